"""How long one flush of the submit coalescer holds the event loop.

Many callers submitting in one pass of the loop (connections of a server on
the general path, tasks of an application) queue in the coalescer; its
flush, one callback, takes up to ``MAX_COALESCED`` submissions off the
front and starts their batch.  This times every flush (thread CPU time,
cyclic GC off so that a collection does not land in one of them) with an
``apply`` that does nothing, for ``--callers`` concurrent callers of one
submission each, and prints the longest flush and the total, medians over
``--rounds``.  In-process, no engine.

Compare two checkouts (alternate the runs)::

    PYTHONPATH=src python bench/bench_coalescer.py
    PYTHONPATH=/other/checkout/src python bench/bench_coalescer.py
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time

from rankd.engine.coalescer import SubmitCoalescer


async def one_round(callers: int) -> tuple[float, float, int]:
    """(longest flush, all flushes, flushes) in seconds of thread CPU."""
    holds: list[float] = []

    async def apply(submissions: list) -> list:
        return [None] * len(submissions)

    coalescer = SubmitCoalescer(apply)
    flush = coalescer._flush

    def timed_flush() -> None:
        started = time.thread_time()
        flush()
        holds.append(time.thread_time() - started)

    coalescer._flush = timed_flush  # type: ignore[method-assign]
    await asyncio.gather(*(coalescer.submit_many([i]) for i in range(callers)))
    return max(holds), sum(holds), len(holds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--callers", type=int, nargs="+", default=[5_000, 20_000, 50_000])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    gc.disable()
    print(f"{'callers':>8} {'flushes':>8} {'longest flush ms':>17} {'all flushes ms':>15}")
    for callers in args.callers:
        runs = [asyncio.run(one_round(callers)) for _ in range(args.rounds)]
        print(f"{callers:>8,} {runs[0][2]:>8} {statistics.median(r[0] for r in runs) * 1e3:>17.1f} "
              f"{statistics.median(r[1] for r in runs) * 1e3:>15.1f}")


if __name__ == "__main__":
    main()
