# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compact event-id store: ≤ 32 bytes per remembered id.

What it owns: for one board, every event id accepted in the last
``dedupe_ttl``, and the answer a retry of it repeats: the store of the
board's :class:`rankd.engine.dedupe.DedupeTable`.  Live ingest (``_ingest``)
and replay (``_replay``) call its C entry points (``_idstore.pxd``:
``c_id_fingerprint``, ``c_live``, ``c_payload``, ``c_put``, ``c_prefetch``),
with no Python call per event.  It succeeded ``PackedLog`` (until
2026-11-29: 90 to 140 bytes an id, the id's bytes, the member's, and the
answer in doubles); its pure-Python twin is
:class:`rankd.engine.idstore.FingerprintDict`, which reads and writes the
same portable snapshot form.

**Fingerprints, not ids.**  An id is kept as 56 bits of a keyed SipHash-1-3
(a random key per table: ids are chosen by clients, who must not be able to
make them collide), and what the submission asked for as a 32-bit keyed
*payload fingerprint* (under the table's key xored with a constant) of
its member and its content fingerprint (``dedupe.fingerprint``: kind,
value and label, the unkeyed 64-bit FNV-1a the old entries hold, so that
old snapshots convert exactly; a client can find two payloads of one FNV
value, but only to have its own conflicting retry answered as the
original, as before).  A retry is known by its id fingerprint and answered only if its payload fingerprint
matches too; with the id's alone matching it is a conflict (409).  So:

* a new id whose fingerprint collides with a remembered one is refused as
  a conflict.  At n remembered ids that happens to a submission with
  probability n / 2**56: at 10M ids, 1.4e-10 (one wrongly refused
  submission in about 7 billion);
* a new id taken for a *retry* (answered with another event's result)
  needs both fingerprints to collide: n / 2**88, 3.2e-20 at 10M ids;
* a true conflict (the same id, another payload) passes for a retry with
  probability 2**-32 (2.3e-10) per attempt.  The keys are secret, so no
  client can aim at a collision; it can only try at random.

The member is not stored: a retry's payload fingerprint proves it is the
member of the original, and the answer names the retry's own.

**Compact answers.**  A record is 24 bytes: the id fingerprint with 8 flag
bits below it (changed, which of score/previous/rank are present, wide,
dead, member-only), the payload fingerprint, score and previous as int32
and rank as uint32.  An answer whose score or previous is not an exact
int32 (or -0.0), or whose rank does not fit, is *wide*: its numbers are
kept in a side dict keyed by the record's number (rare: scores are
usually integers).

**Expiry per block.**  Records are appended in arrival order, and every
entry lives equally long, so arrival order is expiry order.  Time is kept
per block of ``BLOCK`` records: the latest expiry put into it.  A record
lives until its block's time, so an id is remembered for at least the TTL
and at most the TTL plus the time its block took to fill (the ``BLOCK``
puts after it).  Expiring drops whole blocks from the front.  Remembering
an id again marks its old record dead and appends a new one.  The record
array is compacted (the live part moved to the front, by whole blocks)
once its dead front is as big as the rest.

**A table kept full.**  Records are found through an open-addressing table
of 5-byte slots: an 8-bit tag (0: empty) in one array, and the record's
logical number + 1 (32 bits) in another, probed linearly from
``fastrange(fingerprint, size)`` (any size, not a power of 2).  A probe
reads tags (64 to a cache line) and a record only where a tag matches (1
in 255 otherwise).  The table grows by 1/4 once 7/8 full, so its load stays
between 0.7 and 0.875: 5.7 to 7.1 bytes an id.  Growth is incremental, as
in ``PackedLog``: the records are moved into the new table a few per put,
in log order, and lookups that miss it look in the old one meanwhile, so
that no put stalls the event loop at millions of ids.

**Snapshots.**  :meth:`FingerprintLog.log_chunks` writes the portable
form (``idstore.CHUNK_HEAD``: a magic and the table's keys; then
``idstore.PORTABLE`` records: fingerprints, flags, the block's expiry and
the answer in full width).  The keys travel with the snapshot (a snapshot
file is as secret as the data it holds): a table adopts them when it
loads into an empty table.  A snapshot of the old ``PackedLog`` form is
turned into fingerprints by ``idstore.load_old_chunk``.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.math cimport signbit
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcmp, memcpy, memmove

from rankd._skiplist cimport (HUGE_CHUNK, rk_free_table, rk_grow_map, rk_prefetch, rk_siphash13,
                              rk_unmap, rk_zeroed_table)

import os
import struct

cdef extern from "Python.h":
    const char *PyUnicode_AsUTF8AndSize(object text, Py_ssize_t *size) except NULL

# Keys of the payload fingerprint are the id's, xored with this ("payload!").
cdef uint64_t PAYLOAD_KEY = 0x21646167c6f6170
# Logical record numbers are renumbered from 0 at a compaction once past this.
cdef uint64_t _rebase_at = (<uint64_t>1) << 31
# Slots of a new table.
cdef size_t _min_slots = 64
# log2 of the records per expiry time (BLOCK = 1024).
cdef int _block_bits = 10
# Records a put moves to the new table while a resize is under way.
cdef size_t _moves_per_put = 32

_PORTABLE = struct.Struct("<QIBdddQ")
_HEAD = struct.Struct("<4sQQ")
_MAGIC = b"RKI1"
_CONTENT = struct.Struct("<Q")
_SIZE = struct.Struct("<I")


# For tests: the fingerprint keys of tables made from now on (None: random).
cdef object _test_key = None


def _set_test_key(key):
    """For tests: tables made from now on take the 16-byte ``key`` (None:
    a random one each, as always outside tests), so that two tables built
    side by side hold the same fingerprints."""
    global _test_key
    if key is not None and len(key) != 16:
        raise ValueError("a fingerprint key is 16 bytes")
    _test_key = None if key is None else bytes(key)


def _set_rebase_at(uint64_t records):
    """For tests: renumber logical record numbers once past ``records``."""
    global _rebase_at
    _rebase_at = records


def _set_block_bits(int bits):
    """For tests: tables made from now on keep a time per ``2**bits`` records."""
    global _block_bits
    _block_bits = bits


def _set_min_slots(size_t slots):
    """For tests: the slots of tables made from now on (64 by default)."""
    global _min_slots
    _min_slots = max(slots, 2)


def _set_moves_per_put(size_t moves):
    """For tests: records a put moves during a resize (32 by default)."""
    global _moves_per_put
    _moves_per_put = moves


class Conflict:
    """What :meth:`FingerprintLog.get` answers for a remembered id sent with
    another payload (a singleton: ``CONFLICT``)."""

    def __repr__(self):
        return "CONFLICT"


CONFLICT = Conflict()


cdef inline uint8_t _tag(uint64_t fp) noexcept nogil:
    return <uint8_t>(1 + (fp & 0xFFFF) % 255)


cdef inline bint _exact32(double value) noexcept nogil:
    return -2147483648.0 <= value <= 2147483647.0 and <double><int32_t>value == value \
        and not (value == 0.0 and signbit(value))


cdef enum:
    # Entries of a chunk loaded without the GIL at a time (a ms or so).
    LOAD_RUN = 4096


cdef inline bint _is_wide(uint8_t flags, double score, double previous,
                          uint64_t rank) noexcept nogil:
    """Whether an answer does not fit a record (kept in ``wide`` beside it)."""
    return ((flags & HAS_SCORE and not _exact32(score))
            or (flags & HAS_PREVIOUS and not _exact32(previous))
            or (flags & HAS_RANK and rank > <uint64_t>0xFFFFFFFF))


cdef class FingerprintLog:
    """``event id -> answer`` by fingerprints, in arrival order (see the module
    docstring).  The same API as :class:`rankd.engine.idstore.FingerprintDict`."""


    def __cinit__(self):
        key = os.urandom(16) if _test_key is None else _test_key
        self.k0 = int.from_bytes(key[:8], "little")
        self.k1 = int.from_bytes(key[8:], "little")
        self.wide = {}
        self.bb = _block_bits
        self.memo_changes = <uint64_t>-1
        self._new_table(_min_slots)

    def __dealloc__(self):
        _free_table(self.tags, self.slots, self.n)
        if self.old_tags != NULL:
            _free_table(self.old_tags, self.old_slots, self.old_n)
        if self.mapped:
            rk_unmap(self.records, self.cap * sizeof(ids_record))
        else:
            free(self.records)
        free(self.blocks)

    def __len__(self):
        return self.count

    @property
    def key(self):
        """The fingerprint keys, 16 bytes."""
        return self.k0.to_bytes(8, "little") + self.k1.to_bytes(8, "little")

    # --- fingerprints ----------------------------------------------------------------

    cdef uint64_t c_id_fingerprint(self, const char *event_id, Py_ssize_t size) noexcept:
        return rk_siphash13(self.k0, self.k1, event_id, size) >> 8

    def id_fingerprint(self, str event_id):
        """``event_id``'s 56-bit fingerprint."""
        cdef Py_ssize_t size
        cdef const char *data = PyUnicode_AsUTF8AndSize(event_id, &size)
        return self.c_id_fingerprint(data, size)

    def payload_fingerprint(self, str member, content=None):
        """The 32-bit fingerprint of what a submission asked for: its member
        and content fingerprint (None: the member alone, for entries of old
        snapshots written before there was one)."""
        cdef Py_ssize_t size
        cdef const char *data = PyUnicode_AsUTF8AndSize(member, &size)
        if content is None:
            return self.c_payload(data, size, 0, False)
        return self.c_payload(data, size, content, True)

    cdef uint32_t c_payload(self, const char *member, Py_ssize_t size, uint64_t content,
                            bint has_content) except? 0:
        """``payload_fingerprint`` from C (``payload_bytes``' layout)."""
        cdef char small[256]
        cdef char *buffer = small
        cdef Py_ssize_t total = 4 + size + (8 if has_content else 0)
        cdef uint32_t member_size = <uint32_t>size
        cdef uint32_t h
        if total > 256:
            buffer = <char *>malloc(total)
            if buffer == NULL:
                raise MemoryError()
        memcpy(buffer, &member_size, 4)  # little-endian hosts only (see setup.py)
        memcpy(buffer + 4, member, size)
        if has_content:
            memcpy(buffer + 4 + size, &content, 8)
        h = <uint32_t>rk_siphash13(self.k0 ^ PAYLOAD_KEY, self.k1, buffer, total)
        if buffer != small:
            free(buffer)
        return h

    # --- finding ---------------------------------------------------------------------

    cdef ids_record *_rec(self, uint32_t slot) noexcept nogil:
        return &self.records[<uint64_t>(slot - 1) - self.base]

    cdef size_t _find(self, uint64_t fp) noexcept nogil:
        """The slot holding ``fp``, or the empty one that ends its probe."""
        cdef size_t i = ids_fastrange(fp << 8, self.n)
        cdef uint8_t tag = _tag(fp)
        while self.tags[i] != 0:
            if self.tags[i] == tag and (self._rec(self.slots[i]).word >> 8) == fp:
                return i
            i += 1
            if i == self.n:
                i = 0
        return i

    cdef ids_record *_find_moving(self, uint64_t fp) noexcept nogil:
        """During a resize, the live record of ``fp`` only the old table holds."""
        cdef size_t i = ids_fastrange(fp << 8, self.old_n)
        cdef uint8_t tag = _tag(fp)
        cdef ids_record *record
        while self.old_tags[i] != 0:
            if self.old_tags[i] == tag and self.old_slots[i] - 1 >= self.moved_to:
                record = self._rec(self.old_slots[i])
                if (record.word >> 8) == fp and not record.word & DEAD:
                    return record
            i += 1
            if i == self.old_n:
                i = 0
        return NULL

    cdef void c_prefetch(self, uint64_t fp) noexcept:
        """Start loading the tag ``fp``'s lookup reads first."""
        rk_prefetch(&self.tags[ids_fastrange(fp << 8, self.n)])

    cdef bint c_live(self, uint64_t fp, double now) noexcept:
        """Whether the id of fingerprint ``fp`` is remembered and not expired
        (whatever its payload: a retry, or a conflict).  The lookup is kept
        for a ``c_put`` of ``fp`` right after (the ingest of a new id), so
        that it does not probe again."""
        cdef size_t i = self._find(fp)
        cdef ids_record *record = NULL
        if self.tags[i] != 0:
            record = self._rec(self.slots[i])
        elif self.old_tags != NULL:
            record = self._find_moving(fp)
        self.memo_fp = fp
        self.memo_changes = self.changes
        self.memo_slot = i
        self.memo_record = record
        return record != NULL and self._live(record, now)

    cdef ids_record *_lookup(self, uint64_t fp) noexcept:
        cdef size_t i = self._find(fp)
        if self.tags[i] != 0:
            return self._rec(self.slots[i])
        if self.old_tags != NULL:
            return self._find_moving(fp)
        return NULL

    # --- growing ---------------------------------------------------------------------

    cdef int _new_table(self, size_t n) except -1:
        cdef size_t nbytes = _table_bytes(n)
        cdef char *data = <char *>rk_zeroed_table(nbytes, False)
        if data == NULL:
            raise MemoryError()
        self.slots = <uint32_t *>data
        self.tags = <uint8_t *>(data + n * 4)
        self.n = n
        return 0

    cdef void _move(self, size_t budget) noexcept nogil:
        """Index up to ``budget`` more records of a resize in the new table."""
        cdef ids_record *record
        cdef size_t j
        cdef uint64_t fp
        while budget and self.moved_to < self.moving_end:
            record = &self.records[self.moved_to - self.base]
            if not record.word & DEAD:
                fp = record.word >> 8
                j = ids_fastrange(fp << 8, self.n)
                while self.tags[j] != 0:
                    j += 1
                    if j == self.n:
                        j = 0
                self.tags[j] = _tag(fp)
                self.slots[j] = <uint32_t>(self.moved_to + 1)
            self.moved_to += 1
            budget -= 1
        if self.moved_to >= self.moving_end and self.old_tags != NULL:
            _free_table(self.old_tags, self.old_slots, self.old_n)
            self.old_tags = NULL
            self.old_slots = NULL

    cdef int _resize(self, size_t n) except -1:
        self.changes += 1  # (slots move: c_live's lookup is stale)
        if self.old_tags != NULL:
            self._move(<size_t>-1)
        cdef uint8_t *tags = self.tags
        cdef uint32_t *slots = self.slots
        cdef size_t old_n = self.n
        self._new_table(n)
        self.old_tags, self.old_slots, self.old_n = tags, slots, old_n
        self.moved_to = self.base + self.head
        self.moving_end = self.base + self.size
        self._move(0)
        return 0

    cdef int _make_room(self) except -1:
        """Room for one more record: reuse the expired front (whole blocks)
        when it is as big as the live part, else grow the array."""
        cdef Py_ssize_t front = (self.head >> self.bb) << self.bb
        cdef Py_ssize_t live = self.size - front
        cdef Py_ssize_t cap
        cdef char *data
        self.changes += 1  # (records move: c_live's lookup is stale)
        if front and front >= live:
            memmove(self.records, self.records + front, live * sizeof(ids_record))
            memmove(self.blocks, self.blocks + (front >> self.bb),
                    ((live + (1 << self.bb) - 1) >> self.bb) * sizeof(double))
            self.base += front
            self.size -= front
            self.head -= front
            if self.base > _rebase_at:
                self._move(<size_t>-1)  # (the old table's numbers are not renumbered)
                self._renumber()
            return 0
        cap = max(2 * self.cap, 1 << self.bb)
        if cap * <Py_ssize_t>sizeof(ids_record) < HUGE_CHUNK and not self.mapped:
            data = <char *>realloc(self.records, cap * sizeof(ids_record))
        elif self.mapped:
            data = rk_grow_map(<char *>self.records, self.cap * sizeof(ids_record),
                               cap * sizeof(ids_record), False)
        else:
            data = rk_grow_map(NULL, 0, cap * sizeof(ids_record), False)
            if data != NULL:
                memcpy(data, self.records, self.size * sizeof(ids_record))
                free(self.records)
                self.mapped = True
        if data == NULL:
            raise MemoryError()
        self.records = <ids_record *>data
        self.cap = cap
        data = <char *>realloc(self.blocks, (cap >> self.bb) * sizeof(double))
        if data == NULL:
            raise MemoryError()
        self.blocks = <double *>data
        return 0

    cdef void _renumber(self) noexcept:
        """Logical numbers from 0 again (slots keep 32 bits of them)."""
        cdef size_t i
        for i in range(self.n):
            if self.tags[i] != 0:
                self.slots[i] -= <uint32_t>self.base
        if self.wide:
            self.wide = {k - self.base: v for k, v in self.wide.items()}
        self.renumbered += self.base
        self.base = 0

    # --- changing --------------------------------------------------------------------

    cdef int c_put(self, uint64_t fp, uint32_t payload, double expires_at, uint8_t flags,
                   double score, double previous, uint64_t rank) except -1:
        """Remember an answer for the id of fingerprint ``fp``, after every other."""
        cdef size_t i
        cdef ids_record *record
        cdef uint64_t logical
        cdef bint wide
        flags &= PORTABLE_FLAGS
        # Room first, so that nothing changes when memory runs out.
        if <size_t>(self.count + 1) * 8 > self.n * 7:
            self._resize(self.n + max(self.n // 4, 1))
        if self.size == self.cap:
            self._make_room()
        # (C constants throughout: no Python object per put)
        wide = _is_wide(flags, score, previous, rank)
        logical = self.base + self.size
        if wide:
            self.wide[logical] = (score if flags & HAS_SCORE else None,
                                  rank if flags & HAS_RANK else None,
                                  previous if flags & HAS_PREVIOUS else None)
            flags |= WIDE
        record = self._slot_of(fp, &i)
        if record != NULL:
            self._kill(record)
            self.count -= 1
        self._append(i, fp, payload, expires_at, flags, score, previous, rank)
        return 0

    cdef bint _put_plain(self, uint64_t fp, uint32_t payload, double expires_at,
                         uint8_t flags, double score, double previous,
                         uint64_t rank) noexcept nogil:
        """:meth:`c_put` without the GIL, of an answer that fits the record
        (not wide) when there is room for it and it replaces no wide one;
        False (nothing changed) for any other, which :meth:`c_put` puts."""
        cdef size_t i
        cdef ids_record *record
        flags &= PORTABLE_FLAGS
        if (<size_t>(self.count + 1) * 8 > self.n * 7 or self.size == self.cap
                or _is_wide(flags, score, previous, rank)):
            return False
        record = self._slot_of(fp, &i)
        if record != NULL:
            if record.word & WIDE:
                return False
            record.word |= DEAD  # (_kill, of a record with no wide answer)
            self.count -= 1
        self._append(i, fp, payload, expires_at, flags, score, previous, rank)
        return True

    cdef ids_record *_slot_of(self, uint64_t fp, size_t *i) noexcept nogil:
        """The record of ``fp`` (NULL: none), and in ``i[0]`` its slot or
        the empty one its probe ends at."""
        if fp == self.memo_fp and self.changes == self.memo_changes:
            i[0] = self.memo_slot  # (c_live's lookup, nothing changed since)
            return self.memo_record
        i[0] = self._find(fp)
        if self.tags[i[0]] != 0:
            return self._rec(self.slots[i[0]])
        if self.old_tags != NULL:
            return self._find_moving(fp)
        return NULL

    cdef void _append(self, size_t i, uint64_t fp, uint32_t payload, double expires_at,
                      uint8_t flags, double score, double previous,
                      uint64_t rank) noexcept nogil:
        """A record of ``fp`` after every other, in slot ``i`` (there is room;
        a wide answer is in ``wide`` and flagged)."""
        cdef ids_record *record = &self.records[self.size]
        cdef uint64_t logical = self.base + self.size
        cdef Py_ssize_t block
        cdef bint narrow = not flags & WIDE
        record.word = (fp << 8) | flags
        record.payload = payload
        record.score = <int32_t>score if flags & HAS_SCORE and narrow else 0
        record.previous = <int32_t>previous if flags & HAS_PREVIOUS and narrow else 0
        record.rank = <uint32_t>rank if flags & HAS_RANK and narrow else 0
        block = self.size >> self.bb
        if self.size & ((1 << self.bb) - 1) == 0 or self.blocks[block] < expires_at:
            self.blocks[block] = expires_at
        self.tags[i] = _tag(fp)
        self.slots[i] = <uint32_t>(logical + 1)
        self.size += 1
        self.count += 1
        self.changes += 1
        if self.old_tags != NULL:
            self._move(_moves_per_put)

    cdef void _kill(self, ids_record *record) noexcept:
        if record.word & WIDE:
            self.wide.pop(self.base + (record - self.records), None)
        record.word |= DEAD

    cdef void _drop_slot(self, ids_record *record) noexcept:
        """Free ``record``'s slot (backward-shift deletion: no tombstones)."""
        cdef uint64_t logical = self.base + (record - self.records)
        cdef uint64_t fp = record.word >> 8
        cdef size_t hole, j, home, n = self.n
        if self.old_tags != NULL and self.moved_to <= logical < self.moving_end:
            return  # only in the old table, which is read only from moved_to on
        hole = ids_fastrange(fp << 8, n)
        while self.tags[hole] == 0 or self.slots[hole] != logical + 1:
            if self.tags[hole] == 0:
                return  # not indexed (cannot happen)
            hole = hole + 1 if hole + 1 < n else 0
        j = hole
        while True:
            j = j + 1 if j + 1 < n else 0
            if self.tags[j] == 0:
                break
            home = ids_fastrange((self._rec(self.slots[j]).word >> 8) << 8, n)
            if (j + n - home) % n >= (j + n - hole) % n:
                self.tags[hole] = self.tags[j]
                self.slots[hole] = self.slots[j]
                hole = j
        self.tags[hole] = 0
        self.slots[hole] = 0

    def expire(self, double now):
        """Forget the blocks from the front whose time is at or before ``now``;
        stop at the first live one.  Returns how many ids were forgotten."""
        cdef Py_ssize_t expired = 0, end
        cdef ids_record *record
        while self.head < self.size:
            if self.blocks[self.head >> self.bb] > now:
                break
            end = min(((self.head >> self.bb) + 1) << self.bb, self.size)
            while self.head < end:
                record = &self.records[self.head]
                if not record.word & DEAD:
                    self._drop_slot(record)
                    self._kill(record)
                    self.count -= 1
                    expired += 1
                self.head += 1
        if self.old_tags != NULL and self.moved_to < self.base + self.head:
            self.moved_to = self.base + self.head
            self._move(0)
        if expired:
            self.changes += 1
        return expired

    # --- Python API ------------------------------------------------------------------

    cdef tuple _answer(self, ids_record *record):
        cdef uint8_t flags = record.word & 0xFF
        if flags & WIDE:
            score, rank, previous = self.wide[self.base + (record - self.records)]
        else:
            score = float(record.score) if flags & HAS_SCORE else None
            previous = float(record.previous) if flags & HAS_PREVIOUS else None
            rank = record.rank if flags & HAS_RANK else None
        return (score, rank, previous, bool(flags & CHANGED))

    cdef bint _live(self, ids_record *record, double now) noexcept:
        return self.blocks[(record - self.records) >> self.bb] > now

    def get(self, str event_id, str member, uint64_t content, double now):
        """``(score, rank, previous, changed)`` remembered for a retry of
        ``event_id`` with this payload (``content``: its
        ``dedupe.fingerprint``); ``CONFLICT`` if it was remembered with
        another; None if it is not remembered (or expired)."""
        cdef Py_ssize_t size
        cdef const char *data = PyUnicode_AsUTF8AndSize(event_id, &size)
        cdef ids_record *record = self._lookup(self.c_id_fingerprint(data, size))
        cdef uint32_t payload
        if record == NULL or not self._live(record, now):
            return None
        data = PyUnicode_AsUTF8AndSize(member, &size)
        if record.word & MEMBER_ONLY:
            payload = self.c_payload(data, size, 0, False)
        else:
            payload = self.c_payload(data, size, content, True)
        if payload != record.payload:
            return CONFLICT
        return self._answer(record)

    def put(self, str event_id, double expires_at, str member, uint64_t content, tuple answer):
        """Remember ``answer`` (``(score, rank, previous, changed)``) for
        ``event_id`` and its payload, last in expiry order."""
        cdef Py_ssize_t size
        cdef const char *data = PyUnicode_AsUTF8AndSize(event_id, &size)
        if not 0 < size <= MAX_FIELD:
            raise ValueError(f"an event id must be 1 to {MAX_FIELD} bytes, got {size}")
        cdef uint64_t fp = self.c_id_fingerprint(data, size)
        data = PyUnicode_AsUTF8AndSize(member, &size)
        self._put_answer(fp, self.c_payload(data, size, content, True), expires_at, answer, False)

    def put_fingerprint(self, uint64_t fp, uint32_t payload, double expires_at, tuple answer,
                        bint member_only=False):
        """Remember ``answer`` for an id known by its fingerprint."""
        if fp >> 56:
            raise ValueError("an id fingerprint has 56 bits")
        self._put_answer(fp, payload, expires_at, answer, member_only)

    cdef int _put_answer(self, uint64_t fp, uint32_t payload, double expires_at, tuple answer,
                         bint member_only) except -1:
        """``put_fingerprint`` with ``answer`` unpacked in C."""
        cdef uint8_t flags = MEMBER_ONLY if member_only else 0
        cdef double score = 0.0, previous = 0.0
        cdef uint64_t rank = 0
        if len(answer) != 4:
            raise ValueError("an answer is (score, rank, previous, changed)")
        if answer[0] is not None:
            score = answer[0]
            flags |= HAS_SCORE
        if answer[1] is not None:
            if answer[1] < 0:
                raise ValueError(f"a rank must be 0 to 2**64 - 1, got {answer[1]}")
            rank = answer[1]  # (OverflowError from 2**64 on)
            flags |= HAS_RANK
        if answer[2] is not None:
            previous = answer[2]
            flags |= HAS_PREVIOUS
        if answer[3]:
            flags |= CHANGED
        return self.c_put(fp, payload, expires_at, flags, score, previous, rank)

    def items(self):
        """``(fingerprint, payload, member_only, expires_at, answer)`` in expiry
        order (``expires_at``: the block's); the table must not change meanwhile."""
        cdef Py_ssize_t i = self.head
        cdef uint64_t changes = self.changes
        cdef ids_record *record
        while True:
            if self.changes != changes:
                raise RuntimeError("the event-id store changed during iteration")
            if i >= self.size:
                return
            record = &self.records[i]
            i += 1
            if not record.word & DEAD:
                yield (record.word >> 8, record.payload, bool(record.word & MEMBER_ONLY),
                       self.blocks[(i - 1) >> self.bb], self._answer(record))

    def log_chunks(self, Py_ssize_t max_bytes):
        """The live entries in the portable form, in chunks of about
        ``max_bytes``, oldest first.  The table may change between chunks:
        they hold the entries remembered when the first was taken, less
        those expired or remembered again since; nothing remembered later."""
        # Absolute numbers (renumbered + logical): they survive a renumbering.
        cdef uint64_t cursor = self.renumbered + self.base + self.head
        cdef uint64_t end = self.renumbered + self.base + self.size
        cdef uint64_t origin
        cdef Py_ssize_t per_chunk = max(1, (max_bytes - _HEAD.size) // _PORTABLE.size)
        cdef ids_record *record
        cdef uint64_t logical, stop
        cdef Py_ssize_t live
        cdef char *p
        head = _HEAD.pack(_MAGIC, self.k0, self.k1)
        while True:
            # The front may have expired, or been renumbered, since the last chunk.
            origin = self.renumbered + self.base
            cursor = max(cursor, origin + <uint64_t>self.head)
            if cursor >= end:
                return
            stop = min(end, cursor + <uint64_t>per_chunk)
            live = 0
            for logical in range(cursor - origin, stop - origin):
                live += not self.records[logical].word & DEAD
            if live:
                chunk = PyBytes_FromStringAndSize(NULL, _HEAD.size + live * _PORTABLE.size)
                p = PyBytes_AS_STRING(chunk)
                memcpy(p, PyBytes_AS_STRING(head), _HEAD.size)
                p += _HEAD.size
                for logical in range(cursor - origin, stop - origin):
                    record = &self.records[logical]
                    if not record.word & DEAD:
                        p = self._portable(p, record, self.blocks[logical >> self.bb])
            cursor = stop
            if live:
                yield chunk

    cdef char *_portable(self, char *p, ids_record *record, double expires_at):
        """Write ``record`` in the portable form (``idstore.PORTABLE``) at ``p``."""
        cdef uint64_t fp = record.word >> 8
        cdef uint8_t flags = record.word & PORTABLE_FLAGS
        cdef double score = record.score, previous = record.previous
        cdef uint64_t rank = record.rank
        if record.word & WIDE:
            wide_score, wide_rank, wide_previous = self.wide[self.base + (record - self.records)]
            score = wide_score or 0.0
            previous = wide_previous or 0.0
            rank = wide_rank or 0
        else:
            if not flags & HAS_SCORE:
                score = 0.0
            if not flags & HAS_PREVIOUS:
                previous = 0.0
            if not flags & HAS_RANK:
                rank = 0
        memcpy(p, &fp, 8)
        memcpy(p + 8, &record.payload, 4)
        p[12] = <char>flags
        memcpy(p + 13, &expires_at, 8)
        memcpy(p + 21, &score, 8)
        memcpy(p + 29, &previous, 8)
        memcpy(p + 37, &rank, 8)
        return p + 45

    def load_log(self, bytes chunk):
        """Remember the entries of a :meth:`log_chunks` chunk, in order; an
        empty table adopts the chunk's keys.  A malformed chunk (or one of
        other keys into a table that holds entries) raises ``ValueError`` and
        changes nothing.  Returns how many entries it held.  Read in C, in
        place: a tuple per entry made a restart hold 17 times the chunk."""
        cdef Py_ssize_t size = PyBytes_GET_SIZE(chunk)
        cdef const char *p = PyBytes_AS_STRING(chunk)
        cdef const char *q
        cdef Py_ssize_t n, i
        cdef Py_ssize_t head = _HEAD.size, width = _PORTABLE.size
        cdef uint64_t c0, c1, fp, rank
        cdef uint32_t payload
        cdef uint8_t flags
        cdef double expires_at, score, previous
        if size < head or (size - head) % width:
            raise ValueError("an event-id store chunk has a bad size")
        if memcmp(p, <const char *>_MAGIC, 4) != 0:
            raise ValueError("not an event-id store chunk")
        memcpy(&c0, p + 4, 8)
        memcpy(&c1, p + 12, 8)
        if self.count != 0 and (c0 != self.k0 or c1 != self.k1):
            raise ValueError("an event-id store chunk of other fingerprint keys")
        n = (size - head) // width
        for i in range(n):  # (all checked first: a malformed one changes nothing)
            q = p + head + i * width
            memcpy(&fp, q, 8)
            if fp >> 56 or (<uint8_t>q[12]) & ~PORTABLE_FLAGS:
                raise ValueError("an event-id store chunk holds a malformed entry")
        if n:
            self.k0, self.k1 = c0, c1
        i = 0
        while i < n:
            # A group's event ids are loaded in a worker thread (a node taking
            # the group): most entries are put without the GIL, a run at a
            # time, so that the event loop's thread does not wait for it.
            with nogil:
                i = self._load_run(p + head, width, i, min(n, i + LOAD_RUN))
            if i == n:
                break
            # One that needs room, or a wide answer: with the GIL.
            q = p + head + i * width  # (idstore.PORTABLE's layout)
            _portable_entry(q, &fp, &payload, &flags, &expires_at, &score, &previous, &rank)
            self.c_put(fp, payload, expires_at, flags, score, previous, rank)
            i += 1
        return n

    cdef Py_ssize_t _load_run(self, const char *entries, Py_ssize_t width, Py_ssize_t i,
                              Py_ssize_t stop) noexcept nogil:
        """Put entries ``i`` to ``stop`` of a checked chunk's ``entries`` (of
        ``width`` bytes each) without the GIL while :meth:`_put_plain` can;
        returns the first not put."""
        cdef uint64_t fp, rank
        cdef uint32_t payload
        cdef uint8_t flags
        cdef double expires_at, score, previous
        while i < stop:
            _portable_entry(entries + i * width, &fp, &payload, &flags, &expires_at,
                            &score, &previous, &rank)
            if not self._put_plain(fp, payload, expires_at, flags, score, previous, rank):
                break
            i += 1
        return i


cdef inline void _portable_entry(const char *q, uint64_t *fp, uint32_t *payload, uint8_t *flags,
                                 double *expires_at, double *score, double *previous,
                                 uint64_t *rank) noexcept nogil:
    """The fields of an entry of a chunk (``idstore.PORTABLE``'s layout) at ``q``."""
    memcpy(fp, q, 8)
    memcpy(payload, q + 8, 4)
    flags[0] = <uint8_t>q[12]
    memcpy(expires_at, q + 13, 8)
    memcpy(score, q + 21, 8)
    memcpy(previous, q + 29, 8)
    memcpy(rank, q + 37, 8)


def payload_bytes(str member, content):
    """What the payload fingerprint hashes (``idstore.payload_bytes``)."""
    data = member.encode()
    data = _SIZE.pack(len(data)) + data
    return data if content is None else data + _CONTENT.pack(content)


cdef size_t _table_bytes(size_t n) noexcept nogil:
    cdef size_t nbytes = n * 5
    if nbytes >= HUGE_CHUNK:
        return (nbytes + HUGE_CHUNK - 1) // HUGE_CHUNK * HUGE_CHUNK
    return nbytes


cdef void _free_table(uint8_t *tags, uint32_t *slots, size_t n) noexcept nogil:
    rk_free_table(slots, _table_bytes(n))
