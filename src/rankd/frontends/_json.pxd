# cython: language_level=3
"""JSON values written as orjson writes them, natively, into a ``Writer``
(``rankd.engine._packing``): the REST hot route's answers (``_rest``,
``_rest_reads``) made with no dict built and no encoder called.

* Integers in decimal.
* Doubles as Python's ``repr`` (the shortest text that reads back the
  same double, which is orjson's too) rewritten where orjson's notation
  differs: an exponent of -5 in fixed notation (``1e-05`` is ``0.00001``),
  a smaller one with no leading zero (``1e-07`` is ``1e-7``); a non-finite
  double as ``null``.
* Text copied as it is when it is printable ASCII without ``"`` or ``\\``
  (nothing to escape); any other text through ``orjson.dumps`` of that one
  string, so escapes and non-ASCII text are orjson's own.

Everything is ``cdef inline``, as in ``_packing.pxd``: each module that
cimports this file gets its own copy.  ``tests/test_rest_hot.py`` compares
the doubles with orjson's over many random ones, and whole answers with
``orjson.dumps`` of the general path's.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.mem cimport PyMem_Free
from cpython.unicode cimport PyUnicode_AsUTF8AndSize
from libc.math cimport isfinite
from libc.string cimport memcpy, strlen

from rankd.engine._packing cimport Writer, writer_reserve
from rankd.engine._replies cimport _digits


cdef extern from "Python.h":
    char *PyOS_double_to_string(double value, char format_code, int precision, int flags,
                                int *ptype) except NULL
    int Py_DTSF_ADD_DOT_0


cdef inline int json_put(Writer *w, const char *text, Py_ssize_t size) except -1:
    writer_reserve(w, size)
    memcpy(w.data + w.size, text, size)
    w.size += size
    return 0


cdef inline int json_key(Writer *w, const char *text) except -1:
    """Literal text (a key and its punctuation), NUL-terminated."""
    return json_put(w, text, strlen(text))


cdef inline int json_integer(Writer *w, long long value) except -1:
    cdef char text[24]
    cdef int size = 0
    if value < 0:
        text[0] = 45
        size = 1 + _digits(text + 1, <unsigned long long>(-(value + 1)) + 1)
    else:
        size = _digits(text, <unsigned long long>value)
    return json_put(w, text, size)


cdef inline int _json_repr(Writer *w, const char *text) except -1:
    """Python's repr of a finite double (``text``) as orjson writes it."""
    cdef Py_ssize_t size = strlen(text), i
    cdef const char *e = NULL
    cdef int exponent = 0
    for i in range(size):
        if text[i] == 101:  # 'e'
            e = text + i
            break
    if e == NULL or e[1] != 45:  # no exponent, or a positive one: as repr writes it
        return json_put(w, text, size)
    i = 2
    while e[i]:
        exponent = exponent * 10 + (e[i] - 48)
        i += 1
    if exponent == 5:  # d.ddde-05 as 0.0000dddd
        i = 0
        if text[0] == 45:  # '-'
            json_put(w, "-", 1)
            i = 1
        json_put(w, "0.0000", 6)
        while text + i < e:
            if text[i] != 46:  # '.'
                json_put(w, text + i, 1)
            i += 1
        return 0
    json_put(w, text, e - text + 2)  # d.ddde-0N as d.ddde-N
    i = 2
    while e[i] == 48 and e[i + 1]:
        i += 1
    return json_put(w, e + i, strlen(e + i))


cdef inline int json_double(Writer *w, double value) except -1:
    cdef char *text
    if not isfinite(value):
        return json_put(w, "null", 4)
    text = PyOS_double_to_string(value, b"r", 0, Py_DTSF_ADD_DOT_0, NULL)
    try:
        _json_repr(w, text)
    finally:
        PyMem_Free(text)
    return 0


cdef inline int json_bool(Writer *w, bint value) except -1:
    return json_put(w, "true", 4) if value else json_put(w, "false", 5)


cdef inline int json_text(Writer *w, object text, object dumps) except -1:
    """``text`` (a str, or None) as a JSON value; ``dumps`` is
    ``orjson.dumps``, for the text that needs escapes."""
    cdef Py_ssize_t size, i
    cdef const char *data
    cdef unsigned char c
    cdef bytes escaped
    if text is None:
        return json_put(w, "null", 4)
    data = PyUnicode_AsUTF8AndSize(text, &size)
    for i in range(size):
        c = <unsigned char>data[i]
        if c < 32 or c >= 127 or c == 34 or c == 92:  # an escape, or non-ASCII
            escaped = dumps(text)
            return json_put(w, PyBytes_AS_STRING(escaped), PyBytes_GET_SIZE(escaped))
    json_put(w, "\"", 1)
    json_put(w, data, size)
    return json_put(w, "\"", 1)
