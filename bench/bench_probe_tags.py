#!/usr/bin/env python3
"""How many slots of its own tag a lookup in the paged index's member map passes.

The member map (``_pages.pyx``, Members) is linear probing over 32-bit
codes that carry 4 bits of the member's hash.  A probe skips another
member's slot on its tag 15 times in 16; a slot whose tag matches is
resolved in full (page-table entry, page, name: three dependent misses on
a big board) before the probe goes on.  This simulates the map at a given
fill (random homes, random tags, members inserted in random order, as a
build by random names makes them) and reports, for random present members,
how many slots of their tag the probe passes before their own: the share
of lookups that pay those misses.  Pure Python; a second or so a 2^18-slot
table.

::

    python bench/bench_probe_tags.py                # 3/4 full: a 100M board's map
    python bench/bench_probe_tags.py --fill 0.6 --slots 1048576
"""

from __future__ import annotations

import argparse
import collections
import json
import random


def passed_tags(slots: int, fill: float, sample: int, seed: int) -> dict[int, float]:
    """Share of ``sample`` random present members by slots of their tag passed."""
    rng = random.Random(seed)
    table: list[int | None] = [None] * slots  # the tag of the member in each slot
    placed = []  # (home, tag, slot) per member
    for _ in range(int(slots * fill)):
        home, tag = rng.randrange(slots), rng.randrange(16)
        i = home
        while table[i] is not None:
            i = i + 1 if i + 1 < slots else 0
        table[i] = tag
        placed.append((home, tag, i))
    counts: collections.Counter[int] = collections.Counter()
    for home, tag, own in rng.sample(placed, min(sample, len(placed))):
        i, same = home, 0
        while i != own:
            same += table[i] == tag
            i = i + 1 if i + 1 < slots else 0
        counts[same] += 1
    total = sum(counts.values())
    return {k: counts[k] / total for k in sorted(counts)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--slots", type=int, default=1 << 18)
    p.add_argument("--fill", type=float, default=0.745,
                   help="members / slots (the map grows past 3/4)")
    p.add_argument("--sample", type=int, default=100_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    shares = passed_tags(args.slots, args.fill, args.sample, args.seed)
    if args.json:
        print(json.dumps(shares))
        return
    print(f"{args.slots:,} slots, {args.fill:.3f} full: slots of the member's tag passed")
    for k, share in shares.items():
        print(f"  {k}: {100 * share:6.2f} %")
    print(f"  one or more: {100 * (1 - shares.get(0, 0.0)):.2f} %")


if __name__ == "__main__":
    main()
