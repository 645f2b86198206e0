"""Lex ranges as Redis walks them: what ``ZRANGEBYLEX``, ``ZREVRANGEBYLEX``,
``ZLEXCOUNT``, ``ZREMRANGEBYLEX`` and ``ZRANGE ... BYLEX`` (``ZRANGESTORE``
too) read.  The commands themselves are :mod:`.sorted_sets`'; this module
owns the range (:func:`lex_range`, :class:`LexRange`) and the walk over a
board's view (:func:`start_of`, :func:`walk`), and imports no command
module.

Redis walks a lex range over the set's own order (by score, then member)
comparing members only: it is meant for sets whose members share one
score, where that order is the members' order.  It finds where the range
starts, then walks on while members stay in range.  How it finds the start
depends on the set's encoding:

* a small set (up to 128 members, Redis's ``zset-max-listpack-entries``) is
  a listpack, scanned from its first member (its last, walking backwards)
  to the first one in range (:func:`_scan`);
* a larger one is a skiplist, whose descent stops at *a* member in range
  whose predecessor is not (:func:`_descend`, a binary search: on a sorted
  sequence the same member; on a set of mixed scores Redis's own answer
  depends on the random levels of its skiplist).

Both are done here over a board's positions, on boards whose members order
by member within a score (every RESP-made board) exactly as Redis does.
Members compare as Redis compares them, bytewise (UTF-8).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rankd.frontends.resp.arguments import CommandError
from rankd.frontends.resp.limits import SCAN_WHOLE, STEP_ENTRIES

NOT_LEX = "ERR min or max not valid string range item"

#: A bound as compared: ``(0, b"")`` for ``-``, ``(1, text)``, ``(2, b"")``
#: for ``+`` (Redis's ``shared.minstring`` and ``maxstring``), and whether
#: it is exclusive.
Bound = tuple[tuple[int, bytes], bool]


def _item(word: bytes) -> Bound:
    """``zslParseLexRangeItem``: ``-``, ``+``, ``(text`` or ``[text``."""
    if word == b"-":
        return (0, b""), True
    if word == b"+":
        return (2, b""), True
    if word[:1] == b"(":
        return (1, word[1:]), True
    if word[:1] == b"[":
        return (1, word[1:]), False
    raise CommandError(NOT_LEX)


def lex_range(low: bytes, high: bytes) -> tuple[Bound, Bound]:
    """The range ``low`` to ``high`` (a ``CommandError`` as Redis's if
    either is not a range item)."""
    return _item(low), _item(high)


class LexRange:
    """A lex range's tests (``zslLexValueGteMin``, ``zslLexValueLteMax``)."""

    __slots__ = ("empty", "high", "high_ex", "low", "low_ex")

    def __init__(self, bounds: tuple[Bound, Bound]) -> None:
        (self.low, self.low_ex), (self.high, self.high_ex) = bounds
        self.empty = self.low > self.high or (self.low == self.high
                                              and (self.low_ex or self.high_ex))

    def above_low(self, member: str) -> bool:
        value = (1, member.encode())
        return value > self.low if self.low_ex else value >= self.low

    def below_high(self, member: str) -> bool:
        value = (1, member.encode())
        return value < self.high if self.high_ex else value <= self.high


def _member(view: Any, position: int, reverse: bool) -> str:
    return view.by_position(position, 1, reverse=reverse)[0][1]


def _scan(view: Any, enters: Callable[[str], bool], size: int, reverse: bool) -> int | None:
    """A listpack's start: the first position (walking ``reverse`` or not)
    whose member ``enters`` the range."""
    for position, (_, member, _) in enumerate(view.by_position(0, size, reverse=reverse)):
        if enters(member):
            return position
    return None


def _descend(view: Any, enters: Callable[[str], bool], size: int, reverse: bool) -> int:
    """A skiplist's start: a position whose member ``enters`` the range and
    whose predecessor's does not (the last position's does: checked)."""
    outside, inside = -1, size - 1
    while inside - outside > 1:
        middle = (outside + inside) // 2
        if enters(_member(view, middle, reverse)):
            inside = middle
        else:
            outside = middle
    return inside


def start_of(view: Any, bounds: LexRange, reverse: bool) -> int | None:
    """Where a walk of the range starts (a position in the walk's
    direction), or None if no member is in range (``zsl/zzlFirstInLexRange``,
    ``...LastInLexRange`` when ``reverse``)."""
    size = len(view)
    if size == 0 or bounds.empty:
        return None
    if not (bounds.above_low(_member(view, 0, True))
            and bounds.below_high(_member(view, 0, False))):
        return None
    enters, stays = ((bounds.below_high, bounds.above_low) if reverse
                     else (bounds.above_low, bounds.below_high))
    if size <= SCAN_WHOLE:
        start = _scan(view, enters, size, reverse)
    else:
        start = _descend(view, enters, size, reverse)
    if start is None or not stays(_member(view, start, reverse)):
        return None
    return start


def walk(view: Any, bounds: LexRange, reverse: bool, offset: int, limit: int,
         most: int) -> tuple[int, int]:
    """``(first, count)``: the positions (walking ``reverse`` or not) a
    lex range's walk covers, skipping ``offset``, at most ``limit`` (all if
    negative) and ``most`` + 1 (past ``most`` the caller refuses it)."""
    start = start_of(view, bounds, reverse)
    if start is None or offset < 0:  # (Redis's offset-- walks off the end)
        return 0, 0
    first = start + offset
    size = len(view)
    stays = bounds.above_low if reverse else bounds.below_high
    wanted = min(size - first, most + 1 if limit < 0 else min(limit, most + 1))
    count = 0
    while count < wanted:
        chunk = view.by_position(first + count, min(STEP_ENTRIES, wanted - count),
                                 reverse=reverse)
        for _, member, _ in chunk:
            if not stays(member):
                return first, count
            count += 1
    return first, count
