"""Reads of one group's register that writes ask for (``Topology.learn``).

A write to a group this node's view only guesses it writes reads the
group's register first (:mod:`rankd.frontends.resp.cluster_commands`), and
so does a write the engine prepares without taking its group
(``ClusterNode.prepare(take=False)``: boards missing here).  A
write that takes nothing (``ZREM`` of an absent member, ``ZADD XX`` of a
new one) never makes this node the group's writer, so every such write
would read again: clients sending many would turn each command into a
Postgres query on the pool that also carries the log's appends and the
heartbeats.  So :class:`RegisterReads`:

* shares one read of a group among the writes that ask while it runs;
* lets a read that *started* less than :data:`FRESH_SECONDS` ago answer
  (the take that follows a guess is the authority: Postgres's
  compare-and-set, never this view);
* reads at most :data:`AT_ONCE` groups at a time (the pool keeps the rest).

Each caller waits at most ``seconds`` (a read Postgres does not answer in
time leaves the view as it was, and says so: the write's take would wait
on that Postgres again).  For :data:`AWAY_SECONDS` after such a read, every
read says so at once: a pipeline of writes to many groups waits once, not
once a write.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable

from rankd.postgres_link import POSTGRES_ERRORS

#: How long a read of a group's register answers the writes that follow.
FRESH_SECONDS = 0.25
#: Groups whose registers are read at the same time, at most.
AT_ONCE = 2
#: How long after a read Postgres did not answer reads fail at once.
AWAY_SECONDS = 1.0


class RegisterReads:
    """Shared, bounded reads of single groups' registers (module docstring)."""

    def __init__(self, read: Callable[[int], Awaitable[None]], seconds: float, *,
                 fresh: float = FRESH_SECONDS, at_once: int = AT_ONCE) -> None:
        self._read = read
        self._seconds = seconds
        self._fresh = fresh
        self._slots = asyncio.Semaphore(at_once)
        #: The groups being read now.
        self._reading: dict[int, asyncio.Future[bool]] = {}
        #: When each group's last successful read started (monotonic).
        self._read_at: dict[int, float] = {}
        #: When a read last failed (Postgres away or late), if ever.
        self._failed_at = -math.inf

    async def learn(self, group: int) -> bool:
        """Read ``group``'s register now, or share a read under way or
        just made; within about ``seconds`` whatever Postgres does.  False
        if Postgres did not answer (now, or a moment ago)."""
        now = time.monotonic()
        read_at = self._read_at.get(group)
        if read_at is not None and now - read_at < self._fresh:
            return True
        if now - self._failed_at < AWAY_SECONDS:
            return False
        reading = self._reading.get(group)
        if reading is None:
            reading = self._reading[group] = asyncio.ensure_future(self._bounded(group))
            reading.add_done_callback(lambda _: self._reading.pop(group, None))
        # Shielded: a caller that leaves (its client gone) ends no one else's wait.
        try:
            return await asyncio.wait_for(asyncio.shield(reading), self._seconds)
        except TimeoutError:  # (before the read's own bound: it counts already)
            self._failed_at = time.monotonic()
            return False

    async def _bounded(self, group: int) -> bool:
        try:
            async with asyncio.timeout(self._seconds), self._slots:
                started = time.monotonic()
                if started - self._failed_at < AWAY_SECONDS:
                    return False  # (found away while this read waited for a slot)
                await self._read(group)
                self._read_at[group] = started
                return True
        except POSTGRES_ERRORS:
            self._failed_at = time.monotonic()
            return False
