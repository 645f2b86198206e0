"""The sorted-set and keyspace commands, with Redis's semantics.

Keys are boards.  Each command reads its arguments exactly as Redis does
(:mod:`.arguments`), checks them in Redis's order (options, then numbers,
then the key), and answers what ``redis-server`` answers: the tests send
random command sequences to both and compare the replies byte for byte.

Reads take a :class:`rankd.engine.view.SortedView` of the board's window
from the service and answer at once.  ``ZADD`` and ``ZINCRBY`` on an
existing board become :class:`Writes`: submissions the connection sends
to the engine together with those of the commands pipelined right after
them (one batch, one commit), answered once they are applied.  Removals
go through ``Service.remove_members``, which picks and removes in one step.

A key written through RESP that is not a board yet becomes one with
:data:`REDIS_BOARD`, the config under which every answer is Redis's and
the board ranks as Redis leaderboards are read (``ZREVRANGE``): highest
score first, equal scores by member from Z to A (so ``ZRANGE``, the
reverse, lists them A to Z), each write replacing the score (``latest``)
or adding to it (``ZINCRBY``: an explicit increment), one all-time
window.  Boards RESP made before (``rankd.engine.zeros.LEGACY_REDIS_BOARD``, lowest
first) are kept as they are and answer alike.  A board outlives its last
member (only ``admin`` deletes boards), but an empty RESP-made board is
no key to the keyspace commands, as in Redis.  Boards made through REST
with another config are read and written too; ``docs/redis.md`` tables
what differs on them.

Reads are charged by their work (:func:`work_cost`: one request per
:data:`ENTRIES_PER_REQUEST` entries read or returned), and a reply of more
than :data:`STEP_ENTRIES` entries is built a step at a time, letting other
clients in between (:func:`_stepwise`).

Each handler takes the :class:`~.context.Context` of the connection that
runs it (never the connection class: no command module imports
:mod:`.connection`) and returns a :data:`~.context.Reply`.  The lex-range
commands are here too, over :mod:`.lex`'s walk.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rankd._native import native_or
from rankd.engine.config import BOARD_NAME_RULE, is_board_name
from rankd.engine.errors import EngineError, NotFound, Unsettled
from rankd.engine.groups import group_of
from rankd.engine.ingest import (
    IF_ABSENT,
    IF_GREATER,
    IF_LESS,
    IF_PRESENT,
    SKIPLIST_FIRST,
    check_member,
)
from rankd.engine.submission import Submission
from rankd.engine.zeros import LISTPACK_ENTRIES, REDIS_BOARD, REDIS_CONFIGS
from rankd.frontends.resp import lex
from rankd.frontends.resp.arguments import (
    BOUND_NOT_FLOAT,
    SYNTAX,
    CommandError,
    bound,
    glob_match,
    integer,
    positive,
    score,
    text,
)
from rankd.frontends.resp.context import Applied, Context, Reply, Writes
from rankd.frontends.resp.limits import (
    AUDIT_NAMES,
    ENTRIES_PER_REQUEST,
    MAX_PAIRS,
    MAX_REPLY_BYTES,
    MAX_REPLY_ENTRIES,
    SCAN_WHOLE,
    STEP_ENTRIES,
    STEP_RESTARTS,
)
from rankd.frontends.resp.protocol import format_double

_encode_entries, _ = native_or("rankd.frontends.resp._scanner", "encode_entries", None)

#: The config of boards made through RESP (see the module docstring), and
#: the one RESP made boards with before (lowest first): kept, not migrated.
#: rankd.engine.zeros keeps ``-0`` on them as Redis does.
REDIS_BOARD_DICT = REDIS_BOARD.to_dict()
_REDIS_CONFIGS = REDIS_CONFIGS


def board_name(word: bytes) -> str | None:
    """The board a key names, or None if no board can have that name."""
    name = text(word)
    return name if name is not None and is_board_name(name) else None


def _view(conn: Context, key: bytes) -> Any:
    """The view of board ``key`` (the connection's window), or None if no
    such board."""
    name = board_name(key)
    if name is None or not conn.service.has_board(name):
        return None
    return conn.service.view(name, window=conn.window, period=conn.period)


def _check_size(count: int) -> None:
    if count > MAX_REPLY_ENTRIES:
        raise CommandError(f"ERR rankd answers at most {MAX_REPLY_ENTRIES} entries in one "
                           "reply; ask for a smaller range (indexes or LIMIT)")


def _check_removal(count: int) -> None:
    """A command removes at most :data:`MAX_PAIRS` members: the engine
    applies a removal in one step, and 500,000 held the event loop 2.6 s."""
    if count > MAX_PAIRS:
        raise CommandError(f"ERR rankd removes at most {MAX_PAIRS} members in one command "
                           "(its batch limit); remove a range at a time")


def work_cost(entries: int) -> int:
    """Requests of rate limit a command reading or returning ``entries``
    entries costs: one per :data:`ENTRIES_PER_REQUEST`, at least one."""
    return max(1, -(-entries // ENTRIES_PER_REQUEST))


def _charge(conn: Context, entries: int, operation: str = "top") -> None:
    """Charge a command's work once its size is known (admitting it charged
    one request); a ``RateLimited`` refusal answers it."""
    extra = work_cost(entries) - 1
    if extra > 0 and conn.principal is not None:
        conn.gate.admit(conn.principal, operation, conn.address, extra)


def is_key(conn: Context, name: str) -> bool:
    """Whether board ``name`` is a key as Redis would show it: every board
    but an empty RESP-made one (a Redis key goes with its last member)."""
    config = conn.service.board_config(name)
    if config is None:
        return False
    return config not in _REDIS_CONFIGS or len(conn.service.view(name)) > 0


def _version(conn: Context, name: str | None) -> tuple[int, int] | None:
    """What changes when board ``name`` is written, deleted or made again."""
    board = None if name is None else conn.service.engine.boards.get(name)
    return None if board is None else (board.serial, board.version)


#: A reply to build: its header, how many entries (or members) it holds,
#: and a function giving the bytes of ``count`` of them from ``first`` on.
Steps = tuple[bytes, int, Callable[[int, int], bytes]]


def _stepwise(conn: Context, key: bytes, plan: Callable[[], Steps]) -> Reply:
    """The reply ``plan`` lays out: at once if it is small, else built
    :data:`STEP_ENTRIES` entries at a time, yielding the event loop between
    steps, started again (from a new ``plan``) if the board changed
    meanwhile, at most :data:`MAX_REPLY_BYTES` long."""
    header, total, piece = plan()
    if total <= STEP_ENTRIES:
        return header + piece(0, total) if total else header
    return _built_in_steps(conn, board_name(key), plan)


async def _built_in_steps(conn: Context, name: str | None,
                          plan: Callable[[], Steps]) -> bytes:
    """:func:`_stepwise`'s large case (``name``: the board it reads)."""
    for attempt in range(STEP_RESTARTS + 1):
        version = _version(conn, name)
        try:
            header, total, piece = plan()
        except Unsettled as exc:  # writes not committed yet: once they are, again
            if attempt == STEP_RESTARTS:
                raise
            await conn.service.engine.settle(exc.group)
            continue
        parts, size, done = [header], len(header), 0
        while done < total:
            if done and attempt < STEP_RESTARTS:
                await asyncio.sleep(0)  # other clients' turn
                if conn.closing:
                    return b""
                if _version(conn, name) != version:
                    break  # written meanwhile: start again
            count = min(STEP_ENTRIES, total - done)
            part = piece(done, count)
            size += len(part)
            if size > MAX_REPLY_BYTES:
                raise CommandError(f"ERR rankd answers at most {MAX_REPLY_BYTES} bytes in "
                                   "one reply; ask for a smaller range (indexes or LIMIT)")
            parts.append(part)
            done += count
        else:
            return b"".join(parts)
    raise AssertionError("the last attempt runs to the end")


def _entry_steps(conn: Context, total: int, fetch: Callable[[int, int], list],
                 withscores: bool) -> Steps:
    """:data:`Steps` of a range reply: ``fetch(first, count)`` reads entries."""
    replies = conn.replies
    flat = withscores and replies.version == 2
    header = replies.array_header(2 * total if flat else total)

    def piece(first: int, count: int) -> bytes:
        data = _entries(conn, fetch(first, count), withscores, nested=True)
        return data[data.index(b"\n") + 1:]  # without its own array header
    return header, total, piece


def _range(conn: Context, key: bytes, plan: Callable[[], tuple[int, Callable]],
           withscores: bool) -> Reply:
    """A range reply: ``plan()`` gives its size and how to fetch its entries
    from a view of the board as it is now; charged by its size."""
    total, fetch = plan()
    _check_size(total)
    _charge(conn, total)
    if total <= STEP_ENTRIES:
        return _entries(conn, fetch(0, total) if total else [], withscores, nested=True)

    def steps() -> Steps:
        size, fetch = plan()
        _check_size(size)
        return _entry_steps(conn, size, fetch, withscores)
    return _built_in_steps(conn, board_name(key), steps)


def _entries(conn: Context, entries: list, withscores: bool, nested: bool) -> bytes:
    """Members (and scores): flat in RESP2, ``[member, score]`` pairs in RESP3
    when ``nested`` (natively when built: ``_scanner.encode_entries``)."""
    if _encode_entries is not None:
        return _encode_entries(entries, withscores, conn.replies.version, nested)
    replies = conn.replies
    bulk, double = replies.bulk, replies.double
    if not withscores:
        return b"".join([replies.array_header(len(entries)),
                         *[bulk(member) for _, member, _ in entries]])
    if nested and replies.version == 3:
        out = [replies.array_header(len(entries))]
        for _, member, value in entries:
            out += (b"*2\r\n", bulk(member), double(value))
        return b"".join(out)
    out = [replies.array_header(2 * len(entries))]
    for _, member, value in entries:
        out += (bulk(member), double(value))
    return b"".join(out)


# --- writes -------------------------------------------------------------------------


def zadd(conn: Context, args: list[bytes], incr: bool = False) -> Reply:
    """ZADD key [NX|XX] [GT|LT] [CH] [INCR] score member [score member ...]"""
    flags = 0
    changed = False
    position = 2
    while position < len(args):
        option = args[position].lower()
        if option == b"nx":
            flags |= IF_ABSENT
        elif option == b"xx":
            flags |= IF_PRESENT
        elif option == b"ch":
            changed = True
        elif option == b"incr":
            incr = True
        elif option == b"gt":
            flags |= IF_GREATER
        elif option == b"lt":
            flags |= IF_LESS
        else:
            break
        position += 1
    pairs = len(args) - position
    if pairs % 2 or not pairs:
        raise CommandError(SYNTAX)
    pairs //= 2
    if flags & IF_ABSENT and flags & IF_PRESENT:
        raise CommandError("ERR XX and NX options at the same time are not compatible")
    if (flags & IF_GREATER and flags & (IF_ABSENT | IF_LESS)) or (
            flags & IF_LESS and flags & IF_ABSENT):
        raise CommandError("ERR GT, LT, and/or NX options at the same time are not compatible")
    if incr and pairs > 1:
        raise CommandError("ERR INCR option supports a single increment-element pair")
    if pairs > MAX_PAIRS:
        raise CommandError(f"ERR rankd takes at most {MAX_PAIRS} score-member pairs in one "
                           "ZADD")
    values = [score(args[position + 2 * i]) for i in range(pairs)]
    name = _writable_name(args[1])
    members = [_member(args[position + 2 * i + 1]) for i in range(pairs)]
    for value in values:
        if math.isinf(value):
            raise CommandError("ERR rankd keeps finite scores only")
    submissions = [
        Submission(board=name, member=member, delta=value, condition=flags) if incr else
        Submission(board=name, member=member, score=value, condition=flags)
        for value, member in zip(values, members, strict=True)]
    if pairs > LISTPACK_ENTRIES:  # Redis 7.2 makes the set a skiplist first
        submissions[0].condition |= SKIPLIST_FIRST

    def answer(answers: list[dict[str, Any] | EngineError]) -> bytes:
        added = updated = 0
        last: dict[str, Any] | None = None
        for outcome in answers:
            if isinstance(outcome, EngineError):
                raise outcome
            if outcome.get("skipped"):
                continue
            last = outcome
            if outcome["previous"] is None:
                added += 1
            elif outcome["changed"]:
                updated += 1
        if incr:
            if last is None:
                return conn.replies.null()
            return conn.replies.double(incremented(last, values[0]))
        return conn.replies.integer(added + updated if changed else added)

    writes = Writes(submissions, answer)
    if conn.service.has_board(name):
        return writes
    if flags & IF_PRESENT:  # XX on a missing key: nothing to do
        return answer([])
    return conn.create_and_write(name, writes)


def incremented(answer: dict[str, Any], increment: float) -> float:
    """``ZINCRBY``'s reply as Redis computes it: the score before plus the
    increment, or the increment itself for a new member (``-0`` stays
    ``-0``).  Not the score stored: ``-0`` plus ``0`` answers ``0`` and
    leaves the ``-0``, a score equal to it."""
    previous = answer["previous"]
    return increment if previous is None else previous + increment


def zincrby(conn: Context, args: list[bytes]) -> Reply:
    """ZINCRBY key increment member: ZADD ... INCR, as Redis does it."""
    return zadd(conn, args, incr=True)


def _writable_name(key: bytes) -> str:
    name = board_name(key)
    if name is None:
        raise CommandError(f"ERR rankd board names (keys) are {BOARD_NAME_RULE}")
    return name


def _member(word: bytes) -> str:
    member = text(word)
    if member is None:
        raise CommandError("ERR rankd members are UTF-8 text")
    try:
        return check_member(member)
    except EngineError as exc:
        raise CommandError(f"ERR {exc.message}") from None


def zrem(conn: Context, args: list[bytes]) -> Reply:
    """ZREM key member [member ...]"""
    _check_removal(len(args) - 2)
    members = [m for m in map(text, args[2:]) if m is not None]
    return _remove(conn, args[1], lambda view: members)


def zremrangebyrank(conn: Context, args: list[bytes]) -> Reply:
    """ZREMRANGEBYRANK key start stop"""
    start, stop = integer(args[2]), integer(args[3])

    def choose(view: Any) -> list[str]:
        first, count = _rank_range(len(view), start, stop)
        return [member for _, member, _ in view.by_position(first, count)]

    def size(view: Any) -> int:
        return _rank_range(len(view), start, stop)[1]
    return _remove(conn, args[1], choose, size)


def zremrangebyscore(conn: Context, args: list[bytes]) -> Reply:
    """ZREMRANGEBYSCORE key min max"""
    low, high = _score_range(args[2], args[3])

    def choose(view: Any) -> list[str]:
        return [member for _, member, _ in _by_score(view, low, high)]
    return _remove(conn, args[1], choose, lambda view: _count(view, low, high))


async def _removed(conn: Context, name: str, choose: Callable[[Any], list[str]]
                   ) -> list[tuple[str, float]]:
    """Remove what ``choose`` picks; the board stays, even emptied (``is_key``),
    but a RESP-made one emptied loses its deadline (a Redis key made again
    has none)."""
    return await conn.service.remove_members(
        name, choose, window=conn.window, period=conn.period,
        persist_when_empty=_persists(conn, name))


def _persists(conn: Context, name: str) -> bool:
    """Whether board ``name`` loses its deadline with its last member (RESP-made)."""
    return conn.service.board_config(name) in _REDIS_CONFIGS


def _remove(conn: Context, key: bytes, choose: Callable[[Any], list[str]],
            size: Callable[[Any], int] | None = None) -> Reply:
    """Remove what ``choose`` picks, charged by ``size`` (what it will pick)."""
    name = board_name(key)
    if name is None or not conn.service.has_board(name):
        return conn.replies.integer(0)
    if size is not None:
        count = size(_view(conn, key))
        _check_removal(count)
        _charge(conn, count, "remove_member")

    async def run() -> bytes:
        try:
            return conn.replies.integer(len(await _removed(conn, name, choose)))
        except NotFound:  # deleted meanwhile
            return conn.replies.integer(0)
    return run()


def zpop(conn: Context, args: list[bytes], highest: bool) -> Reply:
    """ZPOPMIN|ZPOPMAX key [count]"""
    if len(args) > 3:
        raise CommandError(SYNTAX)
    count = positive(args[2]) if len(args) == 3 else None
    replies = conn.replies
    if count == 0:
        return replies.array_header(0)
    name = board_name(args[1])
    if name is None or not conn.service.has_board(name):
        return replies.array_header(0)
    wanted = 1 if count is None else count
    _check_removal(min(wanted, len(conn.service.view(name))))
    _charge(conn, min(wanted, len(conn.service.view(name))), "remove_member")

    def choose(view: Any) -> list[str]:
        return [m for _, m, _ in view.by_position(0, min(wanted, len(view)), reverse=highest)]

    def reply(popped: list[tuple[str, float]]) -> bytes:
        entries = [(0, member, value) for member, value in popped]
        return _entries(conn, entries, True, nested=count is not None)

    try:  # applied now, acknowledged with the pipeline's writes (see .pop_runs)
        now = conn.service.remove_members_now(
            name, choose, window=conn.window, period=conn.period,
            persist_when_empty=_persists(conn, name))
    except NotFound:
        return reply([])
    if now is not None:
        popped, committed = now
        return reply(popped) if committed is None else Applied(reply(popped), committed)

    async def run() -> bytes:
        try:
            popped = await _removed(conn, name, choose)
        except NotFound:
            popped = []
        return reply(popped)
    return run()


def zpopmin(conn: Context, args: list[bytes]) -> Reply:
    return zpop(conn, args, highest=False)


def zpopmax(conn: Context, args: list[bytes]) -> Reply:
    return zpop(conn, args, highest=True)


# --- reads ---------------------------------------------------------------------------


def zscore(conn: Context, args: list[bytes]) -> Reply:
    """ZSCORE key member"""
    view = _view(conn, args[1])
    member = text(args[2])
    found = None if view is None or member is None else view.score(member)
    return conn.replies.null() if found is None else conn.replies.double(found)


def zmscore(conn: Context, args: list[bytes]) -> Reply:
    """ZMSCORE key member [member ...] (charged by its members: ``COMMANDS``)"""
    replies = conn.replies
    words = args[2:]

    def plan() -> Steps:
        view = _view(conn, args[1])

        def piece(first: int, count: int) -> bytes:
            out = []
            for word in words[first:first + count]:
                member = text(word)
                found = None if view is None or member is None else view.score(member)
                out.append(replies.null() if found is None else replies.double(found))
            return b"".join(out)
        return replies.array_header(len(words)), len(words), piece
    return _stepwise(conn, args[1], plan)


def zcard(conn: Context, args: list[bytes]) -> Reply:
    view = _view(conn, args[1])
    return conn.replies.integer(0 if view is None else len(view))


def zrank(conn: Context, args: list[bytes], reverse: bool = False) -> Reply:
    """ZRANK|ZREVRANK key member [WITHSCORE] (Redis 7.2's reply)"""
    if len(args) > 4 or (len(args) == 4 and args[3].lower() != b"withscore"):
        raise CommandError(SYNTAX)
    view = _view(conn, args[1])
    member = text(args[2])
    position = None if view is None or member is None else view.position(member,
                                                                          reverse=reverse)
    replies = conn.replies
    if len(args) == 4:
        if position is None:
            return replies.null_array()
        return b"*2\r\n" + replies.integer(position) + replies.double(view.score(member))
    return replies.null() if position is None else replies.integer(position)


def zrevrank(conn: Context, args: list[bytes]) -> Reply:
    return zrank(conn, args, reverse=True)


def _rank_range(size: int, start: int, stop: int) -> tuple[int, int]:
    """Redis's index sanitising: ``(first, count)``, count 0 if empty."""
    if start < 0:
        start += size
    if stop < 0:
        stop += size
    start = max(start, 0)
    if start > stop or start >= size:
        return 0, 0
    stop = min(stop, size - 1)
    return start, stop - start + 1


def _score_range(low: bytes, high: bytes) -> tuple[tuple[float, bool], tuple[float, bool]]:
    try:
        return bound(low), bound(high)
    except CommandError:
        raise CommandError(BOUND_NOT_FLOAT) from None


def _by_score(view: Any, low: tuple[float, bool], high: tuple[float, bool]) -> list:
    """Every entry scored between the bounds, lowest first."""
    (low_value, low_ex), (high_value, high_ex) = low, high
    if low_value > high_value or (low_value == high_value and (low_ex or high_ex)):
        return []
    return view.by_score(low_value, high_value, low_exclusive=low_ex, high_exclusive=high_ex)


@dataclass(slots=True)
class RangeSpec:
    """What a ``ZRANGE`` (or ``ZRANGESTORE``) asks for, its arguments read."""

    by: str
    reverse: bool
    withscores: bool
    offset: int
    limit: int
    #: The range's two arguments as given (indexes, score or lex bounds).
    low: bytes
    high: bytes


def parse_range(args: list[bytes], first: int, *, store: bool = False, by: str | None = None,
                reverse: bool | None = None) -> RangeSpec:
    """Read ``key min max [BYSCORE|BYLEX] [REV] [LIMIT offset count]
    [WITHSCORES]`` from ``args[first]`` on, as Redis's
    ``zrangeGenericCommand`` does (``store``: ZRANGESTORE, no WITHSCORES),
    checking the range's syntax too."""
    withscores = False
    offset, limit = 0, -1
    position = first + 3
    while position < len(args):
        option = args[position].lower()
        left = len(args) - position - 1
        if not store and option == b"withscores":
            withscores = True
        elif option == b"limit" and left >= 2:
            offset, limit = integer(args[position + 1]), integer(args[position + 2])
            position += 2
        elif reverse is None and option == b"rev":
            reverse = True
        elif by is None and option == b"bylex":
            by = "lex"
        elif by is None and option == b"byscore":
            by = "score"
        else:
            raise CommandError(SYNTAX)
        position += 1
    reverse = bool(reverse)
    by = by or "rank"
    if limit != -1 and by == "rank":
        raise CommandError("ERR syntax error, LIMIT is only supported in combination with "
                           "either BYSCORE or BYLEX")
    if withscores and by == "lex":
        raise CommandError("ERR syntax error, WITHSCORES not supported in combination with "
                           "BYLEX")
    spec = RangeSpec(by, reverse, withscores, offset, limit, args[first + 1], args[first + 2])
    if by == "rank":
        integer(spec.low), integer(spec.high)
    elif by == "score":
        _score_range(spec.low, spec.high)
    else:
        lex.lex_range(*((spec.high, spec.low) if reverse else (spec.low, spec.high)))
    return spec


def range_plan(conn: Context, key: bytes, spec: RangeSpec
               ) -> Callable[[], tuple[int, Callable[[int, int], list]]] | None:
    """How to read the range ``spec`` asks for on board ``key``, as
    :func:`_range` takes it; None if there is no such board."""
    if _view(conn, key) is None:
        return None
    reverse, offset, limit = spec.reverse, spec.offset, spec.limit
    if spec.by == "lex":
        return lex_plan(conn, key, spec)
    if spec.by == "rank":
        start, stop = integer(spec.low), integer(spec.high)

        def by_rank() -> tuple[int, Callable[[int, int], list]]:
            view = _view(conn, key)
            first, count = _rank_range(0 if view is None else len(view), start, stop)
            return count, lambda skip, n: view.by_position(first + skip, n,
                                                           reverse=reverse)
        return by_rank
    low, high = _score_range(spec.low, spec.high)

    def by_score() -> tuple[int, Callable[[int, int], list]]:
        # Read by position (each step O(log n)): an offset into a score
        # range would walk past every entry skipped, step after step.
        view = _view(conn, key)
        if view is None or offset < 0 or (offset > 0 and offset >= len(view)):
            return 0, lambda skip, n: []
        least, most = (low, high) if not reverse else (high, low)
        total = max(0, _count(view, least, most) - offset)
        if limit >= 0:
            total = min(total, limit)
        first = offset + (_count(view, (most[0], not most[1]), (math.inf, False))
                          if reverse else
                          _count(view, (-math.inf, False), (least[0], not least[1])))
        return total, lambda skip, n: view.by_position(first + skip, n, reverse=reverse)
    return by_score


def zrange(conn: Context, args: list[bytes], *, by: str | None = None,
           reverse: bool | None = None) -> Reply:
    """ZRANGE key start stop [BYSCORE|BYLEX] [REV] [LIMIT offset count]
    [WITHSCORES], and the legacy forms that preset ``by`` and ``reverse``."""
    spec = parse_range(args, 1, by=by, reverse=reverse)
    plan = range_plan(conn, args[1], spec)
    if plan is None:
        return conn.replies.array_header(0)
    return _range(conn, args[1], plan, spec.withscores)


def _count(view: Any, low: tuple[float, bool], high: tuple[float, bool]) -> int:
    (low_value, low_ex), (high_value, high_ex) = low, high
    if low_value > high_value or (low_value == high_value and (low_ex or high_ex)):
        return 0
    return view.count(low_value, high_value, low_exclusive=low_ex, high_exclusive=high_ex)


def zrevrange(conn: Context, args: list[bytes]) -> Reply:
    return zrange(conn, args, by="rank", reverse=True)


def zrangebyscore(conn: Context, args: list[bytes]) -> Reply:
    return zrange(conn, args, by="score", reverse=False)


def zrevrangebyscore(conn: Context, args: list[bytes]) -> Reply:
    return zrange(conn, args, by="score", reverse=True)


def zcount(conn: Context, args: list[bytes]) -> Reply:
    """ZCOUNT key min max"""
    low, high = _score_range(args[2], args[3])
    view = _view(conn, args[1])
    return conn.replies.integer(0 if view is None else _count(view, low, high))


# --- lex ranges (the walk is .lex's) -------------------------------------------------


def lex_plan(conn: Context, key: bytes, spec: RangeSpec
             ) -> Callable[[], tuple[int, Callable[[int, int], list]]]:
    """``ZRANGE ... BYLEX``'s plan (see :func:`range_plan`)."""
    low, high = (spec.high, spec.low) if spec.reverse else (spec.low, spec.high)
    bounds = lex.LexRange(lex.lex_range(low, high))

    def plan() -> tuple[int, Callable[[int, int], list]]:
        view = _view(conn, key)
        if view is None:
            return 0, lambda skip, n: []
        first, count = lex.walk(view, bounds, spec.reverse, spec.offset, spec.limit,
                                MAX_REPLY_ENTRIES)
        return count, lambda skip, n: view.by_position(first + skip, n, reverse=spec.reverse)
    return plan


def zrangebylex(conn: Context, args: list[bytes]) -> Reply:
    """ZRANGEBYLEX key min max [LIMIT offset count]"""
    return zrange(conn, args, by="lex", reverse=False)


def zrevrangebylex(conn: Context, args: list[bytes]) -> Reply:
    """ZREVRANGEBYLEX key max min [LIMIT offset count]"""
    return zrange(conn, args, by="lex", reverse=True)


def zlexcount(conn: Context, args: list[bytes]) -> Reply:
    """ZLEXCOUNT key min max: a listpack's walk; a skiplist's two descents
    (the positions of the first and last members in range)."""
    bounds = lex.LexRange(lex.lex_range(args[2], args[3]))
    view = _view(conn, args[1])
    if view is None:
        return conn.replies.integer(0)
    size = len(view)
    if size <= SCAN_WHOLE:
        return conn.replies.integer(lex.walk(view, bounds, False, 0, -1, size)[1])
    first = lex.start_of(view, bounds, False)
    if first is None:
        return conn.replies.integer(0)
    count = size - first
    last = lex.start_of(view, bounds, True)  # (a position from the end)
    if last is not None:
        count -= last
    return conn.replies.integer(max(count, 0))


def zremrangebylex(conn: Context, args: list[bytes]) -> Reply:
    """ZREMRANGEBYLEX key min max"""
    bounds = lex.LexRange(lex.lex_range(args[2], args[3]))

    def span(view: Any) -> tuple[int, int]:
        return lex.walk(view, bounds, False, 0, -1, MAX_PAIRS)

    def choose(view: Any) -> list[str]:
        first, count = span(view)
        _check_removal(count)
        return [member for _, member, _ in view.by_position(first, count)]
    return _remove(conn, args[1], choose, lambda view: span(view)[1])


def _scan_options(args: list[bytes], start: int, *, types: bool = False
                  ) -> tuple[bytes | None, int, bytes | None]:
    """MATCH pattern, COUNT count (and TYPE type) after ``start``."""
    pattern = kind = None
    count = 10
    position = start
    while position < len(args):
        option = args[position].lower()
        left = len(args) - position - 1
        if option == b"count" and left >= 1:
            count = integer(args[position + 1])
            if count < 1:
                raise CommandError(SYNTAX)
        elif option == b"match" and left >= 1:
            pattern = args[position + 1]
        elif types and option == b"type" and left >= 1:
            kind = args[position + 1]
        else:
            raise CommandError(SYNTAX)
        position += 2
    return pattern, count, kind


def _cursor(word: bytes) -> int:
    """A SCAN/ZSCAN cursor as Redis reads it (C's ``strtoul``, all of the
    word up to a NUL, no leading blank): a sign is taken and ``-n`` wraps
    to 2**64 - n (``-1`` is the last cursor: nothing follows it), an empty
    word is 0, past 2**64 - 1 is invalid."""
    word = word.split(b"\0", 1)[0]
    digits = word[1:] if word[:1] in (b"+", b"-") else word
    if word and (not digits.isdigit() or not digits.isascii() or len(digits.lstrip(b"0")) > 20
                 or int(digits) >= 2**64):
        raise CommandError("ERR invalid cursor")
    value = int(digits or b"0")
    return (-value) % 2**64 if word[:1] == b"-" else value


def zscan(conn: Context, args: list[bytes]) -> Reply:
    """ZSCAN key cursor [MATCH pattern] [COUNT count]: boards up to 128
    members in one reply (as Redis), larger ones ``count`` at a time in
    score order (the cursor is a position)."""
    cursor = _cursor(args[2])
    view = _view(conn, args[1])
    replies = conn.replies
    if view is None or not len(view):  # no key (an emptied board): before the options, as Redis
        return b"*2\r\n" + replies.bulk(b"0") + replies.array_header(0)
    pattern, count, _ = _scan_options(args, 3)
    size = len(view)
    _charge(conn, size if size <= SCAN_WHOLE else min(count, STEP_ENTRIES))
    if size <= SCAN_WHOLE:
        entries, following = view.by_position(0, size), 0
    else:
        first = min(cursor, size)
        count = min(count, STEP_ENTRIES)  # a hint, as in Redis: the cursor goes on
        entries = view.by_position(first, min(count, size - first))
        following = first + len(entries)
        if following >= size:
            following = 0
    if pattern is not None:
        entries = [e for e in entries if glob_match(pattern, e[1].encode())]
    out = [b"*2\r\n", replies.bulk(str(following)), replies.array_header(2 * len(entries))]
    shown = stored_score_text if view.encoding == "listpack" else skiplist_score_text
    for _, member, value in entries:
        out += (replies.bulk(member), replies.bulk(shown(value)))
    return b"".join(out)


#: Within this, an integral score is written as an integer where Redis
#: stores it as text (``d2string``), which is what ZSCAN shows.
_STORED_AS_INTEGER = 2**62


def skiplist_score_text(value: float) -> bytes:
    """A score as ZSCAN shows it from a skiplist: Redis's ``ld2string``
    (``%.17Lg``), ``-0`` included."""
    return b"%.17g" % value


def stored_score_text(value: float) -> bytes:
    """A score as a small Redis sorted set stores it (ZSCAN answers these
    strings, in RESP3 too): integral ones as integers, others ``%.17g``."""
    if value == int(value) and -_STORED_AS_INTEGER <= value <= _STORED_AS_INTEGER:
        return b"%d" % int(value)
    return format_double(value)


# --- keyspace -------------------------------------------------------------------------


def exists(conn: Context, args: list[bytes]) -> Reply:
    """EXISTS key [key ...] (a key named twice counts twice), a step of
    :data:`STEP_ENTRIES` keys at a time."""
    words = args[1:]

    def found(first: int) -> int:
        return sum(1 for name in map(board_name, words[first:first + STEP_ENTRIES])
                   if name is not None and is_key(conn, name))
    if len(words) <= STEP_ENTRIES:
        return conn.replies.integer(found(0))

    async def run() -> bytes:
        total = 0
        for first in range(0, len(words), STEP_ENTRIES):
            if first:
                await asyncio.sleep(0)  # other clients' turn
            total += found(first)
        return conn.replies.integer(total)
    return run()


def type_(conn: Context, args: list[bytes]) -> Reply:
    name = board_name(args[1])
    found = name is not None and is_key(conn, name)
    return conn.replies.simple("zset" if found else "none")


def key_names(conn: Context) -> list[str]:
    """Every key (board names but empty RESP-made boards), sorted; to a
    cluster client, those of the slots this node writes (as each Redis
    Cluster node lists its own: the client asks every node and joins them)."""
    return [name for name in conn.service.board_names()
            if is_key(conn, name) and _listed_here(conn, name)]


def _listed_here(conn: Context, name: str) -> bool:
    state = conn.cluster_session
    if state is None or not state.aware:
        return True
    topology = conn.service.topology
    return topology.primary(group_of(name)) == topology.this_node


def _key_names(conn: Context) -> list[str]:
    """:func:`key_names`, charged by the boards looked at."""
    _charge(conn, len(conn.service.board_names()), "list_boards")
    return key_names(conn)


def delete(conn: Context, args: list[bytes]) -> Reply:
    """DEL key [key ...]: each board named deleted, one audit line each."""
    names = list(dict.fromkeys(n for n in map(board_name, args[1:]) if n is not None))

    async def run() -> bytes:
        deleted = 0
        for name in names:
            was_key = is_key(conn, name)
            if await _delete_board(conn, name, board=name, command="del"):
                deleted += was_key
        return conn.replies.integer(deleted)
    return run()


async def _delete_board(conn: Context, name: str, **audited: object) -> bool:
    """Delete board ``name``; whether it was there.  Logged as REST logs it
    (``Gate.done``) when ``audited`` names what to log."""
    try:
        await conn.service.delete_board(name)
    except NotFound:
        return False
    if audited and conn.principal is not None:
        conn.gate.done(conn.principal, "delete_board", conn.address, **audited)
    return True


def dbsize(conn: Context, args: list[bytes]) -> Reply:
    return conn.replies.integer(len(_key_names(conn)))


def keys(conn: Context, args: list[bytes]) -> Reply:
    """KEYS pattern"""
    names = [n for n in _key_names(conn) if glob_match(args[1], n.encode())]
    _check_size(len(names))
    replies = conn.replies
    return b"".join([replies.array_header(len(names)), *map(replies.bulk, names)])


def scan(conn: Context, args: list[bytes]) -> Reply:
    """SCAN cursor [MATCH pattern] [COUNT count] [TYPE type]: board names in
    order, ``count`` at a time (the cursor is a position)."""
    cursor = _cursor(args[1])
    pattern, count, kind = _scan_options(args, 2, types=True)
    names = conn.service.board_names()
    first = min(cursor, len(names))
    page = names[first:first + min(count, STEP_ENTRIES)]  # a hint, as in Redis
    _charge(conn, len(page), "list_boards")
    following = first + len(page)
    if following >= len(names):
        following = 0
    page = [name for name in page if is_key(conn, name) and _listed_here(conn, name)]
    if pattern is not None:
        page = [n for n in page if glob_match(pattern, n.encode())]
    if kind is not None and kind.lower() != b"zset":
        page = []
    replies = conn.replies
    return (b"*2\r\n" + replies.bulk(str(following)) + replies.array_header(len(page))
            + b"".join(map(replies.bulk, page)))


def flush(conn: Context, args: list[bytes]) -> Reply:
    """FLUSHDB|FLUSHALL [ASYNC|SYNC]: every board deleted."""
    if len(args) > 2 or (len(args) == 2 and args[1].lower() not in (b"async", b"sync")):
        raise CommandError(SYNTAX)

    async def run() -> bytes:
        deleted = [name for name in conn.service.board_names()
                   if await _delete_board(conn, name)]
        if conn.principal is not None:  # one audit line (a flood of them would be cut)
            shown = ",".join(deleted[:AUDIT_NAMES]) + (
                f",+{len(deleted) - AUDIT_NAMES} more" if len(deleted) > AUDIT_NAMES else "")
            conn.gate.done(conn.principal, "delete_board", conn.address, board="*",
                           command=args[0].lower().decode(), deleted=len(deleted),
                           boards=shown)
        return conn.replies.simple("OK")
    return run()
