"""Live feed benchmark: 10,000 WebSocket subscribers on one board of ``rankd serve``
while 10,000 submissions/s arrive over the msgpack TCP protocol.

What it measures (one table, one row per figure, PASS/MISS against a target):

- **delivery latency** p50/p99, from a submission's acknowledgement to its
  receipt at the subscribers (target: p99 <= 2 x ``--interval``, 500 ms at
  the default 0.25 s);
- **pushes per subscriber per second** (``leaderboard.updated`` messages
  after the connect snapshot; at most 1/interval, and the load is built so
  that the top 10 changes on every tick);
- **server CPU**, utime+stime of the daemon from ``/proc/<pid>/stat`` over
  the measuring window, as % of one core;
- **memory per connection**: the daemon's RSS after connecting the
  subscribers minus before, / subscribers;
- how long connecting the subscribers took (``--batch`` at a time), the
  submission rate actually acknowledged, the fan-out time (receipt minus
  the server's render ``ts``), errors and disconnects.

Method (the probe): the load generator adds delta 1 to members drawn at
random from ``--members`` names (default 1,000, so every tick changes the
top 10) at ``--rate``, 50-ish pipelined submits per 5 ms over 4 TCP
connections.  Every 0.4-0.6 s (random, so the probe has no fixed phase with
the feed's ticks) it bumps a dedicated member ``~probe`` by 1e9 over a
separate connection: the probe's score is then ``k * 1e9`` after bump
``k``, always at rank 1, and the generator records the wall-clock time the
ack of bump ``k`` arrived.  Each subscriber searches every pushed message's
bytes for ``{"rank":1,"member":"~probe","score":`` (no JSON parsing) and
records when it first sees a score >= ``k * 1e9``.  One sample per
(subscriber, bump) = that time minus the ack time; a bump some subscriber
never saw counts as infinitely late.  All processes run on one machine
and share its wall clock (``time.time()``).  The notes add the same figure
measured from *sending* each bump (an upper bound when the daemon is slow
to acknowledge) and the minimum from the ack (below 0 when a push carried
a bump before its ack got back).

Processes: the daemon (``tests/daemon.py``'s harness, a temporary data
dir removed afterwards), ``--procs`` (1 or 2) subscriber processes running
a lean WebSocket client written over ``asyncio.Protocol`` on uvloop (HTTP
upgrade, unmasked server frames with 7/16/64-bit lengths, masked pongs),
and one load generator process.  Every process raises RLIMIT_NOFILE to
65536, or to its hard limit when that is lower (a container may forbid
raising it).  The notes say if other ``bench_`` processes ran, how much CPU
processes outside the benchmark used during the window (the CPU was then
shared), and how busy each client process was, with its own event-loop lag
(near 100 % of a core or a large lag, the clients and not the daemon may be
what delays receipt).  Measuring window: ``--seconds`` after a 2 s warm-up.

Run from the project root (the package installed), as root for the
file-descriptor limit::

    python bench/bench_live.py                  # 10,000 subscribers, 10,000/s, 20 s
    python bench/bench_live.py --quick          # 500 subscribers, 1,000/s, 5 s
    python bench/bench_live.py --subscribers 2000 --rate 5000 --seconds 10 --interval 0.1
    python bench/bench_live.py --profile /tmp/live_prof.txt   # + py-spy on the daemon
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hashlib
import math
import multiprocessing
import os
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from array import array
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from neighbours import other_benchmarks
from rankd import wire

ROOT = Path(__file__).resolve().parent.parent
BOARD = "live"
LIMIT = 10
PROBE = "~probe"
PROBE_STEP = 1_000_000_000
PROBE_MARKER = b'{"rank":1,"member":"' + PROBE.encode() + b'","score":'
LEADERBOARD = b'{"type":"leaderboard.updated"'
TS_MARKER = b'"ts":'
WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
NOFILE = 65536
SUBMIT_CONNECTIONS = 4
PACE_SECONDS = 0.005
WARMUP_SECONDS = 2.0
DRAIN_SECONDS = 3.0
READY_TIMEOUT = 60.0


# --- shared helpers ------------------------------------------------------------------------

def raise_nofile() -> tuple[int, int]:
    """Raise the soft (and if allowed the hard) RLIMIT_NOFILE towards 65536."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max(NOFILE, soft)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, max(want, hard)))
    except (ValueError, OSError):  # no CAP_SYS_RESOURCE: the hard limit is the ceiling
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def run_loop(coroutine: Coroutine[Any, Any, Any]) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coroutine)


async def sleep_until(moment: float) -> None:
    await asyncio.sleep(max(0.0, moment - time.time()))


def percentile(ordered: list[float], fraction: float) -> float | None:
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def child_main(target: Callable[[dict[str, Any], Connection], Coroutine[Any, Any, Any]],
               spec: dict[str, Any], conn: Connection) -> None:
    """Entry point of a worker process: errors go back to the parent as text."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise_nofile()
    try:
        result = run_loop(target(spec, conn))
    except Exception:
        result = {"error": traceback.format_exc()}
    with contextlib.suppress(OSError):  # the parent is gone: nobody to tell
        conn.send(result)


async def loop_lag(t0: float, t1: float) -> tuple[float, float]:
    """p99 and max of how late a 5 ms sleep wakes up in [t0, t1): this process's own lag."""
    await sleep_until(t0)
    lags = []
    while (before := time.time()) < t1:
        await asyncio.sleep(0.005)
        lags.append(time.time() - before - 0.005)
    lags.sort()
    return percentile(lags, 0.99) or 0.0, percentile(lags, 1.0) or 0.0


async def receive_command(conn: Connection) -> dict[str, Any]:
    return await asyncio.get_running_loop().run_in_executor(None, conn.recv)


# --- the subscribers (one or two worker processes) ----------------------------------------

def mask_frame(opcode: int, payload: bytes) -> bytes:
    """A client frame (always masked), payload < 126 bytes (pong, close)."""
    key = os.urandom(4)
    masked = bytes(b ^ key[i % 4] for i, b in enumerate(payload))
    return bytes((0x80 | opcode, 0x80 | len(payload))) + key + masked


@dataclass
class Pool:
    """What all subscribers of one process share and record."""

    handshake: bytes
    accept: bytes
    t0: float = math.inf
    t1: float = math.inf
    closing: bool = False
    sightings: dict[int, array] = field(default_factory=dict)
    lags: array = field(default_factory=lambda: array("d"))
    lost: int = 0
    first_loss: str | None = None
    close_codes: Counter[str] = field(default_factory=Counter)

    def on_push(self, subscriber: Subscriber, data: bytes, start: int, end: int,
                now: float) -> None:
        """One ``leaderboard.updated`` after the snapshot: count it, look for the probe."""
        if self.t0 <= now < self.t1:
            subscriber.pushes += 1
            at = data.rfind(TS_MARKER, start, end)
            self.lags.append(now - float(data[at + len(TS_MARKER):end - 1]))
        at = data.find(PROBE_MARKER, start, end)
        if at < 0:
            return
        at += len(PROBE_MARKER)
        seq = round(float(data[at:data.find(b",", at, end)]) / PROBE_STEP)
        while subscriber.seen < seq:
            subscriber.seen += 1
            self.sightings.setdefault(subscriber.seen, array("d")).append(now)


class Subscriber(asyncio.Protocol):
    """One WebSocket connection: upgrade, then server frames parsed in place."""

    __slots__ = ("buffer", "pool", "pushes", "ready", "seen", "transport", "upgraded")

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.upgraded = False
        self.pushes = 0
        self.seen = 0
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.transport.write(self.pool.handshake)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.pool.closing:
            self.pool.lost += 1
            self.pool.first_loss = self.pool.first_loss or (repr(exc) if exc else "EOF")
        if not self.ready.done():
            self.ready.set_exception(ConnectionError(f"lost before the snapshot: {exc!r}"))

    def data_received(self, data: bytes) -> None:
        now = time.time()
        if self.buffer:
            data, self.buffer = self.buffer + data, b""
        if not self.upgraded:
            end = data.find(b"\r\n\r\n")
            if end < 0:
                self.buffer = data
                return
            self.upgrade(data[:end])
            data = data[end + 4:]
        self.frames(data, now)

    def upgrade(self, head: bytes) -> None:
        if head.startswith(b"HTTP/1.1 101") and self.pool.accept in head:
            self.upgraded = True
            return
        self.pool.close_codes[f"upgrade refused: {head[:200]!r}"] += 1
        self.ready.set_exception(ConnectionError(head[:200].decode(errors="replace")))
        self.transport.abort()

    def frames(self, data: bytes, now: float) -> None:
        position, size = 0, len(data)
        while size - position >= 2:
            length = data[position + 1] & 0x7F
            start = position + 2
            if length >= 126:
                width = 2 if length == 126 else 8
                if size - start < width:
                    break
                length = int.from_bytes(data[start:start + width], "big")
                start += width
            end = start + length
            if end > size:
                break
            self.frame(data[position] & 0x0F, data, start, end, now)
            position = end
        if position < size:
            self.buffer = data[position:]

    def frame(self, opcode: int, data: bytes, start: int, end: int, now: float) -> None:
        if opcode == 1 and data.startswith(LEADERBOARD, start):
            if self.ready.done():
                self.pool.on_push(self, data, start, end, now)
            else:
                self.ready.set_result(None)  # the snapshot sent on connect
        elif opcode == 9:
            self.transport.write(mask_frame(0xA, data[start:end]))
        elif opcode == 8:
            code = int.from_bytes(data[start:start + 2], "big") if end - start >= 2 else 1005
            if not self.pool.closing:
                self.pool.close_codes[f"{code} {data[start + 2:end].decode(errors='replace')}"] += 1
            self.transport.write(mask_frame(0x8, data[start:start + 2]))
            self.transport.close()

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(mask_frame(0x8, (1000).to_bytes(2, "big")))
            self.transport.close()


def make_pool(spec: dict[str, Any]) -> Pool:
    key = base64.b64encode(os.urandom(16))
    accept = base64.b64encode(hashlib.sha1(key + WS_GUID).digest())
    handshake = (f"GET /v1/boards/{BOARD}/live?limit={LIMIT} HTTP/1.1\r\n"
                 f"Host: 127.0.0.1:{spec['port']}\r\nUpgrade: websocket\r\n"
                 "Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                 f"Sec-WebSocket-Key: {key.decode()}\r\n\r\n").encode()
    return Pool(handshake, accept)


async def connect_batch(pool: Pool, port: int, count: int) -> tuple[list[Subscriber], list[str]]:
    """``count`` connections at once, each ready once its snapshot arrived."""
    loop = asyncio.get_running_loop()
    made = await asyncio.gather(*(loop.create_connection(lambda: Subscriber(pool), "127.0.0.1",
                                                         port) for _ in range(count)),
                                return_exceptions=True)
    subscribers = [s for _, s in (m for m in made if not isinstance(m, BaseException))]
    errors = [repr(m) for m in made if isinstance(m, BaseException)]
    done = await asyncio.gather(*(asyncio.wait_for(asyncio.shield(s.ready), READY_TIMEOUT)
                                  for s in subscribers), return_exceptions=True)
    errors += [repr(d) for d in done if isinstance(d, BaseException)]
    return [s for s, d in zip(subscribers, done, strict=True) if d is None], errors


async def connect_all(pool: Pool, spec: dict[str, Any]) -> tuple[list[Subscriber], list[str]]:
    subscribers: list[Subscriber] = []
    errors: list[str] = []
    left = spec["subscribers"]
    while left > 0:
        ready, failed = await connect_batch(pool, spec["port"], min(spec["batch"], left))
        subscribers += ready
        errors += failed
        left -= spec["batch"]
    return subscribers, errors


async def subscriber_process(spec: dict[str, Any], conn: Connection) -> dict[str, Any]:
    pool = make_pool(spec)
    began = time.time()
    subscribers, errors = await connect_all(pool, spec)
    conn.send({"connected": len(subscribers), "seconds": time.time() - began,
               "errors": errors[:5], "failed": len(errors)})
    command = await receive_command(conn)
    pool.t0, pool.t1 = command["t0"], command["t1"]
    lag = asyncio.create_task(loop_lag(pool.t0, pool.t1))
    await sleep_until(pool.t0)
    cpu = time.process_time()
    await sleep_until(pool.t1)
    cpu = (time.process_time() - cpu) / (pool.t1 - pool.t0)
    await sleep_until(command["end"])
    pool.closing = True
    for subscriber in subscribers:
        subscriber.close()
    await asyncio.sleep(0.5)
    return {"cpu": cpu, "lag": await lag, "pushes": array("l", [s.pushes for s in subscribers]),
            "sightings": pool.sightings, "lags": pool.lags, "lost": pool.lost,
            "first_loss": pool.first_loss, "close_codes": dict(pool.close_codes)}


# --- the load generator (one worker process) ----------------------------------------------

@dataclass
class Load:
    """Counters of one load run."""

    t0: float = math.inf
    t1: float = math.inf
    sent: int = 0
    acked: int = 0
    acked_in_window: int = 0
    errors: int = 0
    first_error: str | None = None
    lost: list[str] = field(default_factory=list)
    stopping: bool = False


class SubmitConnection(asyncio.Protocol):
    """Pipelined ``submit`` frames; replies matched by id only for calls."""

    def __init__(self, load: Load) -> None:
        self.load = load
        self.decoder = wire.FrameDecoder()
        self.transport: asyncio.Transport | None = None
        self.next_id = 1
        self.calls: dict[int, asyncio.Future[tuple[bool, Any]]] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.load.stopping:
            self.load.lost.append(repr(exc) if exc else "closed by the server")
        for future in self.calls.values():
            if not future.done():
                future.set_exception(ConnectionError("connection lost"))

    def data_received(self, data: bytes) -> None:
        now = time.time()
        load = self.load
        for message in self.decoder.feed(data):
            request_id, ok, body = wire.parse_response(message)
            future = self.calls.pop(request_id, None)
            if future is not None:
                future.set_result((ok, body))
                continue
            load.acked += 1
            if load.t0 <= now < load.t1:
                load.acked_in_window += 1
            if not ok:
                load.errors += 1
                load.first_error = load.first_error or f"{body['code']}: {body['message']}"

    def ids(self, count: int) -> range:
        first = self.next_id
        self.next_id = first + count if first + count < wire.MAX_ID else 1
        return range(first, first + count)

    def submit_batch(self, members: list[str]) -> None:
        self.transport.write(b"".join(
            wire.request(i, "submit", {"board": BOARD, "member": m, "delta": 1})
            for i, m in zip(self.ids(len(members)), members, strict=True)))

    async def call(self, op: str, args: dict[str, Any]) -> tuple[bool, Any]:
        request_id = self.ids(1)[0]
        future = asyncio.get_running_loop().create_future()
        self.calls[request_id] = future
        self.transport.write(wire.request(request_id, op, args))
        return await future


async def open_submitter(load: Load, port: int) -> SubmitConnection:
    _, connection = await asyncio.get_running_loop().create_connection(
        lambda: SubmitConnection(load), "127.0.0.1", port)
    ok, body = await connection.call("hello", {"version": wire.VERSION, "client": "bench_live"})
    if not ok:
        raise ConnectionError(f"hello refused: {body}")
    return connection


async def pace(load: Load, connections: list[SubmitConnection], spec: dict[str, Any],
               start: float) -> None:
    """``spec["rate"]`` submits/s from ``start`` to ``load.t1``, in one write per 5 ms."""
    names = [f"m{n}" for n in range(spec["members"])]
    turn = 0
    while (now := time.time()) < load.t1:
        due = int((now - start) * spec["rate"]) - load.sent
        if due > 0:
            connections[turn % len(connections)].submit_batch(random.choices(names, k=due))
            load.sent += due
            turn += 1
        await asyncio.sleep(PACE_SECONDS)


async def probe(load: Load, connection: SubmitConnection) -> list[tuple[int, float, float]]:
    """Bump the probe every 0.4-0.6 s of the window: ``(k, sent, acked)`` of bump k."""
    bumps: list[tuple[int, float, float]] = []
    await sleep_until(load.t0 + random.uniform(0.0, 0.5))
    while time.time() < load.t1 - 0.3:
        sent = time.time()
        ok, body = await connection.call("submit", {"board": BOARD, "member": PROBE,
                                                    "delta": PROBE_STEP})
        acked = time.time()
        seq = len(bumps) + 1
        if not ok or round(body["score"]) != seq * PROBE_STEP:
            raise RuntimeError(f"probe bump {seq} answered {ok} {body}")
        bumps.append((seq, sent, acked))
        await asyncio.sleep(random.uniform(0.4, 0.6))
    return bumps


async def load_process(spec: dict[str, Any], conn: Connection) -> dict[str, Any]:
    load = Load()
    connections = [await open_submitter(load, spec["tcp_port"])
                   for _ in range(SUBMIT_CONNECTIONS)]
    prober = await open_submitter(load, spec["tcp_port"])
    conn.send({"ready": True})
    command = await receive_command(conn)
    load.t0, load.t1 = command["t0"], command["t1"]
    await sleep_until(command["start"])
    cpu = time.process_time()
    lag = asyncio.create_task(loop_lag(load.t0, load.t1))
    probes = asyncio.create_task(probe(load, prober))
    await pace(load, connections, spec, command["start"])
    bumps = await probes
    cpu = (time.process_time() - cpu) / (load.t1 - command["start"])
    await sleep_until(load.t1 + 2.0)
    load.stopping = True
    for connection in [*connections, prober]:
        connection.transport.close()
    return {"bumps": bumps, "sent": load.sent, "acked": load.acked,
            "rate": load.acked_in_window / (load.t1 - load.t0), "errors": load.errors,
            "first_error": load.first_error, "lost": load.lost, "cpu": cpu,
            "lag": await lag}


# --- orchestration (the main process) -----------------------------------------------------

@dataclass
class Worker:
    process: multiprocessing.process.BaseProcess
    conn: Connection
    name: str

    def receive(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while not self.conn.poll(0.2):
            if not self.process.is_alive():
                raise RuntimeError(f"{self.name} exited with {self.process.exitcode}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not answer in {timeout:g} s")
        message = self.conn.recv()
        if "error" in message:
            raise RuntimeError(f"{self.name} failed:\n{message['error']}")
        return message


def start_worker(target: Callable[..., Coroutine[Any, Any, Any]], spec: dict[str, Any],
                 name: str) -> Worker:
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=child_main, args=(target, spec, child), name=name,
                              daemon=True)
    process.start()
    child.close()
    return Worker(process, parent, name)


def stop_workers(workers: list[Worker]) -> None:
    """Workers done with their results exit by themselves; the others are ended."""
    for worker in workers:
        worker.conn.close()
    for worker in workers:
        worker.process.join(2)
        if worker.process.is_alive():
            worker.process.terminate()
            worker.process.join(3)
        if worker.process.is_alive():
            worker.process.kill()
            worker.process.join(3)


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(utime, stime) of process ``pid`` (all threads) so far, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def machine_busy() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def start_daemon(data_dir: Path, args: argparse.Namespace) -> Any:
    sys.path.insert(0, str(ROOT / "tests"))
    from daemon import Daemon

    allowed = max(20_000, args.subscribers + 100)
    daemon = Daemon(data_dir, "--live-interval", str(args.interval),
                    "--live-max-per-address", str(allowed)).start()
    print("daemon under test runs: " + " ".join(
        f"{part}={kind}" for part, kind in daemon.implementations().items()), flush=True)
    return daemon


def create_board(daemon: Any) -> None:
    status, body = daemon.request("PUT", f"/v1/boards/{BOARD}", {"policy": "sum"})
    if status not in (200, 201):
        raise RuntimeError(f"PUT /v1/boards/{BOARD} answered {status}: {body}")


@dataclass
class Run:
    """Everything measured in one run."""

    args: argparse.Namespace
    connect_seconds: float = 0.0
    connected: int = 0
    connect_errors: list[str] = field(default_factory=list)
    rss_per_connection: float = 0.0
    server_cpu: float = 0.0
    server_system: float = 0.0
    machine_cpu: float = 0.0
    load: dict[str, Any] = field(default_factory=dict)
    subscribers: list[dict[str, Any]] = field(default_factory=list)
    profile: str = ""
    closing_at: float = math.inf
    problems: list[str] = field(default_factory=list)


def connect_subscribers(run: Run, daemon: Any, workers: list[Worker]) -> None:
    args = run.args
    share = [args.subscribers // args.procs + (i < args.subscribers % args.procs)
             for i in range(args.procs)]
    rss = rss_bytes(daemon.process.pid)
    for index, count in enumerate(share):
        spec = {"port": daemon.port, "subscribers": count, "batch": args.batch // args.procs}
        workers.append(start_worker(subscriber_process, spec, f"subscribers-{index}"))
    replies = [w.receive(READY_TIMEOUT + 10 * args.subscribers / args.batch) for w in workers]
    run.connect_seconds = max(r["seconds"] for r in replies)
    run.connected = sum(r["connected"] for r in replies)
    run.connect_errors = [e for r in replies for e in r["errors"]]
    time.sleep(1.0)
    run.rss_per_connection = (rss_bytes(daemon.process.pid) - rss) / max(1, run.connected)
    print(f"connected {run.connected:,} subscribers in {run.connect_seconds:.1f} s",
          file=sys.stderr, flush=True)


def measure(run: Run, daemon: Any, workers: list[Worker], generator: Worker) -> None:
    """Start the load, sample the daemon's CPU over the window, collect the results."""
    pid = daemon.process.pid
    start = time.time() + 0.5
    t0 = start + WARMUP_SECONDS
    t1 = t0 + run.args.seconds
    generator.conn.send({"start": start, "t0": t0, "t1": t1})
    run.closing_at = t1 + DRAIN_SECONDS
    for worker in workers:
        worker.conn.send({"t0": t0, "t1": t1, "end": run.closing_at})
    time.sleep(max(0.0, t0 - time.time()))
    cpu, busy = cpu_seconds(pid), machine_busy()
    spy = start_profiler(run.args, pid)
    time.sleep(max(0.0, t1 - time.time()))
    user, system = (b - a for a, b in zip(cpu, cpu_seconds(pid), strict=True))
    run.server_cpu = (user + system) / (time.time() - t0)
    run.server_system = system / max(user + system, 1e-9)
    done = machine_busy()
    run.machine_cpu = (done[0] - busy[0]) / max(1, done[1] - busy[1]) * (os.cpu_count() or 1)
    run.load = generator.receive(60)
    run.subscribers = [w.receive(60 + DRAIN_SECONDS) for w in workers]
    if spy is not None:
        run.profile = finish_profiler(spy, run.args.profile)


def start_profiler(args: argparse.Namespace, pid: int) -> subprocess.Popen | None:
    if args.profile is None:
        return None
    duration = str(max(1, min(10, int(args.seconds))))
    return subprocess.Popen(["py-spy", "record", "-f", "raw", "--pid", str(pid), "-d",
                             duration, "-o", str(args.profile)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish_profiler(spy: subprocess.Popen, output: Path) -> str:
    spy_output, _ = spy.communicate(timeout=60)
    if spy.returncode != 0:
        return f"py-spy failed ({spy.returncode}): {spy_output.strip()}"
    return top_frames(output)


def top_frames(path: Path, count: int = 20) -> str:
    """The ``count`` leaf frames with the most samples (self time), line numbers merged."""
    totals: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        stack, _, samples = line.rpartition(" ")
        if stack and samples.isdigit():
            totals[re.sub(r":\d+\)$", ")", stack.rsplit(";", 1)[-1])] += int(samples)
    grand = sum(totals.values()) or 1
    lines = [f"  {100 * n / grand:6.1f}  {n:7d}  {frame}" for frame, n in totals.most_common(count)]
    return "\n".join([f"  {grand} samples; self %, samples, frame", *lines])


def bench(run: Run, workdir: Path) -> None:
    daemon = start_daemon(workdir / "data", run.args)
    subscribers: list[Worker] = []
    everyone: list[Worker] = []
    try:
        create_board(daemon)
        connect_subscribers(run, daemon, subscribers)
        everyone += subscribers
        spec = {"tcp_port": daemon.tcp_port, "rate": run.args.rate,
                "members": run.args.members}
        generator = start_worker(load_process, spec, "load generator")
        everyone.append(generator)
        generator.receive(30)
        measure(run, daemon, subscribers, generator)
    finally:
        everyone += [w for w in subscribers if w not in everyone]
        stop_workers(everyone)
        run.problems += daemon_health(daemon, run.closing_at)
        if run.args.daemon_log is not None:
            shutil.copyfile(daemon.log_path, run.args.daemon_log)


def daemon_health(daemon: Any, closing_at: float) -> list[str]:
    """Problems seen in the daemon's exit code and log (``closing_at``: clients closing)."""
    problems = []
    code = daemon.stop()
    if code != 0:
        problems.append(f"the daemon exited with {code}")
    lines = daemon.log().splitlines()
    slow = [log_time(line) for line in lines if "too slow" in line]
    if slow:
        early = sum(t < closing_at for t in slow)
        problems.append(f"the daemon logged {len(slow)} subscribers as too slow and dropped "
                        f"them: {early} before the clients closed, {len(slow) - early} while "
                        "they closed (a reset mid-send is logged so too)")
    bad = [i for i, line in enumerate(lines) if "Traceback" in line or "ERROR" in line]
    if bad:
        start = max(0, bad[0] - 2)
        problems.append("daemon log excerpt:\n" + "\n".join(lines[start:start + 40]))
    return problems


def log_time(line: str) -> float:
    """Epoch seconds of a daemon log line (text format, local time); 0 if none."""
    try:
        return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    except ValueError:
        return 0.0


# --- results ------------------------------------------------------------------------------

def latencies(run: Run, since: int = 2) -> tuple[list[float], int]:
    """Sorted probe latencies (s), one per (subscriber, bump), from the bump's ack
    (``since=2``) or from sending it (``since=1``); never-seen ones as inf."""
    samples: list[float] = []
    missing = 0
    for bump in run.load["bumps"]:
        origin = bump[since]
        seen = [t - origin for sub in run.subscribers for t in sub["sightings"].get(bump[0], ())]
        missing += run.connected - len(seen)
        samples += seen
    samples += [math.inf] * missing
    samples.sort()
    return samples, missing


def pushes_per_second(run: Run) -> tuple[float, int, int]:
    counts = [n for sub in run.subscribers for n in sub["pushes"]]
    if not counts:
        return 0.0, 0, 0
    return sum(counts) / len(counts) / run.args.seconds, min(counts), max(counts)


def ms(value: float | None) -> str:
    if value is None:
        return "-"
    return "never" if math.isinf(value) else f"{value * 1e3:.1f} ms"


def verdict(ok: bool | None) -> str:
    return {True: "PASS", False: "MISS", None: "info"}[ok]


def rows(run: Run) -> list[tuple[str, str, str, str]]:
    args = run.args
    lat, _ = latencies(run)
    target_s = 2 * args.interval
    p99 = percentile(lat, 0.99)
    per_second, low, high = pushes_per_second(run)
    lags = sorted(x for sub in run.subscribers for x in sub["lags"])
    errors = error_count(run)
    return [
        ("subscribers connected", f"{run.connected:,} in {run.connect_seconds:.1f} s "
         f"({args.batch} at a time)", f"{args.subscribers:,}",
         verdict(run.connected == args.subscribers)),
        ("submissions acked/s", f"{run.load['rate']:,.0f}", f">= {0.98 * args.rate:,.0f}",
         verdict(run.load["rate"] >= 0.98 * args.rate)),
        ("delivery latency p50 (probe)", ms(percentile(lat, 0.5)), "-", "info"),
        ("delivery latency p99 (probe)", ms(p99), f"<= {target_s * 1e3:.0f} ms",
         verdict(p99 is not None and p99 <= target_s)),
        ("delivery latency max (probe)", ms(percentile(lat, 1.0)), "-", "info"),
        ("pushes/subscriber/s", f"{per_second:.2f} (each {low}-{high} in "
         f"{args.seconds:g} s)", f"{0.9 / args.interval:.2f}-{1 / args.interval:.2f}",
         verdict(0.9 / args.interval <= per_second <= 1.02 / args.interval)),
        ("fan-out: receipt - render ts p50/p99", f"{ms(percentile(lags, 0.5))} / "
         f"{ms(percentile(lags, 0.99))}", "-", "info"),
        ("server CPU (% of one core)", f"{100 * run.server_cpu:.0f} % "
         f"({run.server_system:.0%} of it in the kernel)", "-", "info"),
        ("server RSS per connection", f"{run.rss_per_connection / 1024:.1f} KiB", "-", "info"),
        ("errors + disconnects", f"{errors:,}", "0", verdict(errors == 0)),
    ]


def error_count(run: Run) -> int:
    subs = sum(s["lost"] + sum(s["close_codes"].values()) for s in run.subscribers)
    return (subs + run.load["errors"] + len(run.load["lost"]) + len(run.connect_errors)
            + (run.args.subscribers - run.connected))


def print_table(table: list[tuple[str, str, str, str]]) -> None:
    header = ("figure", "value", "target", "result")
    widths = [max(len(line[i]) for line in [header, *table]) for i in range(4)]
    for line in [header, *table]:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())


def notes(run: Run, others: list[str], limits: tuple[int, int]) -> Iterator[str]:
    args = run.args
    _, missing = latencies(run)
    yield (f"method: probe member bumped {len(run.load['bumps'])} times at random 0.4-0.6 s "
           f"gaps; latency = first receipt of its new score at rank 1 - ack time, one sample "
           f"per subscriber and bump ({missing} never seen, counted as infinite)")
    rtts = sorted(acked - sent for _, sent, acked in run.load["bumps"])
    lat, sent = latencies(run)[0], latencies(run, since=1)[0]
    yield (f"latency from the ack: min {ms(percentile(lat, 0.0))} (below 0: a push carried the "
           f"bump before its ack arrived); from sending the bump: p50 "
           f"{ms(percentile(sent, 0.5))}, p99 {ms(percentile(sent, 0.99))}")
    yield (f"probe submit -> ack p50 {ms(percentile(rtts, 0.5))}, max {ms(percentile(rtts, 1.0))}"
           " (the next bump waits for the ack)")
    yield (f"load: {args.rate:,}/s offered (delta 1, {args.members:,} members, "
           f"{SUBMIT_CONNECTIONS} pipelined TCP connections), {run.load['sent']:,} sent, "
           f"{run.load['acked']:,} acked; generator CPU {run.load['cpu']:.0%}, "
           f"{lag_text(run.load['lag'])}")
    ours = run.server_cpu + run.load["cpu"] + sum(s["cpu"] for s in run.subscribers)
    yield (f"window {args.seconds:g} s after {WARMUP_SECONDS:g} s warm-up; live interval "
           f"{args.interval:g} s; machine CPU busy {run.machine_cpu:.2f} of "
           f"{os.cpu_count()} cores, of which {max(0.0, run.machine_cpu - ours):.2f} by "
           "processes outside this benchmark")
    for index, sub in enumerate(run.subscribers):
        yield (f"subscriber process {index}: {len(sub['pushes']):,} connections, CPU "
               f"{sub['cpu']:.0%}, {lag_text(sub['lag'])}")
    yield f"RLIMIT_NOFILE {limits[0]} (hard {limits[1]}; 65536 wanted)"
    yield from error_notes(run)
    if others:
        yield "CPU SHARED with other benchmarks: " + "; ".join(others)
    else:
        yield "no other bench_ process ran (the CPU was not shared with one)"


def lag_text(lag: tuple[float, float]) -> str:
    return f"own event-loop lag p99 {ms(lag[0])}, max {ms(lag[1])}"


def error_notes(run: Run) -> Iterator[str]:
    for error in run.connect_errors[:3]:
        yield f"connect error: {error}"
    for sub in run.subscribers:
        if sub["lost"]:
            yield f"{sub['lost']} connections lost, first: {sub['first_loss']}"
        for reason, count in sub["close_codes"].items():
            yield f"{count} closed by the server: {reason}"
    if run.load["errors"]:
        yield f"{run.load['errors']} submit errors, first: {run.load['first_error']}"
    for lost in run.load["lost"][:3]:
        yield f"submit connection lost: {lost}"
    yield from (f"DAEMON PROBLEM: {p}" for p in run.problems)


# --- main ---------------------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--subscribers", type=int, default=10_000,
                        help="WebSocket subscribers (default 10000)")
    parser.add_argument("--rate", type=int, default=10_000,
                        help="submissions per second over TCP (default 10000)")
    parser.add_argument("--seconds", type=float, default=20.0,
                        help="measuring window in seconds (default 20)")
    parser.add_argument("--interval", type=float, default=0.25,
                        help="the daemon's --live-interval (default 0.25)")
    parser.add_argument("--members", type=int, default=1000,
                        help="distinct members the load submits to (default 1000)")
    parser.add_argument("--procs", type=int, choices=(1, 2), default=2,
                        help="subscriber processes (default 2)")
    parser.add_argument("--batch", type=int, default=500,
                        help="subscribers connected at a time (default 500)")
    parser.add_argument("--quick", action="store_true",
                        help="500 subscribers, 1000/s, 5 s")
    parser.add_argument("--profile", type=Path, metavar="FILE",
                        help="py-spy record -f raw on the daemon for the first 10 s of the "
                             "window, to FILE; prints the top 20 frames by self time")
    parser.add_argument("--daemon-log", type=Path, metavar="FILE",
                        help="keep a copy of the daemon's log (the data dir is removed)")
    args = parser.parse_args(argv)
    if args.quick:
        args.subscribers, args.rate, args.seconds = 500, 1000, 5.0
    if min(args.subscribers, args.rate, args.members, args.batch) < 1 \
            or args.seconds < 1 or args.interval <= 0:
        parser.error("counts must be >= 1, --seconds >= 1 and --interval > 0")
    args.batch = max(args.batch, args.procs)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    limits = raise_nofile()
    others = other_benchmarks()
    print(f"rankd live feed benchmark: {args.subscribers:,} subscribers, {args.rate:,}/s, "
          f"{args.seconds:g} s, interval {args.interval:g} s, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    run = Run(args)
    with tempfile.TemporaryDirectory(prefix="rankd-bench-live-") as tmp:
        bench(run, Path(tmp))
    others += [o for o in other_benchmarks() if o not in others]
    print_table(rows(run))
    for note in notes(run, others, limits):
        print(f"  {note}")
    if run.profile:
        print(f"py-spy profile of the daemon (raw stacks in {args.profile}), top 20 frames "
              f"by self time:\n{run.profile}")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
