"""The RESP port against hostile clients: every input is consumed or
stopped, memory stays bounded per connection before and after AUTH, the
unauthenticated get only the handshake, and nothing holds the event loop.

Each test here reproduces a way an outside audit froze the daemon or made
it hold memory, through the port itself, against a real ``rankd serve``;
where Redis answers the same input, so must rankd, byte for byte.
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.request

import pytest

from daemon import Daemon
from rankd.frontends.resp.protocol import encode_request
from redisserver import RedisServer
from respclient import RawClient
from test_security import ADMIN, READER_ENTRY, READER_KEY, SECRET, WRITER_ENTRY, WRITER_KEY


@pytest.fixture(scope="module")
def open_daemon(tmp_path_factory):
    with Daemon(tmp_path_factory.mktemp("resp-hard-open") / "data") as running:
        yield running


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    with Daemon(tmp_path_factory.mktemp("resp-hard-sec") / "data", "--jwt-secret", SECRET,
                "--api-keys", f"{WRITER_ENTRY},{READER_ENTRY}") as running:
        running.request("PUT", "/v1/boards/lb", {"order": "asc", "policy": "latest",
                                                "tie_break": "member"},
                        headers={"Authorization": f"Bearer {ADMIN}"})
        yield running


@pytest.fixture(scope="module")
def redis():
    server = RedisServer()
    yield server
    server.stop()


def health_seconds(daemon: Daemon) -> float:
    """How long ``GET /v1/health`` took to answer (fails past 2 s)."""
    started = time.monotonic()
    with urllib.request.urlopen(f"{daemon.url}/v1/health", timeout=2) as response:
        assert response.status == 200
    return time.monotonic() - started


def silent_for(sock: socket.socket, seconds: float) -> bool:
    """Whether ``sock`` receives nothing (and stays open) for ``seconds``."""
    sock.settimeout(seconds)
    try:
        return sock.recv(1) == b"" and False
    except TimeoutError:
        return True


def received_until_closed(sock: socket.socket, timeout: float = 5.0) -> bytes:
    sock.settimeout(timeout)
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


# --- 1. the inline parser consumes its input or stops -----------------------------------

@pytest.mark.parametrize("stream", [b"\x00\n", b"\x00\r\n", b"PING\x00x\r\n",
                                    b'ECHO "a\x00b"\r\n', b"ECHO a\x00b\r\n"])
def test_a_nul_in_an_inline_request_waits_as_redis_does_and_never_freezes(
        open_daemon, redis, stream):
    """Redis ends an inline request at its newline found by ``strchr``,
    which stops at a NUL: the request never completes, the connection
    waits, and 64 KiB later it is "too big".  rankd once looped for ever
    on ``\\x00\\n``, holding every front-end."""
    sockets = {name: socket.create_connection(("127.0.0.1", port), timeout=5)
               for name, port in (("redis", redis.port), ("rankd", open_daemon.resp_port))}
    try:
        for sock in sockets.values():
            sock.sendall(stream + b"PING\r\n")
        for name, sock in sockets.items():
            assert silent_for(sock, 0.3), name
        assert health_seconds(open_daemon) < 0.2
        with RawClient(open_daemon.resp_port) as other:
            assert other.call("PING") == b"+PONG\r\n"
        answers = {}
        for name, sock in sockets.items():
            sock.sendall(b"x" * 70_000)
            answers[name] = received_until_closed(sock)
        assert answers["rankd"] == answers["redis"] == \
            b"-ERR Protocol error: too big inline request\r\n"
    finally:
        for sock in sockets.values():
            sock.close()
