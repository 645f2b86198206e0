"""The compact event-id store's pure-Python twin, and old snapshots' conversion.

What it owns: :class:`FingerprintDict`, which answers as
:class:`rankd.engine._idstore.FingerprintLog` does (that module's docstring
explains the design: 56-bit keyed id fingerprints, 32-bit payload
fingerprints, compact answers, expiry per block of ``BLOCK`` records) on a
dict kept in arrival order, and writes and reads the same portable
snapshot form; :func:`load_old_chunk`, which turns a chunk of the old
``PackedLog``/``DictLog`` form (event ids and packed entries, which the
daemon wrote until 2026-11-29; :func:`read_old_chunk`) into fingerprints
in either store.

The fingerprints are SipHash-1-3, as the native store computes them (in
pure Python here: slow, but only the fallback runs it).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Iterator, Sequence

from rankd._native import native_or

#: log2 of the records per expiry time (the native store's; tests change it).
BLOCK_BITS = 10
CHANGED, HAS_SCORE, HAS_PREVIOUS, HAS_RANK, MEMBER_ONLY = 1, 2, 4, 8, 64
PORTABLE_FLAGS = CHANGED | HAS_SCORE | HAS_PREVIOUS | HAS_RANK | MEMBER_ONLY
#: The portable form: a chunk head (magic, the keys), then per entry the id
#: fingerprint, the payload fingerprint, flags, the expiry, score, previous, rank.
CHUNK_HEAD = struct.Struct("<4sQQ")
PORTABLE = struct.Struct("<QIBdddQ")
_MAGIC = b"RKI1"
_PAYLOAD_KEY = 0x21646167C6F6170
_U64 = (1 << 64) - 1
_CONTENT = struct.Struct("<Q")
_SIZE = struct.Struct("<I")
MAX_FIELD = 0xFFFF
#: The old form (``PackedLog``/``DictLog``, until 2026-11-29): per entry in a
#: chunk, the id's and entry's sizes; an entry is expires_at, score,
#: previous, rank, flags, then (flagged) the content fingerprint and the member.
_OLD_CHUNK_HEADER = struct.Struct("<HH")
_OLD_ENTRY = struct.Struct("<dddqB")
_OLD_HAS_FINGERPRINT = 16
#: For tests: the keys of tables made from now on (None: random; see ``_set_test_key``).
_test_key: bytes | None = None


def _set_test_key(key: bytes | None) -> None:
    """For tests: tables made from now on take the 16-byte ``key`` (None: a
    random one each), so that two tables built side by side agree."""
    global _test_key
    if key is not None and len(key) != 16:
        raise ValueError("a fingerprint key is 16 bytes")
    _test_key = key


class Conflict:
    """What ``get`` answers for a remembered id sent with another payload."""

    def __repr__(self) -> str:
        return "CONFLICT"


def _sipround(v0: int, v1: int, v2: int, v3: int) -> tuple[int, int, int, int]:
    """One SipRound, its rotations written out (the fallback's hot loop)."""
    m = _U64
    v0 = (v0 + v1) & m
    v1 = (((v1 << 13) | (v1 >> 51)) & m) ^ v0
    v0 = ((v0 << 32) | (v0 >> 32)) & m
    v2 = (v2 + v3) & m
    v3 = (((v3 << 16) | (v3 >> 48)) & m) ^ v2
    v0 = (v0 + v3) & m
    v3 = (((v3 << 21) | (v3 >> 43)) & m) ^ v0
    v2 = (v2 + v1) & m
    v1 = (((v1 << 17) | (v1 >> 47)) & m) ^ v2
    v2 = ((v2 << 32) | (v2 >> 32)) & m
    return v0, v1, v2, v3


def siphash13(k0: int, k1: int, data: bytes) -> int:
    """SipHash-1-3 of ``data`` under the key ``(k0, k1)`` (``rk_siphash13``)."""
    v0, v1 = k0 ^ 0x736F6D6570736575, k1 ^ 0x646F72616E646F6D
    v2, v3 = k0 ^ 0x6C7967656E657261, k1 ^ 0x7465646279746573
    end = len(data) - len(data) % 8
    words = struct.unpack_from(f"<{end // 8}Q", data) if end else ()
    for word in words:
        v3 ^= word
        v0, v1, v2, v3 = _sipround(v0, v1, v2, v3)
        v0 ^= word
    b = ((len(data) & 0xFF) << 56) | int.from_bytes(data[end:], "little")
    v3 ^= b
    v0, v1, v2, v3 = _sipround(v0, v1, v2, v3)
    v0 ^= b
    v2 ^= 0xFF
    for _ in range(3):
        v0, v1, v2, v3 = _sipround(v0, v1, v2, v3)
    return v0 ^ v1 ^ v2 ^ v3


def payload_bytes(member: str, content: int | None) -> bytes:
    """What the payload fingerprint hashes: the member's size and bytes, then
    (unless None) the submission's content fingerprint
    (``rankd.engine.dedupe.fingerprint``: its kind, value and label)."""
    data = member.encode()
    data = _SIZE.pack(len(data)) + data
    return data if content is None else data + _CONTENT.pack(content)


class FingerprintDict:
    """``id fingerprint -> remembered answer`` in arrival order (see the module
    docstring): the pure-Python twin of ``FingerprintLog``."""

    __slots__ = ("_bits", "_blocks", "_entries", "_head_block", "_last", "_seq", "k0", "k1")

    def __init__(self) -> None:
        key = os.urandom(16) if _test_key is None else _test_key
        self.k0 = int.from_bytes(key[:8], "little")
        self.k1 = int.from_bytes(key[8:], "little")
        #: fingerprint -> (payload, flags, sequence number, answer)
        self._entries: dict[int, tuple[int, int, int, tuple]] = {}
        self._blocks: dict[int, float] = {}  # block number -> its latest expiry
        self._seq = 0
        self._bits = BLOCK_BITS
        self._head_block = 0  # the oldest block kept
        # The last id fingerprinted, and its fingerprint: ingest asks about
        # an id, then remembers it (one SipHash in Python, not two).
        self._last: tuple[str, int] | None = None

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def key(self) -> bytes:
        """The fingerprint keys, 16 bytes."""
        return self.k0.to_bytes(8, "little") + self.k1.to_bytes(8, "little")

    def id_fingerprint(self, event_id: str) -> int:
        """``event_id``'s 56-bit fingerprint."""
        last = self._last
        if last is not None and last[0] == event_id:
            return last[1]
        fp = siphash13(self.k0, self.k1, event_id.encode()) >> 8
        self._last = (event_id, fp)
        return fp

    def payload_fingerprint(self, member: str, content: int | None = None) -> int:
        """The 32-bit fingerprint of what a submission asked for: its member
        and content fingerprint (None: the member alone, for entries of old
        snapshots written before there was one)."""
        data = payload_bytes(member, content)
        return siphash13(self.k0 ^ _PAYLOAD_KEY, self.k1, data) & 0xFFFFFFFF

    def get(self, event_id: str, member: str, content: int,
            now: float) -> tuple | Conflict | None:
        """``(score, rank, previous, changed)`` remembered for a retry of
        ``event_id`` with this payload (``content``: its
        ``dedupe.fingerprint``); ``CONFLICT`` if it was remembered with
        another; None if it is not remembered (or expired)."""
        found = self._entries.get(self.id_fingerprint(event_id))
        if found is None or self._blocks[found[2] >> self._bits] <= now:
            return None
        payload, flags, _, answer = found
        expected = self.payload_fingerprint(member, None if flags & MEMBER_ONLY else content)
        return answer if expected == payload else CONFLICT

    def put(self, event_id: str, expires_at: float, member: str, content: int,
            answer: tuple) -> None:
        """Remember ``answer`` (``(score, rank, previous, changed)``) for
        ``event_id`` and its payload, last in expiry order."""
        size = len(event_id.encode())
        if not 0 < size <= MAX_FIELD:
            raise ValueError(f"an event id must be 1 to {MAX_FIELD} bytes, got {size}")
        self.put_fingerprint(self.id_fingerprint(event_id),
                             self.payload_fingerprint(member, content),
                             expires_at, answer)

    def put_fingerprint(self, fp: int, payload: int, expires_at: float, answer: tuple,
                        member_only: bool = False) -> None:
        """Remember ``answer`` for an id known by its fingerprint."""
        score, rank, previous, changed = answer
        if not 0 <= fp < 1 << 56 or not 0 <= payload < 1 << 32:
            raise ValueError("an id fingerprint has 56 bits, a payload fingerprint 32")
        if rank is not None and not 0 <= rank < 1 << 64:
            raise ValueError(f"a rank must be 0 to 2**64 - 1, got {rank}")
        flags = ((CHANGED if changed else 0) | (HAS_SCORE if score is not None else 0)
                 | (HAS_PREVIOUS if previous is not None else 0)
                 | (HAS_RANK if rank is not None else 0) | (MEMBER_ONLY if member_only else 0))
        answer = (None if score is None else float(score), rank,
                  None if previous is None else float(previous), bool(changed))
        block = self._seq >> self._bits
        if self._seq & ((1 << self._bits) - 1) == 0 or self._blocks[block] < expires_at:
            self._blocks[block] = expires_at
        self._entries.pop(fp, None)  # (re-inserted at the end: arrival order)
        self._entries[fp] = (payload, flags, self._seq, answer)
        self._seq += 1

    def expire(self, now: float) -> int:
        """Forget the blocks from the front whose time is at or before
        ``now``; stop at the first live one (a block of superseded entries
        only counts too, as in the native store).  Returns how many ids
        were forgotten."""
        bits, blocks, entries = self._bits, self._blocks, self._entries
        last = (self._seq - 1) >> bits  # the newest entry's block
        expired = 0
        while self._head_block <= last and blocks[self._head_block] <= now:
            end = (self._head_block + 1) << bits
            dropped = []
            for fp, (_, _, seq, _) in entries.items():
                if seq >= end:
                    break
                dropped.append(fp)
            for fp in dropped:
                del entries[fp]
            expired += len(dropped)
            if end > self._seq:
                break  # the block being filled: emptied, it takes the next entries
            del blocks[self._head_block]
            self._head_block += 1
        return expired

    def items(self) -> Iterator[tuple[int, int, bool, float, tuple]]:
        """``(fingerprint, payload, member_only, expires_at, answer)`` in
        expiry order; the table must not change meanwhile."""
        for fp, (payload, flags, seq, answer) in self._entries.items():
            yield fp, payload, bool(flags & MEMBER_ONLY), self._blocks[seq >> self._bits], answer

    def log_chunks(self, max_bytes: int) -> Iterator[bytes]:
        """The entries in the portable form, in chunks of about ``max_bytes``,
        oldest first (the table may change between chunks, as in
        ``FingerprintLog.log_chunks``)."""
        per_chunk = max(1, (max_bytes - CHUNK_HEAD.size) // PORTABLE.size)
        head = CHUNK_HEAD.pack(_MAGIC, self.k0, self.k1)
        entries = self._entries
        taken = list(entries.items())
        for start in range(0, len(taken), per_chunk):
            parts = [head]
            for fp, entry in taken[start:start + per_chunk]:
                if entries.get(fp) is not entry:
                    continue  # forgotten, or remembered again, since
                payload, flags, seq, (score, rank, previous, _) = entry
                parts.append(PORTABLE.pack(fp, payload, flags, self._blocks[seq >> self._bits],
                                           score or 0.0, previous or 0.0, rank or 0))
            if len(parts) > 1:
                yield b"".join(parts)

    def load_log(self, chunk: bytes) -> int:
        """Remember the entries of a portable chunk, in order; an empty table
        adopts the chunk's keys.  A malformed chunk (or one of other keys
        into a table that holds entries) raises ``ValueError`` and changes
        nothing.  Returns how many entries it held."""
        entries = check_chunk(chunk, self.k0, self.k1, not self._entries)
        if entries:
            _, self.k0, self.k1 = CHUNK_HEAD.unpack_from(chunk)
            self._last = None  # (of the old keys)
        for fp, payload, flags, expires_at, score, previous, rank in entries:
            self.put_fingerprint(fp, payload, expires_at, (
                score if flags & HAS_SCORE else None, rank if flags & HAS_RANK else None,
                previous if flags & HAS_PREVIOUS else None, flags & CHANGED),
                bool(flags & MEMBER_ONLY))
        return len(entries)


def check_chunk(chunk: bytes, k0: int, k1: int, adopt: bool) -> list[tuple]:
    """The entries of a portable chunk, checked (``ValueError`` if malformed,
    or of other keys unless ``adopt``)."""
    if len(chunk) < CHUNK_HEAD.size or (len(chunk) - CHUNK_HEAD.size) % PORTABLE.size:
        raise ValueError("an event-id store chunk has a bad size")
    magic, c0, c1 = CHUNK_HEAD.unpack_from(chunk)
    if magic != _MAGIC:
        raise ValueError("not an event-id store chunk")
    if not adopt and (c0, c1) != (k0, k1):
        raise ValueError("an event-id store chunk of other fingerprint keys")
    entries = list(PORTABLE.iter_unpack(memoryview(chunk)[CHUNK_HEAD.size:]))
    for entry in entries:
        if entry[0] >> 56 or entry[2] & ~PORTABLE_FLAGS:
            raise ValueError("an event-id store chunk holds a malformed entry")
    return entries


def read_old_chunk(chunk: bytes) -> list[tuple[str, bytes]]:
    """The ``(event id, packed entry)`` pairs of a chunk of the old portable
    form (``event_id_log`` sections, written until 2026-11-29: per entry
    the id's and the entry's sizes as two u16, then their bytes), all
    checked before any is returned (``ValueError`` if malformed)."""
    pairs = []
    offset = 0
    while offset < len(chunk):
        if len(chunk) - offset < _OLD_CHUNK_HEADER.size:
            raise ValueError("a dedupe log chunk ends inside an entry header")
        id_size, entry_size = _OLD_CHUNK_HEADER.unpack_from(chunk, offset)
        if id_size == 0 or entry_size < _OLD_ENTRY.size:
            raise ValueError("a dedupe log chunk holds an empty event id or an entry "
                             "too short to hold a result")
        offset += _OLD_CHUNK_HEADER.size
        event_id = chunk[offset:offset + id_size]
        entry = chunk[offset + id_size:offset + id_size + entry_size]
        offset += id_size + entry_size
        if offset > len(chunk):
            raise ValueError("a dedupe log chunk ends inside an entry")
        pairs.append((event_id.decode(), entry))
    return pairs


def unpack_old_entry(entry: bytes) -> tuple[float, tuple]:
    """An old packed entry as ``(expires_at, (score, rank, previous, changed,
    member, content))``; ``content`` (the submission's content fingerprint)
    is None in entries written before there was one."""
    if len(entry) < _OLD_ENTRY.size:
        raise ValueError("a packed dedupe entry is too short")
    expires_at, score, previous, rank, flags = _OLD_ENTRY.unpack_from(entry)
    start = _OLD_ENTRY.size
    content = None
    if flags & _OLD_HAS_FINGERPRINT:
        (content,) = _CONTENT.unpack_from(entry, start)
        start += _CONTENT.size
    return expires_at, (score if flags & HAS_SCORE else None,
                        rank if flags & HAS_RANK else None,
                        previous if flags & HAS_PREVIOUS else None,
                        bool(flags & CHANGED), entry[start:].decode(), content)


def load_old_entries(store: FingerprintDict | FingerprintLog,
                     entries: Iterable[tuple[str, float, Sequence]]) -> int:
    """Remember old entries, ``(event_id, expires_at, (score, rank, previous,
    changed, member[, content]))`` in expiry order, in ``store`` as
    fingerprints: the id's, and the payload's from the member and content
    fingerprint.  Entries written before there was a content fingerprint
    keep the member's alone (``MEMBER_ONLY``: a retry is then checked on
    its member, as before).  All are checked before any is remembered
    (``ValueError``).  Returns how many."""
    converted = []
    for event_id, expires_at, result in entries:
        score, rank, previous, changed, member = result[:5]
        content = result[5] if len(result) > 5 else None
        size = len(event_id.encode())
        if not 0 < size <= MAX_FIELD:
            raise ValueError(f"an event id must be 1 to {MAX_FIELD} bytes, got {size}")
        if rank is not None and not 0 <= rank < 1 << 64:
            raise ValueError(f"a rank must be 0 to 2**64 - 1, got {rank}")
        converted.append((store.id_fingerprint(event_id),
                          store.payload_fingerprint(member, content), float(expires_at),
                          (score, rank, previous, bool(changed)), content is None))
    for fp, payload, expires_at, answer, member_only in converted:
        store.put_fingerprint(fp, payload, expires_at, answer, member_only)
    return len(converted)


def load_old_chunk(store: FingerprintDict | FingerprintLog, chunk: bytes) -> int:
    """Remember the entries of a chunk of the old portable form (event ids
    and packed entries: :func:`read_old_chunk`) in ``store``, as
    :func:`load_old_entries` does.  A malformed chunk raises ``ValueError``
    and changes nothing.  Returns how many entries."""
    return load_old_packed(store, read_old_chunk(chunk))


def load_old_packed(store: FingerprintDict | FingerprintLog,
                    pairs: Iterable[tuple[str, bytes]]) -> int:
    """:func:`load_old_entries` of ``(event id, old packed entry)`` pairs."""
    return load_old_entries(store, [(event_id, *unpack_old_entry(entry))
                                    for event_id, entry in pairs])


FingerprintLog, IMPLEMENTATION = native_or("rankd.engine._idstore", "FingerprintLog",
                                          FingerprintDict)
CONFLICT = native_or("rankd.engine._idstore", "CONFLICT", Conflict())[0]
