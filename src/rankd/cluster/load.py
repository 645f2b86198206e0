"""What each board group weighs, for the planner: memory and write rate.

What it owns: reading, from Postgres alone, how much each group holds and
how fast it is written, and turning that into one weight per group that
:func:`rankd.cluster.planner.plan` spreads over nodes.

* **Memory**: the members the group's boards keep (each board's largest
  window), as the live nodes holding it last reported them in their
  heartbeats (``rankd_nodes.group_members``; the most any reports, so a
  follower behind counts no less than its primary).  Members are
  what every node holding the group spends memory on, and a count is the
  same measure for every group (sizes read from Postgres were not: a group
  that had a snapshot stored looked heavier than one of the same boards
  that only had its log).
* **Writes**: the records the group's register advanced by
  (``rankd_groups.last_seq``) since the previous reading, per second:
  Postgres's own count, whoever writes the group.

A group's weight is half its share of memory and half its share of writes,
each scaled so that the average group weighs 1 (a term with no data yet,
or with every group at zero, counts 1 for every group).  Each share is
taken with a prior, as if every group held :data:`MEMBERS_PRIOR` more
members and took :data:`WRITES_PRIOR` more records a second: small
differences (a few hundred members, a few records a minute, or the
records a move itself appends) are noise for placement, and without the
prior they steered it (a rebalance of 1,024 small groups under light
writes stopped at 379/322/323 primaries, the groups just moved looking
busier).  So with groups alike, or small, or before the first reading,
the planner spreads groups by count exactly as it would without weights,
and a group of millions of members or thousands of writes a second weighs
what it should.

Readings are at least :data:`READ_EVERY` seconds apart (one query over the
registers and the nodes' rows); in between, the last weights are reused.
"""

from __future__ import annotations

from collections.abc import Mapping

import asyncpg

#: Seconds between two readings of the groups' sizes and positions.
READ_EVERY = 60.0
#: The priors each group's members and write rate are taken with (above).
MEMBERS_PRIOR = 10_000.0
WRITES_PRIOR = 10.0

#: Per group: its register's position, and its members as the nodes seen in
#: the last minute report them.
QUERY = """
SELECT g.group_id, g.last_seq,
       coalesce(max((n.group_members ->> g.group_id::text)::bigint), 0) AS members
  FROM rankd_groups g
  LEFT JOIN rankd_nodes n ON n.seen_at > now() - interval '1 minute'
 GROUP BY g.group_id, g.last_seq
"""


def weigh(memory: Mapping[int, float], writes: Mapping[int, float], *,
          members_prior: float = MEMBERS_PRIOR,
          writes_prior: float = WRITES_PRIOR) -> dict[int, float]:
    """One weight per group of ``memory`` ∪ ``writes`` (see the module
    docstring): half its scaled memory, half its scaled write rate."""
    groups = set(memory) | set(writes)
    if not groups:
        return {}

    def scaled(values: Mapping[int, float], prior: float) -> dict[int, float]:
        total = sum(max(0.0, values.get(g, 0.0)) for g in groups)
        if total <= 0:
            return dict.fromkeys(groups, 1.0)
        mean = total / len(groups) + prior
        return {g: (max(0.0, values.get(g, 0.0)) + prior) / mean for g in groups}

    by_memory, by_writes = scaled(memory, members_prior), scaled(writes, writes_prior)
    return {g: 0.5 * by_memory[g] + 0.5 * by_writes[g] for g in groups}


class GroupLoad:
    """Reads the groups' weights from Postgres at most every :data:`READ_EVERY` s."""

    def __init__(self, pool: asyncpg.Pool, *, every: float = READ_EVERY,
                 members_prior: float = MEMBERS_PRIOR, writes_prior: float = WRITES_PRIOR
                 ) -> None:
        self.pool = pool
        self.every = every
        self.priors = {"members_prior": members_prior, "writes_prior": writes_prior}
        #: The last reading: monotonic time, and each group's position.
        self._read_at: float | None = None
        self._positions: dict[int, int] = {}
        self._weights: dict[int, float] = {}

    async def weights(self, now: float) -> dict[int, float]:
        """Each group's weight (``now``: the caller's monotonic clock)."""
        if self._read_at is not None and now - self._read_at < self.every:
            return self._weights
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(QUERY)
        memory = {row["group_id"]: float(row["members"]) for row in rows}
        positions = {row["group_id"]: int(row["last_seq"]) for row in rows}
        writes: dict[int, float] = {}
        if self._read_at is not None and now > self._read_at:
            elapsed = now - self._read_at
            writes = {g: max(0, seq - self._positions.get(g, seq)) / elapsed
                      for g, seq in positions.items()}
        self._read_at, self._positions = now, positions
        self._weights = weigh(memory, writes, **self.priors)
        return self._weights
