# cython: language_level=3
"""Native write-ahead log framing and frame scanner.

The hot loops of :func:`rankd.engine.frames.frame_into` and
:func:`rankd.engine.frames.scan`, which document the frame format and the
arguments; ``frame_into_python`` and ``scan_python`` there are the
references these must match result for result (the tests compare them on
random, cut and corrupted logs).  Frames are written with CRC-32C
(``_crc32c.h``: the SSE4.2 instruction where the CPU has it, a table walk
elsewhere); frames of format 1, without the flag, are checked with zlib's
``crc32``, the function Python's ``zlib.crc32`` calls.

:func:`scan_frames` is :func:`scan` for recovery: the records it collects
stay in the buffer read (a :class:`Frames` batch of their offsets), so a
million-record tail makes no million payload objects; the native replay
(``_replay.pyx``) reads them in place.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.long cimport PyLong_FromLongLong
from libc.stdint cimport uint32_t, uint64_t
from libc.stdlib cimport free, realloc
from libc.string cimport memcpy

cdef extern from "zlib.h":
    unsigned long crc32(unsigned long crc, const unsigned char *buf, unsigned int length) nogil

cdef extern from "_crc32c.h":
    void rankd_crc32c_init()
    uint32_t rankd_crc32c(uint32_t crc, const unsigned char *p, size_t n) nogil
    uint32_t rankd_crc32c_portable(uint32_t crc, const unsigned char *p, size_t n) nogil
    uint32_t rankd_crc32c_hardware(uint32_t crc, const unsigned char *p, size_t n) nogil
    int rankd_crc32c_hw
    #: The length word's flag of a CRC-32C frame (format 2; see frames.py).
    const uint32_t CRC32C_FLAG "RANKD_WAL_CRC32C_FLAG"

rankd_crc32c_init()

cdef enum:
    HEADER_BYTES = 16
    CHECKED_BYTES = 12   # length and lsn: the header bytes the CRC covers
    MAX_RECORD_BYTES = 256 * 1024 * 1024


cdef inline uint32_t _checksum(const unsigned char *frame, uint32_t word) noexcept nogil:
    """The CRC a frame whose length word is ``word`` must carry: CRC-32C
    when flagged, else zlib's CRC-32 (format 1)."""
    cdef size_t size = CHECKED_BYTES + (word & ~CRC32C_FLAG)
    if word & CRC32C_FLAG:
        return rankd_crc32c(0, frame + 4, size)
    return <uint32_t>crc32(0, frame + 4, <unsigned int>size)


def crc32c(data, unsigned int crc=0):
    """CRC-32C of ``data`` continuing from ``crc`` (as ``zlib.crc32`` takes it)."""
    return _crc_of(data, crc, 0)


def crc32c_portable(data, unsigned int crc=0):
    """:func:`crc32c` by the portable table walk, whatever the CPU (tests)."""
    return _crc_of(data, crc, 1)


def crc32c_hardware(data, unsigned int crc=0):
    """:func:`crc32c` by the SSE4.2 instruction, or None without it (tests)."""
    if not rankd_crc32c_hw:
        return None
    return _crc_of(data, crc, 2)


def has_hardware_crc32c():
    """Whether the CPU computes CRC-32C (SSE4.2) for the WAL."""
    return bool(rankd_crc32c_hw)


cdef uint32_t _crc_of(data, uint32_t crc, int how) except? 0xffffffff:
    cdef Py_buffer view
    cdef uint32_t out
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        if how == 1:
            out = rankd_crc32c_portable(crc, <const unsigned char *>view.buf, view.len)
        elif how == 2:
            out = rankd_crc32c_hardware(crc, <const unsigned char *>view.buf, view.len)
        else:
            out = rankd_crc32c(crc, <const unsigned char *>view.buf, view.len)
    finally:
        PyBuffer_Release(&view)
    return out


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
        length32 = <uint32_t>length | CRC32C_FLAG
        # Little-endian hosts only, like the rank index (see setup.py).
        memcpy(out + offset + 4, &length32, 4)
        memcpy(out + offset + 8, &lsn, 8)
        memcpy(out + offset + HEADER_BYTES, PyBytes_AS_STRING(payload), length)
        crc = rankd_crc32c(0, out + offset + 4, CHECKED_BYTES + length)
        memcpy(out + offset, &crc, 4)
        offset += HEADER_BYTES + length
        active += HEADER_BYTES + length
    return lsn, active, total


cdef class Frames:
    """Consecutive records a scan collected, left in the buffer it read: a
    read-only sequence of ``(lsn, payload)``, like the list :func:`scan`
    returns, whose items are made only when asked for.  It holds the
    buffer (an ``mmap`` cannot be closed under it)."""

    def __cinit__(self, data):
        PyObject_GetBuffer(data, &self.view, PyBUF_SIMPLE)
        self.held = True
        self.base = <const unsigned char *>self.view.buf

    def __dealloc__(self):
        free(self.spans)
        if self.held:
            PyBuffer_Release(&self.view)

    cdef int push(self, long long lsn, Py_ssize_t offset, Py_ssize_t size) except -1:
        cdef FrameSpan *grown
        if self.count == self.capacity:
            grown = <FrameSpan *>realloc(self.spans,
                                         (self.capacity * 2 + 64) * sizeof(FrameSpan))
            if grown == NULL:
                raise MemoryError()
            self.spans = grown
            self.capacity = self.capacity * 2 + 64
        if self.count == 0:
            self.first_lsn = lsn
        self.spans[self.count].offset = offset
        self.spans[self.count].size = size
        self.count += 1
        return 0

    def __len__(self):
        return self.count

    def __getitem__(self, Py_ssize_t i):
        if i < 0:
            i += self.count
        if not 0 <= i < self.count:
            raise IndexError("frame index out of range")
        return (PyLong_FromLongLong(self.first_lsn + i), PyBytes_FromStringAndSize(
            <const char *>self.base + self.spans[i].offset, self.spans[i].size))

    @property
    def payload_bytes(self):
        """The bytes of every payload (frames' headers not included)."""
        cdef Py_ssize_t i, total = 0
        for i in range(self.count):
            total += self.spans[i].size
        return total


def scan(data, long long first_lsn, bint check, long long from_lsn, long long upto_lsn,
         Py_ssize_t limit, bint collect):
    """``(records, end, next_lsn, bad)``; see ``rankd.engine.frames.scan``."""
    cdef Py_buffer view
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        return _scan(<const unsigned char *>view.buf, view.len, first_lsn, check, from_lsn,
                     upto_lsn, limit, collect, None)
    finally:
        PyBuffer_Release(&view)


def scan_frames(data, long long first_lsn, bint check, long long from_lsn,
                long long upto_lsn, Py_ssize_t limit):
    """:func:`scan` collecting a :class:`Frames` batch in place of the list."""
    cdef Frames frames = Frames(data)
    _, end, next_lsn, bad = _scan(frames.base, frames.view.len, first_lsn, check, from_lsn,
                                  upto_lsn, limit, True, frames)
    return frames, end, next_lsn, bad


cdef tuple _scan(const unsigned char *buf, Py_ssize_t size, long long expected, bint check,
                 long long from_lsn, long long upto_lsn, Py_ssize_t limit, bint collect,
                 Frames frames):
    cdef list records = []
    cdef Py_ssize_t offset = 0, end, collected = 0
    cdef uint32_t crc, length, word
    cdef uint64_t lsn
    bad = None
    while offset < size and expected <= upto_lsn and collected < limit:
        if size - offset < HEADER_BYTES:
            bad = (offset, "incomplete record header", True)
            break
        # Little-endian hosts only, like the rank index (see setup.py).
        memcpy(&crc, buf + offset, 4)
        memcpy(&word, buf + offset + 4, 4)
        memcpy(&lsn, buf + offset + 8, 8)
        length = word & ~CRC32C_FLAG
        end = offset + HEADER_BYTES + <Py_ssize_t>length
        if length > MAX_RECORD_BYTES:
            bad = (offset, f"impossible record length {length}", False)
            break
        if end > size:
            bad = (offset, f"record of {length} bytes runs past the end", True)
            break
        if check and _checksum(buf + offset, word) != crc:
            bad = (offset, "checksum mismatch", end == size)
            break
        if lsn != <uint64_t>expected:
            bad = (offset, f"log position {lsn} where {expected} was expected", False)
            break
        if collect and expected >= from_lsn:
            if frames is not None:
                frames.push(expected, offset + HEADER_BYTES, length)
            else:
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
    cdef uint32_t crc, length, word
    cdef uint64_t lsn
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        buf = <const unsigned char *>view.buf
        size = view.len
        offset = start
        while offset + HEADER_BYTES <= size:
            memcpy(&lsn, buf + offset + 8, 8)
            if lsn >= <uint64_t>min_lsn and lsn <= <uint64_t>max_lsn:
                memcpy(&word, buf + offset + 4, 4)
                length = word & ~CRC32C_FLAG
                if length <= MAX_RECORD_BYTES and offset + HEADER_BYTES + <Py_ssize_t>length <= size:
                    memcpy(&crc, buf + offset, 4)
                    if _checksum(buf + offset, word) == crc:
                        return offset
            offset += 1
        return -1
    finally:
        PyBuffer_Release(&view)
