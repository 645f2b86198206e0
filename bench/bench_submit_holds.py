"""The longest event-loop callback while one caller submits a long list.

``Engine.submit_many`` of ``--events`` submissions (one ``best`` board,
new members, no event ids, ``fsync no``) on a real engine in a temporary
directory: every callback the loop runs is timed (``Handle._run`` wrapped,
``time.perf_counter``, cyclic GC off), and each round prints the longest
one and the call's total time.  The coalescer applies a long list in parts
of at most ``MAX_COALESCED`` submissions, a callback each.

Compare two checkouts (alternate the runs)::

    PYTHONPATH=src:tests python bench/bench_submit_holds.py
    PYTHONPATH=/other/checkout/src:tests python bench/bench_submit_holds.py
"""

from __future__ import annotations

import argparse
import asyncio
import asyncio.events
import gc
import statistics
import tempfile
import time
from pathlib import Path

from engine_helpers import FakeClock, sub, with_engine

_longest = [0.0]
_run = asyncio.events.Handle._run


def _timed_run(self: asyncio.events.Handle) -> None:
    started = time.perf_counter()
    _run(self)
    _longest[0] = max(_longest[0], time.perf_counter() - started)


async def _rounds(engine, events: int, rounds: int) -> list[tuple[float, float]]:
    await engine.put_board("b", {"policy": "best"})
    out = []
    for r in range(rounds):
        submissions = [sub("b", f"m{r}-{i}", score=i) for i in range(events)]
        await asyncio.sleep(0)
        _longest[0] = 0.0
        started = time.perf_counter()
        answers = await engine.submit_many(submissions)
        total = time.perf_counter() - started
        if len(answers) != events or not all(isinstance(a, dict) for a in answers):
            raise RuntimeError("a submission failed")
        out.append((_longest[0], total))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    asyncio.events.Handle._run = _timed_run
    gc.disable()
    with tempfile.TemporaryDirectory() as directory:
        got = asyncio.run(with_engine(Path(directory), FakeClock(),
                                      lambda engine: _rounds(engine, args.events, args.rounds)))
    print(f"{args.events:,} submissions in one call, {args.rounds} rounds: longest callback "
          f"{statistics.median(h for h, _ in got) * 1000:.1f} ms (median; "
          f"{' '.join(f'{h * 1000:.1f}' for h, _ in got)}), the call "
          f"{statistics.median(t for _, t in got) * 1000:.1f} ms")


if __name__ == "__main__":
    main()
