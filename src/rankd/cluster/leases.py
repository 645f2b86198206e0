"""Keeping the leases of the groups a node is primary of.

A lease lasts ``lease_seconds`` of Postgres's time from its last renewal.
The keeper renews all its leases every ``lease_seconds / 3``, in one
statement, on connections of its own (a node's appends, however many are
in flight or hanging on a dead link, never make a renewal wait for a
connection); a renewal gets a quarter of a lease to answer, then the next
one goes out at once on a fresh connection (and later ones, while Postgres
stays away, half a period apart).  When a renewal is fenced (another node took
the group), the lease is dropped and ``on_lost`` is told.

The node's own view of how long a lease still holds is conservative: a
renewal that *started* at monotonic time ``t`` (before Postgres stamped
it) makes the lease good, locally, until ``t + lease_seconds - margin``.
Postgres's deadline is later than that, so :meth:`LeaseKeeper.may_acknowledge`
turns false before another node can take the group.  A node whose
renewals stall (a paused process, a partition from Postgres) therefore
stops acknowledging writes that only its local log holds (``--ack local``)
before they could be lost to a failover.  Writes acknowledged through the
log (``--ack log``) never depend on this: Postgres fences them.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from rankd._tasks import STOP_SECONDS, stop_task
from rankd.cluster.log import ClusterLog, Fenced, Lease

log = logging.getLogger(__name__)

#: How soon a failed renewal is tried again.
RETRY_SECONDS = 0.05


@dataclass
class Held:
    lease: Lease
    #: Monotonic time until which this node may still act as primary.
    good_until: float


class LeaseKeeper:
    """Takes, renews and gives up one node's leases."""

    def __init__(self, store: ClusterLog, node: str, *, margin: float | None = None,
                 on_lost: Callable[[int, Fenced], None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 renewals: ClusterLog | None = None) -> None:
        self.store = store
        #: Where renewals go (their own connection, in a node).
        self.renewals = store if renewals is None else renewals
        self.node = node
        #: Subtracted from every local lease deadline: clock drift between
        #: the node and Postgres over one lease, and time to stop writing.
        self.margin = store.lease_seconds / 5 if margin is None else margin
        self.on_lost = on_lost
        self.clock = clock
        self.held: dict[int, Held] = {}
        self._task: asyncio.Task | None = None

    def may_acknowledge(self, group: int) -> bool:
        """Whether this node is, by its own conservative clock, still the
        group's primary."""
        held = self.held.get(group)
        return held is not None and self.clock() < held.good_until

    def lease(self, group: int) -> Lease | None:
        held = self.held.get(group)
        return None if held is None else held.lease

    async def take(self, group: int, expired_by: datetime.datetime | None = None
                   ) -> Lease | None:
        """Try to become the group's primary (see :meth:`ClusterLog.take`,
        which says what ``expired_by`` is)."""
        started = self.clock()
        lease = await self.store.take(group, self.node, expired_by=expired_by)
        if lease is not None:
            self.held[group] = Held(lease, started + self.store.lease_seconds - self.margin)
        return lease

    def adopt(self, lease: Lease, read_at: float, lease_left: float) -> None:
        """Hold ``lease``, given to this node by another's transaction (a
        move's hand-over) rather than taken here: good until ``lease_left``
        seconds (by Postgres's clock, as read) after ``read_at``, a local
        time before that read, less the margin."""
        self.held[lease.group] = Held(lease, read_at + lease_left - self.margin)

    async def renew_all(self) -> None:
        """Renew every held lease once, all in one round trip; drop (and
        report) the fenced ones."""
        holding = list(self.held.items())
        started = self.clock()
        fenced = await self.renewals.renew_many([held.lease for _, held in holding])
        for group, held in holding:
            if group in fenced:
                self._lose(group, fenced[group])
            elif self.held.get(group) is held:
                held.good_until = started + self.store.lease_seconds - self.margin

    def _lose(self, group: int, exc: Fenced) -> None:
        if self.held.pop(group, None) is not None:
            log.warning("node %s lost group %d: %s", self.node, group, exc)
            if self.on_lost is not None:
                self.on_lost(group, exc)

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="rankd-leases")

    async def stop(self) -> None:
        await stop_task(self._task, STOP_SECONDS)
        self._task = None

    async def _run(self) -> None:
        period = self.store.lease_seconds / 3
        failures = 0
        while True:
            # After a failure the next try goes at once (on a fresh
            # connection), not a period later: a renewal that timed out
            # has already used most of what the lease leaves.  Later ones
            # (Postgres away) go half a period apart, not to pile up
            # connection attempts it must answer all at once when back.
            await asyncio.sleep(period if failures == 0 else
                                RETRY_SECONDS if failures == 1 else period / 2)
            try:
                await self.renew_all()
            except Exception as exc:  # Postgres away: the local deadlines run out
                if not failures:
                    log.warning("node %s cannot renew its leases: %s", self.node,
                                exc or type(exc).__name__)
                failures += 1
            else:
                if failures:
                    log.warning("node %s renews its leases again", self.node)
                failures = 0
