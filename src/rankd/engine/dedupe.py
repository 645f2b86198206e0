"""Idempotency: remember each event id's result for a while."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator


class DedupeTable:
    """``event_id -> (expires_at, result)`` for one board.

    Entries are added in log order, and the time-to-live is the same for
    all, so insertion order is also expiry order: expiring is popping from
    the front, O(1) per entry, no scan and no heap.  (An OrderedDict, since
    popping the front of a plain dict again and again degrades.)
    """

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: OrderedDict[str, tuple[float, tuple]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, event_id: str, now: float) -> tuple | None:
        """The remembered result of ``event_id``, unless it expired."""
        entry = self._entries.get(event_id)
        if entry is None or entry[0] <= now:
            return None
        return entry[1]

    def remember(self, event_id: str, expires_at: float, result: tuple) -> None:
        entries = self._entries
        if event_id in entries:
            entries.move_to_end(event_id)  # insertion order stays expiry order
        entries[event_id] = (expires_at, result)

    def expire(self, now: float) -> int:
        """Forget expired entries; return how many."""
        entries = self._entries
        expired = 0
        while entries:
            event_id = next(iter(entries))
            if entries[event_id][0] > now:
                break
            entries.popitem(last=False)
            expired += 1
        return expired

    def items(self) -> Iterator[tuple[str, float, tuple]]:
        for event_id, (expires_at, result) in self._entries.items():
            yield event_id, expires_at, result
