"""The cut-over of a group move, as its writers see it: held, not refused, and timed.

A move's cut-over (:mod:`rankd.cluster.moves`) closes the group's writes on
the source, flushes them, hands the register over in one transaction, and
the target opens.  Refusing the writes that come meanwhile (``503`` /
``TRYAGAIN``) made every client wait its own retry delay on top of the
cut-over itself, and a write that reached a node whose view of the group
was a moment old came back ``not_primary``.  Instead, while a group is
closed on a node, its writes **wait** at :class:`Gates` (bounded by
:data:`HOLD_SECONDS`) until the gate opens:

* on the source, once the target says it holds the group's writes in
  turn (its ``holding`` notification, sent as soon as it is told of the
  hand-over, so the writes travel while it opens), or the hand-over
  failed (writes go on there):
  a held write then finds the group written elsewhere and is sent on as
  any write is (REST forwards it one hop; TCP and RESP answer ``moved``
  naming the target);
* on the target, from the moment it is told of the hand-over to the
  moment it writes the group: a write that reached it (sent on by the
  source, or by a client that already learnt the new primary) is applied
  there rather than answered ``not_primary``.

A gate only delays; whether a write applies is decided after it opens, by
the same checks as always (the register's epoch fences every earlier
writer: safety never comes from these timings).

:class:`Phases` times each step of one cut-over on one node (monotonic
durations and the wall-clock moments the other nodes' steps are compared
with); the nodes log them, ``/metrics`` shows the last ones, and
``bench/bench_moves.py`` prints the breakdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

#: The longest a write waits at a closed group before it is answered as
#: the group stands then (refused on the source, sent on to the target).
HOLD_SECONDS = 2.0


class Gates:
    """Groups whose writes wait on this node, each until its gate opens."""

    def __init__(self) -> None:
        self._closed: dict[int, asyncio.Future[None]] = {}
        #: Writes that waited, and the longest wait (seconds).
        self.held = 0
        self.longest = 0.0

    def close(self, group: int) -> None:
        """Make ``group``'s writes wait from now on (until :meth:`open`)."""
        if group not in self._closed:
            self._closed[group] = asyncio.get_running_loop().create_future()

    def open(self, group: int) -> None:
        """Let ``group``'s waiting writes go on (a no-op if it is open)."""
        gate = self._closed.pop(group, None)
        if gate is not None and not gate.done():
            gate.set_result(None)

    def closed(self, group: int) -> bool:
        return group in self._closed

    def __bool__(self) -> bool:
        """Whether any group is closed (the writes' fast path asks only this)."""
        return bool(self._closed)

    async def wait_all(self, groups: set[int]) -> None:
        """Wait while any of ``groups`` is closed (each at most :data:`HOLD_SECONDS`)."""
        for group in groups:
            if group in self._closed:
                await self.wait(group)

    async def wait(self, group: int) -> None:
        """Wait while ``group`` is closed, at most :data:`HOLD_SECONDS`."""
        gate = self._closed.get(group)
        if gate is None:
            return
        started = time.monotonic()
        self.held += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(gate), HOLD_SECONDS)
        self.longest = max(self.longest, time.monotonic() - started)


@dataclass
class Phases:
    """The steps of one cut-over on one node: each step's duration (ms), in order."""

    #: Wall-clock time (``time.time()``) the cut-over began on this node.
    began_at: float = field(default_factory=time.time)
    _mark: float = field(default_factory=time.monotonic)
    steps: dict[str, float] = field(default_factory=dict)

    def step(self, name: str) -> None:
        """The step ``name`` ends now (it began where the last one ended)."""
        now = time.monotonic()
        self.steps[name] = round((now - self._mark) * 1000, 1)
        self._mark = now

    @property
    def total_ms(self) -> float:
        return round(sum(self.steps.values()), 1)

    def text(self) -> str:
        """``"flush 1.2 ms, hand-over 4.0 ms"``: how the nodes log it."""
        return ", ".join(f"{name} {ms:.1f} ms" for name, ms in self.steps.items())
