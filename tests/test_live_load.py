"""The live feed under many subscribers that each follow many members: its
ticks share the event loop, so other clients keep being served.

An outside attack: 500 WebSocket subscribers of a big board, each following
100 members no other follows, while a client writes every 50 ms.  Each
tick looked up and rendered all 50,000 followed members in one callback
and held the loop 0.14-0.27 s; ``/v1/health`` waited up to 0.5 s."""

from __future__ import annotations

import base64
import os
import random
import selectors
import socket
import threading
import time

import pytest

from daemon import Daemon
from test_resp_hardening import HealthProbe, _preempted

SUBSCRIBERS = 500
FOLLOWS = 100
MEMBERS = SUBSCRIBERS * FOLLOWS
#: How long the board is written while health is probed.
SECONDS = 3.0


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with Daemon(tmp_path_factory.mktemp("live-load") / "data", "--fsync", "no") as running:
        running.request("PUT", "/v1/boards/big", {"policy": "sum"})
        for start in range(0, MEMBERS, 5000):
            status, _ = running.request("POST", "/v1/boards/big/scores/batch", {"events": [
                {"member": f"m{i}", "delta": i + 1} for i in range(start, start + 5000)]})
            assert status == 200
        yield running


def subscribe(port: int, members: list[str]) -> socket.socket:
    """A WebSocket subscriber of ``big`` following ``members``, upgraded."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall((f"GET /v1/boards/big/live?limit=100&members={','.join(members)} HTTP/1.1\r\n"
                  f"Host: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        assert chunk, head
        head += chunk
    assert head.startswith(b"HTTP/1.1 101"), head[:200]
    sock.setblocking(False)
    return sock


class Drain(threading.Thread):
    """Reads every subscriber's pushes (subscribers that keep up) and counts
    the bytes and the subscribers the server closed."""

    def __init__(self, socks: list[socket.socket]) -> None:
        super().__init__(daemon=True)
        self.selector = selectors.DefaultSelector()
        for sock in socks:
            self.selector.register(sock, selectors.EVENT_READ)
        self.received = 0
        self.closed = 0
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            for key, _ in self.selector.select(0.05):
                try:
                    data = key.fileobj.recv(1 << 20)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    data = b""
                if not data:
                    self.selector.unregister(key.fileobj)
                    self.closed += 1
                self.received += len(data)

    def __enter__(self) -> Drain:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.join(5)


def test_many_subscribers_following_many_members_do_not_hold_the_loop(daemon):
    socks = [subscribe(daemon.port, [f"m{n * FOLLOWS + i}" for i in range(FOLLOWS)])
             for n in range(SUBSCRIBERS)]
    rng = random.Random(43)
    try:
        with Drain(socks) as drain:
            time.sleep(0.5)  # the snapshots sent on connecting
            before = drain.received
            with HealthProbe(daemon) as probe:
                deadline = time.monotonic() + SECONDS
                while time.monotonic() < deadline:
                    # Half the board passed: tens of thousands of followed ranks move.
                    status, _ = daemon.request("POST", "/v1/boards/big/scores", {
                        "member": f"m{rng.randrange(MEMBERS)}", "delta": MEMBERS // 2})
                    assert status == 200
                    time.sleep(0.05)
            pushed = drain.received - before
            closed = drain.closed
    finally:
        for sock in socks:
            sock.close()
    assert not probe.held(), probe.report()
    assert pushed > 1_000_000, pushed  # the followers were sent their new ranks throughout
    assert closed == 0
    # No loop stall, from the start, but those the machine caused (see
    # HealthProbe.stalls: the loop's thread mostly preempted, not computing).
    stalls = [line for line in daemon.log().splitlines()
              if "event loop held for" in line and not _preempted(line)]
    assert not stalls, stalls
