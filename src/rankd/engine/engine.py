"""The engine: the one place where leaderboard state changes.

Every front-end (REST, live feed, TCP, RESP, CLI) and the cluster call
:class:`Engine`, the one façade; the work is done in its rooms, each
owning one responsibility and its state (their module headers say what
each owns and may not touch; ARCHITECTURE.md draws a write and a read
through them):

=================  ===========================================================
``core``           the references every room reads (settings, clock, the
                   current log, the cluster seam, life-cycle flags)
``state``          the boards and how a logged record changes them
``replaying``      logged records applied again (recovery, a follower)
``recovery``       the data dir's lock, snapshot + log replay, take-back
``failure``        read-only after a storage failure, and the roll-back
``commits``        the commit pipeline: a pass's writes, one append, acks
``submits``        submissions in every shape, onto one path
``changes``        board changes, removals, transactions and stores
``replicated``     a cluster node's writes and follower steps (the seam)
``queries``        reads: views, pages, standings, ranks, periods, digest
``snapshotting``   snapshots and the log segments they make unneeded
``housekeeping``   retention, archives, expiry
=================  ===========================================================

A write goes through two steps, the first synchronous, so no other
coroutine can interleave with it: *apply* (the records reach the boards,
through :func:`rankd.engine.ingest.ingest` for submissions and
``BoardState.apply_record`` for the rest), then *commit* (append, and wait
until the WAL policy says they are safe, then acknowledge).  Recovery
replays the same records the same way.  If the log cannot be written the
engine stops accepting writes (:class:`ReadOnly`) until restarted; reads
keep working.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
import time
from collections.abc import Callable
from operator import attrgetter
from pathlib import Path
from typing import Any

from rankd.engine import records, zeros
from rankd.engine.changes import BoardChanges
from rankd.engine.commits import Commits
from rankd.engine.core import Core
from rankd.engine.errors import EngineError
from rankd.engine.failure import StorageGuard
from rankd.engine.housekeeping import Housekeeping
from rankd.engine.intake import Intake
from rankd.engine.queries import Queries
from rankd.engine.reads import PlainReads
from rankd.engine.recovery import Recovery
from rankd.engine.replaying import Replayer
from rankd.engine.replicated import ReplicatedWrites
from rankd.engine.settings import (  # noqa: F401 - the names importers take from here
    ARCHIVE_DEPTH,
    FSYNC_POLICIES,
    SETTLE_SECONDS,
    SETTLE_TRIES,
    EngineConfig,
)
from rankd.engine.snapshotting import Snapshotter
from rankd.engine.state import BoardState
from rankd.engine.submits import Submits
from rankd.engine.wal import WalFailedError
from rankd.index import kinds

log = logging.getLogger(__name__)


class _Room:
    """A method of the :class:`Engine` that is one of its rooms' (its
    docstring and signature are the room method's).  Each engine binds the
    room's method in its own ``__dict__`` (:func:`_bind_rooms`), so a call
    costs no extra frame; a subclass's own method of the name stays."""

    def __init__(self, room: str, function: Callable[..., Any]) -> None:
        self.room, self.name = room, function.__name__
        self.__doc__, self.__wrapped__ = function.__doc__, function

    def __set_name__(self, owner: type, name: str) -> None:
        self.__name__ = name

    def __get__(self, engine: Any, owner: type | None = None) -> Any:
        if engine is None:  # (Engine.top is Queries.top: help() and signature() see it)
            return self.__wrapped__
        return getattr(getattr(engine, self.room), self.name)


def _bind_rooms(engine: Engine) -> None:
    """Put each :class:`_Room` method's bound room method on ``engine``."""
    for name in dir(type(engine)):
        forward = inspect.getattr_static(type(engine), name)
        if isinstance(forward, _Room):
            engine.__dict__[name] = forward.__get__(engine)


def _kept(room: str, name: str, doc: str, setter: str | None = None) -> property:
    """An attribute of the :class:`Engine` that one of its rooms keeps (read
    by a C-level getter: no Python frame); set with the room's ``setter``
    method if given."""
    def set_it(engine: Engine, value: Any) -> None:
        if setter is None:
            setattr(getattr(engine, room), name, value)
        else:
            getattr(getattr(engine, room), setter)(value)
    return property(attrgetter(f"{room}.{name}"), set_it, doc=doc)


class Engine:
    """Boards, their windows and the durable log behind them."""

    def __init__(self, config: EngineConfig | None = None, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.config = config = config or EngineConfig()
        kinds.use(config.index)  # (one kind a process: every board built from now on)
        self.clock = clock
        self._state = state = BoardState(clock)
        #: Answers packed plain reads (RESP's), natively when built.
        self.plain_reads = PlainReads({})
        self._core = core = Core(config, clock, state, self.plain_reads)
        self._replayer = Replayer(core, state)
        self._recovery = Recovery(core, self._replayer)
        self._guard = guard = StorageGuard(core, self._recovery.rebuild)
        self._commits = commits = Commits(core, guard)
        self._cluster = cluster = ReplicatedWrites(core, guard, commits, self._replayer)
        self._submits = submits = Submits(core, guard, commits, cluster)
        self._queries = Queries(core)
        self._changes = BoardChanges(core, guard, commits, cluster, self._queries)
        self._snapshotter = Snapshotter(core, guard, commits)
        self._housekeeping = Housekeeping(core, guard, self._changes, cluster)
        # The write path's upward calls, handed down as callables.
        commits.unpacked_soon = cluster.unpacked_soon = submits.unpacked_soon
        commits.apply_group_runs = cluster.apply_group_runs
        commits.takes_replicated = cluster.takes
        #: The packed path's front door (see rankd.engine.intake), which
        #: front-ends reach through the service; the board state and the
        #: core keep its boards and replication up to date.
        self.intake = core.intake = Intake(commits, state.held, self._run_pass,
                                           submits.submit_packed_later)
        #: Boards' deadlines (see rankd.engine.expiry); the native paths
        #: hold its set of boards about to expire, and leave those alone.
        self.deadlines = state.deadlines
        self.intake.expiring = self.plain_reads.expiring = state.deadlines.expiring
        state.mirrors += [self.intake, self.plain_reads]
        state.replace(state.boards)
        #: Merges the submissions of concurrent callers into one batch.
        self.coalescer = submits.coalescer
        #: Submissions by outcome, for metrics.
        self.stats = commits.stats
        #: Called with a board name after each change (live feed, caches).
        self.listeners = core.listeners
        #: A cluster primary's groups whose writes wait while readers settle.
        self.read_gates = cluster.read_gates
        _bind_rooms(self)

    # --- what the rooms keep ------------------------------------------------------------

    boards = _kept("_state", "boards", "Every board, by name (set: replaced whole, the "
                   "intake's too).", setter="replace")
    positions = _kept("_state", "positions", "A cluster node's place in each group's log: "
                      "group -> (seq, epoch) of the last record it applied.")
    walked = _kept("_state", "walked", "Groups loaded from a snapshot walked under writes: "
                   "group -> the position their state may show records up to.")
    drops = _kept("_state", "drops", "Boards dropped so far (see ``dropped_since``).")
    wal = property(attrgetter("_core.wal"), doc="The write-ahead log, once recovered.")
    snapshots = _kept("_core", "snapshots", "The snapshot files (rankd.engine.snapshot).")
    shipper = _kept("_core", "shipper", "The Postgres shipper, when configured.")
    ready = property(attrgetter("_core.ready"),
                     doc="Set once recovery finished and the engine serves.")
    replication = _kept("_core", "replication", "Set (before start) on a cluster node: see "
                        "rankd.engine.replication.", setter="set_replication")
    failure = _kept("_guard", "failure", "The storage error that made the engine "
                    "read-only, if any.")
    rolling_back = _kept("_guard", "rolling_back", "Set while the state is rebuilt after a "
                         "storage failure: reads are refused meanwhile.")
    unsettled_reads = _kept("_queries", "unsettled_reads", "While a transaction runs its "
                            "step: the groups whose uncommitted writes its reads met.")
    last_snapshot = _kept("_snapshotter", "last_snapshot", "The last snapshot's position, "
                          "path, size, entries and seconds.")

    # --- life cycle -------------------------------------------------------------------

    @classmethod
    async def open(cls, config: EngineConfig | None = None, *,
                   clock: Callable[[], float] = time.time) -> Engine:
        """Lock the data dir, recover (snapshot + WAL tail) and start serving."""
        engine = cls(config, clock=clock)
        await engine.start()
        return engine

    @classmethod
    async def rebuild(cls, data_dir: Path, *, clock: Callable[[], float] = time.time) -> int:
        """Open ``data_dir`` as after a crash (replaying its log), close it
        with a snapshot and return its last position: what
        :func:`rankd.engine.postgres.restore` does once the log is written.
        Its start retires periods as of ``clock``."""
        engine = await cls.open(EngineConfig(data_dir=data_dir, fsync="always"), clock=clock)
        try:
            return engine.wal.last_lsn
        finally:
            await engine.close(snapshot=True)

    def lock(self) -> None:
        """Take the data dir's lock; ``RuntimeError`` if another process has it."""
        self._recovery.lock()

    async def start(self) -> None:
        """Recover and start serving (takes the lock first if needed)."""
        core = self._core
        self._recovery.lock()
        try:
            await self._recover()
            await core.wal.start()
            if core.config.postgres_dsn:
                from rankd.engine.postgres import PostgresShipper

                await self._recovery.take_back_lost_records()
                core.shipper = PostgresShipper(core.config.postgres_dsn, core.wal,
                                               records.describe)
                await core.shipper.start()
        except BaseException:
            self._recovery.unlock()
            raise
        staged = self._state.staged
        if staged and core.replication is None:
            # Built by a rankd that stopped before their end (records taken
            # back included): nothing to show.  (A cluster's may still end.)
            log.info("recovery: dropping %d store(s) left unfinished: %s", len(staged),
                     ", ".join(sorted(staged)[:10]))
            staged.clear()
        self._snapshotter.last_time = time.monotonic()
        if zeros.settle_after_load(self._state.boards):
            # The -0 scores this restart made 0 are in no record: a snapshot soon keeps them so.
            self._commits.events_since_snapshot += 1
            self._snapshotter.last_time = -math.inf
        # Periods retired before the restart (retiring is not logged: the log
        # made them again) are retired again before the first read.  (Expired
        # event ids answer as forgotten already: they wait for the loop.)
        try:
            await self._housekeeping.housekeeping(expire_ids=False)
        except Exception:
            log.exception("housekeeping at start failed; its loop tries again")
        core.tasks.append(asyncio.create_task(self._snapshotter.loop(),
                                              name="rankd-snapshots"))
        core.tasks.append(asyncio.create_task(self._housekeeping.loop(),
                                              name="rankd-housekeeping"))
        core.tasks.append(asyncio.create_task(self._housekeeping.expiry_loop(),
                                              name="rankd-expiry"))
        core.publish(ready=True)
        # (The intake commits a common pass itself when the log writes at once.)
        self.intake.commits_now = core.replication is None and core.wal.fsync != "always"

    async def _recover(self) -> None:
        """Recover the data dir in a worker thread; the replayed tail counts
        towards the next snapshot (records and bytes)."""
        commits = self._commits
        commits.events_since_snapshot = await asyncio.to_thread(self._recovery.recover)
        commits.tail_bytes.recovered(self._recovery.replayed_bytes)

    async def close(self, *, snapshot: bool = True) -> None:
        """Flush the WAL, snapshot (unless told not to) and release the data dir."""
        core = self._core
        if core.closed:
            return
        core.closed = True
        for task in core.tasks:
            task.cancel()
        for task in core.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        try:
            if core.wal is not None and self._guard.failure is None:
                with contextlib.suppress(WalFailedError):
                    await core.wal.commit(core.wal.last_lsn)
                if snapshot and core.ready:
                    try:
                        await self.snapshot()
                    except EngineError as exc:  # e.g. a full disk: the WAL holds it all
                        log.error("no snapshot at shutdown (%s); the WAL keeps everything and "
                                  "the next start replays it", exc)
            if core.shipper is not None:
                if core.shipper.connected and self._guard.failure is None:
                    # Give a live connection a moment to catch up before exit.
                    with contextlib.suppress(TimeoutError):
                        await core.wal.sync()
                        await core.shipper.wait_shipped(core.wal.shippable_lsn, timeout=5)
                await core.shipper.stop()
        finally:
            if core.wal is not None:
                await core.wal.close()
            self._recovery.unlock()

    async def set_local_state_aside(self, reason: BaseException) -> Path:
        """A cluster node whose local log cannot be recovered: move the log
        and snapshots aside (kept, never deleted) and start empty; the
        cluster's log is the authority, and following it rebuilds every
        group."""
        aside = await self._recovery.set_local_state_aside(reason)
        self._core.unshipped.clear()  # (its notes are positions of the log set aside)
        return aside

    async def start_again_empty(self) -> Path:
        """A cluster node whose local log failed (a full disk) and whose data
        dir takes writes again: set the local state aside (see
        :meth:`set_local_state_aside`), open a new, empty log and accept
        writes again, without a restart.  The caller stops applying the
        cluster's logs first and follows every group from the start after."""
        core = self._core
        reason = self._guard.failure or (core.wal.failure if core.wal is not None else None)
        await self.settled()  # the roll-back of what the failed log never took
        aside = await self.set_local_state_aside(reason or RuntimeError("a failed log"))
        self._guard.reset()
        await self._recover()
        await core.wal.start()
        if not any(task.get_name() == "rankd-snapshots" and not task.done()
                   for task in core.tasks):  # (its loop ends when the log fails)
            core.tasks.append(asyncio.create_task(self._snapshotter.loop(),
                                                  name="rankd-snapshots"))
        return aside

    settled = _Room("_guard", StorageGuard.settled)

    # --- writes (rooms: submits, changes, commits) ----------------------------------------

    submit = _Room("_submits", Submits.submit)
    submit_many = _Room("_submits", Submits.submit_many)
    submit_packed = _Room("_submits", Submits.submit_packed)
    submit_packed_nowait = _Room("_submits", Submits.submit_packed_nowait)
    submit_packed_then = _Room("_submits", Submits.submit_packed_then)
    put_board = _Room("_changes", BoardChanges.put_board)
    delete_board = _Room("_changes", BoardChanges.delete_board)
    replace_board = _Room("_changes", BoardChanges.replace_board)
    expire = _Room("_changes", BoardChanges.expire)
    remove_member = _Room("_changes", BoardChanges.remove_member)
    remove_members = _Room("_changes", BoardChanges.remove_members)
    remove_members_now = _Room("_changes", BoardChanges.remove_members_now)
    removes_now = _Room("_changes", BoardChanges.removes_now)
    transaction = _Room("_changes", BoardChanges.transaction)
    stage = _Room("_changes", BoardChanges.stage)
    hold_writes = _Room("_changes", BoardChanges.hold_writes)
    # A removal a front-end applied itself (the RESP pop lane): check, clock, commit.
    check_writable = _Room("_guard", StorageGuard.check_writable)
    now_ms = _Room("_state", BoardState.now_ms)
    commit_soon = _Room("_commits", Commits.commit_soon)

    # --- a cluster node (room: replicated; see rankd.engine.replication) ------------------

    caught_up = _Room("_cluster", ReplicatedWrites.caught_up)
    settle = _Room("_cluster", ReplicatedWrites.settle)
    settled_read = _Room("_cluster", ReplicatedWrites.settled_read)
    route = _Room("_cluster", ReplicatedWrites.route)
    apply_replicated = _Room("_cluster", ReplicatedWrites.apply_replicated)
    held_in = _Room("_cluster", ReplicatedWrites.held_in)
    released = _Room("_cluster", ReplicatedWrites.released)
    written_by = _Room("_cluster", ReplicatedWrites.written_by)
    local_positions_checked = _Room("_cluster", ReplicatedWrites.local_positions_checked)
    load_group_snapshot = _Room("_cluster", ReplicatedWrites.load_group_snapshot)
    reset_group = _Room("_cluster", ReplicatedWrites.reset_group)
    group_snapshot = _Room("_snapshotter", Snapshotter.group_snapshot)

    def takes_replicated(self, packed: Any) -> bool:
        """On a cluster node, whether :meth:`submit_packed_nowait` applies a
        packed run itself: only if its boards are of one group this node
        writes now (the others go the general way, which forwards them or
        names their primary)."""
        return self._cluster.takes(packed)

    # --- reads (rooms: queries, state) ------------------------------------------------------

    view = _Room("_queries", Queries.view)
    read_version = _Room("_queries", Queries.read_version)
    top = _Room("_queries", Queries.top)
    standing = _Room("_queries", Queries.standing)
    standing_read = _Room("_queries", Queries.standing_read)
    around = _Room("_queries", Queries.around)
    ranks = _Room("_queries", Queries.ranks)
    periods = _Room("_queries", Queries.periods)
    board_info = _Room("_queries", Queries.board_info)
    digest = _Room("_queries", Queries.digest)
    deadline = _Room("_queries", Queries.deadline)
    live_board = _Room("_state", BoardState.live_board)
    live_names = _Room("_state", BoardState.live_names)
    dropped_since = _Room("_state", BoardState.dropped_since)

    # --- snapshots and housekeeping -----------------------------------------------------------

    snapshot = _Room("_snapshotter", Snapshotter.snapshot)
    housekeeping = _Room("_housekeeping", Housekeeping.housekeeping)
    expire_due = _Room("_housekeeping", Housekeeping.expire_due)

    def _run_pass(self) -> None:
        """Commit this pass (``Commits.run_pass``): what the intake queues."""
        self._commits.run_pass()

    # --- inner steps the tests drive ----------------------------------------------------------

    _hold = _Room("_state", BoardState.hold)
    _release = _Room("_state", BoardState.release)
    _now_ms = _Room("_state", BoardState.now_ms)
    _write = _Room("_changes", BoardChanges.write)
    _held = property(lambda self: self._state.held)
    _staged = property(lambda self: self._state.staged)
    _tasks = property(lambda self: self._core.tasks)
    _snapshot_lock = property(lambda self: self._snapshotter.lock)
    _snapshot_wanted = property(lambda self: self._commits.snapshot_wanted)
