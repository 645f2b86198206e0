# cython: language_level=3
"""Byte layouts rankd's native modules read and write, in one place.

* The first steps of reading msgpack in place (:struct:`Reader`), shared
  by recovery's replay and the TCP protocol's scanner.
* A msgpack writer for the subset :mod:`rankd.engine.records` produces
  (arrays, ints, float64, str, nil, bool), byte for byte what
  ``msgpack.Packer(use_bin_type=True)`` writes for the same Python values,
  so a record encoded natively is the record ``records.encode`` would give.
* The content fingerprint of a submission (:func:`rankd.engine.dedupe.fingerprint`),
  which live ingest (``_ingest``) and replay (``_replay``) both compute.

Everything is ``cdef inline``: each module that cimports this file gets
its own copy, with no call across modules.
"""

from libc.stdint cimport int64_t, uint8_t, uint64_t
from libc.stdlib cimport free, realloc
from libc.string cimport memcpy

cdef inline uint64_t _fnv1a(uint64_t h, const char *data, Py_ssize_t size) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(size):
        h = (h ^ <uint8_t>data[i]) * <uint64_t>0x100000001b3
    return h


cdef inline uint64_t content_fingerprint(bint is_delta, double value, const char *label,
                                         Py_ssize_t label_size) noexcept nogil:
    """``rankd.engine.dedupe.fingerprint``: FNV-1a 64 of what a submission
    asked for besides its member (``label`` NULL: none)."""
    cdef char head[10]
    head[0] = 1 if is_delta else 0
    memcpy(head + 1, &value, 8)  # little-endian hosts only (see setup.py)
    head[9] = 0 if label == NULL else 1
    cdef uint64_t h = _fnv1a(<uint64_t>0xcbf29ce484222325, head, 10)
    return h if label == NULL else _fnv1a(h, label, label_size)


# --- reading in place -----------------------------------------------------------------

cdef struct Reader:
    const uint8_t *p      # the next byte to read
    const uint8_t *end


cdef inline bint take(Reader *r, Py_ssize_t n, const uint8_t **out) noexcept:
    """The next ``n`` bytes into ``out``; False (nothing taken) if fewer are left."""
    if r.end - r.p < n:
        return False
    out[0] = r.p
    r.p += n
    return True


cdef inline uint64_t read_be(const uint8_t *p, int n) noexcept:
    """An ``n``-byte big-endian unsigned integer."""
    cdef uint64_t v = 0
    cdef int i
    for i in range(n):
        v = (v << 8) | p[i]
    return v


# --- msgpack writer ------------------------------------------------------------------

cdef struct Writer:
    char *data
    Py_ssize_t size
    Py_ssize_t cap


cdef inline int writer_reserve(Writer *w, Py_ssize_t more) except -1:
    cdef Py_ssize_t cap
    cdef char *data
    if w.size + more <= w.cap:
        return 0
    cap = w.cap * 2 if w.cap else 256
    while cap < w.size + more:
        cap *= 2
    data = <char *>realloc(w.data, cap)
    if data == NULL:
        raise MemoryError()
    w.data = data
    w.cap = cap
    return 0


cdef inline void writer_free(Writer *w) noexcept:
    free(w.data)
    w.data = NULL
    w.size = w.cap = 0


cdef inline void _put_be(Writer *w, uint64_t value, int width) noexcept:
    cdef int i
    for i in range(width - 1, -1, -1):
        w.data[w.size + i] = <char>(value & 0xff)
        value >>= 8
    w.size += width


cdef inline int put_tag(Writer *w, uint8_t tag) except -1:
    writer_reserve(w, 1)
    w.data[w.size] = <char>tag
    w.size += 1
    return 0


cdef inline int put_nil(Writer *w) except -1:
    return put_tag(w, 0xc0)


cdef inline int put_bool(Writer *w, bint value) except -1:
    return put_tag(w, 0xc3 if value else 0xc2)


cdef inline int put_array(Writer *w, Py_ssize_t n) except -1:
    writer_reserve(w, 5)
    if n < 16:
        w.data[w.size] = <char>(0x90 | n)
        w.size += 1
    elif n < 0x10000:
        w.data[w.size] = <char>0xdc
        w.size += 1
        _put_be(w, n, 2)
    else:
        w.data[w.size] = <char>0xdd
        w.size += 1
        _put_be(w, n, 4)
    return 0


cdef inline int put_int(Writer *w, int64_t value) except -1:
    """The shortest form, as msgpack-python's packer chooses it."""
    cdef uint64_t u
    writer_reserve(w, 9)
    if value >= 0:
        u = <uint64_t>value
        if u < 0x80:
            w.data[w.size] = <char>u
            w.size += 1
            return 0
        if u <= 0xff:
            w.data[w.size] = <char>0xcc
            w.size += 1
            _put_be(w, u, 1)
        elif u <= 0xffff:
            w.data[w.size] = <char>0xcd
            w.size += 1
            _put_be(w, u, 2)
        elif u <= 0xffffffff:
            w.data[w.size] = <char>0xce
            w.size += 1
            _put_be(w, u, 4)
        else:
            w.data[w.size] = <char>0xcf
            w.size += 1
            _put_be(w, u, 8)
        return 0
    if value >= -32:
        w.data[w.size] = <char>(<uint8_t>(value & 0xff))
        w.size += 1
    elif value >= -128:
        w.data[w.size] = <char>0xd0
        w.size += 1
        _put_be(w, <uint64_t>value, 1)
    elif value >= -32768:
        w.data[w.size] = <char>0xd1
        w.size += 1
        _put_be(w, <uint64_t>value, 2)
    elif value >= -2147483648:
        w.data[w.size] = <char>0xd2
        w.size += 1
        _put_be(w, <uint64_t>value, 4)
    else:
        w.data[w.size] = <char>0xd3
        w.size += 1
        _put_be(w, <uint64_t>value, 8)
    return 0


cdef inline int put_float(Writer *w, double value) except -1:
    cdef uint64_t bits
    memcpy(&bits, &value, 8)
    writer_reserve(w, 9)
    w.data[w.size] = <char>0xcb
    w.size += 1
    _put_be(w, bits, 8)
    return 0


cdef inline int put_str(Writer *w, const char *data, Py_ssize_t size) except -1:
    """UTF-8 text (the packer's str forms with ``use_bin_type=True``)."""
    writer_reserve(w, 5 + size)
    if size < 32:
        w.data[w.size] = <char>(0xa0 | size)
        w.size += 1
    elif size < 0x100:
        w.data[w.size] = <char>0xd9
        w.size += 1
        _put_be(w, size, 1)
    elif size < 0x10000:
        w.data[w.size] = <char>0xda
        w.size += 1
        _put_be(w, size, 2)
    else:
        w.data[w.size] = <char>0xdb
        w.size += 1
        _put_be(w, size, 4)
    memcpy(w.data + w.size, data, size)
    w.size += size
    return 0
