"""Pacing the event loop while many clients' requests flow.

An event loop that is quicker than its clients blocks in ``epoll_wait``
after almost every request, and every client ``send`` then has to wake it:
a cross-CPU wake-up, paid inside the client's system call (on a virtual
machine whose idle vCPUs halt at once, a few microseconds each).  While
the loop's passes each find only a small share of the connections active
in the last second (so most clients are busy elsewhere, not waiting for
this server), :class:`LoopPacer` ends each pass with a short timed sleep
instead: requests gather meanwhile without waking anyone, and the next
pass takes them together.  This is the interrupt moderation of network
cards, done by the loop.

It never spins and costs nothing idle: a pass that finds fewer than two
requests, or most of the active connections' (they are waiting for this
server: a pause would only delay them), sends the loop back to block in
its poll as before, and the pacer waits (no timer) for a lane's next
request.  With fewer than :data:`MIN_CONNECTIONS` active connections it is
not even called.  A pass with :data:`BUSY_REQUESTS` requests or more does
not sleep either: the loop has work enough.  What it costs is latency, at
most ``pause`` a request, and only while many clients are in flight.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import sys
import time
from typing import Any

log = logging.getLogger(__name__)

#: Connections active in the last second below which the loop is not paced.
MIN_CONNECTIONS = 4
#: A pass with this many requests does not sleep.
BUSY_REQUESTS = 64
#: PR_SET_TIMERSLACK (linux/prctl.h).
_PR_SET_TIMERSLACK = 29


class LoopPacer:
    """Paces one event loop for the native lanes of its pipelined servers."""

    def __init__(self, pause_seconds: float, busy: int = BUSY_REQUESTS) -> None:
        if pause_seconds <= 0:
            raise ValueError("a pacer's pause must be positive")
        self.pause = pause_seconds
        self.busy = busy
        self._counts: list[Any] = []
        self._active: dict[int, int] = {}
        self.active = 0
        self._watching = False
        self._handled = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        #: Passes that ended with a pause, for metrics and benchmarks.
        self.pauses = 0

    def attach(self, counts: Any) -> None:
        """Pace for the lanes counting into ``counts`` (a ``LaneCounts``);
        called in the loop's thread."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            _tighten_timer_slack()
        counts.wake = self.wake
        self._counts.append(counts)
        self._arm()

    def set_active(self, server: object, connections: int) -> None:
        """How many of ``server``'s connections were active in the last second."""
        self._active[id(server)] = connections
        self.active = sum(self._active.values())
        if not self._watching:
            self._arm()

    def wake(self) -> None:
        """A lane's request while armed: watch the passes from this one."""
        self._watching = True
        for counts in self._counts:
            counts.armed = False
        self._handled = self._total()
        self._loop.call_soon(self._after_pass)

    def _arm(self) -> None:
        armed = self.active >= MIN_CONNECTIONS
        for counts in self._counts:
            counts.armed = armed

    def _total(self) -> int:
        return sum(c.write_ok + c.read_ok + c.submit_ok for c in self._counts)

    def _after_pass(self) -> None:
        total = self._total()
        handled, self._handled = total - self._handled, total
        if handled < 2 or handled * 2 > self.active:
            self._watching = False  # block in the poll again
            self._arm()
            return
        if handled < self.busy:
            self.pauses += 1
            time.sleep(self.pause)
        self._loop.call_soon(self._after_pass)


def _tighten_timer_slack() -> None:
    """Let the loop's thread sleep to the microsecond: Linux rounds a
    normal thread's timed sleeps up by 50 us (its timer slack)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        if libc.prctl(_PR_SET_TIMERSLACK, 1000, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_TIMERSLACK)")
    except (OSError, AttributeError) as exc:
        log.debug("the loop's timer slack stays as it was: %s", exc)
