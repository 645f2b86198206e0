"""The fault harness's TCP proxy does what each mode says, against a real
echo server on loopback (the cluster fault tests rely on it)."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time

import pytest

from nemesis import Proxy


@pytest.fixture
def echo_port():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    stop = threading.Event()

    def serve():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:  # closed at teardown
                return
            threading.Thread(target=echo, args=(conn,), daemon=True).start()

    def echo(conn):
        with conn, contextlib.suppress(OSError):  # a reset is what the test does
            while data := conn.recv(65536):
                conn.sendall(data)

    serving = threading.Thread(target=serve, daemon=True)
    serving.start()
    yield server.getsockname()[1]
    stop.set()
    serving.join(5)
    server.close()


def round_trip(sock: socket.socket, data: bytes, timeout: float) -> bytes:
    sock.settimeout(timeout)
    sock.sendall(data)
    got = b""
    while len(got) < len(data):
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def test_pass_delay_blackhole_and_reset(echo_port):
    proxy = Proxy(echo_port, delay_seconds=0.3)
    try:
        with socket.create_connection(("127.0.0.1", proxy.port)) as sock:
            assert round_trip(sock, b"hello", 2) == b"hello"
            proxy.set_mode("delay")
            started = time.monotonic()
            assert round_trip(sock, b"slow", 5) == b"slow"
            assert time.monotonic() - started >= 0.55  # delayed each way
            proxy.set_mode("blackhole")
            with pytest.raises(TimeoutError):
                round_trip(sock, b"lost", 0.5)
            proxy.set_mode("reset")
            with pytest.raises((ConnectionResetError, BrokenPipeError, TimeoutError)):
                for _ in range(5):
                    if not round_trip(sock, b"x", 0.5):
                        raise ConnectionResetError("closed")
        with pytest.raises(OSError), socket.create_connection(("127.0.0.1", proxy.port),
                                                             timeout=2) as refused:
            if not round_trip(refused, b"y", 1):
                raise ConnectionResetError("reset on arrival")
        proxy.set_mode("pass")
        with socket.create_connection(("127.0.0.1", proxy.port)) as sock:
            assert round_trip(sock, b"again", 2) == b"again"
    finally:
        proxy.close()


def test_a_server_that_resets_its_connection_resets_the_client_too():
    """A server killed with input it has not read sends an RST; a client
    through the proxy must see its connection end as a direct client would
    (it once stayed open, waiting for an answer that never came)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    proxy = Proxy(server.getsockname()[1])
    try:
        with socket.create_connection(("127.0.0.1", proxy.port)) as client:
            server.settimeout(5)
            conn, _ = server.accept()
            client.sendall(b"a request the server never reads")
            time.sleep(0.2)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()  # unread input and linger 0: an RST
            client.settimeout(3)
            with contextlib.suppress(ConnectionResetError):
                assert client.recv(100) == b""
    finally:
        proxy.close()
        server.close()
