"""RankIndex.set_states against apply_batch for the same absolute states.

Recovery hands each index the ``(member, score, seq)`` states the WAL
records carry; ``set_states`` re-threads the whole list in one ordered pass
once a batch holds at least 1/8 of the index, where ``apply_batch`` searches
once per operation.  Both run on copies (``load`` of one ``dump``) of a
board of ``--members`` (1,000,000) members with scores 1..7 (many ties, as
on a wins board), for batches of several sizes drawn at random with
repeats; the two results must be identical.

Run from the project root (the native index built)::

    python bench/bench_set_states.py
    python bench/bench_set_states.py --members 100000
"""

from __future__ import annotations

import argparse
import random
import time

from rankd.index import IMPLEMENTATION, Op, RankIndex


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--members", type=int, default=1_000_000)
    args = parser.parse_args()
    n = args.members
    base = RankIndex("desc", "first")
    base.apply_batch([(Op.SET, f"member-{i}", 1 + i % 7, i) for i in range(n)])
    dump = base.dump()
    rng = random.Random(1)
    print(f"index {IMPLEMENTATION}, {n:,} members")
    print(f"{'states':>9}  {'apply_batch':>12}  {'set_states':>12}  ratio")
    for fraction in (0.05, 0.125, 0.25, 0.632):
        k = int(n * fraction)
        # Unique scores, so the two ways agree exactly (apply_batch keeps the
        # old seq of an unchanged score; set_states takes every seq as given).
        states = [(f"member-{rng.randrange(n)}", j + 10.0, n + j) for j in range(k)]
        ops = [(Op.SET, member, score, seq) for member, score, seq in states]
        by_ops = RankIndex.load(dump)
        started = time.perf_counter()
        by_ops.apply_batch(ops)
        ops_seconds = time.perf_counter() - started
        by_states = RankIndex.load(dump)
        started = time.perf_counter()
        by_states.set_states(states)
        states_seconds = time.perf_counter() - started
        if by_ops.dump()[24:] != by_states.dump()[24:]:
            raise SystemExit("set_states and apply_batch disagree")
        print(f"{k:>9,}  {ops_seconds:>10.3f} s  {states_seconds:>10.3f} s  "
              f"{ops_seconds / states_seconds:.2f}x")


if __name__ == "__main__":
    main()
