"""The commit pipeline: every write of a pass of the event loop in one WAL
append, acknowledged once the fsync policy is met.

Owns the pass: its commit future (shared by its waiters), the boards it
changed, the packed runs of a cluster node's groups, the passes still
waiting for their fsync, the submission counters (``stats``) and the count
of events since the last snapshot (with the threshold that wants the next
one).  A write is applied first (by the write path, synchronously), then
appended here (:meth:`Commits.append`, :meth:`Commits.commit_soon`); the
pass (:meth:`Commits.run_pass`, queued by the intake) applies the packed
runs gathered meanwhile as one native batch, writes everything in one go
and tells the waiters, then the listeners, the Postgres shipper and the
snapshot trigger (:meth:`Commits.committed`): nobody hears of a write
before it is durable as promised.

This is also the native intake's engine (``rankd.engine._intake`` commits a
single node's common pass itself): the names it reads (``wal``, ``failure``,
``ready``, ``config``, ``clock``, ``stats``, ``_check_writable``,
``_fail``, ``_read_only_after``, ``_events_since_snapshot``,
``_committed``, ``_pass_commit``, ``_pass_boards``, ``takes_replicated``)
are this class's.

May not touch: reads, snapshots, recovery; the cluster only through the
callables it is handed (``apply_group_runs``, ``takes_replicated``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from rankd.engine.core import Core
from rankd.engine.errors import ReadOnly
from rankd.engine.failure import StorageGuard
from rankd.engine.ingest import Ingested, ingest_packed
from rankd.engine.intake import Intake
from rankd.engine.tail import TailBytes
from rankd.engine.wal import WalFailedError


class Commits:
    """The pass and its commit (module docstring)."""

    def __init__(self, core: Core, guard: StorageGuard) -> None:
        self.core = core
        self.guard = guard
        self.config = core.config
        self.clock = core.clock
        #: The core's log, ``ready`` and ``failure``, read once a pass (by the
        #: native intake too): copies the core keeps current (``Core.publish``).
        self.wal, self.ready, self.failure = core.wal, core.ready, core.failure
        core.readers.append(self)
        self._listeners = core.listeners
        # The guard's checks under the names the native intake calls.
        self._check_writable = guard.check_writable
        self._fail = guard.fail
        self._read_only_after = guard.read_only_after
        #: Submissions by outcome, for metrics.
        self.stats = {"applied": 0, "duplicate": 0, "rejected": 0}
        self._events_since_snapshot = 0
        #: Events after which a snapshot is wanted: ``snapshot_every_events``,
        #: or as many as the last snapshot wrote entries if that is more, up
        #: to the bound; and the log's bytes past which one is wanted too
        #: (see rankd.engine.tail).
        self.snapshot_threshold = core.config.snapshot_every_events
        self.tail_bytes = TailBytes(core.config.snapshot_every_bytes)
        self.snapshot_wanted = asyncio.Event()
        #: This pass of the event loop's writes (see :meth:`run_pass`): the
        #: future its waiters share (made when one asks) and their boards;
        #: the intake holds the packed runs it applies first, who to tell
        #: when they are committed, and whether the pass is scheduled.
        self._pass_commit: asyncio.Future[None] | None = None
        self._pass_boards: set[str] = set()
        #: Passes waiting for their fsync (or for runs gone the general way).
        self._finishing: set[asyncio.Future[None]] = set()
        #: On a cluster node, the pass's packed runs by board group, and the
        #: future of each group's (done once the ack mode is met).
        self.pass_groups: dict[int, tuple[list[Any], asyncio.Future[None]]] = {}
        #: Set by the engine: a run the pass may not apply goes the general
        #: way (``Submits.unpacked_soon``); a cluster node's runs of one group
        #: (``ReplicatedWrites.apply_group_runs``); whether a cluster node
        #: applies a packed run itself (``ReplicatedWrites.takes``).
        self.unpacked_soon: Callable[[Any], asyncio.Future[None]] = unwired
        self.apply_group_runs: Callable[..., None] = unwired
        self.takes_replicated: Callable[[Any], bool] = unwired

    @property
    def events_since_snapshot(self) -> int:
        """Events committed since the last snapshot's position."""
        return self._events_since_snapshot

    @events_since_snapshot.setter
    def events_since_snapshot(self, events: int) -> None:
        self._events_since_snapshot = events

    # --- appending ---------------------------------------------------------------------

    def count(self, done: Ingested) -> None:
        """Count a batch's outcomes in ``stats``."""
        stats = self.stats
        stats["applied"] += len(done.payloads)
        stats["rejected"] += done.rejected
        stats["duplicate"] += done.duplicates

    async def commit(self, payloads: list[bytes], boards: set[str]) -> None:
        """Append applied records and wait until the fsync policy is met
        (see :meth:`commit_soon`)."""
        # Shielded: the commit is shared, and one cancelled waiter must not cancel it.
        await asyncio.shield(self.commit_soon(payloads, boards))

    def commit_soon(self, payloads: list[bytes], boards: set[str], events: int | None = None
                    ) -> asyncio.Future[None]:
        """Append applied records to the WAL now; the future is done once
        they meet the fsync policy and listeners were told which ``boards``
        changed.  Every commit of one pass of the event loop shares one
        future (one task, one WAL commit).  ``events``: how many changes the
        records hold, when not one each."""
        try:
            self.append(payloads, boards, events)
        except ReadOnly as exc:
            return failed(exc)
        return self.pass_()

    def append(self, payloads: list[bytes], boards: set[str], events: int | None = None
               ) -> None:
        """Append applied records to the WAL (``ReadOnly`` if it failed)."""
        wal = self.core.wal
        try:
            expected = wal.last_lsn + len(payloads)
            last = wal.append_many(payloads)
        except WalFailedError as exc:
            raise self.guard.read_only_after(exc) from exc
        assert last == expected, f"WAL assigned up to {last}, expected {expected}"
        self._events_since_snapshot += len(payloads) if events is None else events
        self._pass_boards.update(boards)

    # --- the pass ----------------------------------------------------------------------

    def pass_(self) -> asyncio.Future[None]:
        """The future of this pass's commit (see :meth:`run_pass`)."""
        intake = self.core.intake
        if not intake.scheduled:
            intake.schedule()
        if self._pass_commit is None:
            self._pass_commit = asyncio.get_running_loop().create_future()
        return self._pass_commit

    def run_pass(self) -> None:
        """Commit this pass: apply its packed runs (as one native batch),
        append everything to the WAL in one write, then tell the waiters.

        Unless each commit needs an fsync (or runs went the general way),
        all of it happens right here, in one callback: no task, and the
        replies of packed runs leave in this same turn of the loop.  (The
        native intake commits the common case of a single node itself, the
        same way: ``Intake.commit_pass``.)
        """
        runs, thens = self.core.intake.take_pass()
        future, self._pass_commit = self._pass_commit, None
        try:
            if self.pass_groups:
                if future is None:  # the group runs' acknowledgement waits for it
                    future = asyncio.get_running_loop().create_future()
                groups, self.pass_groups = self.pass_groups, {}
                for group, (group_runs, finished) in groups.items():
                    self.apply_group_runs(group, group_runs, finished, future)
            unpacked = self._apply_runs(runs) if runs else []
            boards, self._pass_boards = self._pass_boards, set()
            wal = self.core.wal
            try:
                written = wal.commit_now(wal.last_lsn)
            except WalFailedError as exc:
                raise self.guard.read_only_after(exc) from exc
            if not written or unpacked:
                self.finish_soon(written, unpacked, boards, thens, future)
                return
            self._committed(boards)
        except Exception as exc:  # ReadOnly, or a bug (already refusing writes)
            tell_pass_waiters(thens, future, exc)
            return
        tell_pass_waiters(thens, future, None)

    def _apply_runs(self, runs: list[Any]) -> list[asyncio.Future[None]]:
        """Apply the packed runs of a pass and append their records; the
        runs from the first that meets a held board on go the general way
        (their futures are returned)."""
        self.guard.check_writable()
        core = self.core
        held = core.state.held
        unpacked = []
        if held:  # (a snapshot is being taken: checked run by run)
            for position, packed in enumerate(runs):
                if not held.isdisjoint(packed.board_names()):
                    unpacked = [self.unpacked_soon(later) for later in runs[position:]]
                    runs = runs[:position]
                    break
        if runs:
            config = core.config
            try:
                done = ingest_packed(core.state.boards, runs, core.clock(),
                                     core.wal.last_lsn + 1, config.dedupe_ttl,
                                     config.ts_tolerance)
            except Exception as exc:
                self.guard.fail(exc)  # a bug, as in Submits.submit_batch
                raise
            self.count(done)
            if done.payloads:
                self.append(done.payloads, done.boards)
        return unpacked

    def finish_soon(self, written: bool, unpacked: list[asyncio.Future[None]],
                    boards: set[str], thens: list[Any],
                    future: asyncio.Future[None] | None) -> None:
        """Finish a pass that has to wait (:meth:`_finish_pass`) in a task:
        for the fsync, the runs that went the general way, or a write that
        starts a log segment (the native intake's pass too)."""
        finishing = asyncio.ensure_future(
            self._finish_pass(written, unpacked, boards, thens, future))
        self._finishing.add(finishing)  # held: the loop keeps only weak references
        finishing.add_done_callback(self._finishing.discard)

    async def _finish_pass(self, written: bool, unpacked: list[asyncio.Future[None]],
                           boards: set[str],
                           thens: list[Any],
                           future: asyncio.Future[None] | None) -> None:
        """The rest of :meth:`run_pass` when it has to wait: for the fsync,
        or for the runs that went the general way."""
        try:
            try:
                if not written:
                    await self.core.wal.commit(self.core.wal.last_lsn)
            except WalFailedError as exc:
                raise self.guard.read_only_after(exc) from exc
            finally:
                if unpacked:  # the pass's runs that went the general way are part of it
                    for outcome in await asyncio.gather(*unpacked, return_exceptions=True):
                        if outcome is not None:
                            raise outcome
            self._committed(boards)
        except BaseException as exc:
            tell_pass_waiters(thens, future, exc)
            if not isinstance(exc, Exception):
                raise
        else:
            tell_pass_waiters(thens, future, None)

    def _committed(self, boards: set[str]) -> None:
        """A pass's records are durable as promised: only now may anyone be
        told (live feed, the Postgres shipper, the snapshot trigger)."""
        listeners = self._listeners
        if listeners:
            for name in boards:
                for listener in listeners:
                    listener(name)
        shipper = self.core.shipper
        if shipper is not None:
            shipper.notify()
        if (self._events_since_snapshot >= self.snapshot_threshold
                or self.wal.stats.bytes >= self.tail_bytes.due_at):
            self.snapshot_wanted.set()


def unwired(*args: Any) -> Any:
    """The stand-in for a callable the engine hands a room once built."""
    raise RuntimeError("the engine did not wire this room")


def tell_pass_waiters(thens: list[Any],
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


def failed(exc: BaseException) -> asyncio.Future[None]:
    """A future that already failed with ``exc``."""
    future = asyncio.get_running_loop().create_future()
    future.set_exception(exc)
    return future
