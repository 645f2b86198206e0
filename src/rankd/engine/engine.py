"""The engine: the one place where leaderboard state changes.

Every front-end (REST, live feed, TCP, CLI) calls the engine; the engine
calls the rank indexes and the write-ahead log.  A write goes through two
steps, the first synchronous, so no other coroutine can interleave with it:

1. *apply*: submissions go through :func:`rankd.engine.ingest.ingest`
   (validate, answer duplicates from the dedupe table, apply the board's
   policy and guards, write the absolute new scores to the indexes with the
   log position as arrival sequence, build the WAL records); board changes
   and removals through :meth:`Engine._apply_record`.  Recovery replays the
   same records: it hands each index the absolute states SUBMIT records
   carry, many at once (``RankIndex.set_states``), and applies the other
   records with :meth:`Engine._apply_record`, as Redis replays its AOF
   through the normal command path;
2. *commit*: append the records and wait until the WAL policy says they
   are safe (written to the OS, or fsynced with ``fsync=always``), then
   acknowledge.

If the log cannot be written the engine stops accepting writes
(:class:`ReadOnly`) until restarted; reads keep working.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import gc
import hashlib
import itertools
import json
import logging
import math
import operator
import os
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from rankd._tasks import outcome_seen
from rankd.engine import collector, expiry, records, staging, zeros
from rankd.engine.board import Board
from rankd.engine.coalescer import SubmitCoalescer
from rankd.engine.config import (
    BoardConfig,
    check_board_name,
    file_name_of,
)
from rankd.engine.errors import (
    Conflict,
    EngineError,
    InvalidInput,
    NotFound,
    NotPrimary,
    ReadOnly,
    StorageError,
    Unacknowledged,
    Unavailable,
    Unsettled,
)
from rankd.engine.expiry import Deadlines
from rankd.engine.frames import HEADER_BYTES
from rankd.engine.groups import group_of
from rankd.engine.ingest import Ingested, check_member, ingest, ingest_packed, missing_board
from rankd.engine.intake import Intake, Then
from rankd.engine.periods import check_window, period_of, period_start
from rankd.engine.reads import PlainReads
from rankd.engine.replay import gather_submit, replay_submits
from rankd.engine.replication import GroupWriter, Replication
from rankd.engine.settling import ReadGates
from rankd.engine.snapshot import SnapshotStore
from rankd.engine.submission import Submission
from rankd.engine.tail import (
    DEFAULT_SNAPSHOT_EVERY_BYTES,
    DEFAULT_SNAPSHOT_EVERY_EVENTS,
    MAX_SNAPSHOT_EVERY_EVENTS,
    TailBytes,
    check_tail_options,
)
from rankd.engine.transaction import Transaction
from rankd.engine.view import SortedView
from rankd.engine.wal import WalCorruptError, WalFailedError, WriteAheadLog

log = logging.getLogger(__name__)

#: How long a read of a cluster primary's group waits for the writes it
#: would show to commit (see rankd.engine.settling).
SETTLE_SECONDS = 5.0
#: Reads made again after waiting so, at most, before ``Unsettled`` is the answer.
SETTLE_TRIES = 3
T = TypeVar("T")

FSYNC_POLICIES = ("always", "everysec", "no")
ARCHIVE_DEPTH = 1000
REPLAY_BATCH = 10_000

#: Replayed index states held before they are applied: enough for a large
#: index to take them in one re-threading pass, few enough to bound memory.
REPLAY_PENDING_STATES = 1_000_000
#: Labels copied, then encoded, per step of a snapshot (each a few ms of
#: event-loop time).
SNAPSHOT_CHUNK = 20_000
#: Boards housekeeping looks at before it lets the event loop run.
HOUSEKEEPING_STEP = 64
#: Remembered event ids are copied for a snapshot in chunks of about this
#: many bytes (their portable log form: see rankd.engine.dedupe).
SNAPSHOT_LOG_BYTES = 4 << 20


@dataclass
class EngineConfig:
    """Engine settings; the defaults work with no configuration at all."""

    data_dir: Path = Path("rankd-data")
    #: ``always``: acknowledge after fsync (group commit); ``everysec``:
    #: fsync once a second (a machine crash may lose the last second; a
    #: process crash loses nothing); ``no``: leave it to the OS.
    fsync: str = "everysec"
    segment_bytes: int = 64 << 20
    #: A snapshot is wanted after this many WAL records or bytes since the
    #: last one, whichever first (bounded: see rankd.engine.tail).
    snapshot_every_events: int = DEFAULT_SNAPSHOT_EVERY_EVENTS
    snapshot_every_bytes: int = DEFAULT_SNAPSHOT_EVERY_BYTES
    snapshot_every_seconds: float = 300.0
    dedupe_ttl: float = 86_400.0
    #: How far an event's timestamp may be from the engine clock, seconds.
    ts_tolerance: float = 300.0
    housekeeping_seconds: float = 30.0
    postgres_dsn: str | None = None
    #: Truncate the WAL at a mid-log corruption (keeping the rest aside)
    #: instead of refusing to start.
    repair: bool = False

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir)
        if self.fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync must be one of {', '.join(FSYNC_POLICIES)}, "
                             f"got {self.fsync!r}")
        check_tail_options(self.snapshot_every_events, self.snapshot_every_bytes)


class Engine:
    """Boards, their windows and the durable log behind them."""

    def __init__(self, config: EngineConfig | None = None, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.config = config or EngineConfig()
        self.clock = clock
        #: Boards whose writes wait for a snapshot (``Board.writable`` clear).
        self._held: set[str] = set()
        #: The packed path's front door (see rankd.engine.intake), which
        #: front-ends reach through the service; ``boards`` and
        #: ``replication`` keep it up to date.
        self.intake = Intake(self, self._held, self._run_pass, self._submit_packed_later)
        #: Answers packed plain reads (RESP's), natively when built; kept up
        #: to date like the intake.
        self.plain_reads = PlainReads({})
        #: Boards' deadlines (see rankd.engine.expiry); the native paths
        #: hold its set of boards about to expire, and leave those alone.
        self.deadlines = Deadlines()
        self.intake.expiring = self.plain_reads.expiring = self.deadlines.expiring
        #: Set when a deadline is set, for the expiry task to look again.
        self._deadline_set = asyncio.Event()
        self.boards: dict[str, Board] = {}
        self.wal: WriteAheadLog | None = None
        self.snapshots = SnapshotStore(self.config.data_dir / "snapshots")
        self.shipper: Any = None
        #: Set once recovery finished and the engine serves.
        self.ready = False
        #: The storage error that made the engine read-only, if any.
        self.failure: BaseException | None = None
        #: Called with a board name after each change (live feed, caches).
        self.listeners: list[Callable[[str], None]] = []
        self.last_snapshot: dict[str, Any] = {}
        #: Submissions by outcome, for metrics.
        self.stats = {"applied": 0, "duplicate": 0, "rejected": 0}
        #: Merges the submissions of concurrent callers into one batch.
        self.coalescer = SubmitCoalescer(self._submit_batch)
        self._lock_fd: int | None = None
        self._tasks: list[asyncio.Task] = []
        self._snapshot_lock = asyncio.Lock()
        self._events_since_snapshot = 0
        #: Events after which a snapshot is wanted: ``snapshot_every_events``,
        #: or as many as the last snapshot wrote entries if that is more, up
        #: to the bound (see rankd.engine.tail).
        self._snapshot_threshold = self.config.snapshot_every_events
        self._tail_bytes = TailBytes(self.config.snapshot_every_bytes)
        self._last_snapshot_time = 0.0
        self._snapshot_wanted = asyncio.Event()
        #: This pass of the event loop's writes (see :meth:`_run_pass`): the
        #: future its waiters share (made when one asks) and their boards;
        #: the intake holds the packed runs it applies first, who to tell
        #: when they are committed, and whether the pass is scheduled.
        self._pass_commit: asyncio.Future[None] | None = None
        self._pass_boards: set[str] = set()
        #: Passes waiting for their fsync (or for runs gone the general way).
        self._finishing: set[asyncio.Future[None]] = set()
        #: On a cluster node, the pass's packed runs by board group, and the
        #: future of each group's (done once the ack mode is met).
        self._pass_groups: dict[int, tuple[list[Any], asyncio.Future[None]]] = {}
        self._closed = False
        #: Replay: (board, window, period) -> states not yet in the index.
        self._replayed: dict[tuple[str, str, str], list[tuple[str, float, int]]] = {}
        self._replayed_count = 0
        self._rolled_back = asyncio.Event()
        self.replication = None
        #: A cluster node's place in each group's log: group -> (seq, epoch)
        #: of the last record it applied.
        self.positions: dict[int, tuple[int, int]] = {}
        #: Set (and replaced) whenever ``positions`` advance.
        self._advanced = asyncio.Event()
        #: A cluster primary's groups whose writes wait while readers settle.
        self.read_gates = ReadGates()
        #: While a transaction runs its step: the groups whose uncommitted
        #: writes its reads met (it answers once they commit), else None.
        self.unsettled_reads: set[int] | None = None
        #: Boards being built in steps, by name, and the building whose turn
        #: it is for each name (see rankd.engine.staging).
        self._staged: dict[str, staging.Staged] = {}
        self._staging_turns: dict[str, asyncio.Future[None]] = {}
        #: How many holds each held board has (a snapshot's, a store's), by name.
        self._holds: dict[str, int] = {}

    @property
    def boards(self) -> dict[str, Board]:
        """Every board, by name."""
        return self._boards

    @boards.setter
    def boards(self, boards: dict[str, Board]) -> None:
        self._boards = self.intake.boards = self.plain_reads.boards = boards

    @property
    def rolling_back(self) -> bool:
        """Set while the state is rebuilt after a storage failure: reads are
        refused meanwhile (the native ones too, ``plain_reads.paused``)."""
        return self.plain_reads.paused

    @rolling_back.setter
    def rolling_back(self, rolling_back: bool) -> None:
        self.plain_reads.paused = rolling_back

    @property
    def replication(self) -> Replication | None:
        """Set (before start) on a cluster node: see rankd.engine.replication."""
        return self._replication

    @replication.setter
    def replication(self, replication: Replication | None) -> None:
        self._replication = replication
        self.intake.replicated = replication is not None
        self.plain_reads.replication = replication

    # --- life cycle -------------------------------------------------------------

    @classmethod
    async def open(cls, config: EngineConfig | None = None, *,
                   clock: Callable[[], float] = time.time) -> Engine:
        """Lock the data dir, recover (snapshot + WAL tail) and start serving."""
        engine = cls(config, clock=clock)
        await engine.start()
        return engine

    @classmethod
    async def rebuild(cls, data_dir: Path) -> int:
        """Open ``data_dir`` as after a crash (replaying its log), close it
        with a snapshot and return its last position: what
        :func:`rankd.engine.postgres.restore` does once the log is written."""
        engine = await cls.open(EngineConfig(data_dir=data_dir, fsync="always"))
        try:
            return engine.wal.last_lsn
        finally:
            await engine.close(snapshot=True)

    def lock(self) -> None:
        """Take the data dir's lock; ``RuntimeError`` if another process has it."""
        if self._lock_fd is None:
            self.config.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._lock_data_dir()

    async def start(self) -> None:
        """Recover and start serving (takes the lock first if needed)."""
        self.lock()
        try:
            await asyncio.to_thread(self._recover)
            await self.wal.start()
            if self.config.postgres_dsn:
                from rankd.engine.postgres import PostgresShipper

                await self._take_back_lost_records()
                self.shipper = PostgresShipper(self.config.postgres_dsn, self.wal,
                                               records.describe)
                await self.shipper.start()
        except BaseException:
            self._unlock_data_dir()
            raise
        if self._staged and self._replication is None:
            # Built by a rankd that stopped before their end (records taken
            # back included): nothing to show.  (A cluster's may still end.)
            log.info("recovery: dropping %d store(s) left unfinished: %s", len(self._staged),
                     ", ".join(sorted(self._staged)[:10]))
            self._staged.clear()
        self._last_snapshot_time = time.monotonic()
        if zeros.settle_after_load(self._boards):
            # The -0 scores this restart made 0 are in no record: a snapshot soon keeps them so.
            self._events_since_snapshot += 1
            self._last_snapshot_time = -math.inf
        self._tasks.append(asyncio.create_task(self._snapshot_loop(), name="rankd-snapshots"))
        self._tasks.append(asyncio.create_task(self._housekeeping_loop(),
                                               name="rankd-housekeeping"))
        self._tasks.append(asyncio.create_task(self._expiry_loop(), name="rankd-expiry"))
        self.ready = True
        # (The intake commits a common pass itself when the log writes at once.)
        self.intake.commits_now = self._replication is None and self.wal.fsync != "always"

    async def close(self, *, snapshot: bool = True) -> None:
        """Flush the WAL, snapshot (unless told not to) and release the data dir."""
        if self._closed:
            return
        self._closed = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        try:
            if self.wal is not None and self.failure is None:
                with contextlib.suppress(WalFailedError):
                    await self.wal.commit(self.wal.last_lsn)
                if snapshot and self.ready:
                    try:
                        await self.snapshot()
                    except EngineError as exc:  # e.g. a full disk: the WAL holds it all
                        log.error("no snapshot at shutdown (%s); the WAL keeps everything and "
                                  "the next start replays it", exc)
            if self.shipper is not None:
                if self.shipper.connected and self.failure is None:
                    # Give a live connection a moment to catch up before exit.
                    with contextlib.suppress(TimeoutError):
                        await self.wal.sync()
                        await self.shipper.wait_shipped(self.wal.shippable_lsn, timeout=5)
                await self.shipper.stop()
        finally:
            if self.wal is not None:
                await self.wal.close()
            self._unlock_data_dir()

    async def set_local_state_aside(self, reason: BaseException) -> Path:
        """A cluster node whose local log cannot be recovered: move the log
        and snapshots aside (kept, never deleted) and start empty; the
        cluster's log is the authority, and following it rebuilds every
        group."""
        if self._replication is None:
            raise RuntimeError("only a cluster node may set its local state aside")
        if self.wal is not None:
            with contextlib.suppress(Exception):
                await self.wal.close()
        self.wal = None
        self.intake.commits_now = False
        self.boards, self.positions = {}, {}
        self._replayed, self._replayed_count = {}, 0
        aside = self.config.data_dir / f"aside-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
        aside.mkdir(mode=0o700)
        for part in ("wal", "snapshots"):
            if (self.config.data_dir / part).exists():
                os.replace(self.config.data_dir / part, aside / part)
        self.snapshots = SnapshotStore(self.config.data_dir / "snapshots")
        log.error("the local log cannot be recovered (%s); it is set aside in %s and this "
                  "node starts empty, replaying every group from the cluster's log", reason,
                  aside)
        return aside

    async def start_again_empty(self) -> Path:
        """A cluster node whose local log failed (a full disk) and whose data
        dir takes writes again: set the local state aside (see
        :meth:`set_local_state_aside`), open a new, empty log and accept
        writes again, without a restart.  The caller stops applying the
        cluster's logs first and follows every group from the start after."""
        reason = self.failure or (self.wal.failure if self.wal is not None else None)
        await self.settled()  # the roll-back of what the failed log never took
        aside = await self.set_local_state_aside(reason or RuntimeError("a failed log"))
        self.failure = None
        self._rolled_back = asyncio.Event()
        self.rolling_back = False
        await asyncio.to_thread(self._recover)
        await self.wal.start()
        if not any(task.get_name() == "rankd-snapshots" and not task.done()
                   for task in self._tasks):  # (its loop ends when the log fails)
            self._tasks.append(asyncio.create_task(self._snapshot_loop(),
                                                   name="rankd-snapshots"))
        return aside

    def _lock_data_dir(self) -> None:
        path = self.config.data_dir / "LOCK"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = path.read_text().strip() or "another process"
            raise RuntimeError(
                f"data dir {self.config.data_dir} is in use by {holder}; "
                "a second rankd cannot share it"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}\n".encode())
        self._lock_fd = fd

    def _unlock_data_dir(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing releases the flock
            self._lock_fd = None

    # --- recovery -----------------------------------------------------------------

    def _recover(self) -> None:
        """Latest valid snapshot, then the WAL tail through the normal apply path.

        The cyclic garbage collector is paused meanwhile: recovery builds
        millions of long-lived objects and no cycles, and the collector would
        walk them again and again (it doubled recovery time).  Afterwards a
        large recovered state is frozen (:func:`collector.keep_recovered`),
        or the first young collection would walk all of it at once.
        """
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            self._recover_state()
        finally:
            if was_enabled:
                collector.keep_recovered()
                gc.enable()

    def _recover_state(self) -> None:
        started = time.monotonic()
        self.snapshots.open()
        snapshot_lsn = 0
        latest = self.snapshots.latest()
        if latest is not None:
            snapshot_lsn, sections = latest
            self._load_snapshot(sections)
            self._check_snapshot_kind(sections)
        self.wal = WriteAheadLog(self.config.data_dir / "wal", fsync=self.config.fsync,
                                 segment_bytes=self.config.segment_bytes,
                                 repair=self.config.repair, after_lsn=snapshot_lsn)
        self._check_log_covers(snapshot_lsn)
        total = max(0, self.wal.last_lsn - snapshot_lsn)
        replayed = 0
        reported = 0
        tail_bytes = 0
        for batch in self.wal.iter_batches(snapshot_lsn + 1, REPLAY_BATCH):
            self._replay_local(batch)
            replayed += len(batch)
            tail_bytes += sum(map(len, map(operator.itemgetter(1), batch)))
            if replayed - reported >= REPLAY_BATCH * 20:
                reported = replayed
                log.info("recovery: replayed %d of %d WAL records (%.0f%%)",
                         replayed, total, 100 * replayed / max(total, 1))
        self._apply_replayed()
        self._events_since_snapshot = replayed
        self._tail_bytes.recovered(tail_bytes + replayed * HEADER_BYTES)
        log.info("recovered %d boards from snapshot @%d and %d WAL records in %.2fs",
                 len(self._boards), snapshot_lsn, replayed, time.monotonic() - started)

    async def _take_back_lost_records(self) -> None:
        """Records Postgres holds beyond the end of the local log were durable
        here once (only those are shipped), so the local disk lost them:
        take them back, at the same positions, before taking writes (a new
        write must never reuse a position Postgres already holds)."""
        from rankd.engine.postgres import records_beyond

        lost = await records_beyond(self.config.postgres_dsn, self.wal.last_lsn)
        if not lost:
            return
        log.error("the local log ends at position %d but Postgres holds %d records after it "
                  "(%d-%d), shipped from here before this disk lost them; taking them back",
                  self.wal.last_lsn, len(lost), lost[0][0], lost[-1][0])
        self.wal.append_many([payload for _, payload in lost])
        await self.wal.make_durable(self.wal.last_lsn)
        await asyncio.to_thread(self._replay_taken_back, lost)

    def _replay_taken_back(self, taken: list[tuple[int, bytes]]) -> None:
        self._replay_local(taken)
        self._apply_replayed()

    def _check_log_covers(self, snapshot_lsn: int) -> None:
        """The log must go on exactly where the snapshot stops: a snapshot
        covers only what was durable in the log when it was written, and
        segments are removed only once a snapshot covers them, so a log
        that starts after it or ends before it lost segments."""
        first, found = self.wal.first_lsn, self.wal.found_lsn
        missing = None
        if first is not None and first > snapshot_lsn + 1:
            missing = (f"the WAL starts at position {first} but the snapshot covers only up to "
                       f"{snapshot_lsn}: records {snapshot_lsn + 1}-{first - 1} are missing")
        elif found < snapshot_lsn:
            missing = (f"the WAL ends at position {found} but the snapshot was taken at "
                       f"{snapshot_lsn}, once the log held it: its newest segments are missing")
        if missing is None:
            return
        if not self.config.repair:
            raise WalCorruptError(self.wal.directory, 0, missing)
        log.error("%s; going on because repair is enabled", missing)

    def _check_snapshot_kind(self, sections: list[bytes]) -> None:
        """A cluster node's snapshot starts with its positions in the groups'
        logs; a single node's has none.  Neither may start as the other."""
        of_a_node = bool(sections) and records.decode(sections[0])[0] == "positions"
        if self._replication is not None and not of_a_node and sections:
            raise RuntimeError(f"{self.config.data_dir}: its snapshot is a single node's; "
                               "this data dir was not a cluster node's: start it without "
                               "--cluster-dsn, or the node with an empty data dir")
        if self._replication is None and of_a_node:
            raise RuntimeError(f"{self.config.data_dir}: its snapshot is a cluster node's: "
                               "start this data dir with the --cluster-dsn it was a node of")

    def _load_snapshot(self, sections: list[bytes]) -> None:
        from rankd.index import RankIndex

        for payload in sections:
            section = records.decode(payload)
            kind = section[0]
            if kind == "board":
                _, name, config, version, updated_at = section
                self._forget_board(name)
                board = self._boards[name] = Board(name, BoardConfig.from_dict(dict(config)))
                board.version, board.updated_at = version, updated_at
            elif kind == "expiry":
                self._set_deadline(self._boards[section[1]], section[2])
            elif kind == "index":
                _, name, window, period, dump = section
                self._boards[name].periods[window][period] = RankIndex.load(dump)
            elif kind == "label_columns":
                self._boards[section[1]].labels.update(zip(section[2], section[3], strict=True))
            elif kind == staging.SECTION:
                self._apply_record(section[1], records.decode(section[2]))
            elif kind == "positions":
                self.positions = {group: (seq, epoch) for group, (seq, epoch)
                                  in section[1].items()}
            elif kind == "event_id_log":
                self._boards[section[1]].dedupe.load_log(section[2])
            elif kind == "event_id_columns":  # written as columns until 2026-11-24
                self._boards[section[1]].dedupe.load_packed(section[2], section[3])
            elif kind == "labels":  # written as maps until 2026-11
                self._boards[section[1]].labels.update(section[2])
            elif kind == "event_ids":  # likewise
                entries = section[2]
                self._boards[section[1]].dedupe.load_packed(tuple(entries), tuple(entries.values()))
            elif kind == "dedupe":  # written before event ids were stored packed
                self._boards[section[1]].dedupe.load(section[2])
            else:
                raise RuntimeError(f"unknown snapshot section {kind!r} (written by a newer "
                                   "rankd?)")

    # --- replay and board changes ---------------------------------------------------

    def _replay_local(self, batch: list[tuple[int, bytes]]) -> None:
        """Replay records of the local log: as they are on a single node; a
        cluster node's unwrapped, each run of one group's records at their
        positions in its log (see :mod:`rankd.engine.replication`)."""
        if self._replication is None:
            self._replay_records(batch)
            return
        run: list[tuple[int, bytes]] = []
        run_group = None
        for lsn, payload in batch:
            record = records.decode(payload)
            kind = record[0]
            if kind == records.REPLICATED:
                _, group, first, epoch, payloads = record
                if group != run_group and run:
                    self._replay_records(run)
                    run = []
                run_group = group
                run.extend(enumerate(payloads, first))
                self.positions[group] = (first + len(payloads) - 1, epoch)
                continue
            if run:
                self._replay_records(run)
                run = []
            if kind == records.GROUP_RESET:
                run_group = None
                self._drop_group(record[1])
            elif kind == records.GROUP_LOAD:
                run_group = None
                self._load_group_part(record)
            else:
                raise RuntimeError(
                    f"{self.config.data_dir}: position {lsn} of the log holds a single "
                    "node's record; this data dir was not a cluster node's: start it "
                    "without --cluster-dsn, or the node with an empty data dir")
        if run:
            self._replay_records(run)

    def _load_group_part(self, record: Sequence[Any]) -> None:
        _, group, seq, epoch, part, parts, section = record
        if part == 0:
            self._drop_group(group)
        if section is not None:
            self._load_snapshot([section])
        if part == parts - 1:
            self.positions[group] = (seq, epoch)

    def _drop_group(self, group: int) -> set[str]:
        """Forget a group's boards and its position (replayed anew later)."""
        self._apply_replayed()
        names = {name for name in self._boards if group_of(name) == group}
        for name in names:
            self._forget_board(name)
        staging.drop_group(self._staged, group)
        self.positions.pop(group, None)
        return names

    def _replay_records(self, batch: list[tuple[int, bytes]],
                        touched: set[str] | None = None) -> None:
        """Replay logged ``(lsn, payload)`` records in log order (noting
        the boards they change in ``touched``).

        Runs of SUBMIT records go through :mod:`rankd.engine.replay`, which
        gathers their index states; those reach the indexes before any
        other record of their board, and at the end
        (:meth:`_apply_replayed`).  Every other record goes through
        :meth:`_apply_record`, as it did live.
        """
        ttl = self.config.dedupe_ttl
        position = 0
        while position < len(batch):
            lsn, payload = batch[position]
            record = records.decode(payload)
            position += 1
            if record[0] in (records.REPLICATED, records.GROUP_RESET, records.GROUP_LOAD):
                raise RuntimeError(
                    f"{self.config.data_dir}: position {lsn} of the log holds a cluster "
                    "node's record: start this data dir with the --cluster-dsn it was a "
                    "node of")
            if record[0] == records.TX_SLOT:
                continue  # the TRANSACTION record at the end holds it
            if record[0] == records.TRANSACTION:  # its records, at their positions
                self._replay_records(list(enumerate(record[3], record[2])), touched)
                continue
            if touched is not None:
                touched.add(record[1])
            if record[0] != records.SUBMIT:
                if self._replayed:
                    self._apply_replayed(record[1])
                self._apply_record(lsn, record)
                continue
            board = self._boards.get(record[1])
            if board is None:  # a later record dropped the board
                continue
            gathered = gather_submit(board, lsn, record, ttl, self._replayed)
            position, more = replay_submits(board, batch, position, ttl, self._replayed)
            self._replayed_count += gathered + more
            if self._replayed_count >= REPLAY_PENDING_STATES:
                self._apply_replayed()

    def _apply_replayed(self, name: str | None = None) -> None:
        """Hand gathered replay states to their indexes (of one board, or all)."""
        for key in [k for k in self._replayed if name is None or k[0] == name]:
            states = self._replayed.pop(key)
            self._replayed_count -= len(states)
            self._boards[key[0]].index_for_write(key[1], key[2]).set_states(states)

    def _apply_record(self, lsn: int, record: Any) -> None:
        """Apply a board change or a removal (live, and in replay)."""
        kind = record[0]
        if kind == records.BOARD_PUT:
            _, name, config, ts_ms = record
            config = BoardConfig.from_dict(dict(config))
            board = self._boards.get(name)
            if board is None:
                board = self._boards[name] = Board(name, config)
                # Versions continue from the log position, so a board deleted
                # and created again never repeats a version readers cached.
                board.version = lsn - 1
            else:
                board.reconfigure(config)
            board.version += 1
            board.updated_at = ts_ms / 1000
        elif kind == records.BOARD_DROP:
            self._forget_board(record[1])
        elif kind == records.EXPIRED:
            # Only the deadline it names: a board made again meanwhile stays.
            board = self._boards.get(record[1])
            if board is not None and board.expires_at == record[2]:
                self._forget_board(record[1])
        elif kind == records.EXPIRE:
            _, name, deadline, ts_ms = record
            board = self._boards.get(name)
            if board is None:
                return
            self._set_deadline(board, deadline)
            board.version += 1
            board.updated_at = ts_ms / 1000
        elif kind == records.REMOVE:
            _, name, member, ts_ms = record
            board = self._boards.get(name)
            if board is None:
                return
            for periods in board.periods.values():
                for index in periods.values():
                    index.remove(member)
            board.labels.pop(member, None)
            board.version += 1
            board.updated_at = ts_ms / 1000
        elif kind in staging.KINDS:
            built = staging.apply(self._staged, lsn, record)
            if built is not None:  # the store's end: the built board in place of the old
                self._forget_board(record[1])
                self._boards[record[1]] = built
                if record[1] in self._held:  # (a snapshot copies the old one: it waits too)
                    built.writable.clear()
        else:
            raise RuntimeError(f"unknown WAL record kind {kind!r} at position {lsn}")

    # --- writes ---------------------------------------------------------------------

    async def put_board(self, name: str, config: object, *, discard: bool = False,
                        patch: bool = False) -> tuple[BoardConfig, bool]:
        """Create or change a board: ``(config, created)``.

        With ``patch`` the fields given change and the others stay.  A change
        that would lose data (a window dropped with its members, closed
        periods beyond a lower ``retain``, the policy of a board with members)
        is refused with ``Conflict`` naming what, unless ``discard``.
        """
        check_board_name(name)
        board = self.live_board(name)
        given, deadline = expiry.deadline_of(config)
        if given and deadline is not None and deadline <= self._now_ms():
            raise InvalidInput(f"{expiry.FIELD} must be in the future (DELETE deletes a "
                               "board now)")
        config = expiry.without_deadline(config)
        if patch and board is not None:
            if not isinstance(config, dict):
                raise InvalidInput("board config must be an object")
            config = {**board.config.to_dict(), **config}
            if not given:
                deadline = board.expires_at
        parsed = BoardConfig.from_dict(config)
        now_ms = self._now_ms()
        deadline_record = [records.EXPIRE, name, deadline, now_ms]
        if board is not None:
            if board.config == parsed:
                if board.expires_at != deadline:
                    await board.writable.wait()
                    await self._write([deadline_record])
                return parsed, False
            if ((parsed.order, parsed.tie_break) != (board.config.order, board.config.tie_break)
                    and any(len(i) for p in board.periods.values() for i in p.values())):
                raise Conflict("order and tie_break cannot change on a board with members; "
                               "delete and recreate it")
            losses = board.losses(parsed, self.clock())
            if losses and not discard:
                raise Conflict(f"this change to board {name!r} would lose data: "
                               f"{'; '.join(losses)}; send it again with discard=true to "
                               "go ahead, or leave those fields as they are")
            await board.writable.wait()
            log.info("board %s config changed%s: %s -> %s", name,
                     " (discarding: " + "; ".join(losses) + ")" if losses else "",
                     board.config.to_dict(), parsed.to_dict())
        logged = [[records.BOARD_PUT, name, parsed.to_dict(), now_ms]]
        if deadline != (None if board is None else board.expires_at):
            logged.append(deadline_record)
        await self._write(logged)
        return parsed, board is None

    async def delete_board(self, name: str) -> None:
        """Delete a board and all its windows."""
        board = self._board(name, reading=False)
        await board.writable.wait()
        await self._write([[records.BOARD_DROP, name, self._now_ms()]])

    async def remove_member(self, name: str, member: str) -> bool:
        """Remove a member from every window and period; ``False`` if absent."""
        board = self._board(name, reading=False)
        check_member(member)
        present = member in board.labels or any(
            member in index for periods in board.periods.values() for index in periods.values())
        if not present:
            return False
        await board.writable.wait()
        await self._write([[records.REMOVE, name, member, self._now_ms()]])
        return True

    async def remove_members(self, name: str, choose: Callable[[SortedView], Iterable[str]],
                             *, window: str | None = None, period: str | None = None,
                             drop_when_empty: bool = False, persist_when_empty: bool = False
                             ) -> list[tuple[str, float]]:
        """Remove the members ``choose`` picks from a view of one of the
        board's windows (from every window and period), all in one commit;
        returns them with the scores they had in the view.

        ``choose`` runs once the board may be written, and the removal is
        applied in the same step, so what it picked is what is removed
        (``ZPOPMIN``, ``ZREMRANGEBYSCORE``).  Members it names that the view
        lacks are left out.  With ``drop_when_empty``, a board left without
        members is deleted too (a Redis key does not outlive its last member);
        with ``persist_when_empty``, it loses its deadline (a Redis key made
        again after its last member went has none).
        """
        board = self._board(name, reading=False)
        await board.writable.wait()
        await self.route(name)
        chosen, logged = self._removal(name, choose, window, period, drop_when_empty,
                                       persist_when_empty)
        if logged:
            await self._write(logged)
        return chosen

    def remove_members_now(self, name: str, choose: Callable[[SortedView], Iterable[str]],
                           *, window: str | None = None, period: str | None = None,
                           drop_when_empty: bool = False, persist_when_empty: bool = False
                           ) -> tuple[list[tuple[str, float]], asyncio.Future[None] | None
                                      ] | None:
        """:meth:`remove_members` applied right here, without awaiting:
        ``(removed, committed)``, ``committed`` the future done once the
        removal is durable (None if nothing was removed), which the caller
        must await before acknowledging it.  None, with nothing done, where
        the removal would have to wait: on a cluster node (its group's log),
        or while a snapshot holds the board; :meth:`remove_members` then.

        What a pipeline's pops use: many of them, each seeing the ones
        before, are applied in one turn of the loop and share its commit.
        """
        if not self.removes_now(name):
            return None
        self._board(name, reading=False)  # (NotFound if it is past its deadline)
        self._check_writable()
        chosen, logged = self._removal(name, choose, window, period, drop_when_empty,
                                       persist_when_empty)
        return chosen, self._write_soon(logged) if logged else None

    def removes_now(self, name: str) -> bool:
        """Whether :meth:`remove_members_now` would apply a removal from
        board ``name`` now (rather than answer None)."""
        board = self._boards.get(name)
        return self._replication is None and board is not None and board.writable.is_set()

    def _removal(self, name: str, choose: Callable[[SortedView], Iterable[str]],
                 window: str | None, period: str | None, drop_when_empty: bool,
                 persist_when_empty: bool) -> tuple[list[tuple[str, float]], list[list]]:
        """What :meth:`remove_members` removes (member, score) and the
        records that do it, picked now; nothing applied yet."""
        board = self._board(name, reading=False)  # it may be gone meanwhile
        _, _, _, index = self._view(name, window, period, reading=False)
        view = SortedView(index, board.config.order == "asc")
        chosen = {}
        for member in choose(view):
            score = view.score(member)
            if score is not None:
                chosen[member] = score
        if not chosen:
            return [], []
        now_ms = self._now_ms()
        logged: list[list] = [[records.REMOVE, name, member, now_ms] for member in chosen]
        if (drop_when_empty or (persist_when_empty and board.expires_at is not None)) and all(
                len(index) == sum(1 for member in chosen if member in index)
                for periods in board.periods.values() for index in periods.values()):
            logged.append([records.BOARD_DROP, name, now_ms] if drop_when_empty
                          else [records.EXPIRE, name, None, now_ms])
        return list(chosen.items()), logged

    def transaction(self) -> Transaction:
        """Writes applied in one step and logged as one record: see
        :mod:`rankd.engine.transaction`."""
        return Transaction(self)

    def stage(self, name: str, config: object) -> staging.Staging:
        """A board built off to the side in steps and swapped in at once:
        see :mod:`rankd.engine.staging`."""
        return staging.Staging(self, name, config)

    @contextlib.asynccontextmanager
    async def hold_writes(self, names: Iterable[str]) -> AsyncIterator[Callable[[], None]]:
        """Hold the writes of boards ``names`` (those that exist) while the
        block runs, as a snapshot holds a board it copies (readers go on);
        gives a function that releases them early (idempotent)."""
        boards = []
        for name in dict.fromkeys(names):
            board = self._boards.get(name)
            if board is not None:
                await board.writable.wait()
        for name in dict.fromkeys(names):  # (no await from here: each held as it is)
            board = self._boards.get(name)
            if board is not None:
                self._hold(board)
                boards.append(board)

        def release() -> None:
            while boards:
                self._release(boards.pop())
        try:
            yield release
        finally:
            release()

    async def replace_board(self, name: str, config: object,
                            entries: Callable[[], Iterable[tuple[str, float]]]) -> int:
        """Make board ``name`` anew with ``config`` holding exactly the
        ``(member, score)`` pairs ``entries()`` gives, in place of any board
        of that name and all it held, in one commit (all or nothing after a
        crash, one unit on a cluster): what Redis's ``ZUNIONSTORE`` and the
        other store commands do to their destination.  Returns how many
        members it holds.

        ``entries`` runs once the board may be written, and what it gives is
        applied in the same step, no other write between (so a caller can
        check there that what it computed is still current).  Its members
        must be valid and its scores finite, and their number bounded by
        the caller: they are applied in one step, as a batch is.
        """
        check_board_name(name)
        parsed = BoardConfig.from_dict(config)
        board = self._boards.get(name)
        if board is not None:
            await board.writable.wait()
        writer = None
        if self._replication is not None:
            await self.route(name)
            writer = await self._writer_of(group_of(name))
            first = writer.next_seq
        else:
            self._check_writable()
            first = self.wal.last_lsn + 1
        # Nothing is awaited from here until every record is applied.
        submissions = [Submission(board=name, member=member, score=score)
                       for member, score in entries()]
        now_ms = self._now_ms()
        logged: list[list] = ([[records.BOARD_DROP, name, now_ms]]
                              if name in self._boards else [])
        logged.append([records.BOARD_PUT, name, parsed.to_dict(), now_ms])
        for position, record in enumerate(logged, first):
            self._apply_record(position, record)
        try:
            done = ingest(self._boards, submissions, self.clock(), first + len(logged),
                          self.config.dedupe_ttl, self.config.ts_tolerance)
        except Exception as exc:
            self._fail(exc)  # a bug, as in _submit_batch
            raise
        self._count(done)
        payloads = [records.encode(record) for record in logged] + done.payloads
        if writer is not None:
            await self._replicate(writer, payloads, {name})
        else:
            await self._commit(payloads, {name})
        return len(done.payloads)

    async def submit(self, submission: Submission) -> dict[str, Any]:
        """Apply one submission and return its result (raises EngineError)."""
        (answer,) = await self.coalescer.submit_many([submission])
        if isinstance(answer, EngineError):
            raise answer
        return answer

    async def submit_many(self, submissions: Iterable[Submission]
                          ) -> list[dict[str, Any] | EngineError]:
        """Apply submissions in order, one result or error each.

        A bad submission gets its own error and does not fail the others.
        Submissions of concurrent callers (those that call during the same
        pass of the event loop) are applied together: one WAL append and one
        commit, so under ``fsync=always`` they share one fsync.
        """
        return await self.coalescer.submit_many(list(submissions))

    async def _submit_batch(self, submissions: list[Submission]
                            ) -> list[dict[str, Any] | EngineError]:
        """Apply one coalesced batch (see :meth:`submit_many`).

        Submissions to a board whose snapshot holds its writes wait for it;
        the rest of the batch does not wait with them (the order of each
        board's submissions is kept).
        """
        held = self._held and {s.board for s in submissions
                               if type(s.board) is str and s.board in self._held}
        if held:
            waiting = [type(s.board) is str and s.board in held for s in submissions]
            free = [s for s, wait in zip(submissions, waiting, strict=True) if not wait]
            later = [s for s, wait in zip(submissions, waiting, strict=True) if wait]
            parts = await asyncio.gather(self._submit_batch(free),
                                         self._submit_when_writable(held, later),
                                         return_exceptions=True)
            first, then = [_answers_of(part) for part in parts]
            return [next(then) if wait else next(first) for wait in waiting]
        self._check_writable()
        if self._replication is not None:
            return await self._submit_replicated(submissions)
        purged = self._purge_now((s.board for s in submissions), self.wal.last_lsn + 1)
        if purged:
            self._append(purged, set())
        try:
            done = ingest(self._boards, submissions, self.clock(), self.wal.last_lsn + 1,
                          self.config.dedupe_ttl, self.config.ts_tolerance)
        except Exception as exc:
            # Only a bug gets here, possibly with part of a batch applied and
            # nothing logged: refuse writes rather than diverge from the log.
            self._fail(exc)
            raise
        self._count(done)
        if done.payloads:
            await self._commit(done.payloads, done.boards)
        elif purged:
            await asyncio.shield(self._pass())
        return done.answers

    async def submit_packed(self, packed: Any) -> None:
        """Apply submissions a front-end read in packed form
        (``rankd.engine._packed.Packed``, from the native scanner), in order;
        their answers go into ``packed`` (see ``_ingest.ingest_packed``).

        The same as :meth:`submit_many` of ``packed.submissions()``, without
        a Python object per submission.  Raises ``ReadOnly`` (nothing
        applied) like :meth:`submit_many`.
        """
        await asyncio.shield(self.submit_packed_nowait(packed))

    def submit_packed_nowait(self, packed: Any) -> asyncio.Future[None]:
        """:meth:`submit_packed` without a coroutine, for a front-end's
        ``data_received``: the returned future is done once the run is
        applied and committed (``ReadOnly`` if it cannot be).

        The runs of one pass of the event loop are applied together when
        the pass ends, as one native batch with one commit, and their
        callers need no task each: that is what lets many pipelining
        connections cost little more than one.  Each board's runs are
        applied in the order of the calls: a run touching a board held by a
        snapshot (when handed over, or when its pass applies it) goes the
        general way (:meth:`submit_many`, in a task), and so does every run
        after it until it is applied, behind it.
        """
        try:
            self._check_writable()
        except ReadOnly as exc:
            return _failed(exc)
        intake = self.intake
        if intake.unpacked or self._meets_held(packed):
            return self._unpacked_soon(packed)
        if self._replication is not None:
            group = self._written_group(packed)
            if group is None:
                return self._unpacked_soon(packed)
            if not intake.scheduled:
                intake.schedule()
            entry = self._pass_groups.get(group)
            if entry is None:
                entry = self._pass_groups[group] = (
                    [], asyncio.get_running_loop().create_future())
            entry[0].append(packed)
            return entry[1]
        intake.runs.append(packed)
        return self._pass()

    def submit_packed_then(self, packed: Any, then: Then, token: Any) -> None:
        """:meth:`submit_packed_nowait` for a front-end's ``data_received``
        that needs no future: ``then(token, error)`` is called once the run
        is applied and committed (``error`` None, the answers in
        ``packed``) or cannot be (``ReadOnly``...), never from within this
        call.  On a single node the pass calls it directly, so the replies
        of a pass's runs go out in the pass itself.  (The same as
        ``intake.submit_then``, which a front-end calls.)"""
        # (A log that failed, or a start not done, is found by the pass,
        # which answers ReadOnly.)
        self.intake.submit_then(packed, then, token)

    def _submit_packed_later(self, packed: Any, then: Then, token: Any) -> None:
        """A run that may not join the pass directly (see ``Intake.submit_then``)."""
        self.submit_packed_nowait(packed).add_done_callback(
            lambda done: then(token, done.exception() if not done.cancelled()
                              else asyncio.CancelledError()))

    def takes_replicated(self, packed: Any) -> bool:
        """On a cluster node, whether :meth:`submit_packed_nowait` applies a
        packed run itself: only if its boards are of one group this node
        writes now (the others go the general way, which forwards them or
        names their primary)."""
        return self._written_group(packed) is not None

    def _written_group(self, packed: Any) -> int | None:
        """The one board group of a packed run, if this node writes it now."""
        groups = {group_of(name) for name in packed.board_names()}
        if len(groups) != 1:
            return None
        group = groups.pop()
        if group in self.read_gates.closed:
            return None  # readers settle it: the general way waits for them
        try:
            self._replication.writer(group)
        except EngineError:
            return None
        return group

    def _meets_held(self, packed: Any) -> bool:
        """Whether a packed run writes to a board a snapshot holds."""
        return bool(self._held) and not self._held.isdisjoint(packed.board_names())

    def _unpacked_soon(self, packed: Any) -> asyncio.Future[None]:
        self.intake.unpacked += 1
        return asyncio.ensure_future(self._submit_unpacked(packed))

    def _apply_runs(self, runs: list[Any]) -> list[asyncio.Future[None]]:
        """Apply the packed runs of a pass and append their records; the
        runs from the first that meets a held board on go the general way
        (their futures are returned)."""
        self._check_writable()
        unpacked = []
        if self._held:  # (a snapshot is being taken: checked run by run)
            for position, packed in enumerate(runs):
                if self._meets_held(packed):
                    unpacked = [self._unpacked_soon(later) for later in runs[position:]]
                    runs = runs[:position]
                    break
        if runs:
            try:
                done = ingest_packed(self._boards, runs, self.clock(), self.wal.last_lsn + 1,
                                     self.config.dedupe_ttl, self.config.ts_tolerance)
            except Exception as exc:
                self._fail(exc)  # a bug, as in _submit_batch
                raise
            self._count(done)
            if done.payloads:
                self._append(done.payloads, done.boards)
        return unpacked

    def _apply_group_runs(self, group: int, runs: list[Any], finished: asyncio.Future[None],
                          local: asyncio.Future[None]) -> None:
        """Apply a cluster node's packed runs of one group at the group's
        next positions, as :meth:`_submit_replicated` does; ``finished`` is
        done once the ack mode is met, each run then holding its answers
        and ``position`` (the log's ``(seq, epoch)`` of its writes)."""
        if group in self.read_gates.closed:  # readers settle it: the general way waits
            general = asyncio.gather(*(self._unpacked_soon(packed) for packed in runs))
            general.add_done_callback(lambda outcome: _answer_runs(
                runs, finished, asyncio.CancelledError() if outcome.cancelled()
                else outcome.exception() or (0, 0), positioned=False))
            return
        try:
            self._check_writable()
            writer = self._replication.writer(group)
        except EngineError as exc:  # deposed, or read-only, since the runs came
            _answer_runs(runs, finished, exc)
            return
        try:
            done = ingest_packed(self._boards, runs, self.clock(), writer.next_seq,
                                 self.config.dedupe_ttl, self.config.ts_tolerance)
        except Exception as exc:
            self._fail(exc)  # a bug, as in _submit_batch
            finished.set_exception(exc)
            raise
        self._count(done)
        try:  # ``local``: this pass's commit, the local log's part
            if done.payloads:
                acknowledged = self._replicate(writer, done.payloads, done.boards, local)
            else:  # duplicates or refusals only: what they repeat may not be committed
                acknowledged = asyncio.ensure_future(self._acknowledged(
                    writer, writer.next_seq - 1, writer.epoch, local))
        except EngineError as exc:
            _answer_runs(runs, finished, exc)
            return
        acknowledged.add_done_callback(lambda outcome: _answer_runs(
            runs, finished, asyncio.CancelledError() if outcome.cancelled()
            else outcome.exception() or outcome.result()))

    async def _submit_unpacked(self, packed: Any) -> None:
        try:
            packed.answers = await self.submit_many(packed.submissions())
        except EngineError as exc:  # e.g. read-only: every submission gets the error
            packed.answers = [exc] * len(packed)
        finally:
            self.intake.unpacked -= 1

    def _count(self, done: Ingested) -> None:
        stats = self.stats
        stats["applied"] += len(done.payloads)
        stats["rejected"] += done.rejected
        stats["duplicate"] += done.duplicates

    async def _write(self, logged: list[list]) -> None:
        """Apply and commit non-submission records (board changes, removals)."""
        self._check_writable()
        if self._replication is not None:
            await self._write_replicated(logged)
            return
        # Shielded: the commit is shared, and one cancelled waiter must not cancel it.
        await asyncio.shield(self._write_soon(logged))

    def _write_soon(self, logged: list[list]) -> asyncio.Future[None]:
        """:meth:`_write` on a single node, applied now: the future of its
        commit (see :meth:`_commit_soon`)."""
        next_lsn = self.wal.last_lsn + 1
        purged = self._purge_now(_purged_by(logged), next_lsn)
        for position, record in enumerate(logged, next_lsn + len(purged)):
            self._apply_record(position, record)
        return self._commit_soon([*purged, *(records.encode(record) for record in logged)],
                                 {record[1] for record in logged})

    # --- writes of a cluster node (see rankd.engine.replication) ------------------------

    async def caught_up(self, name: object, seq: int, timeout: float) -> None:
        """Return once board ``name``'s group is applied here up to position
        ``seq`` (read-your-writes on a cluster node; at once on a single
        node, which has every write it acknowledged); ``Unavailable`` if
        ``timeout`` passes first."""
        if self._replication is None or type(name) is not str:
            return
        group = group_of(name)
        deadline = time.monotonic() + timeout
        if self.positions.get(group, (0, 0))[0] < seq:
            self._replication.awaited(group)
        while (applied := self.positions.get(group, (0, 0))[0]) < seq:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Unavailable(f"this node has applied board {name!r}'s log up to "
                                  f"position {applied}, not yet {seq}; read again, or from "
                                  "its primary")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._advanced.wait(), left)

    async def settle(self, group: int, timeout: float = SETTLE_SECONDS) -> None:
        """Wait until the records of ``group`` this node applied are
        committed to its log, holding the group's writes meanwhile (see
        :mod:`rankd.engine.settling`): a read made right after this, without
        awaiting, shows only committed writes.  ``Unavailable`` if they are
        not committed within ``timeout``."""
        replication = self._replication
        committed = replication.settling(group) if replication is not None else None
        if committed is None:
            return
        try:
            await self.read_gates.settle(group, committed, timeout)
        except TimeoutError:
            raise Unavailable(f"writes this node applied to group {group} were not committed "
                              f"to the cluster's log within {timeout:g} s (is it cut off from "
                              "Postgres?); read another node") from None
        except Exception as exc:
            raise Unavailable(f"this node no longer writes group {group} ({exc}); read "
                              "another node") from exc

    async def settled_read(self, read: Callable[[], T]) -> T:
        """``read()``, made again after :meth:`settle` when it meets a group
        whose writes are not committed yet (``Unsettled``), a few times at
        most: for front-ends whose reads may wait."""
        for _ in range(SETTLE_TRIES - 1):
            try:
                return read()
            except Unsettled as exc:
                await self.settle(exc.group)
        return read()

    async def route(self, name: object) -> None:
        """On a cluster node: raise ``NotPrimary`` (naming the primary) if
        another node writes board ``name``'s group, so a front-end can send
        the whole request there.  Nothing on a single node."""
        if self._replication is not None and type(name) is str:
            group = group_of(name)
            exists = name in self._boards  # a group is taken only for a write that can apply
            refusal = (await self._replication.prepare({group}, take=exists)).get(group)
            if refusal is not None:
                raise refusal
            try:
                self._replication.writer(group)
            except NotPrimary as exc:
                if exists or exc.primary is not None:
                    raise  # (else: no node writes it, each event is answered not_found)

    async def _submit_replicated(self, submissions: list[Submission]
                                 ) -> list[dict[str, Any] | EngineError]:
        """Apply a batch on a cluster node: each group's submissions at that
        group's next positions, acknowledged as the ack mode says."""
        by_group: dict[int, list[int]] = {}
        for position, submission in enumerate(submissions):
            group = group_of(submission.board) if type(submission.board) is str else -1
            by_group.setdefault(group, []).append(position)
        # A group is taken only for a write that can apply: not for writes to
        # boards missing here (answered not_found below, or by their primary).
        boards = self._boards
        applicable = {group for group, positions in by_group.items()
                      if group >= 0 and any(submissions[p].board in boards for p in positions)}
        refusals = await self._replication.prepare(applicable)
        refusals.update(await self._replication.prepare(set(by_group) - applicable - {-1},
                                                        take=False))
        # Nothing awaited from here on: what readers settled stays so until applied.
        await self.read_gates.opened(by_group)
        self._check_writable()
        answers: list[Any] = [None] * len(submissions)
        waits: list[tuple[list[int], asyncio.Future]] = []
        for group, positions in by_group.items():
            # Each group's submissions get that group's own outcome: a group
            # refused here changes nothing of the others'.
            try:
                if group in refusals:
                    raise refusals[group]
                writer = self._replication.writer(group) if group >= 0 else None
            except NotPrimary as exc:
                # No node writes a group of missing boards only: they are missing.
                missing = exc.primary is None and not any(submissions[p].board in boards
                                                          for p in positions)
                for position in positions:
                    answers[position] = (missing_board(submissions[position].board)
                                         if missing else exc)
                continue
            except EngineError as exc:
                for position in positions:
                    answers[position] = exc
                continue
            first = writer.next_seq if writer else 0
            purged = self._purge_now((submissions[p].board for p in positions), first) \
                if writer else []
            try:
                done = ingest(self._boards, [submissions[p] for p in positions], self.clock(),
                              first + len(purged), self.config.dedupe_ttl,
                              self.config.ts_tolerance)
            except Exception as exc:
                self._fail(exc)  # a bug, as in _submit_batch
                raise
            self._count(done)
            for position, answer in zip(positions, done.answers, strict=True):
                answers[position] = answer
            applied = [p for p, a in zip(positions, done.answers, strict=True)
                       if not isinstance(a, EngineError)]
            if done.payloads or purged:
                try:
                    replicated = self._replicate(writer, [*purged, *done.payloads],
                                                 done.boards)
                except EngineError as exc:  # the local log failed: sent nowhere
                    for position in applied:
                        answers[position] = exc
                    continue
                waits.append((applied, replicated))
            elif applied:
                # Duplicates only: the events they repeat may not be committed
                # yet, and a duplicate's answer acknowledges them too.
                waits.append((applied, asyncio.ensure_future(self._acknowledged(
                    writer, writer.next_seq - 1, writer.epoch, self._pass()))))
        for (applied, _), outcome in zip(waits, await asyncio.gather(
                *(wait for _, wait in waits), return_exceptions=True), strict=True):
            if isinstance(outcome, EngineError):
                for position in applied:
                    answers[position] = outcome
            elif isinstance(outcome, BaseException):
                raise outcome
            else:  # (seq, epoch): where the group's log holds these writes
                for position in applied:
                    answers[position]["seq"], answers[position]["epoch"] = outcome
        return answers

    async def _writer_of(self, group: int) -> GroupWriter:
        """This node's writer of ``group``, once it may write it now (taken
        if no node holds it, its readers settled); nothing may be awaited
        between this and applying the writes.  Raises the group's refusal."""
        refusal = (await self._replication.prepare({group})).get(group)
        if refusal is not None:
            raise refusal
        await self.read_gates.opened((group,))
        self._check_writable()
        return self._replication.writer(group)

    async def _write_replicated(self, logged: list[list]) -> None:
        writer = await self._writer_of(group_of(logged[0][1]))
        purged = self._purge_now(_purged_by(logged), writer.next_seq)
        for position, record in enumerate(logged, writer.next_seq + len(purged)):
            self._apply_record(position, record)
        await self._replicate(writer, [*purged, *(records.encode(record) for record in logged)],
                              {record[1] for record in logged})

    def _replicate(self, writer: GroupWriter, payloads: list[bytes], boards: set[str],
                   local: asyncio.Future | None = None) -> asyncio.Future:
        """Send applied records to their group's log and to the local log;
        done when the ack mode is met (``Unacknowledged`` if not in time).
        ``local``: the commit of this pass, when it is the caller (the
        records are then only appended)."""
        group, epoch = writer.group, writer.epoch
        first = writer.next_seq
        last = first + len(payloads) - 1
        # The local log first: one that failed (ReadOnly) sends the cluster's
        # log nothing either, so a write refused so is refused everywhere.
        self._append([records.encode([records.REPLICATED, group, first, epoch, payloads])],
                     boards, len(payloads))
        enqueued = writer.enqueue(payloads)
        assert enqueued == first, f"group {group}: log gave {enqueued}, applied at {first}"
        self.positions[group] = (last, epoch)
        self._advance()
        if local is None:
            local = self._pass()
        return asyncio.ensure_future(self._acknowledged(writer, last, epoch, local))

    async def _acknowledged(self, writer: GroupWriter, last: int, epoch: int,
                            local: asyncio.Future) -> tuple[int, int]:
        """``(last, epoch)`` once the ack mode is met for the group's records
        up to ``last``."""
        replication = self._replication
        if replication.ack == "local":
            try:
                await asyncio.shield(local)
            except ReadOnly as exc:
                raise _sent_on(exc) from exc
            replication.check_acknowledge(writer.group)
            return last, epoch
        try:
            both = asyncio.gather(local, writer.committed(last))
            both.add_done_callback(outcome_seen)
            await asyncio.wait_for(asyncio.shield(both), replication.ack_timeout)
        except ReadOnly as exc:
            raise _sent_on(exc) from exc
        except EngineError:
            raise
        except TimeoutError:
            raise Unacknowledged(
                f"the cluster's log did not confirm this write within "
                f"{replication.ack_timeout:g} s; it may still commit: resubmit it with the "
                "same event id to know") from None
        except Exception as exc:
            raise Unacknowledged(f"the cluster's log did not take this write ({exc}); "
                                 "resubmit it with the same event id") from exc
        return last, epoch

    def apply_replicated(self, group: int, logged: list[tuple[int, int, bytes]]
                         ) -> asyncio.Future[None]:
        """Apply records a follower read from a group's log (``(seq, epoch,
        payload)``, in order, right after the last one it applied), as
        recovery does; done once the local log holds them by the fsync
        policy and listeners were told."""
        self._check_writable()
        touched: set[str] = set()
        self._replay_records([(seq, payload) for seq, _, payload in logged], touched)
        self._apply_replayed()
        seq, epoch, _ = logged[-1]
        self.positions[group] = (seq, epoch)
        self._advance()
        runs: list[list] = []  # one local record per epoch's run
        for seq, epoch_of, payload in logged:
            if runs and runs[-1][3] == epoch_of:
                runs[-1][4].append(payload)
            else:
                runs.append([records.REPLICATED, group, seq, epoch_of, [payload]])
        return self._commit_soon([records.encode(run) for run in runs], touched, len(logged))

    def written_by(self, group: int, epoch: int, after_seq: int) -> list[tuple[int, bytes]]:
        """The records of ``group`` the local log holds from ``epoch`` after
        position ``after_seq``: ``(seq, payload)``, in order (what a primary
        that crashed wrote and its group's log never took).  Reads the log
        from the start: call it in a worker thread."""
        found = []
        for batch in self.wal.iter_batches(1, REPLAY_BATCH):
            for _, payload in batch:
                record = records.decode(payload)
                if (record[0] == records.REPLICATED and record[1] == group
                        and record[3] == epoch):
                    found.extend((seq, payload) for seq, payload
                                 in enumerate(record[4], record[2]) if seq > after_seq)
        return found

    def _advance(self) -> None:
        self._advanced.set()
        self._advanced = asyncio.Event()

    async def group_snapshot(self, group: int) -> tuple[int, int, list[bytes]]:
        """The state of ``group``'s boards at its last applied position:
        ``(seq, epoch, sections)`` (snapshot sections, as
        :meth:`load_group_snapshot` takes them).  The group's writers wait
        while its indexes and labels are copied, as for a local snapshot."""
        boards = [board for name, board in self._boards.items() if group_of(name) == group]
        for board in boards:
            await board.writable.wait()
        boards = [board for name, board in self._boards.items() if group_of(name) == group]
        seq, epoch = self.positions.get(group, (0, 0))
        sections = _Sections()
        building = staging.parts_of(self._staged, group)  # (at `seq`: no await between)
        for board in boards:  # held at once: the copy is of one position
            self._hold(board)
        try:
            for board in boards:
                await self._snapshot_board(sections, board, hold=False)
        finally:
            for board in boards:
                self._release(board)
        for part in building:
            sections.add(staging.section(part))
        return seq, epoch, sections.parts

    def load_group_snapshot(self, group: int, seq: int, epoch: int, sections: list[bytes]
                            ) -> asyncio.Future[None]:
        """Replace ``group``'s boards with its snapshot at ``seq`` (a follower
        whose position the cluster's log no longer holds).  The local log
        keeps the snapshot too, so a restart recovers it."""
        self._check_writable()
        parts = sections or [None]  # a group without boards: one empty part
        logged = [records.encode([records.GROUP_LOAD, group, seq, epoch, part, len(parts),
                                  section]) for part, section in enumerate(parts)]
        names = self._drop_group(group)
        self._load_snapshot(sections)
        names |= {name for name in self._boards if group_of(name) == group}
        self.positions[group] = (seq, epoch)
        self._advance()
        self._snapshot_wanted.set()  # and soon a local snapshot, for a short replay
        return self._commit_soon(logged, names)

    def reset_group(self, group: int) -> asyncio.Future[None]:
        """Forget a group's boards (to replay its log anew from the start):
        after this node wrote records the group's log never took."""
        self._check_writable()
        names = self._drop_group(group)
        return self._commit_soon([records.encode([records.GROUP_RESET, group])], names)

    # --- commits ------------------------------------------------------------------------

    async def _commit(self, payloads: list[bytes], boards: set[str]) -> None:
        """Append applied records and wait until the fsync policy is met
        (see :meth:`_commit_soon`)."""
        # Shielded: the commit is shared, and one cancelled waiter must not cancel it.
        await asyncio.shield(self._commit_soon(payloads, boards))

    def _commit_soon(self, payloads: list[bytes], boards: set[str], events: int | None = None
                     ) -> asyncio.Future[None]:
        """Append applied records to the WAL now; the future is done once
        they meet the fsync policy and listeners were told which ``boards``
        changed.  Every commit of one pass of the event loop shares one
        future (one task, one WAL commit).  ``events``: how many changes the
        records hold, when not one each."""
        try:
            self._append(payloads, boards, events)
        except ReadOnly as exc:
            return _failed(exc)
        return self._pass()

    def _append(self, payloads: list[bytes], boards: set[str], events: int | None = None
                ) -> None:
        """Append applied records to the WAL (``ReadOnly`` if it failed)."""
        try:
            expected = self.wal.last_lsn + len(payloads)
            last = self.wal.append_many(payloads)
        except WalFailedError as exc:
            raise self._read_only_after(exc) from exc
        assert last == expected, f"WAL assigned up to {last}, expected {expected}"
        self._events_since_snapshot += len(payloads) if events is None else events
        self._pass_boards.update(boards)

    def _pass(self) -> asyncio.Future[None]:
        """The future of this pass's commit (see :meth:`_run_pass`)."""
        if not self.intake.scheduled:
            self.intake.schedule()
        if self._pass_commit is None:
            self._pass_commit = asyncio.get_running_loop().create_future()
        return self._pass_commit

    def _run_pass(self) -> None:
        """Commit this pass: apply its packed runs (as one native batch),
        append everything to the WAL in one write, then tell the waiters.

        Unless each commit needs an fsync (or runs went the general way),
        all of it happens right here, in one callback: no task, and the
        replies of packed runs leave in this same turn of the loop.  (The
        native intake commits the common case of a single node itself, the
        same way: ``Intake.commit_pass``.)
        """
        runs, thens = self.intake.take_pass()
        future, self._pass_commit = self._pass_commit, None
        try:
            if self._pass_groups:
                if future is None:  # the group runs' acknowledgement waits for it
                    future = asyncio.get_running_loop().create_future()
                groups, self._pass_groups = self._pass_groups, {}
                for group, (group_runs, finished) in groups.items():
                    self._apply_group_runs(group, group_runs, finished, future)
            unpacked = self._apply_runs(runs) if runs else []
            boards, self._pass_boards = self._pass_boards, set()
            try:
                written = self.wal.commit_now(self.wal.last_lsn)
            except WalFailedError as exc:
                raise self._read_only_after(exc) from exc
            if not written or unpacked:
                finishing = asyncio.ensure_future(
                    self._finish_pass(written, unpacked, boards, thens, future))
                self._finishing.add(finishing)  # held: the loop keeps only weak references
                finishing.add_done_callback(self._finishing.discard)
                return
            self._committed(boards)
        except Exception as exc:  # ReadOnly, or a bug (already refusing writes)
            _tell_pass_waiters(thens, future, exc)
            return
        _tell_pass_waiters(thens, future, None)

    async def _finish_pass(self, written: bool, unpacked: list[asyncio.Future[None]],
                           boards: set[str],
                           thens: list[Any],
                           future: asyncio.Future[None] | None) -> None:
        """The rest of :meth:`_run_pass` when it has to wait: for the fsync,
        or for the runs that went the general way."""
        try:
            try:
                if not written:
                    await self.wal.commit(self.wal.last_lsn)
            except WalFailedError as exc:
                raise self._read_only_after(exc) from exc
            finally:
                if unpacked:  # the pass's runs that went the general way are part of it
                    for outcome in await asyncio.gather(*unpacked, return_exceptions=True):
                        if outcome is not None:
                            raise outcome
            self._committed(boards)
        except BaseException as exc:
            _tell_pass_waiters(thens, future, exc)
            if not isinstance(exc, Exception):
                raise
        else:
            _tell_pass_waiters(thens, future, None)

    def _committed(self, boards: set[str]) -> None:
        """A pass's records are durable as promised: only now may anyone be
        told (live feed, the Postgres shipper, the snapshot trigger)."""
        if self.listeners:
            for name in boards:
                for listener in self.listeners:
                    listener(name)
        if self.shipper is not None:
            self.shipper.notify()
        if (self._events_since_snapshot >= self._snapshot_threshold
                or self.wal.stats.bytes >= self._tail_bytes.due_at):
            self._snapshot_wanted.set()

    def _read_only_after(self, exc: WalFailedError) -> ReadOnly:
        self._fail(exc)
        return ReadOnly(f"the write-ahead log failed ({exc}); rankd accepts no writes "
                        "until it is restarted")

    async def _roll_back_unlogged(self) -> None:
        """After the log failed, serve only what it acknowledged.

        Writes are applied in memory before their records reach the log; the
        ones the failed log never took were refused to their writers, so
        readers must not see them either.  The state is rebuilt from the
        snapshot and the log up to the last acknowledged position (what a
        restart would recover), in a worker thread; reads answer
        ``ReadOnly`` meanwhile, and for good if the disk cannot be read.
        """
        acknowledged = self.wal.acknowledged_lsn
        shadow = Engine(self.config, clock=self.clock)
        shadow.replication = self._replication
        try:
            await asyncio.to_thread(shadow._rebuild_from, self.wal, acknowledged)
        except Exception:
            log.exception("cannot read back the state the log acknowledged; reads stay "
                          "refused until restart")
            self._rolled_back.set()
            return
        for name, board in shadow.boards.items():
            before = self._boards.get(name)
            # Readers cache by version: move on from theirs.  Not on a cluster
            # node, whose versions are its groups' log positions, the same on
            # every node: the state rolled back to had those versions, and a
            # group that went back is refused as stale (cluster.freshness).
            if before is not None and self._replication is None:
                board.version = max(board.version, before.version) + 1
        changed = set(self._boards) | set(shadow.boards)
        self.boards = shadow.boards
        self.deadlines.rebuild(((name, board.expires_at) for name, board
                                in shadow.boards.items() if board.expires_at is not None),
                               self._now_ms())
        self.positions = shadow.positions
        self.rolling_back = False
        self._rolled_back.set()
        log.warning("rolled back to log position %d, the last one acknowledged; reads "
                    "resume (writes still refused until restart)", acknowledged)
        for name in changed:
            for listener in self.listeners:
                listener(name)

    async def settled(self) -> None:
        """Return once reads are served again after a storage failure (at once
        when there was none, or the state could not be read back)."""
        if self.rolling_back:
            await self._rolled_back.wait()

    def _rebuild_from(self, wal: WriteAheadLog, upto_lsn: int) -> None:
        """Boards as of ``upto_lsn``: the newest snapshot and ``wal`` after it."""
        latest = self.snapshots.latest()
        snapshot_lsn = 0
        if latest is not None:
            snapshot_lsn, sections = latest
            self._load_snapshot(sections)
        for batch in wal.iter_batches(snapshot_lsn + 1, REPLAY_BATCH, upto_lsn):
            self._replay_local(batch)
        self._apply_replayed()

    def _fail(self, exc: BaseException) -> None:
        if self.failure is None:
            log.critical("refusing writes until restart after: %r", exc)
            self.failure = exc
        # Whoever notices a failed log first: the state goes back to what it
        # acknowledged (once).  A bug with the log healthy rolls nothing back:
        # the commits under way still complete.
        if (self.wal is not None and self.wal.failed and self.ready
                and not self._rolled_back.is_set() and not self.rolling_back):
            self.rolling_back = True
            self._tasks.append(asyncio.ensure_future(self._roll_back_unlogged()))

    def _check_writable(self) -> None:
        if self.failure is not None or (self.wal is not None and self.wal.failed):
            self._fail(self.failure or self.wal.failure)
            raise ReadOnly("rankd stopped accepting writes after a storage failure "
                           f"({self.failure}); restart it after fixing the disk")
        if not self.ready:
            raise ReadOnly("rankd is not serving yet")

    async def _submit_when_writable(self, names: set[str], submissions: list[Submission]
                                    ) -> list[dict[str, Any] | EngineError]:
        for name in names:
            board = self._boards.get(name)
            if board is not None:
                await board.writable.wait()
        return await self._submit_batch(submissions)  # held again meanwhile: it waits again

    # --- reads ---------------------------------------------------------------------------

    def _board(self, name: str, *, reading: bool = True) -> Board:
        """The board named ``name`` (``NotFound`` if none); ``reading``: for a
        read, which a cluster node may refuse (its group not committed or
        not fresh enough here: ``Replication.check_read``)."""
        if self.rolling_back:
            raise ReadOnly("rankd is rolling back writes its log did not keep after a "
                           "storage failure; reads resume once it is done")
        if type(name) is not str:  # a list or a map would not even hash
            raise InvalidInput("board name must be a string")
        if self._replication is not None:
            if not self._replication.serving:
                raise Unavailable("this node is catching up with the cluster's log; it "
                                  "serves once it has (see /v1/ready)")
            if reading:
                try:
                    self._replication.check_read(group_of(name), name)
                except Unsettled as exc:
                    if self.unsettled_reads is None:
                        raise
                    self.unsettled_reads.add(exc.group)  # a transaction's: it waits after
        board = self._boards.get(name)
        if board is None or (board.expires_at is not None and self._expired(board)):
            raise NotFound(f"no board named {name!r}")
        return board

    def _view(self, name: str, window: str | None, period: str | None, *,
              reading: bool = True):
        """Resolve (board, window, period, index-or-None) for a read."""
        board = self._board(name, reading=reading)
        window = window or board.config.primary_window
        try:
            check_window(window)
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
        if window not in board.periods:
            raise NotFound(f"board {name!r} does not keep the {window!r} window")
        current = period_of(window, self.clock())
        if period is None or period == current:
            return board, window, current, board.index(window, current)
        try:
            period_start(window, period)
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
        index = board.index(window, period)
        if index is None:
            raise NotFound(f"period {period!r} of the {window} window is not retained")
        return board, window, period, index

    def view(self, name: str, window: str | None = None, period: str | None = None
             ) -> SortedView:
        """A window of the board as a sorted set in Redis's order (see
        :mod:`rankd.engine.view`)."""
        board, _, _, index = self._view(name, window, period)
        return SortedView(index, board.config.order == "asc")

    def read_version(self, name: str, window: str | None = None, period: str | None = None
                     ) -> tuple[int, str, str]:
        """``(version, window, period)`` a read would see: callers cache
        serialized reads by it (any write to the board bumps the version)."""
        board, window, period, _ = self._view(name, window, period)
        return board.version, window, period

    def top(self, name: str, *, window: str | None = None, period: str | None = None,
            offset: int = 0, limit: int = 10) -> dict[str, Any]:
        """The leaderboard page ``offset..offset+limit`` of a window."""
        board, window, period, index = self._view(name, window, period)
        entries = [] if index is None else index.range_by_rank(offset, limit)
        labels = board.labels
        return {
            "entries": [{"rank": rank, "member": member, "score": score + 0.0,  # -0: 0
                         "label": labels.get(member)} for rank, member, score in entries],
            "total": 0 if index is None else len(index),
            "window": window,
            "period": period,
            "version": board.version,
            "updated_at": board.updated_at,
        }

    def standing(self, name: str, member: str, *, window: str | None = None,
                 period: str | None = None) -> dict[str, Any] | None:
        """A member's score and ranks in a window, or ``None`` if absent."""
        board, window, period, index = self._view(name, window, period)
        check_member(member)
        if index is None or member not in index:
            return None
        return {
            "member": member,
            "score": index.score(member) + 0.0,  # a -0 (rankd.engine.zeros) shows as 0
            "rank": index.rank(member),
            "competition_rank": index.competition_rank(member),
            "dense_rank": index.dense_rank(member),
            "percentile": index.percentile(member),
            "total": len(index),
            "label": board.labels.get(member),
            "window": window,
            "period": period,
            "version": board.version,
        }

    def around(self, name: str, member: str, *, above: int = 4, below: int = 4,
               window: str | None = None, period: str | None = None
               ) -> list[dict[str, Any]] | None:
        """Entries around a member (included), or ``None`` if absent."""
        board, _, _, index = self._view(name, window, period)
        check_member(member)
        entries = None if index is None else index.around(member, above, below)
        if entries is None:
            return None
        return [{"rank": r, "member": m, "score": s + 0.0, "label": board.labels.get(m)}
                for r, m, s in entries]

    def ranks(self, name: str, members: Sequence[str], *, window: str | None = None,
              period: str | None = None) -> dict[str, Any]:
        """A friends board: the given members ordered, with global and list ranks."""
        board, window, period, index = self._view(name, window, period)
        for member in members:
            check_member(member)
        found = []
        missing = []
        for member in dict.fromkeys(members):
            rank = None if index is None else index.rank(member)
            if rank is None:
                missing.append(member)
            else:
                found.append((rank, member))
        found.sort()
        return {
            "entries": [{"rank": rank, "list_rank": position, "member": member,
                         "score": index.score(member) + 0.0, "label": board.labels.get(member)}
                        for position, (rank, member) in enumerate(found, 1)],
            "missing": missing,
            "window": window,
            "period": period,
        }

    def periods(self, name: str, window: str | None = None) -> dict[str, Any]:
        """The current period of a window and the closed ones retained."""
        board, window, current, _ = self._view(name, window, None)
        return {"window": window, "current": current,
                "retained": [p for p in board.periods[window] if p < current][::-1]}

    def board_info(self, name: str, *, reading: bool = True) -> dict[str, Any]:
        """A board's config, member counts per window and version
        (``reading`` False: as the answer of a write to it)."""
        board = self._board(name, reading=reading)
        return {"name": name,
                "config": {**board.config.to_dict(), expiry.FIELD: board.expires_at},
                "members": board.member_counts(self.clock()),
                "version": board.version, "updated_at": board.updated_at}

    def digest(self, name: str | None = None) -> str:
        """An order-sensitive hash of boards' configs, members, scores, ranks
        and labels, to compare two states cheaply."""
        digest = hashlib.blake2b(digest_size=16)
        names = sorted(self._boards) if name is None else [self._board(name, reading=False).name]
        for board_name in names:
            board = self._boards[board_name]
            digest.update(json.dumps([board_name, board.config.to_dict()]).encode())
            if board.expires_at is not None:
                digest.update(b"expires_at %d" % board.expires_at)
            for window in sorted(board.periods):
                for period, index in sorted(board.periods[window].items()):
                    digest.update(f"{window}/{period}".encode())
                    # The dump without its header (which holds next_seq, an
                    # artefact of history) and its CRC trailer.
                    digest.update(memoryview(index.dump())[24:-4])
            digest.update(json.dumps(sorted(board.labels.items())).encode())
        return digest.hexdigest()

    # --- expiry (see rankd.engine.expiry) ------------------------------------------------

    def _expired(self, board: Board) -> bool:
        """Whether ``board``'s deadline passed: it is shown nowhere."""
        return board.expires_at is not None and board.expires_at <= self._now_ms()

    def live_board(self, name: str) -> Board | None:
        """Board ``name``, unless there is none or its deadline passed."""
        board = self._boards.get(name)
        if board is None or (board.expires_at is not None and self._expired(board)):
            return None
        return board

    def live_names(self) -> list[str]:
        """The names of the boards shown (not past their deadline), sorted."""
        if not self.deadlines.live:
            return sorted(self._boards)
        now_ms = self._now_ms()
        return sorted(name for name, board in self._boards.items()
                      if board.expires_at is None or board.expires_at > now_ms)

    def deadline(self, name: str) -> int | None:
        """Board ``name``'s deadline, ms since the epoch (None: none);
        ``NotFound`` if it is not shown (see :meth:`_board`)."""
        return self._board(name).expires_at

    async def expire(self, name: str, deadline: int | None, condition: int = 0) -> bool:
        """Set board ``name``'s deadline (None: clear it), as Redis's
        ``PEXPIREAT`` and ``PERSIST`` do: ``condition`` holds
        ``rankd.engine.expiry.IF_*`` bits (``NX``, ``XX``, ``GT``, ``LT``).
        A deadline not in the future deletes the board now.  False when
        nothing changed (no such board, the condition not met, or
        ``PERSIST`` of a board without a deadline)."""
        board = self._board(name, reading=False)
        await board.writable.wait()
        await self.route(name)
        board = self.live_board(name)  # it may be gone meanwhile
        if board is None or not expiry.allowed(board.expires_at, deadline, condition):
            return False
        now_ms = self._now_ms()
        if deadline is None:
            await self._write([[records.EXPIRE, name, None, now_ms]])
        elif deadline <= now_ms:
            await self._write([[records.EXPIRE, name, deadline, now_ms],
                               [records.EXPIRED, name, deadline, now_ms]])
        else:
            await self._write([[records.EXPIRE, name, deadline, now_ms]])
        return True

    def _set_deadline(self, board: Board, deadline: int | None) -> None:
        before, board.expires_at = board.expires_at, deadline
        self.deadlines.set(board.name, deadline, before, self._now_ms())
        if deadline is not None:
            self._deadline_set.set()

    def _forget_board(self, name: str) -> None:
        board = self._boards.pop(name, None)
        if board is not None:
            self.deadlines.forget(name, board.expires_at)

    def _deadline_of(self, name: str) -> int | None:
        board = self._boards.get(name)
        return None if board is None else board.expires_at

    def _purge_now(self, names: Iterable[object], first: int) -> list[bytes]:
        """Delete the boards of ``names`` whose deadline passed, at log
        positions from ``first`` on, before a write to them (which then
        finds them gone, as Redis finds an expired key): their records,
        encoded, to log before the write's."""
        if not self.deadlines.live:
            return []
        now_ms = self._now_ms()
        logged: list[bytes] = []
        for name in {name for name in names if type(name) is str}:
            board = self._boards.get(name)
            if board is None or board.expires_at is None or board.expires_at > now_ms:
                continue
            record = [records.EXPIRED, name, board.expires_at, now_ms]
            self._apply_record(first + len(logged), record)
            logged.append(records.encode(record))
        return logged

    async def _expiry_loop(self) -> None:
        """Delete boards as their deadlines pass (see :meth:`expire_due`),
        sleeping until the next one otherwise."""
        # (Not ``while True``: Python 3.11's ``wait_for`` swallows a cancel
        # that comes as the event is set, and ``close`` would wait forever.)
        while not self._closed:
            try:
                if await self.expire_due():
                    await asyncio.sleep(0)  # other clients' turn between steps
                    continue
            except Exception:
                log.exception("deleting expired boards failed; trying again shortly")
                await asyncio.sleep(expiry.RETRY_MS / 1000)
                continue
            wake = self.deadlines.next_ms()
            self._deadline_set.clear()
            timeout = 60.0 if wake is None else min(60.0, max(0, wake - self._now_ms()) / 1000)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._deadline_set.wait(), timeout)

    async def expire_due(self) -> int:
        """One step of active expiry: delete (a logged ``EXPIRED`` record
        each) up to ``expiry.STEP`` boards whose deadline passed, those
        this node writes; others are looked at again later (a cluster
        follower's come deleted through the group's log).  Returns how
        many were due."""
        deadlines = self.deadlines
        deadlines.compact(self._deadline_of)
        now_ms = self._now_ms()
        due = deadlines.due(now_ms, self._deadline_of)
        if not due or self.failure is not None or self.rolling_back:
            for name, deadline in due:
                deadlines.retry(name, deadline, now_ms)
            return len(due)
        by_group: dict[int, list[list]] = {}
        for name, deadline in due:
            group = group_of(name) if self._replication is not None else 0
            board = self._boards[name]
            if not board.writable.is_set() or (self._replication is not None
                                               and not self._writes(group)):
                deadlines.retry(name, deadline, now_ms)
                continue
            by_group.setdefault(group, []).append([records.EXPIRED, name, deadline, now_ms])
        groups = list(by_group.values())
        outcomes = await asyncio.gather(*(self._write(logged) for logged in groups),
                                        return_exceptions=True)
        for logged, outcome in zip(groups, outcomes, strict=True):
            if isinstance(outcome, EngineError):  # refused (e.g. deposed meanwhile)
                for _, name, deadline, _ in logged:
                    deadlines.retry(name, deadline, now_ms)
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                log.info("deleted %d board(s) whose deadline passed: %s", len(logged),
                         ", ".join(record[1] for record in logged[:10]))
        return len(due)

    def _writes(self, group: int) -> bool:
        """Whether this cluster node writes ``group`` now."""
        try:
            self._replication.writer(group)
        except EngineError:
            return False
        return True

    # --- snapshots and housekeeping ----------------------------------------------------

    async def snapshot(self) -> Path:
        """Write every board to a new snapshot, then drop WAL segments it covers.

        Only what the log holds durably is ever in a snapshot (the log is
        fsynced up to every write the snapshot may hold before it is
        published), and none is taken after a storage failure
        (``ReadOnly``).

        Each index is copied in a worker thread (the copy runs without the
        GIL) while writes to *that board* wait; the event loop keeps serving.

        A snapshot writes the whole state, remembered event ids included, so
        the next one is wanted only after at least as many records as this
        one wrote entries (or ``snapshot_every_events``, if more), but never
        more than ``MAX_SNAPSHOT_EVERY_EVENTS``, or after
        ``snapshot_every_bytes`` bytes of log, whichever first: a busy
        server with a big dedupe table does not spend most of its time
        rewriting it, and the WAL tail a crash leaves stays bounded (see
        :mod:`rankd.engine.tail`).
        """
        async with self._snapshot_lock:
            self._check_writable()
            started = time.monotonic()
            lsn = self.wal.last_lsn
            logged_bytes = self.wal.stats.bytes
            positions = dict(self.positions)
            building = staging.parts_of(self._staged)  # (at `lsn`: no await between)
            try:
                writer = await asyncio.to_thread(self.snapshots.begin, lsn)
            except OSError as exc:
                raise StorageError(f"cannot write a snapshot: {exc}") from exc
            entries = 0
            try:
                if self._replication is not None:
                    await asyncio.to_thread(writer.add, records.encode(
                        ["positions", {g: list(p) for g, p in positions.items()}]))
                for name, board in list(self._boards.items()):
                    if self._boards.get(name) is not board:
                        continue  # dropped meanwhile; the WAL replays the drop
                    entries += await self._snapshot_board(writer, board)
                for part in building:
                    await asyncio.to_thread(writer.add, staging.section(part))
                # The boards may hold writes logged after `lsn`: every one of
                # them must be durable before a snapshot that holds them is.
                try:
                    await self.wal.make_durable(self.wal.last_lsn)
                except WalFailedError as exc:
                    raise self._read_only_after(exc) from exc
                path = await asyncio.to_thread(writer.commit)
            except OSError as exc:
                await asyncio.to_thread(writer.abort)
                raise StorageError(f"cannot write a snapshot: {exc}") from exc
            except BaseException:
                await asyncio.to_thread(writer.abort)
                raise
            self._snapshot_threshold = min(max(self.config.snapshot_every_events, entries),
                                           MAX_SNAPSHOT_EVERY_EVENTS)
            self._events_since_snapshot = max(0, self.wal.last_lsn - lsn)
            self._tail_bytes.set_mark(logged_bytes)
            self._last_snapshot_time = time.monotonic()
            self.last_snapshot = {"lsn": lsn, "path": str(path), "bytes": writer.size,
                                  "entries": entries, "seconds": time.monotonic() - started}
            log.info("snapshot @%d: %d boards, %d bytes in %.2fs", lsn, len(self._boards),
                     writer.size, self.last_snapshot["seconds"])
            await self._drop_covered_segments()
            return path

    async def _snapshot_board(self, writer: Any, board: Board, *, hold: bool = True) -> int:
        """Write one board; return how many entries (members of every
        window and period, labels, event ids) it wrote.  Its writers wait
        (other boards' do not) while its indexes are dumped, in a worker
        thread without the GIL, and while its labels are copied a chunk at
        a time; the copies are encoded and written after writes resume.
        Its event ids are copied a chunk at a time as each is written,
        while writes go on: a copy of them all would double the memory
        they take (hundreds of megabytes on a busy board) for as long as
        the snapshot runs.  Event ids remembered meanwhile are in the WAL
        after the snapshot's position, and ids expired meanwhile would be
        expired again.  The event loop never waits long."""
        async def add(section: list) -> None:
            await asyncio.to_thread(writer.add, records.encode(section))

        entries = 0
        if hold:
            self._hold(board)
        try:
            await add(["board", board.name, board.config.to_dict(), board.version,
                       board.updated_at])
            if board.expires_at is not None:
                await add(["expiry", board.name, board.expires_at])
            for window, periods in board.periods.items():
                for period, index in list(periods.items()):
                    dump = await asyncio.to_thread(index.dump)
                    entries += len(index)
                    await add(["index", board.name, window, period, dump])
            labels = [chunk async for chunk in _yielding(_columns(board.labels))]
            entries += len(board.dedupe)
        finally:
            if hold:
                self._release(board)
        # As columns: a msgpack map's decoder would intern every key.
        for keys, values in labels:
            await add(["label_columns", board.name, keys, values])
        for chunk in board.dedupe.log_chunks(SNAPSHOT_LOG_BYTES):
            await add(["event_id_log", board.name, chunk])
        return entries + sum(len(keys) for keys, _ in labels)

    def _hold(self, board: Board) -> None:
        """Make ``board``'s writers wait (a snapshot is reading it, or a
        store its inputs) until every hold is released.  A board swapped in
        for it meanwhile (a store's) is held with it."""
        board.writable.clear()
        self._held.add(board.name)
        self._holds[board.name] = self._holds.get(board.name, 0) + 1

    def _release(self, board: Board) -> None:
        left = self._holds.pop(board.name, 1) - 1
        if left:
            self._holds[board.name] = left
            return
        board.writable.set()
        current = self._boards.get(board.name)
        if current is not None:
            current.writable.set()
        self._held.discard(board.name)

    async def _drop_covered_segments(self) -> None:
        keep_from = self.snapshots.oldest_kept_lsn() + 1
        if self.shipper is not None:
            keep_from = min(keep_from, self.shipper.shipped_lsn + 1)
        await asyncio.to_thread(self.wal.remove_segments_before, keep_from)

    async def _snapshot_loop(self) -> None:
        interval = self.config.snapshot_every_seconds
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._snapshot_wanted.wait(), timeout=min(interval, 5))
            self._snapshot_wanted.clear()
            due = time.monotonic() - self._last_snapshot_time >= interval
            if self.failure is not None:
                return  # nothing more may become durable: see snapshot()
            if self._events_since_snapshot and (
                    due or self._events_since_snapshot >= self._snapshot_threshold
                    or self.wal.stats.bytes >= self._tail_bytes.due_at):
                try:
                    await self.snapshot()
                except Exception:
                    log.exception("snapshot failed; the WAL keeps everything meanwhile")

    async def _housekeeping_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.housekeeping_seconds)
            try:
                await self.housekeeping()
            except Exception:
                log.exception("housekeeping failed")

    async def housekeeping(self) -> None:
        """Expire dedupe entries and retire periods beyond ``retain``,
        archiving their final standings first.  The event loop runs between
        boards: with tens of thousands of boards, one pass is many steps."""
        now = self.clock()
        for position, board in enumerate(list(self._boards.values())):
            if position % HOUSEKEEPING_STEP == HOUSEKEEPING_STEP - 1:
                await asyncio.sleep(0)
            await board.writable.wait()  # not while a snapshot reads this board
            board.dedupe.expire(now)
            for window, period in board.expired_periods(now):
                index = board.periods[window].get(period)
                if index is None:
                    continue
                entries = [{"rank": r, "member": m, "score": s, "label": board.labels.get(m)}
                           for r, m, s in index.range_by_rank(0, ARCHIVE_DEPTH)]
                await self._archive(board.name, window, period, entries)
                board.periods[window].pop(period, None)
                log.info("retired period %s of %s/%s (%d members)", period, board.name,
                         window, len(index))

    async def _archive(self, board: str, window: str, period: str,
                       entries: list[dict[str, Any]]) -> None:
        if self.config.postgres_dsn:
            from rankd.engine.postgres import archive_standings

            await archive_standings(self.config.postgres_dsn, board, window, period, entries)
            return
        path = (self.config.data_dir / "archive" / file_name_of(board) / window
                / f"{period}.json")
        await asyncio.to_thread(_write_json_atomically, path, {
            "board": board, "window": window, "period": period, "entries": entries})

    def _now_ms(self) -> int:
        return round(self.clock() * 1000)


def _purged_by(logged: list[list]) -> list[str]:
    """The boards ``logged`` writes, but those it deletes as expired."""
    return [record[1] for record in logged if record[0] != records.EXPIRED]


class _Sections:
    """Collects snapshot sections in memory (a group snapshot)."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def add(self, section: bytes) -> None:
        self.parts.append(section)


def _answers_of(part: list | BaseException) -> Iterator:
    """The answers of one part of a split batch.  A part refused as a whole
    (read-only meanwhile) answers each of its submissions with that error,
    and the other part's answers stand."""
    if isinstance(part, EngineError):
        return itertools.repeat(part)
    if isinstance(part, BaseException):
        raise part
    return iter(part)


def _answer_runs(runs: list[Any], finished: asyncio.Future[None],
                 outcome: BaseException | tuple[int, int], *, positioned: bool = True) -> None:
    """Finish a cluster node's packed runs of one group: ``outcome`` is the
    log's ``(seq, epoch)`` of their writes, or why they are not acknowledged
    (an ``EngineError`` answers every submission that was not refused).
    Not ``positioned``: runs answered the general way (each answer holds
    its own position)."""
    if finished.done():
        return
    if isinstance(outcome, EngineError):
        for packed in runs:
            packed.answers = [outcome if answer is None or type(answer) is dict else answer
                              for answer in packed.answers or [None] * len(packed)]
    elif isinstance(outcome, asyncio.CancelledError):
        finished.cancel()
        return
    elif isinstance(outcome, BaseException):
        finished.set_exception(outcome)
        return
    elif positioned:
        seq, epoch = outcome
        for packed in runs:
            packed.position = outcome
            for answer in packed.answers:
                if type(answer) is dict:
                    answer["seq"], answer["epoch"] = seq, epoch
    finished.set_result(None)


def _tell_pass_waiters(thens: list[Any],
                       future: asyncio.Future[None] | None, error: BaseException | None) -> None:
    """Tell a pass's waiters how it ended: ``error`` None once committed."""
    if future is not None and not future.done():
        if error is None:
            future.set_result(None)
        elif isinstance(error, asyncio.CancelledError):
            future.cancel()
        else:
            future.set_exception(error)
    Intake.tell(thens, error)


def _sent_on(exc: ReadOnly) -> Unacknowledged:
    """The answer to a cluster write the local log failed to keep after it
    was sent to its group's log, which may still commit it."""
    return Unacknowledged(f"this node's local log failed ({exc.message}) after the write "
                          "was sent to the cluster's log, which may still commit it: "
                          "resubmit it with the same event id, to another node")


def _failed(exc: BaseException) -> asyncio.Future[None]:
    """A future that already failed with ``exc``."""
    failed = asyncio.get_running_loop().create_future()
    failed.set_exception(exc)
    return failed


async def _yielding(chunks: Iterator[T]) -> AsyncIterator[T]:
    """``chunks``, letting the event loop run after each."""
    for chunk in chunks:
        yield chunk
        await asyncio.sleep(0)


def _columns(mapping: Mapping[str, Any]) -> Iterator[tuple[list, list]]:
    """``mapping``'s keys and values, in lists of ``SNAPSHOT_CHUNK`` (``mapping``
    must not change meanwhile)."""
    keys, values = iter(mapping), iter(mapping.values())
    while chunk := list(itertools.islice(keys, SNAPSHOT_CHUNK)):
        yield chunk, list(itertools.islice(values, len(chunk)))


def _write_json_atomically(path: Path, data: Any) -> None:
    from rankd.engine.snapshot import fsync_directory

    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as handle:
        json.dump(data, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fsync_directory(path.parent)
