"""Idempotency: remember each event id's result for a while.

What it owns: :class:`DedupeTable`, one board's event ids of the last
``dedupe_ttl`` and the answers their retries repeat, on the compact store
(:class:`rankd.engine._idstore.FingerprintLog`, or its pure-Python twin
:class:`rankd.engine.idstore.FingerprintDict`, whose module docstrings
explain the design: keyed fingerprints of the id and of what it asked
for, 24-byte records, expiry per block of records); and
:func:`fingerprint`, a submission's content fingerprint.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence

from rankd.engine import idstore
from rankd.engine.idstore import CONFLICT, FingerprintLog

_FNV_OFFSET, _FNV_PRIME, _U64 = 0xCBF29CE484222325, 0x100000001B3, (1 << 64) - 1
_VALUE = struct.Struct("<?dB")
#: Which store this process uses: "native" or "python".
IMPLEMENTATION = idstore.IMPLEMENTATION


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


class DedupeTable:
    """``event_id -> answer`` for one board, where the answer is ``(score,
    rank, previous, changed)``: what a retry of the event repeats.

    The store (``log``) keeps fingerprints, not ids: a retry is known by
    its id's fingerprint and answered only if what it asks for (member,
    kind, value, label) fingerprints as the original did; otherwise it is
    a conflict.  Entries are added in log order and all live equally long,
    so arrival order is expiry order; an id lives until its block of
    records expires, at least ``dedupe_ttl`` (``idstore``'s docstring).

    Live ingest and replay use the native store's C entry points directly
    (``_ingest``, ``_replay``); the reference ingest, replay and snapshots
    come here.  Snapshots store the store's portable form (:meth:`log_chunks`,
    :meth:`load_store`: ``event_id_store`` sections); the forms written
    before it (``event_id_log`` chunks, columns, maps, unpacked entries)
    load through :mod:`rankd.engine.idstore`'s conversion.
    """

    __slots__ = ("log",)

    def __init__(self, log: FingerprintLog | None = None) -> None:
        self.log = FingerprintLog() if log is None else log

    def __len__(self) -> int:
        return len(self.log)

    def remembers(self, event_id: str, now: float) -> bool:
        """Whether ``event_id`` is remembered and not expired (with any payload)."""
        log = self.log
        return log.get(event_id, "", 0, now) is not None

    def get(self, event_id: str, member: str, content: int, now: float
            ) -> tuple | object | None:
        """The remembered answer of a retry of ``event_id`` for ``member`` with
        this content fingerprint; ``CONFLICT`` if the id was remembered for
        another submission; None if it is not remembered (or expired)."""
        return self.log.get(event_id, member, content, now)

    def remember(self, event_id: str, expires_at: float, answer: Sequence, member: str,
                 content: int) -> None:
        """Remember ``answer`` (``(score, rank, previous, changed)``) for
        ``event_id``, sent for ``member`` with content fingerprint ``content``."""
        self.log.put(event_id, expires_at, member, content, tuple(answer[:4]))

    def expire(self, now: float) -> int:
        """Forget expired entries; return how many."""
        return self.log.expire(now)

    def items(self) -> Iterator[tuple[int, int, bool, float, tuple]]:
        """``(id fingerprint, payload fingerprint, member_only, expires_at,
        answer)`` in expiry order (for tests and tools; do not write meanwhile)."""
        return self.log.items()

    def packed_items(self) -> list[tuple[int, int, bool, float, tuple]]:
        """:meth:`items` as a list (tests compare two tables' state by it;
        tables of the same keys only)."""
        return list(self.log.items())

    # --- snapshots -------------------------------------------------------------------

    def log_chunks(self, max_bytes: int) -> Iterator[bytes]:
        """The entries in the portable form, for ``event_id_store`` snapshot
        sections, in chunks of about ``max_bytes``; writes may go on between
        chunks (see ``FingerprintLog.log_chunks``)."""
        return self.log.log_chunks(max_bytes)

    def load_store(self, chunk: bytes) -> int:
        """Add the entries of a :meth:`log_chunks` chunk; returns how many."""
        return self.log.load_log(chunk)

    def load_log(self, chunk: bytes) -> int:
        """Add the entries of an old ``event_id_log`` chunk (event ids and
        packed entries, written until 2026-11-29), as fingerprints."""
        return idstore.load_old_chunk(self.log, chunk)

    def load_packed(self, event_ids: Sequence[str], entries: Sequence[bytes]) -> None:
        """Add old packed entries, as a column of event ids and one of their
        entries, in expiry order (the snapshots of 2026-11)."""
        if len(event_ids) != len(entries):
            raise ValueError(f"{len(event_ids)} event ids but {len(entries)} entries")
        idstore.load_old_packed(self.log, zip(event_ids, entries, strict=True))

    def load(self, entries: Iterable[tuple[str, float, Sequence]]) -> None:
        """Add ``(event_id, expires_at, result)`` entries in expiry order, where
        ``result`` is ``(score, rank, previous, changed, member[, content])``
        (the oldest snapshots' ``dedupe`` sections)."""
        idstore.load_old_entries(self.log, entries)


__all__ = ["CONFLICT", "DedupeTable", "fingerprint"]
