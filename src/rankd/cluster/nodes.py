"""The cluster's nodes, as Postgres sees them, and the cluster's status.

Every node upserts its row of ``rankd_nodes`` (its id, the address it
advertises to clients and peers, and the last position it applied of each
group it follows, and its proof of holding the cluster secret: see
:mod:`rankd.cluster.trust`) with :meth:`Nodes.heartbeat`.  A node is *alive* while
its last heartbeat is younger than ``alive_seconds`` by Postgres's clock:
the one clock all nodes share, so no node's skew decides who is alive.

:meth:`Nodes.status` is what ``GET /v1/cluster`` shows: the nodes, and for
each group with a register its epoch, holder, remaining lease and last
position, with every live follower's lag behind it.
"""

from __future__ import annotations

import json
from typing import Any

import asyncpg

from rankd.cluster.capacity import SCHEMA as CAPACITY_SCHEMA
from rankd.cluster.log import lock_schema

SCHEMA = """
CREATE TABLE IF NOT EXISTS rankd_nodes (
    node_id   text PRIMARY KEY,
    advertise text NOT NULL,
    applied   jsonb NOT NULL DEFAULT '{}',
    seen_at   timestamptz NOT NULL
);
ALTER TABLE rankd_nodes ADD COLUMN IF NOT EXISTS advertise_tcp text;
ALTER TABLE rankd_nodes ADD COLUMN IF NOT EXISTS proof text;
ALTER TABLE rankd_nodes ADD COLUMN IF NOT EXISTS advertise_resp text;
ALTER TABLE rankd_nodes ADD COLUMN IF NOT EXISTS members bigint;
ALTER TABLE rankd_nodes ADD COLUMN IF NOT EXISTS group_members jsonb;
""" + CAPACITY_SCHEMA


class Nodes:
    """``rankd_nodes`` through an asyncpg pool."""

    def __init__(self, pool: asyncpg.Pool, *, alive_seconds: float = 10.0) -> None:
        self.pool = pool
        self.alive_seconds = alive_seconds

    async def migrate(self) -> None:
        async with self.pool.acquire() as conn, conn.transaction():
            await lock_schema(conn)
            await conn.execute(SCHEMA)

    async def heartbeat(self, node: str, advertise: str,
                        applied: dict[int, int] | None = None,
                        advertise_tcp: str | None = None, proof: str | None = None,
                        advertise_resp: str | None = None,
                        members: int | None = None,
                        group_members: dict[int, int] | None = None,
                        planning: dict[str, Any] | None = None) -> None:
        """Say this node is alive, where it is reached (HTTP, and TCP
        protocol if it serves it), how far it has applied each group, its
        ``proof`` (``ClusterTrust.node_proof``), its RESP port's address if it
        serves one, how many members its boards hold, and how many of them
        each group's boards hold, and what it can take
        (``planning``: :mod:`rankd.cluster.capacity`), for the planner."""
        async with self.pool.acquire() as conn:
            await conn.execute(
                "INSERT INTO rankd_nodes (node_id, advertise, applied, seen_at, advertise_tcp, "
                "proof, advertise_resp, members, group_members, planning) VALUES ($1, $2, "
                "$3::jsonb, now(), $4, $5, $6, $7, $8::jsonb, $9::jsonb) ON CONFLICT (node_id) DO "
                "UPDATE SET advertise = excluded.advertise, applied = excluded.applied, "
                "seen_at = now(), advertise_tcp = excluded.advertise_tcp, "
                "proof = excluded.proof, advertise_resp = excluded.advertise_resp, "
                "members = excluded.members, group_members = excluded.group_members, "
                "planning = excluded.planning",
                node, advertise, json.dumps({str(g): s for g, s in (applied or {}).items()}),
                advertise_tcp, proof, advertise_resp, members,
                json.dumps({str(g): n for g, n in (group_members or {}).items()}),
                None if planning is None else json.dumps(planning))

    async def status(self) -> dict[str, Any]:
        """Nodes and groups, for ``GET /v1/cluster`` and ``rankd cluster status``."""
        async with self.pool.acquire() as conn:
            nodes = await conn.fetch(
                "SELECT node_id, advertise, applied, members, planning, "
                "extract(epoch FROM now() - seen_at) AS silent FROM rankd_nodes "
                "ORDER BY node_id")
            groups = await conn.fetch(
                "SELECT group_id, epoch, holder, last_seq, "
                "extract(epoch FROM lease_until - now()) AS lease_left FROM rankd_groups "
                "ORDER BY group_id") if await conn.fetchval(
                    "SELECT to_regclass('rankd_groups') IS NOT NULL") else []
        alive = {row["node_id"]: float(row["silent"]) < self.alive_seconds for row in nodes}
        applied = {row["node_id"]: {int(g): s for g, s in json.loads(row["applied"]).items()}
                   for row in nodes}
        # What each node reports it can take (rankd.cluster.capacity).
        planning = {row["node_id"]: json.loads(row["planning"]) if row["planning"] else {}
                    for row in nodes}
        return {
            "nodes": [{"node": row["node_id"], "advertise": row["advertise"],
                       "alive": alive[row["node_id"]], "members": row["members"],
                       "silent_seconds": round(float(row["silent"]), 3),
                       "free_bytes": planning[row["node_id"]].get("free_bytes"),
                       "log_failed": planning[row["node_id"]].get("log_failed")}
                      for row in nodes],
            "replicas_all": sorted({int(g) for node, sent in planning.items() if alive[node]
                                    for g in sent.get("spread") or ()}),
            "groups": [{
                "group": row["group_id"], "epoch": row["epoch"], "primary": row["holder"],
                "lease_seconds_left": (None if row["lease_left"] is None
                                       else round(float(row["lease_left"]), 3)),
                "last_seq": row["last_seq"],
                "followers": {node: {"applied": seqs[row["group_id"]],
                                     "lag": row["last_seq"] - seqs[row["group_id"]]}
                              for node, seqs in applied.items()
                              if alive[node] and row["group_id"] in seqs
                              and node != row["holder"]},
            } for row in groups],
        }
