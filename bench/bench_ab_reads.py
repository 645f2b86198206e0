#!/usr/bin/env python3
"""Reads of the paged index at two (or more) commits, paired in one process.

Why
---
A change to a lookup moves ``rank`` by a tenth of a microsecond or so, and
this machine's noise between two runs is larger than that: two runs of
``bench_huge.py`` on the same tree differed by 15 % at the median and 2x
at p99.  So each commit's ``_pages.pyx`` is built here as a module of its
own, each loads the same board into the same process, and the boards'
reads alternate round by round on the same random members: whatever the
machine does meanwhile, it does to both.

How
---
For each ``--rev``, ``git archive`` gives that commit's ``src`` tree, and
its ``_pages.pyx`` is compiled as ``_pages_ab<i>`` (with ``-O3``, as
``setup.py`` does; needs a C compiler and Cython, skipped with a reason if
either is missing).  The board is either ``--snapshot``, a dump file that
``bench_huge.py --keep`` wrote (all revisions must read its format), or
built here: ``--members`` members ``"p:%014d"`` with random integer scores
by ``apply_batch``.  Then ``--rounds`` rounds; each draws ``--sample``
random members for each call timed (the same for every board; each call
on members of its own, since members another call just read would be in
cache), and, board by board in an order rotated every round, times each
``rank(m)``, then each ``dense_rank(m)`` (with ``--dense``), each
``score(m)`` and, with ``--absent``, each ``score(m)`` of a member the
board does not hold (``absent``: the probe alone, to its empty slot),
and with ``--ranges`` each ``competition_rank(m)``, ``range_by_rank(r,
10)`` from a random rank and top-10, each call alone with
``time.perf_counter_ns`` (the timer's cost is in every figure).

Output: a line per round and board (p50/p99 in µs), then each revision's
medians over the rounds and their ratio to the first revision's.  At 100M
a board loaded earlier often reads ``rank`` with a far worse p99 than one
loaded later (bench/README.md, issue 47 step 14: likely the later board
pushing the earlier one's towers out of cache; since step 15 ranks read
a count tree, not the towers, and the effect is much smaller), so
compare boards in the same load position: run with the ``--rev`` order swapped, or give a
revision twice, first, as a board to sacrifice (``--rev A --rev A --rev B``).

::

    python bench/bench_ab_reads.py --rev HEAD~1 --rev HEAD --members 10000000
    python bench/bench_ab_reads.py --rev HEAD~1 --rev HEAD \\
        --snapshot /tmp/huge/huge-pages-100000000.dump --members 100000000
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from bench_huge import NAME, SEED, percentiles  # the same board as bench_huge's

ROOT = Path(__file__).resolve().parent.parent
SETUP = """
from setuptools import Extension, setup
from Cython.Build import cythonize
setup(ext_modules=cythonize(
    [Extension({name!r}, [{name!r} + ".pyx"], include_dirs=[{engine!r}],
               extra_compile_args=["-O3"], define_macros=[("NDEBUG", "1")])],
    include_path=[{src!r}], language_level=3, quiet=True),
    script_args=["build_ext", "--inplace"])
"""


def build_module(rev: str, name: str, workdir: Path) -> Path:
    """Compile ``rev``'s ``src/rankd/_pages.pyx`` as module ``name``, in a
    directory of its own under ``workdir`` (each revision with its own
    ``.pxi`` files); return that directory."""
    workdir = workdir / name
    tree = workdir / "tree"
    tree.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src"],
                             check=True, capture_output=True).stdout
    tar_path = workdir / f"{name}.tar"
    tar_path.write_bytes(archive)
    with tarfile.open(tar_path) as tar:
        tar.extractall(tree, filter="data")
    rankd = tree / "src" / "rankd"
    for suffix in (".pyx", ".pxd"):
        shutil.copy(rankd / f"_pages{suffix}", workdir / f"{name}{suffix}")
    for pxi in rankd.glob("*.pxi"):
        shutil.copy(pxi, workdir / pxi.name)
    (workdir / f"setup_{name}.py").write_text(
        SETUP.format(name=name, engine=str(rankd / "engine"), src=str(tree / "src")))
    built = subprocess.run([sys.executable, f"setup_{name}.py"], cwd=workdir,
                           capture_output=True, text=True)
    if built.returncode != 0:  # (the compiler's warnings are shown only then)
        sys.exit(f"building {rev} failed:\n{built.stdout}{built.stderr}")
    return workdir


def board(cls: type, args: argparse.Namespace):
    """The board to read: the snapshot loaded, or ``--members`` set by batches."""
    if args.snapshot:
        def pieces():
            with open(args.snapshot, "rb", buffering=0) as f:
                while piece := f.read(1 << 20):
                    yield piece

        return cls.load_chunks(pieces(), os.path.getsize(args.snapshot))
    from rankd.index import Op

    index = cls("desc", "first")
    rng = random.Random(SEED)
    for start in range(0, args.members, 100_000):
        stop = min(start + 100_000, args.members)
        index.apply_batch([(Op.SET, NAME % i, rng.randrange(10**9)) for i in range(start, stop)])
    return index


def timings(call, arguments: list) -> list[int]:
    """Nanoseconds of ``call(a)`` for each argument, each call timed alone."""
    clock = time.perf_counter_ns
    took = []
    gc.disable()
    for argument in arguments:
        t0 = clock()
        call(argument)
        took.append(clock() - t0)
    gc.enable()
    return took


def timed(call, names: list[str]) -> tuple[float, float]:
    """p50 and p99 (µs) of ``call(name)`` for each name, each call timed alone."""
    figures = percentiles(timings(call, names))
    return figures["p50_us"], figures["p99_us"]


def read_call(index, op: str):
    """The call timed for ``op``, of one argument."""
    if op == "absent":
        return index.score
    if op == "range_by_rank":
        return lambda offset: index.range_by_rank(offset, 10)
    if op == "top10":
        return lambda _: index.range_by_rank(0, 10)
    return getattr(index, op)


def cannot_build() -> str:
    """Why ``build_module`` cannot run here, or ``""``."""
    if shutil.which(os.environ.get("CC", "cc")) is None:
        return "no C compiler"
    try:
        import Cython  # noqa: F401
    except ImportError:
        return "Cython is not installed"
    return ""


def revision_boards(revs: list[str], args: argparse.Namespace, workdir: Path) -> dict:
    """Each revision's module built in ``workdir`` and its board (``board``),
    by label: the revision, or ``rev#i`` for one given twice (a control:
    each copy its own board)."""
    sys.path.insert(0, str(ROOT / "src"))
    names = [f"_pages_ab{i}" for i in range(len(revs))]
    labels = [rev if revs.count(rev) == 1 else f"{rev}#{i}" for i, rev in enumerate(revs)]
    for rev, name in zip(revs, names, strict=True):
        sys.path.insert(0, str(build_module(rev, name, workdir)))
    boards = {}
    for label, name in zip(labels, names, strict=True):
        started = time.perf_counter()
        boards[label] = board(importlib.import_module(name).RankIndex, args)
        print(f"{label}: {len(boards[label]):,} members in "
              f"{time.perf_counter() - started:.1f} s", flush=True)
    return boards


def paired_boards(p: argparse.ArgumentParser, args: argparse.Namespace) -> dict | None:
    """``revision_boards`` of ``args.rev`` (two or more), or ``None`` when
    the modules cannot be built here (the reason printed)."""
    if len(args.rev) < 2:
        p.error("give --rev at least twice")
    why = cannot_build()
    if why:
        print(f"skipped: {why}")
        return None
    with tempfile.TemporaryDirectory(prefix="rankd-ab-") as tmp:
        return revision_boards(args.rev, args, Path(tmp))


def paired_arguments(description: str, sample: int) -> argparse.ArgumentParser:
    """The arguments every paired benchmark takes (``--rev`` and the board)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--rev", action="append", required=True, help="a commit (give two or more)")
    p.add_argument("--members", type=int, default=1_000_000)
    p.add_argument("--snapshot", help="a dump file to load instead of building")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--sample", type=int, default=sample)
    return p


def print_medians(figures: dict[str, dict[str, list[float]]], show) -> dict:
    """Each label's medians over the rounds (``show(value)`` as printed) and
    their ratio to the first label's; return the medians."""
    medians = {label: {k: statistics.median(v) for k, v in f.items()}
               for label, f in figures.items()}
    base = next(iter(medians.values()))
    for label, m in medians.items():
        print(f"median {label:>12}  " + "  ".join(
            f"{k} {show(v)} ({v / base[k]:.2f}x)" for k, v in m.items()))
    return medians


def main() -> int:
    p = paired_arguments(__doc__.split("\n")[0], 100_000)
    p.add_argument("--dense", action="store_true", help="time dense_rank too")
    p.add_argument("--absent", action="store_true", help="time score of absent members too")
    p.add_argument("--ranges", action="store_true",
                   help="time competition_rank, range_by_rank(r, 10) and top-10 too")
    p.add_argument("--json", action="store_true", help="print the medians as JSON at the end")
    args = p.parse_args()
    boards = paired_boards(p, args)
    if boards is None:
        return 0
    labels = list(boards)
    ops = (("rank",) + ("dense_rank",) * args.dense + ("score",) + ("absent",) * args.absent
           + ("competition_rank", "range_by_rank", "top10") * args.ranges)
    figures: dict[str, dict[str, list[float]]] = {
        label: {f"{op}_{q}": [] for op in ops for q in ("p50", "p99")} for label in labels}
    size = len(next(iter(boards.values())))
    for r in range(args.rounds):
        rng = random.Random(1000 + r)
        # A sample of its own for each call (the same for every
        # board): a call timed on members another just read would
        # find their lines in cache.
        samples = {op: [NAME % rng.randrange(size) for _ in range(args.sample)]
                   for op in ops}
        if args.absent:  # (names past the board's last: "p:%014d" of size and up)
            samples["absent"] = [NAME % rng.randrange(size, 2 * size)
                                 for _ in range(args.sample)]
        if args.ranges:  # (offsets, not names: 10 members from a random rank)
            samples["range_by_rank"] = samples["top10"] = [
                rng.randrange(size - 10) for _ in range(args.sample)]
        order = labels[r % len(labels):] + labels[:r % len(labels)]
        for rev in order:
            line = []
            for op in ops:
                p50, p99 = timed(read_call(boards[rev], op), samples[op])
                figures[rev][f"{op}_p50"].append(p50)
                figures[rev][f"{op}_p99"].append(p99)
                line.append(f"{op} {p50:.2f}/{p99:.2f}")
            print(f"round {r}: {rev:>12}  " + "  ".join(line), flush=True)
    medians = print_medians(figures, lambda v: f"{v:.2f}")
    if args.json:
        print(json.dumps(medians))
    return 0


if __name__ == "__main__":
    sys.exit(main())
