"""Adversarial inputs at every port of a live daemon while a probe asserts
that ``GET /v1/health`` keeps answering within 200 ms: no input may hold
the event loop (issue 43, "Make the class impossible").

Each family (RESP, TCP, HTTP, WebSocket) gets its own daemon, so one that
freezes does not hide the others, and a few seconds at most."""

from __future__ import annotations

import contextlib
import http.client
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import msgpack
import pytest

from daemon import Daemon
from rankd.frontends.resp.protocol import encode_request
from test_security import SECRET, token
from websocket_frames import masked_frame, upgrade_request

#: The longest a health check may take while the daemon is under attack.
HEALTH_SECONDS = 0.2
#: Time spent on one input at most.
INPUT_SECONDS = 3.0
ADMIN = token("admin write read")


class HealthProbe:
    """Asks ``/v1/health`` every 50 ms in a thread; records each answer's time."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.slow: list[tuple[str, float]] = []
        self.current = "start"
        self.answers = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            began = time.monotonic()
            try:
                connection = http.client.HTTPConnection("127.0.0.1", self.daemon.port,
                                                        timeout=INPUT_SECONDS)
                connection.request("GET", "/v1/health")
                status = connection.getresponse().status
                connection.close()
            except OSError as exc:
                status = repr(exc)
            took = time.monotonic() - began
            self.answers += 1
            if status != 200 or took > HEALTH_SECONDS:
                self.slow.append((f"{self.current} (status {status})", round(took, 3)))

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(INPUT_SECONDS + 1)


@pytest.fixture
def attacked(tmp_path: Path) -> Iterator[tuple[Daemon, HealthProbe]]:
    with Daemon(tmp_path / "data", "--jwt-secret", SECRET, "--fsync", "no") as daemon, \
            HealthProbe(daemon) as probe:
        yield daemon, probe


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=INPUT_SECONDS)


def send_for_a_while(port: int, pieces: Iterator[bytes] | list[bytes],
                     pause: float = 0.0) -> None:
    """Send ``pieces`` on one connection within :data:`INPUT_SECONDS` (the
    daemon may close it: that is an answer), reading whatever comes back."""
    deadline = time.monotonic() + INPUT_SECONDS
    with connect(port) as sock:
        sock.settimeout(0.05)
        for piece in pieces:
            if time.monotonic() > deadline:
                break
            try:
                sock.sendall(piece)
                sock.recv(1 << 16)
            except TimeoutError:
                pass
            except OSError:
                return  # closed by the daemon
            if pause:
                time.sleep(pause)


def run_inputs(probe: HealthProbe, inputs: dict[str, Callable[[], None]]) -> None:
    for name, attack in inputs.items():
        probe.current = name
        attack()
        time.sleep(0.15)  # the probe asks at least twice after each input
    probe.current = "after"
    time.sleep(0.3)
    assert probe.answers > 2 * len(inputs)
    assert not probe.slow, f"health slower than {HEALTH_SECONDS} s during: {probe.slow}"


def resp_inputs(port: int) -> dict[str, Callable[[], None]]:
    auth = encode_request(["AUTH", ADMIN])
    boards = b"".join(encode_request(["ZADD", "a" * n + "x", "1", "m"]) for n in range(1, 30))
    glob = "*a*a*a*a*a*a*a*a*a*a*a*a*b"
    return {
        "RESP \\x00\\n": lambda: send_for_a_while(port, [b"\x00\n"] * 3),
        "RESP \\r\\n flood": lambda: send_for_a_while(port, [b"\r\n" * 32768] * 64),
        "RESP unbalanced quotes": lambda: send_for_a_while(
            port, [b'SET "abc\r\n', b"ZADD 'a\r\n", b'"\\x\r\n'] * 20),
        "RESP huge inline line": lambda: send_for_a_while(port, [b"A" * 65536] * 32),
        "RESP huge multibulk count": lambda: send_for_a_while(
            port, [b"*1048576\r\n", *[b"$1\r\na\r\n" * 8192] * 96]),
        "RESP KEYS/SCAN MATCH glob": lambda: send_for_a_while(port, [
            auth + boards,
            encode_request(["KEYS", glob]),
            encode_request(["SCAN", "0", "MATCH", glob, "COUNT", "1000"]),
            encode_request(["ZSCAN", "ax", "0", "MATCH", glob])]),
        "RESP pre-auth COMMAND INFO flood": lambda: send_for_a_while(
            port, [encode_request(["COMMAND", "INFO", *["zadd"] * 8000])] * 16),
    }


def frame(value: object) -> bytes:
    payload = msgpack.packb(value, use_bin_type=True)
    return len(payload).to_bytes(4, "big") + payload


def tcp_inputs(port: int) -> dict[str, Callable[[], None]]:
    hello = frame([1, "hello", {"version": 1}])
    authed = hello + frame([2, "auth", {"token": ADMIN}])
    empty_maps = (16 * 1024 - 8).to_bytes(4, "big") + b"\xdc\x3f\xf8" + b"\x80" * 16376
    return {
        "TCP malformed msgpack": lambda: send_for_a_while(
            port, [hello + (3).to_bytes(4, "big") + b"\xc1\xc1\xc1"] * 50),
        "TCP huge announced length": lambda: send_for_a_while(
            port, [b"\xff\xff\xff\xff" + b"x" * 1024, b"\x00\x10\x00\x00" + b"y" * 65536]),
        "TCP frames of empty maps": lambda: send_for_a_while(port, [empty_maps] * 64),
        "TCP authenticated garbage": lambda: send_for_a_while(
            port, [authed, *[os.urandom(4096) for _ in range(64)]]),
    }


def http_inputs(port: int) -> dict[str, Callable[[], None]]:
    def huge_headers() -> None:
        send_for_a_while(port, [b"GET /v1/health HTTP/1.1\r\nHost: x\r\n",
                                *[b"X-Big: " + b"a" * 8000 + b"\r\n"] * 64, b"\r\n"])

    def slowloris() -> None:
        sockets = [connect(port) for _ in range(20)]
        try:
            for byte in b"GET /v1/health HTTP/1.1\r\nHost: x\r\nX-a: b":
                for sock in sockets:
                    with contextlib.suppress(OSError):  # closed by the daemon
                        sock.send(bytes([byte]))
                time.sleep(INPUT_SECONDS / 60)
        finally:
            for sock in sockets:
                sock.close()

    def bad_json() -> None:
        for body in (b"{", b"[" * 100000, b'{"a":' * 5000, b"\xff\xfe", b"1e999999"):
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=INPUT_SECONDS)
            connection.request("POST", "/v1/boards/b/scores", body=body,
                               headers={"Authorization": f"Bearer {ADMIN}",
                                        "Content-Type": "application/json"})
            connection.getresponse().read()
            connection.close()

    return {"HTTP huge headers": huge_headers, "HTTP slowloris": slowloris,
            "HTTP bad JSON": bad_json}


def websocket_inputs(daemon: Daemon) -> dict[str, Callable[[], None]]:
    def upgrade() -> bytes:
        return upgrade_request(daemon.port, token=ADMIN)

    daemon.request("PUT", "/v1/boards/b", {}, headers={"Authorization": f"Bearer {ADMIN}"})
    port = daemon.port
    return {
        "WebSocket garbage bytes": lambda: send_for_a_while(
            port, [upgrade(), *[os.urandom(2048) for _ in range(32)]]),
        "WebSocket bad messages": lambda: send_for_a_while(port, [upgrade(), *[
            masked_frame(1, text) for text in (b"{", b'{"action":"follow","members":' + b"[" * 5000,
                                         b'{"action":"follow","members":["' + b"a" * 60000
                                         + b'"]}', b"\xff\xfe")] * 8]),
        "WebSocket huge announced frame": lambda: send_for_a_while(
            port, [upgrade(), b"\x81\xff" + (1 << 62).to_bytes(8, "big") + b"\0" * 4096]),
    }


def test_resp_inputs_never_hold_the_loop(attacked):
    daemon, probe = attacked
    run_inputs(probe, resp_inputs(daemon.resp_port))


def test_tcp_inputs_never_hold_the_loop(attacked):
    daemon, probe = attacked
    run_inputs(probe, tcp_inputs(daemon.tcp_port))


def test_http_inputs_never_hold_the_loop(attacked):
    daemon, probe = attacked
    run_inputs(probe, http_inputs(daemon.port))


def test_websocket_inputs_never_hold_the_loop(attacked):
    daemon, probe = attacked
    run_inputs(probe, websocket_inputs(daemon))
