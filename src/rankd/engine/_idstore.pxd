# cython: language_level=3
"""The compact event-id store's fields and C entry points (see _idstore.pyx),
for the modules that cimport it: live ingest and recovery's replay."""

cimport cython
from libc.stdint cimport int32_t, uint8_t, uint32_t, uint64_t

cdef extern from *:
    """
    typedef struct ids_record {
        uint64_t word;      /* id fingerprint (56 bits) << 8 | flags */
        uint32_t payload;   /* payload fingerprint */
        int32_t score;
        int32_t previous;
        uint32_t rank;
    } ids_record;
    static inline size_t ids_fastrange(uint64_t h, size_t n) {
        return (size_t)(((unsigned __int128)h * n) >> 64);
    }
    """
    ctypedef struct ids_record:
        uint64_t word
        uint32_t payload
        int32_t score
        int32_t previous
        uint32_t rank
    size_t ids_fastrange(uint64_t h, size_t n) nogil


cdef enum:
    CHANGED = 1
    HAS_SCORE = 2
    HAS_PREVIOUS = 4
    HAS_RANK = 8
    WIDE = 16
    DEAD = 32
    MEMBER_ONLY = 64            # payload fingerprint of the member alone (old snapshots)
    PORTABLE_FLAGS = CHANGED | HAS_SCORE | HAS_PREVIOUS | HAS_RANK | MEMBER_ONLY
    MAX_FIELD = 65535


cdef inline uint8_t answer_flags(bint has_score, bint has_previous, bint has_rank,
                                 bint changed) noexcept nogil:
    """The flags of an answer with these parts (``FingerprintLog.c_put``)."""
    return ((HAS_SCORE if has_score else 0) | (HAS_PREVIOUS if has_previous else 0)
            | (HAS_RANK if has_rank else 0) | (CHANGED if changed else 0))


@cython.final
cdef class FingerprintLog:
    cdef ids_record *records      # physical array; logical number = base + index
    cdef Py_ssize_t size, cap, head
    cdef bint mapped
    cdef uint64_t base
    cdef uint64_t renumbered      # subtracted from logical numbers so far
    cdef double *blocks           # per physical block: the latest expiry put into it
    cdef Py_ssize_t blocks_cap
    cdef uint8_t *tags
    cdef uint32_t *slots          # logical number + 1 (valid where the tag is not 0)
    cdef size_t n
    cdef uint8_t *old_tags
    cdef uint32_t *old_slots
    cdef size_t old_n
    cdef uint64_t moved_to, moving_end
    cdef Py_ssize_t count
    cdef readonly uint64_t k0, k1
    cdef uint64_t changes
    cdef dict wide               # logical number -> (score, rank, previous)
    cdef int bb                  # log2 of the records per expiry time
    # The last lookup of c_live, for the put that follows it (valid while
    # ``changes`` is ``memo_changes``): the slot it ended on, its record.
    cdef uint64_t memo_fp, memo_changes
    cdef size_t memo_slot
    cdef ids_record *memo_record

    cdef uint64_t c_id_fingerprint(self, const char *event_id, Py_ssize_t size) noexcept
    cdef uint32_t c_payload(self, const char *member, Py_ssize_t size, uint64_t content,
                            bint has_content) except? 0
    cdef ids_record *_rec(self, uint32_t slot) noexcept nogil
    cdef size_t _find(self, uint64_t fp) noexcept nogil
    cdef ids_record *_find_moving(self, uint64_t fp) noexcept nogil
    cdef ids_record *_lookup(self, uint64_t fp) noexcept
    cdef int _new_table(self, size_t n) except -1
    cdef void _move(self, size_t budget) noexcept nogil
    cdef int _resize(self, size_t n) except -1
    cdef int _make_room(self) except -1
    cdef void _renumber(self) noexcept
    cdef int c_put(self, uint64_t fp, uint32_t payload, double expires_at, uint8_t flags,
                   double score, double previous, uint64_t rank) except -1
    cdef bint _put_plain(self, uint64_t fp, uint32_t payload, double expires_at, uint8_t flags,
                         double score, double previous, uint64_t rank) noexcept nogil
    cdef ids_record *_slot_of(self, uint64_t fp, size_t *i) noexcept nogil
    cdef void _append(self, size_t i, uint64_t fp, uint32_t payload, double expires_at,
                      uint8_t flags, double score, double previous, uint64_t rank) noexcept nogil
    cdef Py_ssize_t _load_run(self, const char *entries, Py_ssize_t width, Py_ssize_t i,
                              Py_ssize_t stop) noexcept nogil
    cdef void _kill(self, ids_record *record) noexcept
    cdef void _drop_slot(self, ids_record *record) noexcept
    cdef void c_prefetch(self, uint64_t fp) noexcept
    cdef bint c_live(self, uint64_t fp, double now) noexcept
    cdef tuple _answer(self, ids_record *record)
    cdef bint _live(self, ids_record *record, double now) noexcept
    cdef int _put_answer(self, uint64_t fp, uint32_t payload, double expires_at, tuple answer,
                         bint member_only) except -1
    cdef char *_portable(self, char *p, ids_record *record, double expires_at)
