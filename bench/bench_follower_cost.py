"""CPU per write on a follower against a primary: the planner's weight of a follower.

The planner's drift measure counts a follower's share of a node's load
(``rankd.cluster.drift.FOLLOWER_WEIGHT``).  A follower holds the group's
boards as its primary does (the same memory); what differs is the CPU a
write costs.  This measures it in-process, engine against engine, the
same records both ways:

* **primary**: ``--writers`` coroutines each submit one event at a time
  (``Engine.submit``, with an event id, to one board of ``--members``
  members) until ``--events`` were acknowledged: the checks, the board
  update, the record's encoding and its local log write; with ``--batch
  N``, batches of ``N`` instead (``Engine.submit_many``, a REST batch's or
  a pipeline's way: the cheapest a primary's write gets);
* **follower**: the same records, read from the primary's local log, applied
  by a second engine holding the same board as a cluster follower applies
  them (``Engine.apply_replicated`` in slices of 1,000 records, its own
  local log's copy included).

CPU is the process's (user + system, worker threads included), ``fsync
no`` on both so the disk does not count.  Neither side's network is in it:
a real primary also parses its requests and ships its log to Postgres, a
real follower reads and checks the log's batches, so the ratio is of the
engines' work alone.  Rounds alternate primary and follower runs; medians.

    PYTHONPATH=src python bench/bench_follower_cost.py             # 200,000 events
    PYTHONPATH=src python bench/bench_follower_cost.py --events 50000 --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import tempfile
from pathlib import Path

from rankd.engine.engine import Engine, EngineConfig
from rankd.engine.groups import group_of
from rankd.engine.submission import Submission

BOARD = "lb:{cost}:daily"


def cpu() -> float:
    times = os.times()
    return times.user + times.system


async def one_round(root: Path, events: int, members: int, writers: int,
                    seed: int, batch: int = 0) -> tuple[float, float]:
    """CPU seconds of the primary's ``events`` writes and of a follower's."""
    rng = random.Random(seed)
    subs = [Submission(BOARD, f"player-{rng.randrange(members)}", float(rng.randrange(10**6)),
                       event_id=f"e{seed}-{n}") for n in range(events)]
    primary = await Engine.open(EngineConfig(data_dir=root / "primary", fsync="no"))
    follower = await Engine.open(EngineConfig(data_dir=root / "follower", fsync="no"))
    try:
        for engine in (primary, follower):
            await engine.put_board(BOARD, {"policy": "best", "windows": ["all"]})
        before = primary._core.wal.last_lsn
        slices = [subs[i::writers] for i in range(writers)]

        async def writer(mine: list[Submission]) -> None:
            if batch:
                for at in range(0, len(mine), batch):
                    await primary.submit_many(mine[at:at + batch])
                return
            for submission in mine:
                await primary.submit(submission)

        started = cpu()
        await asyncio.gather(*(writer(mine) for mine in slices))
        primary_cpu = cpu() - started
        logged = [(lsn, 1, bytes(payload))
                  for batch in primary._core.wal.iter_batches(before + 1, 10_000)
                  for lsn, payload in batch]
        assert len(logged) == events, (len(logged), events)
        group = group_of(BOARD)
        started = cpu()
        for at in range(0, len(logged), 1000):
            await follower.apply_replicated(group, logged[at:at + 1000])
        follower_cpu = cpu() - started
        assert primary.digest(BOARD) == follower.digest(BOARD)  # the same boards
    finally:
        await primary.close(snapshot=False)
        await follower.close(snapshot=False)
    return primary_cpu, follower_cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--members", type=int, default=100_000)
    parser.add_argument("--writers", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=0,
                        help="primary: submit_many batches of this many (0: one at a time)")
    args = parser.parse_args()
    ratios, primaries, followers = [], [], []
    for n in range(args.rounds):
        with tempfile.TemporaryDirectory() as root:
            primary_cpu, follower_cpu = asyncio.run(one_round(
                Path(root), args.events, args.members, args.writers, n, args.batch))
        primaries.append(primary_cpu / args.events * 1e6)
        followers.append(follower_cpu / args.events * 1e6)
        ratios.append(follower_cpu / primary_cpu)
        print(f"round {n + 1}: primary {primaries[-1]:.2f} us/write, follower "
              f"{followers[-1]:.2f} us/write, follower / primary {ratios[-1]:.3f}")
    print(f"median of {args.rounds}: primary {statistics.median(primaries):.2f} us/write, "
          f"follower {statistics.median(followers):.2f} us/write, follower / primary "
          f"{statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
