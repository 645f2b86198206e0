"""What one live-feed tick costs, and how long it holds the event loop, with
many subscribers that each follow many distinct members.

In-process (an ``Engine`` and a ``LiveFeed``, no sockets): ``--subscribers``
subscribers of one board, each on ``limit=100`` and following ``--follows``
members no other subscriber follows, given stand-in transports that take
every frame (so nothing queues and the cost is the feed's own).  A writer
adds to a random member every ``--write-every`` seconds (each write moves
ranks, so followed members change), while a probe task wakes every
millisecond.  Every callback the loop runs is timed in CPU time of the loop
thread (what the project's rule is about: none may hold the loop for more
than a few milliseconds; CPU time leaves out the time the OS gave other
processes on a busy machine).  The collector is settled as the daemon
settles it.  Figures over ``--seconds``: ticks, the wall time of a tick
from its start to its last push (p50/max), the longest callback and the
number over 10 ms, how late the probe woke (wall time: p99/max), pushes and
bytes written.

Run from the project root::

    python bench/bench_live_tick.py                       # the reported attack
    python bench/bench_live_tick.py --subscribers 1000    # twice it
    python bench/bench_live_tick.py --subscribers 5 --follows 3   # the common case
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from rankd.engine import collector
from rankd.engine.engine import Engine, EngineConfig
from rankd.engine.submission import Submission
from rankd.frontends.live import LiveFeed


class _Transport:
    """Takes every write at once (a subscriber that always keeps up)."""

    written = 0

    def write(self, data: bytes) -> None:
        _Transport.written += len(data)

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0


def _timed(feed: LiveFeed, durations: list[float]) -> None:
    """Record the wall time of each tick, sync or async."""
    tick = feed.tick
    if inspect.iscoroutinefunction(tick):
        async def timed_async() -> Any:
            started = time.perf_counter()
            try:
                return await tick()
            finally:
                durations.append(time.perf_counter() - started)
        feed.tick = timed_async  # type: ignore[method-assign]
    else:
        def timed() -> Any:
            started = time.perf_counter()
            try:
                return tick()
            finally:
                durations.append(time.perf_counter() - started)
        feed.tick = timed  # type: ignore[method-assign]


async def _probe(lags: list[float], stop: asyncio.Event) -> None:
    """Wake every millisecond; record how late (wall time, which includes
    the OS running other processes on a busy machine)."""
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        before = loop.time()
        await asyncio.sleep(0.001)
        lags.append(loop.time() - before - 0.001)


def _time_callbacks(held: list[float]) -> None:
    """Record the loop thread's CPU time in each callback the loop runs."""
    run = asyncio.events.Handle._run

    def timed(handle: asyncio.Handle) -> None:
        started = time.thread_time()
        run(handle)
        held.append(time.thread_time() - started)

    asyncio.events.Handle._run = timed  # type: ignore[method-assign]


async def _writer(engine: Engine, members: int, every: float, stop: asyncio.Event) -> None:
    rng = random.Random(7)
    while not stop.is_set():
        await engine.submit(Submission("big", f"m{rng.randrange(members)}",
                                       delta=rng.randrange(1, 5000)))
        await asyncio.sleep(every)


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as data:
        engine = await Engine.open(EngineConfig(data_dir=Path(data), fsync="no",
                                                snapshot_every_seconds=3600.0,
                                                housekeeping_seconds=3600.0))
        try:
            await engine.put_board("big", {"policy": "sum"})
            members = max(args.members, args.subscribers * args.follows)
            for start in range(0, members, 10_000):
                await engine.submit_many(
                    [Submission("big", f"m{i}", delta=random.randrange(1, 100_000))
                     for i in range(start, min(members, start + 10_000))])
            feed = LiveFeed(engine, interval=args.interval)
            for n in range(args.subscribers):
                subscriber = feed.subscribe(
                    "big", None, 100, [f"m{n * args.follows + i}" for i in range(args.follows)])
                subscriber.queue.clear()
                subscriber.transport = _Transport()  # type: ignore[assignment]
            durations: list[float] = []
            lags: list[float] = []
            held: list[float] = []
            _timed(feed, durations)
            stop = asyncio.Event()
            tasks = [asyncio.create_task(_probe(lags, stop)),
                     asyncio.create_task(_writer(engine, members, args.write_every, stop))]
            await asyncio.sleep(0.5)  # warm-up
            durations.clear()
            lags.clear()
            held.clear()
            pushes, written = feed.pushes, _Transport.written
            collector.settle()
            _time_callbacks(held)
            feed.start()
            await asyncio.sleep(args.seconds)
            stop.set()
            await feed.stop()
            await asyncio.gather(*tasks)
            print("  ticks (ms):", " ".join(f"{d * 1000:.0f}" for d in durations))
            lags.sort()
            held.sort()
            print(f"subscribers {args.subscribers} x {args.follows} follows, "
                  f"{members} members, write every {args.write_every * 1000:.0f} ms, "
                  f"{args.seconds:.0f} s")
            print(f"  ticks {len(durations)}  tick wall p50 "
                  f"{statistics.median(durations) * 1000:.1f} ms  max "
                  f"{max(durations) * 1000:.1f} ms")
            print(f"  longest callback (CPU): {held[-1] * 1000:.1f} ms  over 10 ms: "
                  f"{sum(1 for h in held if h > 0.01)} of {len(held)}")
            print(f"  probe late (wall): p99 {lags[int(len(lags) * 0.99)] * 1000:.1f} ms  "
                  f"max {lags[-1] * 1000:.1f} ms")
            print(f"  pushes {feed.pushes - pushes}  bytes {_Transport.written - written}  "
                  f"drops {feed.drops}")
        finally:
            await engine.close(snapshot=False)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subscribers", type=int, default=500)
    parser.add_argument("--follows", type=int, default=100)
    parser.add_argument("--members", type=int, default=100_000)
    parser.add_argument("--write-every", type=float, default=0.05)
    parser.add_argument("--interval", type=float, default=0.25)
    parser.add_argument("--seconds", type=float, default=5.0)
    asyncio.run(main(parser.parse_args()))
