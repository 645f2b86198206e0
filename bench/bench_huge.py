#!/usr/bin/env python3
"""A board of 100 million members on one node: build, snapshot, restart, read.

What it measures
----------------
One board of N members named ``"p:%014d"`` (16 bytes), integer scores drawn
with ``random.Random(47)`` in 0..10^9, order ``desc``, tie-break ``first``,
on one index kind (``--index pages``, the default, or ``skiplist``):

1. **build** (a child process): ``apply_batch`` of ``(Op.SET, member,
   score)`` in batches of ``--batch`` (each batch's names made just before
   its call and dropped after it); seconds, and ``VmRSS``/``VmHWM`` after;
2. **snapshot**: the index written to a file with ``dump_chunks`` (pieces of
   ``--piece`` bytes, each written and dropped before the next is made, as
   the daemon's snapshots do); seconds, file size, ``VmHWM`` during (reset
   first through ``/proc/self/clear_refs``);
3. **restart** (a new child process): ``load_chunks`` of the file read in
   ``--piece``-byte windows; seconds, ``VmRSS`` and ``VmHWM``;
4. **reads**, in the built and in the restarted process: ``rank(m)`` of
   ``--sample`` random members and ``range_by_rank(0, 100)`` (top-100) as
   many times, each call timed alone with ``time.perf_counter_ns`` (the
   timer's own cost, about 50-100 ns here, is in every figure); p50/p99/max.
   ``dense_rank(m)`` and ``score(m)`` are timed too, each on random members
   of its own (on the members ``rank`` just read they would find them in
   cache, as they did before 2026-12-03's step 15):
   ``score`` finds the member's entry as ``rank`` does (map slot, page,
   name) and stops there, so ``rank`` less ``score`` is what counting the
   entries before it costs.

RSS figures are the process's whole resident set (the interpreter, about
10 MiB, included).  The snapshot file goes to ``--dir`` (default a fresh
temporary directory, removed at the end unless ``--keep``).

How to run
----------
::

    python bench/bench_huge.py --members 1000000            # a minute
    python bench/bench_huge.py                              # 100M: several minutes, ~5 GB
    python bench/bench_huge.py --index skiplist --members 20000000

Each phase prints one line; ``--json`` prints the figures as one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NAME = "p:%014d"
SEED = 47


def status() -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` of this process, in bytes."""
    found = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                found[key] = int(value.split()[0]) * 1024
    return found


def reset_peak() -> None:
    """Reset ``VmHWM`` to the current RSS."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def percentiles(samples: list[int]) -> dict[str, float]:
    """p50/p99/max of ``samples`` (ns), in µs."""
    samples.sort()
    n = len(samples)
    return {"p50_us": samples[n // 2] / 1000, "p99_us": samples[min(n - 1, n * 99 // 100)] / 1000,
            "max_us": samples[-1] / 1000}


def reads(index, members: int, sample: int) -> dict[str, dict[str, float]]:
    """Per-call ``rank``, ``dense_rank``, ``score`` and top-100 timings,
    each call over ``sample`` random members of its own (members another
    call just read would be in cache)."""
    rng = random.Random(SEED + 1)
    names, dense_names, score_names = (
        [NAME % rng.randrange(members) for _ in range(sample)] for _ in range(3))
    clock = time.perf_counter_ns
    rank = index.rank
    dense_rank = index.dense_rank
    score = index.score
    top = index.range_by_rank
    rank_ns, dense_ns, score_ns, top_ns = [], [], [], []
    gc.disable()
    for name in names:
        t0 = clock()
        rank(name)
        t1 = clock()
        rank_ns.append(t1 - t0)
    for name in dense_names:
        t0 = clock()
        dense_rank(name)
        t1 = clock()
        dense_ns.append(t1 - t0)
    for name in score_names:
        t0 = clock()
        score(name)
        t1 = clock()
        score_ns.append(t1 - t0)
    for _ in range(sample):
        t0 = clock()
        top(0, 100)
        t1 = clock()
        top_ns.append(t1 - t0)
    gc.enable()
    return {"rank": percentiles(rank_ns), "dense_rank": percentiles(dense_ns),
            "score": percentiles(score_ns),
            "top100": percentiles(top_ns)}


def index_class(kind: str) -> type:
    from rankd.index.kinds import index_class as of_kind

    return of_kind(kind)


def build(args: argparse.Namespace) -> dict:
    """The build-and-snapshot child: figures of phases 1, 2 and 4."""
    from rankd.index import Op

    cls = index_class(args.index)
    index = cls("desc", "first")
    rng = random.Random(SEED)
    base = status()["VmRSS"]
    started = time.perf_counter()
    for start in range(0, args.members, args.batch):
        stop = min(start + args.batch, args.members)
        ops = [(Op.SET, NAME % i, rng.randrange(10**9)) for i in range(start, stop)]
        index.apply_batch(ops)
        del ops
    built_s = time.perf_counter() - started
    gc.collect()
    after = status()
    out = {"members": args.members, "index": args.index, "build_s": built_s,
           "rss_before_bytes": base, "rss_built_bytes": after["VmRSS"],
           "hwm_build_bytes": after["VmHWM"],
           "index_bytes_per_member": (after["VmRSS"] - base) / args.members}
    print(f"build: {args.members:,} members in {built_s:.1f} s; "
          f"RSS {after['VmRSS'] / 2**30:.2f} GiB ({out['index_bytes_per_member']:.1f} "
          f"B/member), peak {after['VmHWM'] / 2**30:.2f} GiB",
          flush=True)
    out["reads_built"] = reads(index, args.members, args.sample)
    print(f"reads (built): {json.dumps(out['reads_built'])}", flush=True)
    reset_peak()
    live = status()["VmRSS"]
    started = time.perf_counter()
    chunks = index.dump_chunks(args.piece)
    with open(args.file, "wb") as f:
        for piece in chunks:
            f.write(piece)
        f.flush()
        os.fsync(f.fileno())
    out["snapshot_s"] = time.perf_counter() - started
    out["snapshot_bytes"] = chunks.size
    out["hwm_snapshot_over_live"] = status()["VmHWM"] / live
    print(f"snapshot: {chunks.size / 2**30:.2f} GiB in {out['snapshot_s']:.1f} s; peak "
          f"{out['hwm_snapshot_over_live']:.3f}x live", flush=True)
    return out


def restart(args: argparse.Namespace) -> dict:
    """The restarted child: figures of phases 3 and 4."""
    cls = index_class(args.index)
    base = status()["VmRSS"]

    def pieces():
        with open(args.file, "rb", buffering=0) as f:
            while piece := f.read(args.piece):
                yield piece

    started = time.perf_counter()
    index = cls.load_chunks(pieces(), os.path.getsize(args.file))
    loaded_s = time.perf_counter() - started
    gc.collect()
    after = status()
    out = {"restart_s": loaded_s, "rss_restarted_bytes": after["VmRSS"],
           "hwm_restart_bytes": after["VmHWM"], "rss_restart_base_bytes": base,
           "length": len(index)}
    print(f"restart: {len(index):,} members loaded in {loaded_s:.1f} s; RSS "
          f"{after['VmRSS'] / 2**30:.2f} GiB, peak {after['VmHWM'] / 2**30:.2f} GiB", flush=True)
    out["reads_restarted"] = reads(index, args.members, args.sample)
    print(f"reads (restarted): {json.dumps(out['reads_restarted'])}", flush=True)
    return out


def child(args: argparse.Namespace, phase: str) -> dict:
    """Run ``phase`` in a fresh interpreter; its JSON figures."""
    command = [sys.executable, __file__, "--worker", phase, "--members", str(args.members),
               "--index", args.index, "--batch", str(args.batch), "--piece", str(args.piece),
               "--sample", str(args.sample), "--file", str(args.file)]
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=True,
                          timeout=args.timeout)
    lines = done.stdout.splitlines()
    for line in lines[:-1]:
        print(line, flush=True)
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--members", type=int, default=100_000_000)
    parser.add_argument("--index", choices=("pages", "skiplist"), default="pages")
    parser.add_argument("--batch", type=int, default=100_000, help="ops per apply_batch")
    parser.add_argument("--piece", type=int, default=4 << 20, help="snapshot piece bytes")
    parser.add_argument("--sample", type=int, default=100_000, help="timed reads of each kind")
    parser.add_argument("--dir", type=Path, help="where the snapshot file goes")
    parser.add_argument("--keep", action="store_true", help="keep the snapshot file")
    parser.add_argument("--reuse", action="store_true",
                        help="with --dir: restart from a snapshot file a --keep run left there, "
                             "skipping the build")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per phase")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", choices=("build", "restart"), help=argparse.SUPPRESS)
    parser.add_argument("--file", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        figures = build(args) if args.worker == "build" else restart(args)
        print(json.dumps(figures), flush=True)
        return
    directory = args.dir or Path(tempfile.mkdtemp(prefix="bench_huge-"))
    directory.mkdir(parents=True, exist_ok=True)
    args.file = directory / f"huge-{args.index}-{args.members}.dump"
    try:
        if args.reuse and args.file.exists():
            figures = {"members": args.members, "index": args.index, "reused": str(args.file)}
            print(f"build: skipped, reusing {args.file}", flush=True)
        else:
            figures = child(args, "build")
        figures.update(child(args, "restart"))
    finally:
        if not args.keep:
            args.file.unlink(missing_ok=True)
            if args.dir is None:
                shutil.rmtree(directory, ignore_errors=True)
    if "rss_built_bytes" not in figures:
        print(json.dumps(figures, indent=1) if args.json else "restart only: no build figures")
        return
    figures["restart_over_built_rss"] = figures["rss_restarted_bytes"] / figures["rss_built_bytes"]
    figures["hwm_restart_over_restarted"] = (figures["hwm_restart_bytes"]
                                             / figures["rss_restarted_bytes"])
    if args.json:
        print(json.dumps(figures, indent=1))
    else:
        print(f"restarted RSS / built RSS {figures['restart_over_built_rss']:.3f}; restart peak / "
              f"restarted RSS {figures['hwm_restart_over_restarted']:.3f}")


if __name__ == "__main__":
    main()
