# cython: language_level=3
from rankd.engine._packed cimport Packed


cdef object scan_run(object data, Py_ssize_t max_bulk, Py_ssize_t max_words)
cdef bytes replies_of(Packed packed, int version, object reply, Py_ssize_t *answered)
