"""The daemon's memory against redis-server's, in one run: what users size
machines by.

    python bench/bench_memory.py                      # 1M and 2M members
    python bench/bench_memory.py --members 1000000 --big   # also 10M
    python bench/bench_memory.py --members 1000000 --churn-seconds 60
    python bench/bench_memory.py --variant plain --variant MALLOC_ARENA_MAX=2
    python bench/bench_memory.py --index skiplist --index pages   # the two layouts

For each size, each server (redis-server, then rankd once per ``--variant``:
an environment for the daemon, ``plain`` for none) starts empty in a fresh
directory and is loaded through its Redis port with pipelined ``ZADD``s of
members named ``player:%012d`` (19 bytes) in shuffled order with random
integer scores.  Reported, from ``/proc/<pid>/status``:

* ``live B/member``: resident set growth from the empty server to the
  loaded one, per member, once it has taken a snapshot (every server in
  service has; what one leaves behind counts), the least RSS over the
  three seconds after it;
* ``load peak``: the high-water mark (``VmHWM``) during the load, per member
  over the empty server's RSS, and as a ratio to the live RSS;
* ``snapshot peak``: the high-water mark while a snapshot is written: rankd's
  forced snapshot (``POST /v1/admin/snapshot``), Redis's ``BGSAVE`` counting
  the forked child's private memory (sampled every 5 ms: its shared pages are
  the parent's), as a ratio to the live RSS;
* ``restart``: the server stopped and started again on the same directory:
  its RSS once it answers, and its high-water mark during the start, as
  ratios to the live RSS before the restart.

The peaks are per phase: ``VmHWM`` is reset between phases by writing 5 to
``/proc/<pid>/clear_refs``.  Also printed: ``index alone``, the resident set
growth of a child process that builds the same board (same names, scores,
order and tie-break as a RESP board) with ``RankIndex.apply_batch`` in
chunks, so the daemon's overhead over its index is visible.

``--index KIND`` (repeatable) adds a daemon run with ``RANKD_INDEX=KIND``
(``skiplist``, ``pages``: see rankd.index.kinds) and the ``index alone``
figure of that kind, which each such run's ``vs index`` column divides by.

``--churn-seconds S`` then runs a churn on a freshly loaded board of the
first size for each server: for ``S`` seconds, pipelined batches that are
60 % ``ZINCRBY`` of random members, 20 % ``ZADD`` of new members and 20 %
``ZREM`` of random members (the board's size stays about level), with the
RSS sampled every second; printed: RSS at the start, at the end and its
maximum, and the growth in per cent.  The issue's hour is ``--churn-seconds
3600``; 60 is the short form.

``--event-ids N`` measures instead what remembered event ids cost the
daemon: a ``sum`` board takes ``N`` submissions over the TCP protocol, in
batches of 1,000, each with a fresh UUID event id and one of 1,000
19-byte members (so the index stays small); printed: the RSS growth per
remembered id, once a snapshot was taken (settled as ``live`` above), the
load's high-water mark per id, the snapshot's peak over the live RSS, and
a restart's (the daemon stopped and started again on its data dir: its
high-water mark during the start, and its RSS once it answers, over the
live RSS before).
With ``--base DIR`` the same runs first on the daemon of an older tree's
sources (``DIR/src``, e.g. a checkout of 157be2a, before the compact
event-id store), side by side; ``--no-ids-too`` adds the same load
without event ids (what the rest of the daemon grows by)::

    python bench/bench_memory.py --event-ids 1000000 --base /work/wt-base

Each server runs alone (one at a time); the two cores are shared with the
loader.  Run from the project root with the native extensions built.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from itertools import repeat
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE.parent / "src"))

from bench_resp import wait_for_port  # noqa: E402
from daemon import Daemon, free_port  # noqa: E402
from rankd.frontends.resp.protocol import encode_request  # noqa: E402

BATCH = 1000  # members per ZADD
WINDOW = 50  # ZADDs in flight
MiB = 1 << 20


def member(i: int) -> bytes:
    """The ``i``-th member's 19-byte name."""
    return b"player:%012d" % i


def status(pid: int) -> dict[str, int]:
    """``/proc/<pid>/status``'s memory fields, in bytes."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Vm"):
                key, value = line.split(":", 1)
                out[key] = int(value.split()[0]) * 1024
    return out


def rss(pid: int) -> int:
    return status(pid)["VmRSS"]


def hwm(pid: int) -> int:
    return status(pid)["VmHWM"]


def settled_rss(pid: int, seconds: float) -> int:
    """The least RSS over ``seconds`` (a snapshot the load set off holds a
    copy of the board's dump for a moment)."""
    least = rss(pid)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.2)
        least = min(least, rss(pid))
    return least


def reset_hwm(pid: int) -> None:
    """Start a new high-water mark at the current RSS."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")


def private_bytes(pid: int) -> int:
    """The pages ``pid`` holds alone (a forked child's copies)."""
    total = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith(("Private_Clean", "Private_Dirty")):
                    total += int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        return 0
    return total


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except FileNotFoundError:
        return []


class Connection:
    """A pipelining RESP client that counts replies and fails on errors."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=300)
        self.buffer = b""

    def send(self, words: list[bytes | str]) -> None:
        self.sock.sendall(encode_request(words))

    def replies(self, count: int) -> None:
        """Read ``count`` simple replies (integers, bulk strings, errors)."""
        data = self.buffer
        seen = 0
        start = 0
        while seen < count:
            end = data.find(b"\r\n", start)
            size = -1
            if end >= 0 and data[start:start + 1] == b"$" and data[start + 1:end] != b"-1":
                size = int(data[start + 1:end])
            if end < 0 or (size >= 0 and len(data) < end + 2 + size + 2):  # (not all here)
                chunk = self.sock.recv(1 << 20)
                if not chunk:
                    raise ConnectionError("closed while waiting for replies")
                data = data[start:] + chunk
                start = 0
                continue
            if data[start:start + 1] == b"-":
                raise RuntimeError(f"server error: {data[start:end]!r}")
            if size >= 0:
                end = end + 2 + size
            start = end + 2
            seen += 1
        self.buffer = data[start:]

    def call(self, *words: bytes | str) -> bytes:
        self.send(list(words))
        data = self.buffer
        while b"\r\n" not in data:
            data += self.sock.recv(65536)
        line, _, self.buffer = data.partition(b"\r\n")
        return line

    def close(self) -> None:
        self.sock.close()


def load(port: int, order: list[int], scores: list[int], on_batch: Callable[[], None]) -> None:
    """Every member of ``order`` with its score, in pipelined ZADDs."""
    conn = Connection(port)
    pending = 0
    for start in range(0, len(order), BATCH):
        words: list[bytes | str] = [b"ZADD", b"lb"]
        for i in order[start:start + BATCH]:
            words += [b"%d" % scores[i], member(i)]
        conn.send(words)
        pending += 1
        if pending == WINDOW:
            conn.replies(pending)
            pending = 0
            on_batch()
    conn.replies(pending)
    count = int(conn.call(b"ZCARD", b"lb")[1:])
    conn.close()
    if count != len(order):
        raise RuntimeError(f"loaded {count} members, expected {len(order)}")


class Sampler:
    """Samples a value every ``period`` seconds in a thread, keeping the maximum."""

    def __init__(self, sample: Callable[[], int], period: float = 0.005) -> None:
        self.sample, self.period = sample, period
        self.peak = 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.is_set():
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                self.peak = max(self.peak, self.sample())
            time.sleep(self.period)

    def stop(self) -> int:
        self.done.set()
        self.thread.join()
        return self.peak


# --- servers -------------------------------------------------------------------------------


class Redis:
    name = "redis"

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.directory)], stdout=subprocess.DEVNULL)
        wait_for_port(self.port)
        conn = Connection(self.port)
        deadline = time.monotonic() + 600
        while b"\r\nloading:0" not in self._info(conn, "persistence"):
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not finish loading")
            time.sleep(0.01)
        conn.close()

    @staticmethod
    def _info(conn: Connection, section: str) -> bytes:
        conn.send([b"INFO", section.encode()])
        data = conn.buffer
        while b"\r\n" not in data:
            data += conn.sock.recv(65536)
        header, _, rest = data.partition(b"\r\n")
        size = int(header[1:])
        while len(rest) < size + 2:
            rest += conn.sock.recv(65536)
        conn.buffer = rest[size + 2:]
        return rest[:size]

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def snapshot(self) -> int:
        """``BGSAVE``; the peak of the parent's RSS plus the child's private pages."""
        conn = Connection(self.port)
        before = self._info(conn, "persistence")
        last = before.split(b"rdb_last_save_time:")[1].split(b"\r\n")[0]
        sampler = Sampler(lambda: rss(self.pid) + sum(map(private_bytes, children(self.pid))))
        reply = conn.call(b"BGSAVE")
        if not reply.startswith(b"+"):
            raise RuntimeError(f"BGSAVE: {reply!r}")
        deadline = time.monotonic() + 600
        while True:
            info = self._info(conn, "persistence")
            if (b"rdb_bgsave_in_progress:0" in info
                    and info.split(b"rdb_last_save_time:")[1].split(b"\r\n")[0] != last):
                break
            if time.monotonic() > deadline:
                raise RuntimeError("BGSAVE did not finish")
            time.sleep(0.05)
        conn.close()
        return sampler.stop()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # (saves nothing: --save "")
            self.process.wait(120)


class Rankd:
    def __init__(self, directory: Path, variant: str) -> None:
        self.name = "rankd" if variant == "plain" else f"rankd {variant}"
        env = dict(v.split("=", 1) for v in variant.split(",")) if variant != "plain" else {}
        self.daemon = Daemon(directory / "data", "--fsync", "everysec", env=env)

    def start(self) -> None:
        self.daemon.start(timeout=600)

    @property
    def port(self) -> int:
        return self.daemon.resp_port

    @property
    def pid(self) -> int:
        assert self.daemon.process is not None
        return self.daemon.process.pid

    def snapshot(self) -> int:
        """A forced snapshot; the peak of the daemon's RSS meanwhile (its ``VmHWM``)."""
        reset_hwm(self.pid)
        status_code, body = self.daemon.request("POST", "/v1/admin/snapshot")
        if status_code != 200:
            raise RuntimeError(f"snapshot: {status_code} {body!r}")
        return hwm(self.pid)

    def stop(self) -> None:
        if self.daemon.process is not None and self.daemon.process.poll() is None:
            self.daemon.stop(timeout=600)


# --- the measurements ----------------------------------------------------------------------


def measure(server: Redis | Rankd, members: int, seed: int) -> dict[str, float]:
    """Load, snapshot, restart; the figures of the module docstring."""
    rng = random.Random(seed)
    order = list(range(members))
    rng.shuffle(order)
    scores = [rng.randrange(10**9) for _ in range(members)]
    server.start()
    try:
        time.sleep(0.5)
        empty = rss(server.pid)
        reset_hwm(server.pid)
        started = time.monotonic()
        load(server.port, order, scores, lambda: None)
        load_seconds = time.monotonic() - started
        load_peak = hwm(server.pid)
        # Live: after the snapshot a loaded server takes anyway (rankd one
        # as many records after the last as it wrote entries; Redis as its
        # save rules say), which is what a server in service holds.
        server.snapshot()
        live = settled_rss(server.pid, 3.0)
        snapshot_peak = server.snapshot()
        time.sleep(0.5)
        after_snapshot = rss(server.pid)
        server.stop()
        started = time.monotonic()
        server.start()
        restart_seconds = time.monotonic() - started
        conn = Connection(server.port)
        count = int(conn.call(b"ZCARD", b"lb")[1:])
        conn.close()
        if count != members:
            raise RuntimeError(f"{server.name} restarted with {count} members of {members}")
        time.sleep(1.0)
        restarted = rss(server.pid)
        restart_peak = hwm(server.pid)  # (a new process: its peak so far is the start's)
    finally:
        server.stop()
    return {"members": members, "empty": empty, "live": live,
            "live_per_member": (live - empty) / members,
            "load_peak": load_peak, "load_peak_per_member": (load_peak - empty) / members,
            "load_seconds": load_seconds,
            "snapshot_peak": snapshot_peak, "after_snapshot": after_snapshot,
            "restart_peak": restart_peak, "restarted": restarted,
            "restart_seconds": restart_seconds}


def index_alone(members: int, seed: int, kind: str = "") -> dict[str, float]:
    """RSS growth of a child building the same board with ``apply_batch``
    (on the ``kind`` of index, the default one if empty)."""
    code = f"""
import gc, json, random, sys
sys.path.insert(0, {str(HERE.parent / 'src')!r})
sys.path.insert(0, {str(HERE)!r})
from bench_memory import index_worker
print(json.dumps(index_worker({members}, {seed}, {kind!r})))
"""
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def index_worker(members: int, seed: int, kind: str = "") -> dict[str, float]:
    """In the child: the names are made per chunk and dropped, as the daemon's are."""
    import gc

    from rankd.index import Op, RankIndex, kinds

    if kind:
        RankIndex = kinds.index_class(kind)

    rng = random.Random(seed)
    order = list(range(members))
    rng.shuffle(order)
    scores = [rng.randrange(10**9) for _ in range(members)]
    gc.collect()
    base = rss(os.getpid())
    index = RankIndex("desc", "member_desc")
    for start in range(0, members, 10_000):
        chunk = order[start:start + 10_000]
        index.apply_batch(list(zip(repeat(Op.SET), (member(i).decode() for i in chunk),
                                   (float(scores[i]) for i in chunk), strict=False)))
    gc.collect()
    grown = rss(os.getpid()) - base
    return {"members": len(index), "per_member": grown / members,
            "peak_per_member": (hwm(os.getpid()) - base) / members}


def churn(server: Redis | Rankd, members: int, seconds: float, seed: int) -> dict[str, float]:
    """Sustained writes on a loaded board; RSS every second."""
    rng = random.Random(seed)
    order = list(range(members))
    rng.shuffle(order)
    scores = [rng.randrange(10**9) for _ in range(members)]
    server.start()
    try:
        load(server.port, order, scores, lambda: None)
        time.sleep(1.0)
        start_rss = rss(server.pid)
        samples = [start_rss]
        conn = Connection(server.port)
        present = list(range(members))  # members believed present (swap-remove)
        next_new = members
        ops = 0
        deadline = time.monotonic() + seconds
        next_sample = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            words_batch = []
            for _ in range(200):
                roll = rng.random()
                if roll < 0.6:
                    words_batch.append([b"ZINCRBY", b"lb", b"%d" % rng.randrange(1, 1000),
                                        member(present[rng.randrange(len(present))])])
                elif roll < 0.8:
                    present.append(next_new)
                    words_batch.append([b"ZADD", b"lb", b"%d" % rng.randrange(10**9),
                                        member(next_new)])
                    next_new += 1
                else:
                    k = rng.randrange(len(present))
                    gone = present[k]
                    present[k] = present[-1]
                    present.pop()
                    words_batch.append([b"ZREM", b"lb", member(gone)])
            conn.sock.sendall(b"".join(encode_request(w) for w in words_batch))
            conn.replies(len(words_batch))
            ops += len(words_batch)
            if time.monotonic() >= next_sample:
                samples.append(rss(server.pid))
                next_sample += 1.0
        time.sleep(1.0)
        samples.append(rss(server.pid))
        card = int(conn.call(b"ZCARD", b"lb")[1:])
        conn.close()
    finally:
        server.stop()
    return {"start": start_rss, "end": samples[-1], "max": max(samples), "ops": ops,
            "mib_each_minute": [round(m / MiB) for m in samples[::60]],
            "members_end": card, "growth": samples[-1] / start_rss - 1,
            "max_growth": max(samples) / start_rss - 1}


def event_ids(directory: Path, count: int, src: Path | None,
              with_ids: bool = True) -> dict[str, float]:
    """The ``--event-ids`` figures of the daemon of ``src`` (None: this
    tree); without ``with_ids``, of the same load with no event ids (what
    the rest of the daemon grows by)."""
    import uuid

    from rankd.client import Client

    env = {} if src is None else {"PYTHONPATH": str(src)}
    directory.mkdir(parents=True, exist_ok=True)
    daemon = Daemon(directory / "data", "--fsync", "everysec", env=env)
    daemon.start(timeout=600)
    try:
        assert daemon.process is not None
        pid = daemon.process.pid
        daemon.request("PUT", "/v1/boards/ids", {"policy": "sum"})
        names = [member(i).decode() for i in range(1000)]
        with Client("127.0.0.1", daemon.tcp_port) as client:
            client.submit_many([{"member": name, "delta": 1} for name in names], board="ids")
            time.sleep(0.5)
            empty = rss(pid)
            reset_hwm(pid)
            started = time.monotonic()
            for start in range(0, count, 1000):
                events = [{"member": names[n % 1000], "delta": 1,
                           "event_id": str(uuid.UUID(int=random.getrandbits(128)))}
                          if with_ids else {"member": names[n % 1000], "delta": 1}
                          for n in range(start, min(start + 1000, count))]
                results = client.submit_many(events, board="ids")["results"]
                if any("error" in r or r.get("duplicate") for r in results):
                    raise RuntimeError(f"a submission failed: {results[:3]}")
            load_seconds = time.monotonic() - started
        load_peak = hwm(pid)
        status_code, body = daemon.request("POST", "/v1/admin/snapshot")
        if status_code != 200:
            raise RuntimeError(f"snapshot: {status_code} {body!r}")
        live = settled_rss(pid, 3.0)
        reset_hwm(pid)
        daemon.request("POST", "/v1/admin/snapshot")
        snapshot_peak = hwm(pid)
        daemon.stop(timeout=600)
        started = time.monotonic()
        daemon.start(timeout=600)  # (a new process: its peak so far is the start's)
        restart_seconds = time.monotonic() - started
        assert daemon.process is not None
        time.sleep(1.0)
        restarted, restart_peak = rss(daemon.process.pid), hwm(daemon.process.pid)
    finally:
        daemon.stop(timeout=600)
    return {"ids": count, "per_id": (live - empty) / count,
            "load_peak_per_id": (load_peak - empty) / count,
            "snapshot_peak": snapshot_peak / live, "live": live, "load_seconds": load_seconds,
            "restart_peak": restart_peak / live, "restarted": restarted / live,
            "restart_seconds": restart_seconds}


def windowed(directory: Path, members: int, windows: list[str], kind: str,
             seed: int) -> dict[str, float]:
    """The ``--windows`` figures: a ``best`` board of ``windows`` on a daemon
    with index ``kind`` takes ``members`` 19-byte members (random integer
    scores, shuffled, no event ids) over TCP in batches of 10,000; its RSS
    growth per member once a snapshot was taken, and the load's peak; then
    a restart from that snapshot: its time (until the daemon answers), its
    RSS (over the first process's before the load) and peak."""
    from rankd.client import Client

    rng = random.Random(seed)
    order = list(range(members))
    rng.shuffle(order)
    directory.mkdir(parents=True, exist_ok=True)
    daemon = Daemon(directory / "data", "--fsync", "everysec", env={"RANKD_INDEX": kind})
    daemon.start(timeout=600)
    try:
        assert daemon.process is not None
        pid = daemon.process.pid
        code, body = daemon.request("PUT", "/v1/boards/w", {"policy": "best",
                                                          "windows": windows})
        if code not in (200, 201):
            raise RuntimeError(f"board: {code} {body!r}")
        time.sleep(0.5)
        empty = rss(pid)
        reset_hwm(pid)
        with Client("127.0.0.1", daemon.tcp_port) as client:
            for start in range(0, members, 10_000):
                events = [{"member": member(i).decode(), "score": rng.randrange(10**9)}
                          for i in order[start:start + 10_000]]
                results = client.submit_many(events, board="w")["results"]
                if any("error" in r for r in results):
                    raise RuntimeError(f"a submission failed: {results[:3]}")
        load_peak = hwm(pid)
        code, body = daemon.request("POST", "/v1/admin/snapshot")
        if code != 200:
            raise RuntimeError(f"snapshot: {code} {body!r}")
        live = settled_rss(pid, 3.0)
        daemon.stop(timeout=600)
        started = time.monotonic()
        daemon.start(timeout=600)  # (a new process: its peak so far is the start's)
        restart_seconds = time.monotonic() - started
        assert daemon.process is not None
        restarted = settled_rss(daemon.process.pid, 3.0)
        restart_peak = hwm(daemon.process.pid)
    finally:
        daemon.stop(timeout=600)
    return {"per_member": (live - empty) / members,
            "load_peak_per_member": (load_peak - empty) / members, "live": live,
            "restart_seconds": restart_seconds,
            "restarted_per_member": (restarted - empty) / members,
            "restart_peak": restart_peak / live}


def servers(root: Path, variants: list[str]) -> list[Callable[[], Redis | Rankd]]:
    made = []

    def fresh(name: str) -> Path:
        directory = root / name
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        return directory

    made.append(lambda: Redis(fresh("redis")))
    for i, variant in enumerate(variants):
        made.append(lambda i=i, variant=variant: Rankd(fresh(f"rankd{i}"), variant))
    return made


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--members", default="1000000,2000000",
                        help="comma-separated board sizes (default 1M and 2M)")
    parser.add_argument("--big", action="store_true", help="also 10M members")
    parser.add_argument("--variant", action="append",
                        help="the daemon's environment, KEY=VALUE[,KEY=VALUE] (repeatable); "
                             "'plain' is none (the default)")
    parser.add_argument("--index", action="append", choices=("skiplist", "pages"),
                        help="a daemon run on this index layout (RANKD_INDEX; repeatable)")
    parser.add_argument("--churn-seconds", type=float, default=0.0,
                        help="also a churn of this many seconds on the first size")
    parser.add_argument("--skip-load", action="store_true",
                        help="only the churn (with --churn-seconds)")
    parser.add_argument("--no-redis", action="store_true", help="rankd only")
    parser.add_argument("--seed", type=int, default=47)
    parser.add_argument("--json", action="store_true", help="also print raw figures as JSON")
    parser.add_argument("--event-ids", type=int, default=0,
                        help="measure remembered event ids instead (this many)")
    parser.add_argument("--base", type=Path,
                        help="with --event-ids: also the daemon of this older tree")
    parser.add_argument("--no-ids-too", action="store_true",
                        help="with --event-ids: also the same load without event ids")
    parser.add_argument("--windows", action="store_true",
                        help="a board of windows all, daily, weekly, monthly against one of "
                        "all, per index kind (--index; default both), at the first --members")
    args = parser.parse_args()
    if args.windows:
        size = int(args.members.split(",")[0])
        print(f"\n{size:,} members, 19-byte names, over TCP; RSS growth per member "
              "(after a snapshot) and the load's peak")
        print("| index | windows | live B/member | load peak B/member | live MiB | restart s | "
              "restarted B/member | restart peak / live |")
        print("|---|---|---|---|---|---|---|---|")
        with tempfile.TemporaryDirectory(prefix="rankd-bench-windows-") as tmp:
            for n, kind in enumerate(args.index or ["skiplist", "pages"]):
                for m, windows in enumerate((["all"], ["all", "daily", "weekly", "monthly"])):
                    w = windowed(Path(tmp) / f"{n}-{m}", size, windows, kind, args.seed)
                    print(f"| {kind} | {', '.join(windows)} | {w['per_member']:.1f} | "
                          f"{w['load_peak_per_member']:.1f} | {w['live'] / MiB:.0f} | "
                          f"{w['restart_seconds']:.1f} | {w['restarted_per_member']:.1f} | "
                          f"{w['restart_peak']:.2f} |", flush=True)
        return 0
    if args.event_ids:
        random.seed(args.seed)
        print(f"\n{args.event_ids:,} submissions with UUID event ids over TCP, 1,000 members")
        print("| daemon | B/remembered id (live) | load peak B/id | snapshot peak / live | "
              "restart peak / live | restarted / live | live MiB | load s | restart s |")
        print("|---|---|---|---|---|---|---|---|---|")
        runs = ([("base", args.base / "src", True)] if args.base else []) + [
            ("this tree", None, True)] + ([("this tree, no event ids", None, False)]
                                          if args.no_ids_too else [])
        with tempfile.TemporaryDirectory(prefix="rankd-bench-ids-") as tmp:
            for i, (name, src, with_ids) in enumerate(runs):
                e = event_ids(Path(tmp) / str(i), args.event_ids, src, with_ids)
                print(f"| {name} | {e['per_id']:.1f} | {e['load_peak_per_id']:.1f} | "
                      f"{e['snapshot_peak']:.2f} | {e['restart_peak']:.2f} | "
                      f"{e['restarted']:.2f} | {e['live'] / MiB:.0f} | "
                      f"{e['load_seconds']:.1f} | {e['restart_seconds']:.1f} |", flush=True)
        return 0
    sizes = [int(s) for s in args.members.split(",")] + ([10_000_000] if args.big else [])
    layouts = {f"RANKD_INDEX={kind}": kind for kind in args.index or []}
    variants = (args.variant or ([] if layouts else ["plain"])) + list(layouts)
    raw: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="rankd-bench-memory-") as tmp:
        makers = servers(Path(tmp), variants)[1 if args.no_redis else 0:]
        if not args.skip_load:
            for size in sizes:
                alone = index_alone(size, args.seed)
                raw[f"index {size}"] = alone
                print(f"\n{size:,} members, 19-byte names, random integer scores; "
                      f"index alone (apply_batch, in-process): "
                      f"{alone['per_member']:.1f} B/member, peak {alone['peak_per_member']:.1f}")
                alone_of = {}
                for variant, kind in layouts.items():
                    alone_of[variant] = raw[f"index {kind} {size}"] = index_alone(
                        size, args.seed, kind)
                    print(f"index alone, {kind}: {alone_of[variant]['per_member']:.1f} B/member, "
                          f"peak {alone_of[variant]['peak_per_member']:.1f}")
                print("| server | live B/member | vs index | load peak B/member | "
                      "load peak / live | snapshot peak / live | restart peak / live | "
                      "restarted / live | live MiB | load s | restart s |")
                print("|---|---|---|---|---|---|---|---|---|---|---|")
                for make in makers:
                    server = make()
                    m = measure(server, size, args.seed)
                    raw[f"{server.name} {size}"] = m
                    its = alone_of.get(server.name.removeprefix("rankd "), alone)
                    print(f"| {server.name} | {m['live_per_member']:.1f} | "
                          f"{m['live_per_member'] / its['per_member']:.2f}x | "
                          f"{m['load_peak_per_member']:.1f} | "
                          f"{m['load_peak'] / m['live']:.2f} | "
                          f"{m['snapshot_peak'] / m['live']:.2f} | "
                          f"{m['restart_peak'] / m['live']:.2f} | "
                          f"{m['restarted'] / m['live']:.2f} | {m['live'] / MiB:.0f} | "
                          f"{m['load_seconds']:.1f} | {m['restart_seconds']:.1f} |",
                          flush=True)
        if args.churn_seconds:
            size = sizes[0]
            print(f"\nchurn: {args.churn_seconds:g} s on {size:,} members (60 % ZINCRBY, "
                  "20 % new ZADD, 20 % ZREM, pipelined by 200)")
            print("| server | ops | RSS start MiB | end MiB | max MiB | growth | max growth |")
            print("|---|---|---|---|---|---|---|")
            for make in makers:
                server = make()
                c = churn(server, size, args.churn_seconds, args.seed)
                raw[f"churn {server.name}"] = c
                print(f"| {server.name} | {c['ops']:,} | {c['start'] / MiB:.0f} | "
                      f"{c['end'] / MiB:.0f} | {c['max'] / MiB:.0f} | {c['growth']:+.1%} | "
                      f"{c['max_growth']:+.1%} |", flush=True)
    if args.json:
        print(json.dumps(raw, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
