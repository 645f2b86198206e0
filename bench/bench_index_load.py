"""A rank index's ``load()`` from its dump, paired against another checkout.

A board's dump (``--members`` members, default 1,000,000, named
``player:<i>``, integer scores drawn with ``random.Random(42)``) of the
kind ``--kind`` (``pages``, the default, or ``skiplist``) is written once;
then, over ``--rounds`` rounds (default 5), a fresh interpreter per side
loads it ``--loads`` times (default 3): this checkout's sources and, with
``--base-src DIR``, another's (built), their order alternated from round to
round so that machine noise hits both alike.  ``--piece BYTES`` loads it
with ``load_chunks`` in pieces of that size instead (a snapshot read in
windows).  Per side: the median wall and CPU time (the loading thread's)
of a load, per load and per member; with a base, the median over rounds
of each round's branch / base ratio.  Every side checks once that the
loaded index dumps to the same bytes.  In-process: no daemon.

::

    python bench/bench_index_load.py --base-src ../wt-base/src
    python bench/bench_index_load.py --kind skiplist --piece 4194304 --base-src ../wt-base/src
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"


def worker(kind: str, path: str, loads: int, piece: int) -> dict[str, object]:
    """Load the dump at ``path`` ``loads`` times; the wall and CPU seconds of each."""
    from rankd.index.kinds import index_class

    cls = index_class(kind)
    data = Path(path).read_bytes()

    def load():
        if piece:
            return cls.load_chunks((data[at:at + piece] for at in range(0, len(data), piece)),
                                   len(data))
        return cls.load(data)

    if load().dump() != data:
        raise RuntimeError("the loaded index dumps to other bytes")
    walls, cpus = [], []
    for _ in range(loads):
        began, began_cpu = time.perf_counter(), time.thread_time()
        index = load()
        cpus.append(time.thread_time() - began_cpu)
        walls.append(time.perf_counter() - began)
        del index
    return {"module": cls.__module__, "wall": walls, "cpu": cpus}


def run_side(src: Path, args: argparse.Namespace, path: str) -> dict[str, object]:
    """One fresh interpreter loading from ``src``'s sources."""
    env = dict(os.environ, PYTHONPATH=str(src.resolve()))
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--kind", args.kind,
           "--dump", path, "--loads", str(args.loads), "--piece", str(args.piece)]
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def write_dump(kind: str, members: int, path: str) -> int:
    """The board's dump written at ``path``; its size."""
    from rankd.index.kinds import index_class

    rng = random.Random(42)
    index = index_class(kind)("desc")
    for i in range(members):
        index.set(f"player:{i}", float(rng.randrange(1_000_000)))
    data = index.dump()
    Path(path).write_bytes(data)
    return len(data)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=("pages", "skiplist"), default="pages")
    parser.add_argument("--members", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--loads", type=int, default=3)
    parser.add_argument("--piece", type=int, default=0,
                        help="load_chunks in pieces of this many bytes (0: load)")
    parser.add_argument("--base-src", type=Path, default=None,
                        help="also load with this src dir (another checkout, built)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dump", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if min(args.members, args.rounds, args.loads) < 1 or args.piece < 0:
        parser.error("sizes must be positive")
    if args.worker:
        print(json.dumps(worker(args.kind, args.dump, args.loads, args.piece)))
        return 0
    sys.path.insert(0, str(SRC))
    sides = [("branch", SRC)] + ([("base", args.base_src)] if args.base_src else [])
    runs: dict[str, list[dict[str, object]]] = {name: [] for name, _ in sides}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "board.dump")
        size = write_dump(args.kind, args.members, path)
        how = f"load_chunks of {args.piece}-byte pieces" if args.piece else "load"
        print(f"{args.kind} index, {args.members:,} members, dump of {size:,} bytes; {how}; "
              f"{args.rounds} rounds x {args.loads} loads per side")
        for r in range(args.rounds):
            for name, src in sides if r % 2 == 0 else sides[::-1]:
                runs[name].append(run_side(src, args, path))
    medians: dict[str, dict[str, list[float]]] = {}
    for name, src in sides:
        per_round = {k: [statistics.median(run[k]) for run in runs[name]] for k in ("wall", "cpu")}
        medians[name] = per_round
        wall, cpu = (statistics.median(per_round[k]) for k in ("wall", "cpu"))
        print(f"  {name} ({src}): median load {wall * 1e3:.1f} ms wall, {cpu * 1e3:.1f} ms CPU "
              f"({cpu / args.members * 1e9:.0f} ns CPU a member); CPU per round (ms): "
              + ", ".join(f"{c * 1e3:.1f}" for c in per_round["cpu"]))
    if args.base_src:
        for k in ("wall", "cpu"):
            ratios = [b / a for a, b in zip(medians["base"][k], medians["branch"][k], strict=True)]
            print(f"  branch / base {k}: median {statistics.median(ratios):.3f} "
                  f"(rounds: {', '.join(f'{x:.3f}' for x in ratios)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
