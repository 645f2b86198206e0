"""The cluster's log and node tables on a test database, without nodes: for
the tests that drive ``ClusterLog`` and ``Nodes`` (and what reads them)
directly."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import asyncpg

from rankd.cluster.log import ClusterLog, migrate
from rankd.cluster.nodes import Nodes


@contextlib.asynccontextmanager
async def cluster_tables(dsn: str, lease_seconds: float = 5.0
                         ) -> AsyncIterator[tuple[asyncpg.Pool, Nodes, ClusterLog]]:
    """A pool on ``dsn`` with the tables made, its ``Nodes`` and a
    ``ClusterLog`` of ``lease_seconds``; the pool is closed at the end."""
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4)
    try:
        async with pool.acquire() as conn:
            await migrate(conn)
        nodes = Nodes(pool)
        await nodes.migrate()
        yield pool, nodes, ClusterLog(pool, lease_seconds=lease_seconds)
    finally:
        await pool.close()
