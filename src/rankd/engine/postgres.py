"""Postgres: event history, archived standings and disaster recovery.

Postgres is optional and never on the write path.  The
:class:`PostgresShipper` tails the write-ahead log and copies every record,
in log order, into ``rankd_events``; a submission never waits for it, so
Postgres being slow or down costs only *lag*, which is reported and caught
up when it returns.

Exactly once: each batch is inserted and the shipped position advanced in
one transaction, and the record's log position is the primary key.  After
any failure (even one during COMMIT, when the outcome is unknown) the
shipper reconnects, re-reads the shipped position and continues from there.

The engine keeps every WAL segment the shipper has not passed, so nothing
is lost while Postgres is away (the disk holds the backlog).

A record whose columns Postgres refuses (text it cannot store, a time out
of its range) never stops shipping: it is shipped with those columns
emptied (kind ``refused``) and its payload intact, so ``restore`` still
replays it, and its position and the error go to ``rankd_dead_letters``;
the shipper logs it and counts it (``rankd_postgres_dead_letters``).

Only records the fsync policy made durable are shipped
(``WriteAheadLog.shippable_lsn``): Postgres never holds a record a power
loss could take back from the local log.  On every connection the shipper
checks that Postgres and the local log agree on the last shipped record;
if they do not, or the local log cannot give the next record (a segment
missing or corrupt), shipping *stalls*: it says so in its status
(``stalled``), in /v1/ready and /metrics, and logs an error, rather than
wait forever or ship a different history.

:func:`restore` rebuilds a data dir from Postgres alone: it replays the
stored records into a fresh WAL, opens an engine on it and snapshots.  This
module imports no engine module above the WAL: what it needs of the engine
(:func:`restore`'s ``rebuild``) is passed in.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg

from rankd._tasks import stop_task
from rankd.engine.wal import WalCorruptError, WalReader, WriteAheadLog
from rankd.postgres_link import POSTGRES_ERRORS, reconnecting

log = logging.getLogger(__name__)

SHIP_BATCH = 10_000
RETRY_MIN_SECONDS = 0.2
RETRY_MAX_SECONDS = 5.0

#: Versioned migrations: MIGRATIONS[i] takes the schema from version i to i + 1.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE rankd_events (
        lsn        bigint PRIMARY KEY,
        kind       text NOT NULL,
        board      text NOT NULL,
        member     text,
        value      double precision,
        event_ts   timestamptz NOT NULL,
        payload    bytea NOT NULL
    );
    CREATE INDEX rankd_events_board_ts ON rankd_events (board, event_ts);
    CREATE TABLE rankd_shipper (
        id          int PRIMARY KEY CHECK (id = 1),
        shipped_lsn bigint NOT NULL,
        updated_at  timestamptz NOT NULL
    );
    INSERT INTO rankd_shipper VALUES (1, 0, now());
    CREATE TABLE rankd_archive (
        board       text NOT NULL,
        time_window text NOT NULL,
        period      text NOT NULL,
        rank        int NOT NULL,
        member      text NOT NULL,
        score       double precision NOT NULL,
        label       text,
        archived_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (board, time_window, period, rank)
    );
    """,
    # Records whose columns Postgres refused (see PostgresShipper._set_aside).
    """
    CREATE TABLE rankd_dead_letters (
        lsn       bigint PRIMARY KEY,
        error     text NOT NULL,
        noted_at  timestamptz NOT NULL DEFAULT now()
    );
    """,
]
SCHEMA_VERSION = len(MIGRATIONS)
_EVENT_COLUMNS = ["lsn", "kind", "board", "member", "value", "event_ts", "payload"]


async def migrate(conn: asyncpg.Connection) -> int:
    """Bring the schema to :data:`SCHEMA_VERSION`; returns the version found."""
    async with conn.transaction():
        # One migrator at a time, even with several rankd processes.
        await conn.execute("SELECT pg_advisory_xact_lock(7231001)")
        await conn.execute("CREATE TABLE IF NOT EXISTS rankd_schema (version int NOT NULL)")
        found = await conn.fetchval("SELECT max(version) FROM rankd_schema") or 0
        if found > SCHEMA_VERSION:
            raise RuntimeError(f"the Postgres schema is version {found}, newer than this "
                               f"rankd knows ({SCHEMA_VERSION}); upgrade rankd")
        for version in range(found, SCHEMA_VERSION):
            await conn.execute(MIGRATIONS[version])
            await conn.execute("INSERT INTO rankd_schema VALUES ($1)", version + 1)
            log.info("Postgres schema migrated to version %d", version + 1)
        return found


class ShippingStalled(Exception):
    """Shipping cannot go on without an operator: the local log and Postgres
    disagree, or the local log lacks a record it must ship."""


class PostgresShipper:
    """Copies WAL records to ``rankd_events`` in the background, exactly once."""

    def __init__(self, dsn: str, wal: WriteAheadLog,
                 describe: Callable[[bytes], dict[str, Any]], *,
                 batch: int = SHIP_BATCH) -> None:
        self.dsn = dsn
        self.wal = wal
        self.describe = describe
        self.batch = batch
        #: Highest position known to be in Postgres (0 until first connected).
        self.shipped_lsn = 0
        self.connected = False
        self.last_error: str | None = None
        self.shipped_total = 0
        self.errors = 0
        #: Records set aside because Postgres refused their columns.
        self.dead_letters = 0
        self._caught_up_at = time.monotonic()
        #: Why shipping cannot make progress (None while it can).
        self.stalled: str | None = None
        self._reader = WalReader(wal, 1, durable_only=True)
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._known = False  # shipped_lsn read from Postgres at least once

    async def start(self) -> None:
        """Start shipping in the background; returns at once, even if Postgres is down."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="rankd-postgres-shipper")

    async def stop(self) -> None:
        """Stop shipping (what is not shipped yet stays in the WAL for next time)."""
        await stop_task(self._task)
        self._task = None

    def notify(self) -> None:
        """New records were committed: ship them soon."""
        self._wakeup.set()

    @property
    def known(self) -> bool:
        """Whether ``shipped_lsn`` was read from Postgres (else it is a lower bound)."""
        return self._known

    def status(self) -> dict[str, Any]:
        """Shipping state for health checks and metrics."""
        lag = max(0, self.wal.written_lsn - self.shipped_lsn)
        if lag == 0:
            self._caught_up_at = time.monotonic()
        return {"connected": self.connected, "shipped_lsn": self.shipped_lsn,
                "lag_records": lag, "lag_seconds": time.monotonic() - self._caught_up_at,
                "last_error": self.last_error, "stalled": self.stalled}

    async def wait_shipped(self, lsn: int, timeout: float = 30.0) -> None:
        """Wait until ``lsn`` is in Postgres (tests, clean shutdown, tools)."""
        deadline = time.monotonic() + timeout
        while self.shipped_lsn < lsn:
            if time.monotonic() > deadline:
                raise TimeoutError(f"position {lsn} not shipped within {timeout}s "
                                   f"(shipped {self.shipped_lsn}; {self.last_error})")
            self.notify()
            await asyncio.sleep(0.02)

    async def _run(self) -> None:
        async for conn in reconnecting(self.dsn, down=self._down, min_delay=RETRY_MIN_SECONDS,
                                       max_delay=RETRY_MAX_SECONDS, reset_on_connect=False):
            try:
                await migrate(conn)
                await self._ship_loop(conn)
            except (ShippingStalled, WalCorruptError) as exc:
                self._stall(exc)
            except POSTGRES_ERRORS as exc:
                self._down(exc)
            except Exception as exc:
                # E.g. Postgres lost commits it acknowledged and now asks for
                # records the WAL no longer has: keep reporting, keep trying.
                log.exception("Postgres shipping failed")
                self._down(exc)
            finally:
                self.connected = False

    def _stall(self, exc: BaseException) -> None:
        message = str(exc)
        if message != self.stalled:
            log.error("Postgres shipping STALLED at position %d and cannot go on by itself: "
                      "%s", self.shipped_lsn + 1, message)
        self.stalled = message
        self.errors += 1
        self.connected = False

    def _down(self, exc: BaseException) -> None:
        message = f"{type(exc).__name__}: {exc}"
        if message != self.last_error:
            log.warning("Postgres shipping paused (%s); retrying, the WAL keeps the backlog",
                        message)
        self.last_error = message
        self.errors += 1
        self.connected = False

    async def _ship_loop(self, conn: asyncpg.Connection) -> None:
        self.shipped_lsn = await conn.fetchval(
            "SELECT shipped_lsn FROM rankd_shipper WHERE id = 1")
        self._known = True
        await self._check_agreement(conn)
        self.connected = True
        self.last_error = None
        self.stalled = None
        self._reader.seek(self.shipped_lsn + 1)
        log.info("shipping WAL to Postgres from position %d", self.shipped_lsn + 1)
        while True:
            batch = self._reader.read(self.batch)
            if not batch:
                self._wakeup.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wakeup.wait(), 0.5)
                continue
            await self._ship(conn, batch)

    async def _check_agreement(self, conn: asyncpg.Connection) -> None:
        """Postgres and the local log must hold the same last shipped record:
        anything else means one of them lost records the other has."""
        shipped = self.shipped_lsn
        if shipped > self.wal.last_lsn:
            raise ShippingStalled(
                f"Postgres holds records up to position {shipped} but the local log ends at "
                f"{self.wal.last_lsn}: this node lost records {self.wal.last_lsn + 1}-"
                f"{shipped} (restart it to take them back from Postgres)")
        if shipped == 0:
            return
        try:
            local = WalReader(self.wal, shipped).read(1)
        except WalCorruptError:
            local = []
        if not local or local[0][0] != shipped:
            return  # already compacted away locally: nothing left to compare
        remote = await conn.fetchval("SELECT payload FROM rankd_events WHERE lsn = $1", shipped)
        if remote is not None and bytes(remote) != local[0][1]:
            raise ShippingStalled(
                f"the record at position {shipped} differs between Postgres and the local "
                "log: they hold different histories")

    def _row(self, lsn: int, payload: bytes) -> tuple:
        try:
            columns = self.describe(payload)
        except (ValueError, OverflowError, TypeError, KeyError) as exc:
            return self._refused_row(lsn, payload, f"cannot read its columns: {exc!r}")
        return (lsn, columns["kind"], columns["board"], columns.get("member"),
                columns.get("value"), columns["event_ts"], payload)

    def _refused_row(self, lsn: int, payload: bytes, error: str) -> tuple:
        self._refused[lsn] = error
        return (lsn, "refused", "", None, None, datetime.now(UTC), payload)

    async def _ship(self, conn: asyncpg.Connection, batch: list[tuple[int, bytes]]) -> None:
        self._refused: dict[int, str] = {}
        rows = [self._row(lsn, payload) for lsn, payload in batch]
        try:
            await self._insert(conn, batch, rows)
        except asyncpg.DataError:
            # One record (or more) Postgres cannot store: find which, one
            # by one, and set them aside rather than retry the batch forever.
            rows = [await self._checked_row(conn, row) for row in rows]
            await self._insert(conn, batch, rows)

    async def _checked_row(self, conn: asyncpg.Connection, row: tuple) -> tuple:
        try:
            async with conn.transaction():
                await conn.copy_records_to_table("rankd_events", records=[row],
                                                 columns=_EVENT_COLUMNS)
                raise _RolledBack
        except _RolledBack:
            return row
        except asyncpg.DataError as exc:
            return self._refused_row(row[0], row[6], f"{type(exc).__name__}: {exc}")

    async def _insert(self, conn: asyncpg.Connection, batch: list[tuple[int, bytes]],
                      rows: list[tuple]) -> None:
        last = batch[-1][0]
        async with conn.transaction():
            stored = await conn.fetchval(
                "SELECT shipped_lsn FROM rankd_shipper WHERE id = 1 FOR UPDATE")
            if stored != batch[0][0] - 1:
                # Someone else shipped meanwhile (or we are behind): resync.
                self.shipped_lsn = stored
                self._reader.seek(stored + 1)
                return
            await conn.copy_records_to_table("rankd_events", records=rows,
                                             columns=_EVENT_COLUMNS)
            if self._refused:
                await conn.executemany(
                    "INSERT INTO rankd_dead_letters (lsn, error) VALUES ($1, $2)",
                    list(self._refused.items()))
            await conn.execute(
                "UPDATE rankd_shipper SET shipped_lsn = $1, updated_at = now() WHERE id = 1",
                last)
        for lsn, error in self._refused.items():
            log.error("Postgres refused the columns of record %d (%s): shipped as 'refused' "
                      "with its payload, noted in rankd_dead_letters", lsn, error)
        self.dead_letters += len(self._refused)
        self.shipped_lsn = last
        self.shipped_total += len(batch)
        if last >= self.wal.written_lsn:
            self._caught_up_at = time.monotonic()


class _RolledBack(Exception):
    """Undoes a trial insert (see ``PostgresShipper._checked_row``)."""


async def records_beyond(dsn: str, lsn: int, *, timeout: float = 10.0
                         ) -> list[tuple[int, bytes]] | None:
    """``(lsn, payload)`` of every record Postgres holds after position
    ``lsn``, in order: what a node whose log ends at ``lsn`` shipped and then
    lost.  ``None`` (logged) when Postgres cannot be asked."""
    try:
        conn = await asyncpg.connect(dsn, timeout=timeout)
    except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
        log.warning("Postgres unreachable at start (%s): cannot check that it holds no record "
                    "this node lost; the shipper checks when it connects", exc)
        return None
    try:
        if not await conn.fetchval("SELECT to_regclass('rankd_shipper') IS NOT NULL"):
            return []
        shipped = await conn.fetchval("SELECT shipped_lsn FROM rankd_shipper WHERE id = 1")
        if shipped <= lsn:
            return []
        rows = await conn.fetch("SELECT lsn, payload FROM rankd_events WHERE lsn > $1 AND "
                                "lsn <= $2 ORDER BY lsn", lsn, shipped)
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(conn.close(), 2)
    found = [(row[0], bytes(row[1])) for row in rows]
    if [position for position, _ in found] != list(range(lsn + 1, shipped + 1)):
        raise RuntimeError(f"Postgres says it holds records up to {shipped} but lacks some "
                           f"after {lsn}: it cannot give back what this node lost")
    return found


async def archive_standings(dsn: str, board: str, window: str, period: str,
                            entries: list[dict[str, Any]]) -> None:
    """Store a closed period's final standings in ``rankd_archive``."""
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        await migrate(conn)
        async with conn.transaction():
            await conn.execute("DELETE FROM rankd_archive WHERE board = $1 AND time_window = $2 "
                               "AND period = $3", board, window, period)
            await conn.copy_records_to_table(
                "rankd_archive",
                records=[(board, window, period, e["rank"], e["member"], e["score"],
                          e.get("label")) for e in entries],
                columns=["board", "time_window", "period", "rank", "member", "score", "label"])
    finally:
        await conn.close()


async def fetch_archive(dsn: str, board: str, window: str, period: str
                        ) -> list[dict[str, Any]]:
    """A closed period's archived standings, best first."""
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        rows = await conn.fetch(
            "SELECT rank, member, score, label FROM rankd_archive WHERE board = $1 AND "
            "time_window = $2 AND period = $3 ORDER BY rank", board, window, period)
    finally:
        await conn.close()
    return [dict(row) for row in rows]


async def restore(dsn: str, data_dir: str | Path, rebuild: Callable[[Path], Awaitable[int]],
                  *, progress: Callable[[int, int], None] | None = None) -> int:
    """Rebuild ``data_dir`` from the events in Postgres; returns the last position.

    ``data_dir`` must not hold a WAL or snapshots already.  The records are
    written to a fresh WAL with their original positions; ``rebuild``
    (``Engine.rebuild``, passed in so that this module does not import the
    engine, which imports it) then replays them as after a crash, writes a
    snapshot and returns the last position.
    """
    data_dir = Path(data_dir)
    for part in ("wal", "snapshots"):
        existing = data_dir / part
        if existing.exists() and any(existing.iterdir()):
            raise RuntimeError(f"{existing} is not empty: restore only into a new data dir")
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        if not await conn.fetchval("SELECT to_regclass('rankd_events') IS NOT NULL"):
            raise RuntimeError("the database holds no rankd events (no rankd_events table)")
        total = await conn.fetchval("SELECT count(*) FROM rankd_events")
        wal = WriteAheadLog(data_dir / "wal", fsync="no")
        expected = 1
        async with conn.transaction():
            cursor = conn.cursor("SELECT lsn, payload FROM rankd_events ORDER BY lsn",
                                 prefetch=SHIP_BATCH)
            async for lsn, payload in cursor:
                if lsn != expected:
                    raise RuntimeError(f"Postgres lacks event {expected} (next is {lsn}); "
                                       "cannot restore a consistent state")
                wal.append(payload)
                expected += 1
                if expected % SHIP_BATCH == 0:
                    await wal.commit(wal.last_lsn)
                    if progress is not None:
                        progress(expected - 1, total)
        await wal.close()
    finally:
        await conn.close()
    last = await rebuild(data_dir)
    log.info("restored %d events from Postgres into %s", expected - 1, data_dir)
    return last
