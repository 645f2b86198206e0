# cython: language_level=3
from rankd.engine._packed cimport PackedReads


cdef class Reads:
    cdef public dict boards
    #: Set while the engine rolls its state back after a storage failure.
    cdef public bint paused
    #: A cluster node's ``Replication`` (reads wait until it is ``serving``), or None.
    cdef public object replication
    #: Names of boards about to expire (``Engine.deadlines.expiring``): read
    #: the general way, which compares their deadline with the clock.
    cdef public set expiring
    # The config last read, and what it says (configs are replaced whole).
    cdef object last_config
    cdef bint all_window, ascending

    cpdef tuple answer(self, PackedReads reads, Py_ssize_t first, int version,
                       Py_ssize_t max_entries, Py_ssize_t max_bytes)
    cdef bytes c_answer(self, PackedReads reads, Py_ssize_t first, int version,
                        Py_ssize_t max_entries, Py_ssize_t max_bytes, Py_ssize_t *stopped)
    cdef object _index(self, object board)
