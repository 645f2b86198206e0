"""Group moves benchmark: the write pause of moving a group that holds a
large board, under load, and memory per node as groups spread.

Everything runs on this machine on loopback: a throwaway Postgres
(tests/pgcluster.py), ``rankd serve --cluster-dsn`` nodes
(tests/daemon.py's harness, ``--fsync everysec``), and the clients in this
process.  This machine has 2 cores, shared by every node, Postgres and
the clients: figures are end to end on it, not per-node capacity.

1. **Write pause of a move.**  Three nodes, ``--replicas 1``.  Board
   ``big`` gets ``--members`` members (default 1,000,000) through batches
   of 10,000; its group is placed on its primary and one follower.  Then,
   while ``--writers`` clients (default 16) each submit one event at a
   time to the board (a refused write, ``503`` or ``421``, is sent again
   with the same event id: to the same node 5 ms later for a writer to the
   primary, at once to the next node for the others), the group is moved
   ``--rounds`` times (default 4) to the node that does not hold it, so each
   move first loads the group there (snapshot, then log) while writes go
   on, then cuts over.  Half the writers go to the primary as polled every
   50 ms (a cluster-aware client), half through every node in turn (a load
   balancer).  Per move, for each half: each write's latency from its first
   attempt to its acknowledgement (retries included), p50/p99/max, and the
   longest gap between two acknowledgements, over the whole move and over
   the writes begun from 1 s before the cut-over to 1 s after it; how long
   the source held (or, before, refused) the group's writes and each step
   of the cut-over as the source's and the target's logs time them (the
   wall-clock moments they log line the two up); the slowest retried writes
   around the cut-over attempt by attempt (node, answer, when, from the
   moment the source closed the group's writes); how long the move took
   from request to the target writing; the target's log of the group
   (loading, caught up, writing) and how many writes through the target took
   over ``SLOW_MS``, by the half second after the request they began in.
   Targets: p99 <= 50 ms, max <= 200 ms.
   Run it with another revision's sources first on ``PYTHONPATH`` to
   measure that revision with this same script.
2. **Memory per node.**  ``--boards`` boards (default 48) of
   ``--board-members`` members (default 10,000), written through the nodes
   in turn, on 1, 2 and 3 nodes (a fresh cluster each, ``--replicas 1``):
   each node's resident memory (VmRSS) once the placement settled, against
   a node without boards.  Each node holds about (1 + R) / N of the data.

Run from the project root::

    python bench/bench_moves.py                  # about 5 minutes
    python bench/bench_moves.py --quick          # 200,000 members, 2 rounds, 12 boards
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import datetime
import itertools
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from daemon import Daemon  # noqa: E402
from pgcluster import Cluster, Server, _bin_dir  # noqa: E402
from rankd.cluster.groups import group_of  # noqa: E402

BIG = "big"
BATCH = 10_000
#: Writes from this long before a cut-over closed to this long after it
#: ended are "around the cut-over".
AROUND_SECONDS = 1.0
#: The slowest writes around each cut-over shown attempt by attempt.
SLOWEST_SHOWN = 3
#: Writes through a move's target slower than this are counted by when they began.
SLOW_MS = 50
#: The longest loop stalls of each node printed after the moves.
STALLS_SHOWN = 3


@contextlib.contextmanager
def postgres_server() -> Iterator[Server]:
    """A throwaway durable Postgres (tests/pgcluster.py) for one run; exits
    with a message where its binaries are missing."""
    bin_dir = _bin_dir()
    if bin_dir is None:
        raise SystemExit("no PostgreSQL server binaries (initdb)")
    pg = Cluster(bin_dir)
    pg.init()
    pg.start(durable=True)
    try:
        yield Server(pg.admin_dsn, pg)
    finally:
        pg.destroy()


def start_nodes(root: Path, dsn: str, count: int, replicas: int,
                first: int = 0, env: dict[str, str] | None = None) -> list[Daemon]:
    """``count`` nodes named ``n{first}``, ``n{first + 1}``..., started and
    ready (``env``: the nodes' extra environment, e.g. another PYTHONPATH)."""
    root.mkdir(parents=True, exist_ok=True)
    nodes = [Daemon(root / f"n{i}", "--cluster-dsn", dsn, "--node-id", f"n{i}",
                    "--lease-seconds", "2", "--log-format", "text", "--replicas",
                    str(replicas), "--rate-address-writes", "0", "--group-idle-seconds", "0",
                    env=env)
             for i in range(first, first + count)]
    for node in nodes:
        node.start()
        while node.request("GET", "/v1/ready")[0] != 200:
            time.sleep(0.05)
    return nodes


def stop_nodes(nodes: list[Daemon]) -> None:
    for node in nodes:
        if node.process is not None and node.process.poll() is None:
            node.stop(timeout=30)


def rss_mib(node: Daemon) -> float:
    text = Path(f"/proc/{node.process.pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", text).group(1)) / 1024


def status(node: Daemon, tries: int = 3) -> dict:
    """``GET /v1/cluster`` of ``node`` (asked again, up to ``tries`` times,
    when the node is too busy to answer: a poll, not a measurement)."""
    for attempt in range(tries):
        try:
            code, body = node.request("GET", "/v1/cluster")
        except OSError:
            if attempt == tries - 1:
                raise
            time.sleep(0.5)
            continue
        assert code == 200, body
        return body
    raise AssertionError("unreachable")


def placement_of(node: Daemon, group: int) -> tuple[str | None, list[str], str | None]:
    """(placed primary, followers, register holder) of ``group``."""
    body = status(node)
    placed = body["placement"]["groups"].get(str(group))
    holder = next((g["primary"] for g in body["groups"] if g["group"] == group), None)
    return (placed["primary"] if placed else None, placed["followers"] if placed else [],
            holder)


async def fill(session: aiohttp.ClientSession, nodes: list[Daemon], board: str,
               members: int, concurrency: int = 4, batch: int = BATCH) -> None:
    """``members`` members on ``board`` (batches of ``batch``, through the nodes in turn)."""
    batches = [range(start, min(members, start + batch)) for start in range(0, members, batch)]
    queue = asyncio.Queue()
    for n, batch in enumerate(batches):
        queue.put_nowait((n, batch))

    async def worker() -> None:
        while not queue.empty():
            n, batch = queue.get_nowait()
            events = [{"member": f"m{i}", "score": i % 100_000, "event_id": f"{board}-{i}"}
                      for i in batch]
            for attempt in itertools.count():
                node = nodes[(n + attempt) % len(nodes)]
                async with session.post(f"{node.url}/v1/boards/{board}/scores/batch",
                                        json={"events": events}) as answer:
                    await answer.read()
                if answer.status == 200:
                    break
                await asyncio.sleep(0.05)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


class Load:
    """Writers submitting one event at a time, retrying refusals by event id:
    half through every node in turn (as behind a load balancer), half to
    the group's primary as last polled (as a cluster-aware client)."""

    def __init__(self, nodes: list[Daemon], writers: int) -> None:
        self.nodes = nodes
        self.writers = writers
        #: (first attempt, acknowledgement) monotonic times of every
        #: acknowledged write, by way: "any node", "primary".
        self.acks: dict[str, list[tuple[float, float]]] = {"any node": [], "primary": []}
        #: The same of the writes sent through any node, by the node that
        #: acknowledged them (a node not writing the group relays them).
        self.through: dict[int, list[tuple[float, float]]] = collections.defaultdict(list)
        #: Each acknowledged write's attempts but the last: (way, its first
        #: attempt, [(sent, answered, node, status)]) (monotonic times).
        self.retried: list[tuple[str, float, list[tuple[float, float, int, int]]]] = []
        self.refused = 0
        #: Refused attempts by way and answer (HTTP status, 0: no answer).
        self.refusals: collections.Counter[tuple[str, int]] = collections.Counter()
        #: The first answers of each kind of refusal (what the node said).
        self.refused_bodies: dict[tuple[str, int], list[str]] = {}
        self.running = True
        #: The group's primary, as last polled.
        self.primary = 0
        #: Each writer's write not acknowledged yet: its first attempt (monotonic).
        self.pending: dict[int, float] = {}

    async def poll_primary(self) -> None:
        while self.running:
            for node in self.nodes:
                try:
                    _, _, holder = await asyncio.to_thread(placement_of, node, group_of(BIG))
                except (OSError, AssertionError):
                    continue
                if holder is not None:
                    self.primary = int(holder[1:])
                break
            await asyncio.sleep(0.05)

    async def writer(self, session: aiohttp.ClientSession, index: int) -> None:
        way = "primary" if index % 2 else "any node"
        for n in itertools.count():
            if not self.running:
                return
            started = self.pending[index] = time.monotonic()
            attempts: list[tuple[float, float, int, int]] = []
            for attempt in itertools.count():
                at = (self.primary if way == "primary" else
                      (n + index + attempt) % len(self.nodes))
                node = self.nodes[at]
                sent = time.monotonic()
                try:
                    async with session.post(
                            f"{node.url}/v1/boards/{BIG}/scores",
                            json={"member": f"w{index}", "score": n,
                                  "event_id": f"w{index}-{n}"}) as answer:
                        body = await answer.read()
                    if answer.status == 200:
                        break
                    if answer.status not in (421, 503):  # only "elsewhere" or "retry"
                        raise RuntimeError(f"write refused: {answer.status} {body!r}")
                    status = answer.status
                    shown = self.refused_bodies.setdefault((way, status), [])
                    if len(shown) < 2:
                        shown.append(f"n{at}: {body[:200].decode(errors='replace')}")
                except aiohttp.ClientError:
                    status = 0
                attempts.append((sent, time.monotonic(), at, status))
                self.refused += 1
                self.refusals[way, status] += 1
                if not self.running:
                    return
                if way == "primary":
                    await asyncio.sleep(0.005)
            self.acks[way].append((started, time.monotonic()))
            if way == "any node":
                self.through[at].append(self.acks[way][-1])
            del self.pending[index]
            if attempts:
                self.retried.append((way, started, attempts))

    async def run(self) -> None:
        async with aiohttp.ClientSession() as session:
            await asyncio.gather(self.poll_primary(),
                                 *(self.writer(session, i) for i in range(self.writers)))

    def window(self, start: float, end: float) -> dict[str, dict[str, float]]:
        return {way: self._window(acks, start, end) for way, acks in self.acks.items()}

    def through_each(self, start: float, end: float) -> str:
        """p99 / max (ms) of the writes sent through any node, by node."""
        shown = []
        for at, acks in sorted(self.through.items()):
            figures = self._window(acks, start, end)
            if figures["writes"]:
                shown.append(f"n{at} {figures['p99_ms']} / {figures['max_ms']}")
        return ", ".join(shown)

    def slow_through(self, at: int, start: float, end: float, over: float) -> str:
        """When the writes through node ``at`` begun in [start, end] that took
        longer than ``over`` seconds began: how many in each half second
        after ``start``."""
        halves = collections.Counter(int((began - start) * 2) for began, done
                                     in self.through.get(at, []) if start <= began <= end
                                     and done - began > over)
        return ", ".join(f"{half / 2:.1f}-{half / 2 + 0.5:.1f} s: {count}"
                         for half, count in sorted(halves.items())) or "none"

    @staticmethod
    def _window(acks: list[tuple[float, float]], start: float, end: float
                ) -> dict[str, float]:
        latencies = sorted(done - began for began, done in acks if start <= began <= end)
        done = sorted(done for _, done in acks if start <= done <= end)
        gap = max((b - a for a, b in itertools.pairwise(done)), default=0.0)
        if not latencies:
            return {"writes": 0}
        return {"writes": len(latencies),
                "p50_ms": round(statistics.median(latencies) * 1000, 1),
                "p99_ms": round(latencies[min(len(latencies) - 1,
                                              int(0.99 * len(latencies)))] * 1000, 1),
                "max_ms": round(latencies[-1] * 1000, 1),
                "longest_gap_ms": round(gap * 1000, 1)}


def log_time(line: str) -> float:
    """The wall-clock time a node's text log ``line`` was written."""
    stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    return stamp.timestamp()


@dataclasses.dataclass
class CutOver:
    """One cut-over as the source's and the target's logs tell it."""

    #: Wall-clock times: the source closed the group's writes; its writes went on elsewhere.
    closed: float
    ended: float
    #: The source's total and its steps; the target's steps (this code only).
    held_ms: float
    source_steps: str = ""
    target_steps: str = ""
    #: The target was told this long after the hand-over committed (ms).
    told_after_ms: float | None = None


def cut_over(source: Daemon, seen: int, target: Daemon, target_seen: int) -> CutOver | None:
    """The source's cut-over logged after its first ``seen`` characters of
    log (and the target's opening after ``target_seen``): this code's
    "writes held here" or the start revision's "writes refused here"."""
    for line in source.log()[seen:].splitlines():
        held = re.search(r"closed at ([0-9.]+), committed at ([0-9.]+).*writes held here "
                         r"for ([0-9.]+) ms: (.*)", line)
        if held:
            closed, committed, ms = float(held[1]), float(held[2]), float(held[3])
            found = CutOver(closed, closed + ms / 1000, ms, held[4])
            opened = re.search(r"opened group .* after it was told \(at ([0-9.]+)\): (.*)",
                               target.log()[target_seen:])
            if opened:
                found.target_steps = opened[2]
                found.told_after_ms = round((float(opened[1]) - committed) * 1000, 1)
            return found
        refused = re.search(r"writes refused here for ([0-9.]+) ms", line)
        if refused:  # (the start revision: logged when the hand-over committed)
            ended = log_time(line)
            return CutOver(ended - float(refused[1]) / 1000, ended, float(refused[1]))
    return None


def around(load: Load, cut: CutOver, wall: float) -> str:
    """Writes around ``cut`` (``wall``: this process's wall clock minus its
    monotonic one): latency per way, and the slowest ones attempt by attempt
    (times from the moment the source closed the group's writes)."""
    start, end = cut.closed - wall - AROUND_SECONDS, cut.ended - wall + AROUND_SECONDS
    figures = load.window(start, end)
    closed = cut.closed - wall
    slow = sorted((attempts[-1][1] - began, way, began, attempts)
                  for way, began, attempts in load.retried if start <= began <= end)[::-1]
    shown = []
    for _, way, began, attempts in slow[:SLOWEST_SHOWN]:
        steps = ", ".join(f"n{at} {status or 'error'} at {(sent - closed) * 1000:+.0f}.."
                          f"{(answered - closed) * 1000:+.0f}"
                          for sent, answered, at, status in attempts)
        shown.append(f"{way} from {(began - closed) * 1000:+.0f} ms: {steps} ms, then acked")
    during = sorted(done - began for acks in load.acks.values() for began, done in acks
                    if began <= cut.ended - wall and done >= closed)
    waiting = [time.monotonic() - began for began in load.pending.values() if began <= end]
    if waiting:  # (not in the figures above: a lower bound of their latency)
        figures["not acknowledged yet"] = (f"{len(waiting)}, waiting {max(waiting) * 1000:.0f} "
                                           "ms so far")
    caught = (f"{len(during)} writes in flight across the cut-over itself, latency max "
              f"{during[-1] * 1000:.0f} ms, median {statistics.median(during) * 1000:.0f} ms"
              if during else "no write in flight across the cut-over itself")
    return f"{figures}; {caught}; slowest retried: " + ("; ".join(shown) or "none")


def snapshots(logged: str) -> str:
    """The group and local snapshots a node logged in ``logged``: how many,
    with their times."""
    stored = re.findall(r"^\S+ (\S+) .*stored group (\d+)'s snapshot at position", logged,
                        re.MULTILINE)
    local = re.findall(r"^\S+ (\S+) .*snapshot @\d+: .* in ([0-9.]+)s", logged, re.MULTILINE)
    return (f"{len(stored)} group snapshots stored"
            + (f" (at {', '.join(clock for clock, _ in stored)})" if stored else "")
            + f", {len(local)} local"
            + (f" ({', '.join(f'{clock} in {seconds} s' for clock, seconds in local)})"
               if local else ""))


def stalls(logged: str) -> str:
    """The loop watchdog's warnings in ``logged``: how often and where a
    node's event loop was held over its threshold."""
    found = re.findall(r"^(\S+ (\S+)) .*event loop held for ([0-9.]+) s \(over [0-9.]+ s"
                       r"(?:; ([^)]*))?\): (.*)$", logged, re.MULTILINE)
    longest = sorted(found, key=lambda stall: -float(stall[2]))[:STALLS_SHOWN]
    return (f"{len(found)} loop stalls over 0.1 s; longest: "
            + ("; ".join(f"{seconds} s (ended {clock}"
                         + (f"; {cpu}" if cpu else "") + f") at {where[:200]}"
                         for _, clock, seconds, cpu, where in longest)
               or "none"))


async def move_pauses(root: Path, dsn: str, members: int, writers: int, rounds: int,
                      fill_batch: int = BATCH) -> None:
    nodes = start_nodes(root, dsn, 3, 1)
    group = group_of(BIG)
    # (to attach a profiler to a node during the moves: py-spy record --pid)
    print("node pids: " + ", ".join(f"{node.data_dir.name} {node.process.pid}"
                                    for node in nodes), flush=True)
    try:
        assert nodes[0].request("PUT", f"/v1/boards/{BIG}", {"policy": "best"})[0] == 201
        started = time.monotonic()
        async with aiohttp.ClientSession() as session:
            await fill(session, nodes, BIG, members, batch=fill_batch)
        print(f"loaded {members:,} members into {BIG!r} (group {group}) in "
              f"{time.monotonic() - started:.1f} s")
        deadline = time.monotonic() + 30
        while placement_of(nodes[0], group)[0] is None:
            assert time.monotonic() < deadline, "the group was never placed"
            await asyncio.sleep(0.2)
        print(f"memory with the board: {[round(rss_mib(n)) for n in nodes]} MiB (n0, n1, n2)")
        load = Load(nodes, writers)
        wall = time.time() - time.monotonic()
        running = asyncio.ensure_future(load.run())
        await asyncio.sleep(3.0)
        baseline = load.window(time.monotonic() - 2.0, time.monotonic())
        print(f"load before any move: {baseline}")
        for node in nodes:
            print(f"  {node.data_dir.name} so far: {snapshots(node.log())}")
        for round_ in range(rounds):
            primary, followers, _ = placement_of(nodes[0], group)
            target = next(f"n{i}" for i in range(3) if f"n{i}" not in (primary, *followers))
            source = nodes[int(primary[1:])]
            logged = [len(node.log()) for node in nodes]
            asked = time.monotonic()
            while True:  # (a node busy loading a group may look silent a moment)
                code, body = nodes[0].request("POST", "/v1/cluster/moves",
                                              {"group": group, "node": target})
                if code == 202:
                    break
                assert "not a live node" in str(body) and time.monotonic() < asked + 30, body
                await asyncio.sleep(0.5)
            deadline = asked + 120
            while placement_of(nodes[0], group)[2] != target:
                assert time.monotonic() < deadline, f"the move to {target} never finished"
                await asyncio.sleep(0.1)
            moved = time.monotonic()
            await asyncio.sleep(1.0)
            for _ in range(100):  # the writes begun around the cut-over: answered first
                if not any(began <= moved + AROUND_SECONDS for began in load.pending.values()):
                    break
                await asyncio.sleep(0.1)
            figures = load.window(asked, time.monotonic())
            target_node = nodes[int(target[1:])]
            cut = cut_over(source, logged[nodes.index(source)], target_node,
                           logged[nodes.index(target_node)])
            print(f"move {round_ + 1}: {primary} -> {target} (not holding it before): took "
                  f"{moved - asked:.1f} s from request to the target writing; writes over "
                  f"the whole move {figures}")
            print(f"  through any node, p99 / max ms by the node written to: "
                  f"{load.through_each(asked, time.monotonic())}")
            slow = load.slow_through(int(target[1:]), asked, time.monotonic(), SLOW_MS / 1000)
            steps = [f"{log_time(line) - wall - asked:.2f} s {line[24:].split(': ', 1)[-1][:70]}"
                     for line in target_node.log()[logged[nodes.index(target_node)]:]
                     .splitlines() if f"group {group}" in line and line[:4].isdigit()]
            print("  the target's log of the group, after the request: " + "; ".join(steps[:8]))
            print(f"  writes through the target over {SLOW_MS} ms, by when they began after the "
                  f"request: {slow}")
            if cut is None:
                print("  (no cut-over in the source's log)")
            else:
                print(f"  cut-over: the source held (or refused) writes for {cut.held_ms} ms"
                      + (f" ({cut.source_steps}); the target was told {cut.told_after_ms} "
                         f"ms after the hand-over committed and opened in {cut.target_steps}"
                         if cut.source_steps else ""))
                if cut.source_steps and not cut.target_steps:  # what the target did instead
                    lines = [line for line in target_node.log()[
                        logged[nodes.index(target_node)]:].splitlines()
                        if f"group {group}" in line or " WARNING " in line]
                    print("  the target did not log its opening; its log:\n    "
                          + "\n    ".join(lines[:12]))
                print(f"  writes around the cut-over (from {AROUND_SECONDS:g} s before to "
                      f"{AROUND_SECONDS:g} s after): {around(load, cut, wall)}")
            for node, start in zip(nodes, logged, strict=True):
                print(f"  {node.data_dir.name}: {stalls(node.log()[start:])}; "
                      f"{snapshots(node.log()[start:])}")
            await asyncio.sleep(2.0)
        load.running = False
        await running
        print(f"writes refused and sent again over the whole run: {load.refused} ("
              + ", ".join(f"{way} {status or 'no answer'}: {count}"
                          for (way, status), count in sorted(load.refusals.items())) + ")")
        for (way, status), bodies in sorted(load.refused_bodies.items()):
            print(f"  {way} {status}, first answers: " + "; ".join(bodies))
    except BaseException:
        for node in nodes:  # what went wrong, as the nodes saw it
            alive = node.process is not None and node.process.poll() is None
            lines = node.log().splitlines()
            errors = [line for line in lines if " ERROR " in line or " CRITICAL " in line
                      or "Traceback" in line or "error" in line.lower()]
            status = "alive" if alive else f"exited with {node.process.returncode}"
            print(f"{node.data_dir.name} ({status}): " + "\n".join(
                errors[-10:] + ([] if alive else lines[-5:])), file=sys.stderr)
        raise
    finally:
        stop_nodes(nodes)


async def memory_spread(root: Path, dsns: list[str], boards: int, members: int) -> None:
    names = [f"mem-{i}" for i in range(boards)]
    for count, dsn in zip((1, 2, 3), dsns, strict=True):
        nodes = start_nodes(root / f"spread{count}", dsn, count, 1)
        try:
            empty = [rss_mib(n) for n in nodes]
            async with aiohttp.ClientSession() as session:
                for i, name in enumerate(names):
                    node = nodes[i % count]
                    async with session.put(f"{node.url}/v1/boards/{name}",
                                           json={"policy": "best"}) as answer:
                        await answer.read()
                    # The first write takes the group where it lands: primaries spread.
                    await fill(session, [node], name, members, concurrency=2)
            await asyncio.sleep(4.0)  # placed, then dropped where not placed
            rows = []
            for node, before in zip(nodes, empty, strict=True):
                body = status(node)
                counts = body["placement"]["per_node"].get(node.data_dir.name, {})
                rows.append(f"{node.data_dir.name}: {rss_mib(node):.0f} MiB "
                            f"(+{rss_mib(node) - before:.0f} over empty; primary of "
                            f"{counts.get('primary', 0)}, follows {counts.get('follower', 0)})")
            print(f"{count} node(s), {boards} boards x {members:,} members, --replicas 1: "
                  + "; ".join(rows))
        finally:
            stop_nodes(nodes)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=1_000_000)
    parser.add_argument("--writers", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--boards", type=int, default=48)
    parser.add_argument("--board-members", type=int, default=10_000)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--fill-batch", type=int, default=BATCH,
                        help="events per REST batch loading the big board (one log record "
                        "each, which a move's target applies in one loop step)")
    args = parser.parse_args()
    if args.quick:
        args.members, args.rounds, args.boards = 200_000, 2, 12
    with postgres_server() as server, tempfile.TemporaryDirectory() as root:
        asyncio.run(move_pauses(Path(root) / "moves", server.create_database(),
                                args.members, args.writers, args.rounds, args.fill_batch))
        if not args.skip_memory:
            dsns = [server.create_database() for _ in range(3)]
            asyncio.run(memory_spread(Path(root), dsns, args.boards, args.board_members))
    return 0


if __name__ == "__main__":
    sys.exit(main())
