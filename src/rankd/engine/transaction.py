"""Atomic transactions: many writes applied in one step, logged as one record.

A front-end that must apply several writes as one unit (RESP's ``EXEC``)
opens a :class:`Transaction` with ``Engine.transaction()``, awaits
:meth:`Transaction.ready` (the boards it will write may be written now; on
a cluster node, this node writes their one group), then, **without
awaiting anything**, calls its operations (:meth:`~Transaction.submit`,
:meth:`~Transaction.remove_members`, :meth:`~Transaction.put_board`,
:meth:`~Transaction.drop_board`, :meth:`~Transaction.expire`,
:meth:`~Transaction.replace_board`) and reads in between as it likes (they
see the transaction's writes so far), and ends with
:meth:`~Transaction.commit`, whose future is done once the whole
transaction is durable (by the fsync policy, or the cluster's ack mode).

No other client's write can come between the operations: they run in one
turn of the event loop.  Their records are logged as one unit: a
transaction of ``n > 1`` records takes the log positions
``first .. first + n - 1`` as ``n`` separate writes would (the indexes'
arrival order and the board versions are those positions), but the first
``n - 1`` hold placeholders (``records.TX_SLOT``) and the last one,
``records.TRANSACTION``, holds all ``n`` records.  One record is one
checksummed frame, so after a crash the transaction is wholly in the log
or wholly absent; recovery (and a cluster's followers, which read the same
records from the group's log) applies the ``n`` records at their positions
when it meets the last one.  On a cluster node the records are one run of
the group's log, sent in one append.

Operations follow the engine's own (``Engine.submit_many``,
``Engine.remove_members``...): a refused one raises (or answers) its
``EngineError`` and the others still apply, as Redis's ``EXEC`` does.  A
board whose deadline passed is deleted (its ``EXPIRED`` record, in the
transaction) before an operation writes it, as ``Engine``'s writes do.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from rankd.engine import expiry, records, zeros
from rankd.engine.config import BoardConfig, check_board_name
from rankd.engine.errors import EngineError, InvalidInput, NotFound, Unavailable
from rankd.engine.groups import group_of
from rankd.engine.ingest import SKIPLIST_FIRST, ingest
from rankd.engine.submission import Submission
from rankd.engine.view import SortedView

if TYPE_CHECKING:
    from rankd.engine.host import WriteHost
    from rankd.engine.replication import GroupWriter


class CrossGroup(EngineError):
    """A cluster transaction whose boards are of more than one group."""

    code = "cross_group"


class Transaction:
    """One atomic unit of writes (see the module docstring)."""

    def __init__(self, engine: WriteHost) -> None:
        self.engine = engine
        #: The encoded records applied so far, in log order.
        self.payloads: list[bytes] = []
        #: The boards they changed.
        self.boards: set[str] = set()
        #: The first position of the transaction's records (set by ``ready``).
        self.first = 0
        #: A cluster node's writer of the transaction's group (None: a single node).
        self.writer: GroupWriter | None = None
        self.group: int | None = None
        #: Groups whose uncommitted writes the reads of the transaction met
        #: (a cluster node under ``--ack log``): its answer waits for them.
        self.unsettled: set[int] = set()
        self._open = False

    # --- before the step ------------------------------------------------------------

    async def ready(self, writes: Iterable[str], reads: Iterable[str] = ()) -> None:
        """Wait until the boards named in ``writes`` may be written: no
        store holds them and, on a cluster node, this node writes their
        group.  ``CrossGroup`` if the boards named (``writes`` and
        ``reads``) are of more than one group on a cluster node;
        ``NotPrimary`` if another node writes the group.  Nothing is
        applied; the operations must follow without an ``await``."""
        engine = self.engine
        writes = set(writes)
        replication = engine.replication
        if replication is not None:
            groups = {group_of(name) for name in writes | set(reads)}
            if len(groups) > 1:
                raise CrossGroup("the keys of this transaction are of more than one board "
                                 "group")
            if writes:
                (group,) = groups
                refusal = (await replication.prepare({group})).get(group)
                if refusal is not None:
                    raise refusal
                await engine.read_gates.opened((group,))
                self.group = group
        for _ in range(100):
            held = [engine.boards[name] for name in writes
                    if name in engine.boards and not engine.boards[name].writable.is_set()]
            if not held:
                break
            for board in held:
                await board.writable.wait()
        else:
            raise Unavailable("the boards of this transaction stay held by stores; "
                              "try again")
        engine.check_writable()
        if self.group is not None:
            self.writer = replication.writer(self.group)
            self.first = self.writer.next_seq
        else:
            self.first = engine.wal.last_lsn + 1
        self._open = True

    # --- the step: operations -----------------------------------------------------------

    @property
    def _position(self) -> int:
        return self.first + len(self.payloads)

    def _writable(self, name: str) -> None:
        """Refuse a write this transaction cannot make atomically."""
        if not self._open:
            raise RuntimeError("Transaction.ready must come before its operations")
        if name in self.engine.held:
            raise Unavailable(f"board {name!r} is held by a store; try again")
        if self.engine.replication is not None and group_of(name) != self.group:
            raise CrossGroup(f"board {name!r} is of another group than this transaction's")

    def _log(self, record: list) -> None:
        """Apply a board change or removal at the next position."""
        self.engine.apply_record(self._position, record)
        self.payloads.append(records.encode(record))
        self.boards.add(record[1])

    def _purge(self, names: Iterable[object]) -> None:
        """Delete the boards of ``names`` whose deadline passed before a
        write to them (``BoardState.purge_now``), at the next positions."""
        purged = self.engine.purge_now(names, self._position)
        self.payloads += purged
        self.boards.update(records.decode(payload)[1] for payload in purged)

    def submit(self, submissions: list[Submission]) -> list[dict[str, Any] | EngineError]:
        """Apply submissions in order, one answer or error each (as
        ``Engine.submit_many``)."""
        engine = self.engine
        names = {s.board for s in submissions}
        for name in names:
            self._writable(name)
        self._purge(names)
        try:
            done = ingest(engine.boards, submissions, engine.clock(), self._position,
                          engine.config.dedupe_ttl, engine.config.ts_tolerance)
        except Exception as exc:
            engine.fail(exc)  # a bug: as in Submits.submit_batch
            raise
        engine.count(done)
        self.payloads += done.payloads
        self.boards |= done.boards
        return done.answers

    def put_board(self, name: str, config: object) -> tuple[BoardConfig, bool]:
        """Create a board (``(config, created)``); one that exists with this
        config is left as it is.  A change of an existing board's config is
        refused (it is ``Engine.put_board``'s, with its checks)."""
        check_board_name(name)
        parsed = BoardConfig.from_dict(config)
        self._writable(name)
        self._purge([name])
        board = self.engine.boards.get(name)
        if board is not None:
            if board.config == parsed:
                return parsed, False
            raise InvalidInput(f"board {name!r} exists with another config; a transaction "
                               "does not change board configs")
        self._log([records.BOARD_PUT, name, parsed.to_dict(), self.engine.now_ms()])
        return parsed, True

    def drop_board(self, name: str) -> None:
        """Delete a board (``NotFound`` if there is none)."""
        if name not in self.engine.boards:
            raise NotFound(f"no board named {name!r}")
        self._writable(name)
        self._log([records.BOARD_DROP, name, self.engine.now_ms()])

    def remove_members(self, name: str, choose: Callable[[SortedView], Iterable[str]], *,
                       window: str | None = None, period: str | None = None,
                       persist_when_empty: bool = False) -> list[tuple[str, float]]:
        """Remove what ``choose`` picks from a view of a window of the board
        (as ``Engine.remove_members``, ``persist_when_empty`` too); returns
        them with their scores."""
        engine = self.engine
        board, _, _, index = engine.resolve(name, window, period, reading=False)
        self._writable(name)
        view = SortedView(index, board.config.order == "asc")
        chosen = view.picked(choose)
        now_ms = engine.now_ms()
        for member in chosen:
            self._log([records.REMOVE, name, member, now_ms])
        if (persist_when_empty and chosen and board.expires_at is not None
                and not any(len(index) for periods in board.periods.values()
                            for index in periods.values())):
            self._log([records.EXPIRE, name, None, now_ms])
        return list(chosen.items())

    def expire(self, name: str, deadline: int | None, condition: int = 0) -> bool:
        """Set or clear board ``name``'s deadline, as ``Engine.expire``
        (``NotFound`` if it is not shown; False if nothing changed); a
        deadline not in the future deletes the board now."""
        engine = self.engine
        self._writable(name)
        self._purge([name])
        board = engine.live_board(name)
        if board is None:
            raise NotFound(f"no board named {name!r}")
        if not expiry.allowed(board.expires_at, deadline, condition):
            return False
        now_ms = engine.now_ms()
        self._log([records.EXPIRE, name, deadline, now_ms])
        if deadline is not None and deadline <= now_ms:
            self._log([records.EXPIRED, name, deadline, now_ms])
        return True

    def replace_board(self, name: str, config: object,
                      entries: Callable[[], Iterable[tuple[str, float]]]) -> int:
        """Make board ``name`` anew holding what ``entries()`` gives, in
        place of any board of that name (as ``Engine.replace_board``, whose
        bounds the caller keeps); how many members it holds."""
        check_board_name(name)
        parsed = BoardConfig.from_dict(config)
        self._writable(name)
        # (Read first: the destination may be one of the inputs.)
        submissions = store_submissions(name, parsed, entries())
        self._purge([name])
        now_ms = self.engine.now_ms()
        if name in self.engine.boards:
            self._log([records.BOARD_DROP, name, now_ms])
        self._log([records.BOARD_PUT, name, parsed.to_dict(), now_ms])
        before = len(self.payloads)
        self.submit(submissions)
        return len(self.payloads) - before

    # --- the end --------------------------------------------------------------------

    def commit(self) -> asyncio.Future | None:
        """Log the transaction's records as one unit (see the module
        docstring), in the same step as its operations; the future is done
        once it is durable (``ReadOnly``... if it cannot be).  None if it
        wrote nothing."""
        self._open = False
        payloads = self.payloads
        if not payloads:
            return None
        logged = payloads
        if len(payloads) > 1:
            # (The last record's board names the transaction, for the history.)
            board = records.decode(payloads[-1])[1]
            now_ms = self.engine.now_ms()
            slot = records.encode([records.TX_SLOT, board, now_ms])
            logged = [slot] * (len(payloads) - 1) + [records.encode(
                [records.TRANSACTION, board, self.first, payloads, now_ms])]
        if self.writer is not None:
            return self.engine.replicate(self.writer, logged, self.boards)
        return self.engine.commit_soon(logged, self.boards, len(payloads))


def store_submissions(name: str, config: BoardConfig,
                      entries: Iterable[tuple[str, float]]) -> list[Submission]:
    """The submissions that make a new board ``name`` hold ``entries``, a
    store command's result.  A result that Redis holds as a skiplist
    (``zeros.store_zeros`` kept its ``-0``) makes a RESP board a skiplist
    before its first write: added one by one to a board that is still a
    listpack, its first members would lose their ``-0`` again."""
    submissions = [Submission(board=name, member=member, score=score)
                   for member, score in entries]
    if submissions and config in zeros.REDIS_CONFIGS and (
            len(submissions) > zeros.LISTPACK_ENTRIES
            or any(len(s.member.encode()) > zeros.LISTPACK_VALUE for s in submissions)):
        submissions[0].condition |= SKIPLIST_FIRST
    return submissions
