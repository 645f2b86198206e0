"""Pacing the event loop while many clients' requests flow.

An event loop that is quicker than its clients blocks in ``epoll_wait``
after almost every request, and every client ``send`` then has to wake it:
a cross-CPU wake-up, paid inside the client's system call (on a virtual
machine whose idle vCPUs halt at once, a few microseconds each).  When a
pass of the loop answers only a small share of the connections active in
the last second (so most clients are busy elsewhere, not waiting for this
server), :class:`LoopPacer` ends the pass with a short timed sleep: the
next requests gather meanwhile without waking anyone, and the next pass
takes them together.  This is the interrupt moderation of network cards,
done by the loop.

The first request of a pass that a native lane (``_lanes.pyx``) answers or
hands over calls :meth:`LoopPacer.wake` (a C flag says whether to), which
queues one callback: it runs after the pass's other callbacks already
queued, the engine's commit of the pass among them, so the pause delays no
reply of that pass.  A pass that answered fewer than two requests, or more
than half of the active connections' (they are waiting for this server: a
pause would only delay them), or :data:`BUSY_REQUESTS` or more (the loop
has work enough), does not pause.  The pacer never spins and keeps no
timer: idle, the loop blocks in its poll as before, and with fewer than
:data:`MIN_CONNECTIONS` active connections the lanes do not even call it.
What it costs is latency, at most ``pause`` a request, and only while many
clients are in flight.
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
        #: Connections active in the last second, over every server.
        self.active = 0
        #: The lanes' requests counted when the last pass was judged.
        self._counted = 0
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
        self._counted = self._total()
        self._arm()

    def set_active(self, server: object, connections: int) -> None:
        """How many of ``server``'s connections were active in the last second."""
        self._active[id(server)] = connections
        was = self.active
        self.active = sum(self._active.values())
        if (was >= MIN_CONNECTIONS) != (self.active >= MIN_CONNECTIONS):
            self._counted = self._total()  # what passed unwatched is not one pass
            self._arm()

    def wake(self) -> None:
        """The first lane request of a pass: judge the pass once its
        callbacks have run."""
        for counts in self._counts:
            counts.armed = False
        self._loop.call_soon(self._after_pass)

    def _arm(self) -> None:
        armed = self.active >= MIN_CONNECTIONS
        for counts in self._counts:
            counts.armed = armed

    def _total(self) -> int:
        return sum(c.write_ok + c.read_ok + c.submit_ok for c in self._counts)

    def _after_pass(self) -> None:
        total = self._total()
        answered, self._counted = total - self._counted, total
        if 2 <= answered < self.busy and answered * 2 <= self.active:
            self.pauses += 1
            time.sleep(self.pause)
        self._arm()


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
