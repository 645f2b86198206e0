# cython: language_level=3, boundscheck=False, wraparound=False
"""Native answers to plain sorted-set reads, encoded as RESP replies.

A RESP connection's scanner packs runs of plain ``ZSCORE``, ``ZRANK``,
``ZREVRANK``, ``ZRANGE`` and ``ZREVRANGE`` requests
(``rankd.engine._packed.PackedReads``); :meth:`Reads.answer` reads each from the
board's index through its C entry points and writes the reply Redis
writes, with no Python object per read but the board lookup.  It reads
the all-time window of boards whose reads use it (what RESP-made boards
keep) in Redis's order (see ``rankd.engine.view``: on an ``asc`` board
position ``p`` is rank ``p + 1``, on a ``desc`` one rank ``n - p``).  It
stops at the first read it does not answer (a board reading another
window by default, a range of more than ``ENTRIES_PER_REQUEST`` entries:
the front-end charges those by their size and builds them in steps) and
says where: the front-end answers that one its general way and hands the
rest back.
A board on the paged index (``--index pages``) is read the same way
through ``_pages.pxd``'s entry points, chosen once per board (``paged``).
The tests compare every reply with Redis's.
"""

from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.dict cimport PyDict_GetItem
from cpython.object cimport PyObject
from cpython.unicode cimport PyUnicode_DecodeASCII

from rankd._pages cimport (
    pg_at, pg_cursor, pg_get, pg_is, pg_length, pg_member, pg_prefetch_name, pg_prefetch_names,
    pg_prefetch_slot, pg_rank, pg_score, pg_step,
)
from rankd._skiplist cimport RK_MEMBER, RankIndex, rk_node
from rankd.engine._packed cimport (
    READ_RANGE, READ_RANK, READ_REVRANGE, READ_REVRANK, READ_SCORE, PackedRead, PackedReads,
)
from rankd.engine._packing cimport Writer, writer_free
from rankd.engine._replies cimport (
    reply_bulk, reply_double, reply_header, reply_null, reply_put,
)


cdef enum:
    # Member reads whose lookups are warmed together (see ``_warm``).
    WARM_READS = 32
    # The longest range answered here, charged one request as every read
    # here is (``rankd.frontends.resp.sorted_sets.ENTRIES_PER_REQUEST``).
    ENTRIES_PER_REQUEST = 100


cdef class Reads:
    """The engine's native answers to packed plain reads (``answer``).
    Its boards, and whether reads are served now, are the engine's, kept
    current by it (``Engine.plain_reads``): a native front-end's read runs
    no Python code."""

    def __init__(self, dict boards):
        self.boards = boards
        self.expiring = set()

    cpdef tuple answer(self, PackedReads reads, Py_ssize_t first, int version,
                       Py_ssize_t max_entries, Py_ssize_t max_bytes):
        """Answer ``reads`` from ``first`` on: ``(replies, stopped)``, where
        ``stopped`` is the first read not answered (``len(reads)`` if all
        were; ``first`` while reads are not served).  Replies past
        ``max_bytes`` also stop it (a client that pipelines large reads
        without reading its replies must not make them pile up here)."""
        cdef Py_ssize_t stopped
        data = self.c_answer(reads, first, version, max_entries, max_bytes, &stopped)
        return data, stopped

    cdef bytes c_answer(self, PackedReads reads, Py_ssize_t first, int version,
                        Py_ssize_t max_entries, Py_ssize_t max_bytes, Py_ssize_t *stopped):
        """:meth:`answer`, for a native front-end: ``stopped`` set through
        the pointer."""
        if self.paused or (self.replication is not None and not self.replication.reads_natively):
            stopped[0] = first
            return b""
        return _answer(self, reads, first, version, max_entries, max_bytes, stopped)

    cdef object _index(self, object board):
        """The index a read of ``board`` answers from here: its all-time
        window's (None while it has none, or without a board); False when the
        read goes the general way (the board reads another window by default,
        or the index is the pure-Python one).  Sets ``ascending``.  The index
        is a skip list or a paged one (``pg_is``)."""
        cdef PyObject *periods
        cdef PyObject *found
        if board is None:
            return None
        if self.expiring and board.name in self.expiring:
            return False  # its deadline is near: the general path reads the clock
        config = board.config
        if config is not self.last_config:
            self.all_window = "all" in config.windows  # (then its primary window)
            self.ascending = config.order == "asc"
            self.last_config = config
        if not self.all_window:
            return False
        periods = PyDict_GetItem(board.periods, "all")  # (C lookups: a method call cost more)
        if periods == NULL:
            return None
        found = PyDict_GetItem(<object>periods, "all")
        if found == NULL:
            return None
        if type(<object>found) is not RankIndex and not pg_is(<object>found):
            return False
        return <object>found


cdef void _warm(Reads owner, PackedReads reads, Py_ssize_t first, Py_ssize_t last) except *:
    """Start loading what the member reads in ``[first, last)`` look up
    first: every member's hash slot, then (the slots had a moment to load)
    the node each points to.  A pipeline's reads then wait for memory
    together rather than one after another."""
    cdef PackedRead *read
    cdef Py_ssize_t i
    cdef int step
    cdef const char *last_name
    cdef Py_ssize_t last_size
    cdef RankIndex index
    cdef bint paged = False
    for step in range(2):
        last_name = NULL
        last_size = -1
        index = None
        paged = False
        for i in range(first, last):
            read = &reads.items[i]
            if read.kind != READ_SCORE and read.kind != READ_RANK and read.kind != READ_REVRANK:
                continue
            if _other_board(reads, read, last_name, last_size):
                found = owner._index(_board(owner.boards, reads, read))
                index = found if type(found) is RankIndex else None
                paged = pg_is(found)
                pindex = found
                last_name = reads.chars(&read.board)
                last_size = read.board.size
            if paged:
                if step == 0:
                    pg_prefetch_slot(pindex, reads.chars(&read.member), read.member.size)
                else:
                    pg_prefetch_name(pindex, reads.chars(&read.member), read.member.size)
                continue
            if index is None:
                continue
            if step == 0:
                index.c_prefetch_slot(reads.chars(&read.member), read.member.size)
            else:
                index.c_prefetch_node(reads.chars(&read.member), read.member.size)


cdef inline bint _other_board(PackedReads reads, PackedRead *read, const char *last_name,
                              Py_ssize_t last_size) noexcept:
    """Whether ``read`` names another board than the last one looked up."""
    cdef const char *name = reads.chars(&read.board)
    cdef Py_ssize_t j
    if last_name == NULL or read.board.size != last_size:
        return True
    for j in range(last_size):
        if name[j] != last_name[j]:
            return True
    return False


cdef inline object _board(dict boards, PackedReads reads, PackedRead *read):
    return boards.get(PyUnicode_DecodeASCII(reads.chars(&read.board), read.board.size, NULL))


cdef bytes _answer(Reads owner, PackedReads reads, Py_ssize_t first, int version,
                   Py_ssize_t max_entries, Py_ssize_t max_bytes, Py_ssize_t *stopped):
    """``Reads.answer`` once reads are served."""
    cdef Writer w
    cdef PackedRead *read
    cdef Py_ssize_t i, size, n, rank, count, position
    cdef long long start, stop
    cdef double score
    cdef RankIndex index
    cdef rk_node *x
    cdef pg_cursor at
    cdef Py_ssize_t mlen
    cdef bint ascending = True, from_best, pairs, paged = False, present
    cdef const char *member
    cdef const char *last_name = NULL
    cdef Py_ssize_t last_size = -1
    board = None
    w.data = NULL
    w.size = w.cap = 0
    try:
        if reads.count - first > 1:
            _warm(owner, reads, first, min(reads.count, first + WARM_READS))
        i = first
        while i < reads.count and w.size < max_bytes:
            if i > first and (i - first) % WARM_READS == 0:
                _warm(owner, reads, i, min(reads.count, i + WARM_READS))
            read = &reads.items[i]
            if _other_board(reads, read, last_name, last_size):
                board = _board(owner.boards, reads, read)
                last_name = reads.chars(&read.board)
                last_size = read.board.size
                found = owner._index(board)
                if found is False:
                    break  # the general path reads it
                paged = pg_is(found)
                pindex = found  # (read through pg_* when paged)
                index = None if paged else found
                ascending = owner.ascending if board is not None else True
            n = pg_length(pindex) if paged else 0 if index is None else index.length
            if read.kind == READ_SCORE:
                member = reads.chars(&read.member)
                if paged:
                    present = pg_get(pindex, member, read.member.size, &score)
                else:
                    present = index is not None and index.c_get(member, read.member.size,
                                                                &score)
                if present:
                    reply_double(&w, score, version)
                else:
                    reply_null(&w, version)
            elif read.kind == READ_RANK or read.kind == READ_REVRANK:
                if paged:
                    rank = pg_rank(pindex, reads.chars(&read.member), read.member.size)
                else:
                    rank = 0 if index is None else index.c_rank(reads.chars(&read.member),
                                                                read.member.size)
                if rank == 0:
                    reply_null(&w, version)
                else:
                    position = rank - 1 if ascending != (read.kind == READ_REVRANK) \
                        else n - rank
                    reply_header(&w, b":", position)
            else:
                # Redis's index sanitising (sorted_sets._rank_range).
                start, stop = read.start, read.stop
                if start < 0:
                    start += n
                if stop < 0:
                    stop += n
                if start < 0:
                    start = 0
                if start > stop or start >= n:
                    count = 0
                else:
                    if stop >= n:
                        stop = n - 1
                    count = stop - start + 1
                if count > max_entries or count > ENTRIES_PER_REQUEST:
                    break  # the general path charges and answers it
                pairs = read.withscores and version == 3
                reply_header(&w, b"*", count * 2 if read.withscores and not pairs else count)
                if count:
                    # Position p from the lowest score (from the highest on REV).
                    from_best = ascending == (read.kind == READ_RANGE)
                    rank = start + 1 if from_best else n - start
                    if paged:
                        pg_at(pindex, rank, &at)
                        pg_prefetch_names(pindex, &at, count, from_best)
                        while count:
                            if pairs:
                                reply_put(&w, "*2\r\n", 4)
                            member = pg_member(pindex, &at, &mlen)
                            reply_bulk(&w, member, mlen)
                            if read.withscores:
                                reply_double(&w, pg_score(pindex, &at), version)
                            pg_step(pindex, &at, from_best)
                            count -= 1
                    else:
                        x = index._node_at(rank)
                        while count:
                            if pairs:
                                reply_put(&w, "*2\r\n", 4)
                            reply_bulk(&w, RK_MEMBER(x), x.mlen)
                            if read.withscores:
                                reply_double(&w, index._score(x), version)
                            x = x.level[0].forward if from_best else x.backward
                            count -= 1
            i += 1
        stopped[0] = i
        return PyBytes_FromStringAndSize(w.data, w.size)
    finally:
        writer_free(&w)
