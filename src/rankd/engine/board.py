"""One leaderboard: its config and a rank index per window and period.

A :class:`Board` is state only.  Only the engine changes it: submissions
through :mod:`rankd.engine.ingest`, board changes and removals through
``Engine._apply_record``, and recovery by replaying the same records;
front-ends never touch it.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from rankd.engine.config import BoardConfig
from rankd.engine.dedupe import DedupeTable
from rankd.engine.periods import oldest_retained, period_of
from rankd.index import RankIndex, kinds

#: Serial numbers of the boards made in this process (``Board.serial``).
_serials = itertools.count(1)


class Board:
    """A board's config, indexes, labels, dedupe table and version."""

    def __init__(self, name: str, config: BoardConfig) -> None:
        self.name = name
        #: Never given to another board of this process (``id()`` is, once
        #: this one is freed): what tells a board made again from the old.
        self.serial = next(_serials)
        self.config = config
        #: window -> period id -> index; periods are added in time order.
        self.periods: dict[str, dict[str, RankIndex]] = {w: {} for w in config.windows}
        #: The name arena the indexes share (each name stored once a board),
        #: or None if the index kind keeps names per index.
        self.names = kinds.new_names()
        self.labels: dict[str, str] = {}
        self.dedupe = DedupeTable()
        #: Bumped by every change, so readers can cache by it.
        self.version = 0
        self.updated_at = 0.0
        #: When the board is deleted, ms since the epoch (see
        #: rankd.engine.expiry), or None: never.
        self.expires_at: int | None = None
        # Cleared while a snapshot copies one of this board's indexes from
        # another thread: writers wait, readers do not.
        self.writable = asyncio.Event()
        self.writable.set()

    def new_index(self) -> RankIndex:
        # The kind the daemon chose (rankd.index.kinds): the same API either way.
        cls = kinds.current()
        return cls(self.config.order, self.config.tie_break, **kinds.sharing(cls, self.names))

    def load_index(self, window: str, period: str, cls: type, dump: Any,
                   size: int | None = None, *, chunks: bool = False) -> None:
        """Put the index of ``dump`` (``cls.load``'s, or ``load_chunks``'
        with ``chunks``) in place, its names in the board's arena."""
        shared = kinds.sharing(cls, self.names)
        self.periods[window][period] = (cls.load_chunks(dump, size, **shared) if chunks
                                        else cls.load(dump, **shared))

    def index(self, window: str, period: str) -> RankIndex | None:
        """The index of a period, or ``None`` if nothing was recorded in it."""
        return self.periods[window].get(period)

    def index_for_write(self, window: str, period: str) -> RankIndex:
        """The index of a period, created empty on its first event."""
        periods = self.periods[window]
        index = periods.get(period)
        if index is None:
            # (The newest before this one: once inserted, this is the last key.)
            late = bool(periods) and period < next(reversed(periods))
            index = periods[period] = self.new_index()
            if late:
                # A late event opened an older period: keep time order.
                self.periods[window] = dict(sorted(periods.items()))
        return index

    def losses(self, config: BoardConfig, now: float) -> list[str]:
        """What adopting ``config`` would lose, for people (empty: nothing)."""
        lost = []
        for window, periods in self.periods.items():
            members = sum(len(index) for index in periods.values())
            if window not in config.windows and members:
                lost.append(f"window {window!r} and its {members} member entries")
        if config.retain < self.config.retain:
            dropped = [(w, p) for w, p in self.expired_periods(now, config.retain)
                       if w in config.windows]
            if dropped:
                lost.append(f"{len(dropped)} closed period(s) beyond retain {config.retain}")
        if config.policy != self.config.policy and any(
                len(index) for periods in self.periods.values() for index in periods.values()):
            lost.append(f"the meaning of every score (policy {self.config.policy} -> "
                        f"{config.policy})")
        return lost

    def reconfigure(self, config: BoardConfig) -> None:
        """Adopt a new config; windows added start empty, windows removed go."""
        self.periods = {w: self.periods.get(w, {}) for w in config.windows}
        self.config = config

    def expired_periods(self, now: float, retain: int | None = None
                        ) -> list[tuple[str, str]]:
        """``(window, period)`` of closed periods beyond ``retain`` (the
        config's, unless given)."""
        retain = self.config.retain if retain is None else retain
        expired = []
        for window, periods in self.periods.items():
            if window == "all":
                continue
            oldest = oldest_retained(window, now, retain)
            expired.extend((window, period) for period in sorted(periods) if period < oldest)
        return expired

    def member_counts(self, now: float) -> dict[str, int]:
        """Members in the current period of each window."""
        counts = {}
        for window in self.config.windows:
            index = self.index(window, period_of(window, now))
            counts[window] = 0 if index is None else len(index)
        return counts
