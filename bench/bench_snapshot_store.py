"""What storing and reading a group's snapshot costs Postgres and the node.

A cluster group's snapshot goes to Postgres (``ClusterLog.store_snapshot``)
and a new follower or a move's target reads it back a MiB at a time
(``ClusterLog.snapshot``); a board's index is one section of tens of MiB
(35 MiB for 1M members named ``player:%012d``).  This measures, on a
throwaway Postgres (the tests' helper):

* **storage**: a 1M-member skip list's dump as one ``bytea`` value, stored
  under each TOAST storage (``EXTENDED``: pglz, Postgres's default;
  ``lz4``; ``EXTERNAL``: uncompressed, what rankd's schema sets), alternated
  ``--repeats`` times: the insert's time, the size kept, and its reads in
  1 MiB pieces (``substring``, as the snapshot's read does) and whole;
* **batches**: rows of log batches of 1, 18 and 187 KiB (a member name, a
  score and a random event id per record) inserted and read back under
  ``EXTENDED`` and ``EXTERNAL``: the time per row and the bytes on disk;
* **the node's loop**: ``ClusterLog.store_snapshot`` of the same section
  under the tree on ``PYTHONPATH``, while a heartbeat wakes every ms; the
  longest and p99 lateness is how long the store held the event loop.
  Run it once per checkout to compare them.

    PYTHONPATH=src python bench/bench_snapshot_store.py
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from pathlib import Path

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from pgcluster import database
from rankd.cluster.log import ClusterLog, migrate
from rankd.index import RankIndex

PIECE = 1 << 20
STORAGES = {"EXTENDED (pglz)": "SET STORAGE EXTENDED", "lz4": "SET COMPRESSION lz4",
            "EXTERNAL": "SET STORAGE EXTERNAL"}


def index_section(members: int) -> bytes:
    index = RankIndex("desc")
    rng = random.Random(1)
    for i in range(members):
        index.set(f"player:{i:012d}", float(rng.randrange(10**9)))
    return index.dump()


async def storage(conn: asyncpg.Connection, data: bytes, repeats: int) -> None:
    print(f"\none {len(data) / 2**20:.1f} MiB section, stored and read back "
          f"(medians of {repeats}, alternated)")
    figures: dict[str, list[tuple[float, ...]]] = {name: [] for name in STORAGES}
    for _ in range(repeats):
        for name, alter in STORAGES.items():
            await conn.execute("DROP TABLE IF EXISTS bench_section; CREATE TABLE "
                               "bench_section (k int PRIMARY KEY, data bytea)")
            if "EXTENDED" not in name:
                await conn.execute(f"ALTER TABLE bench_section ALTER COLUMN data {alter}")
            started = time.perf_counter()
            await conn.execute("INSERT INTO bench_section VALUES (1, $1)", data)
            stored = time.perf_counter() - started
            kept = await conn.fetchval("SELECT pg_column_size(data) FROM bench_section")
            started = time.perf_counter()
            pieces = [await conn.fetchval("SELECT substring(data FROM $1 FOR $2) FROM "
                                          "bench_section", start + 1, PIECE)
                      for start in range(0, len(data), PIECE)]
            in_pieces = time.perf_counter() - started
            started = time.perf_counter()
            whole = await conn.fetchval("SELECT data FROM bench_section")
            read_whole = time.perf_counter() - started
            assert b"".join(pieces) == data == whole
            figures[name].append((stored, kept / 2**20, in_pieces, read_whole))
    print("| storage | insert s | kept MiB | read in 1 MiB pieces s | read whole s |")
    print("|---|---|---|---|---|")
    for name, runs in figures.items():
        med = [statistics.median(run[i] for run in runs) for i in range(4)]
        print(f"| {name} | {med[0]:.2f} | {med[1]:.1f} | {med[2]:.2f} | {med[3]:.2f} |")


def log_batch(rng: random.Random, records: int) -> bytes:
    return b"".join(b"\x00\x01" + b"player:%012d" % rng.randrange(10**6)
                    + rng.randrange(10**9).to_bytes(8, "little")
                    + b"ev-%016x" % rng.getrandbits(64) for _ in range(records))


async def batches(conn: asyncpg.Connection, repeats: int) -> None:
    print(f"\nlog batches, 300 rows each (medians of {repeats}, alternated)")
    print("| batch KiB | storage | insert us/row | read us/row | on disk / raw |")
    print("|---|---|---|---|---|")
    rng = random.Random(2)
    for records in (40, 400, 4000):
        rows = [log_batch(rng, records) for _ in range(300)]
        figures: dict[str, list[tuple[float, ...]]] = {"EXTENDED": [], "EXTERNAL": []}
        for _ in range(repeats):
            for name in figures:
                await conn.execute("DROP TABLE IF EXISTS bench_batches; CREATE TABLE "
                                   "bench_batches (k int PRIMARY KEY, data bytea)")
                await conn.execute(f"ALTER TABLE bench_batches ALTER COLUMN data "
                                   f"SET STORAGE {name}")
                started = time.perf_counter()
                for k, row in enumerate(rows):
                    await conn.execute("INSERT INTO bench_batches VALUES ($1, $2)", k, row)
                stored = time.perf_counter() - started
                started = time.perf_counter()
                await conn.fetch("SELECT data FROM bench_batches ORDER BY k")
                read = time.perf_counter() - started
                disk = await conn.fetchval("SELECT pg_total_relation_size('bench_batches')")
                figures[name].append((stored / len(rows) * 1e6, read / len(rows) * 1e6,
                                      disk / sum(map(len, rows))))
        for name, runs in figures.items():
            med = [statistics.median(run[i] for run in runs) for i in range(3)]
            print(f"| {len(rows[0]) / 1024:.0f} | {name} | {med[0]:.0f} | {med[1]:.0f} | "
                  f"{med[2]:.2f} |")


async def loop_held(dsn: str, data: bytes, repeats: int) -> None:
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4)
    async with pool.acquire() as conn:
        await migrate(conn)
    store = ClusterLog(pool)
    lease = await store.take(1, "bench")
    await store.append(lease, 1, [b"r"])
    print(f"\nClusterLog.store_snapshot of the section ({len(data) / 2**20:.1f} MiB) on the "
          "event loop, a heartbeat every ms")
    print("| round | store s | loop held, longest ms | p99 ms |")
    print("|---|---|---|---|")
    for round_ in range(repeats):
        lateness: list[float] = []
        done = asyncio.Event()

        async def heartbeat(lateness: list[float] = lateness,
                            done: asyncio.Event = done) -> None:
            while not done.is_set():
                due = time.perf_counter() + 0.001
                await asyncio.sleep(0.001)
                lateness.append(max(0.0, time.perf_counter() - due))

        beating = asyncio.create_task(heartbeat())
        started = time.perf_counter()
        await store.store_snapshot(lease, 1 + round_, lease.epoch, [b"head", data])
        took = time.perf_counter() - started
        await store.append(lease, 2 + round_, [b"r"])
        done.set()
        await beating
        lateness.sort()
        print(f"| {round_ + 1} | {took:.2f} | {lateness[-1] * 1000:.1f} | "
              f"{lateness[int(0.99 * len(lateness))] * 1000:.1f} |")
    await pool.close()


async def main_async(dsn: str, members: int, repeats: int) -> None:
    data = index_section(members)
    conn = await asyncpg.connect(dsn)
    try:
        await storage(conn, data, repeats)
        await batches(conn, repeats)
    finally:
        await conn.close()
    await loop_held(dsn, data, repeats)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with database() as dsn:
        asyncio.run(main_async(dsn, args.members, args.repeats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
