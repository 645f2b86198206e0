"""The engine's side of the cluster seam: writes of a cluster node.

Owns what a node's engine does with the :class:`rankd.engine.replication.
Replication` the cluster plugs in: a write of a board group takes its
positions from the group's :class:`~rankd.engine.replication.GroupWriter`
instead of the local log's (:meth:`ReplicatedWrites.replicate`) and is
acknowledged as the ack mode says (:meth:`ReplicatedWrites.acknowledged`);
a follower applies what it reads from a group's log
(:meth:`ReplicatedWrites.apply_replicated`), forgets a group, or loads a
group's snapshot.  Also the read side of the seam: the read gates that let
a primary's readers see only committed writes (:mod:`rankd.engine.settling`),
read-your-writes (:meth:`ReplicatedWrites.caught_up`) and ``route``.

May not touch: the cluster's modules (it sees only the two protocols of
:mod:`rankd.engine.replication`), reads, snapshots.  The local log is
written through :class:`rankd.engine.commits.Commits` only.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any, TypeVar

from rankd._tasks import outcome_seen
from rankd.engine import group_load, records, settings
from rankd.engine.board import Board
from rankd.engine.commits import Commits, unwired
from rankd.engine.core import Core
from rankd.engine.errors import (
    EngineError,
    NotPrimary,
    ReadOnly,
    Unacknowledged,
    Unavailable,
    Unsettled,
)
from rankd.engine.failure import StorageGuard
from rankd.engine.groups import group_of
from rankd.engine.ingest import ingest, ingest_packed, missing_board
from rankd.engine.replaying import Replayer
from rankd.engine.replication import GroupWriter
from rankd.engine.settling import ReadGates
from rankd.engine.submission import Submission

T = TypeVar("T")


class ReplicatedWrites:
    """A cluster node's writes and follower steps (module docstring)."""

    def __init__(self, core: Core, guard: StorageGuard, commits: Commits,
                 replayer: Replayer) -> None:
        self.core = core
        self.state = core.state
        self.guard = guard
        self.commits = commits
        self.replayer = replayer
        #: A cluster primary's groups whose writes wait while readers settle.
        self.read_gates = ReadGates()
        #: Set (and replaced) whenever ``positions`` advance.
        self.advanced = asyncio.Event()
        #: Set by the engine: a run that goes the general way (``Submits.unpacked_soon``).
        self.unpacked_soon: Callable[[Any], asyncio.Future[None]] = unwired

    def advance(self) -> None:
        self.advanced.set()
        self.advanced = asyncio.Event()

    # --- reads on a cluster node ---------------------------------------------------------

    async def caught_up(self, name: object, seq: int, timeout: float) -> None:
        """Return once board ``name``'s group is applied here up to position
        ``seq`` (read-your-writes on a cluster node; at once on a single
        node, which has every write it acknowledged); ``Unavailable`` if
        ``timeout`` passes first."""
        replication = self.core.replication
        if replication is None or type(name) is not str:
            return
        group = group_of(name)
        deadline = time.monotonic() + timeout
        if self.state.positions.get(group, (0, 0))[0] < seq:
            replication.awaited(group)
        while (applied := self.state.positions.get(group, (0, 0))[0]) < seq:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Unavailable(f"this node has applied board {name!r}'s log up to "
                                  f"position {applied}, not yet {seq}; read again, or from "
                                  "its primary")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.advanced.wait(), left)

    async def settle(self, group: int, timeout: float = settings.SETTLE_SECONDS) -> None:
        """Wait until the records of ``group`` this node applied are
        committed to its log, holding the group's writes meanwhile (see
        :mod:`rankd.engine.settling`): a read made right after this, without
        awaiting, shows only committed writes.  ``Unavailable`` if they are
        not committed within ``timeout``."""
        replication = self.core.replication
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
        for _ in range(settings.SETTLE_TRIES - 1):
            try:
                return read()
            except Unsettled as exc:
                await self.settle(exc.group)
        return read()

    # --- writes of a primary ---------------------------------------------------------------

    async def route(self, name: object) -> None:
        """On a cluster node: raise ``NotPrimary`` (naming the primary) if
        another node writes board ``name``'s group, so a front-end can send
        the whole request there.  Nothing on a single node."""
        replication = self.core.replication
        if replication is not None and type(name) is str:
            group = group_of(name)
            exists = name in self.state.boards  # a group is taken only for a write that can apply
            refusal = (await replication.prepare({group}, take=exists)).get(group)
            if refusal is not None:
                raise refusal
            try:
                replication.writer(group)
            except NotPrimary as exc:
                if exists or exc.primary is not None:
                    raise  # (else: no node writes it, each event is answered not_found)

    def writes(self, group: int) -> bool:
        """Whether this cluster node writes ``group`` now."""
        try:
            self.core.replication.writer(group)
        except EngineError:
            return False
        return True

    async def writer_of(self, group: int) -> GroupWriter:
        """This node's writer of ``group``, once it may write it now (taken
        if no node holds it, its readers settled); nothing may be awaited
        between this and applying the writes.  Raises the group's refusal."""
        replication = self.core.replication
        refusal = (await replication.prepare({group})).get(group)
        if refusal is not None:
            raise refusal
        await self.read_gates.opened((group,))
        self.guard.check_writable()
        return self.core.replication.writer(group)

    async def submit(self, submissions: list[Submission]
                     ) -> list[dict[str, Any] | EngineError]:
        """Apply a batch on a cluster node: each group's submissions at that
        group's next positions, acknowledged as the ack mode says."""
        replication = self.core.replication
        config = self.core.config
        by_group: dict[int, list[int]] = {}
        for position, submission in enumerate(submissions):
            group = group_of(submission.board) if type(submission.board) is str else -1
            by_group.setdefault(group, []).append(position)
        # A group is taken only for a write that can apply: not for writes to
        # boards missing here (answered not_found below, or by their primary).
        boards = self.state.boards
        applicable = {group for group, positions in by_group.items()
                      if group >= 0 and any(submissions[p].board in boards for p in positions)}
        refusals = await replication.prepare(applicable)
        refusals.update(await replication.prepare(set(by_group) - applicable - {-1},
                                                  take=False))
        # Nothing awaited from here on: what readers settled stays so until applied.
        await self.read_gates.opened(by_group)
        self.guard.check_writable()
        answers: list[Any] = [None] * len(submissions)
        waits: list[tuple[list[int], asyncio.Future]] = []
        for group, positions in by_group.items():
            # Each group's submissions get that group's own outcome: a group
            # refused here changes nothing of the others'.
            try:
                if group in refusals:
                    raise refusals[group]
                writer = replication.writer(group) if group >= 0 else None
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
            purged = self.state.purge_now((submissions[p].board for p in positions), first) \
                if writer else []
            try:
                done = ingest(self.state.boards, [submissions[p] for p in positions],
                              self.core.clock(), first + len(purged), config.dedupe_ttl,
                              config.ts_tolerance)
            except Exception as exc:
                self.guard.fail(exc)  # a bug, as in Submits.submit_batch
                raise
            self.commits.count(done)
            for position, answer in zip(positions, done.answers, strict=True):
                answers[position] = answer
            applied = [p for p, a in zip(positions, done.answers, strict=True)
                       if not isinstance(a, EngineError)]
            if done.payloads or purged:
                try:
                    replicated = self.replicate(writer, [*purged, *done.payloads],
                                                done.boards)
                except EngineError as exc:  # the local log failed: sent nowhere
                    for position in applied:
                        answers[position] = exc
                    continue
                waits.append((applied, replicated))
            elif applied:
                # Duplicates only: the events they repeat may not be committed
                # yet, and a duplicate's answer acknowledges them too.
                waits.append((applied, asyncio.ensure_future(self.acknowledged(
                    writer, writer.next_seq - 1, writer.epoch, self.commits.pass_()))))
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

    async def write(self, logged: list[list]) -> None:
        """Apply and replicate non-submission records of one board's group."""
        writer = await self.writer_of(group_of(logged[0][1]))
        purged = self.state.purge_now(purged_by(logged), writer.next_seq)
        for position, record in enumerate(logged, writer.next_seq + len(purged)):
            self.state.apply_record(position, record)
        await self.replicate(writer, [*purged, *(records.encode(record) for record in logged)],
                             {record[1] for record in logged})

    def replicate(self, writer: GroupWriter, payloads: list[bytes], boards: set[str],
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
        self.commits.append([records.encode([records.REPLICATED, group, first, epoch,
                                             payloads])], boards, len(payloads))
        self.core.unshipped.written(writer, last, self.core.wal.last_lsn)
        enqueued = writer.enqueue(payloads)
        assert enqueued == first, f"group {group}: log gave {enqueued}, applied at {first}"
        self.state.positions[group] = (last, epoch)
        self.advance()
        if local is None:
            local = self.commits.pass_()
        return asyncio.ensure_future(self.acknowledged(writer, last, epoch, local))

    async def acknowledged(self, writer: GroupWriter, last: int, epoch: int,
                           local: asyncio.Future) -> tuple[int, int]:
        """``(last, epoch)`` once the ack mode is met for the group's records
        up to ``last``."""
        replication = self.core.replication
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

    # --- packed runs of a primary ------------------------------------------------------------

    def written_group(self, packed: Any) -> int | None:
        """The one board group of a packed run, if this node writes it now."""
        groups = {group_of(name) for name in packed.board_names()}
        if len(groups) != 1:
            return None
        group = groups.pop()
        if group in self.read_gates.closed:
            return None  # readers settle it: the general way waits for them
        try:
            self.core.replication.writer(group)
        except EngineError:
            return None
        return group

    def takes(self, packed: Any) -> bool:
        """Whether the packed path applies a run itself (``Engine.takes_replicated``)."""
        return self.written_group(packed) is not None

    def _the_general_way(self, runs: list[Any], finished: asyncio.Future[None]) -> None:
        """Apply ``runs`` as submissions (each waits as the general way does)."""
        general = asyncio.gather(*(self.unpacked_soon(packed) for packed in runs))
        general.add_done_callback(lambda outcome: _answer_runs(
            runs, finished, asyncio.CancelledError() if outcome.cancelled()
            else outcome.exception() or (0, 0), positioned=False))

    def apply_group_runs(self, group: int, runs: list[Any], finished: asyncio.Future[None],
                         local: asyncio.Future[None]) -> None:
        """Apply a cluster node's packed runs of one group at the group's
        next positions, as :meth:`submit` does; ``finished`` is done once
        the ack mode is met, each run then holding its answers and
        ``position`` (the log's ``(seq, epoch)`` of its writes)."""
        if group in self.read_gates.closed:  # readers settle it: the general way waits
            self._the_general_way(runs, finished)
            return
        try:
            self.guard.check_writable()
            writer = self.core.replication.writer(group)
        except Unavailable:  # (a group move's cut-over began since: the general way waits)
            self._the_general_way(runs, finished)
            return
        except EngineError as exc:  # deposed, or read-only, since the runs came
            _answer_runs(runs, finished, exc)
            return
        config = self.core.config
        try:
            done = ingest_packed(self.state.boards, runs, self.core.clock(), writer.next_seq,
                                 config.dedupe_ttl, config.ts_tolerance)
        except Exception as exc:
            self.guard.fail(exc)  # a bug, as in Submits.submit_batch
            finished.set_exception(exc)
            raise
        self.commits.count(done)
        try:  # ``local``: this pass's commit, the local log's part
            if done.payloads:
                acknowledged = self.replicate(writer, done.payloads, done.boards, local)
            else:  # duplicates or refusals only: what they repeat may not be committed
                acknowledged = asyncio.ensure_future(self.acknowledged(
                    writer, writer.next_seq - 1, writer.epoch, local))
        except EngineError as exc:
            _answer_runs(runs, finished, exc)
            return
        acknowledged.add_done_callback(lambda outcome: _answer_runs(
            runs, finished, asyncio.CancelledError() if outcome.cancelled()
            else outcome.exception() or outcome.result()))

    # --- a follower ---------------------------------------------------------------------

    def held_in(self, group: int) -> list[Board]:
        """The boards of ``group`` held now (``BoardState.hold``: a store
        reading them in steps): a follower applies nothing to them until
        they are released (:meth:`released`), as a write on its primary
        would wait.  Snapshots hold nothing: they walk an index on the
        event loop, between the records applied to it."""
        state = self.state
        return [state.boards[name] for name in state.held
                if name in state.boards and group_of(name) == group]

    async def released(self, group: int) -> None:
        """Once no board of ``group`` is held (see :meth:`held_in`)."""
        while boards := self.held_in(group):
            for board in boards:
                await board.writable.wait()

    def apply_replicated(self, group: int, logged: list[tuple[int, int, bytes]]
                         ) -> asyncio.Future[None]:
        """Apply records a follower read from a group's log (``(seq, epoch,
        payload)``, in order, right after the last one it applied), as
        recovery does; done once the local log holds them by the fsync
        policy and listeners were told."""
        self.guard.check_writable()
        touched: set[str] = set()
        self.replayer.replay_records([(seq, payload) for seq, _, payload in logged], touched)
        self.replayer.flush()
        seq, epoch, _ = logged[-1]
        self.state.positions[group] = (seq, epoch)
        self.advance()
        runs: list[list] = []  # one local record per epoch's run
        for seq, epoch_of, payload in logged:
            if runs and runs[-1][3] == epoch_of:
                runs[-1][4].append(payload)
            else:
                runs.append([records.REPLICATED, group, seq, epoch_of, [payload]])
        return self.commits.commit_soon([records.encode(run) for run in runs], touched,
                                        len(logged))

    def written_by(self, group: int, epoch: int, after_seq: int) -> list[tuple[int, bytes]]:
        """The records of ``group`` the local log holds from ``epoch`` after
        position ``after_seq``: ``(seq, payload)``, in order (what a primary
        that crashed wrote and its group's log never took).  Reads the log
        from the start: call it in a worker thread."""
        found = []
        for batch in self.core.wal.iter_batches(1, settings.REPLAY_BATCH):
            for _, payload in batch:
                record = records.decode(payload)
                if (record[0] == records.REPLICATED and record[1] == group
                        and record[3] == epoch):
                    found.extend((seq, payload) for seq, payload
                                 in enumerate(record[4], record[2]) if seq > after_seq)
        return found

    async def load_group_snapshot(self, group: int, seq: int, epoch: int,
                                  sections: list[bytes]) -> None:
        """Replace ``group``'s boards with its snapshot at ``seq`` (a follower
        whose position the cluster's log no longer holds).  The local log
        keeps the snapshot too, so a restart recovers it.  The boards are
        built in a worker thread and swapped in at once
        (:mod:`rankd.engine.group_load`): the loop serves meanwhile."""
        self.guard.check_writable()
        built = await asyncio.to_thread(group_load.build, sections, self.state.clock)
        logged = await asyncio.to_thread(group_load.encoded, group, seq, epoch, sections)
        self.guard.check_writable()
        names = self.replayer.drop_group(group)
        names |= group_load.install(self.state, group, built)
        self.state.positions[group] = (seq, epoch)
        self.advance()
        self.commits.snapshot_wanted.set()  # and soon a local snapshot, for a short replay
        for run in group_load.commit_runs(logged):
            await self.commits.commit_soon(run, names)

    def local_positions_checked(self) -> None:
        """A cluster node compared its local state with the groups' logs at
        start (what they lack was set aside): snapshots drop segments again."""
        self.core.unshipped.unchecked = False

    def reset_group(self, group: int) -> asyncio.Future[None]:
        """Forget a group's boards (to replay its log anew from the start):
        after this node wrote records the group's log never took."""
        self.guard.check_writable()
        names = self.replayer.drop_group(group)
        self.core.unshipped.forget(group)
        return self.commits.commit_soon([records.encode([records.GROUP_RESET, group])], names)


def purged_by(logged: list[list]) -> list[str]:
    """The boards ``logged`` writes, but those it deletes as expired."""
    return [record[1] for record in logged if record[0] != records.EXPIRED]


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


def _sent_on(exc: ReadOnly) -> Unacknowledged:
    """The answer to a cluster write the local log failed to keep after it
    was sent to its group's log, which may still commit it."""
    return Unacknowledged(f"this node's local log failed ({exc.message}) after the write "
                          "was sent to the cluster's log, which may still commit it: "
                          "resubmit it with the same event id, to another node")
