# cython: language_level=3
"""RESP reply pieces written into a ``Writer`` (``_packing.pxd``), shared by
the native read kernel (``_reads``) and the RESP scanner's reply encoder:
numbers are written here rather than through ``snprintf``, which cost more
than the rest of a short reply."""

from libc.math cimport signbit
from libc.string cimport memcpy

from rankd.engine._packing cimport Writer, writer_reserve


cdef extern from "_doubles.h":
    # Redis 7.2's d2string (fpconv's Grisu2 vendored from Redis 7.2.4):
    # writes at most 24 bytes at ``buf``, returns how many.
    int rankd_d2string(char *buf, double value) noexcept nogil

cdef inline void reply_put(Writer *w, const char *text, Py_ssize_t size) except *:
    writer_reserve(w, size)
    memcpy(w.data + w.size, text, size)
    w.size += size


cdef inline int _digits(char *out, unsigned long long value) noexcept:
    """``value`` in decimal at ``out``; returns how many characters."""
    cdef char reversed_[24]
    cdef int n = 0, size = 0
    while True:
        reversed_[n] = <char>(48 + value % 10)
        n += 1
        value //= 10
        if value == 0:
            break
    while n:
        n -= 1
        out[size] = reversed_[n]
        size += 1
    return size


cdef inline void reply_header(Writer *w, char kind, long long count) except *:
    """``<kind><count>\\r\\n``: ``*`` arrays, ``$`` bulk lengths, ``:`` integers."""
    cdef char text[32]
    cdef int size = 1
    text[0] = kind
    if count < 0:
        text[1] = 45
        size = 2
        size += _digits(text + size, <unsigned long long>(-count))
    else:
        size += _digits(text + size, <unsigned long long>count)
    text[size] = 13
    text[size + 1] = 10
    reply_put(w, text, size + 2)


cdef inline void reply_bulk(Writer *w, const char *text, Py_ssize_t size) except *:
    """``text`` as a bulk string: ``$<size>\\r\\n``, its bytes, ``\\r\\n``."""
    reply_header(w, b"$", size)
    reply_put(w, text, size)
    reply_put(w, "\r\n", 2)


cdef inline void reply_double(Writer *w, double value, int version) except *:
    """A score as ``Replies.double`` writes it (Redis 7.2's ``d2string``:
    ``49.9``, not 7.0's ``49.899999999999999``; RESP3 ``,``)."""
    cdef char text[40]
    cdef int size
    cdef long long integral
    # Integral scores within double2ll's range (2**62) are written as
    # integers here, the common case; -0 is not (it is "-0").
    if -4611686018427387904.0 <= value <= 4611686018427387904.0 \
            and value == <double>(<long long>value) \
            and not (value == 0 and signbit(value)):
        integral = <long long>value
        if integral < 0:
            text[0] = 45
            size = 1 + _digits(text + 1, <unsigned long long>(-integral))
        else:
            size = _digits(text, <unsigned long long>integral)
    else:
        size = rankd_d2string(text, value)
    if version == 3:
        reply_put(w, ",", 1)
    else:
        reply_header(w, b"$", size)
    reply_put(w, text, size)
    reply_put(w, "\r\n", 2)


cdef inline void reply_null(Writer *w, int version) except *:
    if version == 3:
        reply_put(w, "_\r\n", 3)
    else:
        reply_put(w, "$-1\r\n", 5)
