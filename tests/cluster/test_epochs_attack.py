"""Attacks on the cluster's log in Postgres (``rankd.cluster.log``): where
each epoch began (``rankd_epochs``), uncompressed storage, and large snapshot
sections streamed by binary COPY.  Each test is named for the defect it
found, in a real Postgres."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from pathlib import Path

import asyncpg
from cluster_nodes import node, sql
from jepsen import wait_ready

from cluster_tables import cluster_tables
from daemon import Daemon
from pgcluster import PG_BIN_DIRS
from rankd.cluster.groups import group_of
from rankd.cluster.log import SNAPSHOT_PIECE, ClusterLog, Lease


def test_two_stores_of_one_snapshot_racing_do_not_fail_on_a_copied_section(pg_dsn):
    """Two stores of the same group's snapshot at the same position (a
    deposed primary's and its successor's, or a retry) whose first section
    is streamed by COPY: both pass the "already stored?" check before
    either commits, and the second's COPY then hit the first's row.  With
    ``ON CONFLICT DO NOTHING`` it waited and stored nothing; the COPY raised
    a unique violation out of ``store_snapshot`` instead of an answer."""
    async def scenario() -> None:
        async with cluster_tables(pg_dsn) as (_, _, store):
            blocker = await asyncpg.connect(pg_dsn)
            try:
                lease = await store.take(7, "a")
                await store.append(lease, 1, [b"x"])
                large = bytes(range(256)) * (SNAPSHOT_PIECE // 256 + 10)
                sections = [large, b"tail"]
                # The register held elsewhere: the first store waits after its
                # sections went in (uncommitted), so the second's check finds none.
                held = blocker.transaction()
                await held.start()
                await blocker.execute("SELECT 1 FROM rankd_groups WHERE group_id = 7 "
                                      "FOR UPDATE")
                stores = []
                for _ in range(2):
                    stores.append(asyncio.ensure_future(
                        store.store_snapshot(lease, 1, lease.epoch, sections)))
                    await asyncio.sleep(0.5)
                await held.rollback()
                answers = await asyncio.wait_for(
                    asyncio.gather(*stores, return_exceptions=True), 10)
                assert answers == [True, True]
                assert (await store.snapshot(7))[2] == sections
            finally:
                await blocker.close()

    asyncio.run(scenario())


async def _take_as_before_epochs(store: ClusterLog, group: int, node: str) -> Lease:
    """A take by a node of the version before ``rankd_epochs``: the same
    register change, and no row of where the epoch began."""
    lease = await store.take(group, node)
    assert lease is not None
    async with store.pool.acquire() as conn:
        await conn.execute("DELETE FROM rankd_epochs WHERE group_id = $1 AND epoch = $2",
                           group, lease.epoch)
    return lease


async def _fill(store: ClusterLog, lease: Lease, first: int, last: int,
                snapshots: tuple[int, ...] = ()) -> None:
    """Append ``first..last`` a record a batch, storing the group's snapshot
    at each position of ``snapshots`` (compacting the log behind it)."""
    for seq in range(first, last + 1):
        await store.append(lease, seq, [f"{lease.epoch}:{seq}".encode()])
        if seq in snapshots:
            assert await store.store_snapshot(lease, seq, lease.epoch, [b"state"])


async def _before_the_upgrade(store: ClusterLog) -> None:
    """Under the previous version: P writes group 9 at epoch 1 (1-100
    committed; under ``--ack local`` it acknowledged more it never shipped)
    and is killed; Q takes epoch 2 at 100, writes 101-300 and stores
    snapshots that compact the log to start after 200.  No epoch has a
    ``rankd_epochs`` row."""
    await _fill(store, await _take_as_before_epochs(store, 9, "p"), 1, 100)
    await asyncio.sleep(0.3)  # P killed: its lease runs out
    await _fill(store, await _take_as_before_epochs(store, 9, "q"), 101, 300,
                snapshots=(200, 300))
    async with store.pool.acquire() as conn:
        assert await conn.fetchval("SELECT min(first_seq) FROM rankd_log "
                                   "WHERE group_id = 9") == 201


def test_an_epoch_taken_before_the_upgrade_never_counts_compacted_positions_as_its_own(
        pg_dsn):
    """A primary killed across the upgrade (:func:`_before_the_upgrade`);
    after it Q takes epoch 3 (a row: it began after 300).  P, back on this
    version, asks where its epoch 1 ended: the answer was 200 (the later
    epoch's start and the compacted log's start, both past epoch 1's end),
    so what P acknowledged at 101-200 counted as committed and was neither
    replayed nor set aside: lost.  The answer may err low (what is set
    aside is resubmitted by event id), never high."""
    async def scenario() -> None:
        async with cluster_tables(pg_dsn, lease_seconds=0.2) as (_, _, store):
            await _before_the_upgrade(store)
            await asyncio.sleep(0.3)
            q3 = await store.take(9, "q")  # Q starts on this version
            assert q3 is not None and q3.epoch == 3
            assert await store.last_seq_of_epoch(9, 1) <= 100
            # Where the epochs are known, the answer is exact.
            assert await store.last_seq_of_epoch(9, 3) == 300

    asyncio.run(scenario())


def test_an_epoch_deposed_by_a_node_before_the_upgrade_never_counts_compacted_positions(
        pg_dsn):
    """As above, P restarting before anyone took the group on this version:
    the register is at epoch 2 (no row), the log starts after 200; epoch 1's
    end was 100, and the answer was 200."""
    async def scenario() -> None:
        async with cluster_tables(pg_dsn, lease_seconds=0.2) as (_, _, store):
            await _before_the_upgrade(store)
            assert await store.last_seq_of_epoch(9, 1) <= 100
            assert await store.last_seq_of_epoch(9, 2) == 300

    asyncio.run(scenario())


def test_a_snapshot_copy_whose_connection_postgres_ended_does_not_hang(pg_dsn):
    """Postgres ends the backend (``pg_terminate_backend``, a restart) while
    a large section streams in by COPY: asyncpg waits for its transport to
    take more data, which a closed connection never does, and no timeout
    covers that wait: the store hung for good (the node's snapshot loop
    with it, so its groups' logs were never compacted again).  It must fail
    at once, store nothing, and the next store must keep the snapshot."""
    async def scenario() -> None:
        async with cluster_tables(pg_dsn) as (_, _, store):
            admin = await asyncpg.connect(pg_dsn)
            try:
                await _terminated_copies(store, admin)
            finally:
                await admin.close()

    asyncio.run(scenario())


async def _terminated_copies(store: ClusterLog, admin: asyncpg.Connection) -> None:
    """Three stores whose COPY ``admin`` ends; then one that keeps the snapshot."""
    lease = await store.take(7, "a")
    await store.append(lease, 1, [b"x"])
    large = bytes(range(256)) * (96 * SNAPSHOT_PIECE // 256)
    sections = [b"head", large, b"tail"]
    for _ in range(3):
        storing = asyncio.ensure_future(
            store.store_snapshot(lease, 1, lease.epoch, sections))
        pid = None
        for _ in range(500):
            pid = await admin.fetchval(
                "SELECT pid FROM pg_stat_activity WHERE query LIKE 'COPY%' "
                "AND datname = current_database() AND pid <> pg_backend_pid()")
            if pid is not None or storing.done():
                break
            await asyncio.sleep(0.002)
        assert pid is not None, "the COPY was not seen running"
        await admin.execute("SELECT pg_terminate_backend($1)", pid)
        done, _ = await asyncio.wait({storing}, timeout=5)
        if not done:
            storing.cancel()
            with contextlib.suppress(BaseException):
                await storing
        assert done, "the store still waits on a connection Postgres closed"
        assert isinstance(storing.exception(), (asyncpg.PostgresError,
                                                asyncpg.InterfaceError, OSError))
        assert await admin.fetchval("SELECT count(*) FROM rankd_group_snapshots") == 0
    assert await store.store_snapshot(lease, 1, lease.epoch, sections)
    assert (await store.snapshot(7))[2] == sections


#: Nodes that acknowledge before Postgres has a write, and store their
#: groups' snapshots (compacting the log) every few records.
LOCAL_ACKS = ("--ack", "local", "--group-snapshot-records", "5")


def _psql() -> str:
    return next(str(d / "psql") for d in PG_BIN_DIRS if (d / "psql").exists())


def _submit(daemon: Daemon, board: str, event_id: str, seconds: float = 20.0) -> None:
    """One event, sent again (same event id) until a node acknowledges it."""
    until = time.monotonic() + seconds
    while True:
        status, answer = daemon.request("POST", f"/v1/boards/{board}/scores",
                                        {"member": event_id, "delta": 1, "event_id": event_id})
        if status == 200:
            return
        assert time.monotonic() < until, (status, answer)
        time.sleep(0.1)


def _compact(dsn: str, daemon: Daemon, board: str, group: int, past: int) -> None:
    """Write ``board`` through ``daemon`` until its snapshots compacted the
    group's log past position ``past``."""
    written, until = 0, time.monotonic() + 30
    while sql(dsn, "SELECT coalesce(min(first_seq), 0) FROM rankd_log WHERE group_id = $1",
              group)[0][0] <= past:
        assert time.monotonic() < until, "the group's log was not compacted"
        for _ in range(10):
            _submit(daemon, board, f"later-{written}")
            written += 1
        time.sleep(0.3)


def _acknowledged_alone(dsn: str, primary: Daemon, board: str, group: int) -> list[str]:
    """Events ``primary`` acknowledged under ``--ack local`` while Postgres
    could not take them (the group's register held by another session),
    then ``primary`` killed (``kill -9``)."""
    blocker = subprocess.Popen([_psql(), dsn, "-q"], stdin=subprocess.PIPE, text=True)
    try:
        assert blocker.stdin is not None
        blocker.stdin.write(f"BEGIN; SELECT 1 FROM rankd_groups WHERE group_id = {group} "
                            "FOR UPDATE;\n")
        blocker.stdin.flush()
        time.sleep(0.2)
        acknowledged = [f"alone-{n}" for n in range(5) if primary.request(
            "POST", f"/v1/boards/{board}/scores",
            {"member": f"alone-{n}", "delta": 1, "event_id": f"alone-{n}"})[0] == 200]
        primary.kill()
        blocker.stdin.write("ROLLBACK;\n\\q\n")
        blocker.stdin.flush()
        blocker.wait(10)
    finally:
        if blocker.poll() is None:
            blocker.kill()
    return acknowledged


def test_a_primary_killed_across_the_upgrade_sets_aside_what_it_acknowledged(
        tmp_path: Path, pg_dsn: str) -> None:
    """Real nodes under ``--ack local``.  Before the upgrade (takes that
    leave no ``rankd_epochs`` row, as the previous version's: a trigger
    drops them) node a writes a board, acknowledges five events Postgres
    never gets and is killed; node b takes the group over and its snapshots
    compact the log past a's epoch.  Then the upgrade (the trigger gone) and
    a starts again: every event it acknowledged must be committed or set
    aside.  a set nothing aside (its epoch's end was taken as the log's
    start): four acknowledged events were lost."""
    a = node(tmp_path, pg_dsn, "a", *LOCAL_ACKS)
    b = node(tmp_path, pg_dsn, "b", *LOCAL_ACKS)
    try:
        a.start()
        wait_ready(a)
        sql(pg_dsn, "CREATE FUNCTION skip_row() RETURNS trigger LANGUAGE plpgsql AS "
                    "$$ BEGIN RETURN NULL; END $$")
        sql(pg_dsn, "CREATE TRIGGER before_epochs BEFORE INSERT ON rankd_epochs "
                    "FOR EACH ROW EXECUTE FUNCTION skip_row()")
        board, group = "up", group_of("up")
        assert a.request("PUT", f"/v1/boards/{board}", {"policy": "sum"})[0] in (200, 201)
        for n in range(3):
            _submit(a, board, f"kept-{n}")
        acknowledged = _acknowledged_alone(pg_dsn, a, board, group)
        assert acknowledged
        b.start()
        wait_ready(b)
        _compact(pg_dsn, b, board, group, past=20)
        sql(pg_dsn, "DROP TRIGGER before_epochs ON rankd_epochs")  # the upgrade
        a.start()
        wait_ready(a)
        assert a.wait_for_log("replaying the group from the log")
        time.sleep(0.5)
        aside = b"".join(path.read_bytes() for path in (tmp_path / "a" / "wal").glob("orphan-*"))
        committed = b"".join(bytes(row[0]) for row in sql(
            pg_dsn, "SELECT records FROM rankd_log UNION ALL "
                    "SELECT data FROM rankd_group_snapshots"))
        lost = [e for e in acknowledged if e.encode() not in aside + committed]
        assert lost == []
    finally:
        for daemon in (a, b):
            if daemon.process is not None and daemon.process.poll() is None:
                daemon.stop(timeout=20)
