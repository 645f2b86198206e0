"""Whether a group fits on a node's disk: its size against the node's room.

What it owns: each group's on-disk size as Postgres knows it, and the
planner's and ``rankd cluster move``'s check that a node given a group has
room for it.

Design:

* **A group's size** is what a node that loads it writes: the group's
  newest snapshot in Postgres (``rankd_group_snapshots``) and the log after
  it (``rankd_log``), in bytes (``length`` of a ``bytea`` reads its size
  uncompressed, from the TOAST pointer for a large one).  The node's own
  snapshot of the group and its local log's copy are of that order.
* **Read incrementally.**  Summing the whole log scans it (seconds for a
  million batches of a kilobyte), so :class:`GroupSizes` reads it once,
  then, at most every :data:`rankd.cluster.load.READ_EVERY` seconds, only
  what changed: the snapshots' sizes (a few rows a group), and per group,
  through the log's key ``(group_id, first_seq)``, the batches appended
  since the last reading, or, for a group with a newer snapshot, its log
  after that snapshot (:data:`QUERY_LOG`): the work follows the write
  rate, not the log's size.  One group's size (``rankd cluster move``) is
  read the same way (:data:`QUERY_ONE`).
* **A node's room** is the free bytes it reported in its last heartbeat
  (:mod:`rankd.cluster.capacity`) less ``--min-free-disk``.  A node that
  reported nothing (an older rankd), or a group of unknown size, fits as
  before.  A node is given a group it does not hold only if the group fits
  in its room; within one plan each group given is taken off the room, so
  ten groups that each fit alone are not all given to a node with room for
  three.  The moves in progress are charged to their targets (counted as
  done, as the planner counts them for load): until the target reports
  its disk again, its free bytes do not show them.
* A node that holds the group already (a follower made primary) loads
  nothing: the check is only for a node that would load it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import asyncpg

from rankd.cluster.capacity import Capacity, read_reports
from rankd.cluster.load import READ_EVERY

#: Per group: its newest snapshot's position and bytes.
QUERY_SNAPSHOTS = """
SELECT group_id, seq, sum(length(data))::bigint AS bytes FROM rankd_group_snapshots
 WHERE (group_id, seq) IN (SELECT group_id, max(seq) FROM rankd_group_snapshots
                            GROUP BY group_id)
 GROUP BY group_id, seq
"""
#: For each group of $1, the bytes and last position of its log's batches
#: starting after the position in $2 (one probe of the log's key a group).
#: (The aggregate inside the lateral subquery keeps it a probe of the key
#: for each group: a plain one was joined by a scan of the whole log.)
QUERY_LOG = """
SELECT c.g AS group_id, coalesce(l.bytes, 0)::bigint AS bytes,
       coalesce(l.last_seq, c.after) AS last_seq
  FROM unnest($1::int[], $2::bigint[]) AS c(g, after)
  CROSS JOIN LATERAL (SELECT sum(length(records)) AS bytes, max(last_seq) AS last_seq
                        FROM rankd_log WHERE group_id = c.g AND first_seq > c.after) AS l
"""
#: One group's ($1) size.
QUERY_ONE = """
WITH newest AS (
    SELECT coalesce(max(seq), 0) AS seq FROM rankd_group_snapshots WHERE group_id = $1
)
SELECT coalesce((SELECT sum(length(data)) FROM rankd_group_snapshots, newest
                  WHERE group_id = $1 AND rankd_group_snapshots.seq = newest.seq), 0)
     + coalesce((SELECT sum(length(records)) FROM rankd_log, newest
                  WHERE group_id = $1 AND first_seq > newest.seq), 0)
"""


async def group_size(pool: asyncpg.Pool, group: int) -> int:
    """``group``'s size in bytes (0: nothing of it in Postgres)."""
    async with pool.acquire() as conn:
        return int(await conn.fetchval(QUERY_ONE, group))


class GroupSizes:
    """The groups' sizes, read from Postgres incrementally (module
    docstring) at most every ``every`` seconds."""

    def __init__(self, pool: asyncpg.Pool, *, every: float = READ_EVERY) -> None:
        self.pool = pool
        self.every = every
        self._read_at: float | None = None
        #: Per group: its newest snapshot's position and bytes, the last
        #: position of its log counted and the log's bytes after the snapshot.
        self._snapshots: dict[int, tuple[int, int]] = {}
        self._logs: dict[int, tuple[int, int]] = {}
        self._sizes: dict[int, int] = {}

    async def sizes(self, now: float) -> dict[int, int]:
        """Each group's size (``now``: the caller's monotonic clock)."""
        if self._read_at is not None and now - self._read_at < self.every:
            return self._sizes
        async with self.pool.acquire() as conn, conn.transaction(readonly=True):
            # (A thousand probes look costly to Postgres's planner, which
            # then compiles the query: 50 ms for nothing.)
            await conn.execute("SET LOCAL jit = off")
            snapshots = {row["group_id"]: (row["seq"], int(row["bytes"]))
                         for row in await conn.fetch(QUERY_SNAPSHOTS)}
            groups = [row[0] for row in await conn.fetch("SELECT group_id FROM rankd_groups")]
            # From the last position counted; from the snapshot for a group
            # whose snapshot is new (what was counted before it is dropped).
            afters = []
            for group in groups:
                snap_seq = snapshots.get(group, (0, 0))[0]
                counted = self._logs.get(group)
                if counted is None or self._snapshots.get(group, (0, 0))[0] != snap_seq:
                    self._logs[group] = counted = (snap_seq, 0)
                afters.append(counted[0])
            rows = await conn.fetch(QUERY_LOG, groups, afters)
        for row in rows:
            _, bytes_before = self._logs[row["group_id"]]
            self._logs[row["group_id"]] = (row["last_seq"], bytes_before + int(row["bytes"]))
        self._snapshots = snapshots
        self._read_at = now
        self._sizes = {group: snapshots.get(group, (0, 0))[1] + self._logs[group][1]
                       for group in groups}
        return self._sizes


@dataclass
class DiskRoom:
    """The bytes each node may still be given, for one plan."""

    #: Per node that reported its free bytes: those less ``--min-free-disk``.
    room: dict[str, int] = field(default_factory=dict)
    #: Per group: its size in bytes (absent: unknown, fits anywhere).
    sizes: Mapping[int, int] = field(default_factory=dict)

    def fits(self, node: str, group: int) -> bool:
        """Whether ``node`` has room to load ``group``."""
        room = self.room.get(node)
        return room is None or self.sizes.get(group, 0) <= room

    def take(self, node: str, group: int) -> None:
        """``node`` is given ``group`` (to load): its room shrinks."""
        if node in self.room:
            self.room[node] -= self.sizes.get(group, 0)

    def refusal(self, node: str, group: int) -> str | None:
        """Why ``node`` may not load ``group`` (None: it may)."""
        if self.fits(node, group):
            return None
        return (f"node {node!r} cannot take group {group}: its snapshot and log take "
                f"{self.sizes.get(group, 0):,} bytes, and the node has "
                f"{max(self.room[node], 0):,} bytes free over --min-free-disk")


def disk_room(capacity: Capacity, min_free: int, sizes: Mapping[int, int],
              moving: Mapping[int, str] | None = None) -> DiskRoom:
    """:class:`DiskRoom` from the nodes' reports; ``moving``: the moves in
    progress (group -> target), charged to their targets."""
    out = DiskRoom({node: free - min_free for node, free in capacity.free.items()
                    if free is not None}, sizes)
    for group, target in (moving or {}).items():
        out.take(target, group)
    return out


async def move_refusal(pool: asyncpg.Pool, target: str, group: int, min_free: int, *,
                       holds: bool) -> str | None:
    """Why ``group`` may not be moved to ``target`` (``rankd cluster move``):
    a node short of disk or whose log fails, or, unless it ``holds`` the
    group already, one without room for it; None if it may."""
    capacity = await read_reports(pool, [target], min_free)
    refusal = capacity.refusal(target)
    if refusal is not None or holds:
        return refusal
    sizes = {group: await group_size(pool, group)}
    return disk_room(capacity, min_free, sizes).refusal(target, group)
