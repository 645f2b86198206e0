# cython: language_level=3, boundscheck=False, wraparound=False
"""Pipelined ``ZPOPMIN``/``ZPOPMAX`` natively: what the RESP scanner packs
and what removes, logs and answers them.

The scanner (``_scanner``) packs each run of consecutive *plain* pops,
``ZPOPMIN``/``ZPOPMAX key [count]`` (any case) with ``key`` a board name
as the scanner's other plain commands take it and ``count`` a positive
integer as ``string2ll`` reads it, into one :class:`PackedPops`, spans of
the bytes read.  :func:`remove_run` pops, from one board, the pops of a
run on it in order, each from what the ones before left: it picks each
member from the index, removes it from every index of the board, writes
its ``REMOVE`` record (byte for byte what ``records.encode`` writes) and
the pop's reply (what ``sorted_sets.zpop`` writes), with no Python object
per pop but the record.  The checks, the commit and the acknowledgement
are ``pop_lane``'s.  A board on the paged index (``--index pages``) is
popped the same way through ``_pages.pxd``'s entry points, chosen once per
run.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.unicode cimport PyUnicode_DecodeASCII
from libc.stdlib cimport free
from libc.string cimport memcmp, memcpy

from rankd._pages cimport pg_at, pg_cursor, pg_is, pg_length, pg_member, pg_remove, pg_score
from rankd._skiplist cimport MAX_MEMBER_BYTES, OP_REMOVE, RK_MEMBER, RankIndex, rk_node
from rankd.engine._packed cimport Span, grown
from rankd.engine._packing cimport Writer, put_array, put_int, put_str, writer_free
from rankd.engine._replies cimport reply_bulk, reply_double, reply_header, reply_put

from rankd.engine.errors import EngineError

cdef enum:
    REMOVE = 4  # rankd.engine.records.REMOVE


cdef class PackedPops:
    """Plain pops whose keys are spans of ``data`` (the RESP scanner fills
    them); ``len()`` of them."""

    def __cinit__(self, bytes data):
        self.data = data
        self.items = &self.first_item
        self.count = 0
        self.capacity = 1

    def __dealloc__(self):
        if self.items != &self.first_item:
            free(self.items)

    def __len__(self):
        return self.count

    cdef PackedPop *add(self) except NULL:
        """A new zeroed pop at the end."""
        if self.count == self.capacity:
            self.items = <PackedPop *>grown(self.items, &self.first_item, self.count,
                                            &self.capacity, sizeof(PackedPop))
        self.items[self.count] = PackedPop(source=Span(0, 0, False), board=Span(0, 0, False),
                                           count=-1, highest=False)
        self.count += 1
        return &self.items[self.count - 1]

    cdef const char *chars(self, Span *span) noexcept:
        return PyBytes_AS_STRING(self.data) + span.offset

    def source(self, Py_ssize_t i):
        """The bytes pop ``i`` was read from (for the front-end's general path)."""
        cdef Span *span
        if not 0 <= i < self.count:
            raise IndexError(i)
        span = &self.items[i].source
        return self.data[span.offset:span.offset + span.size]

    def board(self, Py_ssize_t i):
        """The board pop ``i`` pops from."""
        cdef Span *span
        if not 0 <= i < self.count:
            raise IndexError(i)
        span = &self.items[i].board
        return PyUnicode_DecodeASCII(self.chars(span), span.size, NULL)

    def board_end(self, Py_ssize_t i):
        """Where the pops on pop ``i``'s board right from ``i`` end."""
        cdef Span *first
        cdef Span *other
        cdef Py_ssize_t end = i + 1
        if not 0 <= i < self.count:
            raise IndexError(i)
        first = &self.items[i].board
        while end < self.count:
            other = &self.items[end].board
            if other.size != first.size or memcmp(self.chars(other), self.chars(first),
                                                  first.size) != 0:
                break
            end += 1
        return end

    def highest(self, Py_ssize_t i):
        """Whether pop ``i`` is a ZPOPMAX."""
        if not 0 <= i < self.count:
            raise IndexError(i)
        return bool(self.items[i].highest)


def remove_run(PackedPops pops, Py_ssize_t first, Py_ssize_t end, object index,
               list indexes, bint ascending, long long now_ms, int version,
               Py_ssize_t most, Py_ssize_t per_request, object charge):
    """Apply pops ``first`` to ``end`` of ``pops`` (all on one board, whose
    view is ``index`` and whose every index is in ``indexes``: all native
    skip lists, or all paged indexes), in order: ``(stopped, reply, payloads, maxes)``.

    The run stops before a pop that would take the run past ``most``
    members removed, or that ``charge`` (the caller's rate limit, or None)
    refuses or would charge for more than its request (more than
    ``per_request`` members): that one is answered by itself, the general
    way.  ``reply`` holds the replies of the pops applied (to ``stopped``),
    ``payloads`` their ``REMOVE`` records, applied already, ``maxes`` how
    many of them were ZPOPMAX."""
    cdef Writer w
    cdef Writer record
    cdef PackedPop *pop
    cdef rk_node *x
    cdef bint paged = pg_is(index)
    cdef RankIndex skiplist = None if paged else index
    cdef pg_cursor at
    cdef const char *found
    cdef Py_ssize_t i, k, wanted, taken = 0, maxes = 0
    cdef Py_ssize_t size = pg_length(index) if paged else skiplist.length
    cdef char member[MAX_MEMBER_BYTES]
    cdef Py_ssize_t mlen
    cdef double score, old = 0.0, new = 0.0
    cdef bint had, has_new, changed, from_front, pairs
    cdef RankIndex other
    cdef const char *name
    cdef Py_ssize_t name_size
    cdef list payloads = []
    if paged and not all(pg_is(each) for each in indexes):
        raise TypeError("a board's indexes are all of one kind")
    w.data = record.data = NULL
    w.size = w.cap = record.size = record.cap = 0
    try:
        i = first
        while i < end:
            pop = &pops.items[i]
            wanted = 1 if pop.count < 0 else <Py_ssize_t>min(pop.count, size - taken)
            if wanted > size - taken:  # (what the pops before left)
                wanted = size - taken
            if taken + wanted > most:
                break
            if charge is not None:
                if wanted > per_request:
                    break
                try:
                    charge(1)
                except EngineError:
                    break
            name = pops.chars(&pop.board)
            name_size = pop.board.size
            pairs = pop.count >= 0 and version == 3
            reply_header(&w, b"*", wanted if pairs else 2 * wanted)
            from_front = ascending != pop.highest
            for k in range(wanted):
                if paged:
                    pg_at(index, 1 if from_front else pg_length(index), &at)
                    found = pg_member(index, &at, &mlen)
                    memcpy(member, found, mlen)
                    score = pg_score(index, &at)
                else:
                    x = skiplist._node_at(1 if from_front else skiplist.length)
                    mlen = x.mlen
                    memcpy(member, RK_MEMBER(x), mlen)
                    score = skiplist._score(x)
                if pairs:
                    reply_put(&w, "*2\r\n", 4)
                reply_bulk(&w, member, mlen)
                reply_double(&w, score, version)
                record.size = 0
                put_array(&record, 4)
                put_int(&record, REMOVE)
                put_str(&record, name, name_size)
                put_str(&record, member, mlen)
                put_int(&record, now_ms)
                payloads.append(PyBytes_FromStringAndSize(record.data, record.size))
                if paged:
                    for each in indexes:
                        pg_remove(each, member, mlen)
                else:
                    for other in indexes:
                        other._write(member, mlen, 0.0, OP_REMOVE, False, 0, False,
                                     &old, &had, &new, &has_new, &changed)
            taken += wanted
            if pop.highest:
                maxes += 1
            i += 1
        return i, PyBytes_FromStringAndSize(w.data, w.size), payloads, maxes
    finally:
        writer_free(&w)
        writer_free(&record)
