"""Reads of a cluster primary that show only what its group's log committed.

A primary applies a write to its boards when it takes it, before the
group's log in Postgres commits it (the write's answer waits for that
commit under ``--ack log``).  A read in between would show a write that may
never commit: the primary may be cut off from Postgres and deposed, and
its writes then never happen anywhere.  So a read of a group with writes
applied and not yet committed is refused with :class:`Unsettled`, and the
front-end that meets it calls :meth:`ReadGates.settle` and reads again.

``settle`` closes the group's *gate*: writes arriving for the group wait
(``Engine._submit_replicated`` awaits :meth:`ReadGates.opened`; packed runs
go the general way, which waits too) while the records already applied
commit.  Then the waiting readers read, in the same turn of the event loop
their wait ends in, and the gate opens on the next turn.  A read thus
costs at most the one append in flight and the one after it, and holds
writes back for as long; reads of settled groups never wait.  This is
Redis's ``WAIT``, turned around: the reader waits, not the writer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from rankd._tasks import outcome_seen


class ReadGates:
    """Per board group: the gate readers close while a group's applied
    writes commit."""

    def __init__(self) -> None:
        #: Closed gates: group -> a future done when the group's writes may go on.
        self.closed: dict[int, asyncio.Future[None]] = {}
        self._readers: dict[int, int] = {}

    async def settle(self, group: int, committed: asyncio.Future, timeout: float) -> None:
        """Close ``group``'s gate until ``committed`` (the commit of its last
        applied record) is done, at most ``timeout`` seconds (then
        ``TimeoutError``); the caller reads right after, without awaiting."""
        loop = asyncio.get_running_loop()
        gate = self.closed.get(group)
        if gate is None:
            gate = self.closed[group] = loop.create_future()
        self._readers[group] = self._readers.get(group, 0) + 1
        committed.add_done_callback(outcome_seen)  # (a read that timed out left it)
        try:
            await asyncio.wait_for(asyncio.shield(committed), timeout)
        finally:
            self._readers[group] -= 1
            if not self._readers[group]:
                # On the next turn: every reader this commit woke reads first.
                loop.call_soon(self._open, group, gate)

    def _open(self, group: int, gate: asyncio.Future[None]) -> None:
        if self._readers.get(group):
            return  # a reader came meanwhile: it opens the gate after it
        self._readers.pop(group, None)
        if self.closed.get(group) is gate:
            del self.closed[group]
        if not gate.done():
            gate.set_result(None)

    async def opened(self, groups: Iterable[int]) -> None:
        """Return once none of ``groups`` has its gate closed (the caller
        then applies its writes without awaiting anything else)."""
        while True:
            closed = [self.closed[g] for g in groups if g in self.closed]
            if not closed:
                return
            await asyncio.wait(closed)
