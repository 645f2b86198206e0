"""Idempotency: remember each event id's result for a while."""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence

from rankd._native import native_or

#: expires_at, score, previous, rank, flags; then (flagged) the content
#: fingerprint, and the member's UTF-8 bytes.
_ENTRY = struct.Struct("<dddqB")
_EXPIRES = struct.Struct("<d")
_FINGERPRINT = struct.Struct("<Q")
_CHANGED, _HAS_SCORE, _HAS_PREVIOUS, _HAS_RANK, _HAS_FINGERPRINT = 1, 2, 4, 8, 16
_FNV_OFFSET, _FNV_PRIME, _U64 = 0xCBF29CE484222325, 0x100000001B3, (1 << 64) - 1
_VALUE = struct.Struct("<?dB")


def fingerprint(is_delta: bool, value: float, label: str | None) -> int:
    """What a submission asked for besides its member, as a 64-bit FNV-1a
    hash: whether ``value`` is a delta, the value, the label.  An event id
    sent again with another fingerprint (or member) is a conflict, not a
    retry.  ``rankd.engine._packing.content_fingerprint`` is the native twin."""
    data = _VALUE.pack(is_delta, value, label is not None)
    if label is not None:
        data += label.encode()
    h = _FNV_OFFSET
    for byte in data:
        h = ((h ^ byte) * _FNV_PRIME) & _U64
    return h
#: The portable log form of a snapshot: per entry, the event id's and the
#: entry's sizes, then their bytes.
_CHUNK_HEADER = struct.Struct("<HH")
_MAX_FIELD = 0xFFFF


class DictLog:
    """``event id -> packed entry`` in arrival order: the pure-Python twin
    of ``rankd.engine._dedupe.PackedLog`` (whose docstring explains the
    design), on a dict, which keeps insertion order.

    An entry is a packed result whose first 8 bytes are its expiry time.
    """

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: dict[str, bytes] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, event_id: str) -> bytes | None:
        """The packed entry remembered for ``event_id``, or ``None``."""
        return self._entries.get(event_id)

    def put(self, event_id: str, entry: bytes) -> None:
        """Remember ``entry`` for ``event_id``, last in expiry order."""
        size = len(event_id.encode())
        if not 0 < size <= _MAX_FIELD:
            raise ValueError(f"an event id must be 1 to {_MAX_FIELD} bytes, got {size}")
        if not _ENTRY.size <= len(entry) <= _MAX_FIELD:
            raise ValueError(f"a packed dedupe entry must be {_ENTRY.size} to {_MAX_FIELD} "
                             f"bytes, got {len(entry)}")
        entries = self._entries
        if entries.setdefault(event_id, entry) is not entry:
            del entries[event_id]  # re-inserted at the end: insertion order stays expiry order
            entries[event_id] = entry

    def expire(self, now: float) -> int:
        """Forget the entries from the front that expire at or before
        ``now``; stop at the first live one.  Returns how many."""
        expired = []
        expires_at = _EXPIRES.unpack_from
        for event_id, entry in self._entries.items():
            if expires_at(entry)[0] > now:
                break
            expired.append(event_id)
        for event_id in expired:
            del self._entries[event_id]
        return len(expired)

    def items(self) -> Iterator[tuple[str, bytes]]:
        """``(event_id, entry)`` in expiry order; the table must not change meanwhile."""
        return iter(self._entries.items())

    def log_chunks(self, max_bytes: int) -> Iterator[bytes]:
        """The entries in the portable log form, in chunks of about
        ``max_bytes``, oldest first.  The table may change between chunks:
        they hold the entries remembered when the first one was taken, less
        those expired or remembered again since; nothing remembered later."""
        parts: list[bytes] = []
        size = 0
        entries = self._entries
        for event_id, entry in list(entries.items()):
            if entries.get(event_id) is not entry:
                continue  # forgotten, or remembered again, since
            data = event_id.encode()
            parts += (_CHUNK_HEADER.pack(len(data), len(entry)), data, entry)
            size += _CHUNK_HEADER.size + len(data) + len(entry)
            if size >= max_bytes:
                yield b"".join(parts)
                parts, size = [], 0
        if parts:
            yield b"".join(parts)

    def load_log(self, chunk: bytes) -> int:
        """Remember the entries of a :meth:`log_chunks` chunk, in order.  A
        malformed chunk raises ``ValueError`` and changes nothing."""
        pairs = []
        offset = 0
        while offset < len(chunk):
            if len(chunk) - offset < _CHUNK_HEADER.size:
                raise ValueError("a dedupe log chunk ends inside an entry header")
            id_size, entry_size = _CHUNK_HEADER.unpack_from(chunk, offset)
            if id_size == 0 or entry_size < _ENTRY.size:
                raise ValueError("a dedupe log chunk holds an empty event id or an entry "
                                 "too short to hold a result")
            offset += _CHUNK_HEADER.size
            event_id = chunk[offset:offset + id_size]
            entry = chunk[offset + id_size:offset + id_size + entry_size]
            offset += id_size + entry_size
            if offset > len(chunk):
                raise ValueError("a dedupe log chunk ends inside an entry")
            pairs.append((event_id.decode(), entry))
        for event_id, entry in pairs:
            self.put(event_id, entry)
        return len(pairs)


PackedLog, IMPLEMENTATION = native_or("rankd.engine._dedupe", "PackedLog", DictLog)


class DedupeTable:
    """``event_id -> (expires_at, result)`` for one board, where ``result`` is
    ``(score, rank, previous, changed, member)``: the answer a duplicate repeats.

    Entries are added in log order and all live equally long, so insertion
    order is also expiry order: expiring walks from the front and stops at
    the first live entry, with no heap and no full scan.

    A table holds every event id of the last ``dedupe_ttl`` (a day by
    default), millions on a busy board, and nearly every submission asks
    about an id it has never seen; so the store (``log``: the native
    ``PackedLog``, or ``DictLog``) keeps each result packed in bytes next to
    its id, and only a duplicate unpacks its entry.  Live ingest and replay
    use the native store's C entry points directly.

    Snapshots store the store's portable log form (:meth:`log_chunks`,
    :meth:`load_log`), whose entries are the packed results as they are, so
    the entry layout is part of the snapshot format: changing it needs a
    new snapshot section kind.
    """

    __slots__ = ("log",)

    def __init__(self, log: PackedLog | None = None) -> None:
        self.log = PackedLog() if log is None else log

    def __len__(self) -> int:
        return len(self.log)

    def get(self, event_id: str, now: float) -> tuple | None:
        """The remembered result of ``event_id``, unless it expired."""
        entry = self.log.get(event_id)
        if entry is None or _EXPIRES.unpack_from(entry)[0] <= now:
            return None
        return _unpack(entry)[1]

    def remember(self, event_id: str, expires_at: float, result: Sequence,
                 content: int | None = None) -> None:
        """``result`` is ``(score, rank, previous, changed, member)``;
        ``content`` its submission's :func:`fingerprint`."""
        self.log.put(event_id, _pack(expires_at, result, content))

    def load(self, entries: Iterable[tuple[str, float, Sequence]]) -> None:
        """Add ``(event_id, expires_at, result)`` entries in expiry order (a
        snapshot's; a result may end with its content fingerprint)."""
        for event_id, expires_at, result in entries:
            self.remember(event_id, expires_at, result[:5], (*result, None)[5])

    def load_packed(self, event_ids: Sequence[str], entries: Sequence[bytes]) -> None:
        """Add packed entries, as a column of event ids and one of their
        entries, in expiry order (the snapshots of 2026-11)."""
        if len(event_ids) != len(entries):
            raise ValueError(f"{len(event_ids)} event ids but {len(entries)} entries")
        if entries and min(map(len, entries)) <= _ENTRY.size:
            raise ValueError("a packed dedupe entry is too short")
        for event_id, entry in zip(event_ids, entries, strict=True):
            self.log.put(event_id, entry)

    def log_chunks(self, max_bytes: int) -> Iterator[bytes]:
        """The entries in the portable log form, for a snapshot, in chunks of
        about ``max_bytes``; writes may go on between chunks (see
        ``DictLog.log_chunks``)."""
        return self.log.log_chunks(max_bytes)

    def load_log(self, chunk: bytes) -> int:
        """Add the entries of a :meth:`log_chunks` chunk; returns how many."""
        return self.log.load_log(chunk)

    def packed_items(self) -> list[tuple[str, bytes]]:
        """``(event_id, packed entry)`` in expiry order (for tests and tools)."""
        return list(self.log.items())

    def expire(self, now: float) -> int:
        """Forget expired entries; return how many."""
        return self.log.expire(now)

    def items(self) -> Iterator[tuple[str, float, tuple]]:
        """``(event_id, expires_at, result)`` in expiry order (do not write meanwhile)."""
        for event_id, entry in self.log.items():
            expires_at, result = _unpack(entry)
            yield event_id, expires_at, result


def _pack(expires_at: float, result: Sequence, content: int | None = None) -> bytes:
    score, rank, previous, changed, member = result[:5]
    flags = ((_CHANGED if changed else 0) | (_HAS_SCORE if score is not None else 0)
             | (_HAS_PREVIOUS if previous is not None else 0)
             | (_HAS_RANK if rank is not None else 0)
             | (_HAS_FINGERPRINT if content is not None else 0))
    header = _ENTRY.pack(expires_at, 0.0 if score is None else score,
                         0.0 if previous is None else previous,
                         0 if rank is None else rank, flags)
    if content is not None:
        header += _FINGERPRINT.pack(content)
    return header + member.encode()


def _unpack(entry: bytes) -> tuple[float, tuple]:
    """``(expires_at, (score, rank, previous, changed, member, fingerprint))``;
    the fingerprint is None in entries written before there was one."""
    expires_at, score, previous, rank, flags = _ENTRY.unpack_from(entry)
    start = _ENTRY.size
    content = None
    if flags & _HAS_FINGERPRINT:
        (content,) = _FINGERPRINT.unpack_from(entry, start)
        start += _FINGERPRINT.size
    return expires_at, (score if flags & _HAS_SCORE else None,
                        rank if flags & _HAS_RANK else None,
                        previous if flags & _HAS_PREVIOUS else None,
                        bool(flags & _CHANGED),
                        entry[start:].decode(), content)

