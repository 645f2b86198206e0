"""How long loading a group's snapshot holds the event loop.

A node that starts to hold a board group (a new follower, a move's target)
loads the group's snapshot (``Engine.load_group_snapshot``).  This builds
a board of ``--members`` members (default 1,000,000, each with an event
id) in one engine, takes its group snapshot, then loads it ``--rounds``
times (default 3) into a second engine while a heartbeat coroutine wakes
every millisecond and records how late it ran: the longest lateness is the
longest the load held the loop.  Prints, per round, the load's wall time,
the process's CPU time over it (user + sys), and the heartbeat's p50, p99
and maximum lateness.  First, the native index's load alone in a worker
thread, and how late the main thread's 1 ms sleeps run meanwhile (the
load lets go of the GIL every 2,048 members).  In-process: no daemon, no
Postgres, no network.

Compare two checkouts side by side (the same machine, alternated)::

    PYTHONPATH=src python bench/bench_group_load.py
    PYTHONPATH=/other/checkout/src python bench/bench_group_load.py
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rankd.cluster.groups import group_of
from rankd.engine.engine import Engine, EngineConfig
from rankd.engine.submission import Submission

BOARD = "big"
BATCH = 10_000


async def heartbeat(lateness: list[float], running: asyncio.Event) -> None:
    """Wake every ms; note how late each wake-up was."""
    while not running.is_set():
        due = time.perf_counter() + 0.001
        await asyncio.sleep(0.001)
        lateness.append(max(0.0, time.perf_counter() - due))


def cpu() -> float:
    times = os.times()
    return times.user + times.system


def thread_load(members: int) -> None:
    """The native index's ``load`` of ``members`` in a worker thread, while
    this thread sleeps 1 ms at a time: how late its wake-ups are is how
    long the load kept the GIL from it."""
    import threading

    from rankd.index import RankIndex

    index = RankIndex("desc")
    for n in range(members):
        index.set(f"m{n}", float(n))
    dump = index.dump()
    loaded = threading.Event()
    worker = threading.Thread(target=lambda: (RankIndex.load(dump), loaded.set()))
    lateness = []
    started = time.perf_counter()
    worker.start()
    while not loaded.is_set():
        due = time.perf_counter() + 0.001
        time.sleep(0.001)
        lateness.append(time.perf_counter() - due)
    worker.join()
    print(f"index load of {members:,} members in a thread: {time.perf_counter() - started:.2f}"
          f" s; the other thread's 1 ms sleeps woke up to {max(lateness) * 1000:.1f} ms late "
          f"({len(lateness)} wake-ups)")


async def group_snapshot(root: Path, members: int) -> tuple[int, int, int, list[bytes]]:
    """``(group, seq, epoch, sections)``: the group snapshot of a board of
    ``members`` members with event ids, made by an engine in ``root``."""
    source = await Engine.open(EngineConfig(data_dir=root))
    await source.put_board(BOARD, {"policy": "best"})
    for start in range(0, members, BATCH):
        await source.submit_many([
            Submission(BOARD, f"m{i}", float(i % 100_000), event_id=f"{BOARD}-{i}")
            for i in range(start, min(members, start + BATCH))])
    group = group_of(BOARD)
    seq, epoch, sections, _ = await source.group_snapshot(group)
    await source.close(snapshot=False)
    return group, seq, epoch, sections


async def main(members: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as root:
        group, seq, epoch, sections = await group_snapshot(Path(root) / "source", members)
        size = sum(map(len, sections))
        print(f"{members:,} members: a group snapshot of {len(sections)} sections, "
              f"{size / 1e6:.1f} MB")
        target = await Engine.open(EngineConfig(data_dir=Path(root) / "target"))
        try:
            for round_ in range(rounds):
                lateness: list[float] = []
                done = asyncio.Event()
                beating = asyncio.ensure_future(heartbeat(lateness, done))
                await asyncio.sleep(0.05)
                started, cpu_started = time.perf_counter(), cpu()
                await target.load_group_snapshot(group, seq + round_, epoch, sections)
                took, cpu_took = time.perf_counter() - started, cpu() - cpu_started
                done.set()
                await beating
                assert len(target.boards[BOARD].periods["all"]["all"]) == members
                lateness.sort()
                print(f"round {round_ + 1}: load {took:.2f} s wall, {cpu_took:.2f} s CPU; "
                      f"heartbeat lateness p50 {statistics.median(lateness) * 1000:.1f} ms, "
                      f"p99 {lateness[int(len(lateness) * 0.99)] * 1000:.1f} ms, "
                      f"max {lateness[-1] * 1000:.1f} ms over {len(lateness)} beats")
        finally:
            await target.close(snapshot=False)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    thread_load(args.members)
    asyncio.run(main(args.members, args.rounds))
    sys.exit(0)
