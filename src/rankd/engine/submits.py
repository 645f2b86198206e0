"""Submissions, in every shape a front-end hands them, put on one path.

Owns the shapes: one :class:`~rankd.engine.submission.Submission`, many
(merged with concurrent callers' by the :class:`~rankd.engine.coalescer.
SubmitCoalescer` into one batch), and packed runs from the native scanners
(``submit_packed*``), which join the pass of the event loop
(:class:`rankd.engine.commits.Commits`) or, when they may not (a board a
snapshot holds, runs gone that way before them), go the general way as
submissions.  Each batch is applied through :mod:`rankd.engine.ingest`
and committed by the pass; a cluster node's through
:class:`rankd.engine.replicated.ReplicatedWrites`.  Boards held by a
snapshot make their own submissions wait, not the rest of the batch.

May not touch: reads, snapshots, recovery; board changes (their room is
:mod:`rankd.engine.changes`).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterable, Iterator
from typing import Any

from rankd.engine import zeros
from rankd.engine.coalescer import SubmitCoalescer
from rankd.engine.commits import Commits, failed
from rankd.engine.core import Core
from rankd.engine.errors import EngineError, ReadOnly
from rankd.engine.failure import StorageGuard
from rankd.engine.ingest import ingest
from rankd.engine.intake import Then
from rankd.engine.replicated import ReplicatedWrites
from rankd.engine.submission import Submission


class Submits:
    """Submissions onto the write path (module docstring)."""

    def __init__(self, core: Core, guard: StorageGuard, commits: Commits,
                 cluster: ReplicatedWrites) -> None:
        self.core = core
        self.state = core.state
        self.guard = guard
        self.commits = commits
        self.cluster = cluster
        #: Merges the submissions of concurrent callers into one batch.
        self.coalescer = SubmitCoalescer(self.submit_batch)
        #: By board, the future of the last part waiting for it (a hold):
        #: done once that part's turn came.  A later batch's submissions to
        #: the board wait behind it, even once the hold is released.
        self._waiting: dict[str, asyncio.Future[None]] = {}

    async def submit(self, submission: Submission) -> dict[str, Any]:
        """Apply one submission and return its result (raises EngineError)."""
        (answer,) = await self.coalescer.submit_many([submission])
        if isinstance(answer, EngineError):
            try:
                raise answer
            finally:  # its traceback holds this frame: no cycle through the local
                del answer
        return zeros.shown(answer)  # (REST's: a -0 shows as 0, as in reads)

    async def submit_many(self, submissions: Iterable[Submission]
                          ) -> list[dict[str, Any] | EngineError]:
        """Apply submissions in order, one result or error each.

        A bad submission gets its own error and does not fail the others.
        Submissions of concurrent callers (those that call during the same
        pass of the event loop) are applied together: one WAL append and one
        commit, so under ``fsync=always`` they share one fsync.  A batch
        holds at most ``coalescer.MAX_COALESCED`` submissions (a few ms of
        the loop): a longer list goes in parts, a pass apart, answered at
        once (see :mod:`rankd.engine.coalescer`).
        """
        return await self.coalescer.submit_many(list(submissions))

    async def submit_batch(self, submissions: list[Submission], *, turn: bool = False
                           ) -> list[dict[str, Any] | EngineError]:
        """Apply one coalesced batch (see :meth:`submit_many`).

        Submissions to a board whose snapshot holds its writes wait for it,
        and so do those to a board that earlier submissions still wait for
        (``turn``: these are those earlier ones, their turn come); the rest
        of the batch does not wait with them (the order of each board's
        submissions is kept).
        """
        state = self.state
        queued = self._waiting
        held = (state.held or (queued and not turn)) and {
            s.board for s in submissions if type(s.board) is str and (
                s.board in state.held or (not turn and s.board in queued))}
        if held:
            waiting = [type(s.board) is str and s.board in held for s in submissions]
            free = [s for s, wait in zip(submissions, waiting, strict=True) if not wait]
            later = [s for s, wait in zip(submissions, waiting, strict=True) if wait]
            # Queued now, before any await: a later batch finds it.
            before = [queued[name] for name in held if name in queued]
            mine = asyncio.get_running_loop().create_future()
            queued.update(dict.fromkeys(held, mine))
            # Packed runs handed over meanwhile go the general way, behind it.
            self.core.intake.unpacked += 1
            parts = await asyncio.gather(self.submit_batch(free),
                                         self._submit_when_writable(held, later, before, mine),
                                         return_exceptions=True)
            first, then = [_answers_of(part) for part in parts]
            return [next(then) if wait else next(first) for wait in waiting]
        self.guard.check_writable()
        core = self.core
        if core.replication is not None:
            return await self.cluster.submit(submissions)
        commits = self.commits
        wal = core.wal
        purged = state.purge_now((s.board for s in submissions), wal.last_lsn + 1)
        if purged:
            commits.append(purged, set())
        config = core.config
        try:
            done = ingest(state.boards, submissions, core.clock(), wal.last_lsn + 1,
                          config.dedupe_ttl, config.ts_tolerance)
        except Exception as exc:
            # Only a bug gets here, possibly with part of a batch applied and
            # nothing logged: refuse writes rather than diverge from the log.
            self.guard.fail(exc)
            raise
        commits.count(done)
        if done.payloads:
            await commits.commit(done.payloads, done.boards)
        elif purged:
            await asyncio.shield(commits.pass_())
        return done.answers

    async def _submit_when_writable(self, names: set[str], submissions: list[Submission],
                                    before: list[asyncio.Future[None]],
                                    mine: asyncio.Future[None]
                                    ) -> list[dict[str, Any] | EngineError]:
        """Apply ``submissions`` once the parts queued ``before`` them on
        boards ``names`` had their turn and no hold is left on those boards."""
        try:
            for earlier in before:
                await asyncio.shield(earlier)
            while blocked := [board for name in names
                              if (board := self.state.boards.get(name)) is not None
                              and not board.writable.is_set()]:
                for board in blocked:
                    await board.writable.wait()
        finally:
            # Our turn (or we are gone): the parts queued behind go on.
            for name in names:
                if self._waiting.get(name) is mine:
                    del self._waiting[name]
            mine.set_result(None)
            self.core.intake.unpacked -= 1
        # (no await since the check: applied before any part queued behind)
        return await self.submit_batch(submissions, turn=True)

    # --- packed runs ------------------------------------------------------------------

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
            self.guard.check_writable()
        except ReadOnly as exc:
            return failed(exc)
        intake = self.core.intake
        held = self.state.held
        if intake.unpacked or (held and not held.isdisjoint(packed.board_names())):
            return self.unpacked_soon(packed)
        if self.core.replication is not None:
            group = self.cluster.written_group(packed)
            if group is None:
                return self.unpacked_soon(packed)
            if not intake.scheduled:
                intake.schedule()
            pass_groups = self.commits.pass_groups
            entry = pass_groups.get(group)
            if entry is None:
                entry = pass_groups[group] = (
                    [], asyncio.get_running_loop().create_future())
            entry[0].append(packed)
            return entry[1]
        intake.runs.append(packed)
        return self.commits.pass_()

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
        self.core.intake.submit_then(packed, then, token)

    def submit_packed_later(self, packed: Any, then: Then, token: Any) -> None:
        """A run that may not join the pass directly (see ``Intake.submit_then``)."""
        self.submit_packed_nowait(packed).add_done_callback(
            lambda done: then(token, done.exception() if not done.cancelled()
                              else asyncio.CancelledError()))

    def unpacked_soon(self, packed: Any) -> asyncio.Future[None]:
        """Apply a packed run the general way, as submissions, in a task."""
        self.core.intake.unpacked += 1
        return asyncio.ensure_future(self._submit_unpacked(packed))

    async def _submit_unpacked(self, packed: Any) -> None:
        try:
            packed.answers = await self.submit_many(packed.submissions())
        except EngineError as exc:  # e.g. read-only: every submission gets the error
            packed.answers = [exc] * len(packed)
        finally:
            self.core.intake.unpacked -= 1


def _answers_of(part: list | BaseException) -> Iterator:
    """The answers of one part of a split batch.  A part refused as a whole
    (read-only meanwhile) answers each of its submissions with that error,
    and the other part's answers stand."""
    if isinstance(part, EngineError):
        return itertools.repeat(part)
    if isinstance(part, BaseException):
        raise part
    return iter(part)
