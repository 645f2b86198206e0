# cython: language_level=3
"""Pipelined pops in packed form (see ``_pops.pyx``)."""

from rankd.engine._packed cimport Span


cdef struct PackedPop:
    Span source          # the front-end's (its request's bytes)
    Span board
    long long count      # the count given (at least 1), or -1: none
    bint highest         # ZPOPMAX (else ZPOPMIN)


cdef class PackedPops:
    cdef readonly bytes data           # the buffer the spans point into
    cdef PackedPop *items
    cdef readonly Py_ssize_t count
    cdef Py_ssize_t capacity
    cdef PackedPop first_item          # (as PackedReads's)
    #: The pops before this one are answered (a run answered in steps).
    cdef public Py_ssize_t answered

    cdef PackedPop *add(self) except NULL
    cdef const char *chars(self, Span *span) noexcept
