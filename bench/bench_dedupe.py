"""The dedupe table's stores side by side: the native PackedLog against the
pure-Python DictLog (a dict of ``str -> bytes``, the store before it).

A busy board remembers every event id of the last day, and nearly every
submission asks about an id the table has never seen, then remembers it.
For each table size (``--sizes``), each store is filled with that many ids
(``tcp-<client>-<n>``, packed entries with a 6-byte member, as the daemon
benchmark writes them), then timed on ``--ops`` fresh ids: a lookup and a
put each, as live ingest does.  Also printed: memory per remembered id
(growth of the resident set while filling, after a collection; the ids
and entries are made as they are put, so a store that keeps them as
objects pays for them), the time to copy the whole table into its
snapshot form (``log_chunks``), and the longest single put while filling:
the event loop waits that long when the table grows (its slots doubling,
its log's memory moving), which no median shows.
Each store and size runs in a fresh child process, so memory figures
start clean; times are the median of ``--repeats`` runs.

Run from the project root (the native store built)::

    python bench/bench_dedupe.py
    python bench/bench_dedupe.py --sizes 100000,1000000 --ops 100000
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import statistics
import struct
import subprocess
import sys
import time

ENTRY = struct.Struct("<dddqB")


def rss_bytes() -> int:
    gc.collect()
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def entry(n: int) -> bytes:
    return ENTRY.pack(86_400.0 + n, float(n % 97), float(n % 89), n % 100_000, 15) + b"m%05d" % (
        n % 100_000)


def worker(store: str, size: int, ops: int, repeats: int) -> dict[str, float]:
    if store == "native":
        from rankd.engine._dedupe import PackedLog as Log
    else:
        from rankd.engine.dedupe import DictLog as Log
    baseline = rss_bytes()
    log = Log()
    put = log.put
    clock = time.perf_counter
    longest = 0.0
    for n in range(size):  # the ids and entries live only as long as the store keeps them
        event_id, packed = f"tcp-{n % 50}-{n}", entry(n)
        started = clock()
        put(event_id, packed)
        took = clock() - started
        if took > longest:
            longest = took
    memory = (rss_bytes() - baseline) / size
    get = log.get
    rates = []
    for r in range(repeats):
        fresh = [f"new-{r}-{n}" for n in range(ops)]
        packed = entry(r)
        started = time.perf_counter()
        for event_id in fresh:
            if get(event_id) is None:
                put(event_id, packed)
        rates.append((time.perf_counter() - started) / ops * 1e9)
    started = time.perf_counter()
    copied = sum(len(chunk) for chunk in log.log_chunks(4 << 20))
    snapshot = time.perf_counter() - started
    return {"ns": statistics.median(rates), "bytes": memory, "snapshot_s": snapshot,
            "snapshot_mb": copied / 1e6, "longest_ms": longest * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000000,5000000")
    parser.add_argument("--ops", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        store, size = args.worker
        print(json.dumps(worker(store, int(size), args.ops, args.repeats)))
        return
    print(f"dedupe stores: {args.ops:,} fresh ids per run (lookup + put), "
          f"median of {args.repeats}")
    print(f"{'ids held':>10}  {'store':>7}  {'ns/id':>7}  {'B/id held':>9}  "
          f"{'log_chunks (snapshot form)':>26}  {'longest put':>11}")
    for size in map(int, args.sizes.split(",")):
        figures = {}
        for store in ("python", "native"):
            out = subprocess.run(
                [sys.executable, __file__, "--ops", str(args.ops), "--repeats",
                 str(args.repeats), "--worker", store, str(size)],
                check=True, capture_output=True, text=True).stdout
            figures[store] = f = json.loads(out)
            print(f"{size:>10,}  {store:>7}  {f['ns']:>7.0f}  {f['bytes']:>9.1f}  "
                  f"{f['snapshot_s']:>7.3f} s {f['snapshot_mb']:>4.0f} MB"
                  f"{'':>10}{f['longest_ms']:>9.1f} ms")
        print(f"{'':>10}  {'ratio':>7}  {figures['python']['ns'] / figures['native']['ns']:>6.2f}x"
              f"  {figures['python']['bytes'] / figures['native']['bytes']:>8.2f}x  "
              f"{figures['python']['snapshot_s'] / figures['native']['snapshot_s']:>7.1f}x")


if __name__ == "__main__":
    main()
