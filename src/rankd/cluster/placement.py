"""Where each board group is placed: its primary and followers, and the topology epoch.

Postgres holds the placement (created by :func:`migrate`):

``rankd_topology``
    one row: ``epoch``, the topology's version.  Every change of placement
    increments it in the same transaction, so it only ever grows, and a
    planner that read an older epoch changes nothing (compare-and-set,
    :meth:`Placement.replace`).
``rankd_placement``
    one row per placed group: ``primary_node``, ``followers`` (the nodes
    that should hold the group besides its primary) and ``version``, the
    topology epoch that set the row.
``rankd_moves``
    one row per group being moved: its ``target``.  The group's holder
    carries it out (:mod:`rankd.cluster.moves`), and the row goes in the
    transaction that hands the group over (:meth:`Placement.hand_over`).

Placement only says who *should* write and hold a group.  Who may append
stays the group's register (``rankd_groups``: the epoch compare-and-set of
:mod:`rankd.cluster.log`): a node that placement names primary still takes
the group with a new epoch, and a primary the placement no longer names is
fenced by that epoch, never by the placement.  A group nobody placed yet
(a cluster started before placement existed, or a group never written) is
held by every node, as before.

Routing reads the placement through :class:`rankd.cluster.topology.ClusterTopology`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import asyncpg

from rankd.cluster.log import lock_schema

log = logging.getLogger(__name__)

#: Channel on which a hand-over tells every node ``group:target:epoch``, and
#: the target, once the group's writes wait there until it writes it,
#: ``group:target:epoch:holding``.
CHANNEL = "rankd_topology"

SCHEMA = """
CREATE TABLE IF NOT EXISTS rankd_topology (
    id    int PRIMARY KEY CHECK (id = 1),
    epoch bigint NOT NULL
);
INSERT INTO rankd_topology (id, epoch) VALUES (1, 0) ON CONFLICT DO NOTHING;
CREATE TABLE IF NOT EXISTS rankd_placement (
    group_id     int PRIMARY KEY,
    primary_node text NOT NULL,
    followers    text[] NOT NULL DEFAULT '{}',
    version      bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS rankd_moves (
    group_id     int PRIMARY KEY,
    target       text NOT NULL,
    requested_at timestamptz NOT NULL DEFAULT now()
);
"""


#: :meth:`Placement.hand_over` as one statement (its own transaction): the
#: register moves only if ``source`` still holds it at ``epoch`` (the row
#: locked by the UPDATE, its condition checked again on the newest version,
#: as a ``SELECT ... FOR UPDATE`` then an ``UPDATE`` did); every other change
#: happens only if it did.  $1 group, $2 epoch, $3 source, $4 target,
#: $5 replicas, $6 lease seconds, $7 the notification channel.
HAND_OVER = """
WITH register AS (
    UPDATE rankd_groups SET epoch = epoch + 1, holder = $4,
        lease_until = now() + make_interval(secs => $6)
    WHERE group_id = $1 AND epoch = $2 AND holder = $3
    RETURNING epoch, last_seq
), began AS (
    INSERT INTO rankd_epochs (group_id, epoch, after_seq)
    SELECT $1, epoch, last_seq FROM register
    ON CONFLICT DO NOTHING
), placed AS (
    SELECT followers FROM rankd_placement WHERE group_id = $1 FOR UPDATE
), topology AS (
    UPDATE rankd_topology SET epoch = epoch + 1
    WHERE id = 1 AND EXISTS (SELECT 1 FROM register)
    RETURNING epoch
), placement AS (
    INSERT INTO rankd_placement (group_id, primary_node, followers, version)
    SELECT $1, $4, (ARRAY[$3::text] || ARRAY(
        SELECT node FROM unnest(coalesce((SELECT followers FROM placed), '{}')) AS node
        WHERE node <> $3 AND node <> $4))[1:$5], topology.epoch
    FROM topology
    ON CONFLICT (group_id) DO UPDATE SET primary_node = excluded.primary_node,
        followers = excluded.followers, version = excluded.version
    RETURNING 1
), moved AS (
    DELETE FROM rankd_moves WHERE group_id = $1 AND EXISTS (SELECT 1 FROM register)
    RETURNING 1
)
SELECT register.epoch, pg_notify($7, $1::int::text || ':' || $4::text || ':'
    || register.epoch::text) FROM register
"""


@dataclass(frozen=True)
class Placed:
    """One group's placement."""

    primary: str
    followers: tuple[str, ...]
    version: int

    @property
    def nodes(self) -> tuple[str, ...]:
        return (self.primary, *self.followers)


@dataclass
class Layout:
    """The placement as read at one topology epoch."""

    epoch: int = 0
    groups: dict[int, Placed] = field(default_factory=dict)
    #: Requested moves: group -> target.
    moves: dict[int, str] = field(default_factory=dict)

    def holds(self, node: str, group: int) -> bool:
        """Whether ``node`` should hold ``group`` in memory (every node holds
        a group nobody placed)."""
        placed = self.groups.get(group)
        return placed is None or node in placed.nodes

    def per_node(self) -> dict[str, dict[str, int]]:
        """Groups led and followed per node."""
        counts: dict[str, dict[str, int]] = {}
        for placed in self.groups.values():
            counts.setdefault(placed.primary, {"primary": 0, "follower": 0})["primary"] += 1
            for node in placed.followers:
                counts.setdefault(node, {"primary": 0, "follower": 0})["follower"] += 1
        return counts


class Stale(Exception):
    """The topology moved on since the caller read it: nothing was changed."""


async def migrate(conn: asyncpg.Connection) -> None:
    """Create the placement's tables if they are not there."""
    async with conn.transaction():
        await lock_schema(conn)
        await conn.execute(SCHEMA)


async def read_layout(conn: asyncpg.Connection) -> Layout:
    """The placement and requested moves, in one consistent view."""
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        epoch = await conn.fetchval("SELECT epoch FROM rankd_topology WHERE id = 1")
        rows = await conn.fetch("SELECT group_id, primary_node, followers, version "
                                "FROM rankd_placement")
        moves = await conn.fetch("SELECT group_id, target FROM rankd_moves")
    return Layout(epoch or 0,
                  {r["group_id"]: Placed(r["primary_node"], tuple(r["followers"]), r["version"])
                   for r in rows},
                  {r["group_id"]: r["target"] for r in moves})


async def _bump(conn: asyncpg.Connection, expected: int | None) -> int:
    """Within a transaction: the next topology epoch, compare-and-set
    against ``expected`` when given (:class:`Stale` otherwise)."""
    epoch = await conn.fetchval(
        "UPDATE rankd_topology SET epoch = epoch + 1 WHERE id = 1 "
        "AND ($1::bigint IS NULL OR epoch = $1) RETURNING epoch", expected)
    if epoch is None:
        raise Stale(f"the topology is no longer at epoch {expected}")
    return epoch


def choose_followers(primary: str, live: Iterable[str], replicas: int,
                     load: Mapping[str, float], keep: Iterable[str] = ()) -> tuple[str, ...]:
    """``replicas`` followers for a group led by ``primary``: those of
    ``keep`` still live first (no needless bootstrap), then the least
    loaded live nodes (ties by name, so every planner agrees)."""
    candidates = sorted(set(live) - {primary})
    chosen = [node for node in keep if node in candidates][:replicas]
    for node in sorted(candidates, key=lambda n: (load.get(n, 0), n)):
        if len(chosen) >= replicas:
            break
        if node not in chosen:
            chosen.append(node)
    return tuple(chosen)


class Placement:
    """The placement tables through an asyncpg pool."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def migrate(self) -> None:
        async with self.pool.acquire() as conn:
            await migrate(conn)

    async def read(self) -> Layout:
        async with self.pool.acquire() as conn:
            return await read_layout(conn)

    async def place_if_new(self, group: int, primary: str, followers: tuple[str, ...]) -> bool:
        """Place ``group`` if nobody did yet (its first primary); False if placed."""
        async with self.pool.acquire() as conn, conn.transaction():
            if await conn.fetchval("SELECT 1 FROM rankd_placement WHERE group_id = $1",
                                   group):
                return False
            epoch = await _bump(conn, None)
            await conn.execute(
                "INSERT INTO rankd_placement (group_id, primary_node, followers, version) "
                "VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
                group, primary, list(followers), epoch)
        return True

    async def replace(self, expected_epoch: int, changes: Mapping[int, Placed]) -> int:
        """Set the placement of every group of ``changes`` in one
        transaction if the topology is still at ``expected_epoch``; the new
        epoch.  :class:`Stale` (nothing changed) if it moved on."""
        async with self.pool.acquire() as conn, conn.transaction():
            epoch = await _bump(conn, expected_epoch)
            await conn.executemany(
                "INSERT INTO rankd_placement (group_id, primary_node, followers, version) "
                "VALUES ($1, $2, $3, $4) ON CONFLICT (group_id) DO UPDATE SET "
                "primary_node = excluded.primary_node, followers = excluded.followers, "
                "version = excluded.version",
                [(group, p.primary, list(p.followers), epoch) for group, p in changes.items()])
        return epoch

    async def request_move(self, group: int, target: str, replicas: int) -> int:
        """Ask for ``group`` to be moved to ``target``: the target becomes a
        follower now (it bootstraps the group), the group's holder hands it
        over once the target caught up.  Returns the new topology epoch."""
        async with self.pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow("SELECT primary_node, followers FROM rankd_placement "
                                      "WHERE group_id = $1 FOR UPDATE", group)
            holder = await conn.fetchval("SELECT holder FROM rankd_groups WHERE group_id = $1",
                                         group)
            epoch = await _bump(conn, None)
            primary = row["primary_node"] if row else (holder or target)
            followers = [n for n in (row["followers"] if row else []) if n != primary]
            if target != primary and target not in followers:
                followers.append(target)
            await conn.execute(
                "INSERT INTO rankd_placement (group_id, primary_node, followers, version) "
                "VALUES ($1, $2, $3, $4) ON CONFLICT (group_id) DO UPDATE SET "
                "primary_node = excluded.primary_node, followers = excluded.followers, "
                "version = excluded.version", group, primary, followers, epoch)
            await conn.execute(
                "INSERT INTO rankd_moves (group_id, target) VALUES ($1, $2) "
                "ON CONFLICT (group_id) DO UPDATE SET target = excluded.target, "
                "requested_at = now()", group, target)
        return epoch

    async def forget_move(self, group: int, target: str) -> None:
        """Drop the requested move of ``group`` to ``target`` (done, or given up)."""
        async with self.pool.acquire() as conn:
            await conn.execute("DELETE FROM rankd_moves WHERE group_id = $1 AND target = $2",
                               group, target)

    async def hand_over(self, group: int, epoch: int, source: str, target: str,
                        replicas: int, lease_seconds: float) -> int | None:
        """The cut-over of a move, one transaction: if ``source`` still
        writes ``group`` at ``epoch``, the group's register goes to
        ``target`` at the next epoch with a fresh lease (so ``source``'s
        appends are fenced from then on, and no third node takes the group
        before the target does), the placement names ``target`` primary and
        ``source`` a follower, the topology epoch grows, the move row goes,
        and every node is notified.  Returns the group's new epoch; None
        (nothing changed) if the group moved on.

        It is one statement (:data:`HAND_OVER`), so one round trip to
        Postgres while the group's writes wait, not one per step."""
        async with self.pool.acquire() as conn:
            row = await conn.fetchrow(HAND_OVER, group, epoch, source, target,
                                      max(replicas, 0), lease_seconds, CHANNEL)
        return None if row is None else row[0]

    async def applied_since_asked(self, group: int, target: str) -> int | None:
        """How far ``target`` applied ``group`` by its last heartbeat, if it
        wrote one since the group's move to it was asked for (else None)."""
        async with self.pool.acquire() as conn:
            return await conn.fetchval(
                "SELECT coalesce((n.applied ->> $1::int::text)::bigint, -1) "
                "FROM rankd_nodes AS n JOIN rankd_moves AS m ON m.group_id = $1 "
                "AND m.target = n.node_id WHERE n.node_id = $2 AND n.seen_at > m.requested_at",
                group, target)

    async def notify_holding(self, group: int, target: str, epoch: int) -> None:
        """Tell every node that ``target``, a move's target, holds ``group``'s
        writes (handed at ``epoch``) until it writes the group: the source
        lets the writes it held go there."""
        async with self.pool.acquire() as conn:
            await conn.execute("SELECT pg_notify($1, $2)", CHANNEL,
                               f"{group}:{target}:{epoch}:holding")
