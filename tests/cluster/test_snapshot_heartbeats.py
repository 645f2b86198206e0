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

from held_snapshots import (
    BOARD,
    copies_held,
    snapping_lab,
    waiting_copies,
    write_until_a_copy_waits,
)

#: Heartbeats come a watch round (1 s) apart; waiting on the copy, they
#: came half a lease (5 s) and a round apart.
MAX_GAP_SECONDS = 3.0


def test_heartbeats_go_on_while_a_snapshot_waits(tmp_path, pg_server) -> None:
    lab, primary = snapping_lab(tmp_path)
    board = BOARD

    async def scenario() -> None:
        node = lab.daemons[primary]
        async with copies_held(lab.dsn) as (watcher, holding):
            await write_until_a_copy_waits(node, board, watcher)
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
        assert waited > 0  # (the copy did wait meanwhile)
        gaps = [later - earlier for earlier, later in itertools.pairwise(seen)]
        assert len(seen) >= 4 and max(gaps) < MAX_GAP_SECONDS, (seen, gaps)

    lab.run(scenario)
