# cython: language_level=3, boundscheck=False, wraparound=False
"""Native fast path of the TCP protocol's ``submit`` requests.

:func:`split` cuts a buffer into frames like ``rankd.wire.FrameDecoder``;
each run of consecutive *plain* submit requests becomes one
``rankd.engine._packed.Packed`` (fields as spans of the bytes read, no
Python object per request), which the engine applies through its native
ingest; every other frame is left for the decoder to decode.  A plain
submit is exactly::

    [id, "submit", {board, member, [delta], [score], [event_id], [label], [ts]}]

with ``id`` an integer in 1..2**32-1, ``board`` and ``member`` ASCII strings,
``event_id`` and ``label`` ASCII strings or nil, ``delta`` and ``score``
integers, floats or nil, ``ts`` nil, no key twice, nothing else, and no
byte left over.  Whatever is not plain (other ops, other keys or types,
non-ASCII text, a bad encoding) takes the general path, which decides
what it means, so the two paths cannot disagree on any request but the
plain ones, and those the tests replay both ways.

:func:`encode_answers` writes the response frames of a packed run, byte
for byte what ``rankd.wire.ok``/``rankd.wire.error`` write for the same
answers.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy

from rankd.engine._packed cimport (
    NUMBER_ABSENT, NUMBER_FLOAT, NUMBER_INT, NUMBER_NIL, NUMBER_UINT, Number, Packed,
    PackedResult, PackedSubmission, Span,
)
from rankd.engine._packing cimport (
    Reader, Writer, put_array, put_bool, put_float, put_int, put_nil, put_str, put_tag, writer_free,
    read_be, take, writer_reserve,
)

from rankd.engine.zeros import shown

cdef enum:
    LENGTH_BYTES = 4
    MAX_ID = 0xffffffff
    # Keys of a plain submit, as bits.
    K_BOARD = 1
    K_MEMBER = 2
    K_DELTA = 4
    K_SCORE = 8
    K_EVENT_ID = 16
    K_LABEL = 32
    K_TS = 64


cdef bint _text(Reader *r, const uint8_t *base, Span *span, bint nullable) noexcept:
    """An ASCII str (or nil when ``nullable``) into ``span``."""
    cdef const uint8_t *p
    cdef Py_ssize_t size, i
    cdef int width
    if not take(r, 1, &p):
        return False
    if nullable and p[0] == 0xc0:
        span.present = False
        return True
    if 0xa0 <= p[0] <= 0xbf:
        size = p[0] & 0x1f
    elif 0xd9 <= p[0] <= 0xdb:   # str8, str16, str32
        width = 1 << (p[0] - 0xd9)
        if not take(r, width, &p):
            return False
        size = <Py_ssize_t>read_be(p, width)
    else:
        return False
    if not take(r, size, &p):
        return False
    for i in range(size):
        if p[i] >= 0x80:
            return False
    span.offset = p - base
    span.size = size
    span.present = True
    return True


cdef bint _number(Reader *r, Number *out) noexcept:
    """nil, an integer of any width or a float32/float64."""
    cdef const uint8_t *p
    cdef uint8_t tag
    cdef uint64_t u
    cdef uint32_t bits32
    cdef float f32
    cdef int size
    if not take(r, 1, &p):
        return False
    tag = p[0]
    if tag == 0xc0:
        out.kind = NUMBER_NIL
    elif tag <= 0x7f:
        out.kind = NUMBER_INT
        out.ival = tag
    elif tag >= 0xe0:
        out.kind = NUMBER_INT
        out.ival = <int64_t>tag - 256
    elif 0xcc <= tag <= 0xd3:   # uint8..uint64, int8..int64
        size = 1 << ((tag - 0xcc) & 3)
        if not take(r, size, &p):
            return False
        u = read_be(p, size)
        if tag >= 0xd0:
            if size < 8 and u >> (8 * size - 1):
                u |= ~((<uint64_t>1 << (8 * size)) - 1)   # sign-extend
            out.kind = NUMBER_INT
            out.ival = <int64_t>u
        elif u > <uint64_t>0x7fffffffffffffff:
            out.kind = NUMBER_UINT
            out.uval = u
        else:
            out.kind = NUMBER_INT
            out.ival = <int64_t>u
    elif tag == 0xcb:
        if not take(r, 8, &p):
            return False
        u = read_be(p, 8)
        memcpy(&out.fval, &u, 8)
        out.kind = NUMBER_FLOAT
    elif tag == 0xca:
        if not take(r, 4, &p):
            return False
        bits32 = <uint32_t>read_be(p, 4)
        memcpy(&f32, &bits32, 4)
        out.fval = <double>f32
        out.kind = NUMBER_FLOAT
    else:
        return False
    return True


cdef inline int _key(const uint8_t *p, Py_ssize_t size) noexcept:
    if size == 5 and memcmp(p, b"board", 5) == 0:
        return K_BOARD
    if size == 6 and memcmp(p, b"member", 6) == 0:
        return K_MEMBER
    if size == 5 and memcmp(p, b"delta", 5) == 0:
        return K_DELTA
    if size == 5 and memcmp(p, b"score", 5) == 0:
        return K_SCORE
    if size == 8 and memcmp(p, b"event_id", 8) == 0:
        return K_EVENT_ID
    if size == 5 and memcmp(p, b"label", 5) == 0:
        return K_LABEL
    if size == 2 and memcmp(p, b"ts", 2) == 0:
        return K_TS
    return 0


cdef bint _plain_submit(const uint8_t *base, const uint8_t *frame, Py_ssize_t size,
                        PackedSubmission *out) noexcept:
    """Read a plain submit request (see the module docstring) into ``out``,
    with spans relative to ``base``; False for anything else."""
    cdef Reader r
    cdef const uint8_t *p
    cdef Number ignored
    cdef Span name
    cdef int n, i, key, seen = 0
    cdef uint64_t request_id
    r.p = frame
    r.end = frame + size
    if not take(&r, 1, &p) or p[0] != 0x93:
        return False
    if not take(&r, 1, &p):
        return False
    if 1 <= p[0] <= 0x7f:
        request_id = p[0]
    elif 0xcc <= p[0] <= 0xce:
        n = 1 << (p[0] - 0xcc)
        if not take(&r, n, &p):
            return False
        request_id = read_be(p, n)
        if request_id == 0:
            return False
    else:
        return False
    out.tag = <uint32_t>request_id
    if not take(&r, 7, &p) or memcmp(p, b"\xa6submit", 7) != 0:
        return False
    if not take(&r, 1, &p) or not 0x80 <= p[0] <= 0x87:
        return False
    n = p[0] & 0x0f
    for i in range(n):
        if not take(&r, 1, &p) or not 0xa0 <= p[0] <= 0xbf:
            return False
        if not take(&r, p[0] & 0x1f, &p):
            return False
        key = _key(p, r.p - p)
        if key == 0 or seen & key:
            return False
        seen |= key
        if key == K_BOARD:
            if not _text(&r, base, &out.board, False):
                return False
        elif key == K_MEMBER:
            if not _text(&r, base, &out.member, False):
                return False
        elif key == K_EVENT_ID:
            if not _text(&r, base, &out.event_id, True):
                return False
        elif key == K_LABEL:
            if not _text(&r, base, &out.label, True):
                return False
        elif key == K_DELTA:
            if not _number(&r, &out.delta):
                return False
        elif key == K_SCORE:
            if not _number(&r, &out.score):
                return False
        else:   # ts: only nil
            if not _number(&r, &ignored) or ignored.kind != NUMBER_NIL:
                return False
    return (seen & (K_BOARD | K_MEMBER)) == (K_BOARD | K_MEMBER) and r.p == r.end


def split(data, Py_ssize_t max_frame, bint pack):
    """Cut ``data`` into complete frames: ``(items, end, bad_length)``.

    ``items`` holds, in order, a ``Packed`` for each run of plain submit
    requests (when ``pack``) and ``(start, stop)`` payload offsets of every
    other frame; ``end`` is the offset after the last complete frame.
    ``bad_length`` is the length of a frame outside 1..``max_frame`` that
    stopped the split there (``end`` is its offset), else -1.
    """
    cdef list items = []
    cdef Py_ssize_t end
    bad = _split(data, max_frame, pack, items, &end)
    return items, end, bad


cdef Packed split_run(object data, Py_ssize_t max_frame):
    """The one ``Packed`` run of plain submits that all of ``data`` is, as
    :func:`split` reads it, or None (anything else: the general path's)."""
    cdef list items = []
    cdef Py_ssize_t end
    if (_split(data, max_frame, True, items, &end) >= 0 or end != len(data)
            or len(items) != 1 or type(items[0]) is not Packed):
        return None
    return <Packed>items[0]


cdef Py_ssize_t _split(object data, Py_ssize_t max_frame, bint pack, list items,
                       Py_ssize_t *end) except -2:
    """:func:`split`: the items appended to ``items``, the end set through
    ``end``; returns the bad length, or -1."""
    cdef Py_buffer view
    cdef const uint8_t *buf
    cdef Py_ssize_t size, position = 0, stop, length, run_start = 0
    cdef Packed run = None
    cdef PackedSubmission *item
    cdef Py_ssize_t bad = -1
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        buf = <const uint8_t *>view.buf
        size = view.len
        while size - position >= LENGTH_BYTES:
            length = <Py_ssize_t>read_be(buf + position, LENGTH_BYTES)
            if length == 0 or length > max_frame:
                bad = length
                break
            stop = position + LENGTH_BYTES + length
            if stop > size:
                break
            if pack:
                if run is None:
                    run = Packed(b"")
                    run_start = position
                item = run.add()
                if _plain_submit(buf + run_start, buf + position + LENGTH_BYTES, length, item):
                    item.source = Span(position + LENGTH_BYTES - run_start, length, True)
                    position = stop
                    continue
                run.count -= 1   # not plain: the run (if any) ends before this frame
                _close(run, buf, run_start, position, items)
                run = None
            items.append((position + LENGTH_BYTES, stop))
            position = stop
        _close(run, buf, run_start, position, items)
    finally:
        PyBuffer_Release(&view)
    end[0] = position
    return bad


cdef void _close(Packed run, const uint8_t *buf, Py_ssize_t start, Py_ssize_t end,
                 list items) except *:
    if run is not None and run.count:
        run.data = PyBytes_FromStringAndSize(<const char *>buf + start, end - start)
        items.append(run)


cdef inline int _put_span(Writer *w, Packed packed, Span *span) except -1:
    if span.present:
        return put_str(w, packed.chars(span), span.size)
    return put_nil(w)


def encode_answers(Packed packed, ok, error):
    """The response frames of ``packed``'s submissions, in order:
    ``(frames, answered)``.  ``ok(id, answer)`` and ``error(id, code,
    message)`` (``rankd.wire``'s) encode the answers that are Python
    objects (a dict, or an ``EngineError``); ``answered`` counts those the
    engine answered natively."""
    cdef Py_ssize_t answered
    frames = encode_run(packed, ok, error, &answered)
    return frames, answered


cdef bytes encode_run(Packed packed, object ok, object error, Py_ssize_t *answered):
    """:func:`encode_answers`, for a native lane: ``answered`` set through
    the pointer."""
    cdef Writer w
    cdef Py_ssize_t i, start, native = 0
    cdef uint32_t length
    cdef PackedSubmission *item
    cdef PackedResult *result
    cdef list answers = packed.answers
    cdef object position = packed.position
    cdef int64_t seq = 0, epoch = 0
    if position is not None:
        seq, epoch = position
    w.data = NULL
    w.size = w.cap = 0
    try:
        for i in range(packed.count):
            item = &packed.items[i]
            answer = answers[i]
            if answer is not None:
                frame = (ok(item.tag, shown(answer)) if type(answer) is dict
                         else error(item.tag, answer.code, answer.message))
                writer_reserve(&w, len(frame))
                memcpy(w.data + w.size, <const char *>(<bytes>frame), len(frame))
                w.size += len(frame)
                continue
            native += 1
            result = &packed.results[i]
            start = w.size
            writer_reserve(&w, LENGTH_BYTES)
            w.size += LENGTH_BYTES
            put_array(&w, 3)
            put_int(&w, item.tag)
            put_int(&w, 0)
            put_tag(&w, 0x87 if position is None else 0x89)   # a map of 7 (9 with seq, epoch)
            put_str(&w, b"member", 6)
            _put_span(&w, packed, &item.member)
            put_str(&w, b"score", 5)
            put_float(&w, result.score + 0.0)  # a stored -0 shows as 0 (as reads show it)
            put_str(&w, b"rank", 4)
            put_int(&w, result.rank)
            put_str(&w, b"previous", 8)
            if result.has_previous:
                put_float(&w, result.previous + 0.0)
            else:
                put_nil(&w)
            put_str(&w, b"changed", 7)
            put_bool(&w, result.changed)
            put_str(&w, b"duplicate", 9)
            put_bool(&w, False)
            put_str(&w, b"event_id", 8)
            _put_span(&w, packed, &item.event_id)
            if position is not None:
                put_str(&w, b"seq", 3)
                put_int(&w, seq)
                put_str(&w, b"epoch", 5)
                put_int(&w, epoch)
            length = <uint32_t>(w.size - start - LENGTH_BYTES)
            w.data[start] = <char>(length >> 24)
            w.data[start + 1] = <char>(length >> 16)
            w.data[start + 2] = <char>(length >> 8)
            w.data[start + 3] = <char>length
        answered[0] = native
        return PyBytes_FromStringAndSize(w.data, w.size)
    finally:
        writer_free(&w)
