# What the two native rank indexes share: their argument checks, the
# decoding of a write's or a batch operation's arguments, the paging of a
# read, and the checks of a dump's header and records.
#
# Design: rankd._skiplist and rankd._pages both ``include`` this file, so each
# module gets its own copy of these ``cdef inline`` helpers and the C compiler
# inlines them on the write path as if they were written in place (a common
# Cython module would reach them through its C-API table: a call per check
# that cannot be inlined).  Each check raises the exception the contract
# (rankd.index._contract) names and returns -1, so a write validates
# everything before it touches the structure.
#
# The including module provides: MAX_MEMBER_BYTES, MAX_EXACT_INT, MAX_SEQ,
# MAX_LEVEL, MAX_LENGTH, OP_SET, OP_INCR, OP_REMOVE, DUMP_VERSION,
# DUMP_HEADER_SIZE, DUMP_RECORD_SIZE, rk_load_f64/u16/u64, rk_utf8_valid,
# PyUnicode_AsUTF8AndSize, PyObject_GC_UnTrack, zlib, and the cimports memcmp,
# PyFloat_AS_DOUBLE, PyLong_AsLongLongAndOverflow, INFINITY, isfinite,
# uint8_t, uint16_t and uint64_t.


cdef inline int _member_bytes(object member, const char **data, Py_ssize_t *size) except -1:
    if not isinstance(member, str):
        raise TypeError(f"member must be a str, got {type(member).__name__}")
    try:
        data[0] = PyUnicode_AsUTF8AndSize(member, size)
    except UnicodeEncodeError as exc:
        raise ValueError(f"member is not encodable as UTF-8: {exc.reason}") from None
    if size[0] == 0:
        raise ValueError("member must not be empty")
    if size[0] > MAX_MEMBER_BYTES:
        raise ValueError(
            f"member must be at most {MAX_MEMBER_BYTES} bytes in UTF-8, got {size[0]}"
        )
    return 0


cdef inline int _number(object value, double *out, str what) except -1:
    cdef long long as_int
    cdef int overflow = 0
    if type(value) is float:
        out[0] = PyFloat_AS_DOUBLE(value)
    elif isinstance(value, bool):
        raise TypeError(f"{what} must be an int or float, got bool")
    elif isinstance(value, int):
        as_int = PyLong_AsLongLongAndOverflow(value, &overflow)
        if overflow or as_int > MAX_EXACT_INT or as_int < -MAX_EXACT_INT:
            raise ValueError(
                f"{what} {value} is beyond 2**53 and cannot be stored exactly as a float"
            )
        out[0] = <double>as_int
    elif isinstance(value, float):
        out[0] = PyFloat_AS_DOUBLE(value)
    else:
        raise TypeError(f"{what} must be an int or float, got {type(value).__name__}")
    if not isfinite(out[0]):
        raise ValueError(f"{what} must be finite, got {value!r}")
    return 0  # -0.0 is kept: it ranks as 0.0 (the caller decides which zero it stores)


cdef inline int _bound(object value, double *out, str what) except -1:
    """A range bound: like a score, but infinities are allowed."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be an int or float, got {type(value).__name__}")
    try:
        out[0] = <double>value
    except OverflowError:
        # An int beyond float range lies beyond every score.
        out[0] = INFINITY if value > 0 else -INFINITY
    if out[0] != out[0]:
        raise ValueError(f"{what} must not be NaN")
    return 0


cdef inline int _seq(object value, uint64_t *out) except -1:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"seq must be an int, got {type(value).__name__}")
    if value < 0 or value > MAX_SEQ:
        raise ValueError(f"seq must be between 0 and 2**63 - 1, got {value}")
    out[0] = <uint64_t>value
    return 0


cdef inline int _count(object value, str what) except -1:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{what} must not be negative, got {value}")
    return 0


cdef inline int _paging(object offset, object limit) except -1:
    """A read's ``offset`` and ``limit`` (None: no limit), checked."""
    _count(offset, "offset")
    if limit is not None:
        _count(limit, "limit")
    return 0


cdef inline bint _window_ranks(Py_ssize_t lo, Py_ssize_t hi, object offset, object limit,
                               bint reverse, Py_ssize_t *first, Py_ssize_t *last) except -1:
    """The ranks ``first..last`` among ``lo..hi`` left after skipping
    ``offset`` and keeping at most ``limit`` from the chosen end; False when
    none are left."""
    _paging(offset, limit)
    if hi - lo + 1 <= offset:
        return False
    cdef Py_ssize_t skip = offset
    cdef Py_ssize_t available = hi - lo + 1 - skip
    cdef Py_ssize_t take = available if limit is None or limit > available else limit
    if reverse:
        first[0], last[0] = hi - skip - take + 1, hi - skip
    else:
        first[0], last[0] = lo + skip, lo + skip + take - 1
    return True


cdef inline int _score_keys(object low, object high, bint low_exclusive, bint high_exclusive,
                            bint descending, double *key_low, double *key_high,
                            bint *ex_low, bint *ex_high) except -1:
    """A score range as a range of keys (scores negated on a descending
    board, which swaps the ends), with which end excludes its bound."""
    cdef double low_score, high_score
    _bound(low, &low_score, "low")
    _bound(high, &high_score, "high")
    if descending:
        key_low[0], key_high[0] = -high_score, -low_score
        ex_low[0], ex_high[0] = high_exclusive, low_exclusive
    else:
        key_low[0], key_high[0] = low_score, high_score
        ex_low[0], ex_high[0] = low_exclusive, high_exclusive
    return 0


cdef inline int _write_input(object member, object number, str what, object seq,
                             double *value, uint64_t *s, const char **data,
                             Py_ssize_t *size) except -1:
    """A ``set`` or ``incr`` call's arguments, checked and decoded (``s`` left
    as it was when ``seq`` is None)."""
    _number(number, value, what)
    if seq is not None:
        _seq(seq, s)
    _member_bytes(member, data, size)
    return 0


cdef inline int _operation(object item, int *op, double *value, bint *has_seq, uint64_t *s,
                           const char **data, Py_ssize_t *size) except -1:
    """One ``(op, member, value[, seq])`` of ``apply_batch``, checked and
    decoded (``value`` left as it was for a removal, ``s`` without a seq)."""
    cdef Py_ssize_t n
    cdef int overflow
    cdef long long op_code
    if type(item) is not tuple:
        raise TypeError(f"an operation must be a tuple, got {type(item).__name__}")
    n = len(<tuple>item)
    if n != 3 and n != 4:
        raise TypeError(
            f"an operation is (op, member, value[, seq]), got {n} items"
        )
    op_obj = (<tuple>item)[0]
    if isinstance(op_obj, bool) or not isinstance(op_obj, int):
        raise TypeError(f"op must be an Op, got {type(op_obj).__name__}")
    # Compared in C: Op is an IntEnum, a subclass of int, which
    # Python-level comparisons take through the slow path.
    op_code = PyLong_AsLongLongAndOverflow(op_obj, &overflow)
    if overflow or not OP_SET <= op_code <= OP_REMOVE:
        raise ValueError(f"op must be an Op value (0..6), got {op_obj}")
    op[0] = <int>op_code
    if op[0] != OP_REMOVE:
        _number((<tuple>item)[2], value, "delta" if op[0] == OP_INCR else "score")
    has_seq[0] = n == 4 and (<tuple>item)[3] is not None
    if has_seq[0]:
        _seq((<tuple>item)[3], s)
    _member_bytes((<tuple>item)[1], data, size)
    return 0


cdef inline int _options(object order, object tie_break, int max_level, int branching,
                         object seed) except -1:
    """The constructor arguments both indexes take, checked."""
    if order not in ("desc", "asc"):
        raise ValueError(f"order must be 'desc' or 'asc', got {order!r}")
    if tie_break not in ("first", "member", "member_desc"):
        raise ValueError("tie_break must be 'first', 'member' or 'member_desc', "
                         f"got {tie_break!r}")
    if not 1 <= max_level <= MAX_LEVEL:
        raise ValueError(f"max_level must be between 1 and {MAX_LEVEL}, got {max_level}")
    if not 2 <= branching <= 64:
        raise ValueError(f"branching must be between 2 and 64, got {branching}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")
    return 0


# --- dumps: the format both indexes write (see RankIndex.dump) ----------------

cdef enum:
    # A dump header's byte 7: the records were walked while the index changed
    # (``dump_walk``), so a member may repeat.
    DUMP_WALKED = 1


cdef Py_ssize_t _checked_dump_size(object data, int max_version) except -1:
    """The size of the whole dump ``data``, its header (:func:`_dump_header_fields`)
    and checksum checked (``load``: a damaged dump is refused before anything
    is built)."""
    cdef Py_buffer view
    cdef uint64_t count, next_seq
    cdef Py_ssize_t size
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        size = view.len
        if size < DUMP_HEADER_SIZE + 4:
            raise ValueError(f"rank index dump is truncated: {size} bytes")
        _dump_header_fields(<const char *>view.buf, size, &count, &next_seq, max_version)
        stored_crc = int.from_bytes(data[size - 4:size], "little")
        if zlib.crc32(memoryview(data)[:size - 4]) != stored_crc:
            raise ValueError("rank index dump is corrupt (CRC mismatch)")
        return size
    finally:
        PyBuffer_Release(&view)


cdef int _dump_header_fields(const char *buf, Py_ssize_t size, uint64_t *count,
                             uint64_t *next_seq, int max_version) except -1:
    """A dump's header, checked: its member count and next seq (its version,
    order and tie-break codes are ``buf[4]``, ``buf[5]`` and ``buf[6]``;
    ``buf[7]`` is ``DUMP_WALKED`` for a walked dump, whose loader keeps the
    first record of a member and skips any later one: see ``dump_walk``).
    Versions 1..``max_version`` are taken; version 2's records have no seq
    and belong to boards tied by member.  The checksum is not checked here
    (a dump read in pieces has it checked at its end); ``size``: the dump's
    whole size, -1 if unknown."""
    cdef Py_ssize_t record = DUMP_RECORD_SIZE
    if memcmp(buf, b"RKIX", 4) != 0:
        raise ValueError("not a rank index dump (bad magic)")
    if not 1 <= <uint8_t>buf[4] <= max_version:
        raise ValueError(f"unsupported rank index dump version {<uint8_t>buf[4]}")
    if <uint8_t>buf[5] > 1 or <uint8_t>buf[6] > 2 or <uint8_t>buf[7] > DUMP_WALKED:
        raise ValueError("rank index dump has an unknown order or tie-break code")
    if buf[4] == 2:
        if buf[6] == 0:
            raise ValueError("a version 2 rank index dump (no seqs) of a board tied by arrival")
        record -= 8
    count[0] = rk_load_u64(buf + 8)
    next_seq[0] = rk_load_u64(buf + 16)
    if next_seq[0] > <uint64_t>MAX_SEQ + 1:
        raise ValueError("rank index dump has an invalid next_seq")
    if count[0] > MAX_LENGTH or (size >= 0 and count[0] > <uint64_t>(size // record)):
        raise ValueError(f"rank index dump claims {count[0]} members, more than it holds")
    return 0


cdef enum:
    # What :func:`_dump_record_check` found wrong with a record.
    RECORD_SOUND = 0
    RECORD_TRUNCATED
    RECORD_BAD_LENGTH
    RECORD_NOT_UTF8
    RECORD_NOT_FINITE
    RECORD_BAD_SEQ


cdef inline int _dump_record_check(const char **p, const char *end, uint64_t next_seq,
                                   double *score, uint64_t *seq, uint16_t *mlen,
                                   bint has_seq) noexcept nogil:
    """:func:`_dump_record` without the GIL: ``RECORD_SOUND`` with the record
    read and ``p[0]`` left at the member's bytes, else what is wrong with
    it (``p[0]`` then unmoved)."""
    cdef Py_ssize_t record = DUMP_RECORD_SIZE if has_seq else DUMP_RECORD_SIZE - 8
    cdef const char *q = p[0]
    if end - q < record:
        return RECORD_TRUNCATED
    score[0] = rk_load_f64(q)
    seq[0] = rk_load_u64(q + 8) if has_seq else 0
    mlen[0] = rk_load_u16(q + record - 2)
    q += record
    if mlen[0] == 0 or mlen[0] > MAX_MEMBER_BYTES or end - q < mlen[0]:
        return RECORD_BAD_LENGTH
    if not rk_utf8_valid(<const uint8_t *>q, mlen[0]):
        return RECORD_NOT_UTF8
    if not isfinite(score[0]):
        return RECORD_NOT_FINITE
    if has_seq and (seq[0] > <uint64_t>MAX_SEQ or seq[0] >= next_seq):
        return RECORD_BAD_SEQ
    p[0] = q
    return RECORD_SOUND


cdef inline bint _dump_record_whole(const char **p, const char *end, uint64_t next_seq,
                                    double *score, uint64_t *seq, uint16_t *mlen,
                                    bint has_seq) noexcept nogil:
    """Whether the record at ``p[0]`` lies whole before ``end`` (the bytes
    of a dump read so far) and is sound: then it is read as by
    :func:`_dump_record_check`, else ``p[0]`` is unmoved (a load's run
    without the GIL stops there: see :func:`_dump_record_read`)."""
    cdef Py_ssize_t record = DUMP_RECORD_SIZE if has_seq else DUMP_RECORD_SIZE - 8
    cdef const char *q = p[0]
    if end - q < record or end - q < record + rk_load_u16(q + record - 2):
        return False  # it straddles the pieces read so far
    return _dump_record_check(p, end, next_seq, score, seq, mlen, has_seq) == RECORD_SOUND


cdef inline int _dump_record(const char **p, const char *end, uint64_t i, uint64_t next_seq,
                             double *score, uint64_t *seq, uint16_t *mlen,
                             bint has_seq=True) except -1:
    """Record ``i`` at ``p[0]`` read and checked (``end``: where the records
    end; ``has_seq``: a version 1 record, else version 2's, whose ``seq``
    reads as 0); ``p[0]`` is left at the member's bytes."""
    cdef int found = _dump_record_check(p, end, next_seq, score, seq, mlen, has_seq)
    if found == RECORD_TRUNCATED:
        raise ValueError(f"rank index dump is truncated at record {i}")
    if found == RECORD_BAD_LENGTH:
        raise ValueError(f"rank index dump has a bad member length at record {i}")
    if found == RECORD_NOT_UTF8:
        raise ValueError(f"rank index dump has a member that is not UTF-8 at record {i}")
    if found == RECORD_NOT_FINITE:
        raise ValueError(f"rank index dump has a non-finite score at record {i}")
    if found == RECORD_BAD_SEQ:
        raise ValueError(f"rank index dump has an invalid seq at record {i}")
    return 0


cdef inline tuple _untracked(tuple result):
    """``result``, which holds only numbers, bools and None, left out of the
    cyclic garbage collector: it can be in no cycle, and a batch of a
    thousand results otherwise has the collector traverse them all (the
    collector would untrack them itself, but only once it has)."""
    PyObject_GC_UnTrack(<void *>result)
    return result


cdef object _float_or_none(bint present, double value):
    return value if present else None


# --- dumps in pieces: the header, and a reader of pieces (dump_chunks/load_chunks) ---
#
# A snapshot writes a board's dump, and a restart reads it back, in pieces of
# a few MiB: a whole-board byte string was a second copy of the index at the
# snapshot and restart peaks (a third of the skip list's live size, over half
# of the paged index's).  The pieces are the bytes of ``dump()`` cut anywhere:
# the writer cuts them between records, but the reader takes any cut (a
# snapshot section read from its file in fixed windows), copying only a
# record that straddles two pieces.

cdef void _dump_header_write(char *p, int version, bint descending, int tie_code,
                             uint64_t length, uint64_t next_seq,
                             bint walked=False) noexcept nogil:
    """A dump's 24-byte header at ``p``."""
    memcpy(p, b"RKIX", 4)
    p[4] = version
    p[5] = 0 if descending else 1
    p[6] = tie_code  # 0 first, 1 member, 2 member_desc
    p[7] = DUMP_WALKED if walked else 0
    rk_store_u64(p + 8, length)
    rk_store_u64(p + 16, next_seq)


cdef inline Py_ssize_t _dump_chunk_room(Py_ssize_t max_bytes) noexcept nogil:
    """The scratch a ``dump_chunks(max_bytes)`` piece is built in: room for
    the header, the one record a piece always holds, and the checksum."""
    return max(max_bytes, 0) + DUMP_HEADER_SIZE + DUMP_RECORD_SIZE + MAX_MEMBER_BYTES + 4


@cython.final
cdef class _DumpReader:
    """The bytes of a dump given as an iterable of buffers (cut anywhere),
    for a load to parse in place: ``need(n)`` makes ``n`` bytes readable at
    ``p`` (``end`` is where the readable bytes stop), ``finish()`` checks
    the CRC-32 trailer and that nothing follows it.  Each piece is let go
    before the next is asked for; the CRC is taken as the bytes are passed."""

    cdef object pieces
    cdef object piece
    cdef Py_buffer view
    cdef bint held
    cdef Py_ssize_t pos        # first byte of the piece not yet taken (in the carry)
    cdef Py_ssize_t crc_from   # first byte of the piece not yet in ``crc``
    cdef bytearray carry       # a record that straddled pieces
    cdef bint in_carry
    cdef bint check_crc
    cdef object crc
    cdef const char *p
    cdef const char *end

    def __cinit__(self, pieces, bint check_crc=True):
        self.pieces = iter(pieces)
        self.check_crc = check_crc
        self.crc = 0
        self.held = False
        self.in_carry = False
        self.p = NULL
        self.end = NULL

    def __dealloc__(self):
        if self.held:
            PyBuffer_Release(&self.view)

    cdef inline int need(self, Py_ssize_t n) except -1:
        if self.end - self.p >= n:
            return 0
        return self._gather(n)

    cdef int _crc_piece(self, Py_ssize_t upto) except -1:
        if self.check_crc and upto > self.crc_from:
            self.crc = zlib.crc32(memoryview(self.piece)[self.crc_from:upto], self.crc)
        self.crc_from = upto
        return 0

    cdef bint _next_piece(self) except -1:
        """Move to the next non-empty piece; False at the end of the pieces."""
        while True:
            if self.held:
                PyBuffer_Release(&self.view)
                self.held = False
            self.piece = None
            piece = next(self.pieces, None)
            if piece is None:
                return False
            PyObject_GetBuffer(piece, &self.view, PyBUF_SIMPLE)
            self.held = True
            self.piece = piece
            self.pos = 0
            self.crc_from = 0
            if self.view.len:
                return True

    cdef int _gather(self, Py_ssize_t n) except -1:
        cdef bytearray taken
        cdef Py_ssize_t take
        cdef const char *buf
        if not self.in_carry and self.held:  # (a carry's bytes are in the CRC already)
            self.pos = self.view.len
            self._crc_piece(self.pos)
        taken = bytearray(self.p[:self.end - self.p])
        while len(taken) < n:
            if not self.held or self.pos >= self.view.len:
                if not self._next_piece():
                    raise ValueError("rank index dump is truncated")
            buf = <const char *>self.view.buf
            if not taken and self.view.len - self.pos >= n:
                # Read the piece in place from here on.
                self.in_carry = False
                self.carry = None
                self.p = buf + self.pos
                self.end = buf + self.view.len
                self.crc_from = self.pos
                return 0
            take = min(n - len(taken), self.view.len - self.pos)
            taken += buf[self.pos:self.pos + take]
            self.pos += take
            self._crc_piece(self.pos)
        self.carry = taken
        self.in_carry = True
        self.p = <const char *>taken
        self.end = self.p + len(taken)
        return 0

    cdef int finish(self) except -1:
        """Check the trailer after the last record (and nothing after it)."""
        cdef bytearray trailer = bytearray()
        cdef Py_ssize_t take
        if not self.in_carry and self.held:
            self.pos = self.p - <const char *>self.view.buf
            self._crc_piece(self.pos)
        elif self.in_carry and self.p != self.end:
            trailer += self.p[:self.end - self.p]  # (a trailer this short cannot be)
        while len(trailer) < 4:
            if not self.held or self.pos >= self.view.len:
                if not self._next_piece():
                    raise ValueError("rank index dump is truncated (no checksum)")
            take = min(4 - len(trailer), self.view.len - self.pos)
            trailer += (<const char *>self.view.buf)[self.pos:self.pos + take]
            self.pos += take
        if self.pos < self.view.len or self._next_piece():
            raise ValueError("rank index dump has bytes after its last record")
        if self.check_crc and int.from_bytes(trailer, "little") != self.crc:
            raise ValueError("rank index dump is corrupt (CRC mismatch)")
        return 0



cdef inline int _dump_record_read(_DumpReader reader, uint64_t i, uint64_t next_seq,
                                  double *score, uint64_t *seq, uint16_t *mlen,
                                  bint has_seq) except -1:
    """Record ``i`` read from ``reader`` and checked as by :func:`_dump_record`
    (gathered whole first if it straddles pieces); ``reader.p`` is left at
    the member's bytes."""
    cdef Py_ssize_t record = DUMP_RECORD_SIZE if has_seq else DUMP_RECORD_SIZE - 8
    reader.need(record)
    reader.need(record + rk_load_u16(reader.p + record - 2))
    return _dump_record(&reader.p, reader.end, i, next_seq, score, seq, mlen, has_seq)


cdef class _DumpPieces:
    """What the ``dump_chunks`` iterators of both indexes share (each adds
    its position in the index and ``__next__``): a piece is built in
    ``scratch`` without the GIL, then copied into its ``bytes``."""

    cdef Py_ssize_t mutations
    cdef Py_ssize_t max_bytes
    cdef char *scratch
    cdef bint started
    cdef bint done
    cdef object crc
    cdef readonly Py_ssize_t size

    def __cinit__(self, *args):
        self.max_bytes = max(1, args[1])
        self.crc = 0
        self.scratch = <char *>malloc(_dump_chunk_room(self.max_bytes))
        if self.scratch == NULL:
            raise MemoryError()

    def __dealloc__(self):
        free(self.scratch)

    def __iter__(self):
        return self

    cdef bytes _piece(self, Py_ssize_t n, bint last_record):
        """The piece of the ``n`` bytes in the scratch, with the checksum
        after the last record if it fits (else it is the next piece alone)."""
        cdef bint final = last_record and (n == 0 or n + 4 <= self.max_bytes)
        cdef bytes out = PyBytes_FromStringAndSize(self.scratch, n + 4 * final)
        self.crc = zlib.crc32(memoryview(out)[:n], self.crc)
        if final:
            # ``out`` is not shared yet, so finishing it in place is safe.
            rk_store_u32(PyBytes_AS_STRING(out) + n, <uint32_t>self.crc)
            self.done = True
        return out


cdef class _WalkPieces:
    """What the ``dump_walk`` iterators of both indexes share (each adds its
    index, how it finds the first entry after the last record written, and
    ``__next__``): a piece is built in ``scratch``; the last record written
    is kept (member, key, seq) for the next piece to go on after it."""

    cdef Py_ssize_t max_bytes
    cdef char *scratch
    cdef char *member
    cdef Py_ssize_t mlen
    cdef double key
    cdef uint64_t seq
    cdef bint started
    cdef bint done
    #: Records written so far (the header's count).
    cdef readonly uint64_t records

    def __cinit__(self, *args):
        self.max_bytes = max(1, args[1])
        self.scratch = <char *>malloc(self.max_bytes + DUMP_RECORD_SIZE + MAX_MEMBER_BYTES)
        self.member = <char *>malloc(MAX_MEMBER_BYTES)
        if self.scratch == NULL or self.member == NULL:
            raise MemoryError()

    def __dealloc__(self):
        free(self.scratch)
        free(self.member)

    def __iter__(self):
        return self

    cdef void _written(self, double key, uint64_t seq, const char *member,
                       Py_ssize_t mlen) noexcept:
        """Note the last record a piece wrote (the next goes on after it)."""
        self.key, self.seq, self.mlen = key, seq, mlen
        memcpy(self.member, member, mlen)


cdef bytes _walked_header(int version, bint descending, int tie_code, uint64_t records,
                          uint64_t next_seq):
    """A walked dump's header (``DUMP_WALKED``)."""
    cdef bytes out = PyBytes_FromStringAndSize(NULL, DUMP_HEADER_SIZE)
    _dump_header_write(PyBytes_AS_STRING(out), version, descending, tie_code, records,
                       next_seq, True)
    return out
