"""Commands tools send (issue 45, item 8): ``UNLINK`` (``DEL``: a board is
deleted at once either way), ``TIME``, ``OBJECT ENCODING|FREQ`` and
``MEMORY USAGE`` (what ``redis-cli --memkeys`` and ``--bigkeys``
ask).  Their replies are Redis 7.2's; ``tests/test_resp_tooling.py``
compares them with ``redis-server``'s.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from rankd.frontends.resp import sorted_sets as zset
from rankd.frontends.resp.arguments import SYNTAX, CommandError, integer
from rankd.frontends.resp.protocol import format_double

if TYPE_CHECKING:
    from rankd.frontends.resp.context import Context

#: Members ``MEMORY USAGE`` samples by default (Redis's ``OBJ_COMPUTE_SIZE_DEF_SAMPLES``).
DEFAULT_SAMPLES = 5
#: The most members one ``MEMORY USAGE`` reads (``SAMPLES 0``: all, in Redis).
MAX_SAMPLES = 1024

LFU_ONLY = ("ERR An LFU maxmemory policy is not selected, access frequency not tracked. "
            "Please note that when switching between policies at runtime LRU and LFU data "
            "will take some time to adjust.")


def time_(conn: Context, args: list[bytes]) -> bytes:
    """TIME: seconds and microseconds of the server's clock."""
    micros = time.time_ns() // 1000
    replies = conn.replies
    return (replies.array_header(2) + replies.bulk(str(micros // 1_000_000))
            + replies.bulk(str(micros % 1_000_000)))


def _encoding(view: object) -> str:
    return view.encoding  # type: ignore[attr-defined]


def object_encoding(conn: Context, args: list[bytes]) -> bytes:
    """OBJECT ENCODING key: what Redis would hold the set as (``listpack``
    until it held more than 128 members or one of more than 64 bytes, then
    ``skiplist``, see :mod:`rankd.engine.zeros`); rankd holds
    every board in its own index either way."""
    view = _key_view(conn, args[2])
    return conn.replies.null() if view is None else conn.replies.bulk(_encoding(view))


def object_freq(conn: Context, args: list[bytes]) -> bytes:
    """OBJECT FREQ key: access frequency is kept only under an LFU
    ``maxmemory-policy``; rankd's is ``noeviction``: Redis's error."""
    if _key_view(conn, args[2]) is None:
        return conn.replies.null()
    raise CommandError(LFU_ONLY)


def memory_usage(conn: Context, args: list[bytes]) -> bytes:
    """MEMORY USAGE key [SAMPLES count]: the bytes Redis would use for the
    set, estimated as Redis does (its structures' sizes, the members
    sampled): comparable between keys, as ``redis-cli --memkeys`` uses it;
    not rankd's own memory (its index, windows and dedupe table)."""
    samples = DEFAULT_SAMPLES
    position = 3
    while position < len(args):
        if args[position].lower() == b"samples" and position + 1 < len(args):
            samples = integer(args[position + 1])
            if samples < 0:
                raise CommandError(SYNTAX)
            samples = samples or MAX_SAMPLES
            position += 2
        else:
            raise CommandError(SYNTAX)
    view = _key_view(conn, args[2])
    if view is None:
        return conn.replies.null()
    size = len(view)
    taken = view.by_position(0, min(size, samples, MAX_SAMPLES))
    key_bytes = len(args[2]) + 9 + 24  # the key's sds and its dict entry
    if _encoding(view) == "listpack":
        body = 16 + 7 + sum(len(m.encode()) + len(format_double(s)) + 4
                            for _, m, s in view.by_position(0, size))
    else:
        per_member = sum(len(m.encode()) + 9 + 24 + 48 for _, m, _ in taken) / max(1, len(taken))
        # robj, zset, zskiplist, dict, its table, the 32-level header node.
        body = 16 + 16 + 32 + 96 + 8 * _slots(size) + 560 + round(per_member * size)
    return conn.replies.integer(body + key_bytes)


def _slots(size: int) -> int:
    """The slots of a Redis dict holding ``size`` entries (a power of two)."""
    slots = 4
    while slots < size:
        slots *= 2
    return slots


def _key_view(conn: Context, key: bytes) -> object | None:
    """The view of a key that exists as Redis shows keys (not an emptied
    RESP-made board), charged by the members looked at."""
    name = zset.board_name(key)
    if name is None or not zset.is_key(conn, name):
        return None
    return conn.service.view(name, window=conn.window, period=conn.period)
