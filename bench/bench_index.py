#!/usr/bin/env python3
"""Benchmark the rank index: native skip list vs pure-Python fallback vs Redis sorted sets.

What it measures
----------------
One board of N members ``"player:<i>"`` (integer scores drawn with
``random.Random(42)`` in 0..1_000_000, order ``desc``, tie-break ``first``) is
built in each contestant, then:

1. bulk load: ``apply_batch`` of ``(Op.SET, member, score)`` in chunks of
   10_000 (seconds; Redis: pipelined ``ZADD`` of 10_000 pairs per command);
2. ``incr(member, 1)`` then ``rank(member)`` per call on random existing
   members (pairs/s; Redis: one ``EVAL`` doing ``ZINCRBY`` + ``ZREVRANK``);
3. ``apply_batch`` of ``(Op.INCR, member, 1.0)`` in batches of 1000, whose
   results include the rank (ops/s; Redis: ``ZINCRBY``, which returns the
   score only);
4. top-10 read ``range_by_rank(0, 10)`` (reads/s; Redis:
   ``ZREVRANGE lb 0 9 WITHSCORES``);
5. ``rank(member)`` of a random member (reads/s; Redis: ``ZREVRANK``);
6. ``around(member, 5, 5)`` (reads/s; Redis: one ``EVAL`` doing ``ZREVRANK``
   then ``ZREVRANGE r-5 r+5 WITHSCORES``);
7. ``ranks(100 random members)`` (members/s; Redis: one ``EVAL`` doing 100
   ``ZREVRANK`` calls);
8. ``dump()`` and ``load()`` (seconds; Redis: ``DUMP`` and ``RESTORE`` of the
   key, through a loopback socket);
9. memory per member: growth of the resident set size (``/proc/self/statm``,
   after ``gc.collect()``) from the state before the first load to the
   populated index, divided by N (Redis: growth of ``INFO memory``
   ``used_memory``); and the same growth once a random half is removed (and
   a tenth of the rest incremented), divided by the members left (rankd only).

Each rankd implementation runs in a fresh child process (this script with
the hidden ``--worker`` option) so that memory figures start from a clean
interpreter and one contestant's heap does not disturb the next.  Random
member choices are drawn before the clock starts; every timed figure is the
median of ``--repeats`` runs, timed with ``time.perf_counter``.

Redis is measured with its own ``redis-benchmark`` (``-c 50``, once without
pipelining and once with ``-P 64``) against a private ``redis-server`` that
this script starts on a free loopback port and always stops.  Its
``__rand_int__`` placeholder expands to 12-digit zero-padded numbers, so the
Redis board's members are named ``player:%012d`` (every benchmark command
hits an existing member; the script checks that ``ZCARD`` did not grow).

How to run
----------
::

    python bench/bench_index.py --quick          # smoke run, a few seconds
    python bench/bench_index.py                  # 1M members, about 4 minutes
    python bench/bench_index.py --no-redis --no-fallback --members 100000

Redis needs ``redis-server`` and ``redis-benchmark`` on the PATH (Debian:
``apt-get install -y redis-server redis-tools``); it is a benchmark-only
tool, not a rankd dependency.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import gc
import io
import json
import os
import platform
import random
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any

LOAD_CHUNK = 10_000
INCR_BATCH = 1_000
RANKS_BATCH = 100
MAX_SCORE = 1_000_000
SEED = 42
REDIS_KEY = "lb"
REDIS_CLIENTS = 50
REDIS_PIPELINE = 64
QUICK = {"members": 20_000, "ops": 2_000, "repeats": 1}

Results = dict[str, Any]


# --- dataset -------------------------------------------------------------------------------


def make_dataset(n: int, names: str = "short") -> tuple[list[str], list[int]]:
    """Members ``player:<i>`` (``names="padded"``: ``player:%012d``, 19 bytes,
    as Redis's benchmark names them) and their scores, the same in every process."""
    rng = random.Random(SEED)
    template = "player:{:012d}" if names == "padded" else "player:{}"
    members = [template.format(i) for i in range(n)]
    scores = [rng.randint(0, MAX_SCORE) for _ in range(n)]
    return members, scores


def pick(members: Sequence[str], count: int, seed: int) -> list[str]:
    """``count`` random existing members, drawn before any clock starts."""
    return random.Random(seed).choices(members, k=count)


def rss_bytes() -> int:
    """Resident set size of this process, after a full collection."""
    gc.collect()
    with open("/proc/self/statm") as f:
        resident_pages = int(f.read().split()[1])
    return resident_pages * resource.getpagesize()


def trim_heap() -> None:
    """Collect, and give the C heap's free memory back (glibc's ``malloc_trim``)."""
    import ctypes

    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def str_block_bytes(members: Sequence[str]) -> float:
    """Mean pymalloc block size of the member ``str`` objects (16-byte classes)."""
    total = sum((sys.getsizeof(m) + 15) // 16 * 16 for m in members)
    return total / len(members)


# --- rankd worker (runs in a child process) ------------------------------------------------


def load_index(cls: type, members: list[str], scores: list[int],
               tie_break: str = "first") -> tuple[Any, float]:
    """Build a board with chunked ``apply_batch`` SETs; only the calls are timed."""
    from rankd.index import Op

    index = cls(order="desc", tie_break=tie_break)
    elapsed = 0.0
    for start in range(0, len(members), LOAD_CHUNK):
        end = start + LOAD_CHUNK
        chunk = list(zip(repeat(Op.SET), members[start:end], scores[start:end], strict=False))
        t0 = time.perf_counter()
        index.apply_batch(chunk)
        elapsed += time.perf_counter() - t0
    if len(index) != len(members):
        raise RuntimeError(f"loaded {len(index)} members, expected {len(members)}")
    return index, elapsed


Touches = list[list[str]]
"""One list of random members per repeat, so no repeat reads a cache warmed by the last."""
Bench = Callable[[int], int]
"""Runs repeat number ``i`` and returns how many items it processed."""


def time_rate(func: Bench, repeats: int) -> float:
    """Median of ``items / seconds`` over ``repeats`` runs of ``func``."""
    rates = []
    for i in range(repeats):
        t0 = time.perf_counter()
        items = func(i)
        rates.append(items / (time.perf_counter() - t0))
    return statistics.median(rates)


def bench_incr_rank(index: Any, touches: Touches) -> Bench:
    incr, rank = index.incr, index.rank

    def run(i: int) -> int:
        for member in touches[i]:
            incr(member, 1)
            rank(member)
        return len(touches[i])

    return run


def bench_incr_batch(index: Any, touches: Touches) -> Bench:
    from rankd.index import Op

    batches = [[[(Op.INCR, m, 1.0) for m in touch[j : j + INCR_BATCH]]
                for j in range(0, len(touch), INCR_BATCH)] for touch in touches]
    apply_batch = index.apply_batch

    def run(i: int) -> int:
        for batch in batches[i]:
            apply_batch(batch)
        return len(touches[i])

    return run


def bench_top10(index: Any, calls: int) -> Bench:
    range_by_rank = index.range_by_rank

    def run(_: int) -> int:
        for _ in range(calls):
            range_by_rank(0, 10)
        return calls

    return run


def bench_rank(index: Any, touches: Touches) -> Bench:
    rank = index.rank

    def run(i: int) -> int:
        for member in touches[i]:
            rank(member)
        return len(touches[i])

    return run


def bench_around(index: Any, touches: Touches) -> Bench:
    around = index.around

    def run(i: int) -> int:
        for member in touches[i]:
            around(member, 5, 5)
        return len(touches[i])

    return run


def bench_ranks(index: Any, touches: Touches) -> Bench:
    groups = [[touch[j : j + RANKS_BATCH] for j in range(0, len(touch), RANKS_BATCH)]
              for touch in touches]
    ranks = index.ranks

    def run(i: int) -> int:
        for group in groups[i]:
            ranks(group)
        return len(touches[i])

    return run


def time_dump_load(cls: type, index: Any, repeats: int) -> tuple[float, float, int]:
    """Median seconds of ``dump()`` and of ``cls.load()``, and the dump size."""
    dumps, loads = [], []
    data = b""
    for _ in range(repeats):
        t0 = time.perf_counter()
        data = index.dump()
        dumps.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        copy = cls.load(data)
        loads.append(time.perf_counter() - t0)
        if len(copy) != len(index):
            raise RuntimeError("load() returned a different number of members")
        del copy
    return statistics.median(dumps), statistics.median(loads), len(data)


class NoBoard:
    """A board that keeps nothing: warms the load loop (see ``run_worker``)."""

    def __init__(self, order: str, tie_break: str) -> None:
        self.length = 0

    def apply_batch(self, batch: list[Any]) -> None:
        self.length += len(batch)

    def __len__(self) -> int:
        return self.length


def worker_class(impl: str) -> type:
    if impl == "native":
        from rankd._skiplist import RankIndex
    elif impl == "pages":
        from rankd._pages import RankIndex
    else:
        from rankd.index._fallback import RankIndex
    return RankIndex


def run_worker(impl: str, n: int, ops: int, repeats: int, load_repeats: int,
               names: str = "short", tie_break: str = "first") -> Results:
    """Every rankd figure for one implementation; runs in its own process."""
    import rankd.index  # noqa: F401  (before the baseline: module code is not the index's)
    from rankd.engine import heap

    # As the daemon does at start-up: a fixed mmap threshold, so that the
    # benchmark's own big transient lists and sets are mapped and given
    # back, not left in the heap among the index's blocks.
    heap.tune()

    cls = worker_class(impl)
    members, scores = make_dataset(n, names)
    touches = {name: [pick(members, ops, SEED + 100 * k + i) for i in range(repeats)]
               for k, name in enumerate(TOUCHING, start=1)}
    # The load loop's own chunks leave pymalloc arenas and heap memory
    # resident (1.3-1.6 bytes a member at 1M with a board that keeps
    # nothing): one pass into such a board first, so that the baseline
    # already holds them and the growth below is the board's.
    load_index(NoBoard, members, scores, tie_break)
    gc.collect()
    baseline = rss_bytes()
    index, first_load = load_index(cls, members, scores, tie_break)
    grown = rss_bytes() - baseline
    # What the build leaves resident once its index is freed (the build's
    # own Python objects, which pin pymalloc arenas; the allocator's free
    # memory): the RSS growth less this is what the index holds.
    del index
    trim_heap()
    residue = rss_bytes() - baseline
    loads = [first_load]
    index, seconds = load_index(cls, members, scores, tie_break)  # the board read below
    if load_repeats > 1:
        loads.append(seconds)
    for _ in range(load_repeats - 2):
        del index
        gc.collect()
        index, seconds = load_index(cls, members, scores, tie_break)
        loads.append(seconds)
    del scores  # transient; the members stay, the reads pick from them
    log(f"  {impl}: loaded {n:,} members, {statistics.median(loads):.2f} s")
    res: Results = {
        "load_s": statistics.median(loads),
        "mem_b": grown / n,
        "held_b": (grown - residue) / n,
        "str_b": str_block_bytes(members) if impl == "python" else 0.0,
        "ops": ops,
        "members": n,
        "load_repeats": load_repeats,
    }
    res.update(index_parts(index, n))
    res.update(run_timed(index, touches, ops, repeats))
    res["dump_s"], res["load2_s"], res["dump_bytes"] = time_dump_load(cls, index, repeats)
    res["half_mem_b"] = remove_half(index, members, grown)
    return res


INDEX_PARTS = ("pages", "page_heap", "names", "map", "page_table", "counts")


def index_parts(index: Any, n: int) -> Results:
    """The bytes per member the index counts itself, by structure (the
    paged index's ``_memory()``; none for the others).  The RSS growth
    beyond their sum is the allocator's headers and free chunks and what
    the load's own Python objects left resident."""
    memory = getattr(index, "_memory", None)
    if memory is None:
        return {}
    parts = memory()
    return {f"idx_{name}_b": parts.get(name, 0) / n for name in INDEX_PARTS}


def remove_half(index: Any, members: list[str], grown: int) -> float:
    """Remove a random half of the members, then increment a tenth of the
    rest (writes are when the paged index compacts its name arena and
    evacuates its page heap); return the full board's RSS growth
    (``grown``) less what the removals gave back, per remaining member,
    the C heap's free pages given back before and after.  (Not the growth
    over the first baseline: the timed runs since freed objects that were
    there before it.)"""
    from rankd.index import Op

    trim_heap()  # (what the timed runs left free goes back first, not in the count)
    full = rss_bytes()
    gone = set(random.Random(SEED + 7).sample(members, len(members) // 2))
    left = [m for m in members if m not in gone]
    ordered = [m for m in members if m in gone]
    for start in range(0, len(ordered), LOAD_CHUNK):
        index.apply_batch([(Op.REMOVE, m, None) for m in ordered[start : start + LOAD_CHUNK]])
    touched = left[: len(left) // 10]
    for start in range(0, len(touched), LOAD_CHUNK):
        index.apply_batch([(Op.INCR, m, 1) for m in touched[start : start + LOAD_CHUNK]])
    del gone, ordered, touched
    trim_heap()  # (as the index itself does after removals, at its cadence)
    given_back = full - (rss_bytes() - 8 * len(left))  # (less the list of the rest)
    return (grown - given_back) / len(left)


TOUCHING = ("incr_rank", "incr_batch", "rank", "around", "ranks")


def run_timed(index: Any, touches: dict[str, Touches], ops: int, repeats: int) -> Results:
    """The per-operation throughput figures, each the median of ``repeats``.

    Every input (member lists, batches) is built here, before any clock starts.
    """
    benches: dict[str, Bench] = {
        "incr_rank": bench_incr_rank(index, touches["incr_rank"]),
        "incr_batch": bench_incr_batch(index, touches["incr_batch"]),
        "top10": bench_top10(index, ops),
        "rank": bench_rank(index, touches["rank"]),
        "around": bench_around(index, touches["around"]),
        "ranks": bench_ranks(index, touches["ranks"]),
    }
    out: Results = {}
    for name, func in benches.items():
        t0 = time.perf_counter()
        out[name] = time_rate(func, repeats)
        log(f"    {name}: {time.perf_counter() - t0:.1f} s")
    return out


# --- Redis: server, raw RESP client, redis-benchmark ---------------------------------------


class RedisError(Exception):
    """An error reply from Redis."""


class Resp:
    """A minimal RESP2 client: pipelined commands, blocking replies."""

    def __init__(self, port: int, timeout: float = 600.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.reader = self.sock.makefile("rb", buffering=1 << 20)

    def close(self) -> None:
        self.reader.close()
        self.sock.close()

    @staticmethod
    def encode(*args: bytes | str | int | float) -> bytes:
        parts = [b"*%d\r\n" % len(args)]
        for arg in args:
            raw = arg if isinstance(arg, bytes) else str(arg).encode()
            parts.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
        return b"".join(parts)

    def send(self, payload: bytes) -> None:
        self.sock.sendall(payload)

    def reply(self) -> Any:
        line = self.reader.readline()
        if not line:
            raise ConnectionError("Redis closed the connection")
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RedisError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            size = int(rest)
            return None if size < 0 else self.reader.read(size + 2)[:-2]
        if kind == b"*":
            count = int(rest)
            return None if count < 0 else [self.reply() for _ in range(count)]
        raise RedisError(f"unexpected reply line {line!r}")

    def call(self, *args: bytes | str | int | float) -> Any:
        self.send(self.encode(*args))
        return self.reply()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def redis_server() -> Iterator[int]:
    """A private redis-server on a free loopback port; stopped on exit, whatever happens."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="rankd-bench-redis-") as tmp:
        cmd = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "no", "--daemonize", "no", "--dir", tmp,
               "--logfile", os.path.join(tmp, "redis.log")]
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
        try:
            wait_ready(port, proc)
            yield port
        finally:
            stop(proc)


def wait_ready(port: int, proc: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server exited early with status {proc.returncode}")
        try:
            client = Resp(port, timeout=2.0)
        except OSError:
            time.sleep(0.05)
            continue
        try:
            if client.call("PING") == "PONG":
                return
        except (OSError, RedisError):  # LOADING, or still starting
            time.sleep(0.05)
        finally:
            client.close()
    raise RuntimeError("redis-server did not become ready")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def redis_member(i: int) -> str:
    """Redis members match what redis-benchmark's ``__rand_int__`` expands to."""
    return f"player:{i:012d}"


def used_memory(client: Resp) -> int:
    info = client.call("INFO", "memory").decode()
    for line in info.splitlines():
        if line.startswith("used_memory:"):
            return int(line.split(":", 1)[1])
    raise RedisError("INFO memory has no used_memory")


def redis_load(client: Resp, n: int) -> float:
    """Pipelined multi-member ZADDs, 10_000 pairs each; only the I/O is timed."""
    _, scores = make_dataset(n)
    commands = []
    for start in range(0, n, LOAD_CHUNK):
        args: list[bytes | str | int | float] = ["ZADD", REDIS_KEY]
        for i in range(start, min(start + LOAD_CHUNK, n)):
            args += [scores[i], redis_member(i)]
        commands.append(Resp.encode(*args))
    payload = b"".join(commands)
    t0 = time.perf_counter()
    client.send(payload)
    added = sum(client.reply() for _ in commands)
    elapsed = time.perf_counter() - t0
    if added != n:
        raise RuntimeError(f"ZADD added {added} members, expected {n}")
    return elapsed


def redis_dump_restore(client: Resp, repeats: int) -> tuple[float, float, int]:
    """Median seconds of ``DUMP lb`` and ``RESTORE lb:copy``, and the payload size."""
    dumps, restores = [], []
    data = b""
    for _ in range(repeats):
        t0 = time.perf_counter()
        data = client.call("DUMP", REDIS_KEY)
        dumps.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        client.call("RESTORE", f"{REDIS_KEY}:copy", 0, data, "REPLACE")
        restores.append(time.perf_counter() - t0)
        client.call("DEL", f"{REDIS_KEY}:copy")
    return statistics.median(dumps), statistics.median(restores), len(data)


LUA_INCR_RANK = ("redis.call('ZINCRBY', KEYS[1], 1, ARGV[1]) "
                 "return redis.call('ZREVRANK', KEYS[1], ARGV[1])")
LUA_AROUND = ("local r = redis.call('ZREVRANK', KEYS[1], ARGV[1]) "
              "if not r then return false end "
              "local s = r - 5 if s < 0 then s = 0 end "
              "return redis.call('ZREVRANGE', KEYS[1], s, r + 5, 'WITHSCORES')")
LUA_RANKS = ("local t = {} for i, m in ipairs(ARGV) do "
             "t[i] = redis.call('ZREVRANK', KEYS[1], m) end return t")
RAND = "player:__rand_int__"


@dataclass(frozen=True)
class RedisBench:
    """One redis-benchmark command and how to turn its requests/s into the row's unit.

    With ``script``, the command is ``EVALSHA <sha> 1 lb *args`` after a
    ``SCRIPT LOAD`` (as a real client would run it), else ``command *args``.
    """

    key: str
    command: tuple[str, ...]
    script: str | None = None
    items_per_request: int = 1
    requests_divisor: int = 1

    def argv(self, client: Resp) -> list[str]:
        if self.script is None:
            return list(self.command)
        sha = client.call("SCRIPT", "LOAD", self.script).decode()
        return ["EVALSHA", sha, "1", REDIS_KEY, *self.command]


REDIS_BENCHES = (
    RedisBench("incr_rank", (RAND,), script=LUA_INCR_RANK),
    RedisBench("incr_batch", ("ZINCRBY", REDIS_KEY, "1", RAND)),
    RedisBench("top10", ("ZREVRANGE", REDIS_KEY, "0", "9", "WITHSCORES")),
    RedisBench("rank", ("ZREVRANK", REDIS_KEY, RAND)),
    RedisBench("around", (RAND,), script=LUA_AROUND),
    RedisBench("ranks", (RAND,) * RANKS_BATCH, script=LUA_RANKS,
               items_per_request=RANKS_BATCH, requests_divisor=50),
)


def redis_benchmark(port: int, n: int, requests: int, pipeline: int, argv: Sequence[str]) -> float:
    """Requests per second reported by one ``redis-benchmark --csv`` run."""
    cmd = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-n", str(requests),
           "-r", str(n), "-c", str(REDIS_CLIENTS), "-P", str(pipeline), "--csv", *argv]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600).stdout
    for row in csv.reader(io.StringIO(out)):
        if len(row) >= 2 and row[0] != "test":
            return float(row[1])
    raise RuntimeError(f"no figure in redis-benchmark output: {out!r}")


def run_redis(n: int, ops: int, p1_ops: int, repeats: int) -> Results:
    """Every Redis figure, against a private server that is stopped afterwards."""
    res: Results = {}
    with redis_server() as port:
        client = Resp(port)
        try:
            res["version"] = redis_version(client)
            before = used_memory(client)
            res["load_s"] = redis_load(client, n)
            res["mem_b"] = (used_memory(client) - before) / n
            log(f"  redis: loaded {n:,} members, {res['load_s']:.2f} s")
            res["dump_s"], res["load2_s"], res["dump_bytes"] = redis_dump_restore(client, repeats)
            for pipeline, total in ((1, p1_ops), (REDIS_PIPELINE, ops)):
                t0 = time.perf_counter()
                for bench in REDIS_BENCHES:
                    requests = max(total // bench.requests_divisor, 100)
                    argv = bench.argv(client)
                    rps = statistics.median(
                        redis_benchmark(port, n, requests, pipeline, argv)
                        for _ in range(repeats))
                    res[f"{bench.key}_p{pipeline}"] = rps * bench.items_per_request
                log(f"  redis: redis-benchmark -P {pipeline}: {time.perf_counter() - t0:.1f} s")
            res["zcard_after"] = client.call("ZCARD", REDIS_KEY)
        finally:
            client.close()
    return res


def redis_version(client: Resp) -> str:
    for line in client.call("INFO", "server").decode().splitlines():
        if line.startswith("redis_version:"):
            return line.split(":", 1)[1]
    return "?"


# --- report --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One line of the table: which figure, its unit, and where Redis's come from."""

    label: str
    unit: str
    key: str
    redis_p1: str | None
    redis_p64: str | None


ROWS = (
    Row("bulk load (apply_batch SET x10k)", "s", "load_s", None, "load_s"),
    Row("incr+rank, per call", "pairs/s", "incr_rank", "incr_rank_p1", "incr_rank_p64"),
    Row("apply_batch INCR x1000", "ops/s", "incr_batch", "incr_batch_p1", "incr_batch_p64"),
    Row("top-10 range_by_rank(0, 10)", "reads/s", "top10", "top10_p1", "top10_p64"),
    Row("rank(member)", "reads/s", "rank", "rank_p1", "rank_p64"),
    Row("around(member, 5, 5)", "reads/s", "around", "around_p1", "around_p64"),
    Row("ranks(100 members)", "members/s", "ranks", "ranks_p1", "ranks_p64"),
    Row("dump()", "s", "dump_s", "dump_s", None),
    Row("load()", "s", "load2_s", "load2_s", None),
    Row("memory per member (RSS growth)", "B", "mem_b", "mem_b", None),
    Row("  less what the build leaves once the index is freed", "B", "held_b", None, None),
    Row("  of which index pages (entries, towers)", "B", "idx_pages_b", None, None),
    Row("  of which page heap (chunk prefixes, holes)", "B", "idx_page_heap_b", None, None),
    Row("  of which index names (arena)", "B", "idx_names_b", None, None),
    Row("  of which index member map", "B", "idx_map_b", None, None),
    Row("  of which index page table", "B", "idx_page_table_b", None, None),
    Row("  of which index count tree", "B", "idx_counts_b", None, None),
    Row("  same, after removing a random half", "B", "half_mem_b", None, None),
)


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "s":
        return f"{value:.3f}"
    if unit == "B":
        return f"{value:.1f}"
    if value >= 1e6:
        return f"{value / 1e6:.2f}M"
    return f"{value / 1e3:.1f}k"


def ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}x"


def table(native: Results | None, fallback: Results | None, redis: Results | None,
          pages: Results | None = None) -> str:
    head = ("operation", "unit", "native", "pages", "pages/nat", "fallback", "redis P=1",
            f"redis P={REDIS_PIPELINE}", "nat/redis P=1", f"nat/redis P={REDIS_PIPELINE}")
    lines = [head]
    for row in ROWS:
        nat = native.get(row.key) if native else None
        pg = pages.get(row.key) if pages else None
        fb = fallback.get(row.key) if fallback else None
        r1 = redis.get(row.redis_p1) if redis and row.redis_p1 else None
        r64 = redis.get(row.redis_p64) if redis and row.redis_p64 else None
        lines.append((row.label, row.unit, fmt(nat, row.unit), fmt(pg, row.unit), ratio(pg, nat),
                      fmt(fb, row.unit), fmt(r1, row.unit), fmt(r64, row.unit), ratio(nat, r1),
                      ratio(nat, r64)))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    out = []
    for k, line in enumerate(lines):
        cells = [line[0].ljust(widths[0]), line[1].ljust(widths[1])]
        cells += [cell.rjust(w) for cell, w in zip(line[2:], widths[2:], strict=True)]
        out.append("  ".join(cells))
        if k == 0:
            out.append("-" * len(out[0]))
    return "\n".join(out)


def cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "?"


def load_average() -> str:
    """The 1-minute load average: other jobs on a shared machine skew every figure."""
    try:
        with open("/proc/loadavg") as f:
            return f.read().split()[0]
    except OSError:
        return "?"


def machine_info() -> str:
    import rankd
    import rankd.index

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return "\n".join([
        f"CPU: {cpu_model()}; cores usable: {cores} (os.cpu_count={os.cpu_count()})",
        f"Python {platform.python_version()} ({platform.python_implementation()}), "
        f"{platform.system()} {platform.release()}",
        f"rankd {rankd.__version__}; rankd.index.IMPLEMENTATION = "
        f"{rankd.index.IMPLEMENTATION!r}",
    ])


def notes(args: argparse.Namespace, fallback: Results | None, redis: Results | None) -> str:
    lines = [
        "Notes:",
        f"* rates are medians of {args.repeats} run(s); 'k' = 1e3, 'M' = 1e6. Ratio = native ÷ "
        "redis in the row's unit: for /s above 1 means native is faster; for s and B below 1 "
        "means native is better.",
        "* rankd figures are in-process calls from a Python loop (call overhead included, no "
        "network). Redis figures are requests/s measured by redis-benchmark over loopback TCP "
        f"with {REDIS_CLIENTS} clients, so they include the round trips, protocol parsing and "
        "redis-benchmark sharing the machine's cores with the server. P=1 is the fair match for "
        "per-call rows, P=64 for batched rows (apply_batch, ranks).",
        "* redis 'incr+rank' and 'around' use one EVALSHA (Lua) per request; 'ranks(100)' is "
        "one EVALSHA of 100 ZREVRANKs (members/s = requests/s x 100); 'apply_batch INCR' is "
        "compared with ZINCRBY, which returns the new score but not the rank.",
        "* redis bulk load: pipelined ZADD of 10k pairs per command, client-side encoding not "
        "timed; dump()/load() compare with DUMP/RESTORE of the key (payload sent over loopback).",
        "* redis memory: growth of INFO used_memory; members are 'player:%012d' (19 bytes, to "
        "match redis-benchmark's __rand_int__) against 'player:<i>' (8-13 bytes) in rankd.",
    ]
    if fallback:
        lines.append(
            f"* fallback: {fallback['members']:,} members, {fallback['ops']:,} ops per figure "
            f"(fewer, to keep the run short), bulk load timed over "
            f"{fallback['load_repeats']} load(s). Its memory figure excludes the member str "
            "objects it references, which this "
            f"benchmark's own list also holds (about {fallback['str_b']:.0f} B/member more "
            "when the index alone owns them); the native index copies member bytes into its "
            "own nodes, so its figure includes them.")
    if redis:
        ranks_div = REDIS_BENCHES[-1].requests_divisor
        lines.append(
            f"* redis requests per redis-benchmark run: {args.redis_unpipelined_ops:,} at P=1, "
            f"{args.ops:,} at P={REDIS_PIPELINE} (ranks(100): those / {ranks_div}, at "
            "least 100), "
            f"-c {REDIS_CLIENTS}, -r {args.members:,}.")
        lines.append(
            f"* redis {redis['version']}: ZCARD after all benchmarks = {redis['zcard_after']:,} "
            f"(expected {args.members:,}: every command hit an existing member). Ties in "
            "ZREVRANK/ZREVRANGE are ordered by member, not by arrival.")
    wrapped = [textwrap.fill(line, 100, subsequent_indent="  ", break_on_hyphens=False)
               for line in lines]
    return "\n".join(wrapped)


# --- driver --------------------------------------------------------------------------------


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def spawn_worker(impl: str, n: int, ops: int, repeats: int, load_repeats: int,
                 names: str = "short", tie_break: str = "first") -> Results:
    """Run one rankd implementation in a fresh interpreter and collect its JSON figures."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", impl, "--members", str(n),
           "--ops", str(ops), "--repeats", str(repeats), "--load-repeats", str(load_repeats),
           "--names", names, "--tie-break", tie_break]
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def alternate(args: argparse.Namespace) -> tuple[Results, Results | None]:
    """The native skip list's figures and, with ``--pages``, the paged index's,
    from workers alternated over ``--rounds`` rounds; each figure is the median
    over rounds (memory too), so machine noise hits both alike."""
    runs: dict[str, list[Results]] = {"native": [], "pages": []}
    impls = ("native", "pages") if args.pages else ("native",)
    for r in range(args.rounds if args.pages else 1):
        for impl in impls if r % 2 == 0 else impls[::-1]:
            runs[impl].append(spawn_worker(impl, args.members, args.ops, args.repeats,
                                           args.repeats, args.names, args.tie_break))
            log(f"  round {r + 1}: {impl} done")

    def median(results: list[Results]) -> Results:
        return {k: statistics.median(r[k] for r in results) if isinstance(v, float) else v
                for k, v in results[0].items()}

    return median(runs["native"]), median(runs["pages"]) if args.pages else None


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--members", type=int, default=None, help="board size N (default 1_000_000)")
    p.add_argument("--ops", type=int, default=None, help="operations per figure (default 200_000)")
    p.add_argument("--repeats", type=int, default=None, help="runs per figure, median (default 3)")
    p.add_argument("--fallback-members", type=int, default=None,
                   help="board size for the fallback (default: --members)")
    p.add_argument("--fallback-ops", type=int, default=None,
                   help="operations per figure for the fallback (default: --ops / 4)")
    p.add_argument("--fallback-load-repeats", type=int, default=1,
                   help="bulk loads of the fallback board (default 1: ~40 s each at 1M here)")
    p.add_argument("--redis-unpipelined-ops", type=int, default=None,
                   help="requests per unpipelined redis-benchmark run (default: --ops / 4)")
    p.add_argument("--no-redis", action="store_true", help="skip Redis")
    p.add_argument("--no-fallback", action="store_true", help="skip the pure-Python fallback")
    p.add_argument("--quick", action="store_true",
                   help=f"smoke run: {QUICK['members']:,} members, {QUICK['ops']:,} ops, 1 repeat")
    p.add_argument("--pages", action="store_true",
                   help="also run the compact paged index (rankd._pages), each round "
                        "alternating with the native skip list")
    p.add_argument("--rounds", type=int, default=1,
                   help="with --pages: alternated native/pages worker rounds; each figure "
                        "is the median over rounds (default 1)")
    p.add_argument("--names", choices=("short", "padded"), default="short",
                   help="member names: player:<i> (default) or player:%%012d (19 bytes)")
    p.add_argument("--tie-break", choices=("first", "member"), default="first",
                   help="tie-break of the rankd boards (default first)")
    p.add_argument("--worker", choices=("native", "python", "pages"), help=argparse.SUPPRESS)
    p.add_argument("--load-repeats", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    defaults = QUICK if args.quick else {"members": 1_000_000, "ops": 200_000, "repeats": 3}
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.fallback_members is None:
        args.fallback_members = args.members
    if args.fallback_ops is None:
        args.fallback_ops = max(args.ops // 4, 100)
    if args.redis_unpipelined_ops is None:
        args.redis_unpipelined_ops = max(args.ops // 4, 100)
    if args.load_repeats is None:
        args.load_repeats = args.repeats
    if args.quick:
        args.fallback_load_repeats = min(args.fallback_load_repeats, args.repeats)
    sizes = (args.members, args.ops, args.repeats, args.fallback_members, args.fallback_ops,
             args.fallback_load_repeats, args.redis_unpipelined_ops, args.load_repeats)
    if min(sizes) < 1:
        p.error("sizes and repeats must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        res = run_worker(args.worker, args.members, args.ops, args.repeats, args.load_repeats,
                         args.names, args.tie_break)
        print(json.dumps(res))
        return 0
    if not args.no_redis and not (shutil.which("redis-server") and shutil.which("redis-benchmark")):
        log("redis-server/redis-benchmark not found: apt-get install -y redis-server "
            "redis-tools, or pass --no-redis")
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks
    started = time.perf_counter()
    load_before = load_average()
    log(f"native: {args.members:,} members, {args.ops:,} ops, {args.repeats} repeat(s)")
    native, pages = alternate(args)
    log(f"  native done at {time.perf_counter() - started:.0f} s")
    fallback = None
    if not args.no_fallback:
        log(f"fallback: {args.fallback_members:,} members, {args.fallback_ops:,} ops")
        fallback = spawn_worker("python", args.fallback_members, args.fallback_ops, args.repeats,
                                args.fallback_load_repeats)
        log(f"  fallback done at {time.perf_counter() - started:.0f} s")
    redis = None
    if not args.no_redis:
        log(f"redis: {args.members:,} members, {args.ops:,} requests per run")
        redis = run_redis(args.members, args.ops, args.redis_unpipelined_ops, args.repeats)
    print(machine_info())
    print(f"Board: {args.members:,} members, order desc, tie_break {args.tie_break}; "
          f"{args.ops:,} ops per "
          f"figure; median of {args.repeats}; total wall time "
          f"{time.perf_counter() - started:.0f} s")
    print(f"1-min load average: {load_before} at start, {load_average()} at end "
          f"(this benchmark alone keeps it near 1-2)\n")
    print(f"Names: {args.names}; tie_break {args.tie_break}; native/pages rounds: "
          f"{args.rounds if args.pages else 1}")
    print(table(native, fallback, redis, pages))
    print()
    print(notes(args, fallback, redis))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        log("interrupted")
        sys.exit(130)
