"""The loop watchdog's own cost: CPU per heartbeat on the loop's thread, and
an idle process's CPU with the watchdog running against without it (the
heartbeat and the watcher thread together), side by side in one run.

    PYTHONPATH=src python bench/bench_watchdog.py [--rounds 5]

Each round measures both, alternating; medians are printed.  A heartbeat
runs every ``rankd.watchdog.INTERVAL`` seconds, so its cost in a core's
share is the per-beat CPU times that rate.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from rankd.watchdog import INTERVAL, LoopWatchdog

try:
    import uvloop
except ImportError:
    uvloop = None


async def per_beat(beats: int = 20_000) -> float:
    """CPU seconds of the loop's thread per heartbeat (called directly)."""
    watchdog = LoopWatchdog()
    watchdog._loop = asyncio.get_running_loop()
    watchdog._schedule()
    watchdog._handle.cancel()
    began = time.thread_time()
    for _ in range(beats):
        watchdog._due = time.monotonic()  # (on time: nothing logged)
        watchdog._beat()
        watchdog._handle.cancel()
    return (time.thread_time() - began) / beats


async def idle_share(seconds: float, with_watchdog: bool) -> float:
    """The process's CPU over ``seconds`` idle, as a share of a core."""
    watchdog = LoopWatchdog() if with_watchdog else None
    if watchdog is not None:
        watchdog.start()
    try:
        cpu, wall = time.process_time(), time.monotonic()
        await asyncio.sleep(seconds)
        return (time.process_time() - cpu) / (time.monotonic() - wall)
    finally:
        if watchdog is not None:
            watchdog.stop()


async def rounds(count: int, seconds: float) -> None:
    beats, without, with_ = [], [], []
    for _ in range(count):
        beats.append(await per_beat())
        without.append(await idle_share(seconds, False))
        with_.append(await idle_share(seconds, True))
    beat = statistics.median(beats)
    print(f"loop: {'uvloop' if uvloop is not None else 'asyncio'}; {count} rounds, medians")
    print(f"heartbeat: {beat * 1e6:.2f} us of CPU a beat, {beat / INTERVAL * 100:.3f}% "
          f"of a core at one beat every {INTERVAL * 1000:g} ms")
    print(f"idle process: {statistics.median(without) * 100:.3f}% of a core without the "
          f"watchdog, {statistics.median(with_) * 100:.3f}% with it "
          f"(the difference, per round, median: "
          f"{statistics.median(w - o for w, o in zip(with_, without, strict=True)) * 100:.3f}%)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0, help="idle time per measure")
    args = parser.parse_args()
    if uvloop is not None:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(rounds(args.rounds, args.seconds))
    else:
        asyncio.run(rounds(args.rounds, args.seconds))


if __name__ == "__main__":
    main()
