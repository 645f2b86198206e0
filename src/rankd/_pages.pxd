# cython: language_level=3
"""C entry points of the compact paged rank index (``_pages.pyx``), for the
daemon's native lanes (the ingest kernel, plain RESP reads and pops, the
REST hot route's standing).

They mirror the skip list's (``_skiplist.pxd``: ``c_get``, ``c_put``,
``c_rank``, the prefetches, and the node walks the reads and pops make)
with the same semantics, as functions of the index object rather than
methods: declaring the class here would move every field and C method of
``RankIndex`` out of ``_pages.pyx``, where its layout is still changing.
Each takes a ``rankd._pages.RankIndex`` (checked once per board with
:func:`pg_is` by the caller, never per member) and a member as UTF-8 bytes
the caller has checked (non-empty, at most 256 bytes, valid UTF-8).
Implemented in ``_pages_lanes.pxi``.
"""

from libc.stdint cimport uint64_t


cdef struct pg_cursor:
    # An entry in rank order: a page (pg_page *) and a position in it.
    void *page
    Py_ssize_t pos


cdef bint pg_is(object index) noexcept
cdef Py_ssize_t pg_length(object index) noexcept
cdef bint pg_full(object index) noexcept
cdef void pg_prefetch_slot(object index, const char *member, Py_ssize_t mlen) noexcept
cdef void pg_prefetch_name(object index, const char *member, Py_ssize_t mlen) noexcept
cdef bint pg_get(object index, const char *member, Py_ssize_t mlen, double *score) noexcept
cdef Py_ssize_t pg_put(object index, const char *member, Py_ssize_t mlen, double score,
                       uint64_t seq) except -1
cdef Py_ssize_t pg_rank(object index, const char *member, Py_ssize_t mlen) noexcept
cdef int pg_remove(object index, const char *member, Py_ssize_t mlen) except -1
cdef Py_ssize_t pg_standing(object index, const char *member, Py_ssize_t mlen, double *score,
                            Py_ssize_t *dense, Py_ssize_t *before) noexcept
cdef void pg_at(object index, Py_ssize_t rank, pg_cursor *cursor) noexcept
cdef void pg_prefetch_names(object index, pg_cursor *cursor, Py_ssize_t count,
                            bint forward) noexcept
cdef const char *pg_member(object index, pg_cursor *cursor, Py_ssize_t *mlen) noexcept
cdef double pg_score(object index, pg_cursor *cursor) noexcept
cdef void pg_step(object index, pg_cursor *cursor, bint forward) noexcept
