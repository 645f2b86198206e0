"""Redis's expiry commands on boards: ``EXPIRE``, ``PEXPIRE``, ``EXPIREAT``,
``PEXPIREAT`` (``NX|XX|GT|LT``), ``TTL``, ``PTTL``, ``EXPIRETIME``,
``PEXPIRETIME`` and ``PERSIST``.

Arguments are read and checked in Redis's order (``expireGenericCommand``:
options, then the number, then the key) with Redis's error texts, and the
replies are Redis's (the tests compare them with ``redis-server``'s).  A
board's deadline is the engine's (``Engine.expire``; see
:mod:`rankd.engine.expiry`): logged, replicated, and the board deleted by a
logged record once it passes.  A key in Redis's sense is what
:func:`.sorted_sets.is_key` says (an emptied RESP-made board is none).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rankd.engine.errors import NotFound
from rankd.engine.expiry import IF_LATER, IF_NONE, IF_SET, IF_SOONER
from rankd.frontends.resp.arguments import CommandError, integer
from rankd.frontends.resp.sorted_sets import Reply, board_name, is_key

if TYPE_CHECKING:
    from rankd.frontends.resp.context import Context

_INT64_MAX = 2**63 - 1
_INT64_MIN = -(2**63)
#: Redis's bounds on seconds before they become milliseconds (C division).
_SECONDS_MAX = _INT64_MAX // 1000
_SECONDS_MIN = -(-_INT64_MIN // 1000)
_OPTIONS = {b"nx": IF_NONE, b"xx": IF_SET, b"gt": IF_LATER, b"lt": IF_SOONER}


def _now_ms(conn: Context) -> int:
    """The engine's clock in ms (the one deadlines are compared with)."""
    return round(conn.service.engine.clock() * 1000)


def _condition(args: list[bytes]) -> int:
    """The ``NX|XX|GT|LT`` options after the key and the time."""
    condition = 0
    for word in args[3:]:
        flag = _OPTIONS.get(word.lower())
        if flag is None:
            shown = word.decode(errors="replace").replace("\r", " ").replace("\n", " ")
            raise CommandError(f"ERR Unsupported option {shown}")
        condition |= flag
    if condition & IF_NONE and condition & (IF_SET | IF_LATER | IF_SOONER):
        raise CommandError("ERR NX and XX, GT or LT options at the same time are not "
                           "compatible")
    if condition & IF_LATER and condition & IF_SOONER:
        raise CommandError("ERR GT and LT options at the same time are not compatible")
    return condition


def _expire(conn: Context, args: list[bytes], *, relative: bool,
            seconds: bool) -> Reply:
    """EXPIRE|PEXPIRE|EXPIREAT|PEXPIREAT key time [NX|XX|GT|LT]"""
    condition = _condition(args)
    when = integer(args[2])
    invalid = f"ERR invalid expire time in '{args[0].lower().decode(errors='replace')}' command"
    if seconds:
        if when > _SECONDS_MAX or when < _SECONDS_MIN:
            raise CommandError(invalid)
        when *= 1000
    base = _now_ms(conn) if relative else 0
    if when > _INT64_MAX - base:
        raise CommandError(invalid)
    deadline = when + base
    name = board_name(args[1])
    if name is None or not is_key(conn, name):
        return conn.replies.integer(0)
    return _changed(conn, name, deadline, condition, args[0])


async def _changed(conn: Context, name: str, deadline: int | None, condition: int,
                   command: bytes) -> bytes:
    """Change board ``name``'s deadline; 1 if it changed, audited as REST's
    board changes are."""
    try:
        changed = await conn.service.expire(name, deadline, condition)
    except NotFound:  # deleted meanwhile
        changed = False
    if changed and conn.principal is not None:
        conn.gate.done(conn.principal, "patch_board", conn.address, board=name,
                       command=command.lower().decode(errors="replace"),
                       expires_at_ms=deadline)
    return conn.replies.integer(int(changed))


def expire(conn: Context, args: list[bytes]) -> Reply:
    return _expire(conn, args, relative=True, seconds=True)


def pexpire(conn: Context, args: list[bytes]) -> Reply:
    return _expire(conn, args, relative=True, seconds=False)


def expireat(conn: Context, args: list[bytes]) -> Reply:
    return _expire(conn, args, relative=False, seconds=True)


def pexpireat(conn: Context, args: list[bytes]) -> Reply:
    return _expire(conn, args, relative=False, seconds=False)


def persist(conn: Context, args: list[bytes]) -> Reply:
    """PERSIST key: the board's deadline cleared; 1 if it had one."""
    name = board_name(args[1])
    if name is None or not is_key(conn, name):
        return conn.replies.integer(0)
    return _changed(conn, name, None, 0, args[0])


def _ttl(conn: Context, args: list[bytes], *, absolute: bool, seconds: bool) -> Reply:
    """TTL|PTTL|EXPIRETIME|PEXPIRETIME key: -2 without the key, -1 without
    a deadline, else the time left (or the deadline), as Redis rounds it."""
    name = board_name(args[1])
    deadline = None
    try:
        if name is None or not is_key(conn, name):
            return conn.replies.integer(-2)
        deadline = conn.service.deadline(name)
    except NotFound:
        return conn.replies.integer(-2)
    if deadline is None:
        return conn.replies.integer(-1)
    value = deadline if absolute else max(0, deadline - _now_ms(conn))
    return conn.replies.integer((value + 500) // 1000 if seconds else value)


def ttl(conn: Context, args: list[bytes]) -> Reply:
    return _ttl(conn, args, absolute=False, seconds=True)


def pttl(conn: Context, args: list[bytes]) -> Reply:
    return _ttl(conn, args, absolute=False, seconds=False)


def expiretime(conn: Context, args: list[bytes]) -> Reply:
    return _ttl(conn, args, absolute=True, seconds=True)


def pexpiretime(conn: Context, args: list[bytes]) -> Reply:
    return _ttl(conn, args, absolute=True, seconds=False)

