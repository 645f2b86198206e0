"""Daemon benchmark: submissions/s and latency of ``rankd serve`` over REST
and the msgpack TCP protocol, side by side with Redis ``ZINCRBY``.

The daemon runs as a subprocess (``tests/daemon.py``'s harness, free
loopback ports, a fresh temporary data dir removed afterwards, WAL fsync
``--fsync``, default ``everysec``).  Every load generator runs in a process
of its own, so the daemon keeps one core of a 2-core machine to itself.
Board ``bench`` has policy ``sum``; every submission is ``delta`` 1 for a
member drawn from 100,000 names.  REST submissions carry a unique
``event_id``; TCP ones run twice (``--kinds``), once without one and once
with one, each beside its Redis counterpart (3 below).

1. **REST** - 64 keep-alive connections POSTing
   ``{"member", "delta": 1, "event_id"}`` to ``/v1/boards/bench/scores``
   for ``--seconds``.  Driven by ``wrk`` (one thread, a Lua script) when it
   is installed, else by an aiohttp ``ClientSession`` with 64 workers.
   Target: >= 10,000/s with p99 <= 50 ms.
2. **TCP** - a lean raw-socket asyncio load generator (``asyncio.Protocol``
   over uvloop), 50 connections, each keeping 1 (non-pipelined) or 16
   (pipelined) submit requests in flight (``--depths`` picks other depths).
   It shares the machine with the server, so it does little per request:
   a submit frame is a pre-encoded part per member plus the id (and the
   event id), request ids cycle through msgpack's one-byte integers, and a
   reply is read from its first bytes (decoded only when it is an error);
   it checks at start that its frames are ``rankd.wire``'s, byte for byte.
   Two kinds of submission, each a row of its own at every depth:

   * ``plain``: no event id, an increment like Redis's ``ZINCRBY``;
   * ``ids``: a unique ``event_id`` each, which rankd remembers for a day
     so that a retry is answered with the first answer and applied once.

   Target for pipelined submissions with event ids: >= 200,000/s.
3. **Redis** - when ``redis-server`` is installed, one is started on a free
   loopback port (``--save "" --appendonly no``) and driven by the same
   load generator design (raw RESP): ``ZINCRBY bench 1 <member>`` beside
   plain submissions, and beside those with event ids the same guarantee
   built from Redis's parts, as an application would: a Lua script
   (``EVALSHA``, :data:`IDEMPOTENT_SCRIPT`) that answers an id it has seen
   with the score it stored for it, else runs ``ZINCRBY`` and stores its
   answer under the id for a day.  The run checks that script first (a
   retry answers the first answer and changes nothing).  50 connections at
   each depth, each right after rankd's scenario at that depth (once the
   daemon is idle: it may snapshot after a load), so that a ratio compares
   the two in the same minute of this noisy machine; ``--rounds`` times
   alternately (3 by default), the rows giving each server's median run
   and the notes every round's rates.  At depth 16 a second Redis
   follows, with its append-only file fsynced once a second
   (``--appendonly yes --appendfsync everysec``), as durable as rankd's
   default WAL: an information row for each kind.  ``redis-benchmark -c 50
   -P <depth>`` (``ZINCRBY``) runs last, for reference.  Redis is always
   stopped at the end.

Throughput counts the replies received in a measuring window that starts
after a warm-up; latency is from writing a request to reading its reply.
The notes under the table give client and server CPU use (a generator near
100 % of its core means it, not the server, was the limit), errors, and any
other ``bench_`` process found running (the CPU was then shared).

Run from the project root (the package installed)::

    python bench/bench_daemon.py                  # full run, about 3 minutes
    python bench/bench_daemon.py --quick          # 2 s per scenario
    python bench/bench_daemon.py --no-redis --fsync always
    python bench/bench_daemon.py --profile /tmp/daemon_tcp.txt  # + py-spy, pipelined TCP
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import hashlib
import json
import os
import random
import re
import resource
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

from neighbours import other_benchmarks
from rankd import wire
from rankd.frontends.resp.protocol import encode_request

ROOT = Path(__file__).resolve().parent.parent
_pack = msgpack.Packer(use_bin_type=True).pack
#: A reply frame's length, array header, first and second byte of its payload.
_reply_head = struct.Struct(">IBBB").unpack_from
BOARD = "bench"
MEMBERS = 100_000
REST_CONNECTIONS = 64
TCP_CONNECTIONS = 50
PIPELINE_DEPTH = 16
REST_TARGET = 10_000
REST_P99_TARGET_MS = 50.0
PIPELINED_TARGET = 200_000
#: Request ids cycle through 2..127 (see request_id_of); depths stay below.
ID_CYCLE = 126
MAX_DEPTH = 100
DRAIN_SECONDS = 5.0
#: The kinds of TCP submission (see the module docstring), each a row per depth.
KINDS = ("plain", "ids")
#: What an application adds to Redis for rankd's event ids: an id seen
#: within a day is answered with the score stored for it and changes
#: nothing; else the increment, and its answer stored under the id.
IDEMPOTENT_SCRIPT = """\
local done = redis.call('GET', KEYS[2])
if done then return done end
local score = redis.call('ZINCRBY', KEYS[1], ARGV[1], ARGV[2])
redis.call('SET', KEYS[2], score, 'EX', 86400)
return score
"""
IDEMPOTENT_SHA = hashlib.sha1(IDEMPOTENT_SCRIPT.encode()).hexdigest()

WRK_SCRIPT = """\
local counter = 0
local threads = 0
function setup(thread)
  thread:set("tid", threads)
  threads = threads + 1
end
function init(args)
  math.randomseed(os.time() + tid * 7919)
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
end
function request()
  counter = counter + 1
  local body = string.format('{"member":"m%d","delta":1,"event_id":"rest-%d-%d"}',
                             math.random(0, 99999), tid, counter)
  return wrk.format(nil, nil, nil, body)
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('WRKJSON {"requests":%d,"duration_us":%d,"connect":%d,"read":%d,'
    .. '"write":%d,"status":%d,"timeout":%d,"p50_us":%d,"p99_us":%d,"max_us":%d}\\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(99), latency.max))
end
"""


# --- results --------------------------------------------------------------------------------

@dataclass
class Result:
    """One measured scenario on one server."""

    rate: float
    p50_ms: float | None = None
    p99_ms: float | None = None
    errors: int = 0
    notes: list[str] = field(default_factory=list)
    other_cpu: float = 0.0  # CPU share of other processes while measuring

    @classmethod
    def from_worker(cls, data: dict[str, Any]) -> Result:
        notes = [cpu_note(data["client_cpu"], data["server_cpu"], data["other_cpu"])]
        if data["errors"]:
            notes.append(f"{data['errors']} error replies, first: {data['first_error']}")
        if data["lost"]:
            notes.append(f"{len(data['lost'])} connections lost: {data['lost'][0]}")
        return cls(data["rate"], data["p50_ms"], data["p99_ms"],
                   data["errors"] + len(data["lost"]), notes, data["other_cpu"])


def cpu_note(client: float, server: float, other: float) -> str:
    """CPU use in % of one core; ``other``: the rest of the machine (shared CPU)."""
    return (f"CPU (100% = one core): client {client:.0%}, server {server:.0%}, "
            f"other processes {max(0.0, other):.0%}")


@dataclass
class Row:
    scenario: str
    rankd: Result | None
    redis: Result | None
    target: str = "-"
    passed: bool | None = None


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (all its threads) so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float:
    """CPU seconds all processes of the machine have used (from /proc/stat)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def percentile_ms(sorted_ns: list[int], fraction: float) -> float | None:
    if not sorted_ns:
        return None
    return sorted_ns[min(len(sorted_ns) - 1, int(fraction * len(sorted_ns)))] / 1e6


# --- the load generator (runs in a worker process) --------------------------------------

@dataclass
class Load:
    """State shared by every connection of one load run."""

    depth: int
    started: bool = False
    recording: bool = False
    stopping: bool = False
    latencies: list[int] = field(default_factory=list)
    errors: int = 0
    first_error: str | None = None
    lost: list[str] = field(default_factory=list)


class LoadConnection(asyncio.Protocol):
    """Keeps ``load.depth`` requests in flight; subclasses speak the protocol."""

    greeting: bytes | None = None

    def __init__(self, load: Load, index: int, order: list[Any]) -> None:
        self.load = load
        self.index = index
        self.order = order
        self.cursor = random.randrange(len(order))
        self.transport: asyncio.Transport | None = None
        self.pending: dict[int, int] = {}
        self.sent = 0
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self.greeting is None:
            self.ready.set_result(None)
        else:
            self.transport.write(self.greeting)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.load.stopping:
            self.load.lost.append(repr(exc) if exc else "closed by the server")
        if not self.ready.done():
            self.ready.set_exception(ConnectionError("closed before the greeting"))

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter_ns()
        load = self.load
        pending = self.pending
        latencies = load.latencies if load.recording else None
        for request_id, error in self.replies(data):
            sent = pending.pop(request_id)
            if latencies is not None:
                latencies.append(now - sent)
            if error is not None:
                load.errors += 1
                load.first_error = load.first_error or error
        self.fill()

    def fill(self) -> None:
        """Top the requests in flight up to the depth, in one write."""
        load = self.load
        missing = load.depth - len(self.pending)
        if missing <= 0 or load.stopping or not load.started:
            return
        now = time.perf_counter_ns()
        frames = []
        pending = self.pending
        for _ in range(missing):
            request_id = request_id_of(self.sent)
            self.sent += 1
            if request_id in pending:
                raise RuntimeError(f"request id {request_id} is still in flight")
            pending[request_id] = now
            frames.append(self.request(request_id))
        self.transport.write(b"".join(frames))

    def next_item(self) -> Any:
        """The next member's pre-encoded request part, in this connection's order."""
        self.cursor += 1
        return self.order[self.cursor % len(self.order)]

    def request(self, request_id: int) -> bytes:
        raise NotImplementedError

    def replies(self, data: bytes) -> list[tuple[int, str | None]]:
        """``(request id, error or None)`` of every complete reply in ``data``."""
        raise NotImplementedError


def request_id_of(count: int) -> int:
    """The id of a connection's ``count``-th request: ids cycle through
    2..127 (1 is the greeting's), msgpack's one-byte integers, so the load
    generator can read a reply's id and status without decoding it.  A
    connection answers in order, so an id is free again long before it comes
    round (``--depths`` stays below the cycle; :meth:`LoadConnection.fill`
    checks)."""
    return 2 + count % ID_CYCLE


class RankdConnection(LoadConnection):
    """rankd TCP protocol: hello, then ``submit`` frames matched by id.

    Lean on purpose, since it shares the machine with the server: a request
    is a pre-encoded part per member plus the id and the event id, and a
    reply is read from its first bytes (``[id, 0, ...]`` is a success),
    decoded only when it is an error.  :func:`check_rankd_encoding` holds
    both to ``rankd.wire``'s encoding."""

    greeting = wire.request(1, "hello", {"version": wire.VERSION, "client": "bench_daemon"})

    def __init__(self, load: Load, index: int, order: list[Any], tag: str,
                 event_ids: bool = True) -> None:
        super().__init__(load, index, order)
        self.buffer = bytearray()
        self.event_prefix = f"{tag}-{index}-" if event_ids else None

    def request(self, request_id: int) -> bytes:
        parts = [b"\x93", _pack(request_id), self.next_item()]
        if self.event_prefix is not None:
            parts.append(_pack(f"{self.event_prefix}{self.sent}"))
        payload = b"".join(parts)
        return len(payload).to_bytes(4, "big") + payload

    def replies(self, data: bytes) -> list[tuple[int, str | None]]:
        buffer = self.buffer
        if buffer:
            buffer += data
            data = bytes(buffer)
            buffer.clear()
        done: list[tuple[int, str | None]] = []
        position, size = 0, len(data)
        while size - position >= 7:
            length, array, request_id, status = _reply_head(data, position)
            end = position + 4 + length
            if end > size:
                break
            if array == 0x93 and 1 < request_id < 0x80 and status == wire.OK:
                done.append((request_id, None))  # [id, 0, body]: a success
            elif reply := self.decoded(data[position + 4:end]):
                done.append(reply)
            position = end
        if position < size:
            buffer += data[position:]
        return done

    def decoded(self, payload: bytes) -> tuple[int, str | None] | None:
        """``(id, error)`` of a reply read the long way (an error), or None
        for the greeting's."""
        request_id, ok, body = wire.parse_response(msgpack.unpackb(payload))
        error = None if ok else f"{body['code']}: {body['message']}"
        if not self.ready.done():
            if error:
                self.ready.set_exception(ConnectionError(f"hello refused: {error}"))
            else:
                self.ready.set_result(None)
            return None
        return request_id, error


def submit_parts(names: list[str], event_ids: bool = True) -> list[bytes]:
    """Per member, the part of a submit request after its id (up to its
    event id, with ``event_ids``)."""
    header, tail = (b"\x84", ("event_id",)) if event_ids else (b"\x83", ())
    return [_pack("submit") + header + b"".join(map(_pack, (
        "board", BOARD, "member", name, "delta", 1, *tail))) for name in names]


def check_rankd_encoding() -> None:
    """The lean generator's frames are ``rankd.wire``'s, byte for byte."""
    load = Load(depth=1)
    for event_ids in (True, False):
        connection = RankdConnection(load, 3, submit_parts(["m7"], event_ids), "t", event_ids)
        for count in (0, 125, 126, 1000):
            connection.sent = count
            request_id = request_id_of(count)
            body = {"board": BOARD, "member": "m7", "delta": 1}
            if event_ids:
                body["event_id"] = f"t-3-{count}"
            if connection.request(request_id) != wire.request(request_id, "submit", body):
                raise AssertionError("the load generator's submit frame is not rankd.wire's")
    body = {"member": "m7", "score": 2.0, "rank": 1, "previous": 1.0, "changed": True}
    replies = [wire.ok(request_id_of(n), body) for n in range(300)]
    replies.insert(7, wire.error(9, "invalid", "no"))
    connection.ready.set_result(None)
    stream = b"".join(replies)
    got = [reply for start in range(0, len(stream), 97)
           for reply in connection.replies(stream[start:start + 97])]
    if got != [*((request_id_of(n), None) for n in range(7)), (9, "invalid: no"),
               *((request_id_of(n), None) for n in range(7, 300))]:
        raise AssertionError("the load generator misreads rankd replies")


class RedisConnection(LoadConnection):
    """RESP ``ZINCRBY``, or with ``tag`` the idempotent script (``EVALSHA``)
    under a unique id; replies come in request order, so ids are implicit."""

    def __init__(self, load: Load, index: int, order: list[Any], tag: str | None = None
                 ) -> None:
        super().__init__(load, index, order)
        self.buffer = bytearray()
        self.replied = 0
        self.id_prefix = None if tag is None else f"ev:{tag}-{index}-"

    def request(self, request_id: int) -> bytes:
        if self.id_prefix is None:
            return self.next_item()
        key = f"{self.id_prefix}{self.sent}".encode()
        return b"%s$%d\r\n%s\r\n%s" % (_EVALSHA_HEAD, len(key), key, self.next_item())

    def replies(self, data: bytes) -> list[tuple[int, str | None]]:
        buffer = self.buffer
        buffer += data
        done = []
        position = 0
        while (end := buffer.find(b"\r\n", position)) >= 0:
            kind = buffer[position]
            error = None
            if kind == 0x24:  # "$": bulk string, the new score
                length = int(buffer[position + 1:end])
                stop = end + 4 + length if length >= 0 else end + 2
                if stop > len(buffer):
                    break
                position = stop
            else:
                if kind == 0x2D:  # "-": an error
                    error = buffer[position + 1:end].decode(errors="replace")
                position = end + 2
            done.append((request_id_of(self.replied), error))
            self.replied += 1
        del buffer[:position]
        return done


def member_names() -> list[str]:
    names = [f"m{n}" for n in range(MEMBERS)]
    random.shuffle(names)
    return names


def redis_commands(names: list[str]) -> list[bytes]:
    return [b"*4\r\n$7\r\nZINCRBY\r\n$%d\r\n%s\r\n$1\r\n1\r\n$%d\r\n%s\r\n"
            % (len(BOARD), BOARD.encode(), len(name), name.encode()) for name in names]


#: ``EVALSHA <sha> 2 <board>``: the idempotent script's request up to its id key.
_EVALSHA_HEAD = b"*7\r\n$7\r\nEVALSHA\r\n$40\r\n%s\r\n$1\r\n2\r\n$%d\r\n%s\r\n" % (
    IDEMPOTENT_SHA.encode(), len(BOARD), BOARD.encode())


def redis_idempotent_parts(names: list[str]) -> list[bytes]:
    """Per member, the idempotent script's arguments after its id key."""
    return [b"$1\r\n1\r\n$%d\r\n%s\r\n" % (len(name), name.encode()) for name in names]


def redis_call(port: int, *arguments: str) -> bytes:
    """One command to the Redis on ``port``; its raw reply (one read)."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(encode_request(arguments))
        return sock.recv(65536)


def load_idempotent_script(port: int) -> None:
    """Load the script into the Redis on ``port`` and check that it does
    what rankd's event ids do: a retry is answered with the first answer and
    changes nothing."""
    if redis_call(port, "SCRIPT", "LOAD", IDEMPOTENT_SCRIPT) != b"$40\r\n%s\r\n" % (
            IDEMPOTENT_SHA.encode()):
        raise AssertionError("SCRIPT LOAD did not answer the script's SHA-1")
    call = ("EVALSHA", IDEMPOTENT_SHA, "2", "check", "ev:check")
    answers = [redis_call(port, *call, "5", "m"), redis_call(port, *call, "7", "m"),
               redis_call(port, "ZSCORE", "check", "m")]
    redis_call(port, "DEL", "check", "ev:check")
    if answers != [b"$1\r\n5\r\n"] * 3:
        raise AssertionError(f"the idempotent script misbehaves: {answers}")


def cpu_sample(server_pid: int) -> tuple[float, float, float, float]:
    """(wall clock, this process's CPU, the server's CPU, the machine's CPU) now."""
    return (time.perf_counter(), time.process_time(), cpu_seconds(server_pid),
            machine_busy_seconds())


def cpu_shares(before: tuple[float, ...], after: tuple[float, ...]
               ) -> tuple[float, float, float, float]:
    """(elapsed, client, server, others' CPU share) between two :func:`cpu_sample`."""
    elapsed, client, server, machine = (b - a for a, b in zip(before, after, strict=True))
    return (elapsed, client / elapsed, server / elapsed,
            (machine - client - server) / elapsed)


def instrument(pid: int, on: bool) -> None:
    """Turn callgrind's counting in process ``pid`` on or off (a server run
    under ``valgrind --tool=callgrind --instr-atstart=no``)."""
    subprocess.run(["callgrind_control", "-i", "on" if on else "off", str(pid)],
                   check=True, capture_output=True)


async def measure(load: Load, spec: dict[str, Any]) -> tuple[float, float, float, float]:
    """Warm up, then record for ``spec["seconds"]``; CPU shares as :func:`cpu_shares`.
    With ``spec["callgrind"]`` the server's instructions are counted while
    recording (``bench_change.py --callgrind``)."""
    await asyncio.sleep(spec["warmup"])
    if spec.get("callgrind"):
        instrument(spec["server_pid"], True)
    before = cpu_sample(spec["server_pid"])
    load.recording = True
    await asyncio.sleep(spec["seconds"])
    load.recording = False
    after = cpu_sample(spec["server_pid"])
    if spec.get("callgrind"):
        instrument(spec["server_pid"], False)
    return cpu_shares(before, after)


def summary(load: Load, elapsed: float, client_cpu: float, server_cpu: float,
            other_cpu: float) -> dict[str, Any]:
    latencies = sorted(load.latencies)
    return {"rate": len(latencies) / elapsed, "replies": len(latencies), "elapsed": elapsed,
            "p50_ms": percentile_ms(latencies, 0.50), "p99_ms": percentile_ms(latencies, 0.99),
            "max_ms": percentile_ms(latencies, 1.0), "errors": load.errors,
            "first_error": load.first_error, "lost": load.lost,
            "client_cpu": client_cpu, "server_cpu": server_cpu, "other_cpu": other_cpu}


async def run_socket_load(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec["connections"]`` connections at ``spec["depth"]`` in flight each."""
    load = Load(depth=spec["depth"])
    names = member_names()
    event_ids = spec["kind"] == "ids"
    if spec["protocol"] == "rankd":
        check_rankd_encoding()
        factory: Callable[..., LoadConnection] = functools.partial(
            RankdConnection, load, order=submit_parts(names, event_ids), tag=spec["tag"],
            event_ids=event_ids)
    elif event_ids:
        factory = functools.partial(RedisConnection, load, order=redis_idempotent_parts(names),
                                    tag=spec["tag"])
    else:
        factory = functools.partial(RedisConnection, load, order=redis_commands(names))
    loop = asyncio.get_running_loop()
    connections: list[LoadConnection] = []
    for index in range(spec["connections"]):
        _, connection = await loop.create_connection(functools.partial(factory, index),
                                                     "127.0.0.1", spec["port"])
        connections.append(connection)
    await asyncio.gather(*(connection.ready for connection in connections))
    load.started = True
    for connection in connections:
        connection.fill()
    measured = await measure(load, spec)
    load.stopping = True
    deadline = time.monotonic() + DRAIN_SECONDS
    while any(c.pending for c in connections) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    for connection in connections:
        connection.transport.close()
    return summary(load, *measured)


async def rest_worker(session: Any, url: str, load: Load, prefix: str) -> None:
    count = 0
    while not load.stopping:
        count += 1
        body = json.dumps({"member": f"m{random.randrange(MEMBERS)}", "delta": 1,
                           "event_id": f"{prefix}{count}"})
        began = time.perf_counter_ns()
        async with session.post(url, data=body,
                                headers={"Content-Type": "application/json"}) as response:
            await response.read()
        if load.recording:
            load.latencies.append(time.perf_counter_ns() - began)
        if response.status != 200:
            load.errors += 1
            load.first_error = load.first_error or f"HTTP {response.status}"


async def run_rest_load(spec: dict[str, Any]) -> dict[str, Any]:
    """aiohttp fallback for REST when wrk is not installed."""
    import aiohttp

    load = Load(depth=1, started=True)
    url = f"http://127.0.0.1:{spec['port']}/v1/boards/{BOARD}/scores"
    connector = aiohttp.TCPConnector(limit=spec["connections"])
    async with aiohttp.ClientSession(connector=connector) as session:
        tasks = [asyncio.create_task(rest_worker(session, url, load, f"{spec['tag']}-{index}-"))
                 for index in range(spec["connections"])]
        measured = await measure(load, spec)
        load.stopping = True
        await asyncio.wait(tasks, timeout=DRAIN_SECONDS)
    return summary(load, *measured)


def worker_main(spec: dict[str, Any]) -> dict[str, Any]:
    coroutine: Coroutine[Any, Any, dict[str, Any]] = (
        run_rest_load(spec) if spec["protocol"] == "rest" else run_socket_load(spec))
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coroutine)


# --- orchestration (the main process) -------------------------------------------------------

def run_worker(spec: dict[str, Any]) -> Result:
    """The load generator in a process of its own."""
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)]
    timeout = spec["warmup"] + spec["seconds"] + DRAIN_SECONDS + 60
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"load generator failed ({done.returncode}):\n{done.stderr}")
    return Result.from_worker(json.loads(done.stdout))


def run_wrk(port: int, seconds: float, server_pid: int, workdir: Path) -> Result:
    script = workdir / "submit.lua"
    script.write_text(WRK_SCRIPT)
    command = ["wrk", "-t1", f"-c{REST_CONNECTIONS}", f"-d{max(1, round(seconds))}s",
               "--timeout", "5s", "-s", str(script),
               f"http://127.0.0.1:{port}/v1/boards/{BOARD}/scores"]
    before = (time.perf_counter(), children_cpu_seconds(), cpu_seconds(server_pid),
              machine_busy_seconds())
    done = subprocess.run(command, capture_output=True, text=True, check=True,
                          timeout=seconds + 60)
    shares = cpu_shares(before, (time.perf_counter(), children_cpu_seconds(),
                                 cpu_seconds(server_pid), machine_busy_seconds()))
    match = re.search(r"^WRKJSON (.*)$", done.stdout, re.MULTILINE)
    if match is None:
        raise RuntimeError(f"unexpected wrk output:\n{done.stdout}\n{done.stderr}")
    data = json.loads(match.group(1))
    elapsed = data["duration_us"] / 1e6
    errors = sum(data[key] for key in ("connect", "read", "write", "status", "timeout"))
    notes = [" ".join(command[:4]) + " -s submit.lua (wrk, not aiohttp)", cpu_note(*shares[1:])]
    if errors:
        notes.append("wrk errors: " + ", ".join(
            f"{key} {data[key]}" for key in ("connect", "read", "write", "status", "timeout")))
    return Result(data["requests"] / elapsed, data["p50_us"] / 1e3, data["p99_us"] / 1e3,
                  errors, notes, shares[3])


def run_redis_benchmark(port: int, pipeline: int, requests: int) -> Result:
    command = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-c",
               str(TCP_CONNECTIONS), "-P", str(pipeline), "-n", str(requests), "-r",
               str(MEMBERS), "--csv", "ZINCRBY", "bench", "1", "m__rand_int__"]
    done = subprocess.run(command, capture_output=True, text=True, check=True, timeout=600)
    rows = [line.replace('"', "").split(",") for line in done.stdout.splitlines()]
    header, values = rows[0], rows[-1]
    data = dict(zip(header, values, strict=True))
    return Result(float(data["rps"]), float(data["p50_latency_ms"]),
                  float(data["p99_latency_ms"]), notes=[" ".join(command[:9])])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def redis_server(workdir: Path, *, aof: bool = False) -> Iterator[tuple[int, int]]:
    """A throwaway redis-server: ``(port, pid)``; always stopped afterwards.
    ``aof``: with its append-only file, fsynced once a second (rankd's
    default ``everysec``: both write each command to the OS before replying)."""
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    durability = ["--appendonly", "yes", "--appendfsync", "everysec"] if aof else [
        "--appendonly", "no"]
    process = subprocess.Popen(
        ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "",
         *durability, "--dir", str(workdir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_redis(port, process)
        yield port, process.pid
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_for_redis(port: int, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"redis-server exited with {process.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"PING\r\n")
            if s.recv(64).startswith(b"+PONG"):
                return
        time.sleep(0.05)
    raise RuntimeError("redis-server did not answer PING")


def start_daemon(data_dir: Path, fsync: str) -> Any:
    sys.path.insert(0, str(ROOT / "tests"))
    from daemon import Daemon

    daemon = Daemon(data_dir, "--fsync", fsync).start()
    parts = daemon.implementations()
    print("  daemon under test runs: " + " ".join(f"{k}={v}" for k, v in parts.items()),
          flush=True)
    FALLBACK.update(part for part, kind in parts.items() if kind != "native")
    status, body = daemon.request("PUT", f"/v1/boards/{BOARD}", {"policy": "sum"})
    if status not in (200, 201):
        raise RuntimeError(f"PUT /v1/boards/{BOARD} answered {status}: {body}")
    return daemon


def socket_spec(protocol: str, port: int, depth: int, pid: int, seconds: float,
                tag: str = "", kind: str = "ids") -> dict[str, Any]:
    """A load run's settings; ``kind`` is one of KINDS (``tag`` makes its ids unique)."""
    return {"protocol": protocol, "port": port, "connections": TCP_CONNECTIONS,
            "depth": depth, "server_pid": pid, "seconds": seconds,
            "warmup": min(1.0, seconds / 4), "tag": tag, "kind": kind}


def bench_rankd(daemon: Any, seconds: float, workdir: Path, depths: list[int],
                redis: dict[str, tuple[int, int]], rounds: int = 1,
                kinds: tuple[str, ...] = KINDS) -> list[Row]:
    """REST, then each TCP depth and kind: rankd, and right after it Redis
    (``redis``: port and pid of the plain one, and of the one with an AOF,
    if running) at the same depth, so that both see the machine in the same
    mood, ``rounds`` times (each row gives the median run of each); Redis
    waits until the daemon is idle (it may snapshot after a load).  The
    Redis with an AOF runs at PIPELINE_DEPTH only, once a kind."""
    pid = daemon.process.pid
    if shutil.which("wrk"):
        rest = run_wrk(daemon.port, seconds, pid, workdir)
    else:
        spec = {**socket_spec("rest", daemon.port, 1, pid, seconds, tag="rest"),
                "connections": REST_CONNECTIONS}
        rest = run_worker(spec)
        rest.notes.insert(0, "aiohttp ClientSession, 64 workers (wrk not installed)")
    rest_ok = rest.rate >= REST_TARGET and (rest.p99_ms or 0) <= REST_P99_TARGET_MS
    rows = [Row(f"REST {REST_CONNECTIONS} conns keep-alive", rest, None,
                f">={REST_TARGET:,}/s p99<={REST_P99_TARGET_MS:g}ms", rest_ok and not rest.errors)]
    aof_rows: list[Row] = []
    for depth in depths:
        for kind in kinds:
            # Alternately, ``rounds`` times: each ratio compares neighbours
            # in time, and the medians damp this shared machine's swings.
            runs: dict[str, list[Result]] = {"rankd": [], "redis": []}
            for _ in range(rounds):
                tag = f"tcp{depth}-{time.time_ns()}"
                runs["rankd"].append(run_worker(socket_spec(
                    "rankd", daemon.tcp_port, depth, pid, seconds, tag=tag, kind=kind)))
                if "plain" in redis:
                    wait_idle(pid)
                    port, redis_pid = redis["plain"]
                    runs["redis"].append(run_worker(socket_spec(
                        "redis", port, depth, redis_pid, seconds, tag=tag, kind=kind)))
            result = median_run(runs["rankd"])
            targeted = depth == PIPELINE_DEPTH and kind == "ids"
            passed = (result.rate >= PIPELINED_TARGET and not result.errors) if targeted else None
            target = f">={PIPELINED_TARGET:,}/s" if targeted else "-"
            row = Row(tcp_name(depth, kind), result, median_run(runs["redis"]), target, passed)
            if rounds > 1:
                result.notes.append("rounds, rankd/s" + (" vs redis/s" if runs["redis"] else "")
                                    + ": " + ", ".join(
                                        f"{mine.rate:,.0f}" + (f" vs {theirs.rate:,.0f}"
                                                               if theirs else "")
                                        for mine, theirs in zip(runs["rankd"], runs["redis"]
                                                                or [None] * rounds, strict=True)))
            rows.append(row)
            if "aof" in redis and depth == PIPELINE_DEPTH:
                wait_idle(pid)
                port, redis_pid = redis["aof"]
                durable = run_worker(socket_spec("redis", port, depth, redis_pid, seconds,
                                                 tag=f"aof-{time.time_ns()}", kind=kind))
                aof_rows.append(Row(f"{tcp_name(depth, kind)}, redis AOF everysec", result,
                                    durable))
    return rows + aof_rows


def median_run(runs: list[Result]) -> Result | None:
    """The run of median rate (the lower middle one of an even count)."""
    if not runs:
        return None
    return sorted(runs, key=lambda run: run.rate)[(len(runs) - 1) // 2]


def wait_idle(pid: int, timeout: float = 60.0) -> None:
    """Return once process ``pid`` has used under 5% of a core for half a
    second (or after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        used = cpu_seconds(pid)
        time.sleep(0.5)
        if cpu_seconds(pid) - used < 0.025:
            return


def tcp_name(depth: int, kind: str = "plain") -> str:
    return (f"TCP {TCP_CONNECTIONS} conns depth {depth}" + (" (pipelined)" if depth > 1 else "")
            + (", event ids" if kind == "ids" else ""))


def bench_redis(rows: list[Row], seconds: float, depths: list[int], port: int) -> None:
    """Add the redis-benchmark rows (``ZINCRBY``), against the plain Redis on ``port``."""
    for depth in depths:
        measured = [row.redis.rate for row in rows if row.redis and row.scenario in (
            tcp_name(depth, "plain"), tcp_name(depth, "ids"))]
        requests = max(50_000, int(max(measured, default=0) * seconds))
        result = run_redis_benchmark(port, depth, requests)
        rows.append(Row(f"redis-benchmark -c {TCP_CONNECTIONS} -P {depth}", None, result))


def profile_daemon(daemon: Any, seconds: float, output: Path) -> str:
    """py-spy on the daemon under pipelined TCP load; the top frames by self time."""
    duration = max(1, round(seconds))
    spy = subprocess.Popen(["py-spy", "record", "--native", "-f", "raw", "-r", "250",
                            "--pid", str(daemon.process.pid),
                            "-d", str(duration), "-o", str(output)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    load = run_worker(socket_spec("rankd", daemon.tcp_port, PIPELINE_DEPTH,
                                  daemon.process.pid, duration + 1.0,
                                  tag=f"profile-{time.time_ns()}"))
    spy_output, _ = spy.communicate(timeout=60)
    if spy.returncode != 0:
        return f"py-spy failed ({spy.returncode}): {spy_output.strip()}"
    return (f"py-spy profile of the daemon under pipelined TCP load ({load.rate:,.0f}/s while "
            f"sampled), raw stacks in {output}\n" + top_frames(output))


def top_frames(path: Path, count: int = 20) -> str:
    """The ``count`` leaf frames with the most samples (self time), line numbers merged."""
    totals: dict[str, int] = {}
    for line in path.read_text().splitlines():
        stack, _, samples = line.rpartition(" ")
        if not stack or not samples.isdigit():
            continue
        leaf = re.sub(r":\d+\)$", ")", stack.rsplit(";", 1)[-1])
        totals[leaf] = totals.get(leaf, 0) + int(samples)
    grand = sum(totals.values()) or 1
    ranked = sorted(totals.items(), key=lambda item: -item[1])[:count]
    lines = [f"  {'self %':>6}  {'samples':>7}  frame", *(
        f"  {100 * n / grand:6.1f}  {n:7d}  {frame}" for frame, n in ranked)]
    return "\n".join([f"  {grand} samples", *lines])


# --- reporting -----------------------------------------------------------------------------

def source_version() -> str:
    """The git commit the package is run from, ``+dirty`` with local changes."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                              check=False).stdout.strip()
    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    return commit + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def fmt_rate(result: Result | None) -> str:
    return "-" if result is None else f"{result.rate:,.0f}"


def fmt_ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def fmt_pair(rankd: Result | None, redis: Result | None, attribute: str) -> str:
    values = [fmt_ms(getattr(r, attribute)) for r in (rankd, redis) if r is not None]
    return " / ".join(values) if values else "-"


#: Parts a daemon under test ran in pure Python: no ratio against Redis then.
FALLBACK: set[str] = set()


def row_cells(row: Row) -> list[str]:
    ratio = (f"{row.rankd.rate / row.redis.rate:.2f}x"
             if row.rankd and row.redis and row.redis.rate and not FALLBACK else "-")
    verdict = {True: "PASS", False: "MISS", None: "info"}[row.passed]
    if row.rankd and row.rankd.errors:
        verdict += " (errors)"
    return [row.scenario, fmt_rate(row.rankd), fmt_rate(row.redis), ratio,
            fmt_pair(row.rankd, row.redis, "p50_ms"), fmt_pair(row.rankd, row.redis, "p99_ms"),
            row.target, verdict]


def print_table(rows: list[Row]) -> None:
    header = ["scenario", "rankd/s", "redis/s", "ratio", "p50 ms", "p99 ms", "target",
              "result"]
    table = [header, *(row_cells(row) for row in rows)]
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    right = {1, 2, 3}
    for line in table:
        print("  ".join(cell.rjust(w) if i in right else cell.ljust(w)
                        for i, (cell, w) in enumerate(zip(line, widths, strict=True))).rstrip())
    print("p50/p99: rankd / redis where both ran; redis-benchmark rows: its own figures.")
    if FALLBACK:
        print(f"NO RATIOS: the daemon ran {', '.join(sorted(FALLBACK))} in pure Python "
              "(the native modules are not built or not installed); its figures say "
              "nothing about rankd against Redis.")


def print_notes(rows: list[Row]) -> None:
    for row in rows:
        for server, result in (("rankd", row.rankd), ("redis", row.redis)):
            for note in result.notes if result else []:
                print(f"  {row.scenario} [{server}]: {note}")


def print_sharing(rows: list[Row], others: list[str]) -> None:
    """Whether other processes took CPU from the measurement."""
    busiest = max((result.other_cpu for row in rows for result in (row.rankd, row.redis)
                   if result), default=0.0)
    print(f"  other processes used up to {busiest:.0%} of a core during a scenario"
          + (" (the CPU was shared)" if busiest >= 0.1 else ""))
    print("  other bench_ processes seen: " + ("none" if not others else
                                               "\n    " + "\n    ".join(others)))


def daemon_health(daemon: Any) -> list[str]:
    """Problems seen in the daemon's exit code and log."""
    problems = []
    code = daemon.stop()
    if code != 0:
        problems.append(f"the daemon exited with {code}")
    lines = daemon.log().splitlines()
    bad = [i for i, line in enumerate(lines) if "Traceback" in line or " ERROR " in line]
    if bad:
        start = max(0, bad[0] - 2)
        problems.append("daemon log excerpt:\n" + "\n".join(lines[start:start + 40]))
    return problems


# --- main -------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0,
                        help="measuring time of each scenario (default 10)")
    parser.add_argument("--quick", action="store_true", help="2 s per scenario")
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternate rounds of rankd and Redis at each TCP depth; the "
                             "rows give the median run of each (default 3)")
    parser.add_argument("--no-redis", action="store_true", help="skip the Redis comparison")
    parser.add_argument("--fsync", default="everysec", choices=("always", "everysec", "no"),
                        help="the daemon's WAL fsync policy (default everysec)")
    parser.add_argument("--profile", type=Path, metavar="FILE",
                        help="also run py-spy (raw format, to FILE) on the daemon under "
                             "pipelined TCP load and print the top 20 frames by self time")
    parser.add_argument("--depths", type=depth_list, default=[1, PIPELINE_DEPTH],
                        metavar="N,N,...",
                        help=f"TCP pipelining depths, rankd and Redis alike (default "
                             f"1,{PIPELINE_DEPTH}; the target applies at {PIPELINE_DEPTH})")
    parser.add_argument("--kinds", type=kind_list, default=KINDS, metavar="KIND,...",
                        help="kinds of TCP submission, each a row per depth: plain (no "
                             "event id, beside ZINCRBY) and ids (a unique event id each, "
                             "beside Redis's idempotent script); default both")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def kind_list(text: str) -> tuple[str, ...]:
    kinds = tuple(part.strip() for part in text.split(","))
    unknown = [kind for kind in kinds if kind not in KINDS]
    if not kinds or unknown:
        raise argparse.ArgumentTypeError(f"kinds are among {', '.join(KINDS)}: {text!r}")
    return kinds


def depth_list(text: str) -> list[int]:
    try:
        depths = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of depths: {text!r}") from None
    if not depths or min(depths) < 1 or max(depths) > MAX_DEPTH:
        raise argparse.ArgumentTypeError(f"depths are integers in 1..{MAX_DEPTH}")
    return depths


def run_all(args: argparse.Namespace, seconds: float, workdir: Path) -> tuple[list[Row], str]:
    with contextlib.ExitStack() as stack:
        redis: dict[str, tuple[int, int]] = {}
        if not args.no_redis and shutil.which("redis-server"):
            redis["plain"] = stack.enter_context(redis_server(workdir / "redis"))
            if PIPELINE_DEPTH in args.depths:
                redis["aof"] = stack.enter_context(redis_server(workdir / "redis-aof", aof=True))
            if "ids" in args.kinds:
                for port, _ in redis.values():
                    load_idempotent_script(port)
        elif not args.no_redis:
            print("redis-server is not installed: no Redis comparison "
                  "(apt-get install -y redis-server redis-tools)", file=sys.stderr)
        daemon = start_daemon(workdir / "data", args.fsync)
        profile = ""
        try:
            rows = bench_rankd(daemon, seconds, workdir, args.depths, redis, args.rounds,
                               args.kinds)
            if args.profile:
                profile = profile_daemon(daemon, seconds, args.profile)
        finally:
            problems = daemon_health(daemon)
        for problem in problems:
            print(f"DAEMON PROBLEM: {problem}", file=sys.stderr)
        if redis:
            bench_redis(rows, seconds, args.depths, redis["plain"][0])
    return rows, profile


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(worker_main(json.loads(args.worker))))
        return 0
    seconds = 2.0 if args.quick else args.seconds
    before = other_benchmarks()
    print(f"rankd daemon benchmark (source {source_version()}): {seconds:g} s per scenario, "
          f"fsync={args.fsync}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="rankd-bench-") as tmp:
        rows, profile = run_all(args, seconds, Path(tmp))
    after = other_benchmarks()
    print()
    print_table(rows)
    print("notes:")
    print_notes(rows)
    print_sharing(rows, sorted(set(before) | set(after)))
    if profile:
        print(profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
