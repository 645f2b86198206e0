# cython: language_level=3
"""Submissions in packed form: fields as spans of one buffer, results in C.

A front-end that reads submissions off the wire (the TCP protocol's
scanner, ``rankd.frontends._submits``) fills a :class:`Packed` with spans
into the bytes it read instead of building a ``Submission`` object each;
the ingest kernel (``rankd.engine._ingest.ingest_packed``) applies them and
writes each result into ``results``; the front-end encodes its answers
from there.  Only what the engine's state keeps becomes a Python object.
"""

from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.stdlib cimport realloc
from libc.string cimport memcpy

cdef enum NumberKind:
    NUMBER_ABSENT = 0    # the field was not sent
    NUMBER_NIL = 1       # sent as nil (None)
    NUMBER_INT = 2       # an integer that fits int64 (ival)
    NUMBER_UINT = 3      # an integer above int64 (uval)
    NUMBER_FLOAT = 4     # a float (fval)


cdef struct Number:
    NumberKind kind
    int64_t ival
    uint64_t uval
    double fval


cdef struct Span:
    # Text: ``size`` bytes at ``offset`` of the buffer (ASCII: checked by the
    # scanner); ``present`` False for an absent or nil field.
    Py_ssize_t offset
    Py_ssize_t size
    bint present


cdef struct PackedSubmission:
    uint32_t tag         # the front-end's (the request id); the engine ignores it
    Span source          # the front-end's (its request frame's payload)
    Span board
    Span member
    Span event_id
    Span label
    Number score
    Number delta


cdef struct PackedResult:
    # What the ingest kernel answers a submission it applied itself (for a
    # packed one: in ``results``, its ``answers[i]`` None; the others'
    # answers are Python objects in ``answers``).
    double score
    double previous
    int64_t rank
    bint has_previous
    bint changed


cdef class Packed:
    cdef readonly bytes data           # the buffer the spans point into
    cdef PackedSubmission *items
    cdef PackedResult *results
    cdef readonly Py_ssize_t count
    cdef Py_ssize_t capacity
    # Where ``items`` and ``results`` point until a second submission is
    # added: a run of one (every request of a client that does not
    # pipeline) allocates nothing more than the object.
    cdef PackedSubmission first_item
    cdef PackedResult first_result
    #: Per submission, once applied: None (result in ``results``), an answer
    #: dict or an EngineError; None before.
    cdef public list answers
    #: On a cluster node, the ``(seq, epoch)`` of the log holding the run's
    #: writes, once acknowledged (every answer carries it); else None.
    cdef public object position

    cdef PackedSubmission *add(self) except NULL
    cdef object text(self, Span *span)
    cpdef bint only_board(self, str name) except -1
    cdef const char *chars(self, Span *span) noexcept


cdef enum ReadKind:
    READ_SCORE = 0       # ZSCORE key member
    READ_RANK = 1        # ZRANK key member
    READ_REVRANK = 2     # ZREVRANK key member
    READ_RANGE = 3       # ZRANGE key start stop [WITHSCORES]
    READ_REVRANGE = 4    # ZREVRANGE key start stop [WITHSCORES]


cdef struct PackedRead:
    ReadKind kind
    Span source          # the front-end's (its request's bytes)
    Span board
    Span member
    int64_t start
    int64_t stop
    bint withscores


cdef class PackedReads:
    cdef readonly bytes data           # the buffer the spans point into
    cdef PackedRead *items
    cdef readonly Py_ssize_t count
    cdef Py_ssize_t capacity
    cdef PackedRead first_item         # (as Packed's)

    cdef PackedRead *add(self) except NULL
    cdef const char *chars(self, Span *span) noexcept


cdef inline void *grown(void *items, void *first, Py_ssize_t count, Py_ssize_t *capacity,
                        size_t size) except NULL:
    """A packed run's array of ``size``-byte ``items`` (``first``: its one
    item held in the object, where it starts), with room for one more
    beyond ``count``: moved to the heap and doubled (16 at first) when
    full, ``capacity`` updated; ``MemoryError`` if there is no memory."""
    cdef Py_ssize_t more
    cdef void *moved
    if count < capacity[0]:
        return items
    more = 16 if items == first else capacity[0] * 2
    moved = realloc(NULL if items == first else items, more * size)
    if moved == NULL:
        raise MemoryError()
    if items == first:
        memcpy(moved, first, size)
    capacity[0] = more
    return moved
