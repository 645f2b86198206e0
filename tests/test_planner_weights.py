"""The planner's group weights read from a real Postgres
(rankd.cluster.load): memory from the members the nodes report per group,
writes from its register's advance between two readings."""

from __future__ import annotations

import asyncio

import pytest

from cluster_tables import cluster_tables
from rankd.cluster.load import GroupLoad, weigh


def test_weights_average_one_and_fall_back_to_count() -> None:
    assert weigh({}, {}) == {}
    assert weigh({1: 0.0, 2: 0.0}, {}) == {1: 1.0, 2: 1.0}  # no data: by count
    both = weigh({1: 300.0, 2: 100.0}, {1: 0.0, 2: 40.0}, members_prior=0, writes_prior=0)
    assert both == pytest.approx({1: 0.5 * 1.5 + 0.5 * 0.0, 2: 0.5 * 0.5 + 0.5 * 2.0})
    assert sum(both.values()) == pytest.approx(len(both))


def test_small_differences_weigh_nothing_large_ones_weigh_their_share() -> None:
    """With the priors, groups of a few hundred members and a few writes a
    minute weigh about alike; a group of millions of members, or of
    thousands of writes a second, weighs near its share."""
    small = weigh({1: 1_000.0, 2: 1_300.0}, {1: 0.1, 2: 0.3})
    assert small == pytest.approx({1: 1.0, 2: 1.0}, abs=0.02)
    big = weigh({1: 2_000_000.0, 2: 1_000.0}, {1: 5_000.0, 2: 1.0})
    assert big[1] > 1.95 and big[2] < 0.05, big
    assert sum(big.values()) == pytest.approx(2.0)


def test_a_group_weighs_its_members_and_its_write_rate(pg_dsn: str) -> None:
    async def scenario() -> None:
        async with cluster_tables(pg_dsn) as (pool, nodes, log):
            big, small, idle = await log.take(1, "a"), await log.take(2, "a"), \
                await log.take(3, "b")
            # a holds groups 1 and 2, b follows 1 (a little behind) and holds 3.
            await nodes.heartbeat("a", "a:1", group_members={1: 9_000, 2: 1_000})
            await nodes.heartbeat("b", "b:1", group_members={1: 8_000, 3: 0})
            await log.append(big, 1, [b"x"] * 10)
            load = GroupLoad(pool, every=0.0, members_prior=0, writes_prior=0)
            first = await load.weights(now=100.0)
            # Memory 9,000 / 1,000 / 0 (the most any node reports); no rate yet.
            assert first == pytest.approx({1: 0.5 * 2.7 + 0.5, 2: 0.5 * 0.3 + 0.5, 3: 0.5})
            # Writes: group 2 advances by 50 records in 10 s, the others not.
            await log.append(small, 1, [b"x"] * 50)
            second = await load.weights(now=110.0)
            assert second == pytest.approx({1: 0.5 * 2.7, 2: 0.5 * 0.3 + 0.5 * 3, 3: 0.0})
            # Read again within ``every``: the same weights, no query.
            again = GroupLoad(pool, every=3600.0)
            kept = await again.weights(now=0.0)
            await log.append(idle, 1, [b"x"] * 100)
            assert await again.weights(now=1.0) is kept

    asyncio.run(scenario())
