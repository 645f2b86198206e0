"""Clients blocked in ``BZPOPMIN``, ``BZPOPMAX`` and ``BZMPOP``: who waits on
which board, in which order they are woken, and their timeouts read as
Redis 7.2 reads them.

Each board keeps its waiters in arrival order.  A commit that changes a
board (any front-end, a cluster's log, an expiry) marks it ready; once the
commit's listeners have run, the first waiter of every ready board is
woken, those woken together in the order they blocked (one commit can fill
several boards: an ``EXEC``, a store).  A woken waiter runs its command
again (as Redis 7.2 does: it pops from the first of *its* keys with
members), or waits on in its place; when it leaves, popped or gone, the
next waiter of each of its boards is woken in turn.  So a board's clients
are served in arrival order, and a client blocked on several boards by
whichever gets members first.

A waiter is woken only by its boards, its timer and its connection closing
or its client's EOF (``RespConnection.unblock``; it then leaves, as Redis
frees a client that closes while blocked): no polling, and nothing of it stays behind
once its command ends.  A connection runs one command at a time (what it
pipelined after waits behind it, as in Redis), so each connection has at
most one waiter, and the server at most its connection cap
(``--max-connections``).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import math
import time
import weakref
from collections.abc import Awaitable, Callable
from decimal import Decimal
from fractions import Fraction
from typing import TYPE_CHECKING, Any, TypeVar

from rankd.frontends.resp.arguments import (
    _C_SPACE,
    _DECIMAL,
    _HEXADECIMAL,
    _INFINITY,
    CommandError,
)

if TYPE_CHECKING:
    from rankd.engine.engine import Engine

_arrivals = itertools.count()
T = TypeVar("T")


class Waiter:
    """One blocked command: its boards, and what wakes it."""

    __slots__ = ("arrival", "event", "names", "timed_out", "timer")

    def __init__(self, names: list[str]) -> None:
        self.names = list(dict.fromkeys(names))  # a key named twice waits once
        self.arrival = next(_arrivals)
        self.event = asyncio.Event()
        self.timed_out = False
        self.timer: asyncio.TimerHandle | None = None

    def time_out(self) -> None:
        self.timed_out = True
        self.event.set()


class Blocked:
    """The waiters of one engine, per board in arrival order (see the
    module docstring); ``Engine.listeners`` tells it which boards changed."""

    def __init__(self, engine: Engine) -> None:
        self.queues: dict[str, collections.deque[Waiter]] = {}
        self.waiters: set[Waiter] = set()
        #: Boards changed since the last wake-up, and whether one is due.
        self.ready: dict[str, None] = {}
        self.due = False
        engine.listeners.append(self.changed)

    def __len__(self) -> int:
        """The clients blocked (``INFO``'s ``blocked_clients``)."""
        return len(self.waiters)

    def changed(self, name: str) -> None:
        if name not in self.queues:
            return
        self.ready[name] = None
        if self.due:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # (no loop: nothing can be waiting on one)
            self.wake()
            return
        self.due = True
        loop.call_soon(self.wake)  # after the rest of the commit's boards

    def wake(self) -> None:
        """Wake the first waiter of every ready board, oldest first."""
        self.due = False
        ready, self.ready = self.ready, {}
        first = {queue[0] for queue in map(self.queues.get, ready) if queue}
        for waiter in sorted(first, key=lambda waiter: waiter.arrival):
            waiter.event.set()

    def add(self, waiter: Waiter) -> None:
        self.waiters.add(waiter)
        for name in waiter.names:
            self.queues.setdefault(name, collections.deque()).append(waiter)

    def remove(self, waiter: Waiter) -> None:
        """Take a waiter out; the next on each of its boards looks again
        (the board may have members it left)."""
        self.waiters.discard(waiter)
        for name in waiter.names:
            queue = self.queues.get(name)
            if queue is None or waiter not in queue:
                continue
            queue.remove(waiter)
            if queue:
                self.changed(name)
            else:
                del self.queues[name]


_blocked: weakref.WeakKeyDictionary[Any, Blocked] = weakref.WeakKeyDictionary()


def blocked(engine: Engine) -> Blocked:
    """The engine's :class:`Blocked` (made on first use)."""
    found = _blocked.get(engine)
    if found is None:
        found = _blocked[engine] = Blocked(engine)
    return found


async def wait(conn: Any, names: list[str], deadline: float | None,
               attempt: Callable[[], Awaitable[T | None]]) -> T | None:
    """Wait on boards ``names`` until ``attempt()`` gives something (not
    None), at most until ``deadline`` (loop time; None: no limit); None at
    the deadline or when the connection closes."""
    waiter = Waiter(names)
    waiters = blocked(conn.service.engine)
    waiters.add(waiter)
    if deadline is not None:
        waiter.timer = asyncio.get_running_loop().call_at(deadline, waiter.time_out)
    try:
        while not conn.closing:
            # Only while it waits: a pop under way finishes (its member is
            # answered) before a closing server closes the connection.
            conn.unblock = waiter.event.set
            await waiter.event.wait()
            conn.unblock = None
            waiter.event.clear()
            if conn.closing or conn.ended or waiter.timed_out:
                return None
            found = await attempt()
            if found is not None:
                return found
        return None
    finally:
        conn.unblock = None
        if waiter.timer is not None:
            waiter.timer.cancel()
        waiters.remove(waiter)


# --- timeouts ------------------------------------------------------------------------

#: Redis's ``MAX_LONG_DOUBLE_CHARS``: ``string2ld`` reads less than this.
MAX_LONG_DOUBLE_CHARS = 5 * 1024
_LLONG_MAX = 2**63 - 1
#: An x87 long double: 64 significant bits; past 2**16384 it overflows, and
#: below half its least subnormal (2**-16446) a value reads as 0.
_SIGNIFICAND = 64
_OVERFLOW_BITS = 16384
_ZERO_BITS = -16446
NOT_FLOAT = "ERR timeout is not a float or out of range"
NEGATIVE = "ERR timeout is negative"
OUT_OF_RANGE = "ERR timeout is out of range"


def _extended(value: Fraction) -> Fraction:
    """``value`` rounded to a long double's 64 significant bits (to nearest,
    ties to even), as ``strtold`` and the x87's multiplication round."""
    if not value:
        return value
    sign = -1 if value < 0 else 1
    magnitude = abs(value)
    exponent = magnitude.numerator.bit_length() - magnitude.denominator.bit_length()
    if Fraction(2) ** exponent > magnitude:
        exponent -= 1
    shift = _SIGNIFICAND - 1 - exponent  # the significand as a 64-bit integer
    scaled = magnitude * Fraction(2) ** shift
    whole, rest = divmod(scaled.numerator, scaled.denominator)
    if 2 * rest > scaled.denominator or (2 * rest == scaled.denominator and whole & 1):
        whole += 1
    return sign * Fraction(whole) / Fraction(2) ** shift


def _strtold(word: bytes) -> Fraction | float | None:
    """What ``string2ld`` reads from all of ``word``: its exact value as a
    long double (a Fraction, or an infinity), None where Redis refuses it
    (blanks, other characters, NaN, overflow, underflow to zero)."""
    if not word or len(word) >= MAX_LONG_DOUBLE_CHARS or word[0] in _C_SPACE:
        return None
    if _DECIMAL.fullmatch(word):
        number = Decimal(word.decode())
        if not number:
            return Fraction(0)
        # Decided without building 10**exponent for an exponent of millions.
        bits = (number.adjusted() + 1) * math.log2(10)
        if not _ZERO_BITS - 8 < bits < _OVERFLOW_BITS + 8:
            return None
        exact = Fraction(number)
    elif found := _HEXADECIMAL.fullmatch(word):
        sign, digits, power = found.groups()
        whole, _, fraction = digits.partition(b".")
        mantissa = int((whole + fraction) or b"0", 16)
        if not mantissa:
            return Fraction(0)
        exponent = int(power or b"0") - 4 * len(fraction)
        bits = mantissa.bit_length() + exponent
        if not _ZERO_BITS - 8 < bits < _OVERFLOW_BITS + 8:
            return None
        exact = Fraction(mantissa) * Fraction(2) ** exponent * (-1 if sign == b"-" else 1)
    elif found := _INFINITY.fullmatch(word):
        return -math.inf if found.group(1) == b"-" else math.inf
    else:  # NaN, or not a number
        return None
    if abs(exact) <= Fraction(2) ** _ZERO_BITS:  # rounds to 0: out of range (ERANGE)
        return None
    value = _extended(exact)
    if abs(value) >= Fraction(2) ** _OVERFLOW_BITS:  # rounds past the largest: likewise
        return None
    return value


def timeout(word: bytes, now_ms: int | None = None) -> int:
    """A blocking command's timeout in milliseconds (0: none), as Redis
    7.2's ``getTimeoutFromObjectOrReply`` reads seconds: a long double times
    1000, rounded up to a whole millisecond; Redis's errors for what is not
    a number, negative, or past what a 64-bit deadline holds (``now_ms``:
    the time of day, for that last bound)."""
    seconds = _strtold(word)
    if seconds is None:
        raise CommandError(NOT_FLOAT)
    infinite = isinstance(seconds, float)
    milliseconds = seconds if infinite else _extended(seconds * 1000)
    if milliseconds > _LLONG_MAX:
        raise CommandError(OUT_OF_RANGE)
    # ceill, then a cast to long long: -inf and values below its range come
    # out as LLONG_MIN (what the x86 conversion gives), negative either way.
    whole = -1 if infinite else math.ceil(milliseconds)
    if whole < 0:
        raise CommandError(NEGATIVE)
    if whole and whole > _LLONG_MAX - (time.time_ns() // 1_000_000 if now_ms is None
                                       else now_ms):
        raise CommandError(OUT_OF_RANGE)
    return whole
