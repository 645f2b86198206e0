"""``ZRANDMEMBER``, ``ZMPOP`` and the blocking pops ``BZPOPMIN``,
``BZPOPMAX``, ``BZMPOP``, with Redis's semantics.

A pop removes through ``Service.remove_members``, which picks and removes
in one step.  ``ZMPOP`` pops from the first of its keys that has members.
Where the engine applies a removal at once (``Service.remove_members_now``:
a single node, outside ``MULTI``), ``ZMPOP`` and a blocking pop that finds
members are applied as they run and answered with the pipeline's commit,
as ``ZPOPMIN`` is (:mod:`.pop_runs`): a pipeline of them shares its commits.

A blocking pop that finds nothing waits on its boards (:mod:`.blocking`:
in arrival order per board, woken by any commit that changes one), then
pops as it would have at once, or waits on.  A timeout of 0 waits until a
member comes or the connection closes.

``ZRANDMEMBER`` picks positions at random: with a negative count, that
many, repeats allowed, in random order; with a positive one, distinct
members in the set's order (Redis's order for its small sets; for large
ones Redis's order is its hash table's); a count at least the set's size
gives the whole set, highest first (Redis iterates a set from its end).
Replies of more than :data:`STEP_ENTRIES` entries are built in steps.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rankd.engine.errors import NotFound, Unsettled
from rankd.frontends.resp import blocking, exec_step
from rankd.frontends.resp.arguments import SYNTAX, CommandError, integer
from rankd.frontends.resp.sorted_sets import (
    Applied,
    Reply,
    Steps,
    _charge,
    _check_removal,
    _check_size,
    _entries,
    _persists,
    _removed,
    _stepwise,
    _view,
    board_name,
)

if TYPE_CHECKING:
    from rankd.frontends.resp.context import Context

#: Times a pop picks its board again when another client emptied it first.
POP_TRIES = 3
_INT64_MAX = 2**63 - 1


# --- ZRANDMEMBER -------------------------------------------------------------------


def zrandmember(conn: Context, args: list[bytes]) -> Reply:
    """ZRANDMEMBER key [count [WITHSCORES]]"""
    replies = conn.replies
    if len(args) == 2:
        view = _view(conn, args[1])
        if view is None or not len(view):
            return replies.null()
        return replies.bulk(view.by_position(random.randrange(len(view)), 1)[0][1])
    count = integer(args[2])
    if count < -_INT64_MAX:
        raise CommandError("ERR value is out of range, value must between "
                           f"{-_INT64_MAX} and {_INT64_MAX}")
    if len(args) > 4 or (len(args) == 4 and args[3].lower() != b"withscores"):
        raise CommandError(SYNTAX)
    withscores = len(args) == 4
    if withscores and not -_INT64_MAX // 2 <= count <= _INT64_MAX // 2:
        raise CommandError("ERR value is out of range")
    view = _view(conn, args[1])
    if view is None or count == 0 or not len(view):
        return replies.array_header(0)
    total = -count if count < 0 else min(count, len(view))
    _check_size(total)
    _charge(conn, total)

    def plan() -> Steps:
        view = _view(conn, args[1])
        size = 0 if view is None else len(view)
        if count < 0 or count == 1:  # repeats allowed: any position, any order
            positions = [random.randrange(size) for _ in range(total)] if size else []
        elif count >= size:  # the whole set, as Redis iterates it: from its last
            positions = list(range(size - 1, -1, -1))
        else:
            positions = sorted(random.sample(range(size), count))
        flat = withscores and replies.version == 2
        header = replies.array_header(2 * len(positions) if flat else len(positions))

        def piece(first: int, step: int) -> bytes:
            entries = [view.by_position(p, 1)[0] for p in positions[first:first + step]]
            data = _entries(conn, entries, withscores, nested=True)
            return data[data.index(b"\n") + 1:]  # without its own array header
        return header, len(positions), piece
    return _stepwise(conn, args[1], plan)


# --- pops --------------------------------------------------------------------------


def _members(conn: Context, name: str) -> int:
    view = _view(conn, name.encode())
    return 0 if view is None else len(view)


async def _pop_first(conn: Context, names: list[str], highest: bool, count: int
                     ) -> tuple[str, list[tuple[str, float]]] | None:
    """Pop up to ``count`` members (lowest, or ``highest``) from the first
    of boards ``names`` that has any: ``(board, popped)``, or None.  On a
    cluster node a write may wake a blocked pop before the log committed
    it: the pop waits for that commit (``Engine.settle``), as a read does."""
    for _ in range(POP_TRIES):
        try:
            name = next((n for n in names if _members(conn, n)), None)
        except Unsettled as exc:
            await conn.service.engine.settle(exc.group)
            name = next((n for n in names if _members(conn, n)), None)
        if name is None:
            return None
        size = min(count, _members(conn, name))
        _check_removal(size)
        _charge(conn, size, "remove_member")

        def choose(view: Any) -> list[str]:
            wanted = min(count, len(view))
            return [m for _, m, _ in view.by_position(0, wanted, reverse=highest)]
        try:
            popped = await _removed(conn, name, choose)
        except NotFound:  # deleted meanwhile
            popped = []
        if popped:
            return name, popped
    return None


#: What :func:`_pop_now` answers where the pop must wait (:func:`_pop_first`).
_WAIT = object()


def _pop_now(conn: Context, names: list[str], highest: bool, count: int,
             reply: Callable[[Context, str, list], bytes]) -> Any:
    """:func:`_pop_first` applied right here, where the engine removes at
    once: the reply (an ``Applied`` pending its commit), None if no board
    has members, or :data:`_WAIT` (nothing done) where the pop must wait:
    inside ``EXEC``, on a cluster node, on a board a snapshot holds."""
    if exec_step.running(conn) is not None:
        return _WAIT
    name = next((n for n in names if _members(conn, n)), None)
    if name is None:
        return None
    if not conn.service.engine.removes_now(name):
        return _WAIT
    size = min(count, _members(conn, name))
    _check_removal(size)
    _charge(conn, size, "remove_member")

    def choose(view: Any) -> list[str]:
        return [m for _, m, _ in view.by_position(0, min(count, len(view)), reverse=highest)]
    now = conn.service.remove_members_now(name, choose, window=conn.window, period=conn.period,
                                          persist_when_empty=_persists(conn, name))
    assert now is not None, "removes_now said it would apply now"
    popped, committed = now
    data = reply(conn, name, popped)
    return data if committed is None else Applied(data, committed)


def _names(keys: list[bytes]) -> list[str]:
    return [name for name in map(board_name, keys) if name is not None]


def _nested(conn: Context, name: str, popped: list[tuple[str, float]]) -> bytes:
    """ZMPOP's reply: the key, then ``[member, score]`` pairs (nested in
    RESP2 too)."""
    replies = conn.replies
    out = [b"*2\r\n", replies.bulk(name), replies.array_header(len(popped))]
    for member, value in popped:
        out += (b"*2\r\n", replies.bulk(member), replies.double(value))
    return b"".join(out)


def _flat(conn: Context, name: str, popped: list[tuple[str, float]]) -> bytes:
    """BZPOPMIN/BZPOPMAX's reply: key, member, score."""
    ((member, value),) = popped
    replies = conn.replies
    return b"*3\r\n" + replies.bulk(name) + replies.bulk(member) + replies.double(value)


def _mpop_args(args: list[bytes], at: int) -> tuple[list[bytes], bool, int]:
    """``numkeys key [key ...] MIN|MAX [COUNT count]`` from ``args[at]``:
    the keys, whether MAX, the count (Redis's order and errors)."""
    numkeys = integer(args[at], "ERR numkeys should be greater than 0")
    if numkeys < 1:
        raise CommandError("ERR numkeys should be greater than 0")
    where = at + numkeys + 1
    if where >= len(args):
        raise CommandError(SYNTAX)
    side = args[where].lower()
    if side not in (b"min", b"max"):
        raise CommandError(SYNTAX)
    count = -1
    position = where + 1
    while position < len(args):
        if count == -1 and args[position].lower() == b"count" and position + 1 < len(args):
            count = integer(args[position + 1], "ERR count should be greater than 0")
            if count < 1:
                raise CommandError("ERR count should be greater than 0")
            position += 2
        else:
            raise CommandError(SYNTAX)
    return args[at + 1:where], side == b"max", max(count, 1)


def zmpop(conn: Context, args: list[bytes]) -> Reply:
    """ZMPOP numkeys key [key ...] MIN|MAX [COUNT count]"""
    keys, highest, count = _mpop_args(args, 1)
    now = _pop_now(conn, _names(keys), highest, count, _nested)
    if now is None:
        return conn.replies.null_array()
    if now is not _WAIT:
        return now

    async def run() -> bytes:
        found = await _pop_first(conn, _names(keys), highest, count)
        return conn.replies.null_array() if found is None else _nested(conn, *found)
    return run()


# --- blocking pops -------------------------------------------------------------------


async def _block(conn: Context, keys: list[bytes], timeout: int, highest: bool,
                 count: int, reply: Callable[[Context, str, list], bytes]) -> bytes:
    """Pop at once if a board has members, else wait for one (``timeout``
    milliseconds, 0: no limit) in arrival order; a null array on timeout."""
    names = _names(keys)
    found = await _pop_first(conn, names, highest, count)
    if found is not None:
        return reply(conn, *found)
    if exec_step.running(conn) is not None:  # Redis never blocks inside MULTI
        return conn.replies.null_array()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout / 1000 if timeout else None
    found = None if conn.ended else await blocking.wait(
        conn, names, deadline, lambda: _pop_first(conn, names, highest, count))
    if found is not None:
        return reply(conn, *found)
    if conn.ended:  # the client is done sending: it cannot wait (as Redis frees it)
        conn.freed()
        return b""
    return b"" if conn.closing else conn.replies.null_array()


def bzpop(conn: Context, args: list[bytes], highest: bool) -> Reply:
    """BZPOPMIN|BZPOPMAX key [key ...] timeout"""
    timeout = blocking.timeout(args[-1])
    now = _pop_now(conn, _names(args[1:-1]), highest, 1, _flat)
    if now is not None and now is not _WAIT:
        return now
    return _block(conn, args[1:-1], timeout, highest, 1, _flat)


def bzpopmin(conn: Context, args: list[bytes]) -> Reply:
    return bzpop(conn, args, highest=False)


def bzpopmax(conn: Context, args: list[bytes]) -> Reply:
    return bzpop(conn, args, highest=True)


def bzmpop(conn: Context, args: list[bytes]) -> Reply:
    """BZMPOP timeout numkeys key [key ...] MIN|MAX [COUNT count]"""
    keys, highest, count = _mpop_args(args, 2)
    timeout = blocking.timeout(args[1])
    now = _pop_now(conn, _names(keys), highest, count, _nested)
    if now is not None and now is not _WAIT:
        return now
    return _block(conn, keys, timeout, highest, count, _nested)
