"""Connections that hold resources without doing anything useful: caps on
open connections, small frames and a deadline before the TCP handshake,
and idle timeouts on both listeners (slowloris), against the real daemon
through raw sockets."""

from __future__ import annotations

import socket
import struct
import time

import msgpack
import pytest

from daemon import Daemon
from rankd import wire
from rankd.frontends.connections import HANDSHAKE_SECONDS, SWEEP_SECONDS, ConnectionLimits
from rankd.frontends.tcp import HANDSHAKE_MAX_FRAME


def frame(value) -> bytes:
    payload = msgpack.packb(value)
    return struct.pack(">I", len(payload)) + payload


def read_frames(sock: socket.socket, timeout: float) -> tuple[list, bool]:
    """Frames the server sent until it closed (True) or ``timeout`` passed."""
    sock.settimeout(timeout)
    data = b""
    closed = False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        except ConnectionResetError:
            closed = True
            break
        if not chunk:
            closed = True
            break
        data += chunk
    frames = []
    while len(data) >= 4:
        (length,) = struct.unpack(">I", data[:4])
        frames.append(msgpack.unpackb(data[4:4 + length]))
        data = data[4 + length:]
    return frames, closed


def closed_within(sock: socket.socket, seconds: float) -> bool:
    return read_frames(sock, seconds)[1]


def test_a_large_frame_before_the_handshake_is_refused_at_its_header(tmp_path):
    with Daemon(tmp_path / "data") as daemon:
        sock = socket.create_connection(("127.0.0.1", daemon.tcp_port))
        # Declare a 1 MiB frame and send a little of it: once buffered whole.
        sock.sendall(struct.pack(">I", 1 << 20) + b"\x00" * 1000)
        frames, closed = read_frames(sock, 5)
        assert closed and frames[-1][2]["code"] == "too_large", frames
        assert str(HANDSHAKE_MAX_FRAME) in frames[-1][2]["message"]
        # After hello, frames of the full size are taken.
        with socket.create_connection(("127.0.0.1", daemon.tcp_port)) as ok:
            ok.sendall(frame([1, "hello", {"version": wire.VERSION}]))
            time.sleep(0.2)
            big = frame([2, "health", {}])
            ok.sendall(big)
            frames, closed = read_frames(ok, 1)
            assert not closed and [f[1] for f in frames] == [0, 0]


def test_silent_and_trickling_connections_are_closed(tmp_path):
    """300 connections sending nothing once stayed open for good."""
    with Daemon(tmp_path / "data", "--idle-timeout", "2", "--http-idle-timeout", "2") as daemon:
        silent_tcp = socket.create_connection(("127.0.0.1", daemon.tcp_port))
        idle_tcp = socket.create_connection(("127.0.0.1", daemon.tcp_port))
        idle_tcp.sendall(frame([1, "hello", {"version": wire.VERSION}]))
        silent_http = socket.create_connection(("127.0.0.1", daemon.port))
        trickling_http = socket.create_connection(("127.0.0.1", daemon.port))
        started = time.monotonic()
        for part in (b"GET /v1/health HTTP/1.1\r\n", b"Host: x\r\n", b"X-A: 1\r\n"):
            trickling_http.sendall(part)
            time.sleep(0.5)
        # The idle authenticated connection and the HTTP ones go after about 2 s...
        for sock in (idle_tcp, silent_http, trickling_http):
            assert closed_within(sock, 4 + SWEEP_SECONDS), sock
        # ...the silent TCP one at the handshake deadline.
        frames, closed = read_frames(silent_tcp, HANDSHAKE_SECONDS + 2 * SWEEP_SECONDS)
        assert closed and frames[-1][2]["code"] == "handshake_timeout", frames
        assert time.monotonic() - started < HANDSHAKE_SECONDS + 4 * SWEEP_SECONDS
        # A connection that keeps talking is not idle.
        with socket.create_connection(("127.0.0.1", daemon.tcp_port)) as busy:
            busy.sendall(frame([1, "hello", {"version": wire.VERSION}]))
            for request_id in range(2, 8):
                time.sleep(0.5)
                busy.sendall(frame([request_id, "health", {}]))
            frames, closed = read_frames(busy, 0.5)
            assert not closed and len(frames) == 7


def test_connection_caps_answer_and_close_over_the_limit(tmp_path):
    with Daemon(tmp_path / "data", "--max-connections", "12") as daemon:
        held = []
        try:
            # Daemon.start's own health checks are closed by now; fill the cap.
            for number in range(12):
                try:
                    sock = socket.create_connection(("127.0.0.1", daemon.tcp_port))
                except OSError as exc:
                    raise AssertionError(f"{number}: {exc}\n{daemon.log()}") from None
                sock.sendall(frame([1, "hello", {"version": wire.VERSION}]))
                held.append(sock)
            time.sleep(0.3)
            with socket.create_connection(("127.0.0.1", daemon.tcp_port)) as over:
                frames, closed = read_frames(over, 3)
                assert closed and frames[0][2]["code"] == "too_many_connections"
            with socket.create_connection(("127.0.0.1", daemon.port)) as over:
                over.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
                answer = over.recv(4096)
                assert answer.startswith(b"HTTP/1.1 503") and b"too_many_connections" in answer
            held.pop().close()
            time.sleep(0.3)
            status, _ = daemon.request("GET", "/v1/health")
            assert status == 200  # room again
            status, metrics = 0, ""
        finally:
            for sock in held:
                sock.close()
        time.sleep(0.3)
        import urllib.request

        with urllib.request.urlopen(daemon.url + "/metrics", timeout=10) as response:
            metrics = response.read().decode()
        refused = [line for line in metrics.splitlines()
                   if line.startswith("rankd_connections_refused_total ")]
        assert refused and float(refused[0].split()[1]) >= 2


def test_connection_limits_count_per_address_and_exempt_loopback():
    limits = ConnectionLimits(max_total=5, max_per_address=2)
    assert limits.admit("203.0.113.1") is None and limits.admit("203.0.113.1") is None
    assert "this address" in limits.admit("203.0.113.1")
    assert limits.admit("127.0.0.1") is None and limits.admit("127.0.0.1") is None
    assert limits.admit("::1") is None
    assert "maximum of 5" in limits.admit("198.51.100.2")
    limits.release("203.0.113.1")
    assert limits.admit("203.0.113.1") is None
    assert limits.refused == 2 and limits.total == 5


@pytest.mark.parametrize("value", ["-1", "abc"])
def test_bad_connection_settings_are_refused(tmp_path, value):
    import subprocess
    import sys

    from daemon import SRC

    done = subprocess.run([sys.executable, "-m", "rankd.cli", "serve", "--max-connections",
                           value, "--data-dir", str(tmp_path / "d")],
                          env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--max-connections" in done.stderr
