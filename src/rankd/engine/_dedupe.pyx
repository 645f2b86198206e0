# cython: language_level=3, boundscheck=False, wraparound=False
"""The dedupe table's store: event id -> packed entry, in one log.

A board remembers every event id it accepted for ``dedupe_ttl`` (a day by
default), so a busy board holds millions, and almost every submission
asks about an id it has never seen.  A Python dict answers that with a
chain of cache misses (its index, then an entry, often twice) and keeps
a ``str`` and a ``bytes`` object per id.  This store keeps each id and
its packed entry (the layout of :mod:`rankd.engine.dedupe`) in one
append-only byte log, and finds them through an open-addressing table of
8-byte slots that hold a 16-bit tag of the id's hash next to the
record's offset: a new id usually costs one cache line of slots.

A busy board's table keeps growing for a day, and nothing it does to grow
may stall the event loop: the slot table doubles by moving a few records
a put into the new table (lookups that miss it look in the old one
meanwhile), the new table's memory is zeroed by the kernel a page at a
time as records are moved into it, and the log grows as a mapping the
kernel moves without copying.  Done at once, the three stalled the loop
for 0.1 to 0.8 s a time at millions of ids.

Records are appended in arrival order, and every entry lives equally
long, so arrival order is expiry order: expiring drops records from the
front of the log and stops at the first live one.  Remembering an id
again marks its old record dead and appends a new one, so the order
stays right.  The log is compacted (the live part moved to the front)
once its dead front is half of it; slots hold *logical* offsets, which
compaction does not change.

Snapshots copy the log in chunks of a portable form (:meth:`PackedLog.log_chunks`),
which :class:`rankd.engine.dedupe.DictLog`, the pure-Python twin, reads
and writes too.  They take one chunk at a time while ids keep arriving,
so a chunk walks *absolute* offsets (``renumbered + base`` is the absolute
offset of physical offset 0): unlike logical ones they survive both ways
of renumbering (a rebase, and the restart at 0 of an emptied log).
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport uint8_t, uint16_t, uint64_t
from libc.stdlib cimport free
from libc.string cimport memcmp, memcpy, memmove

from rankd._skiplist cimport (HUGE_CHUNK, rk_advise_huge, rk_free_table, rk_grow_map,
                              rk_prefetch, rk_siphash13, rk_unmap, rk_zeroed_table)
from rankd.engine._packing cimport ENTRY_BYTES, writer_free, writer_reserve

import os

cdef extern from "Python.h":
    const Py_ssize_t PY_SSIZE_T_MAX
    const char *PyUnicode_AsUTF8AndSize(object text, Py_ssize_t *size) except NULL


cdef enum:
    MIN_SLOTS = 16
    MAX_FIELD = 65535           # ids and entries are at most this many bytes
    CHUNK_HEADER = 4            # portable form: u16 id size, u16 entry size

# Logical offsets are renumbered from 0 at a compaction once past this.
cdef uint64_t _rebase_at = (<uint64_t>1) << 40


def _set_rebase_at(uint64_t offset):
    """For tests: renumber logical offsets once past ``offset`` (2**40 by default)."""
    global _rebase_at
    _rebase_at = offset


# Records a put moves to the new slot table while a resize is under way:
# enough that a resize is soon done (lookups that miss look in both tables
# meanwhile, and both are held), few enough that a put stays short (each
# move is a cache miss or two: a microsecond or so for them all).
cdef size_t _moves_per_put = 32


def _set_moves_per_put(size_t moves):
    """For tests: records a put moves during a resize (32 by default; 1
    keeps resizes under way across many operations)."""
    global _moves_per_put
    _moves_per_put = moves


cdef class PackedLog:
    """``event id -> packed entry`` in arrival order (see the module docstring).

    The same API as :class:`rankd.engine.dedupe.DictLog`.
    """

    def __cinit__(self):
        key = os.urandom(16)
        self.k0 = int.from_bytes(key[:8], "little")
        self.k1 = int.from_bytes(key[8:], "little")
        self.slots = _zeroed_slots(MIN_SLOTS)
        if self.slots == NULL:
            raise MemoryError()
        self.mask = MIN_SLOTS - 1

    def __dealloc__(self):
        _free_slots(self.slots, self.mask + 1)
        if self.old_slots != NULL:
            _free_slots(self.old_slots, self.old_mask + 1)
        if self.log_mapped:
            rk_unmap(self.log.data, self.log.cap)
        else:
            writer_free(&self.log)

    def __len__(self):
        return self.count

    # --- C entry points ------------------------------------------------------------

    cdef uint64_t _hash(self, const char *event_id, Py_ssize_t size) noexcept:
        return rk_siphash13(self.k0, self.k1, event_id, size)

    cdef dd_record *_record(self, uint64_t slot) noexcept:
        return <dd_record *>(self.log.data + ((slot & DD_OFFSET_MASK) - 1 - self.base))

    cdef size_t _find(self, const char *event_id, Py_ssize_t size, uint64_t h) noexcept:
        """The slot holding ``event_id``, or the empty slot that ends its probe."""
        cdef size_t i = h & self.mask
        cdef uint64_t slot
        while True:
            slot = self.slots[i]
            if slot == 0 or (DD_TAG(slot) == DD_TAG(h)
                             and _holds(self._record(slot), event_id, size, h)):
                return i
            i = (i + 1) & self.mask

    cdef dd_record *_find_moving(self, const char *event_id, Py_ssize_t size,
                                 uint64_t h) noexcept:
        """During a resize, the live record of ``event_id`` that only the old
        slot table holds (not yet moved), or NULL.  The old table also
        holds records already moved, superseded or expired: only offsets
        from ``moved_to`` on are read (the memory below may be reused)."""
        cdef size_t i = h & self.old_mask
        cdef dd_record *record
        while self.old_slots[i] != 0:
            if (DD_TAG(self.old_slots[i]) == DD_TAG(h)
                    and (self.old_slots[i] & DD_OFFSET_MASK) - 1 >= self.moved_to):
                record = self._record(self.old_slots[i])
                if not record.dead and _holds(record, event_id, size, h):
                    return record
            i = (i + 1) & self.old_mask
        return NULL

    cdef void _move(self, size_t budget) noexcept:
        """Index up to ``budget`` more records of a resize under way in the
        new slot table, in log order; drop the old table once all are."""
        cdef dd_record *record
        cdef size_t j
        while budget and self.moved_to < self.moving_end:
            record = <dd_record *>(self.log.data + (self.moved_to - self.base))
            if not record.dead:
                j = record.hash & self.mask
                while self.slots[j] != 0:
                    j = (j + 1) & self.mask
                self.slots[j] = DD_SLOT(record.hash, self.moved_to)
            self.moved_to += DD_RECORD_SIZE(record.id_size, record.entry_size)
            budget -= 1
        if self.moved_to >= self.moving_end:
            _free_slots(self.old_slots, self.old_mask + 1)
            self.old_slots = NULL
            if (self.mask + 1) * sizeof(uint64_t) >= HUGE_CHUNK:
                rk_advise_huge(self.slots, (self.mask + 1) * sizeof(uint64_t))

    cdef void c_prefetch(self, const char *event_id, Py_ssize_t size) noexcept:
        """Start loading the slots ``event_id``'s lookup reads first."""
        rk_prefetch(&self.slots[self._hash(event_id, size) & self.mask])

    cdef const char *c_entry(self, const char *event_id, Py_ssize_t size,
                             Py_ssize_t *entry_size) noexcept:
        """The entry remembered for ``event_id`` (valid until the next
        change), its size into ``entry_size``; NULL if there is none."""
        cdef uint64_t h = self._hash(event_id, size)
        cdef uint64_t slot = self.slots[self._find(event_id, size, h)]
        cdef dd_record *record = NULL
        if slot != 0:
            record = self._record(slot)
        elif self.old_slots != NULL:
            record = self._find_moving(event_id, size, h)
        if record == NULL:
            return NULL
        entry_size[0] = record.entry_size
        return DD_ENTRY(record)

    cdef int c_put(self, const char *event_id, Py_ssize_t size, const char *entry,
                   Py_ssize_t entry_size) except -1:
        """Remember ``entry`` for ``event_id``, after every other id (an id
        remembered before moves to the end)."""
        cdef uint64_t h
        cdef size_t i
        cdef Py_ssize_t need
        cdef dd_record *record
        if not 0 < size <= MAX_FIELD:
            raise ValueError(f"an event id must be 1 to {MAX_FIELD} bytes, got {size}")
        if not ENTRY_BYTES <= entry_size <= MAX_FIELD:
            raise ValueError(f"a packed dedupe entry must be {ENTRY_BYTES} to {MAX_FIELD} "
                             f"bytes, got {entry_size}")
        # Room first, so that nothing changes when memory runs out.
        if <size_t>(self.count + 1) * 2 > self.mask + 1:
            self._resize_slots((self.mask + 1) * 2)
        need = DD_RECORD_SIZE(size, entry_size)
        if self.log.size + need > self.log.cap:
            self._make_room(need)
        h = self._hash(event_id, size)
        i = self._find(event_id, size, h)
        record = NULL
        if self.slots[i] != 0:
            record = self._record(self.slots[i])
        elif self.old_slots != NULL:
            record = self._find_moving(event_id, size, h)
        if record != NULL:
            record.dead = 1
            self.dead += 1
            self.count -= 1
        record = <dd_record *>(self.log.data + self.log.size)
        record.hash = h
        record.id_size = <uint16_t>size
        record.entry_size = <uint16_t>entry_size
        record.dead = 0
        memcpy(<char *>DD_ID(record), event_id, size)
        memcpy(<char *>DD_ENTRY(record), entry, entry_size)
        self.slots[i] = DD_SLOT(h, self.base + self.log.size)
        self.log.size += need
        self.count += 1
        self.changes += 1
        if self.old_slots != NULL:
            self._move(_moves_per_put)
        return 0

    # --- memory ----------------------------------------------------------------------

    cdef int _resize_slots(self, size_t size) except -1:
        """Start indexing the records in ``size`` slots.  The records are
        moved a few per put (``_move``), in log order (the old slots would
        send each move to a random record); until they all are, lookups
        that miss the new table look in the old one.  Moving them all at
        once stalled the event loop: 0.1 to 0.3 s for 4 million ids."""
        cdef uint64_t *slots
        if self.old_slots != NULL:
            self._move(<size_t>-1)  # (the last resize's moves, if puts outran them)
        slots = _zeroed_slots(size)
        if slots == NULL:
            raise MemoryError()
        self.old_slots = self.slots
        self.old_mask = self.mask
        self.slots = slots
        self.mask = size - 1
        self.moved_to = self.base + self.head
        self.moving_end = self.base + self.log.size
        self._move(0)  # (drops the old table at once if there is nothing to move)
        return 0

    cdef int _make_room(self, Py_ssize_t need) except -1:
        """Room for ``need`` more bytes: reuse the expired front when it is
        at least as big as the live part (so each byte moves at most once
        per byte appended), else grow to twice what is needed."""
        cdef Py_ssize_t live = self.log.size - self.head
        if self.head < live or live + need > self.log.cap:
            self._grow_log(2 * (live + need))
        if self.head:
            memmove(self.log.data, self.log.data + self.head, live)
            self._compacted()
        return 0

    cdef int _grow_log(self, Py_ssize_t wanted) except -1:
        """Capacity for at least ``wanted`` bytes, doubling.  A small log is
        malloc'd; from 2 MiB up it is a mapping that grows in place of
        realloc's (``rk_grow_map``: no stall however big it gets).  Not in
        huge pages: the kernel zeroes a huge page in one fault, 2.5 to 5 ms
        on a virtual machine's fresh memory, where small pages spread the
        same work over the appends (and a log is read mostly in order,
        where huge pages save little).  Nothing changes when memory runs
        out."""
        cdef Py_ssize_t cap
        cdef char *data
        if wanted < HUGE_CHUNK and not self.log_mapped:
            writer_reserve(&self.log, wanted - self.log.size)
            return 0
        cap = self.log.cap if self.log_mapped else HUGE_CHUNK
        while cap < wanted:
            cap *= 2
        data = (rk_grow_map(self.log.data, self.log.cap, cap, False) if self.log_mapped
                else rk_grow_map(NULL, 0, cap, False))
        if data == NULL:
            raise MemoryError()
        if not self.log_mapped:  # (from malloc'd memory: copied once)
            memcpy(data, self.log.data, self.log.size)
            free(self.log.data)
            self.log_mapped = True
        self.log.data = data
        self.log.cap = cap
        return 0

    cdef void _compacted(self) noexcept:
        """The live records were moved to the front: logical offsets stay,
        unless they grow large, when they are all renumbered from 0 (slots
        keep 48 bits of offset)."""
        cdef size_t i
        self.base += self.head
        self.log.size -= self.head
        self.head = 0
        if self.base > _rebase_at:
            self._move(<size_t>-1)  # (the old table's offsets are not renumbered)
            for i in range(self.mask + 1):
                if self.slots[i] != 0:
                    self.slots[i] -= self.base
            self.renumbered += self.base
            self.base = 0

    cdef void _drop_slot(self, dd_record *record) noexcept:
        """Free ``record``'s slot (backward-shift deletion: no tombstones)."""
        cdef uint64_t logical = self.base + (<char *>record - self.log.data) + 1
        cdef size_t hole = record.hash & self.mask, j, home
        if self.old_slots != NULL and self.moved_to < logical <= self.moving_end:
            return  # only in the old table, which is read only from moved_to on
        while (self.slots[hole] & DD_OFFSET_MASK) != logical:
            if self.slots[hole] == 0:
                return  # not indexed (cannot happen): end the probe, not loop forever
            hole = (hole + 1) & self.mask
        j = hole
        while True:
            j = (j + 1) & self.mask
            if self.slots[j] == 0:
                break
            home = self._record(self.slots[j]).hash & self.mask
            # j may fill the hole if its probe started at or before it.
            if ((j - home) & self.mask) >= ((j - hole) & self.mask):
                self.slots[hole] = self.slots[j]
                hole = j
        self.slots[hole] = 0

    # --- Python API ------------------------------------------------------------------

    def get(self, str event_id):
        """The packed entry remembered for ``event_id``, or ``None``."""
        cdef Py_ssize_t size, entry_size
        cdef const char *data = PyUnicode_AsUTF8AndSize(event_id, &size)
        cdef const char *entry = self.c_entry(data, size, &entry_size)
        return None if entry == NULL else PyBytes_FromStringAndSize(entry, entry_size)

    def put(self, str event_id, bytes entry):
        """Remember ``entry`` for ``event_id``, last in expiry order."""
        cdef Py_ssize_t size
        cdef const char *data = PyUnicode_AsUTF8AndSize(event_id, &size)
        self.c_put(data, size, PyBytes_AS_STRING(entry), PyBytes_GET_SIZE(entry))

    def expire(self, double now):
        """Forget the entries from the front whose expiry (an entry's first
        float64) is at or before ``now``; stop at the first live one.
        Returns how many were forgotten."""
        cdef dd_record *record
        cdef double expires_at
        cdef Py_ssize_t expired = 0
        while self.head < self.log.size:
            record = <dd_record *>(self.log.data + self.head)
            if not record.dead:
                memcpy(&expires_at, DD_ENTRY(record), 8)
                if expires_at > now:
                    break
                self._drop_slot(record)
                self.count -= 1
                expired += 1
            else:
                self.dead -= 1
            self.head += DD_RECORD_SIZE(record.id_size, record.entry_size)
        if self.old_slots != NULL and self.moved_to < self.base + self.head:
            self.moved_to = self.base + self.head  # (the old table must not read them)
            self._move(0)
        if expired:
            self.changes += 1
        if self.head == self.log.size:  # empty, no slot in use: start again at the front
            self.renumbered += self.base + self.head
            self.base = self.head = self.log.size = 0
        return expired

    def items(self):
        """``(event_id, entry)`` in expiry order; the table must not change meanwhile."""
        cdef Py_ssize_t offset = self.head
        cdef uint64_t changes = self.changes
        cdef dd_record *record
        while True:
            if self.changes != changes:
                raise RuntimeError("the dedupe table changed during iteration")
            if offset >= self.log.size:
                return
            record = <dd_record *>(self.log.data + offset)
            offset += DD_RECORD_SIZE(record.id_size, record.entry_size)
            if not record.dead:
                yield (PyUnicode_DecodeUTF8(DD_ID(record), record.id_size, NULL),
                       PyBytes_FromStringAndSize(DD_ENTRY(record), record.entry_size))

    def log_chunks(self, Py_ssize_t max_bytes):
        """The live entries in the portable log form (see ``DictLog``), in
        chunks of about ``max_bytes``, oldest first.

        The table may change between chunks (a snapshot takes them while
        ids keep arriving): the chunks hold the entries remembered when the
        first one was taken, less those expired or remembered again since;
        nothing remembered later.
        """
        cdef uint64_t cursor = self.renumbered + self.base + self.head  # absolute offsets
        cdef uint64_t end = self.renumbered + self.base + self.log.size
        cdef uint64_t origin
        cdef Py_ssize_t offset, stop, size
        cdef dd_record *record
        cdef char *p
        cdef uint16_t field
        while True:
            # Where the log is now: it may have been compacted, expired or
            # grown (moved) since the last chunk.
            origin = self.renumbered + self.base
            cursor = max(cursor, origin + <uint64_t>self.head)
            if cursor >= end:
                return
            # Measure a chunk, then copy it.
            offset = stop = <Py_ssize_t>(cursor - origin)
            size = 0
            while stop < <Py_ssize_t>(end - origin) and (size == 0 or size < max_bytes):
                record = <dd_record *>(self.log.data + stop)
                if not record.dead:
                    size += CHUNK_HEADER + record.id_size + record.entry_size
                stop += DD_RECORD_SIZE(record.id_size, record.entry_size)
            cursor = origin + <uint64_t>stop
            chunk = PyBytes_FromStringAndSize(NULL, size)
            p = PyBytes_AS_STRING(chunk)
            while offset < stop:
                record = <dd_record *>(self.log.data + offset)
                offset += DD_RECORD_SIZE(record.id_size, record.entry_size)
                if record.dead:
                    continue
                field = record.id_size
                memcpy(p, &field, 2)
                field = record.entry_size
                memcpy(p + 2, &field, 2)
                memcpy(p + CHUNK_HEADER, DD_ID(record), record.id_size)
                memcpy(p + CHUNK_HEADER + record.id_size, DD_ENTRY(record), record.entry_size)
                p += CHUNK_HEADER + record.id_size + record.entry_size
            if size:
                yield chunk

    def load_log(self, bytes chunk):
        """Remember the entries of a :meth:`log_chunks` chunk, in order.  A
        malformed chunk raises ``ValueError`` and changes nothing."""
        cdef const uint8_t *data = <const uint8_t *>PyBytes_AS_STRING(chunk)
        cdef Py_ssize_t size = PyBytes_GET_SIZE(chunk), offset = 0, id_size, entry_size
        cdef Py_ssize_t entries = 0
        while offset < size:  # check it all first
            if size - offset < CHUNK_HEADER:
                raise ValueError("a dedupe log chunk ends inside an entry header")
            id_size = data[offset] | (data[offset + 1] << 8)
            entry_size = data[offset + 2] | (data[offset + 3] << 8)
            if id_size == 0 or entry_size < ENTRY_BYTES:
                raise ValueError("a dedupe log chunk holds an empty event id or an entry "
                                 "too short to hold a result")
            offset += CHUNK_HEADER + id_size + entry_size
            if offset > size:
                raise ValueError("a dedupe log chunk ends inside an entry")
            entries += 1
        offset = 0
        while offset < size:
            id_size = data[offset] | (data[offset + 1] << 8)
            entry_size = data[offset + 2] | (data[offset + 3] << 8)
            self.c_put(<const char *>data + offset + CHUNK_HEADER, id_size,
                       <const char *>data + offset + CHUNK_HEADER + id_size, entry_size)
            offset += CHUNK_HEADER + id_size + entry_size
        return entries


cdef inline bint _holds(dd_record *record, const char *event_id, Py_ssize_t size,
                        uint64_t h) noexcept:
    """``record`` is ``event_id``'s (whose hash is ``h``)."""
    return (record.hash == h and record.id_size == size
            and memcmp(DD_ID(record), event_id, size) == 0)


cdef inline uint64_t *_zeroed_slots(size_t size) noexcept:
    """A zeroed slot array; NULL if out of memory (``rk_zeroed_table``: a
    big one is zeroed by the kernel a page at a time as records move in,
    in small pages until ``_move`` advises it into huge ones)."""
    return <uint64_t *>rk_zeroed_table(size * sizeof(uint64_t), False)


cdef inline void _free_slots(uint64_t *slots, size_t size) noexcept:
    """Free what ``_zeroed_slots(size)`` gave."""
    rk_free_table(slots, size * sizeof(uint64_t))
