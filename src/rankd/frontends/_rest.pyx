# cython: language_level=3, boundscheck=False, wraparound=False
"""The REST hot route's native ingest: a plain submission's JSON body as a
packed run of one, and its answer once applied.

:func:`pack` reads the body of ``POST /v1/boards/{board}/scores`` into a
``rankd.engine._packed.Packed`` (fields as spans of the bytes received, as
the TCP and RESP scanners do), which the engine's packed path applies with
the others of its pass (``Intake.submit_then``); :func:`answered` is the
``then`` that completes the request's future with the answer the general
path would give (``ingest.answer``'s dict, or the ``EngineError``), and
:func:`answer_json` the same answer as the JSON bytes ``orjson.dumps``
gives for it, written with no dict made (``_json.pxd``): what the hot
route's own completion (``rest_hot``) answers.

A plain body is exactly a JSON object of the keys ``member`` (required),
``delta``, ``score`` and ``event_id``, each at most once: the text fields
strings of printable ASCII without escapes, the numbers integers of at
most 15 digits (exact in a double and in int64), JSON whitespace between
tokens and nothing after the object.  Anything else (floats, escapes,
non-ASCII text, other keys or types, invalid JSON) gives None: the general
path decodes it and decides what it means, so the two cannot disagree on
any body but the plain ones, and ``tests/test_rest_hot.py`` sends those
both ways.  The engine's ingest validates the fields as it does the TCP
protocol's plain submits (lengths, the board's policy, event ids).
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport int64_t
from libc.string cimport memcmp

from rankd.engine._packed cimport NUMBER_INT, Number, Packed, PackedResult, PackedSubmission, Span
from rankd.engine._packing cimport Writer, writer_free
from rankd.frontends._json cimport (
    json_bool, json_double, json_integer, json_key, json_put, json_text,
)

import orjson

cdef object dumps = orjson.dumps

cdef enum:
    # Keys of a plain body, as bits.
    K_MEMBER = 1
    K_DELTA = 2
    K_SCORE = 4
    K_EVENT_ID = 8
    MAX_DIGITS = 15


cdef inline Py_ssize_t _space(const unsigned char *p, Py_ssize_t i, Py_ssize_t n) noexcept:
    while i < n and (p[i] == 32 or p[i] == 10 or p[i] == 13 or p[i] == 9):
        i += 1
    return i


cdef Py_ssize_t _string(const unsigned char *p, Py_ssize_t i, Py_ssize_t n,
                        Py_ssize_t shift, Span *span) noexcept:
    """The string at ``p[i]`` (its opening quote) into ``span`` (offsets
    moved by ``shift``): the index after it, or -1 if it is not plain."""
    cdef Py_ssize_t start
    cdef unsigned char c
    if i >= n or p[i] != 34:
        return -1
    i += 1
    start = i
    while i < n:
        c = p[i]
        if c == 34:
            span.offset = start + shift
            span.size = i - start
            span.present = True
            return i + 1
        if c < 32 or c >= 127 or c == 92:  # control, non-ASCII, an escape
            return -1
        i += 1
    return -1


cdef Py_ssize_t _integer(const unsigned char *p, Py_ssize_t i, Py_ssize_t n,
                         Number *number) noexcept:
    """The integer at ``p[i]`` into ``number``: the index after it, or -1
    if it is not plain (a fraction, an exponent, a leading zero, too long)."""
    cdef bint negative = False
    cdef Py_ssize_t start
    cdef int64_t value = 0
    if i < n and p[i] == 45:  # '-'
        negative = True
        i += 1
    start = i
    while i < n and 48 <= p[i] <= 57:
        if i - start == MAX_DIGITS:
            return -1
        value = value * 10 + (p[i] - 48)
        i += 1
    if i == start or (p[start] == 48 and i - start > 1):
        return -1
    if i < n and (p[i] == 46 or p[i] == 101 or p[i] == 69):  # '.', 'e', 'E'
        return -1
    number.kind = NUMBER_INT
    number.ival = -value if negative else value
    return i


cdef inline bint _key(const unsigned char *p, Span *span, const char *name,
                      Py_ssize_t size, Py_ssize_t shift) noexcept:
    return span.size == size and memcmp(p + span.offset - shift, name, size) == 0


def pack(str board, bytes body):
    """The plain submission ``body`` to ``board`` as a packed run of one,
    or None: not plain (see the module docstring), the general path's."""
    cdef bytes name
    try:
        name = board.encode("ascii")
    except UnicodeEncodeError:
        return None
    cdef Py_ssize_t shift = PyBytes_GET_SIZE(name)
    cdef bytes data = name + body
    cdef const unsigned char *p = <const unsigned char *>PyBytes_AS_STRING(data) + shift
    cdef Py_ssize_t n = PyBytes_GET_SIZE(body)
    cdef Py_ssize_t i = _space(p, 0, n)
    cdef int seen = 0, bit
    cdef Span key
    cdef Span member, event_id
    cdef Number delta, score
    if i >= n or p[i] != 123:  # '{'
        return None
    i = _space(p, i + 1, n)
    if i < n and p[i] == 125:  # '}': no member
        return None
    while True:
        i = _string(p, i, n, shift, &key)
        if i < 0:
            return None
        i = _space(p, i, n)
        if i >= n or p[i] != 58:  # ':'
            return None
        i = _space(p, i + 1, n)
        if _key(p, &key, b"member", 6, shift):
            bit = K_MEMBER
            i = _string(p, i, n, shift, &member)
        elif _key(p, &key, b"delta", 5, shift):
            bit = K_DELTA
            i = _integer(p, i, n, &delta)
        elif _key(p, &key, b"score", 5, shift):
            bit = K_SCORE
            i = _integer(p, i, n, &score)
        elif _key(p, &key, b"event_id", 8, shift):
            bit = K_EVENT_ID
            i = _string(p, i, n, shift, &event_id)
        else:
            return None
        if i < 0 or seen & bit:
            return None
        seen |= bit
        i = _space(p, i, n)
        if i < n and p[i] == 44:  # ','
            i = _space(p, i + 1, n)
            continue
        if i < n and p[i] == 125:  # '}'
            break
        return None
    if _space(p, i + 1, n) != n or not seen & K_MEMBER:
        return None
    cdef Packed packed = Packed(data)
    cdef PackedSubmission *item = packed.add()
    item.source = Span(shift, n, True)
    item.board = Span(0, shift, True)
    item.member = member
    if seen & K_EVENT_ID:
        item.event_id = event_id
    if seen & K_DELTA:
        item.delta = delta
    if seen & K_SCORE:
        item.score = score
    return packed


def answered(tuple token, error):
    """``Intake.submit_then``'s ``then`` for a run :func:`pack` made:
    ``token`` is ``(future, packed)``; the future gets the submission's
    answer, as the general path gives it, or its error."""
    future, packed_object = token
    if future.done():  # the request was cancelled (its client went away)
        return
    if error is not None:
        future.set_exception(error)
        return
    cdef Packed packed = <Packed>packed_object
    answer = packed.answers[0]
    if answer is None:
        future.set_result(_answer(packed))
    elif type(answer) is dict:
        future.set_result(answer)
    else:
        future.set_exception(answer)


cdef dict _answer(Packed packed):
    """``ingest.answer`` of the run's one submission, applied natively (and
    on a cluster node the log position, as the engine adds it)."""
    cdef PackedSubmission *item = &packed.items[0]
    cdef PackedResult *result = &packed.results[0]
    cdef dict answer = {
        # (+ 0.0: a stored -0 shows as 0, as the general path's answers show it)
        "member": packed.text(&item.member), "score": result.score + 0.0, "rank": result.rank,
        "previous": result.previous + 0.0 if result.has_previous else None,
        "changed": result.changed, "duplicate": False,
        "event_id": packed.text(&item.event_id)}
    position = packed.position
    if position is not None:
        answer["seq"], answer["epoch"] = position
    return answer


def answer_json(Packed packed):
    """The answer to the run's one submission (a run :func:`pack` made, now
    applied) as the JSON bytes ``orjson.dumps`` gives for what
    :func:`answered` would answer; raises the submission's ``EngineError``."""
    answer = packed.answers[0]
    if answer is not None:
        if type(answer) is dict:
            return dumps(answer)
        raise answer
    cdef PackedSubmission *item = &packed.items[0]
    cdef PackedResult *result = &packed.results[0]
    cdef Writer w
    w.data = NULL
    w.size = w.cap = 0
    try:
        json_key(&w, "{\"member\":")
        json_text(&w, packed.text(&item.member), dumps)
        json_key(&w, ",\"score\":")
        json_double(&w, result.score + 0.0)  # (a -0 shows as 0, as in _answer)
        json_key(&w, ",\"rank\":")
        json_integer(&w, result.rank)
        json_key(&w, ",\"previous\":")
        if result.has_previous:
            json_double(&w, result.previous + 0.0)
        else:
            json_put(&w, "null", 4)
        json_key(&w, ",\"changed\":")
        json_bool(&w, result.changed)
        json_key(&w, ",\"duplicate\":false,\"event_id\":")
        json_text(&w, packed.text(&item.event_id), dumps)
        position = packed.position
        if position is not None:
            json_key(&w, ",\"seq\":")
            json_integer(&w, position[0])
            json_key(&w, ",\"epoch\":")
            json_integer(&w, position[1])
        json_put(&w, "}", 1)
        return PyBytes_FromStringAndSize(w.data, w.size)
    finally:
        writer_free(&w)
