# cython: language_level=3
"""Native write-ahead log framing and frame scanner.

The hot loops of :func:`rankd.engine.frames.frame_into` and
:func:`rankd.engine.frames.scan`, which document the frame format and the
arguments; ``frame_into_python`` and ``scan_python`` there are the
references these must match result for result (the tests compare them on
random, cut and corrupted logs).  The checksum is zlib's ``crc32``, the
function Python's ``zlib.crc32`` calls, so both implementations (and every
log ever written) agree.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport uint32_t, uint64_t
from libc.string cimport memcpy

cdef extern from "zlib.h":
    unsigned long crc32(unsigned long crc, const unsigned char *buf, unsigned int length) nogil

cdef enum:
    HEADER_BYTES = 16
    CHECKED_BYTES = 12   # length and lsn: the header bytes the CRC covers
    MAX_RECORD_BYTES = 256 * 1024 * 1024


def frame_into(bytearray buffer, payloads, long long last_lsn, Py_ssize_t active,
               Py_ssize_t limit, list rolls):
    """``(last lsn, active bytes, bytes appended)``; see
    ``rankd.engine.frames.frame_into_python``."""
    cdef list items = payloads if type(payloads) is list else list(payloads)
    cdef Py_ssize_t n = len(items), i, length, total = 0, start = PyByteArray_GET_SIZE(buffer)
    cdef Py_ssize_t offset
    cdef unsigned char *out
    cdef uint32_t crc, length32
    cdef uint64_t lsn
    cdef bytes payload
    for i in range(n):
        payload = <bytes?>items[i]
        if PyBytes_GET_SIZE(payload) > MAX_RECORD_BYTES:
            raise ValueError(f"a record of {PyBytes_GET_SIZE(payload)} bytes is too large")
        total += HEADER_BYTES + PyBytes_GET_SIZE(payload)
    PyByteArray_Resize(buffer, start + total)
    out = <unsigned char *>PyByteArray_AS_STRING(buffer)
    offset = start
    lsn = last_lsn
    for i in range(n):
        payload = <bytes>items[i]
        length = PyBytes_GET_SIZE(payload)
        lsn += 1
        if active and active + length > limit:
            rolls.append((offset, lsn))
            active = 0
        length32 = <uint32_t>length
        # Little-endian hosts only, like the rank index (see setup.py).
        memcpy(out + offset + 4, &length32, 4)
        memcpy(out + offset + 8, &lsn, 8)
        memcpy(out + offset + HEADER_BYTES, PyBytes_AS_STRING(payload), length)
        crc = crc32(0, out + offset + 4, CHECKED_BYTES + length)
        memcpy(out + offset, &crc, 4)
        offset += HEADER_BYTES + length
        active += HEADER_BYTES + length
    return lsn, active, total


def scan(data, long long first_lsn, bint check, long long from_lsn, long long upto_lsn,
         Py_ssize_t limit, bint collect):
    """``(records, end, next_lsn, bad)``; see ``rankd.engine.frames.scan``."""
    cdef Py_buffer view
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        return _scan(<const unsigned char *>view.buf, view.len, first_lsn, check, from_lsn,
                     upto_lsn, limit, collect)
    finally:
        PyBuffer_Release(&view)


cdef tuple _scan(const unsigned char *buf, Py_ssize_t size, long long expected, bint check,
                 long long from_lsn, long long upto_lsn, Py_ssize_t limit, bint collect):
    cdef list records = []
    cdef Py_ssize_t offset = 0, end, collected = 0
    cdef uint32_t crc, length
    cdef uint64_t lsn
    bad = None
    while offset < size and expected <= upto_lsn and collected < limit:
        if size - offset < HEADER_BYTES:
            bad = (offset, "incomplete record header", True)
            break
        # Little-endian hosts only, like the rank index (see setup.py).
        memcpy(&crc, buf + offset, 4)
        memcpy(&length, buf + offset + 4, 4)
        memcpy(&lsn, buf + offset + 8, 8)
        end = offset + HEADER_BYTES + <Py_ssize_t>length
        if length > MAX_RECORD_BYTES:
            bad = (offset, f"impossible record length {length}", False)
            break
        if end > size:
            bad = (offset, f"record of {length} bytes runs past the end", True)
            break
        if check and crc32(0, buf + offset + 4, CHECKED_BYTES + length) != crc:
            bad = (offset, "checksum mismatch", end == size)
            break
        if lsn != <uint64_t>expected:
            bad = (offset, f"log position {lsn} where {expected} was expected", False)
            break
        if collect and expected >= from_lsn:
            records.append((expected, PyBytes_FromStringAndSize(
                <const char *>buf + offset + HEADER_BYTES, length)))
            collected += 1
        expected += 1
        offset = end
    return records, offset, expected, bad


def find_frame(data, Py_ssize_t start, long long min_lsn, long long max_lsn):
    """Offset of the first whole, checksummed frame at or after ``start``
    whose position lies in ``[min_lsn, max_lsn]``, or -1; see
    ``rankd.engine.frames.find_frame_python``."""
    cdef Py_buffer view
    cdef const unsigned char *buf
    cdef Py_ssize_t offset, size
    cdef uint32_t crc, length
    cdef uint64_t lsn
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        buf = <const unsigned char *>view.buf
        size = view.len
        offset = start
        while offset + HEADER_BYTES <= size:
            memcpy(&lsn, buf + offset + 8, 8)
            if lsn >= <uint64_t>min_lsn and lsn <= <uint64_t>max_lsn:
                memcpy(&length, buf + offset + 4, 4)
                if length <= MAX_RECORD_BYTES and offset + HEADER_BYTES + <Py_ssize_t>length <= size:
                    memcpy(&crc, buf + offset, 4)
                    if crc32(0, buf + offset + 4, CHECKED_BYTES + length) == crc:
                        return offset
            offset += 1
        return -1
    finally:
        PyBuffer_Release(&view)
