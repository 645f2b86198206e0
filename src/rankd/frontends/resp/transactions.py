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
one whose writes go to the transaction (:mod:`.exec_step`), so
every command means inside ``EXEC`` what it means outside.  The
transaction's records are logged as one record (wholly there or wholly
absent after a crash) and ``EXEC`` is answered once they are durable.  On
a cluster node a transaction's keys must be of one board group
(``CROSSSLOT`` otherwise, nothing applied), which this node must write
(``TRYAGAIN`` naming the node that does, as for single writes).

Every command may be queued, as in Redis: a deadline set (``EXPIRE``...)
and a store's destination replaced go into the transaction like any
write; a blocking pop (``BZPOPMIN``...) does not block, it answers as its
non-blocking form (null when nothing is there), as Redis's do inside
``MULTI``.  A command's keys are those ``COMMAND`` gives and, for the
commands with ``numkeys`` (``ZUNIONSTORE``, ``ZMPOP``...), those it counts.

The loop is held for the step only, so the step's work is bounded: a
store (``ZUNIONSTORE``, ``ZINTERSTORE``, ``ZDIFFSTORE``) whose inputs no
earlier command of the transaction writes is computed *before* the step,
in steps, other clients served in between (as outside ``MULTI``), and
computed again in the step only if an input changed meanwhile; a store
whose inputs the transaction itself writes, and an aggregation it answers
(``ZUNION``...), are computed in the step,
:data:`~.exec_step.MAX_STEP_READ` entries read at most for one ``EXEC``;
the stores of one ``EXEC`` write :data:`~.exec_step.MAX_STEP_STORED`
members at most.  Past either, the command answers an error in
``EXEC``'s reply (the others apply).

A transaction's queue is bounded (:data:`MAX_QUEUED` commands,
:data:`MAX_QUEUED_BYTES` bytes): past it the command is refused and the
transaction is discarded at ``EXEC`` (``EXECABORT``).  Its reply is
bounded (:data:`MAX_EXEC_REPLY_BYTES`): reads past it answer an error.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from rankd.engine.errors import EngineError
from rankd.engine.transaction import CrossGroup, Transaction
from rankd.frontends.resp import aggregates, monitor
from rankd.frontends.resp.arguments import CommandError
from rankd.frontends.resp.context import Multi, error_text
from rankd.frontends.resp.exec_step import transaction_service
from rankd.frontends.resp.sorted_sets import (
    MAX_REPLY_BYTES,
    STEP_RESTARTS,
    Writes,
    board_name,
    is_key,
)

if TYPE_CHECKING:
    from rankd.frontends.resp.context import Command, Context

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
#: Where the ``numkeys`` of a command with keys it counts stands.
NUMKEYS = {"zunionstore": 2, "zinterstore": 2, "zdiffstore": 2, "zunion": 1, "zinter": 1,
           "zdiff": 1, "zintercard": 1, "zmpop": 1, "bzmpop": 2}
#: The stores computed before an EXEC's step when their inputs allow it.
PRECOMPUTED = frozenset({"zunionstore", "zinterstore", "zdiffstore"})

EXECABORT = "EXECABORT Transaction discarded because of previous errors."
CROSSSLOT = "CROSSSLOT Keys in request don't hash to the same slot"


# --- the state a connection keeps -------------------------------------------------------


def _state(conn: Context, name: str | None) -> tuple[int, int, bool] | int:
    """What changes when board ``name`` is written, deleted or made again:
    ``(board's serial, version, whether it is a key)``; with no board, how
    many boards were dropped so far (one made and dropped before EXEC
    leaves nothing else to see)."""
    engine = conn.service.engine
    board = None if name is None else engine.boards.get(name)
    if board is None:
        return engine.drops
    return board.serial, board.version, is_key(conn, name)


def _dirty(conn: Context) -> bool:
    """Whether a watched key changed since WATCH."""
    engine = conn.service.engine
    for name, before in (conn.watched or {}).items():
        now = _state(conn, name)
        if now == before:
            continue
        if type(now) is int:
            if type(before) is int:
                if engine.dropped_since(name, before):
                    return True  # made (a write touches it, as in Redis) and dropped again
                continue
            if not before[2]:
                continue  # an empty board (no key to Redis) deleted: nothing changed for Redis
        return True
    return False


def forget(conn: Context) -> None:
    """Leave MULTI and forget the watches (EXEC, DISCARD, RESET)."""
    if conn.multi is not None:
        conn.packs = conn.multi.packs
    conn.multi = None
    conn.watched = None


def rejected(conn: Context, words: list[bytes], text: str) -> str:
    """A command failed its checks (name, arity): inside MULTI, EXEC will
    abort.  A refused EXEC itself discards the transaction (and the
    watches) at once, its error saying so, as Redis's ``rejectCommand``."""
    if conn.multi is not None:
        conn.multi.failed = True
    if words[0].lower() != b"exec":
        return text
    forget(conn)
    return f"EXECABORT Transaction discarded because of: {text.removeprefix('ERR ')}"


def queue(conn: Context, command: Command, words: list[bytes], out: list[bytes],
          weight: int) -> bool:
    """Inside MULTI, queue ``command`` (admitted now, as Redis checks it
    when queued) and answer ``+QUEUED`` or its error into ``out``; False
    (nothing done) outside MULTI and for the commands that run at once."""
    multi = conn.multi
    if multi is None or command.name.split("|")[0] in CONTROL:
        return False
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
        out.append(conn.replies.error(error_text(exc)))
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


def multi(conn: Context, args: list[bytes]) -> bytes:
    """MULTI: queue the commands that follow, until EXEC or DISCARD."""
    if conn.multi is not None:
        raise CommandError("ERR MULTI calls can not be nested")
    conn.multi = Multi(conn.packs)
    conn.packs = False  # every command is queued as words (none goes the native way)
    return conn.replies.simple("OK")


def discard(conn: Context, args: list[bytes]) -> bytes:
    """DISCARD: forget the queued commands and the watches."""
    if conn.multi is None:
        raise CommandError("ERR DISCARD without MULTI")
    forget(conn)
    return conn.replies.simple("OK")


def watch(conn: Context, args: list[bytes]) -> bytes:
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


def unwatch(conn: Context, args: list[bytes]) -> bytes:
    conn.watched = None
    return conn.replies.simple("OK")


def exec_(conn: Context, args: list[bytes]) -> Any:
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


def _counted(words: list[bytes], at: int) -> list[bytes]:
    """The keys ``numkeys`` (``words[at]``) counts; as many as there are
    when it is wrong (the command then fails when it runs, writing nothing)."""
    try:
        count = int(words[at])
    except (IndexError, ValueError):
        return []
    return words[at + 1:at + 1 + max(0, count)]


def _keys(command: Command, words: list[bytes]) -> tuple[list[str], list[str]]:
    """The boards a command writes and those it reads (its keys, as COMMAND
    says where they are, and those its ``numkeys`` counts)."""
    named: list[bytes] = []
    if command.first_key:
        last = command.last_key if command.last_key >= 0 else len(words) + command.last_key
        named = words[command.first_key:last + 1]
    at = NUMKEYS.get(command.name)
    counted = _counted(words, at) if at is not None else []
    if "write" not in command.flags:
        return [], _names(named + counted)
    if not command.first_key:  # ZMPOP, BZMPOP: the keys counted are written
        return _names(counted), []
    return _names(named), _names(counted)  # (a store: its destination, its inputs)


def _names(keys: list[bytes]) -> list[str]:
    return [name for name in map(board_name, keys) if name is not None]


def _boards(conn: Context, queued: list[tuple[Command, list[bytes]]]
            ) -> tuple[set[str], set[str]]:
    """The boards a transaction writes, and those it reads."""
    writes: set[str] = set()
    reads: set[str] = set()
    for command, words in queued:
        written, read = _keys(command, words)
        if command.name in ("flushdb", "flushall"):
            writes.update(conn.service.engine.boards)
        writes.update(written)
        reads.update(read)
    return writes, reads


def _untouched(queued: list[tuple[Command, list[bytes]]]) -> list[list[bytes]]:
    """The stores no earlier command of the transaction writes an input of
    (they may be computed before its step)."""
    found: list[list[bytes]] = []
    written: set[str] = set()
    everything = False
    for command, words in queued:
        keys, read = _keys(command, words)
        if command.name in PRECOMPUTED and not everything and written.isdisjoint(read):
            found.append(words)
        written.update(keys)
        # (FLUSH* writes every board; RANKD.WINDOW changes what a store reads.)
        everything = everything or command.name in ("flushdb", "flushall", "rankd.window")
    return found


async def _ready(conn: Context, transaction: Transaction,
                 queued: list[tuple[Command, list[bytes]]]) -> dict[int, Any]:
    """Compute the stores that may be computed before the step (see the
    module docstring), then wait until the transaction may be applied; if
    one of their inputs changed meanwhile, again (twice at most, then the
    step computes it).  Their results, by ``id`` of the command's words."""
    writes, reads = _boards(conn, queued)
    stores = _untouched(queued)
    done: dict[int, Any] = {}
    for attempt in range(STEP_RESTARTS + 1):
        for words in stores:
            if id(words) not in done or not aggregates.current(conn, done[id(words)]):
                try:
                    done[id(words)] = await aggregates.precompute(conn, words)
                except (CommandError, EngineError):
                    done.pop(id(words), None)  # (the step answers its error)
                if conn.closing:
                    raise CommandError("ERR the connection is closing")
        try:
            await transaction.ready(writes, reads)
        except CrossGroup:
            raise CommandError(CROSSSLOT) from None
        if attempt == STEP_RESTARTS or all(aggregates.current(conn, outcome)
                                           for outcome in done.values()):
            return done
    raise AssertionError("the last attempt returns")


async def _run(conn: Context, queued: list[tuple[Command, list[bytes]]]) -> bytes:
    service = conn.service
    engine = service.engine
    transaction = engine.transaction()
    precomputed = await _ready(conn, transaction, queued)
    # From here to the commit, nothing is awaited: one step of the event loop.
    conn.service = transaction_service(service, transaction, precomputed)
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


def _one(conn: Context, command: Command, words: list[bytes]) -> bytes:
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
        return conn.replies.error(error_text(exc))
    stats[(command.name, "ok")] += 1
    return result


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
