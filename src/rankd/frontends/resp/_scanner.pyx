# cython: language_level=3, boundscheck=False, wraparound=False
"""Native reading of RESP requests, and the fast path of plain writes.

:func:`scan` cuts a buffer into multibulk commands as
``rankd.frontends.resp.protocol.RequestReader`` does (the same limits,
checked on each header before its bytes are awaited, and the same protocol
errors), without a Python object per header.  Each run of consecutive
*plain* writes becomes one ``rankd.engine._packed.Packed`` (fields as spans
of the bytes read), which the engine applies through its native ingest;
every other command comes out as a list of ``bytes``.  A plain write is
exactly ``ZADD key score member`` or ``ZINCRBY key increment member`` (any
case) with ``key`` a board name of printable ASCII (1 to 512 bytes, not
``.`` nor ``..``: ``rankd.engine.config.is_board_name``), ``member``
1 to 256 printable ASCII bytes, and the number one that Redis's
``getDoubleFromObject`` takes (C's ``strtod``, all of it, no leading blank,
no overflow, not NaN) and finite.  Anything else takes the general path,
which decides what it means; the tests compare both paths' replies with
Redis's.  Likewise each run of consecutive *plain* reads becomes one
``rankd.engine._packed.PackedReads``, which the engine answers natively
(``rankd.engine._reads``): ``ZSCORE``/``ZRANK``/``ZREVRANK key member`` and
``ZRANGE``/``ZREVRANGE key start stop [WITHSCORES]`` with a board name,
a member as above and indexes as ``string2ll`` reads them.  And each run
of consecutive *plain* pops becomes one ``_pops.PackedPops``, which
``pop_lane`` removes and answers natively: ``ZPOPMIN``/``ZPOPMAX key
[count]`` with a board name and a positive count as ``string2ll`` reads
it.  An inline request stops the scan: the Python reader takes it.

:func:`encode_replies` writes the replies of a packed run, byte for byte
what the general path writes for the same answers.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_AsUTF8AndSize
from libc.math cimport isfinite, isnan
from libc.stdint cimport uint8_t
from libc.stdlib cimport strtod
from libc.string cimport memcpy

from rankd.engine._packed cimport (
    NUMBER_FLOAT, READ_RANGE, READ_RANK, READ_REVRANGE, READ_REVRANK, READ_SCORE, Packed,
    PackedRead, PackedReads, PackedResult, PackedSubmission, ReadKind, Span,
)
from rankd.engine._packing cimport Writer, writer_free
from rankd.engine._replies cimport rankd_d2string, reply_double, reply_header, reply_put
from rankd.frontends.resp._pops cimport PackedPop, PackedPops

cdef enum:
    MAX_INLINE = 64 * 1024
    MAX_NAME = 512  # rankd.engine.config.MAX_BOARD_NAME_BYTES
    MAX_MEMBER = 256
    MAX_NUMBER = 64
    TAG_ZADD = 0
    TAG_ZINCRBY = 1


cdef inline Py_ssize_t _line_end(const uint8_t *buf, Py_ssize_t position, Py_ssize_t size
                                 ) noexcept:
    """Offset of the ``\\r\\n`` at or after ``position``, or -1."""
    cdef Py_ssize_t i
    for i in range(position, size - 1):
        if buf[i] == 13 and buf[i + 1] == 10:
            return i
    return -1


cdef inline bint _length(const uint8_t *buf, Py_ssize_t start, Py_ssize_t end,
                         long long *out) noexcept:
    """The integer in a header, as Redis's ``string2ll`` reads it (an
    optional '-', no '+', no leading zero); False if it is not one."""
    cdef long long value = 0
    cdef bint negative = False
    cdef Py_ssize_t i = start
    if end - i == 1 and buf[i] == 48:
        out[0] = 0
        return True
    if i < end and buf[i] == 45:
        negative = True
        i += 1
    if i >= end or end - i > 18 or not 49 <= buf[i] <= 57 or not _digits(buf, i, end, &value):
        return False
    out[0] = -value if negative else value
    return True


cdef inline bint _digits(const uint8_t *buf, Py_ssize_t start, Py_ssize_t end,
                         long long *out) noexcept:
    """The decimal digits ``buf[start:end]`` (at most 18) as a number; False
    if one is not a digit."""
    cdef long long value = 0
    cdef Py_ssize_t i
    for i in range(start, end):
        if not 48 <= buf[i] <= 57:
            return False
        value = value * 10 + (buf[i] - 48)
    out[0] = value
    return True


cdef inline bint _name_is(const uint8_t *word, Py_ssize_t size, const char *upper,
                          Py_ssize_t length) noexcept:
    cdef Py_ssize_t i
    if size != length:
        return False
    for i in range(size):
        if (word[i] & 0xDF) != <uint8_t>upper[i]:
            return False
    return True


cdef inline bint _board_name(const uint8_t *word, Py_ssize_t size) noexcept:
    cdef Py_ssize_t i
    cdef uint8_t c
    if not 0 < size <= MAX_NAME:
        return False
    if size <= 2 and word[0] == 46 and (size == 1 or word[1] == 46):
        return False  # "." and ".."
    for i in range(size):
        c = word[i]
        if not 32 <= c <= 126:
            return False  # not ASCII, or a control: the general path decides
    return True


cdef inline bint _member(const uint8_t *word, Py_ssize_t size) noexcept:
    cdef Py_ssize_t i
    if not 0 < size <= MAX_MEMBER:
        return False
    for i in range(size):
        if not 0x20 <= word[i] <= 0x7e:
            return False
    return True


cdef bint _score(const uint8_t *word, Py_ssize_t size, double *out) noexcept:
    """Redis's ``getDoubleFromObject``, and finite."""
    cdef char text[MAX_NUMBER + 1]
    cdef char *end
    cdef double value
    if not 0 < size <= MAX_NUMBER:
        return False
    if _small_integer(word, size, out):  # "1", "-5": what most increments are
        return True
    if word[0] in (32, 9, 10, 11, 12, 13):
        return False
    memcpy(text, word, size)
    text[size] = 0
    value = strtod(text, &end)
    if end - text != size or isnan(value) or not isfinite(value):
        return False  # overflow gives infinity: refused here too
    if value == 0 and _underflows(word, size):
        return False
    out[0] = value
    return True


cdef inline bint _small_integer(const uint8_t *word, Py_ssize_t size, double *out) noexcept:
    """A sign and 1 to 15 decimal digits, read as ``strtod`` reads it
    (exactly: below 2**53), without its generality."""
    cdef Py_ssize_t i = 0
    cdef bint negative = word[0] == 45
    cdef long long value = 0
    if negative or word[0] == 43:
        i = 1
    if not 0 < size - i <= 15 or not _digits(word, i, size, &value):
        return False
    out[0] = -<double>value if negative else <double>value  # "-0" is -0.0, as strtod's
    return True


cdef bint _underflows(const uint8_t *word, Py_ssize_t size) noexcept:
    """Whether a number ``strtod`` read as 0 has a non-zero digit before
    its exponent (it underflowed: Redis refuses it, as ERANGE)."""
    cdef Py_ssize_t i = 0
    cdef bint hexadecimal
    cdef uint8_t c
    if i < size and (word[i] == 43 or word[i] == 45):
        i += 1
    hexadecimal = i + 1 < size and word[i] == 48 and (word[i + 1] | 0x20) == 120
    if hexadecimal:
        i += 2
    while i < size:
        c = word[i]
        if (c | 0x20) == (112 if hexadecimal else 101):  # the exponent: p, or e
            return False
        if c != 48 and c != 46:
            return True
        i += 1
    return False


def format_double(double value):
    """``value`` as Redis 7.2's ``d2string`` writes it (the native encoders'
    own code; ``rankd.frontends.resp.doubles`` is the pure-Python twin)."""
    cdef char text[32]
    return PyBytes_FromStringAndSize(text, rankd_d2string(text, value))


def scan(data, Py_ssize_t start_at, Py_ssize_t max_bulk, Py_ssize_t max_words, bint pack):
    """Cut ``data`` from ``start_at`` into complete multibulk commands:
    ``(items, end, error)``.

    ``items`` holds, in order, a ``Packed`` for each run of plain writes
    (when ``pack``; each item's ``tag`` says ZADD 0 or ZINCRBY 1), a
    ``PackedReads`` for each run of plain reads (when ``pack``) and a list
    of ``bytes`` for every other command; ``end`` is the offset after the
    last complete command.  ``error`` is the protocol error (Redis's text
    after ``Protocol error: ``) that stopped the scan at ``end``, or None;
    the scan also stops at an inline request or an incomplete command.
    """
    cdef list items = []
    cdef Py_ssize_t end
    error = _scan(data, start_at, max_bulk, max_words, pack, items, &end)
    return items, end, error


cdef object scan_run(object data, Py_ssize_t max_bulk, Py_ssize_t max_words):
    """The one ``Packed`` or ``PackedReads`` that all of ``data`` is, as
    :func:`scan` reads it, or None (anything else: the general path's)."""
    cdef list items = []
    cdef Py_ssize_t end
    error = _scan(data, 0, max_bulk, max_words, True, items, &end)
    if error is not None or end != len(data) or len(items) != 1 or type(items[0]) is list:
        return None
    return items[0]


cdef object _scan(object data, Py_ssize_t start_at, Py_ssize_t max_bulk,
                  Py_ssize_t max_words, bint pack, list items, Py_ssize_t *end):
    """:func:`scan`: the items appended to ``items``, the end set through
    ``end``; returns the error."""
    cdef Py_buffer view
    cdef const uint8_t *buf
    cdef Py_ssize_t size, position = 0, start, line, run_start = 0, i
    cdef long long count, length
    cdef Packed run = None
    cdef PackedSubmission *item
    cdef list words
    cdef Py_ssize_t offsets[5]
    cdef Py_ssize_t sizes[5]
    cdef PackedReads reads = None
    cdef Py_ssize_t reads_start = 0
    cdef PackedRead *read
    cdef long long first_index, last_index
    cdef int kind
    cdef double value
    cdef bint complete
    cdef int tag
    cdef PackedPops pops = None
    cdef Py_ssize_t pops_start = 0
    cdef PackedPop *pop
    cdef long long pop_count
    error = None
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        buf = <const uint8_t *>view.buf
        size = view.len
        position = start_at
        while position < size:
            if buf[position] != 42:  # not '*': an inline request
                break
            start = position
            line = _line_end(buf, position, size)
            if line < 0:
                if size - position > MAX_INLINE:
                    error = "too big multibulk count string"
                break
            if not _length(buf, position + 1, line, &count):
                error = "invalid multibulk length"
                break
            if count > max_words:
                error = "invalid multibulk length"
                break
            position = line + 2
            if count <= 0:
                continue  # Redis ignores empty requests
            complete = True
            for i in range(count):
                if position >= size:
                    complete = False
                    break
                line = _line_end(buf, position, size)
                if line < 0:
                    if size - position > MAX_INLINE:
                        error = "too big bulk count string"
                    complete = False
                    break
                if buf[position] != 36:  # '$'
                    error = f"expected '$', got '{chr(buf[position])}'"
                    complete = False
                    break
                if not _length(buf, position + 1, line, &length) or length < 0 \
                        or length > max_bulk:
                    error = "invalid bulk length"
                    complete = False
                    break
                if line + 2 + length + 2 > size:
                    complete = False
                    break
                if i < 5:
                    offsets[i] = line + 2
                    sizes[i] = <Py_ssize_t>length
                position = line + 2 + <Py_ssize_t>length + 2
            if not complete:
                position = start
                break
            if pack and count == 4 and _board_name(buf + offsets[1], sizes[1]) \
                    and _member(buf + offsets[3], sizes[3]) \
                    and _score(buf + offsets[2], sizes[2], &value):
                if _name_is(buf + offsets[0], sizes[0], b"ZADD", 4):
                    tag = TAG_ZADD
                elif _name_is(buf + offsets[0], sizes[0], b"ZINCRBY", 7):
                    tag = TAG_ZINCRBY
                else:
                    tag = -1
                if tag >= 0:
                    _close_reads(reads, data, buf, reads_start, start, items)
                    reads = None
                    if pops is not None:
                        _close_pops(pops, data, buf, pops_start, start, items)
                        pops = None
                    if run is None:
                        run = Packed(b"")
                        run_start = start
                    item = run.add()
                    item.tag = tag
                    item.source = Span(start - run_start, position - start, True)
                    item.board = Span(offsets[1] - run_start, sizes[1], True)
                    item.member = Span(offsets[3] - run_start, sizes[3], True)
                    if tag == TAG_ZADD:
                        item.score.kind = NUMBER_FLOAT
                        item.score.fval = value
                    else:
                        item.delta.kind = NUMBER_FLOAT
                        item.delta.fval = value
                    continue
            kind = _read_kind(buf, count, offsets, sizes) if pack else -1
            if kind >= 0 and kind <= READ_REVRANK:
                read_ok = _member(buf + offsets[2], sizes[2])
            elif kind >= 0:
                read_ok = (_length(buf, offsets[2], offsets[2] + sizes[2], &first_index)
                           and _length(buf, offsets[3], offsets[3] + sizes[3], &last_index))
            else:
                read_ok = False
            if read_ok:
                _close(run, data, buf, run_start, start, items)
                run = None
                if pops is not None:
                    _close_pops(pops, data, buf, pops_start, start, items)
                    pops = None
                if reads is None:
                    reads = PackedReads(b"")
                    reads_start = start
                read = reads.add()
                read.kind = <ReadKind>kind
                read.source = Span(start - reads_start, position - start, True)
                read.board = Span(offsets[1] - reads_start, sizes[1], True)
                if kind <= READ_REVRANK:
                    read.member = Span(offsets[2] - reads_start, sizes[2], True)
                else:
                    read.start, read.stop = first_index, last_index
                    read.withscores = count == 5
                continue
            pop_count = -1
            tag = _pop_kind(buf, count, offsets, sizes, &pop_count) if pack and count <= 3 else -1
            if tag >= 0:
                _close(run, data, buf, run_start, start, items)
                run = None
                _close_reads(reads, data, buf, reads_start, start, items)
                reads = None
                if pops is None:
                    pops = PackedPops(b"")
                    pops_start = start
                pop = pops.add()
                pop.source = Span(start - pops_start, position - start, True)
                pop.board = Span(offsets[1] - pops_start, sizes[1], True)
                pop.count = pop_count
                pop.highest = tag == 1
                continue
            _close(run, data, buf, run_start, start, items)
            run = None
            _close_reads(reads, data, buf, reads_start, start, items)
            reads = None
            if pops is not None:
                _close_pops(pops, data, buf, pops_start, start, items)
                pops = None
            words = []
            position = start
            line = _line_end(buf, position, size)
            position = line + 2
            for i in range(count):
                line = _line_end(buf, position, size)
                _length(buf, position + 1, line, &length)
                words.append(PyBytes_FromStringAndSize(<const char *>buf + line + 2,
                                                       <Py_ssize_t>length))
                position = line + 2 + <Py_ssize_t>length + 2
            items.append(words)
        _close(run, data, buf, run_start, position, items)
        _close_reads(reads, data, buf, reads_start, position, items)
        if pops is not None:
            _close_pops(pops, data, buf, pops_start, position, items)
    finally:
        PyBuffer_Release(&view)
    end[0] = position
    return error


cdef int _read_kind(const uint8_t *buf, long long count, Py_ssize_t *offsets,
                    Py_ssize_t *sizes) noexcept:
    """Which plain read a command is (``ReadKind``), or -1: ``ZSCORE``,
    ``ZRANK``, ``ZREVRANK`` with a key and a member, ``ZRANGE`` and
    ``ZREVRANGE`` with a key, two indexes and perhaps ``WITHSCORES``."""
    if count < 3 or count > 5 or not _board_name(buf + offsets[1], sizes[1]):
        return -1
    if count == 3:
        if _name_is(buf + offsets[0], sizes[0], b"ZSCORE", 6):
            return READ_SCORE
        if _name_is(buf + offsets[0], sizes[0], b"ZRANK", 5):
            return READ_RANK
        if _name_is(buf + offsets[0], sizes[0], b"ZREVRANK", 8):
            return READ_REVRANK
        return -1
    if count == 5 and not _name_is(buf + offsets[4], sizes[4], b"WITHSCORES", 10):
        return -1
    if _name_is(buf + offsets[0], sizes[0], b"ZRANGE", 6):
        return READ_RANGE
    if _name_is(buf + offsets[0], sizes[0], b"ZREVRANGE", 9):
        return READ_REVRANGE
    return -1


cdef int _pop_kind(const uint8_t *buf, long long count, Py_ssize_t *offsets,
                  Py_ssize_t *sizes, long long *pop_count) noexcept:
    """Whether a command is a plain pop: 1 for ``ZPOPMAX``, 0 for
    ``ZPOPMIN key [count]`` with a board name and a positive count (set
    through ``pop_count``), else -1."""
    cdef int kind
    if count < 2 or sizes[0] != 7 or not _board_name(buf + offsets[1], sizes[1]):
        return -1
    if _name_is(buf + offsets[0], sizes[0], b"ZPOPMIN", 7):
        kind = 0
    elif _name_is(buf + offsets[0], sizes[0], b"ZPOPMAX", 7):
        kind = 1
    else:
        return -1
    if count == 3 and not (_length(buf, offsets[2], offsets[2] + sizes[2], pop_count)
                           and pop_count[0] >= 1):
        return -1
    return kind


cdef bytes _part(object data, const uint8_t *buf, Py_ssize_t start, Py_ssize_t end):
    """``data[start:end]`` as bytes: ``data`` itself when that is all of it
    (a read of one command, the common case, is not copied)."""
    if start == 0 and type(data) is bytes and end == PyBytes_GET_SIZE(data):
        return <bytes>data
    return PyBytes_FromStringAndSize(<const char *>buf + start, end - start)


cdef void _close_reads(PackedReads reads, object data, const uint8_t *buf, Py_ssize_t start,
                       Py_ssize_t end, list items) except *:
    if reads is not None and reads.count:
        reads.data = _part(data, buf, start, end)
        items.append(reads)


cdef void _close_pops(PackedPops pops, object data, const uint8_t *buf, Py_ssize_t start,
                      Py_ssize_t end, list items) except *:
    if pops is not None and pops.count:
        pops.data = _part(data, buf, start, end)
        items.append(pops)


cdef void _close(Packed run, object data, const uint8_t *buf, Py_ssize_t start,
                 Py_ssize_t end, list items) except *:
    if run is not None and run.count:
        run.data = _part(data, buf, start, end)
        items.append(run)


def encode_replies(Packed packed, int version, reply):
    """The replies of ``packed``'s writes, in order: ``(data, answered)``.
    ``reply(tag, answer, value)`` encodes an answer that is a Python object
    (a dict the general ingest made, or an ``EngineError``); ``answered``
    counts those the engine answered natively."""
    cdef Py_ssize_t answered
    data = replies_of(packed, version, reply, &answered)
    return data, answered


cdef bytes replies_of(Packed packed, int version, object reply, Py_ssize_t *answered):
    """:func:`encode_replies`, for a native lane: ``answered`` set through
    the pointer."""
    cdef Writer w
    cdef Py_ssize_t i, native = 0
    cdef PackedSubmission *item
    cdef PackedResult *result
    cdef list answers = packed.answers
    cdef bytes encoded
    w.data = NULL
    w.size = w.cap = 0
    try:
        for i in range(packed.count):
            item = &packed.items[i]
            answer = answers[i]
            if answer is not None:
                encoded = reply(item.tag, answer,
                                item.score.fval if item.tag == TAG_ZADD else item.delta.fval)
                reply_put(&w, <const char *>encoded, len(encoded))
                continue
            native += 1
            result = &packed.results[i]
            if item.tag == TAG_ZADD:
                reply_put(&w, ":0\r\n" if result.has_previous else ":1\r\n", 4)
            else:
                # Redis's reply: the score plus the increment, or the increment
                # itself for a new member (-0 stays -0; -0 + 0 is 0, though a
                # -0 score stays, as equal to it).
                reply_double(&w, result.previous + item.delta.fval if result.has_previous
                             else item.delta.fval, version)
        answered[0] = native
        return PyBytes_FromStringAndSize(w.data, w.size)
    finally:
        writer_free(&w)


cdef void _bulk_text(Writer *w, str text) except *:
    cdef Py_ssize_t size
    cdef const char *data = PyUnicode_AsUTF8AndSize(text, &size)
    reply_header(w, b"$", size)
    reply_put(w, data, size)
    reply_put(w, "\r\n", 2)


def encode_entries(list entries, bint withscores, int version, bint nested):
    """A range reply of ``(rank, member, score)`` entries, as
    ``sorted_sets._entries`` writes it: members (and scores), flat in RESP2,
    ``[member, score]`` pairs in RESP3 when ``nested``."""
    cdef Writer w
    cdef Py_ssize_t count = len(entries)
    cdef bint pairs = withscores and nested and version == 3
    w.data = NULL
    w.size = w.cap = 0
    try:
        reply_header(&w, b"*", count * 2 if withscores and not pairs else count)
        for entry in entries:
            if pairs:
                reply_put(&w, "*2\r\n", 4)
            _bulk_text(&w, <str>(<tuple>entry)[1])
            if withscores:
                reply_double(&w, <double>(<tuple>entry)[2], version)
        return PyBytes_FromStringAndSize(w.data, w.size)
    finally:
        writer_free(&w)
