"""Board changes: create, reconfigure, delete, remove members, replace,
set deadlines; and transactions and stores, which make them in steps.

Owns every write that is not a submission: each is checked here, applied
to the board state as a record (``BoardState.apply_record``) and committed
like submissions (the pass of :class:`rankd.engine.commits.Commits`, or a
cluster group's log through :class:`rankd.engine.replicated.
ReplicatedWrites`).  It is also the :class:`rankd.engine.host.WriteHost`
that :class:`~rankd.engine.transaction.Transaction` and
:class:`~rankd.engine.staging.Staging` write through.

May not touch: recovery, snapshots (it takes no hold of a board but those
a front-end asks for with :meth:`BoardChanges.hold_writes`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterable
from operator import attrgetter

from rankd.engine import expiry, records, staging
from rankd.engine.commits import Commits
from rankd.engine.config import BoardConfig, check_board_name
from rankd.engine.core import Core
from rankd.engine.errors import Conflict, InvalidInput
from rankd.engine.failure import StorageGuard
from rankd.engine.groups import group_of
from rankd.engine.ingest import check_member, ingest
from rankd.engine.queries import Queries
from rankd.engine.replicated import ReplicatedWrites, purged_by
from rankd.engine.transaction import Transaction, store_submissions
from rankd.engine.view import SortedView

log = logging.getLogger("rankd.engine.engine")


class BoardChanges:
    """Writes other than submissions (module docstring)."""

    def __init__(self, core: Core, guard: StorageGuard, commits: Commits,
                 cluster: ReplicatedWrites, queries: Queries) -> None:
        self.core = core
        self.state = state = core.state
        self.guard = guard
        self.commits = commits
        self.cluster = cluster
        self.queries = queries
        # What a transaction and a store use (rankd.engine.host.WriteHost).
        self.held = state.held
        self.staged = state.staged
        self.staging_turns = state.staging_turns
        self.read_gates = cluster.read_gates
        self.config = core.config
        self.clock = core.clock
        self.now_ms = state.now_ms
        self.apply_record = state.apply_record
        self.purge_now = state.purge_now
        self.live_board = state.live_board
        self.check_writable = guard.check_writable
        self.fail = guard.fail
        self.count = commits.count
        self.commit_soon = commits.commit_soon
        self.replicate = cluster.replicate
        self.writer_of = cluster.writer_of
        self.route = cluster.route
        self.resolve = queries.resolve

    # (The current ones, read by C-level getters.)
    boards = property(attrgetter("state.boards"), doc="Every board, by name.")
    wal = property(attrgetter("core.wal"), doc="The current write-ahead log.")
    replication = property(attrgetter("core.replication"), doc="The cluster seam, or None.")

    # --- writing records ------------------------------------------------------------

    async def write(self, logged: list[list]) -> None:
        """Apply and commit non-submission records (board changes, removals)."""
        self.guard.check_writable()
        if self.core.replication is not None:
            await self.cluster.write(logged)
            return
        # Shielded: the commit is shared, and one cancelled waiter must not cancel it.
        await asyncio.shield(self.write_soon(logged))

    def write_soon(self, logged: list[list]) -> asyncio.Future[None]:
        """:meth:`write` on a single node, applied now: the future of its
        commit (see ``Commits.commit_soon``)."""
        next_lsn = self.core.wal.last_lsn + 1
        purged = self.state.purge_now(purged_by(logged), next_lsn)
        for position, record in enumerate(logged, next_lsn + len(purged)):
            self.state.apply_record(position, record)
        return self.commits.commit_soon([*purged, *(records.encode(record) for record in logged)],
                                        {record[1] for record in logged})

    # --- boards ------------------------------------------------------------------------

    async def put_board(self, name: str, config: object, *, discard: bool = False,
                        patch: bool = False) -> tuple[BoardConfig, bool]:
        """Create or change a board: ``(config, created)``.

        With ``patch`` the fields given change and the others stay.  A change
        that would lose data (a window dropped with its members, closed
        periods beyond a lower ``retain``, the policy of a board with members)
        is refused with ``Conflict`` naming what, unless ``discard``.
        """
        check_board_name(name)
        board = self.state.live_board(name)
        given, deadline = expiry.deadline_of(config)
        if given and deadline is not None and deadline <= self.now_ms():
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
        now_ms = self.now_ms()
        deadline_record = [records.EXPIRE, name, deadline, now_ms]
        if board is not None:
            if board.config == parsed:
                if board.expires_at != deadline:
                    await board.writable.wait()
                    await self.write([deadline_record])
                return parsed, False
            if ((parsed.order, parsed.tie_break) != (board.config.order, board.config.tie_break)
                    and any(len(i) for p in board.periods.values() for i in p.values())):
                raise Conflict("order and tie_break cannot change on a board with members; "
                               "delete and recreate it")
            losses = board.losses(parsed, self.core.clock())
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
        await self.write(logged)
        return parsed, board is None

    async def delete_board(self, name: str) -> None:
        """Delete a board and all its windows."""
        board = self.queries.board(name, reading=False)
        await board.writable.wait()
        await self.write([[records.BOARD_DROP, name, self.now_ms()]])

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
        state = self.state
        board = state.boards.get(name)
        if board is not None:
            await board.writable.wait()
        writer = None
        if self.core.replication is not None:
            await self.cluster.route(name)
            writer = await self.cluster.writer_of(group_of(name))
            first = writer.next_seq
        else:
            self.guard.check_writable()
            first = self.core.wal.last_lsn + 1
        # Nothing is awaited from here until every record is applied.
        submissions = store_submissions(name, parsed, entries())
        now_ms = self.now_ms()
        logged: list[list] = ([[records.BOARD_DROP, name, now_ms]]
                              if name in state.boards else [])
        logged.append([records.BOARD_PUT, name, parsed.to_dict(), now_ms])
        for position, record in enumerate(logged, first):
            state.apply_record(position, record)
        config_ = self.core.config
        try:
            done = ingest(state.boards, submissions, self.core.clock(), first + len(logged),
                          config_.dedupe_ttl, config_.ts_tolerance)
        except Exception as exc:
            self.guard.fail(exc)  # a bug, as in Submits.submit_batch
            raise
        self.commits.count(done)
        payloads = [records.encode(record) for record in logged] + done.payloads
        if writer is not None:
            await self.cluster.replicate(writer, payloads, {name})
        else:
            await self.commits.commit(payloads, {name})
        return len(done.payloads)

    async def expire(self, name: str, deadline: int | None, condition: int = 0) -> bool:
        """Set board ``name``'s deadline (None: clear it), as Redis's
        ``PEXPIREAT`` and ``PERSIST`` do: ``condition`` holds
        ``rankd.engine.expiry.IF_*`` bits (``NX``, ``XX``, ``GT``, ``LT``).
        A deadline not in the future deletes the board now.  False when
        nothing changed (no such board, the condition not met, or
        ``PERSIST`` of a board without a deadline)."""
        board = self.queries.board(name, reading=False)
        await board.writable.wait()
        await self.cluster.route(name)
        board = self.state.live_board(name)  # it may be gone meanwhile
        if board is None or not expiry.allowed(board.expires_at, deadline, condition):
            return False
        now_ms = self.now_ms()
        if deadline is None:
            await self.write([[records.EXPIRE, name, None, now_ms]])
        elif deadline <= now_ms:
            await self.write([[records.EXPIRE, name, deadline, now_ms],
                              [records.EXPIRED, name, deadline, now_ms]])
        else:
            await self.write([[records.EXPIRE, name, deadline, now_ms]])
        return True

    # --- members ------------------------------------------------------------------------

    async def remove_member(self, name: str, member: str) -> bool:
        """Remove a member from every window and period; ``False`` if absent."""
        board = self.queries.board(name, reading=False)
        check_member(member)
        present = member in board.labels or any(
            member in index for periods in board.periods.values() for index in periods.values())
        if not present:
            return False
        await board.writable.wait()
        await self.write([[records.REMOVE, name, member, self.now_ms()]])
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
        board = self.queries.board(name, reading=False)
        await board.writable.wait()
        await self.cluster.route(name)
        chosen, logged = self._removal(name, choose, window, period, drop_when_empty,
                                       persist_when_empty)
        if logged:
            await self.write(logged)
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
        or while a store holds the board; :meth:`remove_members` then.

        What a pipeline's pops use: many of them, each seeing the ones
        before, are applied in one turn of the loop and share its commit.
        """
        if not self.removes_now(name):
            return None
        self.queries.board(name, reading=False)  # (NotFound if it is past its deadline)
        self.guard.check_writable()
        chosen, logged = self._removal(name, choose, window, period, drop_when_empty,
                                       persist_when_empty)
        return chosen, self.write_soon(logged) if logged else None

    def removes_now(self, name: str) -> bool:
        """Whether :meth:`remove_members_now` would apply a removal from
        board ``name`` now (rather than answer None)."""
        board = self.state.boards.get(name)
        return (self.core.replication is None and board is not None
                and board.writable.is_set())

    def _removal(self, name: str, choose: Callable[[SortedView], Iterable[str]],
                 window: str | None, period: str | None, drop_when_empty: bool,
                 persist_when_empty: bool) -> tuple[list[tuple[str, float]], list[list]]:
        """What :meth:`remove_members` removes (member, score) and the
        records that do it, picked now; nothing applied yet."""
        board = self.queries.board(name, reading=False)  # it may be gone meanwhile
        _, _, _, index = self.queries.resolve(name, window, period, reading=False)
        view = SortedView(index, board.config.order == "asc")
        chosen = view.picked(choose)
        if not chosen:
            return [], []
        now_ms = self.now_ms()
        logged: list[list] = [[records.REMOVE, name, member, now_ms] for member in chosen]
        if (drop_when_empty or (persist_when_empty and board.expires_at is not None)) and all(
                len(index) == sum(1 for member in chosen if member in index)
                for periods in board.periods.values() for index in periods.values()):
            logged.append([records.BOARD_DROP, name, now_ms] if drop_when_empty
                          else [records.EXPIRE, name, None, now_ms])
        return list(chosen.items()), logged

    # --- in steps -------------------------------------------------------------------------

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
        block runs (a store reading its inputs in steps; readers go on);
        gives a function that releases them early (idempotent)."""
        state = self.state
        boards = []
        for name in dict.fromkeys(names):
            board = state.boards.get(name)
            if board is not None:
                await board.writable.wait()
        for name in dict.fromkeys(names):  # (no await from here: each held as it is)
            board = state.boards.get(name)
            if board is not None:
                state.hold(board)
                boards.append(board)

        def release() -> None:
            while boards:
                state.release(boards.pop())
        try:
            yield release
        finally:
            release()
