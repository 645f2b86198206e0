#!/usr/bin/env python3
"""Writes of the paged index at two (or more) commits, paired in one process.

Why
---
``bench_index.py`` times writes of one build against the skip list's; a
change to the paged index's write path is better judged against the
paged index before it, in the same process and the same minutes (this
machine's noise between runs is larger than such a change), as
``bench_ab_reads.py`` does for reads.

How
---
Each ``--rev``'s ``_pages.pyx`` is built as a module of its own and given
the same board (``--members`` members ``"p:%014d"`` with random integer
scores, or a ``--snapshot``: see ``bench_ab_reads.py``).  Then
``--rounds`` rounds; each draws its writes (the same for every board)
and, board by board in an order rotated every round, times four phases,
each a Python loop of single calls:

* ``incr``: ``incr(m, d)`` of ``--sample`` random members by 1..99 (a
  small step: the entry most often stays in its page, and ties come and
  go);
* ``set``: ``set(m, s)`` of ``--sample`` random members to a random score
  (the entry moves to another page: a removal and an insert);
* ``remove``: ``remove(m)`` of ``--sample // 4`` random members;
* ``add``: the same members set again (new members for the board).

Output: each round's rates, then the medians over rounds and their ratio
to the first revision's (above 1: faster).

::

    python bench/bench_ab_writes.py --rev HEAD~1 --rev HEAD
"""

from __future__ import annotations

import gc
import random
import sys
import time

from bench_ab_reads import paired_arguments, paired_boards, print_medians
from bench_huge import NAME

PHASES = ("incr", "set", "remove", "add")


def phases(index, writes: dict) -> dict[str, float]:
    """Calls a second of each phase on ``index``."""
    rates = {}
    gc.disable()
    started = time.perf_counter()
    for member, delta in writes["incr"]:
        index.incr(member, delta)
    done = time.perf_counter()
    rates["incr"] = len(writes["incr"]) / (done - started)
    started = done
    for member, score in writes["set"]:
        index.set(member, score)
    done = time.perf_counter()
    rates["set"] = len(writes["set"]) / (done - started)
    started = done
    for member, _ in writes["remove"]:
        index.remove(member)
    done = time.perf_counter()
    rates["remove"] = len(writes["remove"]) / (done - started)
    started = done
    for member, score in writes["remove"]:
        index.set(member, score)
    rates["add"] = len(writes["remove"]) / (time.perf_counter() - started)
    gc.enable()
    return rates


def main() -> int:
    p = paired_arguments(__doc__.split("\n")[0], 200_000)
    args = p.parse_args()
    boards = paired_boards(p, args)
    if boards is None:
        return 0
    labels = list(boards)
    size = len(boards[labels[0]])
    figures: dict[str, dict[str, list[float]]] = {
        label: {phase: [] for phase in PHASES} for label in labels}
    for r in range(args.rounds):
        rng = random.Random(2000 + r)
        removed = rng.sample(range(size), args.sample // 4)
        writes = {
            "incr": [(NAME % rng.randrange(size), rng.randrange(1, 100))
                     for _ in range(args.sample)],
            "set": [(NAME % rng.randrange(size), rng.randrange(10**9))
                    for _ in range(args.sample)],
            "remove": [(NAME % i, rng.randrange(10**9)) for i in removed],
        }
        order = labels[r % len(labels):] + labels[:r % len(labels)]
        for label in order:
            rates = phases(boards[label], writes)
            for phase, rate in rates.items():
                figures[label][phase].append(rate)
            print(f"round {r}: {label:>12}  " + "  ".join(
                f"{phase} {rate / 1000:.0f}k/s" for phase, rate in rates.items()), flush=True)
    print_medians(figures, lambda v: f"{v / 1000:.0f}k/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
