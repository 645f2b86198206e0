"""Memory bounds of the msgpack TCP front-end under attack, against a real
daemon started with credentials (so the pre-auth path is the one attacked).

Each test runs one hostile client while a watcher samples the daemon's RSS
(``/proc/<pid>/status`` VmRSS) and another client keeps asking for health
over HTTP and over TCP.  The daemon's RSS must stay within
:data:`RSS_BOUND` of its baseline (the bound docs/protocol.md states) and
every probe must be answered within :data:`PROBE_TIMEOUT`.  The attacks are
bounded in bytes and time, and stop early once the bound is broken (a
server that does not bound its memory must fail the test, not the machine).
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import jwt
import msgpack
import pytest

from daemon import Daemon
from rankd import wire
from rankd.client import Client

#: What an attack may add to the daemon's RSS (docs/protocol.md).
RSS_BOUND = 64 * 1024 * 1024
#: How long another client may wait for an answer during an attack.
PROBE_TIMEOUT = 2.0
#: Each attack's budget: bytes sent and seconds.
ATTACK_BYTES = 64 * 1024 * 1024
ATTACK_SECONDS = 10.0

SECRET = "tcp-bounds-secret-" + "z" * 20


def token(scope: str = "read write admin") -> str:
    return jwt.encode({"scope": scope, "exp": int(time.time()) + 3600}, SECRET,
                      algorithm="HS256")


def frame(value: Any) -> bytes:
    payload = msgpack.packb(value)
    return struct.pack(">I", len(payload)) + payload


def rss(pid: int) -> int:
    """The resident set of process ``pid``, in bytes."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS line")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with Daemon(tmp_path_factory.mktemp("bounds") / "data", "--jwt-secret", SECRET) as running:
        with Client("127.0.0.1", running.tcp_port, token=token()) as client:
            client.put_board("arena", {"policy": "best"})
            client.submit_many([{"board": "arena", "member": f"m{i}", "score": i}
                                for i in range(100)])
        yield running


class Watch:
    """While an attack runs: the daemon's peak RSS over its baseline, and
    the slowest answer (or the failure) another client got."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.pid = daemon.process.pid
        self.client = Client("127.0.0.1", daemon.tcp_port, token=token("read"),
                             timeout=PROBE_TIMEOUT, retries=0)
        self.client.connect()
        self._probe()  # warm: the baseline includes this client
        self.baseline = rss(self.pid)
        self.peak = self.baseline
        self.slowest = 0.0
        self.failures: list[str] = []
        self.probes = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._sample, daemon=True),
                         threading.Thread(target=self._probes, daemon=True)]

    def __enter__(self) -> Watch:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(10)
        self.client.close()

    @property
    def grown(self) -> int:
        return self.peak - self.baseline

    def over(self) -> bool:
        """Whether the bound is broken already (the attack may stop)."""
        return self.grown > RSS_BOUND

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, rss(self.pid))

    def _probe(self) -> None:
        with urllib.request.urlopen(f"{self.daemon.url}/v1/health",
                                    timeout=PROBE_TIMEOUT) as answer:
            assert answer.status == 200
        assert self.client.health()["status"] == "ok"

    def _probes(self) -> None:
        while not self._stop.wait(0.2):
            started = time.monotonic()
            try:
                self._probe()
            except Exception as exc:
                self.failures.append(repr(exc))
            self.slowest = max(self.slowest, time.monotonic() - started)
            self.probes += 1

    def check(self) -> None:
        """Assert the bound and the probes (a few of them: a short attack too)."""
        deadline = time.monotonic() + 3 * PROBE_TIMEOUT
        while self.probes < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        grown = self.grown / 2**20
        assert not self.over(), f"the daemon's RSS grew by {grown:.0f} MiB"
        assert not self.failures, self.failures[:3]
        assert self.probes >= 3 and self.slowest < PROBE_TIMEOUT, (self.probes, self.slowest)


@contextlib.contextmanager
def attacker(port: int, authenticate: bool = False) -> Iterator[socket.socket]:
    """A raw connection that has said hello (and authenticated, if asked:
    answered, so what follows is read as an authenticated client's)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=2)
    try:
        sock.sendall(frame([1, "hello", {"version": wire.VERSION}]))
        if authenticate:
            sock.sendall(frame([2, "auth", {"token": token()}]))
            decoder, answers = wire.FrameDecoder(), []
            while len(answers) < 2:
                answers += decoder.feed(sock.recv(65536))
            assert [answer[1] for answer in answers] == [wire.OK, wire.OK], answers
        yield sock
    finally:
        sock.close()


def send_until_stopped(sock: socket.socket, chunks: Iterator[bytes], watch: Watch,
                       deadline: float, budget: list[int]) -> None:
    """Send ``chunks`` until the server closes or stops reading (a send
    times out), the budget or the deadline is spent, or the bound is broken."""
    for chunk in chunks:
        if budget[0] <= 0 or time.monotonic() > deadline or watch.over():
            return
        try:
            sock.sendall(chunk)
        except (TimeoutError, OSError):
            return
        budget[0] -= len(chunk)


def amplifying_frames() -> Iterator[bytes]:
    """Frames just under the handshake's 16 KiB of empty maps, each of
    which decodes into about a megabyte of Python objects when decoded
    whole; a health request (allowed before auth) with a junk argument."""
    maps = [{}] * 16_000
    request_id = 2
    while True:
        yield frame([request_id, "health", {"x": maps}])
        request_id += 1


def test_malformed_amplifying_frames_before_auth_stay_bounded(daemon):
    """(a) Before auth, 16 KiB frames that decode into ~1 MB each, in a loop
    over fresh connections: 19 MiB once grew the daemon by 618 MiB."""
    budget = [ATTACK_BYTES]
    deadline = time.monotonic() + ATTACK_SECONDS
    connections = 0
    with Watch(daemon) as watch:
        while budget[0] > 0 and time.monotonic() < deadline and not watch.over():
            with attacker(daemon.tcp_port) as sock:
                connections += 1
                send_until_stopped(sock, amplifying_frames(), watch, deadline, budget)
        watch.check()
    assert connections > 1, "a connection sending malformed frames was never closed"


def test_one_endless_frame_stays_bounded(daemon):
    """(b) One frame that announces a huge length, then bytes for ever:
    refused at its header before and after auth."""
    junk = b"\xc1" * (1 << 16)
    with Watch(daemon) as watch:
        for authenticate in (False, True):
            budget = [ATTACK_BYTES // 2]
            with attacker(daemon.tcp_port, authenticate) as sock:
                sock.sendall(struct.pack(">I", 0xFFFF_FFF0))
                send_until_stopped(sock, iter(lambda: junk, None), watch,
                                   time.monotonic() + ATTACK_SECONDS / 2, budget)
                assert budget[0] > 0, "the server read the whole endless frame"
        watch.check()


def test_pipelining_without_reading_replies_stays_bounded(daemon):
    """(c) An authenticated client pipelines large requests (1,000 members
    of a ``ranks`` each, answered with as much) and never reads a reply:
    reading pauses once a few MiB are queued, whatever the request count."""
    members = [f"absent-member-{i:06d}-" + "p" * 40 for i in range(1000)]
    request = frame([3, "ranks", {"board": "arena", "members": members}])
    budget = [ATTACK_BYTES]
    with Watch(daemon) as watch, attacker(daemon.tcp_port, authenticate=True) as sock:
        send_until_stopped(sock, iter(lambda: request, None), watch,
                           time.monotonic() + ATTACK_SECONDS, budget)
        watch.check()
        assert budget[0] > 0, "the server read everything: nothing paused it"
