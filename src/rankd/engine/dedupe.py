"""Idempotency: remember each event id's result for a while."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence


class DedupeTable:
    """``event_id -> (expires_at, result)`` for one board.

    Entries are added in log order and all live equally long, so insertion
    order is also expiry order: expiring walks from the front and stops at
    the first live entry, with no heap and no full scan.  A plain dict keeps
    that order, and copies and iterates several times faster than an
    OrderedDict, which matters when a snapshot writes a million of them.
    """

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: dict[str, tuple[float, tuple]] = {}

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
            del entries[event_id]  # re-insert at the end: insertion order stays expiry order
        entries[event_id] = (expires_at, result)

    def load(self, entries: Iterable[tuple[str, float, Sequence]]) -> None:
        """Add ``(event_id, expires_at, result)`` entries in expiry order (a snapshot's)."""
        self._entries.update({event_id: (expires_at, tuple(result))
                              for event_id, expires_at, result in entries})

    def expire(self, now: float) -> int:
        """Forget expired entries; return how many."""
        expired = []
        for event_id, (expires_at, _) in self._entries.items():
            if expires_at > now:
                break
            expired.append(event_id)
        for event_id in expired:
            del self._entries[event_id]
        return len(expired)

    def items(self) -> Iterator[tuple[str, float, tuple]]:
        """``(event_id, expires_at, result)`` in expiry order (do not write meanwhile)."""
        for event_id, (expires_at, result) in self._entries.items():
            yield event_id, expires_at, result
