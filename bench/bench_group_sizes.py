"""What the planner's reading of the groups' sizes costs Postgres (rankd.cluster.disk_fit).

A throwaway Postgres (or ``--dsn``): ``--groups`` groups, each with a
snapshot of four 64 KiB sections and ``--batches`` log batches of 1 KiB
(half of them before the snapshot, as the log keeps one snapshot interval).
Timed: the planner's first reading (every group's log after its
snapshot), then readings after one more batch a group (only the new
batches are read: one probe of the log's key a group), and one group's
size (``rankd cluster move``'s check).

    python bench/bench_group_sizes.py                       # 1,024 groups x 1,000 batches
    python bench/bench_group_sizes.py --batches 100         # quick
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import asyncpg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from rankd.cluster.disk_fit import GroupSizes, group_size  # noqa: E402
from rankd.cluster.log import migrate  # noqa: E402


async def run(dsn: str, groups: int, batches: int, rounds: int) -> None:
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    try:
        async with pool.acquire() as conn:
            await migrate(conn)
            await conn.execute("""
                INSERT INTO rankd_group_snapshots (group_id, seq, epoch, part, parts, data)
                SELECT g, $2::bigint, 1, p, 4, convert_to(repeat('s', 65536), 'UTF8')
                  FROM generate_series(0, $1 - 1) g, generate_series(0, 3) p""",
                               groups, batches // 2)
            await conn.execute("""
                INSERT INTO rankd_log (group_id, first_seq, last_seq, epoch, records)
                SELECT g, s, s, 1, convert_to(repeat('r', 1024), 'UTF8')
                  FROM generate_series(0, $1 - 1) g, generate_series(1, $2) s""",
                               groups, batches)
            await conn.execute("""
                INSERT INTO rankd_groups (group_id, epoch, holder, last_seq)
                SELECT g, 1, 'a', $2 FROM generate_series(0, $1 - 1) g""", groups, batches)
            await conn.execute("ANALYZE")
        reader = GroupSizes(pool, every=0.0)
        started = time.perf_counter()
        sizes = await reader.sizes(0.0)
        first = time.perf_counter() - started
        again = []
        for n in range(rounds):
            async with pool.acquire() as conn:
                await conn.execute("""
                    INSERT INTO rankd_log (group_id, first_seq, last_seq, epoch, records)
                    SELECT g, $2::bigint, $2::bigint, 1, convert_to(repeat('r', 1024), 'UTF8')
                      FROM generate_series(0, $1 - 1) g""", groups, batches + 1 + n)
            started = time.perf_counter()
            sizes = await reader.sizes(1.0 + n)
            again.append(time.perf_counter() - started)
        one = []
        for group in range(0, groups, max(1, groups // 8)):
            started = time.perf_counter()
            assert await group_size(pool, group) == sizes[group]
            one.append(time.perf_counter() - started)
    finally:
        await pool.close()
    print(f"{groups:,} groups x {batches:,} batches of 1 KiB (snapshot 256 KiB each at "
          f"{batches // 2}), a group's size {sizes[0]:,} B: first reading "
          f"{first * 1000:.0f} ms; after one batch a group: median "
          f"{statistics.median(again) * 1000:.0f} ms, max {max(again) * 1000:.0f} ms "
          f"({rounds} readings); one group: median {statistics.median(one) * 1000:.1f} ms, "
          f"max {max(one) * 1000:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", help="an empty database (default: a throwaway cluster)")
    parser.add_argument("--groups", type=int, default=1024)
    parser.add_argument("--batches", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    from pgcluster import database

    with database(args.dsn) as dsn:
        asyncio.run(run(dsn, args.groups, args.batches, args.rounds))


if __name__ == "__main__":
    main()
