# cython: language_level=3, boundscheck=False, wraparound=False
"""Native replay of SUBMIT records.

The hot loop of recovery: ``rankd.engine.replay`` documents what replaying
a SUBMIT record does, and ``replay_submits_python`` there is the reference
this must match state for state (the tests compare them on random records).

A record is read straight from its msgpack payload, in the layout
``rankd.engine.records`` writes (an 11-item array; see that module), with
no intermediate Python objects: only the member, event id, label, scores
and log position the state keeps are created.  Anything else (another
kind or board, an encoding our packer does not produce) stops the walk at
that record, *before* any of its effects, and the caller replays it from
its decoded form.  A record is parsed whole before it changes anything.

The batch is a list of ``(lsn, payload)`` or, in recovery, a ``Frames``
batch (``_frames.pyx``): payloads left in the log's buffer, read in place,
so the tail makes no per-record payload or tuple objects.  The states
gathered are appended to packed runs (``rankd.index.packed``: a
``bytearray`` per index, which the native index reads in place), so a
record makes no object at all unless it carries a label (the board keeps
it as a str).
"""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING
from cpython.dict cimport PyDict_GetItem, PyDict_SetItem
from cpython.ref cimport PyObject
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy

from rankd._skiplist cimport (
    MAX_MEMBER_BYTES,
    PACKED_HEAD,
    rk_store_f64,
    rk_store_u16,
    rk_store_u64,
    rk_utf8_valid,
)
from rankd.engine._idstore cimport FingerprintLog, answer_flags
from rankd.engine._frames cimport Frames
from rankd.engine._packing cimport Reader, content_fingerprint, read_be, take

cdef enum:
    SUBMIT = 3
    RECORD_ITEMS = 11
    RESULT_ITEMS = 4
    MAX_UPDATES = 16     # a board has at most 4 windows
    MAX_CACHED = 32      # (window, period) pairs remembered per call


cdef struct Text:
    const char *data
    Py_ssize_t size
    bint present          # False: nil


cdef struct Update:
    Text window
    Text period
    double score


cdef struct Record:
    Text board
    Text member
    Text event_id
    Text label
    double value
    bint is_delta
    int64_t now_ms
    Py_ssize_t nupdates
    Update updates[MAX_UPDATES]
    double score, previous
    int64_t rank
    bint has_score, has_previous, has_rank, changed


cdef struct Cached:
    Text window
    Text period
    PyObject *states     # borrowed from `keep`; NULL: a window the board no longer has


# --- msgpack readers: 0 on success, -1 for anything outside the subset ---------------

cdef int _array(Reader *r, Py_ssize_t *n) noexcept:
    cdef const uint8_t *p
    if not take(r, 1, &p):
        return -1
    if 0x90 <= p[0] <= 0x9f:
        n[0] = p[0] & 0x0f
    elif p[0] == 0xdc:
        if not take(r, 2, &p):
            return -1
        n[0] = <Py_ssize_t>read_be(p, 2)
    else:
        return -1
    return 0


cdef int _int(Reader *r, int64_t *out) noexcept:
    cdef const uint8_t *p
    cdef uint8_t tag
    cdef uint64_t u
    cdef int size
    if not take(r, 1, &p):
        return -1
    tag = p[0]
    if tag <= 0x7f:
        out[0] = tag
        return 0
    if tag >= 0xe0:
        out[0] = <int64_t>tag - 256
        return 0
    if 0xcc <= tag <= 0xd3:   # uint8..uint64, int8..int64
        size = 1 << ((tag - 0xcc) & 3)
        if not take(r, size, &p):
            return -1
        u = read_be(p, size)
        if tag >= 0xd0:
            if size < 8 and u >> (8 * size - 1):
                u |= ~((<uint64_t>1 << (8 * size)) - 1)   # sign-extend
        elif u > <uint64_t>0x7fffffffffffffff:
            return -1
        out[0] = <int64_t>u
        return 0
    return -1


cdef int _float(Reader *r, double *out) noexcept:
    """A float64: what the packer writes for every Python float."""
    cdef const uint8_t *p
    cdef uint64_t bits
    if not take(r, 1, &p) or p[0] != 0xcb or not take(r, 8, &p):
        return -1
    bits = read_be(p, 8)
    memcpy(out, &bits, 8)
    return 0


cdef int _nil(Reader *r) noexcept:
    """1 and consumed if the next item is nil, else 0."""
    if r.p < r.end and r.p[0] == 0xc0:
        r.p += 1
        return 1
    return 0


cdef int _bool(Reader *r, bint *out) noexcept:
    cdef const uint8_t *p
    if not take(r, 1, &p) or (p[0] != 0xc2 and p[0] != 0xc3):
        return -1
    out[0] = p[0] == 0xc3
    return 0


cdef int _text(Reader *r, Text *out, bint nullable) noexcept:
    cdef const uint8_t *p
    cdef Py_ssize_t size
    cdef int width
    out.present = False
    if nullable and _nil(r):
        return 0
    if not take(r, 1, &p):
        return -1
    if 0xa0 <= p[0] <= 0xbf:
        size = p[0] & 0x1f
    elif 0xd9 <= p[0] <= 0xdb:   # str8, str16, str32
        width = 1 << (p[0] - 0xd9)
        if not take(r, width, &p):
            return -1
        size = <Py_ssize_t>read_be(p, width)
    else:
        return -1
    if not take(r, size, &p):
        return -1
    out.data = <const char *>p
    out.size = size
    out.present = True
    return 0


cdef int _number(Reader *r, double *out) noexcept:
    """A float64, or an int (as a float)."""
    cdef int64_t as_int
    if r.p < r.end and r.p[0] == 0xcb:
        return _float(r, out)
    if _int(r, &as_int) < 0:
        return -1
    out[0] = <double>as_int
    return 0


cdef int _parse(const uint8_t *data, Py_ssize_t size, Record *rec) noexcept:
    """Read a whole SUBMIT record into ``rec``; -1 if it is not one we read."""
    cdef Reader r
    cdef Py_ssize_t n, i
    cdef int64_t kind, ignored
    r.p = data
    r.end = data + size
    if _array(&r, &n) < 0 or n != RECORD_ITEMS:
        return -1
    if _int(&r, &kind) < 0 or kind != SUBMIT:
        return -1
    if (_text(&r, &rec.board, False) < 0 or _text(&r, &rec.member, False) < 0
            or _number(&r, &rec.value) < 0 or _bool(&r, &rec.is_delta) < 0
            or _text(&r, &rec.event_id, True) < 0 or _int(&r, &ignored) < 0
            or _int(&r, &rec.now_ms) < 0 or _text(&r, &rec.label, True) < 0):
        return -1
    if _array(&r, &rec.nupdates) < 0 or rec.nupdates > MAX_UPDATES:
        return -1
    for i in range(rec.nupdates):
        if (_array(&r, &n) < 0 or n != 3 or _text(&r, &rec.updates[i].window, False) < 0
                or _text(&r, &rec.updates[i].period, False) < 0
                or _float(&r, &rec.updates[i].score) < 0):
            return -1
    if _array(&r, &n) < 0 or n != RESULT_ITEMS:
        return -1
    rec.has_score = not _nil(&r)
    if rec.has_score and _float(&r, &rec.score) < 0:
        return -1
    rec.has_rank = not _nil(&r)
    if rec.has_rank and _int(&r, &rec.rank) < 0:
        return -1
    rec.has_previous = not _nil(&r)
    if rec.has_previous and _float(&r, &rec.previous) < 0:
        return -1
    if _bool(&r, &rec.changed) < 0:
        return -1
    return 0 if r.p == r.end else -1


cdef inline bint _same(Text *a, Text *b) noexcept:
    return a.size == b.size and memcmp(a.data, b.data, a.size) == 0


cdef inline object _str(Text *t):
    return PyUnicode_DecodeUTF8(t.data, t.size, NULL)


cdef inline int _check_utf8(Text *t) except -1:
    """Raise what decoding would raise if ``t`` is present and not UTF-8
    (as msgpack does for the Python replay), without making a str."""
    if t.present and not rk_utf8_valid(<const uint8_t *>t.data, t.size):
        _str(t)
    return 0


cdef int _append_state(bytearray run, Text *member, double score, uint64_t lsn) except -1:
    """Append ``(member, score, lsn)`` to a packed run (``rankd.index.packed``)."""
    cdef Py_ssize_t at = PyByteArray_GET_SIZE(run)
    cdef char *p
    PyByteArray_Resize(run, at + PACKED_HEAD + member.size)  # (it over-allocates)
    p = PyByteArray_AS_STRING(run) + at
    rk_store_f64(p, score)
    rk_store_u64(p + 8, lsn)
    rk_store_u16(p + 16, <uint16_t>member.size)
    memcpy(p + PACKED_HEAD, member.data, member.size)
    return 0


cdef int _remember(FingerprintLog log, Record *rec, double expires_at) except -1:
    """Note the record's event id and result in the dedupe table, as
    ``rankd.engine.ingest.note_submit`` does: the id's fingerprint, the
    payload's (member and content fingerprint) and the answer."""
    cdef uint64_t fingerprint = content_fingerprint(
        rec.is_delta, rec.value, rec.label.data if rec.label.present else NULL,
        rec.label.size)
    cdef uint32_t payload = log.c_payload(rec.member.data, rec.member.size, fingerprint, True)
    return log.c_put(log.c_id_fingerprint(rec.event_id.data, rec.event_id.size), payload,
                     expires_at, answer_flags(rec.has_score, rec.has_previous, rec.has_rank,
                                              rec.changed),
                     rec.score, rec.previous, <uint64_t>rec.rank)


cdef Py_ssize_t _cache_states(Cached *cache, Py_ssize_t *ncached, Update *update, str name,
                              dict windows, dict pending, list keep) except -1:
    """Remember which pending packed run a ``(window, period)`` feeds
    (``NULL``: a window the board no longer has); return its cache slot."""
    cdef Py_ssize_t c
    cdef PyObject *found
    if ncached[0] == MAX_CACHED:
        ncached[0] = 0  # start over; `keep` still owns the lists
    c = ncached[0]
    ncached[0] += 1
    cache[c].window = update.window
    cache[c].period = update.period
    cache[c].states = NULL
    window = _str(&update.window)
    period = _str(&update.period)  # even when unused: it must be valid UTF-8
    if window in windows:  # else removed by a later config change
        key = (name, window, period)
        found = PyDict_GetItem(pending, key)
        if found == NULL:
            states = bytearray()
            PyDict_SetItem(pending, key, states)
        else:
            states = <object>found
        keep.append(states)
        cache[c].states = <PyObject *>states
    return c


def replay_submits(board, batch, Py_ssize_t start, double dedupe_ttl, dict pending):
    """``(stop, gathered)``; see ``rankd.engine.replay.replay_submits_python``
    (``batch``: a list of ``(lsn, payload)``, or a ``Frames`` batch)."""
    cdef Record rec
    cdef Cached cache[MAX_CACHED]
    cdef Py_ssize_t ncached = 0, stop = start, gathered = 0, changed = 0, i, c
    cdef int64_t last_now_ms = 0
    cdef bytes name = board.name.encode()
    cdef Text board_name
    cdef dict windows = board.periods
    cdef dict labels = board.labels
    log = board.dedupe.log
    cdef list keep = []          # owns the cached packed runs
    cdef tuple item
    cdef bytes payload
    cdef uint64_t lsn
    cdef PyObject *targets[MAX_UPDATES]
    cdef Frames frames = batch if type(batch) is Frames else None
    cdef list items = None if frames is not None else <list?>batch
    cdef Py_ssize_t count = len(batch)
    cdef const uint8_t *data
    cdef Py_ssize_t size
    board_name.data = PyBytes_AS_STRING(name)
    board_name.size = len(name)
    if type(log) is not FingerprintLog:
        return start, 0  # the pure-Python store: the caller replays from decoded records
    while stop < count:
        if frames is not None:
            data = frames.base + frames.spans[stop].offset
            size = frames.spans[stop].size
        else:
            item = <tuple?>items[stop]
            payload = <bytes?>item[1]
            data = <const uint8_t *>PyBytes_AS_STRING(payload)
            size = len(payload)
        if (_parse(data, size, &rec) < 0
                or not _same(&rec.board, &board_name)
                or rec.member.size > MAX_MEMBER_BYTES):
            break
        # Everything that can fail (UTF-8 decoding) before any effect.
        _check_utf8(&rec.member)
        _check_utf8(&rec.event_id)
        label = _str(&rec.label) if rec.label.present else None
        lsn = <uint64_t>(frames.first_lsn + stop) if frames is not None else item[0]
        for i in range(rec.nupdates):
            for c in range(ncached):
                if (_same(&cache[c].window, &rec.updates[i].window)
                        and _same(&cache[c].period, &rec.updates[i].period)):
                    break
            else:
                c = _cache_states(cache, &ncached, &rec.updates[i], board.name, windows,
                                  pending, keep)
            targets[i] = cache[c].states
        for i in range(rec.nupdates):
            if targets[i] != NULL:
                _append_state(<bytearray>targets[i], &rec.member, rec.updates[i].score, lsn)
                gathered += 1
        if label is not None:
            PyDict_SetItem(labels, _str(&rec.member), label)
        if rec.event_id.present:
            _remember(<FingerprintLog>log, &rec, <double>rec.now_ms / 1000.0 + dedupe_ttl)
        if rec.nupdates:
            changed += 1
            last_now_ms = rec.now_ms
        stop += 1
    if changed:
        board.version += changed
        board.updated_at = <double>last_now_ms / 1000.0
    return stop, gathered
