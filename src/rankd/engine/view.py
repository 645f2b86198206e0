"""A board's window read as a sorted set, in Redis's order.

Redis numbers a sorted set's members from 0 at the lowest score (``ZRANK``,
``ZRANGE``) and reverses that order for ``ZREVRANK`` and ``ZREVRANGE``.  A
rankd board ranks from its best member (rank 1), best meaning highest on a
``desc`` board and lowest on an ``asc`` one.  :class:`SortedView` maps the
one onto the other, so a front-end speaking Redis never needs to know the
board's order, nor touch its index:

* on an ``asc`` board, position ``p`` is rank ``p + 1``: Redis's order
  exactly when ties are broken by member (``member``: what RESP made
  boards with before);
* on a ``desc`` board, position ``p`` is rank ``n - p``: the reverse of
  the board's ranking, so ``ZREVRANK`` and ``ZREVRANGE`` give the board's
  own leaderboard (with its own tie order) from position 0: Redis's order
  exactly when ties are broken by member from Z to A (``member_desc``:
  what RESP makes boards with now, ranked as ``ZREVRANGE`` lists them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from rankd.engine import zeros

#: ``(rank, member, score)`` as the index gives them.
Entry = tuple[int, str, float]


class SortedView:
    """Read-only positional access to one window (and period) of a board."""

    __slots__ = ("_ascending", "_index")

    def __init__(self, index: Any, ascending: bool) -> None:
        #: The window's rank index, or None while the period has no members.
        self._index = index
        self._ascending = ascending

    def __len__(self) -> int:
        return 0 if self._index is None else len(self._index)

    @property
    def encoding(self) -> str:
        """What Redis would hold the window's set as (``OBJECT ENCODING``:
        ``listpack`` or ``skiplist``, see :mod:`rankd.engine.zeros`)."""
        return zeros.encoding(self._index)

    def score(self, member: str) -> float | None:
        """``member``'s score, or None if absent (so is a member no index can
        hold: empty, or too long)."""
        if self._index is None:
            return None
        try:
            return self._index.score(member)
        except ValueError:  # (the index refuses it: it holds no such member)
            return None

    def picked(self, choose: Callable[[SortedView], Iterable[str]]) -> dict[str, float]:
        """The members ``choose`` picks from this view that it holds, with
        their scores, in the order picked (what a removal removes)."""
        chosen = {}
        for member in choose(self):
            score = self.score(member)
            if score is not None:
                chosen[member] = score
        return chosen

    def position(self, member: str, *, reverse: bool = False) -> int | None:
        """The member's 0-based position from the lowest score (``ZRANK``),
        or from the highest with ``reverse`` (``ZREVRANK``); None if absent."""
        if self._index is None:
            return None
        try:
            rank = self._index.rank(member)
        except ValueError:  # (as in :meth:`score`)
            return None
        if rank is None:
            return None
        from_best = rank - 1
        return from_best if self._ascending != reverse else len(self._index) - rank

    def by_position(self, start: int, count: int, *, reverse: bool = False) -> list[Entry]:
        """``count`` entries from position ``start`` (both already in range),
        lowest score first, or highest first with ``reverse``."""
        if self._index is None or count <= 0:
            return []
        return self._index.range_by_rank(start, count, reverse=self._ascending == reverse)

    def by_score(self, low: float, high: float, *, low_exclusive: bool = False,
                 high_exclusive: bool = False, offset: int = 0, limit: int | None = None,
                 reverse: bool = False) -> list[Entry]:
        """Entries scored between ``low`` and ``high``, lowest first (highest
        with ``reverse``), skipping ``offset``, at most ``limit``."""
        if self._index is None:
            return []
        return self._index.range_by_score(
            low, high, low_exclusive=low_exclusive, high_exclusive=high_exclusive,
            offset=offset, limit=limit, reverse=self._ascending == reverse)

    def count(self, low: float, high: float, *, low_exclusive: bool = False,
              high_exclusive: bool = False) -> int:
        if self._index is None:
            return 0
        return self._index.count(low, high, low_exclusive=low_exclusive,
                                 high_exclusive=high_exclusive)
