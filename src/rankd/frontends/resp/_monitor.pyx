# cython: language_level=3, boundscheck=False, wraparound=False
"""MONITOR's quoting natively: :func:`quoted` is
``rankd.frontends.resp.monitor.quoted`` (Redis's ``sdscatrepr``) in one
pass, so a word of a megabyte is quoted in about a millisecond and a
monitor's line never holds the event loop."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.string cimport memcpy

cdef const char *HEX = b"0123456789abcdef"


def quoted(bytes word):
    """``word`` between double quotes, escaped as ``sdscatrepr`` escapes it."""
    cdef Py_ssize_t size = PyBytes_GET_SIZE(word), i, extra = 0
    cdef const unsigned char *data = <const unsigned char *>PyBytes_AS_STRING(word)
    cdef unsigned char c
    for i in range(size):
        c = data[i]
        if c == b'\\' or c == b'"' or c == b'\n' or c == b'\r' or c == b'\t' or c == 7 \
                or c == 8:
            extra += 1
        elif c < 0x20 or c > 0x7e:
            extra += 3
    result = PyBytes_FromStringAndSize(NULL, size + extra + 2)
    cdef char *out = PyBytes_AS_STRING(result)
    cdef Py_ssize_t o = 1
    out[0] = b'"'
    if extra == 0:
        memcpy(out + 1, data, size)
        o += size
    else:
        for i in range(size):
            c = data[i]
            if c == b'\\' or c == b'"':
                out[o] = b'\\'
                out[o + 1] = c
                o += 2
            elif c == b'\n' or c == b'\r' or c == b'\t' or c == 7 or c == 8:
                out[o] = b'\\'
                out[o + 1] = (b'n' if c == b'\n' else b'r' if c == b'\r' else
                              b't' if c == b'\t' else b'a' if c == 7 else b'b')
                o += 2
            elif c < 0x20 or c > 0x7e:
                out[o] = b'\\'
                out[o + 1] = b'x'
                out[o + 2] = HEX[c >> 4]
                out[o + 3] = HEX[c & 15]
                o += 4
            else:
                out[o] = c
                o += 1
    out[o] = b'"'
    return result
