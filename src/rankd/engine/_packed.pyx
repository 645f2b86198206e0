# cython: language_level=3
"""Submissions in packed form (see _packed.pxd)."""

cimport cython
from cpython.bytes cimport PyBytes_AS_STRING
from cpython.unicode cimport PyUnicode_AsUTF8AndSize, PyUnicode_DecodeASCII
from libc.stdlib cimport free, realloc
from libc.string cimport memcmp, memcpy


cdef object _number(Number *number):
    if number.kind == NUMBER_INT:
        return number.ival
    if number.kind == NUMBER_UINT:
        return number.uval
    if number.kind == NUMBER_FLOAT:
        return number.fval
    return None


# One run (or several, pipelined) per request read: kept for reuse rather
# than handed back to the allocator.
@cython.freelist(64)
cdef class Packed:
    """Submissions whose text fields are spans of ``data`` (see the module
    docstring); ``len()`` of them."""

    def __cinit__(self, bytes data):
        self.data = data
        self.items = &self.first_item
        self.results = &self.first_result
        self.count = 0
        self.capacity = 1
        self.answers = None  # (set by the ingest, or to every submission's error)
        self.position = None

    def __dealloc__(self):
        if self.items != &self.first_item:
            free(self.items)
            free(self.results)

    def __len__(self):
        return self.count

    cdef PackedSubmission *add(self) except NULL:
        """A new zeroed submission at the end."""
        cdef Py_ssize_t capacity
        cdef PackedSubmission *items
        cdef PackedResult *results
        if self.count == self.capacity:
            inline = self.items == &self.first_item
            capacity = 16 if inline else self.capacity * 2
            items = <PackedSubmission *>realloc(NULL if inline else self.items,
                                                capacity * sizeof(PackedSubmission))
            if items == NULL:
                raise MemoryError()
            results = <PackedResult *>realloc(NULL if inline else self.results,
                                              capacity * sizeof(PackedResult))
            if results == NULL:
                if inline:
                    free(items)
                else:
                    self.items = items
                raise MemoryError()
            if inline:
                memcpy(items, &self.first_item, sizeof(PackedSubmission))
                memcpy(results, &self.first_result, sizeof(PackedResult))
            self.items = items
            self.results = results
            self.capacity = capacity
        self.items[self.count] = PackedSubmission(
            tag=0, source=Span(0, 0, False), board=Span(0, 0, False), member=Span(0, 0, False),
            event_id=Span(0, 0, False), label=Span(0, 0, False),
            score=Number(NUMBER_ABSENT, 0, 0, 0.0), delta=Number(NUMBER_ABSENT, 0, 0, 0.0))
        self.count += 1
        return &self.items[self.count - 1]

    cdef object text(self, Span *span):
        """The span as a ``str``, None if absent."""
        if not span.present:
            return None
        return PyUnicode_DecodeASCII(self.chars(span), span.size, NULL)

    cdef const char *chars(self, Span *span) noexcept:
        return PyBytes_AS_STRING(self.data) + span.offset

    def tags(self):
        """The front-end's tag of each submission."""
        return [self.items[i].tag for i in range(self.count)]

    def board_names(self):
        """The distinct boards submitted to (a name is made once per run of
        submissions to one board, not once per submission)."""
        cdef Span *span
        cdef Span *last = NULL
        names = set()
        for i in range(self.count):
            span = &self.items[i].board
            if (last == NULL or span.size != last.size
                    or memcmp(self.chars(span), self.chars(last), span.size) != 0):
                names.add(self.text(span))
            last = span
        return names

    cpdef bint only_board(self, str name) except -1:
        """Whether every submission is to board ``name`` (and there is one):
        a front-end's check of a run against the board it last took, with
        no ``str`` made."""
        cdef Py_ssize_t size, i
        cdef const char *text = PyUnicode_AsUTF8AndSize(name, &size)
        cdef Span *span
        if self.count == 0:
            return False
        for i in range(self.count):
            span = &self.items[i].board
            if span.size != size or memcmp(self.chars(span), text, size) != 0:
                return False
        return True

    def submission(self, Py_ssize_t i):
        """Submission ``i`` as a ``Submission`` object (what the engine's
        general path takes)."""
        from rankd.engine.submission import Submission
        cdef PackedSubmission *item
        if not 0 <= i < self.count:
            raise IndexError(i)
        item = &self.items[i]
        return Submission(board=self.text(&item.board), member=self.text(&item.member),
                          score=_number(&item.score), delta=_number(&item.delta),
                          event_id=self.text(&item.event_id), label=self.text(&item.label))

    def sources(self):
        """The bytes each submission was read from (``source`` spans), for a
        front-end that hands them back to its general path."""
        cdef Span *span
        out = []
        for i in range(self.count):
            span = &self.items[i].source
            out.append(self.data[span.offset:span.offset + span.size])
        return out

    def submissions(self):
        """Every submission as a ``Submission`` object."""
        return [self.submission(i) for i in range(self.count)]


@cython.freelist(64)
cdef class PackedReads:
    """Plain sorted-set reads whose text fields are spans of ``data`` (a
    RESP front-end's scanner fills them; ``rankd.engine._reads`` answers
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

    cdef PackedRead *add(self) except NULL:
        """A new zeroed read at the end."""
        if self.count == self.capacity:
            self.items = <PackedRead *>grown(self.items, &self.first_item, self.count,
                                             &self.capacity, sizeof(PackedRead))
        self.items[self.count] = PackedRead(
            kind=READ_SCORE, source=Span(0, 0, False), board=Span(0, 0, False),
            member=Span(0, 0, False), start=0, stop=0, withscores=False)
        self.count += 1
        return &self.items[self.count - 1]

    cdef const char *chars(self, Span *span) noexcept:
        return PyBytes_AS_STRING(self.data) + span.offset

    def source(self, Py_ssize_t i):
        """The bytes read ``i`` was read from (for the front-end's general path)."""
        cdef Span *span
        if not 0 <= i < self.count:
            raise IndexError(i)
        span = &self.items[i].source
        return self.data[span.offset:span.offset + span.size]

    def board_names(self):
        """The distinct boards read."""
        cdef Span *span
        cdef Py_ssize_t i
        names = set()
        for i in range(self.count):
            span = &self.items[i].board
            names.add(PyUnicode_DecodeASCII(self.chars(span), span.size, NULL))
        return names
