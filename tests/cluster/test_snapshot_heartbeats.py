"""A primary storing a group's snapshot keeps sending its heartbeats.

Storing a large group's state takes seconds (here Postgres holds the copy,
as a slow disk would, for up to half a lease).  The heartbeat and lease
checks of the watch loop must not wait for it: a node silent for two leases
drops out of the other nodes' live peers while it holds its leases, and
writes sent through them got no address to go to ("no live node does
yet").  Snapshots have their own task; here the primary's ``seen_at`` in
``rankd_nodes`` goes on advancing, a round apart, while its copy waits."""

from __future__ import annotations

import asyncio
import itertools
import time

import asyncpg
from jepsen import Lab

#: Heartbeats come a watch round (1 s) apart; waiting on the copy, they
#: came half a lease (5 s) and a round apart.
MAX_GAP_SECONDS = 3.0


def test_heartbeats_go_on_while_a_snapshot_waits(tmp_path, pg_server) -> None:
    lab = Lab(tmp_path, lease_seconds=10.0, extra=("--group-snapshot-records", "20"))

    async def waiting_copies(conn: asyncpg.Connection) -> int:
        return await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE 'INSERT INTO rankd_group_snapshots%'")

    async def scenario() -> None:
        board = "snapping"
        lab.daemons[0].request("PUT", f"/v1/boards/{board}", {"policy": "sum"})
        primary = lab.primary_of(board)
        node = lab.daemons[primary]
        blocker = await asyncpg.connect(lab.dsn)
        watcher = await asyncpg.connect(lab.dsn)
        try:
            holding = blocker.transaction()
            await holding.start()
            await blocker.execute("LOCK TABLE rankd_group_snapshots IN EXCLUSIVE MODE")
            written = 0
            deadline = time.monotonic() + 30
            while not await waiting_copies(watcher):
                assert time.monotonic() < deadline, "no snapshot was begun"
                status, answer = node.request("POST", f"/v1/boards/{board}/scores", {
                    "member": f"m{written % 5}", "delta": 1, "event_id": f"e{written}"})
                assert status == 200, answer
                written += 1
                await asyncio.sleep(0.01)
            seen: list[float] = []
            waited = 0
            until = time.monotonic() + 7.0
            while time.monotonic() < until:
                at = await watcher.fetchval(
                    "SELECT extract(epoch FROM seen_at) FROM rankd_nodes WHERE node_id = $1",
                    f"n{primary}")
                if not seen or at != seen[-1]:
                    seen.append(at)
                waited += bool(await waiting_copies(watcher))
                await asyncio.sleep(0.1)
            await holding.rollback()
        finally:
            await blocker.close()
            await watcher.close()
        assert waited > 0  # (the copy did wait meanwhile)
        gaps = [later - earlier for earlier, later in itertools.pairwise(seen)]
        assert len(seen) >= 4 and max(gaps) < MAX_GAP_SECONDS, (seen, gaps)

    try:
        asyncio.run(scenario())
    except BaseException:
        print(lab.logs())
        raise
    finally:
        lab.close()
