"""Whether a group fits on a node's disk: its size against the node's room.

What it owns: each group's on-disk size as Postgres knows it, and the
planner's and ``rankd cluster move``'s check that a node given a group has
room for it.

Design:

* **A group's size** is what a node that loads it writes: the group's
  newest snapshot in Postgres (``rankd_group_snapshots``) and the log after
  it (``rankd_log``), in bytes (:data:`QUERY`; ``length`` of a ``bytea``
  reads its stored size, not the value).  The node's own snapshot of the
  group and its local log's copy are of that order.  Sizes are read at
  most every :data:`rankd.cluster.load.READ_EVERY` seconds, as the weights.
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

#: Per group: its newest snapshot's bytes and its log's after it.
QUERY = """
WITH newest AS (
    SELECT group_id, max(seq) AS seq FROM rankd_group_snapshots GROUP BY group_id
), snapshots AS (
    SELECT s.group_id, sum(length(s.data))::bigint AS bytes
      FROM rankd_group_snapshots s JOIN newest n ON n.group_id = s.group_id AND n.seq = s.seq
     GROUP BY s.group_id
), logs AS (
    SELECT l.group_id, sum(length(l.records))::bigint AS bytes
      FROM rankd_log l LEFT JOIN newest n ON n.group_id = l.group_id
     WHERE l.last_seq > coalesce(n.seq, 0)
     GROUP BY l.group_id
)
SELECT coalesce(s.group_id, l.group_id) AS group_id,
       coalesce(s.bytes, 0) + coalesce(l.bytes, 0) AS bytes
  FROM snapshots s FULL JOIN logs l ON l.group_id = s.group_id
"""


async def group_sizes(pool: asyncpg.Pool, group: int | None = None) -> dict[int, int]:
    """Each group's size in bytes (see the module docstring); only
    ``group``'s when given."""
    query = QUERY if group is None else (
        f"SELECT * FROM ({QUERY}) AS sizes WHERE group_id = $1")
    async with pool.acquire() as conn:
        rows = await (conn.fetch(query) if group is None else conn.fetch(query, group))
    return {row["group_id"]: int(row["bytes"]) for row in rows}


class GroupSizes:
    """The groups' sizes, read from Postgres at most every ``every`` seconds."""

    def __init__(self, pool: asyncpg.Pool, *, every: float = READ_EVERY) -> None:
        self.pool = pool
        self.every = every
        self._read_at: float | None = None
        self._sizes: dict[int, int] = {}

    async def sizes(self, now: float) -> dict[int, int]:
        """Each group's size (``now``: the caller's monotonic clock)."""
        if self._read_at is None or now - self._read_at >= self.every:
            self._sizes = await group_sizes(self.pool)
            self._read_at = now
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
    return disk_room(capacity, min_free, await group_sizes(pool, group)).refusal(target, group)
