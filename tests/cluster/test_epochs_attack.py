"""Attacks on the cluster's log in Postgres (``rankd.cluster.log``): where
each epoch began (``rankd_epochs``), uncompressed storage, and large snapshot
sections streamed by binary COPY.  Each test is named for the defect it
found, in a real Postgres."""

from __future__ import annotations

import asyncio

import asyncpg

from rankd.cluster.log import SNAPSHOT_PIECE, ClusterLog, migrate


async def _open(dsn: str, lease: float = 5.0) -> ClusterLog:
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=8)
    async with pool.acquire() as conn:
        await migrate(conn)
    return ClusterLog(pool, lease_seconds=lease)


def test_two_stores_of_one_snapshot_racing_do_not_fail_on_a_copied_section(pg_dsn):
    """Two stores of the same group's snapshot at the same position (a
    deposed primary's and its successor's, or a retry) whose first section
    is streamed by COPY: both pass the "already stored?" check before
    either commits, and the second's COPY then hit the first's row.  With
    ``ON CONFLICT DO NOTHING`` it waited and stored nothing; the COPY raised
    a unique violation out of ``store_snapshot`` instead of an answer."""
    async def scenario() -> None:
        store = await _open(pg_dsn)
        blocker = await asyncpg.connect(pg_dsn)
        try:
            lease = await store.take(7, "a")
            await store.append(lease, 1, [b"x"])
            large = bytes(range(256)) * (SNAPSHOT_PIECE // 256 + 10)
            sections = [large, b"tail"]
            # The register held elsewhere: the first store waits after its
            # sections went in (uncommitted), so the second's check finds none.
            held = blocker.transaction()
            await held.start()
            await blocker.execute("SELECT 1 FROM rankd_groups WHERE group_id = 7 FOR UPDATE")
            first = asyncio.ensure_future(store.store_snapshot(lease, 1, lease.epoch, sections))
            await asyncio.sleep(0.5)
            second = asyncio.ensure_future(store.store_snapshot(lease, 1, lease.epoch,
                                                                sections))
            await asyncio.sleep(0.5)
            await held.rollback()
            answers = await asyncio.wait_for(
                asyncio.gather(first, second, return_exceptions=True), 10)
            assert answers == [True, True]
            assert (await store.snapshot(7))[2] == sections
        finally:
            await blocker.close()
            await store.pool.close()

    asyncio.run(scenario())
