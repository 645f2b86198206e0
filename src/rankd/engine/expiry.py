"""Board expiry: deadlines, as Redis's ``EXPIRE`` keeps them for keys.

A board may carry a deadline, ``Board.expires_at`` (milliseconds since the
epoch).  Setting or clearing it is a logged record (``records.EXPIRE``);
deleting the board once it passed is another (``records.EXPIRED``),
written by the node that writes the board (the single node, or its
group's primary on a cluster), so the deletion happens at one log
position, the same instant, on every node.  Between the deadline and that
record the board is shown nowhere: every read answers as if it were
absent (as a Redis replica does for a key whose expiry its primary has
not sent yet), and a write first logs the deletion, then applies to a
board made anew (as Redis does for a write to an expired key).

:class:`Deadlines` finds the boards due without looking at the others: a
heap of ``(deadline, name)``.  Entries are never removed when a deadline
changes or its board goes; one is checked against the board when it comes
up (``Board.expires_at`` must still be its deadline), and the heap is
rebuilt when stale entries outnumber live ones.

The engine's native paths (packed writes, packed reads) never read the
clock: they leave the boards whose deadline is less than
:data:`MARGIN_MS` away (the set :attr:`Deadlines.expiring`, which they
check) to the general paths, which compare deadlines with the clock.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable

from rankd.engine.errors import InvalidInput

#: Boards whose deadline is closer than this go the general paths (which
#: read the clock) instead of the native ones (which do not).
MARGIN_MS = 2_000
#: How soon a node that cannot delete a due board yet (a cluster node that
#: does not write its group, a board a snapshot holds) looks again.
RETRY_MS = 1_000
#: Boards deleted in one step of the expiry task (one log append), before
#: the event loop serves others.
STEP = 256
#: The latest deadline a board may have: the year 9999 (Redis takes any
#: 64-bit time; JSON, Postgres and people do better with this).
MAX_DEADLINE_MS = 253_402_300_799_999
#: The config field REST shows and sets a board's deadline with.
FIELD = "expires_at_ms"

#: Conditions of a deadline change (Redis's ``EXPIRE`` options): ``NX``
#: only if the board has no deadline, ``XX`` only if it has one, ``GT``
#: only later than its deadline, ``LT`` only sooner (no deadline counts as
#: infinitely far).
IF_NONE = 1
IF_SET = 2
IF_LATER = 4
IF_SOONER = 8


def allowed(current: int | None, deadline: int | None, condition: int) -> bool:
    """Whether a board whose deadline is ``current`` takes ``deadline``
    under ``condition``, as Redis decides it (``expireGenericCommand``);
    clearing it (None, ``PERSIST``) only if it has one."""
    if deadline is None:
        return current is not None
    if condition & IF_NONE and current is not None:
        return False
    if condition & IF_SET and current is None:
        return False
    if condition & IF_LATER and (current is None or deadline <= current):
        return False
    return not (condition & IF_SOONER and current is not None and deadline >= current)


def deadline_of(data: object) -> tuple[bool, int | None]:
    """The deadline a board config given as JSON-like data sets:
    ``(given, deadline)``; ``given`` False when the field is absent."""
    if not isinstance(data, dict) or FIELD not in data:
        return False, None
    value = data[FIELD]
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # JSON's 1.0 is the integer 1
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or not 0 <= value <= MAX_DEADLINE_MS):
        raise InvalidInput(f"{FIELD} must be null or an integer of milliseconds since "
                           f"1970 (UTC) from 0 to {MAX_DEADLINE_MS}")
    return True, value


def without_deadline(data: object) -> object:
    """A board config given as JSON-like data without its deadline field
    (what :class:`rankd.engine.config.BoardConfig` reads)."""
    if isinstance(data, dict) and FIELD in data:
        return {key: value for key, value in data.items() if key != FIELD}
    return data


class Deadlines:
    """The boards' deadlines, earliest first (see the module docstring)."""

    def __init__(self) -> None:
        #: ``(deadline, name)`` of deadlines more than MARGIN_MS away when
        #: set; some stale.
        self._heap: list[tuple[int, str]] = []
        #: ``(deadline, name)`` of the boards in :attr:`expiring`; some stale.
        self._soon: list[tuple[int, str]] = []
        #: ``(when, deadline, name)``: due boards looked at again later.
        self._later: list[tuple[int, int, str]] = []
        #: Names of boards whose deadline is less than MARGIN_MS away (or
        #: past): the native paths leave them to the general ones.  The same
        #: set for the life of the engine (the native paths hold it).
        self.expiring: set[str] = set()
        #: How many boards have a deadline (to know when to compact).
        self.live = 0

    def set(self, name: str, deadline: int | None, before: int | None, now_ms: int) -> None:
        """Board ``name``'s deadline changed from ``before`` to ``deadline``."""
        self.live += (deadline is not None) - (before is not None)
        self.expiring.discard(name)
        if deadline is None:
            return
        if deadline - MARGIN_MS <= now_ms:
            self.expiring.add(name)
            heapq.heappush(self._soon, (deadline, name))
        else:
            heapq.heappush(self._heap, (deadline, name))

    def forget(self, name: str, before: int | None) -> None:
        """Board ``name`` is gone (it had deadline ``before``)."""
        if before is not None:
            self.live -= 1
        self.expiring.discard(name)

    def clear(self) -> None:
        """Forget everything (the boards are replaced whole)."""
        self._heap.clear()
        self._soon.clear()
        self._later.clear()
        self.expiring.clear()
        self.live = 0

    def rebuild(self, deadlines: Iterable[tuple[str, int]], now_ms: int) -> None:
        """Start again from every board's ``(name, deadline)``."""
        self.clear()
        for name, deadline in deadlines:
            self.set(name, deadline, None, now_ms)

    def compact(self, current: Callable[[str], int | None]) -> None:
        """Drop stale entries once they outnumber live ones (deadlines set
        again and again), looking at the entries only, never the boards."""
        if len(self._heap) + len(self._soon) <= 2 * self.live + 1024:
            return
        for heap in (self._heap, self._soon):
            heap[:] = [entry for entry in heap if current(entry[1]) == entry[0]]
            heapq.heapify(heap)

    def due(self, now_ms: int, current: Callable[[str], int | None]) -> list[tuple[str, int]]:
        """Boards whose deadline passed, ``(name, deadline)``, at most
        :data:`STEP`; marks those less than MARGIN_MS away as expiring.
        ``current(name)``: the board's deadline now (None: none, or no board)."""
        heap, soon, later = self._heap, self._soon, self._later
        moved = 0
        while heap and heap[0][0] - MARGIN_MS <= now_ms and moved < STEP:
            deadline, name = heapq.heappop(heap)
            if current(name) == deadline:  # (else stale: changed, or the board went)
                self.expiring.add(name)
                heapq.heappush(soon, (deadline, name))
                moved += 1
        found: list[tuple[str, int]] = []
        while later and later[0][0] <= now_ms and len(found) < STEP:
            _, deadline, name = heapq.heappop(later)
            if current(name) == deadline:
                found.append((name, deadline))
        while soon and soon[0][0] <= now_ms and len(found) < STEP:
            deadline, name = heapq.heappop(soon)
            if current(name) == deadline:
                found.append((name, deadline))
        return found

    def retry(self, name: str, deadline: int, now_ms: int) -> None:
        """A due board that could not be deleted now: look again later."""
        heapq.heappush(self._later, (now_ms + RETRY_MS, deadline, name))

    def next_ms(self) -> int | None:
        """When :meth:`due` has something to do next (None: nothing set)."""
        times = []
        if self._heap:
            times.append(self._heap[0][0] - MARGIN_MS)
        if self._soon:
            times.append(self._soon[0][0])
        if self._later:
            times.append(self._later[0][0])
        return min(times) if times else None
