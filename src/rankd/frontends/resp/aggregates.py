"""Aggregations and store commands: ``ZUNION``, ``ZINTER``, ``ZDIFF``,
``ZINTERCARD``, ``ZUNIONSTORE``, ``ZINTERSTORE``, ``ZDIFFSTORE`` and
``ZRANGESTORE``, with Redis's semantics.

Arguments are read as Redis's ``zunionInterDiffGenericCommand`` reads
them, and the result is computed as it computes it: the inputs in order of
size (a stable sort, as glibc's), each score times its key's weight (a NaN
product counts as 0), ``AGGREGATE SUM`` turning ``inf + -inf`` into 0 as
Redis does; ``ZINTER`` walks its smallest input and looks its members up
in the others, ``ZDIFF`` walks its first.  A missing key (or a name no
board can have) is an empty set.

The inputs are read :data:`STEP_ENTRIES` entries at a time, other clients
served in between; if an input is written meanwhile the work starts again
(twice at most, then it is done in one go), so a result is of one state of
its inputs, as in Redis.  Work is bounded (:data:`MAX_AGGREGATE_READ`
entries read or looked up) and charged by entries, as reads are.

A store command's destination is made anew as a RESP board holding the
result, at most :data:`MAX_STORE_ENTRIES` members: built off to the side
:data:`STEP_ENTRIES` members at a time and swapped in at once in place of
the board it replaces and all it held (``Service.stage_board``, see
``rankd.engine.staging``).  Right before the swap the inputs are checked:
if one changed since the result was computed, the store starts again (at
most :data:`STEP_RESTARTS` times, the last with the inputs' writes held),
so what is stored is what the inputs held when it was swapped in.  An
empty result leaves no key, as in Redis (the destination, if a board, is
left empty: an empty RESP-made board is no key).

Inside ``EXEC`` (:mod:`.transactions`) a store is part of the EXEC's one
commit instead (``Service.replace_board`` in the transaction): it may come
computed already (:func:`precompute`, before the EXEC's step); what the
step computes or stores itself is counted against the EXEC's bounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import math
from collections.abc import Awaitable, Callable, Generator, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rankd.engine.errors import Unsettled
from rankd.engine.zeros import store_zeros
from rankd.frontends.resp import exec_step
from rankd.frontends.resp.arguments import SYNTAX, CommandError, integer, score
from rankd.frontends.resp.sorted_sets import (
    _REDIS_CONFIGS,
    MAX_REPLY_BYTES,
    REDIS_BOARD_DICT,
    STEP_ENTRIES,
    STEP_RESTARTS,
    Reply,
    _charge,
    _check_size,
    _entries,
    _version,
    _view,
    _writable_name,
    board_name,
    is_key,
    parse_range,
    range_plan,
    work_cost,
)
from rankd.security import ANONYMOUS_ALL

if TYPE_CHECKING:
    from rankd.frontends.resp.context import Context

#: Entries one aggregation may read from its inputs or look up in them
#: (a union reads every input; an intersection or a difference walks one
#: and looks its members up in the others).
MAX_AGGREGATE_READ = 250_000
#: Members a store command may write (built in steps: see the module
#: docstring); as many as an aggregation may read.
MAX_STORE_ENTRIES = MAX_AGGREGATE_READ

#: A result: member -> score (or, for ZINTERCARD, a count).
Result = dict[str, float]
#: Work done in steps: yields between them, returns its result.
Work = Generator[None, None, Any]


@dataclass(slots=True)
class Aggregation:
    """What a ZUNION/ZINTER/ZDIFF (or its STORE, or ZINTERCARD) asks for."""

    op: str
    keys: list[bytes]
    weights: list[float]
    aggregate: Callable[[float, float], float]
    withscores: bool = False
    limit: int = 0


def _sum(total: float, value: float) -> float:
    total += value
    return 0.0 if math.isnan(total) else total  # inf + -inf: 0, as Redis


def _min(current: float, value: float) -> float:
    return value if value < current else current


def _max(current: float, value: float) -> float:
    return value if value > current else current


_AGGREGATES = {b"sum": _sum, b"min": _min, b"max": _max}


def parse(args: list[bytes], at: int, op: str, *, store: bool = False,
          card: bool = False) -> Aggregation:
    """Read ``numkeys key [key ...]`` from ``args[at]`` on and the options
    after them, in Redis's order and with its errors."""
    count = integer(args[at])
    if count < 1:
        raise CommandError(f"ERR at least 1 input key is needed for "
                           f"'{args[0].lower().decode(errors='replace')}' command")
    if count > len(args) - at - 1:
        raise CommandError(SYNTAX)
    keys = args[at + 1:at + 1 + count]
    found = Aggregation(op, keys, [1.0] * count, _sum)
    position = at + 1 + count
    while position < len(args):
        option = args[position].lower()
        left = len(args) - position
        if op != "diff" and not card and left >= count + 1 and option == b"weights":
            for i in range(count):
                try:
                    found.weights[i] = score(args[position + 1 + i])
                except CommandError:
                    raise CommandError("ERR weight value is not a float") from None
            position += count + 1
        elif op != "diff" and not card and left >= 2 and option == b"aggregate":
            aggregate = _AGGREGATES.get(args[position + 1].lower())
            if aggregate is None:
                raise CommandError(SYNTAX)
            found.aggregate = aggregate
            position += 2
        elif not store and not card and option == b"withscores":
            found.withscores = True
            position += 1
        elif card and left >= 2 and option == b"limit":
            found.limit = integer(args[position + 1], "ERR LIMIT can't be negative")
            if found.limit < 0:
                raise CommandError("ERR LIMIT can't be negative")
            position += 2
        else:
            raise CommandError(SYNTAX)
    return found


def _views(conn: Context, keys: list[bytes]) -> list[Any]:
    return [_view(conn, key) for key in keys]


def _size(view: Any) -> int:
    return 0 if view is None else len(view)


def _work(views: list[Any], op: str) -> int:
    """Entries an aggregation reads or looks up (what it is charged)."""
    if op == "union":
        return sum(map(_size, views))
    walked = _size(views[0]) if op == "diff" else min(map(_size, views))
    return walked * len(views)


def _chunks(view: Any, size: int) -> Iterable[list]:
    for first in range(0, len(view), size):
        yield view.by_position(first, min(size, len(view) - first))


def compute(views: list[Any], found: Aggregation) -> Work:
    """The result, a step at a time (see :data:`Work`): a member -> score
    dict, or ZINTERCARD's count."""
    chunk = max(1, STEP_ENTRIES // len(views))  # entries read and looked up per step
    weights, aggregate = found.weights, found.aggregate
    result: Result = {}
    if found.op == "union":
        for i in sorted(range(len(views)), key=lambda i: _size(views[i])):
            if not _size(views[i]):
                continue
            weight = weights[i]
            for entries in _chunks(views[i], STEP_ENTRIES):
                for _, member, value in entries:
                    value *= weight
                    if math.isnan(value):
                        value = 0.0
                    known = result.get(member)
                    result[member] = value if known is None else aggregate(known, value)
                yield
        return result
    if found.op == "diff":
        first, others = views[0], [v for v in views[1:] if _size(v)]
        if not _size(first):
            return result
        for entries in _chunks(first, chunk):
            for _, member, value in entries:
                if all(other.score(member) is None for other in others):
                    result[member] = value
            yield
        return result
    order = sorted(range(len(views)), key=lambda i: _size(views[i]))
    if not _size(views[order[0]]):
        return 0 if found.op == "card" else result
    smallest, weight = views[order[0]], weights[order[0]]
    others = [(views[i], weights[i]) for i in order[1:]]
    cardinality = 0
    for entries in _chunks(smallest, chunk):
        for _, member, value in entries:
            total = weight * value
            if math.isnan(total):
                total = 0.0
            for other, other_weight in others:
                found_score = other.score(member)
                if found_score is None:
                    break
                total = aggregate(total, found_score * other_weight)
            else:
                if found.op == "card":
                    cardinality += 1
                    if found.limit and cardinality >= found.limit:
                        return cardinality
                else:
                    result[member] = total
        yield
    return cardinality if found.op == "card" else result


def _finish(work: Work) -> Any:
    """Run ``work`` to its end, in one go."""
    while True:
        try:
            next(work)
        except StopIteration as done:
            return done.value


class _Closed(Exception):
    """The connection closed while its work was under way."""


def _versions(conn: Context, names: list[str | None]) -> list[Any]:
    return [_version(conn, name) for name in names]


async def _in_steps(conn: Context, names: list[str | None],
                    make: Callable[[], Work]) -> tuple[Any, list[Any]]:
    """``make()``'s work done a step at a time, other clients served in
    between, started again if one of the boards ``names`` changed (twice
    at most, then done in one go); its result and the boards' versions it
    is of."""
    for attempt in range(STEP_RESTARTS + 1):
        versions = _versions(conn, names)
        try:
            work = make()
            if attempt == STEP_RESTARTS:
                return _finish(work), versions
            while True:
                try:
                    next(work)
                except StopIteration as done:
                    return done.value, versions
                await asyncio.sleep(0)  # other clients' turn
                if conn.closing:
                    raise _Closed
                if _versions(conn, names) != versions:
                    break  # written meanwhile: start again
        except Unsettled as exc:  # writes not committed yet: once they are, again
            if attempt == STEP_RESTARTS:
                raise
            await conn.service.engine.settle(exc.group)
    raise AssertionError("the last attempt runs to the end")


def _names(keys: list[bytes]) -> list[str | None]:
    return list(dict.fromkeys(board_name(key) for key in keys))


def _charge_reads(conn: Context, entries: int) -> None:
    """A store's reads, charged as reads are (which takes the read scope:
    the command itself is admitted as a write)."""
    conn.gate.admit(conn.principal or ANONYMOUS_ALL, "top", conn.address, work_cost(entries))


def _prepare(conn: Context, found: Aggregation, *, store: bool,
             charge: bool = True) -> Callable[[], Work]:
    """Check an aggregation's size and charge it (unless not ``charge``:
    done again); the work to do."""
    work = _work(_views(conn, found.keys), found.op)
    if work > MAX_AGGREGATE_READ:
        raise CommandError(f"ERR rankd reads at most {MAX_AGGREGATE_READ} entries in one "
                           "aggregation (its inputs, and the members looked up in them)")
    if charge:
        (_charge_reads if store else _charge)(conn, work)
    return lambda: compute(_views(conn, found.keys), found)


def _run(conn: Context, found: Aggregation, *, store: bool, charge: bool = True
         ) -> Any:
    """``(result, versions)`` (the versions of the inputs it is of) at
    once if the aggregation's work is small (or inside EXEC, whose step
    allows it so much work), else a coroutine of them."""
    make = _prepare(conn, found, store=store, charge=charge)
    names = _names(found.keys)
    work = _work(_views(conn, found.keys), found.op)
    inside = exec_step.running(conn)
    if inside is not None:
        inside.spend_read(work)
    if inside is not None or work <= STEP_ENTRIES:
        return _finish(make()), _versions(conn, names)
    return _in_steps(conn, names, make)


def _sorted(result: Result) -> list[tuple[int, str, float]]:
    return [(0, member, value) for member, value in
            sorted(result.items(), key=lambda item: (item[1], item[0]))]


async def _reply_in_steps(conn: Context, result: Result, withscores: bool) -> bytes:
    """A large result's reply: sorted a chunk at a time, merged and encoded
    a step at a time, other clients served in between."""
    items = list(result.items())
    runs = []
    for first in range(0, len(items), STEP_ENTRIES):
        runs.append(sorted(items[first:first + STEP_ENTRIES],
                           key=lambda item: (item[1], item[0])))
        await asyncio.sleep(0)
    merged = heapq.merge(*runs, key=lambda item: (item[1], item[0]))
    replies = conn.replies
    parts = [replies.array_header(2 * len(items) if withscores and replies.version == 2
                                  else len(items))]
    size = len(parts[0])
    done = 0
    while done < len(items):
        count = min(STEP_ENTRIES, len(items) - done)
        entries = [(0, member, value) for member, value in
                   (next(merged) for _ in range(count))]
        data = _entries(conn, entries, withscores, nested=True)
        part = data[data.index(b"\n") + 1:]  # without its own array header
        size += len(part)
        if size > MAX_REPLY_BYTES:
            raise CommandError(f"ERR rankd answers at most {MAX_REPLY_BYTES} bytes in one "
                               "reply; ask for a smaller range")
        parts.append(part)
        done += count
        await asyncio.sleep(0)
        if conn.closing:
            return b""
    return b"".join(parts)


def _answer(conn: Context, result: Result, withscores: bool) -> Reply:
    _check_size(len(result))
    if len(result) <= STEP_ENTRIES:
        return _entries(conn, _sorted(result), withscores, nested=True)
    return _reply_in_steps(conn, result, withscores)


def _aggregate(conn: Context, args: list[bytes], op: str) -> Reply:
    """ZUNION, ZINTER, ZDIFF: numkeys key [key ...] [options]."""
    found = parse(args, 1, op)
    outcome = _run(conn, found, store=False)
    if isinstance(outcome, tuple):
        return _answer(conn, outcome[0], found.withscores)

    async def later() -> bytes:
        try:
            result, _ = await outcome
        except _Closed:
            return b""
        reply = _answer(conn, result, found.withscores)
        return reply if isinstance(reply, bytes) else await reply
    return later()


def zunion(conn: Context, args: list[bytes]) -> Reply:
    """ZUNION numkeys key [key ...] [WEIGHTS w ...] [AGGREGATE SUM|MIN|MAX] [WITHSCORES]"""
    return _aggregate(conn, args, "union")


def zinter(conn: Context, args: list[bytes]) -> Reply:
    """ZINTER numkeys key [key ...] [WEIGHTS w ...] [AGGREGATE SUM|MIN|MAX] [WITHSCORES]"""
    return _aggregate(conn, args, "inter")


def zdiff(conn: Context, args: list[bytes]) -> Reply:
    """ZDIFF numkeys key [key ...] [WITHSCORES]"""
    return _aggregate(conn, args, "diff")


def zintercard(conn: Context, args: list[bytes]) -> Reply:
    """ZINTERCARD numkeys key [key ...] [LIMIT limit]"""
    found = parse(args, 1, "inter", card=True)
    found.op = "card"
    outcome = _run(conn, found, store=False)
    if isinstance(outcome, tuple):
        return conn.replies.integer(outcome[0])

    async def later() -> bytes:
        try:
            result, _ = await outcome
        except _Closed:
            return b""
        return conn.replies.integer(result)
    return later()


# --- stores --------------------------------------------------------------------------


def _check_stored(count: int) -> None:
    if count > MAX_STORE_ENTRIES:
        raise CommandError(f"ERR rankd stores at most {MAX_STORE_ENTRIES} members in one "
                           "command; store fewer")


#: A store's work, one attempt: its result, and whether that is still what
#: its inputs hold (checked in the step that writes it).
Attempt = Callable[[bool], Awaitable[tuple[Result, Callable[[], bool]]]]


async def _store(conn: Context, args: list[bytes], inputs: list[str | None],
                 attempt: Attempt, range_by: str | None = None) -> bytes:
    """Make board ``args[1]`` anew holding what ``attempt`` computes from
    boards ``inputs``, built in steps (see the module docstring); started
    again if an input changed before it is swapped in, the last time with
    the inputs' writes held.  ``range_by``: ZRANGESTORE's (its zeros, see
    ``zeros.store_zeros``)."""
    try:
        name = board_name(args[1])
        if name is None:  # no board can be named so: nothing to store, or refused
            result = (await attempt(True))[0]
            _check_stored(len(result))
            if result:
                _writable_name(args[1])
            return conn.replies.integer(0)
        # On a cluster node that does not write it: TRYAGAIN, as writes.
        await conn.service.route_write(name)
        staging = conn.service.stage_board(name, REDIS_BOARD_DICT)
        try:
            await staging.begin()  # (before any hold: a store waiting its turn holds none)
            for tries in range(STEP_RESTARTS + 1):
                stored = await _store_once(conn, args, inputs, attempt, staging, tries,
                                           range_by)
                if stored is not None:
                    return stored
                staging.reset()
        finally:
            staging.close()
    except _Closed:
        return b""
    raise AssertionError("the last attempt holds its inputs: they cannot change")


async def _store_once(conn: Context, args: list[bytes], inputs: list[str | None],
                      attempt: Attempt, staging: Any, tries: int, range_by: str | None
                      ) -> bytes | None:
    """One attempt of :func:`_store`: its reply, or None if an input
    changed before the result was swapped in."""
    name = staging.name
    holding = (conn.service.hold_writes([i for i in inputs if i is not None])
               if tries == STEP_RESTARTS else contextlib.nullcontext(None))
    async with holding as release:
        result, current = await attempt(tries == 0)
        _check_stored(len(result))
        store_zeros(result, range_by)
        if tries == 0:
            _charge(conn, len(result), "submit")
        if not result and not is_key(conn, name):
            return conn.replies.integer(0)  # no key before, none after
        admin = _admit_maker(conn, name)
        while result:
            if staging.parts:
                await asyncio.sleep(0)  # other clients' turn
                if conn.closing:
                    raise _Closed
            # Taken from the result as they are added: it is never copied
            # whole, nor freed in one go.
            chunk = [result.popitem() for _ in range(min(STEP_ENTRIES, len(result)))]
            if any(math.isinf(value) for _, value in chunk):
                raise CommandError("ERR rankd keeps finite scores only")  # nothing shown
            staging.add(chunk)
        stored = await staging.commit(current, release)
    if stored is None:
        return None
    if admin:
        _made(conn, name, args)
    return conn.replies.integer(stored)


async def _store_in_exec(conn: Context, args: list[bytes], result: Result,
                        current: Callable[[], Result], range_by: str | None = None) -> bytes:
    """Inside EXEC: make board ``args[1]`` anew holding ``result`` (as
    ``current()`` gives it when applied: it computes it again if its inputs
    changed), in the EXEC's one commit."""
    _check_stored(len(result))
    if any(math.isinf(value) for value in result.values()):
        raise CommandError("ERR rankd keeps finite scores only")
    inside = exec_step.running(conn)
    inside.spend_stored(len(result))
    name = board_name(args[1])
    if name is not None:  # on a cluster node that does not write it: TRYAGAIN, as writes
        await conn.service.route_write(name)
    if not result and (name is None or not is_key(conn, name)):
        return conn.replies.integer(0)  # no key before, none after
    name = _writable_name(args[1])
    admin = _admit_maker(conn, name)
    stored = await conn.service.replace_board(
        name, REDIS_BOARD_DICT, lambda: list(store_zeros(current(), range_by).items()))
    if admin:
        _made(conn, name, args)
    return conn.replies.integer(stored)


def _admit_maker(conn: Context, name: str) -> bool:
    """Whether storing into ``name`` makes a board, or replaces one REST made
    (its windows, its config): admitted then with the scope making boards
    takes (rewriting a RESP-made one is a write)."""
    admin = conn.service.board_config(name) not in _REDIS_CONFIGS
    if admin:
        conn.gate.admit(conn.principal or ANONYMOUS_ALL, "put_board", conn.address)
    return admin


def _made(conn: Context, name: str, args: list[bytes]) -> None:
    """The audit of a store that made (or replaced) board ``name``."""
    conn.gate.done(conn.principal or ANONYMOUS_ALL, "put_board", conn.address, board=name,
                   command=args[0].lower().decode(errors="replace"))


@dataclass(slots=True)
class Computed:
    """A store's result computed before the step of the EXEC that holds it
    (see :mod:`.transactions`), and the versions of the inputs it is of."""

    names: list[str | None]
    result: Result
    versions: list[Any]


_STORES = {b"zunionstore": "union", b"zinterstore": "inter", b"zdiffstore": "diff"}


async def precompute(conn: Context, args: list[bytes]) -> Computed:
    """Compute a queued store's result now, in steps as outside ``MULTI``
    (charged and bounded so), for the step of its EXEC."""
    found = parse(args, 2, _STORES[args[0].lower()], store=True)
    outcome = _run(conn, found, store=True)
    if not isinstance(outcome, tuple):
        try:
            outcome = await outcome
        except _Closed:
            raise CommandError("ERR the connection closed") from None
    return Computed(_names(found.keys), *outcome)


def current(conn: Context, computed: Computed) -> bool:
    """Whether no input of ``computed`` changed since it was computed."""
    return _versions(conn, computed.names) == computed.versions


def _store_aggregate(conn: Context, args: list[bytes], op: str) -> Reply:
    """ZUNIONSTORE, ZINTERSTORE, ZDIFFSTORE destination numkeys key ..."""
    found = parse(args, 2, op, store=True)
    names = _names(found.keys)
    if exec_step.running(conn) is not None:
        return _store_aggregate_in_exec(conn, args, found, names)

    async def attempt(first: bool) -> tuple[Result, Callable[[], bool]]:
        outcome = _run(conn, found, store=True, charge=first)
        result, versions = outcome if isinstance(outcome, tuple) else await outcome
        return result, lambda: _versions(conn, names) == versions
    return _store(conn, args, names, attempt)


def _store_aggregate_in_exec(conn: Context, args: list[bytes], found: Aggregation,
                             names: list[str | None]) -> Reply:
    """A store inside EXEC: computed before the step if it could be, else now."""
    computed = exec_step.running(conn).precomputed.get(id(args))
    outcome = ((computed.result, computed.versions) if computed is not None
               else _run(conn, found, store=True))

    def current(result: Result, versions: list[Any]) -> Callable[[], Result]:
        def now() -> Result:
            if _versions(conn, names) == versions:
                return result
            return _finish(compute(_views(conn, found.keys), found))  # changed: again
        return now

    if isinstance(outcome, tuple):
        return _store_in_exec(conn, args, outcome[0], current(*outcome))

    async def later() -> bytes:
        try:
            result, versions = await outcome
        except _Closed:
            return b""
        return await _store_in_exec(conn, args, result, current(result, versions))
    return later()


def zunionstore(conn: Context, args: list[bytes]) -> Reply:
    """ZUNIONSTORE destination numkeys key [key ...] [WEIGHTS w ...] [AGGREGATE ...]"""
    return _store_aggregate(conn, args, "union")


def zinterstore(conn: Context, args: list[bytes]) -> Reply:
    """ZINTERSTORE destination numkeys key [key ...] [WEIGHTS w ...] [AGGREGATE ...]"""
    return _store_aggregate(conn, args, "inter")


def zdiffstore(conn: Context, args: list[bytes]) -> Reply:
    """ZDIFFSTORE destination numkeys key [key ...]"""
    return _store_aggregate(conn, args, "diff")


def _range_work(conn: Context, key: bytes, spec: Any) -> Work:
    """The members of a range (as :func:`compute` gives a result), read
    :data:`STEP_ENTRIES` at a time."""
    plan = range_plan(conn, key, spec)
    result: Result = {}
    if plan is None:
        return result
    total, fetch = plan()
    _check_stored(total)
    for first in range(0, total, STEP_ENTRIES):
        for _, member, value in fetch(first, min(STEP_ENTRIES, total - first)):
            result[member] = value
        yield
    return result


def zrangestore(conn: Context, args: list[bytes]) -> Reply:
    """ZRANGESTORE dst src min max [BYSCORE|BYLEX] [REV] [LIMIT offset count]"""
    spec = parse_range(args, 2, store=True)
    if exec_step.running(conn) is not None:  # in the EXEC's one commit

        def current() -> Result:
            plan = range_plan(conn, args[2], spec)
            if plan is None:
                return {}
            total, fetch = plan()
            _check_stored(total)
            return {member: value for _, member, value in fetch(0, total)}
        result = current()
        _charge_reads(conn, len(result))
        return _store_in_exec(conn, args, result, current, spec.by)
    names = [board_name(args[2])]

    async def attempt(first: bool) -> tuple[Result, Callable[[], bool]]:
        plan = range_plan(conn, args[2], spec)
        if plan is None or plan()[0] <= STEP_ENTRIES:
            result = _finish(_range_work(conn, args[2], spec))
            versions = _versions(conn, names)
        else:
            result, versions = await _in_steps(conn, names, lambda: _range_work(
                conn, args[2], spec))
        if first:
            _charge_reads(conn, len(result))
        return result, lambda: _versions(conn, names) == versions
    return _store(conn, args, names, attempt, spec.by)
