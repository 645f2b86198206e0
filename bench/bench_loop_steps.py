"""The loop thread's own CPU time per step while a node loads a group.

``bench_group_load.py`` measures how late a heartbeat runs during a group
load: on a shared machine that includes the time the loop thread waits for
a core or for the GIL, and swings with the load of the machine.  This one
counts what the load itself makes one step of the event loop cost: every
callback the loop runs (``asyncio.Handle._run``) is timed with
``time.thread_time`` (CPU time of the loop's thread, user and system: a
write's copy into the page cache included, a wait for a core not).  It
builds a ``--members`` board with event ids (default 1,000,000), takes its
group snapshot (as ``bench_group_load.py`` does), loads it into a second
engine (``load_group_snapshot``: built in a worker thread, swapped in,
then the local log's copy written) and prints the longest steps, how many
took over 5 ms and the total.
In-process: no daemon, no Postgres, no network.

``--transaction N``: then one transaction of ``N`` submissions (RESP's
``EXEC``: one ``TRANSACTION`` record) on the loaded board, and the CPU of
applying that record as a follower does (``Replayer.replay_records`` and
``flush``, what ``apply_replicated`` runs in one step) on a third engine
holding the board: a record that is applied whole.

Compare two checkouts side by side (alternated)::

    PYTHONPATH=src python bench/bench_loop_steps.py
    PYTHONPATH=/other/checkout/src python bench/bench_loop_steps.py
"""

from __future__ import annotations

import argparse
import asyncio
import asyncio.events
import tempfile
import time
from pathlib import Path

from bench_group_load import BOARD, group_snapshot
from rankd.engine.engine import Engine, EngineConfig
from rankd.engine.submission import Submission

#: (CPU seconds, callback) of each loop step while recording.
steps: list[tuple[float, str]] = []
recording = False
_run = asyncio.events.Handle._run


def _timed_run(self: asyncio.events.Handle) -> None:
    if not recording:
        return _run(self)
    started = time.thread_time()
    try:
        return _run(self)
    finally:
        steps.append((time.thread_time() - started, repr(self)[:120]))


async def main(members: int, show: int) -> None:
    global recording
    asyncio.events.Handle._run = _timed_run
    with tempfile.TemporaryDirectory() as root:
        group, seq, epoch, sections = await group_snapshot(Path(root) / "source", members)
        target = await Engine.open(EngineConfig(data_dir=Path(root) / "target"))
        try:
            recording = True
            started = time.perf_counter()
            await target.load_group_snapshot(group, seq, epoch, sections)
            took = time.perf_counter() - started
            await asyncio.sleep(0.5)  # the commits the load left behind
            recording = False
        finally:
            await target.close(snapshot=False)
    cpu = sorted(steps, reverse=True)
    print(f"{members:,} members, a snapshot of {sum(map(len, sections)) / 1e6:.1f} MB in "
          f"{len(sections)} sections (largest {max(map(len, sections)) / 1e6:.1f} MB); "
          f"load {took:.2f} s wall")
    print(f"{len(cpu)} loop steps, {sum(c for c, _ in cpu) * 1000:.0f} ms CPU in all; "
          f"over 5 ms: {sum(c > 0.005 for c, _ in cpu)}; longest: "
          + ", ".join(f"{c * 1000:.1f}" for c, _ in cpu[:show]) + " ms")
    for seconds, handle in cpu[:3]:
        print(f"  {seconds * 1000:.1f} ms {handle}")


async def transaction(members: int, submissions: int) -> None:
    """One transaction's record, applied as a follower applies it (module doc)."""
    with tempfile.TemporaryDirectory() as root:
        *_, sections = await group_snapshot(Path(root) / "source", members)
        primary = await Engine.open(EngineConfig(data_dir=Path(root) / "primary"))
        follower = await Engine.open(EngineConfig(data_dir=Path(root) / "follower"))
        try:
            for engine in (primary, follower):
                engine._state.load(sections)
            wal = primary._core.wal
            before = wal.last_lsn
            writing = primary.transaction()
            await writing.ready([BOARD])
            started = time.thread_time()
            writing.submit([Submission(BOARD, f"m{n * 97 % members}", float(members + n))
                            for n in range(submissions)])
            committed = writing.commit()
            primary_cpu = time.thread_time() - started
            if committed is not None:
                await committed
            logged = [record for batch in wal.iter_batches(before + 1, submissions + 10)
                      for record in batch]
            started, wall = time.thread_time(), time.perf_counter()
            follower._replayer.replay_records(logged)
            follower._replayer.flush()
            follower_cpu, wall = time.thread_time() - started, time.perf_counter() - wall
        finally:
            await primary.close(snapshot=False)
            await follower.close(snapshot=False)
    print(f"a transaction of {submissions:,} submissions on {members:,} members: "
          f"{max(len(payload) for _, payload in logged) / 1e6:.1f} MB record; the primary's "
          f"step {primary_cpu * 1000:.1f} ms CPU; a follower's application "
          f"{follower_cpu * 1000:.1f} ms CPU ({wall * 1000:.1f} ms wall)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=1_000_000)
    parser.add_argument("--show", type=int, default=6, help="longest steps printed")
    parser.add_argument("--transaction", type=int, default=0, metavar="N",
                        help="then a transaction of N submissions (module doc)")
    args = parser.parse_args()
    asyncio.run(main(args.members, args.show))
    if args.transaction:
        asyncio.run(transaction(args.members, args.transaction))
