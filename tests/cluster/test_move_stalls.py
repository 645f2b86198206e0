"""What held a move's target's event loop while it loaded the group (issue 49).

Each test times the loop's thread (a task that sleeps 1 ms and notes how
late it wakes) around one step of a move that used to hold it.
"""

from __future__ import annotations

import asyncio
import os
import time

import asyncpg

from rankd.cluster import log as cluster_log
from rankd.cluster.log import ClusterLog, migrate

#: A loop step longer than this fails (the watchdog reports 100 ms; the
#: steps bounded here take a few ms on a quiet machine).
HOLD_BOUND = 0.025


async def longest_hold(work):
    """``work()``'s result, and the longest the loop went without running
    a 1 ms ticker meanwhile."""
    done = asyncio.Event()
    longest = 0.0

    async def tick() -> None:
        nonlocal longest
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            longest, last = max(longest, now - last), now

    ticker = asyncio.ensure_future(tick())
    await asyncio.sleep(0.01)
    try:
        result = await work()
    finally:
        done.set()
        await ticker
    return result, longest


def test_a_large_snapshot_section_is_read_from_postgres_in_pieces(pg_dsn: str) -> None:
    """A board's index section (tens of MB) came back as one row, which
    asyncpg parses in one loop step: 40-130 ms.  Read in pieces of
    SNAPSHOT_PIECE, the sections come back the same, the loop never held
    for long."""
    big = os.urandom(48 << 20)
    sections = [b"", os.urandom(100), big, os.urandom(cluster_log.SNAPSHOT_PIECE),
                os.urandom(cluster_log.SNAPSHOT_PIECE + 1)]

    async def run() -> None:
        pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=2)
        try:
            async with pool.acquire() as conn:
                await migrate(conn)
                for part, data in enumerate(sections):
                    await conn.execute(
                        "INSERT INTO rankd_group_snapshots (group_id, seq, epoch, part, "
                        "parts, data) VALUES (7, 40, 3, $1, $2, $3)", part, len(sections), data)
            store = ClusterLog(pool)
            assert await store.snapshot(8) is None
            holds = []
            for _ in range(2):  # the first read warms Postgres's cache
                snapshot, hold = await longest_hold(lambda: store.snapshot(7))
                assert snapshot == (40, 3, sections)
                holds.append(hold)
            assert min(holds) < HOLD_BOUND, holds
        finally:
            await pool.close()

    asyncio.run(run())
