"""Instructions per call of the rank index's entry points, under callgrind.

Wall clock on this shared machine moves by tens of percent; instruction
counts do not (they move by about 1% between runs: each index draws a
random SipHash key).  For each index kind (the skip list, ``_skiplist``,
and the paged index, ``_pages``) this runs a child process under
``valgrind --tool=callgrind`` counting only inside ``RankIndex``'s Python
entry points (``--toggle-collect``), and prints per call:

- ``build``: ``apply_batch`` SETs of ``--batch`` new members, ``--members`` in all;
- ``set (new)``: ``set`` of ``--calls`` members not on the board;
- ``score``, ``rank``: of ``--calls`` random members on the board;
- ``incr``: of ``--calls // 2`` random members on the board.

Members are ``player:%012d`` (19 bytes), scores random integers (seeded),
tie-break ``--tie-break``.  Needs ``valgrind``; a minute or two a kind at
the defaults::

    python bench/bench_index_calls.py                        # this tree
    python bench/bench_index_calls.py --src /other/tree/src  # another build
"""

from __future__ import annotations

import argparse
import os
import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path

#: The C function of each Python entry point, by kind: Cython names them
#: ``__pyx_pw_<module>_9RankIndex_<n><name>``.
MODULES = {"skiplist": "5rankd_9_skiplist", "pages": "5rankd_6_pages"}
ROWS = ("build", "set (new)", "score", "rank", "incr")
OP_SET, OP_INCR = 0, 5


def child(kind: str, members: int, calls: int, batch: int, tie_break: str) -> None:
    """The measured work (callgrind counts only the entry points)."""
    if kind == "pages":
        from rankd._pages import RankIndex
    else:
        from rankd._skiplist import RankIndex
    rng = random.Random(1)
    index = RankIndex("desc", tie_break)
    names = [f"player:{i:012d}" for i in range(members + calls)]
    order = list(range(members))
    rng.shuffle(order)
    for start in range(0, members, batch):
        index.apply_batch([(OP_SET, names[i], float(rng.randrange(1_000_000)))
                           for i in order[start:start + batch]])
    for i in range(members, members + calls):
        index.set(names[i], float(rng.randrange(1_000_000)))
    probes = [names[rng.randrange(members)] for _ in range(calls)]
    for name in probes:
        index.score(name)
    for name in probes:
        index.rank(name)
    for name in probes[: calls // 2]:
        index.incr(name, 1.0)


def inclusive(out: Path, module: str) -> dict[str, int]:
    """Inclusive instructions of each entry point in a callgrind output."""
    text = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100",
                           str(out)], capture_output=True, text=True, check=True).stdout
    found: dict[str, int] = {}
    pattern = re.compile(r"^\s*([\d,]+)\s.*__pyx_pw_" + module + r"_9RankIndex_\d+(\w+?)\s")
    for line in text.splitlines():
        match = pattern.match(line)
        if match:
            found[match.group(2)] = found.get(match.group(2), 0) + int(
                match.group(1).replace(",", ""))
    return found


def measure(kind: str, args: argparse.Namespace) -> dict[str, float]:
    """Instructions per call of each row, for ``kind``."""
    module = MODULES[kind]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        env = dict(os.environ, PYTHONHASHSEED="0")
        if args.src:
            env["PYTHONPATH"] = args.src + os.pathsep + env.get("PYTHONPATH", "")
        subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                        f"--toggle-collect=__pyx_pw_{module}_9RankIndex_*",
                        sys.executable, __file__, "--child", kind,
                        "--members", str(args.members), "--calls", str(args.calls),
                        "--batch", str(args.batch), "--tie-break", args.tie_break],
                       env=env, check=True, capture_output=True)
        counts = inclusive(out, module)
    per_row = {"build": ("apply_batch", args.members), "set (new)": ("set", args.calls),
               "score": ("score", args.calls), "rank": ("rank", args.calls),
               "incr": ("incr", args.calls // 2)}
    return {row: counts.get(name, 0) / n for row, (name, n) in per_row.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--members", type=int, default=100_000)
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--tie-break", choices=("first", "member"), default="first")
    parser.add_argument("--src", help="the tree's src directory to measure (default: as imported)")
    parser.add_argument("--kinds", default="skiplist,pages")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.members, args.calls, args.batch, args.tie_break)
        return
    kinds = args.kinds.split(",")
    figures = {kind: measure(kind, args) for kind in kinds}
    print(f"instructions per call, {args.members:,} members, tie-break {args.tie_break}"
          + (f", src {args.src}" if args.src else ""))
    print(f"{'':12}" + "".join(f"{kind:>12}" for kind in kinds)
          + ("       ratio" if len(kinds) == 2 else ""))
    for row in ROWS:
        values = [figures[kind][row] for kind in kinds]
        ratio = f"{values[1] / values[0]:11.2f}x" if len(kinds) == 2 and values[0] else ""
        print(f"{row:12}" + "".join(f"{v:12,.0f}" for v in values) + ratio)


if __name__ == "__main__":
    main()
