"""How long a snapshot of a big board holds up the event loop and its writers.

Fills one board with ``--members`` members (each with an event id, every
tenth with a label), then takes a snapshot while a ticker task sleeps 2 ms
at a time and records how late it wakes up.  The longest gap is the longest
the event loop was blocked.  Target: under 100 ms at 1M members.

Meanwhile a writer submits to the same board every 5 ms and records how
long each submission took: the longest is the longest a write to the board
waited for the snapshot (until 2026-11-30 a board took no writes while its
indexes were copied; now they are walked while it takes writes).

    python bench/bench_snapshot.py [--members 1000000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import tempfile
import time

from rankd.engine.engine import Engine, EngineConfig
from rankd.engine.submission import Submission
from rankd.engine.tail import MAX_SNAPSHOT_EVERY_BYTES, MAX_SNAPSHOT_EVERY_EVENTS


async def fill(engine: Engine, members: int) -> None:
    await engine.put_board("big", {"policy": "sum"})
    for start in range(0, members, 10_000):
        await engine.submit_many([
            Submission(board="big", member=f"player:{i}", delta=1.0, event_id=f"e{i}",
                       label=f"P{i}" if i % 10 == 0 else None)
            for i in range(start, min(start + 10_000, members))])


async def one_snapshot(engine: Engine) -> tuple[float, float, float, float, float, int]:
    """(seconds, longest event-loop gap, p99 gap, longest write, p99 write,
    writes) of one snapshot."""
    gaps: list[float] = []
    writes: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.002)
            now = time.perf_counter()
            gaps.append(now - last - 0.002)
            last = now

    async def writer() -> None:
        count = 0
        while not done.is_set():
            count += 1
            started = time.perf_counter()
            await engine.submit(Submission(board="big", member=f"writer:{count % 100}",
                                           delta=1.0))
            writes.append(time.perf_counter() - started)
            await asyncio.sleep(0.005)

    tasks = [asyncio.create_task(ticker()), asyncio.create_task(writer())]
    await asyncio.sleep(0.05)
    started = time.perf_counter()
    await engine.snapshot()
    took = time.perf_counter() - started
    done.set()
    await asyncio.gather(*tasks)
    gaps.sort()
    writes.sort()
    return (took, gaps[-1], gaps[int(len(gaps) * 0.99)], writes[-1],
            writes[int(len(writes) * 0.99)], len(writes))


async def main(members: int, repeats: int) -> None:
    with tempfile.TemporaryDirectory() as data_dir:
        engine = await Engine.open(EngineConfig(data_dir=data_dir, fsync="no",
                                                snapshot_every_events=MAX_SNAPSHOT_EVERY_EVENTS,
                                                snapshot_every_bytes=MAX_SNAPSHOT_EVERY_BYTES))
        await fill(engine, members)
        gc.freeze()  # as the daemon does after recovery
        runs = [await one_snapshot(engine) for _ in range(repeats)]
        await engine.close(snapshot=False)
    seconds = statistics.median(r[0] for r in runs)
    worst = max(r[1] for r in runs)
    p99 = statistics.median(r[2] for r in runs)
    write = statistics.median(r[3] for r in runs)
    write_p99 = statistics.median(r[4] for r in runs)
    count = statistics.median(r[5] for r in runs)
    print(f"snapshot of {members:,} members with {members:,} event ids and {members // 10:,} "
          f"labels: median {seconds:.2f} s over {repeats} runs")
    print(f"longest event-loop gap: {worst * 1000:.0f} ms (target < 100 ms: "
          f"{'PASS' if worst < 0.1 else 'MISS'}); median p99 gap {p99 * 1000:.1f} ms")
    print(f"longest wait of a write to the board: median {write * 1000:.0f} ms over the runs; "
          f"p99 {write_p99 * 1000:.1f} ms; {count:.0f} writes a run")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    options = parser.parse_args()
    asyncio.run(main(options.members, options.repeats))
