"""``rankd cluster migrate-slots``: regroup a cluster of before hash slots.

A cluster an older rankd made keys its registers, logs and snapshots in
Postgres by CRC-32 board groups (``legacy_group_of``); this rankd groups by
Redis Cluster slots, and refuses such a cluster at start
(:mod:`rankd.cluster.scheme`).  The records of one old group may touch
boards that now fall in several groups (a transaction, a store), so logs
cannot be split record by record.  Instead, with every node stopped, this
command

1. rebuilds every board's state in a throwaway local engine, group by old
   group, exactly as a follower does (the group's snapshot, then its log:
   ``load_group_snapshot`` and ``apply_replicated``), with the engine's
   grouping switched to the old one meanwhile (this process only);
2. takes one snapshot of each *new* group from that state
   (``Engine.group_snapshot``);
3. in one Postgres transaction replaces the registers, logs and snapshots
   by those snapshots (each new group's register at position 1, no holder,
   an epoch above every old one) and records the new scheme with a new
   layout id.  A crash before the commit changes nothing; after it the
   nodes start with empty data dirs (a data dir of before is refused) and
   load every group from its snapshot.

It reads everything into memory: run it where the cluster's data fits.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg

from rankd.cluster.log import ClusterLog, lock_schema, migrate
from rankd.cluster.nodelock import LOCK_SPACE
from rankd.cluster.scheme import KEY, META_SCHEMA, has_groups, mark
from rankd.engine import groups
from rankd.engine.engine import Engine
from rankd.engine.settings import EngineConfig

log = logging.getLogger(__name__)

class MigrationRefused(RuntimeError):
    """The cluster cannot be migrated now (nodes running, already migrated)."""


@contextlib.contextmanager
def legacy_grouping() -> Iterator[None]:
    """Within: every rankd module that imported ``group_of`` groups boards
    by CRC-32, as the cluster being read did.  Only for this one-off process."""
    patched = [module for module in list(sys.modules.values())
               if module is not groups and module is not None
               and getattr(module, "group_of", None) is groups.group_of]
    for module in patched:
        module.group_of = groups.legacy_group_of
    try:
        yield
    finally:
        for module in patched:
            module.group_of = groups.group_of


async def _check_stopped(conn: asyncpg.Connection) -> None:
    row = await conn.fetchrow("SELECT value FROM rankd_cluster_meta WHERE key = $1", KEY) \
        if await conn.fetchval("SELECT to_regclass('rankd_cluster_meta') IS NOT NULL") else None
    if row is not None:
        raise MigrationRefused(f"the cluster is grouped by {row['value']!r} already; "
                               "nothing to migrate")
    running = await conn.fetchval(
        "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
        "WHERE l.locktype = 'advisory' AND l.classid = $1 AND l.objsubid = 2 "
        "AND d.datname = current_database()", LOCK_SPACE)
    if running:
        raise MigrationRefused(f"stop every node first: {running} node(s) still run "
                               "(each holds its node id's lock)")
    held = await conn.fetch("SELECT group_id FROM rankd_groups WHERE lease_until > now()")
    if held:
        raise MigrationRefused(f"stop every node first: {len(held)} group(s) have a lease "
                               "still running")


async def _rebuild(store: ClusterLog, engine: Engine, old_groups: list[int]) -> int:
    """Every old group's state into ``engine``; how many records were applied."""
    applied = 0
    for group in old_groups:
        seq = 0
        snapshot = await store.snapshot(group)
        if snapshot is not None:
            seq, epoch, sections = snapshot
            await engine.load_group_snapshot(group, seq, epoch, sections)
        while True:
            records = await store.read(group, seq, 100)
            if not records:
                break
            await engine.released(group)  # (not under a snapshot's dump)
            await engine.apply_replicated(group, records)
            seq = records[-1][0]
            applied += len(records)
    return applied


async def migrate_slots(dsn: str) -> dict[str, Any]:
    """Regroup the cluster at ``dsn`` by hash slots (see the module's doc);
    what was done."""
    conn = await asyncpg.connect(dsn)
    try:
        await migrate(conn)
        async with conn.transaction():
            await lock_schema(conn)
            await conn.execute(META_SCHEMA)
            await _check_stopped(conn)
        if not await has_groups(conn):
            async with conn.transaction():
                await lock_schema(conn)
                await mark(conn)
            return {"old_groups": 0, "new_groups": 0, "boards": 0, "records": 0}
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
        try:
            store = ClusterLog(pool)
            old_groups = sorted({row["group_id"] for row in await conn.fetch(
                "SELECT group_id FROM rankd_groups UNION SELECT group_id FROM "
                "rankd_group_snapshots")})
            top_epoch = await conn.fetchval(
                "SELECT greatest((SELECT max(epoch) FROM rankd_groups), "
                "(SELECT max(epoch) FROM rankd_log), 0)")
            with tempfile.TemporaryDirectory(prefix="rankd-migrate-slots-") as work:
                engine = await Engine.open(EngineConfig(
                    data_dir=Path(work), fsync="no", snapshot_every_seconds=10 ** 9,
                    housekeeping_seconds=10 ** 9))
                try:
                    with legacy_grouping():
                        records = await _rebuild(store, engine, old_groups)
                    names = list(engine.boards)
                    new_groups = sorted({groups.group_of(name) for name in names})
                    snapshots = {group: (await engine.group_snapshot(group))[2]
                                 for group in new_groups}
                finally:
                    await engine.close(snapshot=False)
        finally:
            await pool.close()
        epoch = top_epoch + 1
        async with conn.transaction():
            await lock_schema(conn)
            await _check_stopped(conn)
            await conn.execute("DELETE FROM rankd_log")
            await conn.execute("DELETE FROM rankd_group_snapshots")
            await conn.execute("DELETE FROM rankd_groups")
            await conn.execute("DELETE FROM rankd_epochs")  # the old groups' epochs
            for group, sections in snapshots.items():
                await conn.execute(
                    "INSERT INTO rankd_groups (group_id, epoch, last_seq) VALUES ($1, $2, 1)",
                    group, epoch)
                for part, data in enumerate(sections):
                    await conn.execute(
                        "INSERT INTO rankd_group_snapshots (group_id, seq, epoch, part, parts, "
                        "data) VALUES ($1, 1, $2, $3, $4, $5)",
                        group, epoch, part, len(sections), data)
            await conn.execute("UPDATE rankd_nodes SET applied = '{}'") \
                if await conn.fetchval("SELECT to_regclass('rankd_nodes') IS NOT NULL") else None
            await mark(conn)
        return {"old_groups": len(old_groups), "new_groups": len(new_groups),
                "boards": len(names), "records": records}
    finally:
        await conn.close()
