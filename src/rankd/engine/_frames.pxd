# cython: language_level=3
"""The native frame scanner's batch of records left in place (see _frames.pyx),
for the module that cimports it: recovery's replay (_replay.pyx)."""

cdef struct FrameSpan:
    Py_ssize_t offset     # of the payload, from the buffer's start
    Py_ssize_t size


cdef class Frames:
    cdef Py_buffer view
    cdef bint held
    cdef const unsigned char *base
    cdef FrameSpan *spans
    cdef Py_ssize_t count
    cdef Py_ssize_t capacity
    cdef readonly long long first_lsn
    cdef int push(self, long long lsn, Py_ssize_t offset, Py_ssize_t size) except -1
