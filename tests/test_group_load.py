"""The planner's group weights read from a real Postgres
(rankd.cluster.load): memory from a group's newest snapshot and the log
after it, writes from its register's advance between two readings."""

from __future__ import annotations

import asyncio
import os

import asyncpg
import pytest

from rankd.cluster.load import GroupLoad, weigh
from rankd.cluster.log import ClusterLog, migrate


def test_weights_average_one_and_fall_back_to_count() -> None:
    assert weigh({}, {}) == {}
    assert weigh({1: 0.0, 2: 0.0}, {}) == {1: 1.0, 2: 1.0}  # no data: by count
    both = weigh({1: 300.0, 2: 100.0}, {1: 0.0, 2: 40.0})
    assert both == pytest.approx({1: 0.5 * 1.5 + 0.5 * 0.0, 2: 0.5 * 0.5 + 0.5 * 2.0})
    assert sum(both.values()) == pytest.approx(len(both))


def test_a_group_weighs_its_snapshot_its_log_and_its_write_rate(pg_dsn: str) -> None:
    async def scenario() -> None:
        pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=4)
        try:
            async with pool.acquire() as conn:
                await migrate(conn)
            log = ClusterLog(pool, lease_seconds=5.0)
            big, small, idle = await log.take(1, "a"), await log.take(2, "a"), \
                await log.take(3, "a")
            # The big group: a snapshot of ~200 kB (incompressible), then more log.
            seq = await log.append(big, 1, [bytes(range(256)) * 4] * 10)
            assert await log.store_snapshot(big, seq, big.epoch, [os.urandom(200_000)])
            await log.append(big, seq + 1, [os.urandom(1000)])
            await log.append(small, 1, [os.urandom(1000)])
            load = GroupLoad(pool, every=0.0)
            first = await load.weights(now=100.0)
            assert first[1] > first[2] and first[1] > first[3], first
            assert sum(first.values()) == pytest.approx(3.0)
            # Writes: group 2 advances by 50 records in 10 s, the others not.
            await log.append(small, 2, [b"x"] * 50)
            second = await load.weights(now=110.0)
            assert second[2] > first[2] and second[3] < first[3], (first, second)
            # Read again within ``every``: the same weights, no query.
            again = GroupLoad(pool, every=3600.0)
            kept = await again.weights(now=0.0)
            await log.append(idle, 1, [os.urandom(300_000)])
            assert await again.weights(now=1.0) is kept
        finally:
            await pool.close()

    asyncio.run(scenario())
