"""The HTTP and WebSocket front-ends under the three misbehaving clients
every front-end is tested with: one that sends without reading, one that
sends one endless request, one that sends malformed requests in a loop.
The daemon's memory stays within a bound and other clients keep being
served (``/v1/health`` within 200 ms) throughout.  The RESP and TCP ports
have the same tests (test_resp_hardening.py, test_tcp_bounds.py)."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable

import pytest

from daemon import Daemon
from test_resp_hardening import RSS_BOUND, HealthProbe, rss
from websocket_frames import masked_frame, upgrade_request

#: The live feed the WebSocket tests open (a 1,000-entry top each push).
LIVE = "/v1/boards/b/live?limit=1000"
#: How long one attack lasts at most.
SECONDS = 4.0
#: Between two connections of a loop of malformed requests (each is closed
#: after its 400): a client that opens connections faster than that from
#: one loopback address runs into the kernel's TIME-WAIT handling before
#: the daemon, which is not what these tests are about.
RECONNECT_SECONDS = 0.01


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with Daemon(tmp_path_factory.mktemp("http-bounds") / "data") as running:
        running.request("PUT", "/v1/boards/b", {})
        for start in range(0, 2000, 500):
            running.request("POST", "/v1/boards/b/scores/batch", {"events": [
                {"member": f"m{i}", "delta": i} for i in range(start, start + 500)]})
        yield running


def attack(daemon: Daemon, send: Callable[[socket.socket], None]) -> None:
    """Run ``send`` on a connection whose replies are never read (a tiny
    receive buffer), while a probe asks for health; check the bounds."""
    before = rss(daemon)
    with HealthProbe(daemon) as probe:
        sock = socket.create_connection(("127.0.0.1", daemon.port), timeout=1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        with contextlib.suppress(OSError):  # closed, or no longer read: both answers
            send(sock)
        grown = rss(daemon) - before
        sock.close()
    assert grown < RSS_BOUND, grown
    assert not probe.held(), probe.report()


def repeat(sock: socket.socket, chunk: bytes, prefix: bytes = b"") -> None:
    sock.sendall(prefix)
    deadline = time.monotonic() + SECONDS
    while time.monotonic() < deadline:
        sock.sendall(chunk)


def test_pipelined_requests_never_read(daemon):
    request = b"GET /v1/boards/b/top?limit=1000 HTTP/1.1\r\nHost: x\r\n\r\n"
    attack(daemon, lambda sock: repeat(sock, request * 64))


def test_one_endless_request_body(daemon):
    """A chunked body that never ends: refused past the 1 MiB body limit."""
    head = (b"POST /v1/boards/b/scores/batch HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b"10000\r\n" + b" " * 0x10000 + b"\r\n"
    attack(daemon, lambda sock: repeat(sock, chunk, head))


def test_one_endless_header_line(daemon):
    attack(daemon, lambda sock: repeat(sock, b"a" * 65536, b"GET / HTTP/1.1\r\nX-Big: "))


def test_malformed_requests_in_a_loop(daemon):
    def send(sock: socket.socket) -> None:
        deadline = time.monotonic() + SECONDS
        garbage = [b"\x00\n", b"GET\r\n\r\n", b"POST /v1/boards/b/scores HTTP/1.1\r\n"
                   b"Content-Length: -1\r\n\r\n", os.urandom(4096)]
        while time.monotonic() < deadline:
            with socket.create_connection(("127.0.0.1", daemon.port), timeout=1) as each:
                for piece in garbage:
                    try:
                        each.sendall(piece)
                    except OSError:
                        break
            time.sleep(RECONNECT_SECONDS)
    attack(daemon, send)


def test_a_live_feed_that_is_never_read_while_the_board_changes(daemon):
    """The feed pushes a 1,000-entry top on every change; the client never
    reads: the pushes it has not taken are not kept for it."""
    def send(sock: socket.socket) -> None:
        sock.sendall(upgrade_request(daemon.port, LIVE))
        deadline = time.monotonic() + SECONDS
        i = 0
        while time.monotonic() < deadline:
            daemon.request("POST", "/v1/boards/b/scores", {"member": f"m{i % 2000}",
                                                           "delta": 1})
            i += 1
            sock.sendall(masked_frame(9, b"ping"))
    attack(daemon, send)


def test_malformed_and_oversized_live_messages_in_a_loop(daemon):
    follow = b'{"action":"follow","members":["' + b"a" * 60000 + b'"]}'
    messages = masked_frame(1, b"{") + masked_frame(1, follow) + masked_frame(1, b"\xff\xfe") + \
        masked_frame(2, os.urandom(1000))

    def send(sock: socket.socket) -> None:
        deadline = time.monotonic() + SECONDS
        while time.monotonic() < deadline:
            with socket.create_connection(("127.0.0.1", daemon.port), timeout=1) as each, \
                    contextlib.suppress(OSError):
                each.sendall(upgrade_request(daemon.port, LIVE) + messages)
            time.sleep(RECONNECT_SECONDS)
    attack(daemon, send)


def test_frames_sent_behind_a_declined_upgrade_leave_no_memory_behind(daemon):
    """Each connection sends an upgrade the Host check declines (421) with
    240 KB of WebSocket frames right behind it, and closes.  aiohttp used
    to parse the frames as the next HTTP request, and its parse error
    quotes all it read (~4 bytes a byte) in an exception held in a
    reference cycle: ~0.6 MB a connection, kept until the next collection,
    which the daemon makes rare (rankd.engine.collector): 60 MB here."""
    frames = masked_frame(1, b'{"action":"follow","members":["' + b"a" * 60000 + b'"]}') * 4
    declined = upgrade_request(daemon.port, LIVE).replace(
        f"127.0.0.1:{daemon.port}".encode(), b"x")  # a Host refused: 421
    before = rss(daemon)
    for _ in range(100):
        with socket.create_connection(("127.0.0.1", daemon.port), timeout=1) as each, \
                contextlib.suppress(OSError):
            each.sendall(declined + frames)
            assert each.recv(12) == b"HTTP/1.1 421"
        time.sleep(RECONNECT_SECONDS)
    grown = rss(daemon) - before
    assert grown < 16 << 20, grown >> 20


def test_connections_that_open_with_garbage_leave_no_memory_behind(daemon):
    """aiohttp's parse error quotes all it read and a reference cycle keeps
    it until a full collection: 200 connections of 240 KB of garbage once
    held 190 MB.  A connection that does not open with a request line is
    answered 400 and closed before aiohttp reads it."""
    garbage = os.urandom(240_000)
    before = rss(daemon)
    for _ in range(200):
        with socket.create_connection(("127.0.0.1", daemon.port), timeout=2) as sock, \
                contextlib.suppress(OSError):
            sock.sendall(garbage)
        time.sleep(RECONNECT_SECONDS)
    assert rss(daemon) - before < 16 << 20
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=2) as sock:
        sock.sendall(b"\x16\x03\x01junk")  # a TLS hello on the plain port, say
        assert sock.recv(1000).startswith(b"HTTP/1.1 400 Bad Request\r\n")


@pytest.fixture(scope="module")
def impatient(tmp_path_factory):
    with Daemon(tmp_path_factory.mktemp("http-impatient") / "data",
                "--http-idle-timeout", "2") as running:
        running.request("PUT", "/v1/boards/b", {})
        yield running


@pytest.mark.parametrize("framing", ["length", "chunked"])
def test_a_body_that_trickles_in_is_cut_off(impatient, framing):
    """Headers that trickle in were cut off by the keep-alive timeout, but
    a body sent a byte every second held its connection open for ever."""
    head = (b"POST /v1/boards/b/scores HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\n")
    head += (b"Content-Length: 100000\r\n\r\n" if framing == "length"
             else b"Transfer-Encoding: chunked\r\n\r\n")
    piece = b" " if framing == "length" else b"1\r\n \r\n"
    with socket.create_connection(("127.0.0.1", impatient.port), timeout=10) as sock:
        sock.sendall(head)
        started = time.monotonic()
        sock.settimeout(0.5)
        answer = b""
        while time.monotonic() - started < 8 and not answer:
            with contextlib.suppress(OSError):
                sock.sendall(piece)
            try:
                answer = sock.recv(1000)
            except TimeoutError:
                continue
            except OSError:
                break
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert time.monotonic() - started < 4


def test_a_client_that_leaves_mid_body_is_no_error(impatient):
    with socket.create_connection(("127.0.0.1", impatient.port), timeout=5) as sock:
        sock.sendall(b"POST /v1/boards/b/scores HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
        time.sleep(0.2)
    time.sleep(0.5)
    assert '"level": "error"' not in impatient.log()
