"""Postgres holding a primary's snapshot copy, as a slow disk would with a
large state: a lock on ``rankd_group_snapshots`` that the copy's INSERT
waits on, and a board written until the copy waits."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
from jepsen import Lab

#: The board the helpers write, of a policy that adds deltas up.
BOARD = "snapping"


def snapping_lab(root: Any) -> tuple[Lab, int]:
    """Three nodes with a lease of 10 s (a copy waits half of it) that
    snapshot a group every 20 records, :data:`BOARD` made, and the index
    of the node that writes it."""
    lab = Lab(root, lease_seconds=10.0, extra=("--group-snapshot-records", "20"))
    try:
        lab.daemons[0].request("PUT", f"/v1/boards/{BOARD}", {"policy": "sum"})
        primary = lab.primary_of(BOARD)
        assert primary is not None
    except BaseException:
        lab.close()
        raise
    return lab, primary


async def waiting_copies(conn: asyncpg.Connection) -> int:
    """Snapshot copies waiting on the lock now."""
    return await conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND query LIKE 'INSERT INTO rankd_group_snapshots%'")


@contextlib.asynccontextmanager
async def copies_held(dsn: str) -> AsyncIterator[tuple[asyncpg.Connection, Any]]:
    """Snapshot copies wait while inside; yields a connection outside the
    lock's transaction (to watch with) and the transaction (rolled back on
    leaving, if not before)."""
    blocker = await asyncpg.connect(dsn)
    watcher = await asyncpg.connect(dsn)
    try:
        holding = blocker.transaction()
        await holding.start()
        await blocker.execute("LOCK TABLE rankd_group_snapshots IN EXCLUSIVE MODE")
        yield watcher, holding
    finally:
        await blocker.close()
        await watcher.close()


async def write_until_a_copy_waits(node: Any, board: str, watcher: asyncpg.Connection,
                                   timeout: float = 30.0) -> int:
    """Write ``board`` through ``node`` (deltas of 1, each with an event
    id) until a snapshot copy waits; how many writes were acknowledged."""
    written = 0
    deadline = time.monotonic() + timeout
    while not await waiting_copies(watcher):
        assert time.monotonic() < deadline, "no snapshot was begun"
        for _ in range(10):
            status, answer = node.request("POST", f"/v1/boards/{board}/scores", {
                "member": f"m{written % 5}", "delta": 1, "event_id": f"e{written}"})
            assert status == 200, answer
            written += 1
        await asyncio.sleep(0.05)
    return written
