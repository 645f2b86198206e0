"""Concurrent callers whose lists fit one flush but not two together.

20 callers of 600 submissions each on a real engine (``fsync no``), the
coalescer of another tree (``--old``: its ``coalescer.py``, e.g. from
``git show 7d0943f:src/rankd/engine/coalescer.py``) and this tree's
alternated in one process: thread CPU per submission, flushes, the longest
loop callback and the wall time of the whole gather, medians.

    PYTHONPATH=src:tests python bench/bench_fitting_lists.py --old /tmp/old_coalescer.py
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from engine_helpers import FakeClock, sub, with_engine
from rankd.engine.coalescer import SubmitCoalescer

_run = asyncio.events.Handle._run
_timing = {"on": False, "longest": 0.0}


def _timed(handle: Any) -> None:
    start = time.perf_counter()
    _run(handle)
    took = time.perf_counter() - start
    if _timing["on"] and took > _timing["longest"]:
        _timing["longest"] = took


async def _rounds(engine: Any, old: type, rounds: int) -> dict[str, list[tuple]]:
    await engine.put_board("y", {"policy": "sum"})
    results: dict[str, list[tuple]] = {"old": [], "new": []}
    trees = [("old", old), ("new", SubmitCoalescer)]
    for rnd in range(rounds):
        for name, cls in trees if rnd % 2 else trees[::-1]:
            coalescer = engine._submits.coalescer = cls(engine._submits.submit_batch)
            calls = [[sub("y", f"{rnd}{name}{k}-{i}", delta=1) for i in range(600)]
                     for k in range(20)]
            await asyncio.sleep(0)
            _timing.update(on=True, longest=0.0)
            cpu, wall = time.thread_time(), time.perf_counter()
            await asyncio.gather(*(engine.submit_many(call) for call in calls))
            cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
            _timing["on"] = False
            results[name].append((cpu / 12_000 * 1e6, coalescer.flushes,
                                  _timing["longest"] * 1e3, wall * 1e3))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True, help="another tree's coalescer.py")
    parser.add_argument("--rounds", type=int, default=16)
    args = parser.parse_args()
    spec = importlib.util.spec_from_file_location("old_coalescer", args.old)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    asyncio.events.Handle._run = _timed
    results = asyncio.run(with_engine(
        Path(tempfile.mkdtemp()) / "data", FakeClock(),
        lambda engine: _rounds(engine, module.SubmitCoalescer, args.rounds)))
    for name, rows in results.items():
        print(f"{name}: cpu {statistics.median(r[0] for r in rows):.2f} us/submission, "
              f"flushes {statistics.median(r[1] for r in rows):.0f}, longest callback "
              f"{statistics.median(r[2] for r in rows):.2f} ms, gather "
              f"{statistics.median(r[3] for r in rows):.1f} ms")
    ratio = statistics.median(b[0] / a[0] for a, b in zip(results["old"], results["new"],
                                                          strict=True))
    print(f"cpu new/old (paired median): {ratio:.3f}")


if __name__ == "__main__":
    main()
