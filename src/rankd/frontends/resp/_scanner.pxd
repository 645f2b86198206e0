# cython: language_level=3
cdef object scan_run(object data, Py_ssize_t max_bulk, Py_ssize_t max_words)
