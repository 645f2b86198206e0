"""A board's windows in memory: paged indexes with a name arena each, or one shared.

A board of ``all``, ``daily``, ``weekly`` and ``monthly`` keeps four
indexes holding (mostly) the same members.  This builds such a board
in-process, each layout in a child process of its own (alternated over
``--rounds``, so both see the same noise), and reports per member of the
board:

* RSS growth once built (``windows`` indexes, every member in each, 19-byte
  names, random integer scores, tie-break ``first``), and the indexes' own
  count (pages, maps, and the arena once if shared);
* the CPU time of the build, per write (a member new to the board takes a
  lookup in each other index when the arena is shared), and of updates of
  existing members;
* a restart: the windows' dumps loaded back (into one arena when shared),
  its RSS growth and time;
* a period retired: the ``daily`` index dropped and a new one filled with a
  tenth of the members, then writes until the arena's compaction is done;
  the RSS growth against the built board;
* then a random half of the members removed from every window, and writes
  to every window until the compaction and the member maps' shrinks are
  done: RSS growth per member left, and the indexes' own count against
  that of the same windows loaded afresh (RSS after removals is as much
  the allocator's as the index's: freed pages lie between live ones).

    PYTHONPATH=src python bench/bench_windows_memory.py --members 1000000 --rounds 3 \
        [--base-src /path/to/older/tree/src]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def trim() -> None:
    import ctypes

    ctypes.CDLL("libc.so.6").malloc_trim(0)


def worker(layout: str, members: int, windows: int, seed: int) -> dict[str, float]:
    from rankd import _pages

    rng = random.Random(seed)
    names = [f"player:{i:012d}" for i in range(members)]  # 19 bytes
    rng.shuffle(names)
    scores = [[rng.randrange(10**9) for _ in range(members)] for _ in range(windows)]
    gc.collect()
    trim()
    base = rss()

    def shared(arena: object | None) -> dict[str, object]:
        # (an arena of each index's own: no keyword, as a tree before sharing takes)
        return {} if arena is None else {"names": arena}

    arena = _pages.Names() if layout == "shared" else None
    indexes = [_pages.RankIndex("desc", "first", **shared(arena)) for _ in range(windows)]
    start = time.process_time()
    for i, member in enumerate(names):  # as the engine writes: a member to every window
        for w in range(windows):
            indexes[w].set(member, scores[w][i])
    build_cpu = time.process_time() - start
    built = rss() - base
    def own_count(made: list) -> int:
        # The indexes' own count of their bytes, the shared arena once.
        parts = [ix._memory() for ix in made]
        held = sum(v for part in parts for k, v in part.items() if k != "names")
        return held + (parts[0]["names"] if layout == "shared"
                       else sum(part["names"] for part in parts))

    own = own_count(indexes)
    touched = rng.sample(names, min(members, 200_000))
    start = time.process_time()
    for member in touched:
        for w in range(windows):
            indexes[w].incr(member, 1)
    update_cpu = time.process_time() - start
    dumps = [ix.dump() for ix in indexes]
    del indexes, arena
    gc.collect()
    trim()
    before_load = rss()
    start = time.perf_counter()
    arena = _pages.Names() if layout == "shared" else None
    indexes = [_pages.RankIndex.load(d, **shared(arena)) for d in dumps]
    load_seconds = time.perf_counter() - start
    restarted = rss() - before_load
    del dumps
    gc.collect()
    # A period retired: the daily index goes, a new one takes a tenth.
    indexes[1] = _pages.RankIndex("desc", "first", **shared(arena))
    gc.collect()
    for member in names[: members // 10]:
        indexes[1].set(member, 1)
    writes = 0
    while arena is not None and arena._state()[3] and writes < 50 * members:
        indexes[0].incr(names[writes % members], 1)
        writes += 1
    trim()
    retired = rss() - base
    # A random half of the members removed from every window (cheaters, a
    # purge), then writes to the rest until the compaction is done.
    gone = rng.sample(names, members // 2)
    for member in gone:
        for index in indexes:
            index.remove(member)
    left = list(set(names) - set(gone))
    # (writes to every window: each moves its own map's shrink a step, and
    # the arena's compaction)
    writes = 0
    while writes < 50 * members and (
            (arena is not None and arena._state()[3])
            or any(index._map_state()[1] for index in indexes)):
        for index in indexes:
            index.incr(left[writes % len(left)], 1)
        writes += 1
    del gone
    gc.collect()
    trim()
    halved = rss() - base - 8 * len(left)  # (less the list of the rest)
    halved_own = own_count(indexes)
    # The same windows loaded afresh (a restart), in the index's own count.
    dumps = [ix.dump() for ix in indexes]
    fresh_arena = _pages.Names() if layout == "shared" else None
    fresh_own = own_count([_pages.RankIndex.load(d, **shared(fresh_arena)) for d in dumps])
    return {"halved": halved / len(left), "halved_own": halved_own / len(left),
            "fresh_own": fresh_own / len(left), "built": built / members, "own": own / members,
            "build_us": build_cpu / (members * windows) * 1e6,
            "update_us": update_cpu / (len(touched) * windows) * 1e6,
            "restarted": restarted / members, "load_s": load_seconds,
            "retired": retired / members, "compaction_writes": writes}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--members", type=int, default=1_000_000)
    parser.add_argument("--windows", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=47)
    parser.add_argument("--base-src", type=Path,
                        help="run the 'own' layout on this tree's sources (a tree before "
                        "the arena was shared), so the CPU columns compare the trees")
    parser.add_argument("--worker", choices=("own", "shared"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.members, args.windows, args.seed)))
        return 0
    runs: dict[str, list[dict[str, float]]] = {"own": [], "shared": []}
    for r in range(args.rounds):
        for layout in (("own", "shared") if r % 2 == 0 else ("shared", "own")):
            env = dict(os.environ)
            if layout == "own" and args.base_src is not None:
                env["PYTHONPATH"] = f"{args.base_src}:{env.get('PYTHONPATH', '')}"
            out = subprocess.run(
                [sys.executable, str(Path(__file__).resolve()), "--worker", layout,
                 "--members", str(args.members), "--windows", str(args.windows),
                 "--seed", str(args.seed + r)],
                check=True, capture_output=True, text=True, env=env).stdout
            runs[layout].append(json.loads(out))
            print(f"round {r + 1} {layout}: {runs[layout][-1]}", file=sys.stderr, flush=True)
    print(f"\n{args.members:,} members in each of {args.windows} windows, 19-byte names, "
          f"random integer scores, tie-break first; medians of {args.rounds} rounds "
          "(B/member of the board)")
    print("| arena | built RSS | own count | build µs/write | update µs/write | "
          "restarted RSS | load s | period retired RSS | half removed: RSS a member left | "
          "own count / loaded afresh |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for layout, results in runs.items():
        med = {k: statistics.median(r[k] for r in results) for k in results[0]}
        print(f"| {layout} | {med['built']:.1f} | {med['own']:.1f} | {med['build_us']:.2f} | "
              f"{med['update_us']:.2f} | {med['restarted']:.1f} | {med['load_s']:.2f} | "
              f"{med['retired']:.1f} | {med['halved']:.1f} | "
              f"{med['halved_own']:.1f} / {med['fresh_own']:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
