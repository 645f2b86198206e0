# cython: language_level=3
from rankd.engine._packed cimport Packed


cdef Packed split_run(object data, Py_ssize_t max_frame)
cdef bytes encode_run(Packed packed, object ok, object error, Py_ssize_t *answered)
