#!/usr/bin/env python3
"""Where a big board's slowest lookups come from: false tag matches, or the chain.

Why
---
Issue 47 asks for a 100M board's ``rank`` p99 at 2 µs or less.  A lookup
of the paged index is a chain of dependent reads: the member map's slot,
the page-table entry, the page, the name.  Its p99 is set by two things
this script tells apart:

* **false tag matches.**  A probe passes other members' slots and skips
  them on a 4-bit tag; one whose tag matches is resolved in full (page
  and name) before the probe goes on.  Each lookup is sorted by how many
  slots of its tag it read (1: its own only) with
  ``RankIndex._probe_info``, and each group's share of the calls, its
  p50/p99 and its share of the slowest 1 % are printed.
* **the chain itself.**  The same timing loop over a C function that
  makes ``k`` dependent random reads in a buffer of ``--floor-gib`` on
  2 MiB pages, for ``k`` of 2 to 5: what ``k`` misses cost on this
  machine, timer and call included.  A lookup with no false match is
  near the chain of its misses; no layout does better than its chain.

How
---
The board is a ``--snapshot`` (a dump that ``bench_huge.py --keep``
wrote) or ``--members`` members ``"p:%014d"`` built by batches, as in
``bench_huge.py``.  Each of ``--rounds`` rounds times ``score`` and
``rank`` on ``--sample`` random members of their own, each call alone
with ``time.perf_counter_ns``, then the chases; medians over rounds are
printed.  The chase module is compiled here (needs a C compiler and
Cython; without them that part is skipped with a reason).

::

    python bench/bench_lookup_tail.py --members 1000000
    python bench/bench_lookup_tail.py --snapshot /tmp/huge/huge-pages-100000000.dump
"""

from __future__ import annotations

import argparse
import importlib
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_ab_reads import board, timings  # the same board as bench_ab_reads's
from bench_huge import NAME

ROOT = Path(__file__).resolve().parent.parent

CHASE = """
# cython: language_level=3, boundscheck=False, wraparound=False
from libc.stdint cimport uint64_t
cdef extern from "sys/mman.h":
    void *mmap(void *, size_t, int, int, int, long)
    int madvise(void *, size_t, int)
    int PROT_READ, PROT_WRITE, MAP_PRIVATE, MAP_ANONYMOUS, MADV_HUGEPAGE
cdef uint64_t *words
cdef size_t nwords

def setup(size_t nbytes):
    global words, nwords
    nwords = nbytes // 8
    words = <uint64_t *>mmap(NULL, nbytes, PROT_READ | PROT_WRITE,
                             MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
    madvise(words, nbytes, MADV_HUGEPAGE)
    cdef uint64_t x = 88172645463325252
    cdef size_t i
    for i in range(nwords):
        x ^= x << 13; x ^= x >> 7; x ^= x << 17
        words[i] = x

def chase(uint64_t start, int k):
    cdef uint64_t v = start
    cdef int j
    for j in range(k):  # each read's place comes from the read before
        v = words[(v * 0x9E3779B97F4A7C15u >> 20) % nwords]
    return v
"""

SETUP = """
from setuptools import Extension, setup
from Cython.Build import cythonize
setup(ext_modules=cythonize([Extension("_chase", ["_chase.pyx"],
      extra_compile_args=["-O2"])], quiet=True), script_args=["build_ext", "--inplace"])
"""


def chase_module(workdir: Path):
    """The pointer-chase module, compiled in ``workdir``, or ``None`` with a reason."""
    if shutil.which(os.environ.get("CC", "cc")) is None:
        return None, "no C compiler"
    try:
        import Cython  # noqa: F401
    except ImportError:
        return None, "Cython is not installed"
    (workdir / "_chase.pyx").write_text(CHASE)
    (workdir / "setup_chase.py").write_text(SETUP)
    built = subprocess.run([sys.executable, "setup_chase.py"], cwd=workdir,
                           capture_output=True, text=True)
    if built.returncode != 0:
        return None, f"building the chase failed: {built.stderr[-500:]}"
    sys.path.insert(0, str(workdir))
    return importlib.import_module("_chase"), ""


def quantile(sorted_ns: list[int], q: float) -> float:
    return sorted_ns[min(len(sorted_ns) - 1, int(len(sorted_ns) * q))] / 1000


def by_tagged(took: list[int], tagged: list[int]) -> dict[str, tuple[float, ...]]:
    """Per group of slots of the member's tag read: share of calls %,
    p50 µs, p99 µs, share of the slowest 1 % of all calls %."""
    cut = sorted(took)[int(len(took) * 0.99)]
    groups: dict[str, list[int]] = {}
    for ns, t in zip(took, tagged, strict=True):
        groups.setdefault("3+" if t >= 3 else str(t), []).append(ns)
    out = {}
    for key, ns in groups.items():
        ns.sort()
        slow = sum(1 for x in ns if x >= cut)
        out[key] = (100 * len(ns) / len(took), quantile(ns, 0.5), quantile(ns, 0.99),
                    100 * slow / max(1, sum(1 for x in took if x >= cut)))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--members", type=int, default=1_000_000)
    p.add_argument("--snapshot", help="a dump file to load instead of building")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sample", type=int, default=200_000)
    p.add_argument("--floor-gib", type=float, default=4.0,
                   help="buffer of the pointer chase (about the board's size)")
    args = p.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    from rankd._pages import RankIndex

    index = board(RankIndex, args)
    size = len(index)
    index._probe_info(NAME % 0)  # (finishes a map resize under way: one table)
    print(f"{size:,} members; member map {index._map_state()[0]:,} slots "
          f"({100 * size / index._map_state()[0]:.1f} % full)", flush=True)
    with tempfile.TemporaryDirectory(prefix="rankd-chase-") as tmp:
        chase, why = chase_module(Path(tmp))
        if chase is None:
            print(f"chase skipped: {why}")
        else:
            chase.setup(int(args.floor_gib * (1 << 30)))
        groups: dict[str, dict[str, list[tuple[float, ...]]]] = {"score": {}, "rank": {}}
        overall: dict[str, list[tuple[float, float]]] = {}
        for r in range(args.rounds):
            rng = random.Random(900 + r)
            for op in ("score", "rank"):
                names = [NAME % rng.randrange(size) for _ in range(args.sample)]
                took = timings(getattr(index, op), names)
                tagged = [index._probe_info(name)[1] for name in names]
                ordered = sorted(took)
                overall.setdefault(op, []).append((quantile(ordered, 0.5), quantile(ordered, 0.99)))
                for key, row in by_tagged(took, tagged).items():
                    groups[op].setdefault(key, []).append(row)
            if chase is not None:
                for k in (2, 3, 4, 5):
                    starts = [rng.getrandbits(63) for _ in range(args.sample)]
                    ordered = sorted(timings(lambda s, k=k: chase.chase(s, k), starts))
                    overall.setdefault(f"chase of {k} misses", []).append(
                        (quantile(ordered, 0.5), quantile(ordered, 0.99)))
            print(f"round {r} done", flush=True)
    print("\nmedians over the rounds, µs")
    for name, rows in overall.items():
        print(f"  {name:18} p50 {statistics.median(a for a, _ in rows):5.2f}  "
              f"p99 {statistics.median(b for _, b in rows):5.2f}")
    for op, by in groups.items():
        print(f"\n{op}: slots of the member's tag read   share   p50    p99   of the slowest 1 %")
        for key in sorted(by):
            cols = list(zip(*by[key], strict=True))
            share, p50, p99, slow = (statistics.median(c) for c in cols)
            print(f"  {key:>3} {'(its own only)' if key == '1' else '':31} {share:5.1f} % "
                  f"{p50:5.2f}  {p99:5.2f}   {slow:5.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
