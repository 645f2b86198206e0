"""MULTI, EXEC, DISCARD, WATCH, UNWATCH: Redis transactions, applied atomically.

Redis's semantics: after ``MULTI`` a connection's commands are checked
(name, arity, the caller's right to run them) and queued, each answered
``+QUEUED``; one that fails those checks is answered its error and makes
``EXEC`` answer ``-EXECABORT``, applying nothing.  ``EXEC`` runs the queue
and answers an array of its replies; a command that fails when it runs
answers its own error there and the others still apply (Redis rolls
nothing back).  ``WATCH``ed keys written by anyone (any front-end, any
client, deletion) between ``WATCH`` and ``EXEC`` make ``EXEC`` answer a
null array, applying nothing.  ``EXEC``, ``DISCARD`` and ``RESET`` forget
the watches.

rankd's guarantee on top: an ``EXEC``'s writes are one commit.  Its
commands run in one step of the event loop (no other client's command in
between), against a :class:`rankd.engine.transaction.Transaction`: the
handlers are the ordinary ones, with the connection's service swapped for
one whose writes go to the transaction (:class:`_TransactionEngine`), so
every command means inside ``EXEC`` what it means outside.  The
transaction's records are logged as one record (wholly there or wholly
absent after a crash) and ``EXEC`` is answered once they are durable.  On
a cluster node a transaction's keys must be of one board group
(``CROSSSLOT`` otherwise, nothing applied), which this node must write
(``TRYAGAIN`` naming the node that does, as for single writes).

A transaction's queue is bounded (:data:`MAX_QUEUED` commands,
:data:`MAX_QUEUED_BYTES` bytes): past it the command is refused and the
transaction is discarded at ``EXEC`` (``EXECABORT``).  Its reply is
bounded (:data:`MAX_EXEC_REPLY_BYTES`): reads past it answer an error.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rankd.engine.errors import EngineError
from rankd.engine.transaction import CrossGroup, Transaction
from rankd.frontends.resp import monitor
from rankd.frontends.resp.arguments import CommandError
from rankd.frontends.resp.sorted_sets import MAX_REPLY_BYTES, Writes, board_name, is_key

if TYPE_CHECKING:
    from rankd.engine.view import SortedView
    from rankd.frontends.resp.commands import Command
    from rankd.frontends.resp.connection import RespConnection

#: Commands one transaction may queue, and the bytes they may hold (the
#: connection's bound on requests queued: hardening 3's).
MAX_QUEUED = 10_000
MAX_QUEUED_BYTES = 4 << 20
#: Bytes one EXEC reply may hold: reads past it answer an error.
MAX_EXEC_REPLY_BYTES = MAX_REPLY_BYTES
#: Keys one connection may watch.
MAX_WATCHED = 10_000
#: What runs at once inside MULTI instead of being queued (as in Redis).
CONTROL = frozenset({"exec", "discard", "multi", "watch", "quit", "reset"})
#: Commands not made through the transaction yet (a deadline is its own
#: logged record, a store its own commit; a blocking pop would wait):
#: refused when queued, so EXEC never half-applies.
NOT_QUEUED = frozenset({"expire", "pexpire", "expireat", "pexpireat", "persist",
                        "zunionstore", "zinterstore", "zdiffstore", "zrangestore",
                        "bzpopmin", "bzpopmax", "bzmpop"})

EXECABORT = "EXECABORT Transaction discarded because of previous errors."
CROSSSLOT = "CROSSSLOT Keys in request don't hash to the same slot"


@dataclass(slots=True)
class Multi:
    """A connection's transaction being queued (between MULTI and EXEC)."""

    #: Whether the connection packed plain commands before MULTI (see ``multi``).
    packs: bool
    queued: list[tuple[Command, list[bytes]]] = field(default_factory=list)
    size: int = 0
    #: A command failed its checks (or the bounds were passed): EXECABORT.
    failed: bool = False


# --- the state a connection keeps -------------------------------------------------------


def _state(conn: RespConnection, name: str | None) -> tuple[int, int, bool] | None:
    """What changes when board ``name`` is written, deleted or made again:
    ``(board, version, whether it is a key)``, None if there is no board."""
    board = None if name is None else conn.service.engine.boards.get(name)
    if board is None:
        return None
    return id(board), board.version, is_key(conn, name)


def _dirty(conn: RespConnection) -> bool:
    """Whether a watched key changed since WATCH."""
    for name, before in (conn.watched or {}).items():
        now = _state(conn, name)
        if now == before:
            continue
        if now is None and (before is None or not before[2]):
            continue  # an empty board (no key to Redis) deleted: nothing changed for Redis
        return True
    return False


def forget(conn: RespConnection) -> None:
    """Leave MULTI and forget the watches (EXEC, DISCARD, RESET)."""
    if conn.multi is not None:
        conn.packs = conn.multi.packs
    conn.multi = None
    conn.watched = None


def rejected(conn: RespConnection, words: list[bytes], text: str) -> str:
    """A command failed its checks (name, arity): inside MULTI, EXEC will
    abort.  A refused EXEC itself discards the transaction (and the
    watches) at once, its error saying so, as Redis's ``rejectCommand``."""
    if conn.multi is not None:
        conn.multi.failed = True
    if words[0].lower() != b"exec":
        return text
    forget(conn)
    return f"EXECABORT Transaction discarded because of: {text.removeprefix('ERR ')}"


def queue(conn: RespConnection, command: Command, words: list[bytes], out: list[bytes],
          weight: int) -> bool:
    """Inside MULTI, queue ``command`` (admitted now, as Redis checks it
    when queued) and answer ``+QUEUED`` or its error into ``out``; False
    (nothing done) outside MULTI and for the commands that run at once."""
    multi = conn.multi
    if multi is None or command.name.split("|")[0] in CONTROL:
        return False
    if command.name in NOT_QUEUED:
        multi.failed = True
        conn.server.stats[(command.name, "error")] += 1
        out.append(conn.replies.error(
            f"ERR rankd cannot run {command.name.upper()} inside a transaction yet; the "
            "transaction is discarded (EXEC answers EXECABORT)"))
        return True
    try:
        conn._admit(command, words)
    except CommandError as exc:
        multi.failed = True
        conn.server.stats[(command.name, "error")] += 1
        out.append(conn.replies.error(exc.text))
        return True
    except EngineError as exc:
        multi.failed = True
        conn.server.stats[(command.name, exc.code)] += 1
        out.append(conn.replies.error(_error_text(exc)))
        return True
    if multi.failed:  # (EXEC aborts: nothing more is kept)
        out.append(conn.replies.simple("QUEUED"))
        return True
    if len(multi.queued) >= MAX_QUEUED or multi.size + weight > MAX_QUEUED_BYTES:
        multi.failed = True
        multi.queued.clear()
        multi.size = 0
        out.append(conn.replies.error(
            f"ERR rankd queues at most {MAX_QUEUED} commands and {MAX_QUEUED_BYTES} bytes "
            "in one transaction; it is discarded (EXEC answers EXECABORT)"))
        return True
    multi.queued.append((command, words))
    multi.size += weight
    out.append(conn.replies.simple("QUEUED"))
    return True


# --- the commands -------------------------------------------------------------------------


def multi(conn: RespConnection, args: list[bytes]) -> bytes:
    """MULTI: queue the commands that follow, until EXEC or DISCARD."""
    if conn.multi is not None:
        raise CommandError("ERR MULTI calls can not be nested")
    conn.multi = Multi(conn.packs)
    conn.packs = False  # every command is queued as words (none goes the native way)
    return conn.replies.simple("OK")


def discard(conn: RespConnection, args: list[bytes]) -> bytes:
    """DISCARD: forget the queued commands and the watches."""
    if conn.multi is None:
        raise CommandError("ERR DISCARD without MULTI")
    forget(conn)
    return conn.replies.simple("OK")


def watch(conn: RespConnection, args: list[bytes]) -> bytes:
    """WATCH key [key ...]: EXEC applies nothing if one of them changes."""
    if conn.multi is not None:
        raise CommandError("ERR WATCH inside MULTI is not allowed")
    watched = conn.watched if conn.watched is not None else {}
    for key in args[1:]:
        name = board_name(key)
        if name is not None and name not in watched:
            if len(watched) >= MAX_WATCHED:
                raise CommandError(f"ERR rankd watches at most {MAX_WATCHED} keys per "
                                   "connection")
            watched[name] = _state(conn, name)
    conn.watched = watched
    return conn.replies.simple("OK")


def unwatch(conn: RespConnection, args: list[bytes]) -> bytes:
    conn.watched = None
    return conn.replies.simple("OK")


def exec_(conn: RespConnection, args: list[bytes]) -> Any:
    """EXEC: run the queued commands as one atomic commit (see the module
    docstring)."""
    pending = conn.multi
    if pending is None:
        raise CommandError("ERR EXEC without MULTI")
    dirty = _dirty(conn)
    forget(conn)
    if pending.failed:
        raise CommandError(EXECABORT)
    if dirty:
        return conn.replies.null_array()
    return _run(conn, pending.queued)


def _keys(command: Command, words: list[bytes]) -> list[str]:
    """The boards a command names (its keys, as COMMAND says where they are)."""
    if not command.first_key:
        return []
    last = command.last_key if command.last_key >= 0 else len(words) + command.last_key
    return [name for name in map(board_name, words[command.first_key:last + 1])
            if name is not None]


def _boards(conn: RespConnection, queued: list[tuple[Command, list[bytes]]]
            ) -> tuple[set[str], set[str]]:
    """The boards a transaction writes, and those it reads."""
    writes: set[str] = set()
    reads: set[str] = set()
    for command, words in queued:
        keys = _keys(command, words)
        if command.name in ("flushdb", "flushall"):
            writes.update(conn.service.engine.boards)
        elif "write" in command.flags:
            writes.update(keys)
        else:
            reads.update(keys)
    return writes, reads


async def _run(conn: RespConnection, queued: list[tuple[Command, list[bytes]]]) -> bytes:
    service = conn.service
    engine = service.engine
    transaction = engine.transaction()
    writes, reads = _boards(conn, queued)
    try:
        await transaction.ready(writes, reads)
    except CrossGroup:
        raise CommandError(CROSSSLOT) from None
    # From here to the commit, nothing is awaited: one step of the event loop.
    conn.service = _transaction_service(service, transaction)
    engine.unsettled_reads = transaction.unsettled if engine.replication is not None else None
    replies = [conn.replies.array_header(len(queued))]
    size = 0
    try:
        for command, words in queued:
            if size > MAX_EXEC_REPLY_BYTES and "write" not in command.flags:
                reply = conn.replies.error(f"ERR rankd answers at most {MAX_EXEC_REPLY_BYTES} "
                                           "bytes in one EXEC reply")
            else:
                reply = _one(conn, command, words)
            size += len(reply)
            replies.append(reply)
        committed = transaction.commit()
    finally:
        conn.service = service
        engine.unsettled_reads = None
    if committed is not None:
        await asyncio.shield(committed)  # (an error: the whole EXEC's reply)
    for group in transaction.unsettled:  # what its reads showed is committed too
        await engine.settle(group)
    return b"".join(replies)


def _one(conn: RespConnection, command: Command, words: list[bytes]) -> bytes:
    """Run one queued command now, synchronously: its reply or its error
    (and shown to the monitors, as Redis shows what EXEC runs)."""
    if conn.server.monitors:
        monitor.feed(conn, command, words, None)
    stats = conn.server.stats
    try:
        result = command.handler(conn, words)
        if isinstance(result, Writes):
            result = result.answer(_finished(conn.service.submit_prepared(result.submissions)))
        elif not isinstance(result, bytes):
            result = _finished(result)
    except CommandError as exc:
        stats[(command.name, "error")] += 1
        return conn.replies.error(exc.text)
    except EngineError as exc:
        stats[(command.name, exc.code)] += 1
        return conn.replies.error(_error_text(exc))
    stats[(command.name, "ok")] += 1
    return result


def _error_text(exc: EngineError) -> str:
    from rankd.frontends.resp.connection import error_text  # (it imports this module)
    return error_text(exc)


def _finished(awaitable: Any) -> Any:
    """Run a handler's coroutine to its end now: inside a transaction it
    never waits (its writes go to the transaction, which applies them at
    once; a reply built in steps is built in one go)."""
    coroutine = awaitable.__await__() if not hasattr(awaitable, "send") else awaitable
    try:
        while True:
            if coroutine.send(None) is not None:  # a real wait: not inside a transaction
                coroutine.close()
                raise CommandError("ERR rankd cannot run this command inside a transaction")
    except StopIteration as stop:
        return stop.value


# --- writes into the transaction ------------------------------------------------------------


class _TransactionEngine:
    """The engine as the commands of an EXEC see it: reads as ever, writes
    applied by the transaction (its methods complete without waiting)."""

    def __init__(self, engine: Any, transaction: Transaction) -> None:
        self._engine = engine
        self._transaction = transaction

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    async def submit_many(self, submissions: Iterable[Any]) -> list[Any]:
        return self._transaction.submit(list(submissions))

    async def submit(self, submission: Any) -> dict[str, Any]:
        (answer,) = self._transaction.submit([submission])
        if isinstance(answer, EngineError):
            raise answer
        return answer

    async def put_board(self, name: str, config: object, *, discard: bool = False,
                        patch: bool = False) -> tuple[Any, bool]:
        return self._transaction.put_board(name, config)

    async def delete_board(self, name: str) -> None:
        self._transaction.drop_board(name)

    async def expire(self, name: str, deadline: int | None, condition: int = 0) -> bool:
        raise CommandError("ERR rankd cannot set a deadline inside a transaction yet")

    async def replace_board(self, name: str, config: object, entries: Any) -> int:
        raise CommandError("ERR rankd cannot store a result inside a transaction yet")

    def stage(self, name: str, config: object) -> Any:
        raise CommandError("ERR rankd cannot store a result inside a transaction yet")

    async def remove_members(self, name: str, choose: Callable[[SortedView], Iterable[str]],
                             *, window: str | None = None, period: str | None = None,
                             drop_when_empty: bool = False, persist_when_empty: bool = False
                             ) -> list[tuple[str, float]]:
        removed = self._transaction.remove_members(name, choose, window=window, period=period,
                                                   persist_when_empty=persist_when_empty)
        if drop_when_empty and removed and not any(
                len(index) for periods in self._engine.boards[name].periods.values()
                for index in periods.values()):
            self._transaction.drop_board(name)
        return removed


def _transaction_service(service: Any, transaction: Transaction) -> Any:
    """The connection's service for the commands of one EXEC: the same,
    over :class:`_TransactionEngine`."""
    inside = copy.copy(service)
    inside.engine = _TransactionEngine(service.engine, transaction)
    return inside
