"""The dedupe table's stores side by side: the compact FingerprintLog
(``rankd.engine._idstore``: fingerprints, 24-byte records) behind the
``DedupeTable`` the daemon holds (``compact``), and, from the sources of an
older tree (``--base``, e.g. a checkout of 157be2a), the native PackedLog it
succeeded (``native``: ids and packed answers) and the pure-Python DictLog
(``python``: a dict of ``str -> bytes``); the pure-Python twin of the
compact store is ``compact-python``.

A busy board remembers every event id of the last day, and nearly every
submission asks about an id the table has never seen, then remembers it.
For each table size (``--sizes``), each store is filled with that many ids
(``--ids tcp``: ``tcp-<client>-<n>`` with a 6-byte member, as the daemon
benchmark writes them; ``--ids uuid``: UUIDs with a 19-byte member,
``player:%012d``), then timed on ``--ops`` fresh ids: a lookup and a
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
    python bench/bench_dedupe.py --base /work/wt-base --ids uuid --stores native,compact \
        --sizes 1000000,10000000
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import struct
import subprocess
import sys
import time
import uuid

ENTRY = struct.Struct("<dddqB")


def rss_bytes() -> int:
    gc.collect()
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def entry(n: int, member: bytes) -> bytes:
    return ENTRY.pack(86_400.0 + n, float(n % 97), float(n % 89), n % 100_000, 15) + member


def make_id(kind: str, n: int) -> str:
    if kind == "uuid":
        return str(uuid.UUID(int=(n * 0x9E3779B97F4A7C15F39CC0605CEDC834) % (1 << 128)))
    return f"tcp-{n % 50}-{n}"


def make_member(kind: str, n: int) -> str:
    return f"player:{n % 1_000_000:012d}" if kind == "uuid" else f"m{n % 100_000:05d}"


def worker(store: str, size: int, ops: int, repeats: int, ids: str) -> dict[str, float]:
    if store.startswith("compact"):
        return compact_worker(size, ops, repeats, ids, store == "compact-python")
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
        event_id, packed = make_id(ids, n), entry(n, make_member(ids, n).encode())
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
        packed = entry(r, make_member(ids, r).encode())
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


def compact_worker(size: int, ops: int, repeats: int, ids: str,
                   pure: bool) -> dict[str, float]:
    """The same for the daemon's ``DedupeTable`` on ``FingerprintLog`` (or,
    ``pure``, ``FingerprintDict``), whose put takes the payload (member,
    content fingerprint) and the answer rather than a packed entry."""
    from rankd.engine.dedupe import DedupeTable
    from rankd.engine.idstore import FingerprintDict

    baseline = rss_bytes()
    log = DedupeTable(FingerprintDict() if pure else None).log
    put = log.put
    clock = time.perf_counter
    longest = 0.0
    for n in range(size):
        event_id, member = make_id(ids, n), make_member(ids, n)
        answer = (float(n % 97), n % 100_000, float(n % 89), True)
        started = clock()
        put(event_id, 86_400.0 + n, member, n, answer)
        took = clock() - started
        if took > longest:
            longest = took
    memory = (rss_bytes() - baseline) / size
    get = log.get
    rates = []
    for r in range(repeats):
        fresh = [f"new-{r}-{n}" for n in range(ops)]
        member, answer = make_member(ids, r), (float(r), r, None, True)
        started = time.perf_counter()
        for event_id in fresh:
            if get(event_id, member, r, 0.0) is None:
                put(event_id, 86_400.0, member, r, answer)
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
    parser.add_argument("--ids", choices=("tcp", "uuid"), default="tcp")
    parser.add_argument("--stores", default="compact")
    parser.add_argument("--base", help="the root of an older tree: its sources run the "
                        "'native' and 'python' stores (PackedLog, DictLog)")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        store, size = args.worker
        print(json.dumps(worker(store, int(size), args.ops, args.repeats, args.ids)))
        return
    print(f"dedupe stores: {args.ids} ids, {args.ops:,} fresh ids per run (lookup + put), "
          f"median of {args.repeats}")
    print(f"{'ids held':>10}  {'store':>7}  {'ns/id':>7}  {'B/id held':>9}  "
          f"{'log_chunks (snapshot form)':>26}  {'longest put':>11}")
    for size in map(int, args.sizes.split(",")):
        figures = {}
        stores = args.stores.split(",")
        for store in stores:
            env = dict(os.environ)
            if store in ("native", "python"):
                if not args.base:
                    parser.error(f"the {store!r} store is gone from this tree: give --base")
                env["PYTHONPATH"] = os.path.join(args.base, "src")
            out = subprocess.run(
                [sys.executable, __file__, "--ops", str(args.ops), "--repeats",
                 str(args.repeats), "--ids", args.ids, "--worker", store, str(size)],
                check=True, capture_output=True, text=True, env=env).stdout
            figures[store] = f = json.loads(out)
            print(f"{size:>10,}  {store:>7}  {f['ns']:>7.0f}  {f['bytes']:>9.1f}  "
                  f"{f['snapshot_s']:>7.3f} s {f['snapshot_mb']:>4.0f} MB"
                  f"{'':>10}{f['longest_ms']:>9.1f} ms")
        first, last = figures[stores[0]], figures[stores[-1]]
        print(f"{'':>10}  {'ratio':>7}  {first['ns'] / last['ns']:>6.2f}x"
              f"  {first['bytes'] / last['bytes']:>8.2f}x  "
              f"{first['snapshot_s'] / last['snapshot_s']:>7.1f}x  ({stores[0]} / {stores[-1]})")


if __name__ == "__main__":
    main()
