"""Acknowledgements through a board group's log in Postgres (``--ack log``).

``--submitters`` (64) coroutines each commit one record at a time (a
SUBMIT-sized payload) through one :class:`rankd.cluster.committer.
GroupCommitter` for ``--seconds``; every commit returns only once the
Postgres transaction holding it committed.  Prints acknowledged records/s,
p50/p99 latency, and records per transaction, median of ``--repeats``.
Target (issue 26): >= 20,000/s with p99 <= 20 ms.

Then follower lag: records committed at ``--rate`` (20,000/s) for
``--seconds``, in batches every 10 ms, while a :class:`rankd.cluster.tail.
LogTail` follows the group; the lag of a record is the time from the start
of the commit holding it (so the commit's own latency counts) to the tail
handing it on.  Target: p99 <= 250 ms.

Postgres: a throwaway local cluster (the tests' helper; ``fsync=off``,
synchronous commit on), or ``--dsn``.  Run from the project root::

    python bench/bench_cluster_log.py
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import asyncpg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from rankd.cluster.committer import GroupCommitter  # noqa: E402
from rankd.cluster.groups import GROUPS  # noqa: E402
from rankd.cluster.log import ClusterLog, migrate  # noqa: E402
from rankd.cluster.tail import LogTail  # noqa: E402

PAYLOAD = b"\x9b\x03\xa5arena\xa6member\xcb" + bytes(8) + b"\xc3\xc0\xcf" + bytes(8) * 2 + \
    b"\xc0\x91\x93\xa3all\xa3all\xcb" + bytes(8) + b"\x94\xcb" + bytes(8) + b"\x01\xc0\xc3"


async def one_run(dsn: str, group: int, submitters: int, seconds: float
                  ) -> tuple[float, list[float], float]:
    pool = await asyncpg.create_pool(dsn, min_size=2, max_size=4)
    try:
        async with pool.acquire() as conn:
            await migrate(conn)
        store = ClusterLog(pool, lease_seconds=30)
        lease = await store.take(group, "bench")
        committer = GroupCommitter(store, lease)
        latencies: list[float] = []
        deadline = time.perf_counter() + seconds

        async def submitter() -> None:
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                await committer.commit([PAYLOAD])
                latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(submitter() for _ in range(submitters)))
        elapsed = time.perf_counter() - started
        return len(latencies) / elapsed, latencies, committer.records / max(1, committer.appends)
    finally:
        await pool.close()


async def follow_run(dsn: str, group: int, rate: float, seconds: float) -> list[float]:
    """Lags (seconds) of records committed at ``rate`` while a tail follows."""
    pool = await asyncpg.create_pool(dsn, min_size=2, max_size=4)
    committed: dict[int, float] = {}
    lags: list[float] = []

    def apply(records: list[tuple[int, int, bytes]]) -> None:
        now = time.perf_counter()
        lags.extend(now - committed[seq] for seq, _, _ in records if seq in committed)

    try:
        async with pool.acquire() as conn:
            await migrate(conn)
        store = ClusterLog(pool, lease_seconds=30)
        committer = GroupCommitter(store, await store.take(group, "bench"))
        tail = LogTail(store, dsn, lambda _group, records: apply(records),
                       applied={group: committer.next_seq - 1})
        # Only this group: the tail follows every group with a register, and the
        # acknowledgement run before wrote another one.
        tail.paused = set(range(GROUPS)) - {group}
        await tail.start()
        per_tick = max(1, round(rate / 100))
        deadline = time.perf_counter() + seconds
        last = 0
        while time.perf_counter() < deadline:
            tick = time.perf_counter()
            # Counted from before the commit (its own latency included): the
            # tail may apply a batch before the commit's answer is back.
            for seq in range(committer.next_seq, committer.next_seq + per_tick):
                committed[seq] = tick
            last = await committer.commit([PAYLOAD] * per_tick)
            await asyncio.sleep(max(0.0, 0.01 - (time.perf_counter() - tick)))
        await tail.wait_for(group, last, 30)
        await tail.stop()
    finally:
        await pool.close()
    return lags


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--dsn", default=None)
    parser.add_argument("--submitters", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rate", type=float, default=20_000.0, help="follower figure")
    args = parser.parse_args()
    from pgcluster import database

    with database(args.dsn) as dsn:
        runs = [asyncio.run(one_run(dsn, group, args.submitters, args.seconds))
                for group in range(args.repeats)]
        lags = asyncio.run(follow_run(dsn, 500, args.rate, args.seconds))
    rates = [rate for rate, _, _ in runs]
    median = sorted(runs, key=lambda r: r[0])[len(runs) // 2]
    _, latencies, per_transaction = median
    p50, p99 = percentile(latencies, 0.50) * 1000, percentile(latencies, 0.99) * 1000
    verdict = "PASS" if statistics.median(rates) >= 20_000 and p99 <= 20 else "MISS"
    print(f"ack log, {args.submitters} submitters, {args.seconds:g} s x {args.repeats}: "
          f"{statistics.median(rates):,.0f} acks/s (runs: "
          f"{', '.join(f'{r:,.0f}' for r in rates)}), p50 {p50:.2f} ms, p99 {p99:.2f} ms, "
          f"{per_transaction:.0f} records per transaction  [{verdict}: >= 20,000/s, "
          "p99 <= 20 ms]")
    lag50, lag99 = percentile(lags, 0.50) * 1000, percentile(lags, 0.99) * 1000
    follow = "PASS" if lag99 <= 250 else "MISS"
    print(f"follower lag at {args.rate:,.0f} records/s, {args.seconds:g} s: {len(lags):,} "
          f"records, p50 {lag50:.1f} ms, p99 {lag99:.1f} ms  [{follow}: p99 <= 250 ms]")
    return 0 if verdict == follow == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
