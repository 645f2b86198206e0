"""Idempotency: remember each event id's result for a while."""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from types import MappingProxyType

#: expires_at, score, previous, rank, flags; then the member's UTF-8 bytes.
_ENTRY = struct.Struct("<dddqB")
_EXPIRES = struct.Struct("<d")
_CHANGED, _HAS_SCORE, _HAS_PREVIOUS, _HAS_RANK = 1, 2, 4, 8


class DedupeTable:
    """``event_id -> (expires_at, result)`` for one board, where ``result`` is
    ``(score, rank, previous, changed, member)``: the answer a duplicate repeats.

    Entries are added in log order and all live equally long, so insertion
    order is also expiry order: expiring walks from the front and stops at
    the first live entry, with no heap and no full scan.  A plain dict keeps
    that order, and copies and iterates several times faster than an
    OrderedDict, which matters when a snapshot writes a million of them.

    A table holds every event id of the last ``dedupe_ttl`` (a day by
    default), so each entry is one ``bytes`` value, packed: about 80 bytes
    besides its key.  Nested tuples of Python objects (floats, an int, the
    member's ``str``) took about 200 bytes more per entry (recovering 1M
    members and 2M event ids peaked at 1,248 MB with them, 851 MB packed).
    Bytes are also invisible to the cyclic garbage collector.  Only a
    duplicate unpacks its entry.

    Snapshots store the packed entries as they are (:meth:`packed`,
    :meth:`load_packed`), so the entry layout is part of the snapshot format:
    changing it needs a new snapshot section kind.  They store them as two
    arrays (event ids, entries) rather than a msgpack map, whose decoder
    interns every key: for a million ids that cost a third of a second and
    an interned-string table as big as the ids.
    """

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: dict[str, bytes] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, event_id: str, now: float) -> tuple | None:
        """The remembered result of ``event_id``, unless it expired."""
        entry = self._entries.get(event_id)
        if entry is None or _EXPIRES.unpack_from(entry)[0] <= now:
            return None
        return _unpack(entry)[1]

    def remember(self, event_id: str, expires_at: float, result: Sequence) -> None:
        entries = self._entries
        entry = _pack(expires_at, result)
        # One probe of a table of millions in the common case, a new id.
        if entries.setdefault(event_id, entry) is not entry:
            del entries[event_id]  # re-insert at the end: insertion order stays expiry order
            entries[event_id] = entry

    def load(self, entries: Iterable[tuple[str, float, Sequence]]) -> None:
        """Add ``(event_id, expires_at, result)`` entries in expiry order (a snapshot's)."""
        self._entries.update({event_id: _pack(expires_at, result)
                              for event_id, expires_at, result in entries})

    def packed(self) -> Mapping[str, bytes]:
        """``event_id -> packed entry`` in expiry order, for a snapshot: a
        read-only view, which changes with the table."""
        return MappingProxyType(self._entries)

    def load_packed(self, event_ids: Sequence[str], entries: Sequence[bytes]) -> None:
        """Add :meth:`packed` entries, as a column of event ids and one of
        their entries, in expiry order (a snapshot's)."""
        if len(event_ids) != len(entries):
            raise ValueError(f"{len(event_ids)} event ids but {len(entries)} entries")
        if entries and min(map(len, entries)) <= _ENTRY.size:
            raise ValueError("a packed dedupe entry is too short")
        self._entries.update(zip(event_ids, entries, strict=True))

    def raw(self) -> dict[str, bytes]:
        """The packed entries themselves, for recovery's native replay
        (``rankd.engine._replay``), which adds entries as :meth:`remember`
        does, packed in this module's layout."""
        return self._entries

    def expire(self, now: float) -> int:
        """Forget expired entries; return how many."""
        expired = []
        expires_at = _EXPIRES.unpack_from
        for event_id, entry in self._entries.items():
            if expires_at(entry)[0] > now:
                break
            expired.append(event_id)
        for event_id in expired:
            del self._entries[event_id]
        return len(expired)

    def items(self) -> Iterator[tuple[str, float, tuple]]:
        """``(event_id, expires_at, result)`` in expiry order (do not write meanwhile)."""
        for event_id, entry in self._entries.items():
            expires_at, result = _unpack(entry)
            yield event_id, expires_at, result


def _pack(expires_at: float, result: Sequence) -> bytes:
    score, rank, previous, changed, member = result
    flags = ((_CHANGED if changed else 0) | (_HAS_SCORE if score is not None else 0)
             | (_HAS_PREVIOUS if previous is not None else 0)
             | (_HAS_RANK if rank is not None else 0))
    return _ENTRY.pack(expires_at, 0.0 if score is None else score,
                       0.0 if previous is None else previous,
                       0 if rank is None else rank, flags) + member.encode()


def _unpack(entry: bytes) -> tuple[float, tuple]:
    expires_at, score, previous, rank, flags = _ENTRY.unpack_from(entry)
    return expires_at, (score if flags & _HAS_SCORE else None,
                        rank if flags & _HAS_RANK else None,
                        previous if flags & _HAS_PREVIOUS else None,
                        bool(flags & _CHANGED),
                        entry[_ENTRY.size:].decode())

