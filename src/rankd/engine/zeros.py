"""Which zero a board stores: ``-0`` kept as a Redis sorted set keeps it.

Redis 7.2 keeps a score of ``-0`` only in a set encoded as a skiplist; a
listpack stores every integral score as an integer, ``-0`` as ``0``
(``zzlInsertAt``: ``double2ll``).  A set is a listpack until it holds more
than ``zset-max-listpack-entries`` (128) members or takes a member longer
than ``zset-max-listpack-value`` (64 bytes), and converts *before* the
insert that passes a limit (so that member keeps its ``-0``, the members
before it lost theirs).  It then stays a skiplist, however small it gets,
until the key is deleted (emptied), a store command writes it (converted
back if small: ``zsetConvertToListpackIfNeeded``) or the server restarts
(the encoding is decided afresh from the size at load, and a listpack
loses its ``-0`` then).

This module owns that rule for the boards RESP makes
(:data:`REDIS_CONFIGS`); every other board stores one zero, ``0``.  A
board's index counts its high-water marks (``RankIndex.peaks``: length
and longest member since it was made, emptied or reset), which is all the
encoding state there is: :func:`encoding` reads it, :func:`stored_zero`
decides the sign of a ``-0`` a write would store, and
:func:`settle_after_load` is the restart.  The native write paths hand
every ``-0`` they are given to the Python ingest (``ingest.ingest_one``),
which asks :func:`stored_zero`; nothing else produces a ``-0`` (a sum of
two numbers of other signs is ``+0``).
"""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING, Any

from rankd.engine.config import BoardConfig

if TYPE_CHECKING:
    from rankd.engine.board import Board

#: Redis's ``zset-max-listpack-entries`` and ``zset-max-listpack-value``.
LISTPACK_ENTRIES = 128
LISTPACK_VALUE = 64

#: The config of boards made through RESP: highest score first, ties by
#: member Z to A (Redis's ``ZREVRANGE``), each write replacing the score.
REDIS_BOARD = BoardConfig(order="desc", policy="latest", tie_break="member_desc",
                          windows=("all",))
#: The config RESP made boards with before (lowest first): kept, not migrated.
LEGACY_REDIS_BOARD = BoardConfig(order="asc", policy="latest", tie_break="member",
                                 windows=("all",))
#: Boards that keep ``-0`` as Redis does.
REDIS_CONFIGS = (REDIS_BOARD, LEGACY_REDIS_BOARD)


def is_negative_zero(value: float) -> bool:
    """Whether ``value`` is ``-0.0``."""
    return value == 0.0 and math.copysign(1.0, value) < 0


def skiplist(peaks: tuple[int, int]) -> bool:
    """Whether high-water marks ``(length, member bytes)`` made a Redis set a skiplist."""
    return peaks[0] > LISTPACK_ENTRIES or peaks[1] > LISTPACK_VALUE


def encoding(index: Any) -> str:
    """What ``OBJECT ENCODING`` answers for a board's index."""
    return "skiplist" if index is not None and skiplist(index.peaks) else "listpack"


def stored_zero(config: BoardConfig, index: Any, member: str, new_member: bool) -> float:
    """The zero a write of ``-0.0`` stores for ``member`` (``new_member``:
    it is not on the board yet): ``-0.0`` on a Redis board that is, or
    becomes with this insert, a skiplist; else ``0.0``."""
    if config not in REDIS_CONFIGS:
        return 0.0
    length, member_bytes = (0, 0) if index is None else index.peaks
    if new_member:
        length = max(length, (0 if index is None else len(index)) + 1)
        member_bytes = max(member_bytes, len(member.encode()))
    return -0.0 if skiplist((length, member_bytes)) else 0.0


def shown(answer: dict[str, Any]) -> dict[str, Any]:
    """A write's answer as REST and TCP show it (changed in place,
    returned): a stored ``-0`` score (and previous score) is ``0``, as their
    reads show it.  RESP reads the answer raw: ``ZINCRBY`` adds to the
    previous score's sign as Redis does."""
    if answer.get("score") == 0.0:
        answer["score"] = 0.0
    if answer.get("previous") == 0.0:
        answer["previous"] = 0.0
    return answer


def settle_after_load(boards: dict[str, Board]) -> int:
    """Decide every Redis board's encoding afresh from what it holds, as
    Redis does when it loads a dump: a board of at most 128 members of at
    most 64 bytes is a listpack again and its ``-0`` scores become ``0``.
    Returns how many scores changed.  Boards of more members are skiplists
    whatever their history, so only the small ones are read."""
    changed = 0
    for board in boards.values():
        if board.config not in REDIS_CONFIGS:
            continue
        for index in (i for periods in board.periods.values() for i in periods.values()):
            if len(index) <= LISTPACK_ENTRIES:
                index.reset_peaks()
                if not skiplist(index.peaks):
                    changed += index.positive_zeros()
    return changed


def store_zeros(result: dict[str, float], range_by: str | None = None) -> dict[str, float]:
    """``result``, the members and scores a store command writes to a
    Redis board, with the zeros Redis keeps (changed in place, returned).

    ``ZUNIONSTORE``, ``ZINTERSTORE`` and ``ZDIFFSTORE`` (``range_by``
    None) build a skiplist and convert it to a listpack if the result is
    small (``zsetConvertToListpackIfNeeded``).  ``ZRANGESTORE`` (``range_by``
    ``"rank"``, ``"score"`` or ``"lex"``) makes the set for the range's
    length (``zsetTypeCreate``: unknown, so 0, by score or lex, as 7.2.5
    on; 7.2.4 made those a skiplist, reading -1 as a huge size) and adds
    the members in the range's order, converting as ``ZADD`` does, so the
    members added while it was a listpack (at most 128) lose their ``-0``.
    """
    if range_by is None:
        if len(result) <= LISTPACK_ENTRIES and all(
                len(member.encode()) <= LISTPACK_VALUE for member in result):
            for member, value in result.items():
                if value == 0.0:
                    result[member] = 0.0
        return result
    if range_by == "rank" and len(result) > LISTPACK_ENTRIES:
        return result
    for member in itertools.islice(result, LISTPACK_ENTRIES):
        if len(member.encode()) > LISTPACK_VALUE:
            break  # a skiplist from this member on
        if result[member] == 0.0:
            result[member] = 0.0
    return result
