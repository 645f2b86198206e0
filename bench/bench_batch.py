"""``apply_batch`` INCR cost per operation on boards of different tie density.

The index benchmark measures one board (scores drawn in 0..1,000,000, about
one tie per score).  How often scores tie decides which write path an
increment takes (kept in place, moved along level 0, or unlinked and linked
back) and how far a search runs through runs of tied scores, so a change to
the index can help one board and not another.  This script times the same
increments on three boards, each built fresh in this process:

* ``distinct``: 1M members, scores in 0..10**9 (almost no ties);
* ``benchmark``: 1M members, scores in 0..1,000,000 (bench_index.py's);
* ``runs``: 100K members all starting at 0, then 1M increments of +1, so
  runs of thousands of members share each score (a board of wins).

Each repeat times ``--ops`` increments of +1 on random members, in batches
of ``--batch``; batches are built before the clock starts.  It prints the
ns per operation of every repeat and their median.  Meant for comparing
builds side by side: run it alternately against each (``PYTHONPATH`` of a
``git worktree`` with its own build) and compare the medians.

Run from the project root (the native index built)::

    python bench/bench_batch.py
    python bench/bench_batch.py --boards benchmark --repeats 9
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from rankd.index import IMPLEMENTATION, Op, RankIndex

BOARDS = ("distinct", "benchmark", "runs")


def build(board: str, rng: random.Random) -> tuple[RankIndex, list[str]]:
    """The board, loaded in chunks as the index benchmark loads it."""
    n = 100_000 if board == "runs" else 1_000_000
    members = [f"player:{i}" for i in range(n)]
    index = RankIndex("desc", "first")
    high = {"distinct": 10**9, "benchmark": 1_000_000, "runs": 0}[board]
    for start in range(0, n, 10_000):
        index.apply_batch([(Op.SET, m, float(rng.randint(0, high)))
                           for m in members[start:start + 10_000]])
    if board == "runs":
        for _ in range(1_000_000 // 1000):
            index.apply_batch([(Op.INCR, members[rng.randrange(n)], 1.0) for _ in range(1000)])
    return index, members


def time_increments(index: RankIndex, members: list[str], ops: int, batch: int,
                    rng: random.Random) -> float:
    """Nanoseconds per operation for ``ops`` increments in batches of ``batch``."""
    batches = [[(Op.INCR, members[rng.randrange(len(members))], 1.0) for _ in range(batch)]
               for _ in range(ops // batch)]
    t0 = time.perf_counter()
    for ops_batch in batches:
        index.apply_batch(ops_batch)
    return (time.perf_counter() - t0) / (len(batches) * batch) * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--boards", default=",".join(BOARDS),
                        help=f"comma-separated, of {', '.join(BOARDS)} (default: all)")
    parser.add_argument("--ops", type=int, default=400_000, help="increments per repeat")
    parser.add_argument("--batch", type=int, default=1000, help="operations per apply_batch")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    boards = args.boards.split(",")
    for board in boards:
        if board not in BOARDS:
            parser.error(f"unknown board {board!r}; choose from {', '.join(BOARDS)}")
    print(f"index {IMPLEMENTATION}; {args.ops:,} increments per repeat in batches of "
          f"{args.batch:,}; median of {args.repeats}")
    for board in boards:
        rng = random.Random(1)
        index, members = build(board, rng)
        runs = [time_increments(index, members, args.ops, args.batch, rng)
                for _ in range(args.repeats)]
        listed = " ".join(f"{r:.0f}" for r in runs)
        print(f"{board:>10}: {statistics.median(runs):6.0f} ns/op  (runs {listed})", flush=True)


if __name__ == "__main__":
    main()
