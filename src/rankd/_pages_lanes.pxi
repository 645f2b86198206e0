# The paged index's C entry points for the daemon's native lanes, declared
# in _pages.pxd (which says why they are functions, not methods).
#
# Design: each is a thin call of the index's own helpers (_lookup, _locate,
# _write, _rank_of, _page_at, _name), so it answers exactly what the
# Python API answers and follows the layout wherever that goes; nothing
# here allocates a Python object.  Included at the end of _pages.pyx.


cdef bint pg_is(object index) noexcept:
    """Whether ``index`` is a paged index (the entry points' argument)."""
    return type(index) is RankIndex


cdef Py_ssize_t pg_length(object index) noexcept:
    """Members in ``index``."""
    return (<RankIndex>index).length


cdef bint pg_full(object index) noexcept:
    """``index.full``: a write that changes a score may be refused."""
    return (<RankIndex>index)._full()


cdef void pg_prefetch_slot(object index, const char *member, Py_ssize_t mlen) noexcept:
    """Start loading ``member``'s home slot in the member map (a batch warms
    its next lookups, as the skip list's ``c_prefetch_slot``)."""
    cdef RankIndex x = <RankIndex>index
    rk_prefetch(&x.slot_ids[pg_home(x._hash(member, mlen), x.nslots)])


cdef void pg_prefetch_name(object index, const char *member, Py_ssize_t mlen) noexcept:
    """Start loading the page named by the first slot from the home slot on
    whose tag is the member's (after :func:`pg_prefetch_slot` had time to
    load the slot): its header, entry numbers and ids, which a lookup reads
    to find the name it compares.  A member absent asks for nothing."""
    cdef RankIndex x = <RankIndex>index
    cdef uint32_t code = x._tagged_code(x._hash(member, mlen))
    cdef pg_page *p
    cdef Py_ssize_t i
    if code == 0:
        return
    p = x.pages[PG_CODE_PNO(code)]
    for i in range(0, <Py_ssize_t>(sizeof(pg_page) + PG_ENOS_BYTES(x.page_size)
                                   + PG_IDS_BYTES(x.page_size)), 64):
        rk_prefetch(<char *>p + i)


cdef bint pg_get(object index, const char *member, Py_ssize_t mlen, double *score) noexcept:
    """Whether ``member`` is present; its score into ``score`` if so."""
    cdef RankIndex x = <RankIndex>index
    cdef uint32_t code = x._lookup(member, mlen)
    cdef Py_ssize_t pos
    cdef pg_page *p
    if code == 0:
        return False
    p = x._locate(code, &pos)
    score[0] = x._score_at(p, pos)
    return True


cdef Py_ssize_t pg_put(object index, const char *member, Py_ssize_t mlen, double score,
                       uint64_t seq) except -1:
    """``set(member, score, seq=seq)``: returns the member's unique rank after it."""
    cdef double old = 0.0, new = 0.0
    cdef bint had, has_new, changed
    return (<RankIndex>index)._write(member, mlen, score, OP_SET, True, seq, True,
                                     &old, &had, &new, &has_new, &changed)


cdef Py_ssize_t pg_rank(object index, const char *member, Py_ssize_t mlen) noexcept:
    """The unique rank of ``member``, 0 if absent."""
    cdef RankIndex x = <RankIndex>index
    cdef uint32_t code = x._lookup(member, mlen)
    return 0 if code == 0 else x._rank_of(code, NULL)


cdef int pg_remove(object index, const char *member, Py_ssize_t mlen) except -1:
    """``remove(member)``: 1 if it was present, else 0."""
    cdef double old = 0.0, new = 0.0
    cdef bint had = False, has_new, changed
    (<RankIndex>index)._write(member, mlen, 0.0, OP_REMOVE, False, 0, False,
                              &old, &had, &new, &has_new, &changed)
    return had


cdef Py_ssize_t pg_standing(object index, const char *member, Py_ssize_t mlen, double *score,
                            Py_ssize_t *dense, Py_ssize_t *before) noexcept:
    """``member``'s unique rank (0 if absent), with its score, dense rank and
    the members scoring strictly better (``competition_rank - 1``): what
    ``score``, ``rank``, ``dense_rank`` and ``competition_rank`` answer."""
    cdef RankIndex x = <RankIndex>index
    cdef uint32_t code = x._lookup(member, mlen)
    cdef Py_ssize_t pos, rank
    cdef pg_page *p
    if code == 0:
        return 0
    p = x._locate(code, &pos)
    score[0] = x._score_at(p, pos)
    before[0] = x._better_than(p, pos)
    rank = x._rank_of(code, dense)
    return rank


cdef void pg_at(object index, Py_ssize_t rank, pg_cursor *cursor) noexcept:
    """Point ``cursor`` at 1-based ``rank`` (1 <= rank <= length)."""
    cursor.page = (<RankIndex>index)._page_at(rank, &cursor.pos)


cdef void pg_prefetch_names(object index, pg_cursor *cursor, Py_ssize_t count,
                            bint forward) noexcept:
    """Start loading the names of ``count`` entries from ``cursor`` on (back
    unless ``forward``), as a range read of the index does: names lie away
    from their entries, and a range would wait for each miss in turn."""
    (<RankIndex>index)._prefetch_names(<pg_page *>cursor.page, cursor.pos, count, not forward)


cdef const char *pg_member(object index, pg_cursor *cursor, Py_ssize_t *mlen) noexcept:
    """The member at ``cursor`` (its UTF-8 bytes, ``mlen`` of them), valid
    until the index changes."""
    cdef pg_page *p = <pg_page *>cursor.page
    return (<RankIndex>index)._name(PG_IDS(p)[cursor.pos], mlen)


cdef double pg_score(object index, pg_cursor *cursor) noexcept:
    """The score at ``cursor``."""
    return (<RankIndex>index)._score_at(<pg_page *>cursor.page, cursor.pos)


cdef void pg_step(object index, pg_cursor *cursor, bint forward) noexcept:
    """Move ``cursor`` to the next rank (``forward``) or the previous one;
    its page is NULL past either end."""
    cdef pg_page *p = <pg_page *>cursor.page
    if forward:
        cursor.pos += 1
        if cursor.pos == p.n:
            cursor.page = p.level[0].forward
            cursor.pos = 0
    else:
        cursor.pos -= 1
        if cursor.pos < 0:
            p = p.prev
            cursor.page = p
            cursor.pos = 0 if p == NULL else p.n - 1
