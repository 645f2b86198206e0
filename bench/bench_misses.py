"""Instructions and simulated cache misses per ingested event, under cachegrind.

This machine's timings move by 20-40% from one hour to the next; counts of
instructions and of misses in a simulated cache do not depend on what else
runs.  They still vary by 10-20% between runs with the random hash keys
(the index's and the dedupe log's SipHash keys, drawn per process; the
str hash is pinned with ``PYTHONHASHSEED=0``): run it twice.  This script runs
the engine twice under ``valgrind --tool=cachegrind`` with a 1 MiB last
level (about this VM's share of cache that helps): once ingesting
``--prefill`` submissions, once ingesting ``--measure`` more after them,
and prints the difference per measured event.  Submissions are deltas on
100,000 members, each with a unique 18-character event id, in batches of
1000 (``Engine.submit_many``), WAL fsync ``no``, no snapshots.

The default window (1.1M to 1.2M events) is one where neither dedupe store
resizes its table (a dict at 2/3 of a power of two, the native log at 1/2),
so the figures compare steady states.  Needs ``valgrind`` (Debian:
``apt-get install -y valgrind``); about 5 minutes::

    python bench/bench_misses.py
    PYTHONPATH=/path/to/other/src python bench/bench_misses.py   # another build
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

CACHES = ["--D1=65536,2,64", "--LL=1048576,16,64"]


async def ingest(total: int) -> None:
    from rankd.engine.engine import Engine, EngineConfig
    from rankd.engine.submission import Submission
    from rankd.engine.tail import MAX_SNAPSHOT_EVERY_BYTES, MAX_SNAPSHOT_EVERY_EVENTS

    engine = await Engine.open(EngineConfig(
        data_dir=tempfile.mkdtemp(prefix="rankd-misses-"), fsync="no",
        snapshot_every_events=MAX_SNAPSHOT_EVERY_EVENTS,
        snapshot_every_bytes=MAX_SNAPSHOT_EVERY_BYTES, snapshot_every_seconds=10**9))
    await engine.put_board("b", {"policy": "sum"})
    for start in range(0, total, 1000):
        await engine.submit_many([
            Submission(board="b", member=f"m{i % 100_000}", delta=1.0,
                       event_id=f"evt-{i:014d}")
            for i in range(start, min(start + 1000, total))])
    await engine.close(snapshot=False)


def totals(events: int, workdir: Path) -> dict[str, int]:
    """cachegrind's program totals for a run ingesting ``events``."""
    out = workdir / f"cachegrind.{events}"
    subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=yes", *CACHES,
                    f"--cachegrind-out-file={out}", sys.executable, __file__,
                    "--run", str(events)], check=True, capture_output=True,
                   env={**os.environ, "PYTHONHASHSEED": "0"})
    text = subprocess.run(["cg_annotate", str(out)], check=True, capture_output=True,
                          text=True).stdout
    header = next(line for line in text.splitlines() if line.startswith("Events recorded:"))
    names = header.split(":", 1)[1].split()
    line = next(line for line in text.splitlines() if "PROGRAM TOTALS" in line)
    numbers = [int(n.replace(",", "")) for n in re.findall(r"([\d,]+) \(", line)]
    return dict(zip(names, numbers, strict=False))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prefill", type=int, default=1_100_000)
    parser.add_argument("--measure", type=int, default=100_000)
    parser.add_argument("--run", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run is not None:
        asyncio.run(ingest(args.run))
        return
    from rankd.engine import dedupe

    store = getattr(dedupe, "IMPLEMENTATION", "a dict (a build before the dedupe log)")
    with tempfile.TemporaryDirectory() as workdir:
        before = totals(args.prefill, Path(workdir))
        after = totals(args.prefill + args.measure, Path(workdir))
    per = {name: (after[name] - before[name]) / args.measure for name in after}
    print(f"per event, events {args.prefill:,} to {args.prefill + args.measure:,} "
          f"(dedupe store: {store}; cachegrind D1 64 KiB, LL 1 MiB)")
    print(f"  instructions          {per['Ir']:>10,.0f}")
    print(f"  LL read misses        {per['DLmr']:>10.1f}")
    print(f"  LL write misses       {per['DLmw']:>10.1f}")


if __name__ == "__main__":
    main()
