"""The loop watchdog: how long callbacks hold the event loop, and who held it.

The daemon serves every front-end from one event loop, so one callback that
runs long (a parser that does not advance, an exponential glob, a huge
reply built at once) stops every client.  The daemon runs on uvloop, which
has no slow-callback hook, so the watchdog measures from outside:

* a *heartbeat* callback runs on the loop every :data:`INTERVAL` seconds
  and notes how late it ran: that is how long the callbacks queued before
  it held the loop.  Each lateness goes into the ``rankd_loop_stall_seconds``
  histogram, and one over :data:`THRESHOLD` is logged as a warning when
  the loop is free again;
* a *watcher* thread looks at the heartbeat; when it is late by more than
  half the threshold it samples the loop thread's stack
  (``sys._current_frames()``) and the :data:`ACTIVITY` marker, which the
  warning then names.  A loop held for good (a parser that never returns)
  cannot log anything itself: the watcher logs it, after
  :data:`STUCK_SECONDS` and again at doubling intervals.

:data:`ACTIVITY` is what the front-ends set per request, with plain
attribute assignments (``ACTIVITY.frontend = "resp"; ACTIVITY.command =
name``): nothing on the hot path but two stores.  The heartbeat clears it,
so a marker the watchdog reads was set since the last beat, never left over
from an earlier request; where no front-end set one, the front-end is told
from the sampled stack (which module of ``rankd.frontends`` is running).

The watcher needs the GIL to sample: a callback stuck in native code that
holds the GIL is measured (by the heartbeat, once it returns) and logged
without a stack.

A warning also says where the time went (:class:`CpuSplit`, read every
:data:`CPU_EVERY` beats: the window a warning covers begins up to that
many beats before the stall): the CPU the loop's thread used, that of the
process's other threads, and how often the loop's thread waited (a voluntary context
switch: I/O, a lock, the GIL) or lost its core (an involuntary one).  A
loop thread that computed all along is a long callback; one that barely
ran while other threads did waited for the GIL (a worker thread's
CPU-bound work: uvloop takes the GIL again for every libuv callback); one
that barely ran and was preempted often waited for a core (the machine's
cores busy elsewhere); one that waited often without others running was
blocked (a write the kernel throttled, say).
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import NamedTuple

try:
    import resource
except ImportError:  # (not on Windows: no context switches counted)
    resource = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

#: Seconds between heartbeats.
INTERVAL = 0.010
#: A heartbeat later than this is a stall: logged as a warning.
THRESHOLD = 0.100
#: The watcher logs a loop held this long while it is still held.
STUCK_SECONDS = 1.0
#: Seconds between the watcher's looks at the heartbeat.
WATCH_PERIOD = 0.050
#: Beats between two readings of the CPU a stall's warning splits (see CpuSplit).
CPU_EVERY = 5
#: Upper bounds of the histogram's buckets, in seconds.
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
           30.0)
#: The rankd frames of a sampled stack shown in the warning.
STACK_FRAMES = 8

_PACKAGE = str(Path(__file__).resolve().parent)
#: Which front-end a module of ``rankd/frontends`` serves.
_FRONTENDS = (("frontends/resp/", "resp"), ("frontends/tcp", "tcp"),
              ("frontends/live", "live"), ("frontends/rest", "http"),
              ("frontends/forwarding", "http"), ("frontends/service", "service"))


class Activity:
    """What the loop is doing now, as a front-end last said: set with plain
    attribute stores per request (no call, no allocation)."""

    __slots__ = ("command", "frontend")

    def __init__(self) -> None:
        #: ``"resp"``, ``"tcp"``, ``"http"``, ``"live"``, or None.
        self.frontend: str | None = None
        #: The command or operation being answered (a constant string), or None.
        self.command: str | None = None

    def clear(self) -> None:
        self.frontend = self.command = None


#: The one marker of the process (the daemon runs one loop).
ACTIVITY = Activity()


class StallHistogram:
    """A cumulative-bucket histogram of plain numbers (observed on the loop,
    read by the metrics collector at scrape time)."""

    def __init__(self, bounds: tuple[float, ...] = BUCKETS) -> None:
        self.bounds = bounds
        #: Observations per bucket (not cumulative); the last is +Inf.
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self.sum += seconds

    @property
    def count(self) -> int:
        return sum(self.counts)

    def buckets(self) -> list[tuple[str, int]]:
        """``(upper bound, cumulative count)`` pairs, as Prometheus exposes them."""
        out, total = [], 0
        for bound, count in zip((*map(str, self.bounds), "+Inf"), self.counts, strict=True):
            total += count
            out.append((bound, total))
        return out


class Sample:
    """What the watcher saw while the loop was held."""

    __slots__ = ("beat", "command", "frontend", "stack")

    def __init__(self, beat: int, frontend: str | None, command: str | None,
                 stack: list[str]) -> None:
        self.beat = beat
        self.frontend = frontend
        self.command = command
        self.stack = stack

    def describe(self) -> str:
        """``front-end resp, command keys, at protocol.py:120 in _feed < ...``."""
        return describe(self.frontend, self.command, self.stack)


def describe(frontend: str | None, command: str | None, stack: list[str]) -> str:
    parts = [f"front-end {frontend or 'unknown'}", f"command {command or 'unknown'}"]
    if stack:
        parts.append("at " + " < ".join(stack))
    return ", ".join(parts)


def rankd_stack(frame: FrameType | None, limit: int = STACK_FRAMES
                ) -> tuple[list[str], str | None]:
    """The innermost ``limit`` frames of rankd code in ``frame``'s stack,
    as ``file:line in function``, and the front-end its outermost
    ``rankd/frontends`` frame belongs to."""
    shown: list[str] = []
    frontend = None
    while frame is not None:
        path = frame.f_code.co_filename
        if path.startswith(_PACKAGE):
            relative = path[len(_PACKAGE) + 1:]
            if len(shown) < limit:
                shown.append(f"{relative}:{frame.f_lineno} in {frame.f_code.co_name}")
            for prefix, name in _FRONTENDS:
                if relative.startswith(prefix):
                    frontend = name  # the outermost wins: the one that called the rest
                    break
        frame = frame.f_back
    return shown, frontend


_RUSAGE_THREAD = getattr(resource, "RUSAGE_THREAD", None) if resource else None


def _thread_usage() -> tuple[float, int, int]:
    """The calling thread's CPU seconds and ``(voluntary, involuntary)``
    context switches so far (one system call: this runs every beat)."""
    if _RUSAGE_THREAD is None:
        return time.thread_time(), 0, 0
    usage = resource.getrusage(_RUSAGE_THREAD)
    return usage.ru_utime + usage.ru_stime, usage.ru_nvcsw, usage.ru_nivcsw


class CpuSplit:
    """CPU time used since the last heartbeat was scheduled, by the loop's
    thread and by the process's other threads, and the loop thread's
    context switches (read on the loop's thread)."""

    __slots__ = ("at", "process", "thread")

    def __init__(self) -> None:
        self.at = time.monotonic()
        self.thread = _thread_usage()
        self.process = time.process_time()

    def since(self) -> CpuUse:
        """What was used since this was made."""
        cpu, voluntary, involuntary = _thread_usage()
        thread = cpu - self.thread[0]
        return CpuUse(time.monotonic() - self.at, thread,
                      max(0.0, time.process_time() - self.process - thread),
                      voluntary - self.thread[1], involuntary - self.thread[2])


class CpuUse(NamedTuple):
    """Where a stall's time went: over ``window`` seconds, the CPU seconds
    of the loop's thread and of the process's other threads, and the loop
    thread's voluntary (it waited: I/O, a lock, the GIL) and involuntary
    (its core was taken) context switches."""

    window: float
    loop_cpu: float
    others_cpu: float
    waited: int
    preempted: int

    def text(self) -> str:
        """The split as a stall's warning says it."""
        return (f"in the last {self.window * 1000:.0f} ms: CPU {self.loop_cpu * 1000:.0f} ms "
                f"in the loop's thread, {self.others_cpu * 1000:.0f} ms in others; the loop's "
                f"thread waited {self.waited} times, was preempted {self.preempted} times")

    def fields(self) -> dict[str, float]:
        """The split as a stall's structured log fields."""
        return {"loop_cpu_seconds": round(self.loop_cpu, 4),
                "other_threads_cpu_seconds": round(self.others_cpu, 4),
                "loop_waits": self.waited, "loop_preemptions": self.preempted}


class LoopWatchdog:
    """Heartbeat on one event loop plus the watcher thread (see the module)."""

    def __init__(self, *, interval: float = INTERVAL, threshold: float = THRESHOLD,
                 stuck_seconds: float = STUCK_SECONDS, watch_period: float = WATCH_PERIOD,
                 activity: Activity = ACTIVITY) -> None:
        if not 0 < interval < threshold:
            raise ValueError("the heartbeat interval must be positive and below the threshold")
        self.interval = interval
        self.threshold = threshold
        self.stuck_seconds = stuck_seconds
        self.watch_period = watch_period
        self.activity = activity
        self.histogram = StallHistogram()
        #: Stalls over the threshold seen so far.
        self.stalls = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._handle: asyncio.TimerHandle | None = None
        #: When the next heartbeat is due (time.monotonic()), and its number.
        self._due = 0.0
        self._beat_number = 0
        self._sample: Sample | None = None
        self._cpu = CpuSplit()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Start beating on ``loop`` (the running one by default), and watching."""
        self._loop = loop or asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._schedule()
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch, name="rankd-loop-watchdog",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop beating and watching (waits for the watcher thread)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _schedule(self) -> None:
        self._due = time.monotonic() + self.interval
        if self._beat_number % CPU_EVERY == 0:  # (a few system calls: not every beat)
            self._cpu = CpuSplit()
        self._handle = self._loop.call_later(self.interval, self._beat)  # type: ignore[union-attr]

    def _beat(self) -> None:
        late = time.monotonic() - self._due
        if late < 0:
            late = 0.0  # the loop's clock has millisecond steps
        self.histogram.observe(late)
        if late > self.threshold:
            self._stalled(late, self._cpu.since())
        self._beat_number += 1
        self.activity.clear()
        self._schedule()

    def _stalled(self, late: float, cpu: CpuUse) -> None:
        self.stalls += 1
        sample = self._sample
        if sample is not None and sample.beat == self._beat_number:
            where = sample.describe()
        else:  # not sampled (the watcher had no GIL): the marker alone
            where = describe(self.activity.frontend, self.activity.command, [])
        log.warning("event loop held for %.3f s (over %g s; %s): %s", late,
                    self.threshold, cpu.text(), where,
                    extra={"fields": {"stall_seconds": round(late, 4), **cpu.fields()}})

    def _watch(self) -> None:
        """The watcher thread: sample a late heartbeat, log a loop held for good."""
        next_report = self.stuck_seconds
        sampled = -1
        while not self._stop.wait(self.watch_period):
            late = time.monotonic() - self._due
            beat = self._beat_number
            if late <= self.threshold / 2:
                next_report = self.stuck_seconds
                continue
            if sampled != beat:
                sampled = beat
                self._sample = self.sample(beat)
            if late >= next_report:
                self._sample = self.sample(beat)  # where it is now
                log.warning("event loop held for %.1f s so far, and still held: %s", late,
                            self._sample.describe(),
                            extra={"fields": {"stall_seconds": round(late, 1)}})
                next_report *= 2

    def sample(self, beat: int) -> Sample:
        """The loop thread's stack and marker now."""
        frontend, command = self.activity.frontend, self.activity.command
        frame = sys._current_frames().get(self._loop_thread)
        stack, from_stack = rankd_stack(frame)
        return Sample(beat, frontend or from_stack, command, stack)
