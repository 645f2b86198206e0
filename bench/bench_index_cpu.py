"""CPU time per operation of the paged index against the skip list, paired.

``bench_index.py`` times each row by wall clock over a tenth of a second,
which this shared machine moves by a factor of two from run to run.  This
one times each row by the process's CPU time (``time.process_time``), and
runs every (tree, kind) pair in its own process, alternating trees and
kinds round by round, so that a row's ratio pages/skip list is taken from
runs made seconds apart.  Rows, on a board of ``--members`` members
``player:%012d`` (19 bytes) with random integer scores:

- ``build``: ``apply_batch`` SETs of 10,000 new members, all of them;
- ``batch INCR``: ``apply_batch`` INCRs of 1,000 random members;
- ``set (new)``, ``incr (new)``: per call, members not on the board;
- ``incr+rank``: per call, ``incr`` then ``rank`` of a random member;
- ``score``, ``rank``: per call, random members;
- ``around``: ``around(member, 5, 5)`` of random members;
- ``ranks(100)``: ``ranks`` of 100 random members, per member;
- ``top-10``: ``range_by_rank(0, 10)``;
- ``dump``, ``load``: the whole board's snapshot, per member.

Scores are integers below 10^7 (``--scores int``, which the paged index
keeps in 4 bytes) or the same plus 0.5 (``--scores fraction``: 8 bytes).
With two trees or more, a last column gives each tree's paged index
against the first tree's, round by round (``--pages-only`` leaves the
skip list out).

Usage (figures are ns per operation, medians over rounds)::

    python bench/bench_index_cpu.py --tree base=/work/wt-base/src --tree branch=src
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

ROWS = ("build", "batch INCR", "set (new)", "incr (new)", "incr+rank", "score", "rank",
        "around", "ranks(100)", "top-10", "dump", "load")
OP_SET, OP_INCR = 0, 5


def worker(kind: str, members: int, ops: int, tie_break: str,
           fraction: float = 0.0) -> dict[str, float]:
    """ns of CPU per operation of each row, for one index kind."""
    if kind == "pages":
        from rankd._pages import RankIndex
    else:
        from rankd._skiplist import RankIndex
    rng = random.Random(7)
    index = RankIndex("desc", tie_break)
    names = [f"player:{i:012d}" for i in range(members + 2 * ops)]
    order = list(range(members))
    rng.shuffle(order)
    batches = [[(OP_SET, names[i], rng.randrange(10_000_000) + fraction)
                for i in order[s:s + 10_000]] for s in range(0, members, 10_000)]
    out: dict[str, float] = {}
    clock = time.process_time
    t = clock()
    for batch in batches:
        index.apply_batch(batch)
    out["build"] = (clock() - t) / members
    incrs = [[(OP_INCR, names[rng.randrange(members)], float(rng.randrange(1, 100)))
              for _ in range(1000)] for _ in range(ops // 1000)]
    t = clock()
    for batch in incrs:
        index.apply_batch(batch)
    out["batch INCR"] = (clock() - t) / (len(incrs) * 1000)
    fresh = names[members:members + ops]
    scores = [float(rng.randrange(10_000_000)) for _ in range(ops)]
    t = clock()
    for name, score in zip(fresh, scores, strict=True):
        index.set(name, score)
    out["set (new)"] = (clock() - t) / ops
    fresh = names[members + ops:]
    t = clock()
    for name, score in zip(fresh, scores, strict=True):
        index.incr(name, score)
    out["incr (new)"] = (clock() - t) / ops
    probes = [names[rng.randrange(members)] for _ in range(ops)]
    t = clock()
    for name in probes:
        index.incr(name, 1.0)
        index.rank(name)
    out["incr+rank"] = (clock() - t) / ops
    t = clock()
    for name in probes:
        index.score(name)
    out["score"] = (clock() - t) / ops
    t = clock()
    for name in probes:
        index.rank(name)
    out["rank"] = (clock() - t) / ops
    t = clock()
    for name in probes:
        index.around(name, 5, 5)
    out["around"] = (clock() - t) / ops
    groups = [probes[i:i + 100] for i in range(0, ops, 100)]
    t = clock()
    for group in groups:
        index.ranks(group)
    out["ranks(100)"] = (clock() - t) / ops
    t = clock()
    for _ in range(ops):
        index.range_by_rank(0, 10)
    out["top-10"] = (clock() - t) / ops
    t = clock()
    data = index.dump()
    out["dump"] = (clock() - t) / len(index)
    t = clock()
    type(index).load(data)
    out["load"] = (clock() - t) / len(index)
    return {row: value * 1e9 for row, value in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", action="append", required=True,
                        help="NAME=SRC, a tree to measure (repeatable)")
    parser.add_argument("--members", type=int, default=1_000_000)
    parser.add_argument("--ops", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tie-break", choices=("first", "member"), default="first")
    parser.add_argument("--scores", choices=("int", "fraction"), default="int")
    parser.add_argument("--pages-only", action="store_true")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.members, args.ops, args.tie_break,
                                0.5 if args.scores == "fraction" else 0.0)))
        return
    trees = [tree.split("=", 1) for tree in args.tree]
    got: dict[tuple[str, str], list[dict[str, float]]] = {}
    for rnd in range(args.rounds):
        for name, src in trees if rnd % 2 == 0 else trees[::-1]:
            kinds = ("pages",) if args.pages_only else ("skiplist", "pages")
            for kind in kinds if rnd % 2 == 0 else kinds[::-1]:
                env = dict(os.environ, PYTHONPATH=os.path.abspath(src))
                result = subprocess.run(
                    [sys.executable, __file__, "--worker", kind, "--members", str(args.members),
                     "--ops", str(args.ops), "--tie-break", args.tie_break,
                     "--scores", args.scores, "--tree", "-"],
                    env=env, capture_output=True, text=True, check=True)
                got.setdefault((name, kind), []).append(json.loads(result.stdout))
                print(f"round {rnd + 1} {name} {kind} done, load {os.getloadavg()[0]:.1f}",
                      file=sys.stderr)
    print(f"CPU ns per operation, {args.members:,} members, tie-break {args.tie_break}, "
          f"{args.scores} scores, {args.rounds} rounds (medians; ratios per round)")
    header = f"{'':12}"
    for name, _ in trees:
        if not args.pages_only:
            header += f"{name + ' skip':>13}"
        header += f"{name + ' pages':>13}"
        if not args.pages_only:
            header += f"  {'pages/skip':<18}{'median':>7}"
    for name, _ in trees[1:]:
        header += f"  {name + '/' + trees[0][0] + ' pages':<20}{'median':>7}"
    print(header)
    for row in ROWS:
        line = f"{row:12}"
        for name, _ in trees:
            pages = [r[row] for r in got[(name, "pages")]]
            if not args.pages_only:
                skip = [r[row] for r in got[(name, "skiplist")]]
                line += f"{statistics.median(skip):13,.0f}"
            line += f"{statistics.median(pages):13,.0f}"
            if not args.pages_only:
                line += ratio_cells(pages, skip, 18)
        first = [r[row] for r in got[(trees[0][0], "pages")]]
        for name, _ in trees[1:]:
            line += ratio_cells([r[row] for r in got[(name, "pages")]], first, 20)
        print(line)


def ratio_cells(values: list[float], against: list[float], width: int) -> str:
    """Round-by-round ratios and their median, as table cells."""
    ratios = [v / a for v, a in zip(values, against, strict=True)]
    return f"  {' '.join(f'{x:.2f}' for x in ratios):<{width}}{statistics.median(ratios):6.2f}x"


if __name__ == "__main__":
    main()
