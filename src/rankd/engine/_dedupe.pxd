# cython: language_level=3
"""The native dedupe store's fields and C entry points (see _dedupe.pyx),
for the modules that cimport it: live ingest and recovery's replay."""

from libc.stdint cimport uint8_t, uint16_t, uint64_t

from rankd.engine._packing cimport Writer

cdef extern from *:
    """
    /* A record: this header, the id's bytes, the entry's bytes, padding to 8. */
    typedef struct dd_record {
        uint64_t hash;
        uint16_t id_size;
        uint16_t entry_size;
        uint8_t dead;
        uint8_t pad[3];
    } dd_record;
    #define DD_HEADER 16
    #define DD_RECORD_SIZE(id, entry) (((size_t)DD_HEADER + (id) + (entry) + 7) & ~(size_t)7)
    #define DD_ID(r) ((const char *)(r) + DD_HEADER)
    #define DD_ENTRY(r) ((const char *)(r) + DD_HEADER + (r)->id_size)
    #define DD_OFFSET_BITS 48
    #define DD_OFFSET_MASK ((((uint64_t)1) << DD_OFFSET_BITS) - 1)
    #define DD_TAG(h) ((h) >> DD_OFFSET_BITS)
    /* The slot of a record: its hash's tag beside its logical offset + 1 (0: empty). */
    #define DD_SLOT(h, logical) ((DD_TAG(h) << DD_OFFSET_BITS) | ((logical) + 1))
    """
    ctypedef struct dd_record:
        uint64_t hash
        uint16_t id_size
        uint16_t entry_size
        uint8_t dead
    size_t DD_RECORD_SIZE(size_t id_size, size_t entry_size) nogil
    const char *DD_ID(dd_record *record) nogil
    const char *DD_ENTRY(dd_record *record) nogil
    uint64_t DD_OFFSET_MASK
    uint64_t DD_TAG(uint64_t hash) nogil
    uint64_t DD_SLOT(uint64_t hash, uint64_t logical) nogil


cdef class PackedLog:
    cdef Writer log                 # the records, oldest first, from `head` to `log.size`
    cdef Py_ssize_t head            # physical offset of the oldest record kept
    cdef uint64_t base              # logical offset of physical offset 0
    cdef uint64_t renumbered        # subtracted from logical offsets so far
    cdef uint64_t *slots            # 0 = empty, else tag << 48 | (logical offset + 1)
    cdef size_t mask
    cdef Py_ssize_t count           # live entries (each has one slot)
    cdef Py_ssize_t dead            # records superseded by a later one of the same id
    cdef uint64_t k0, k1            # SipHash key
    cdef uint64_t changes           # bumped by every change, for iterators
    cdef bint log_mapped            # the log is an rk_grow_map mapping (else malloc'd)
    # A resize under way (``old_slots`` not NULL): the records from logical
    # offset ``moved_to`` to ``moving_end`` are still indexed by the old table alone.
    cdef uint64_t *old_slots
    cdef size_t old_mask
    cdef uint64_t moved_to, moving_end

    cdef uint64_t _hash(self, const char *event_id, Py_ssize_t size) noexcept
    cdef dd_record *_record(self, uint64_t slot) noexcept
    cdef size_t _find(self, const char *event_id, Py_ssize_t size, uint64_t h) noexcept
    cdef dd_record *_find_moving(self, const char *event_id, Py_ssize_t size,
                                 uint64_t h) noexcept
    cdef void _move(self, size_t budget) noexcept
    cdef int _resize_slots(self, size_t size) except -1
    cdef int _make_room(self, Py_ssize_t need) except -1
    cdef int _grow_log(self, Py_ssize_t wanted) except -1
    cdef void _compacted(self) noexcept
    cdef void _drop_slot(self, dd_record *record) noexcept
    cdef void c_prefetch(self, const char *event_id, Py_ssize_t size) noexcept
    cdef const char *c_entry(self, const char *event_id, Py_ssize_t size,
                             Py_ssize_t *entry_size) noexcept
    cdef int c_put(self, const char *event_id, Py_ssize_t size, const char *entry,
                   Py_ssize_t entry_size) except -1
