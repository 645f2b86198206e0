# The paged index's count tree: the entries (and leaders) before a page, in one miss.
#
# Design
# ------
# A member's rank is the entries of the pages before its page plus its
# position in it.  The skip list's spans gave that sum by a walk over
# towers (how ranks were read until issue 47's step 15), but on a big
# board the towers of its lowest levels are not in cache: three or four
# dependent misses at 100M members (bench/README.md, issue 47 step 13).
# This tree gives it with one: a B+ tree of counts over the pages in
# rank order.  It is the only count kept above the pages (since step 16
# the links carry no spans); ``ct_page_at`` goes down it to the page of
# a rank.  It counts
# leaders too (first entries of a run of equal scores), for dense ranks.
#
# * A *leaf* lists up to ``fanout`` page numbers in rank order, each with
#   its page's entry and leader counts; an *internal node* lists up to
#   ``fanout`` nodes, each with the entries and leaders under it.
#   ``fanout`` is the index's page size (64 by default; tests' tiny page
#   sizes make deep trees).
# * A node is ``stride`` 32-bit words in one array (its id is its place):
#   parent, children, slot in the parent, leaf flag, then the children's
#   ids, their entry counts and their leader counts, each array apart so
#   that a prefix of counts is contiguous (and summed by vector
#   instructions).
# * ``where``, by page number (a page table array, 4 bytes a page),
#   gives the page's leaf and its slot there, so that a read goes straight
#   to the page's counts.  An insert or removal in a leaf rewrites the
#   ``where`` of the pages it shifts (half a leaf on average, once per
#   page split or merge), and a node's split or merge those of the pages
#   it moves.
# * Entries before a page: its leaf's counts before its slot, then at
#   each level up the counts before the node's slot (leaders alike).
#   At 100M members (1.9M pages) the leaves are some 35 MB and the nodes
#   above them under 1 MB: the leaf is a miss, read beside the page (the
#   caller asks for both at once), and the rest is in cache.
# * Pages keep their numbers when they move (growth, evacuation,
#   widening), so only writes that change a page's entry count
#   (``ct_add``) or the order of pages (a page linked or unlinked) touch
#   the tree: ``_account``, ``_link_after``, ``_unlink_page`` and a load.
# * Splits halve a full node, but for an insert at its end, which starts
#   the new node with that child alone (a load appends: its nodes end
#   full).  A node left with a quarter of ``fanout`` children or fewer
#   merges with a neighbour when the two fit in three quarters of one; an
#   internal root with one child gives way to it.
# * Nothing here allocates but ``ct_reserve``: a page number is given
#   (``_page_alloc``) only once room for the nodes its insert can make
#   (one a level, and a new root) is reserved, so linking a page cannot
#   fail, and unlinking one frees nodes only.

cdef enum:
    CT_NONE = 0xFFFFFFFF
    CT_HEAD = 4            # words before a node's children


ctypedef struct pg_counts:
    uint32_t *words        # the nodes, ``stride`` words each
    uint32_t stride
    uint32_t fanout
    uint32_t made          # node ids below it have been used
    uint32_t cap           # nodes the array holds
    uint32_t free_list     # a freed node (its word 0 links the next), or CT_NONE
    uint32_t nfree
    uint32_t root          # CT_NONE: no page
    uint32_t depth         # levels (1: the root is a leaf)
    uint32_t *where        # by page number: leaf << 6 | slot
    uint32_t where_cap


cdef inline uint32_t *ct_node(pg_counts *ct, uint32_t node) noexcept nogil:
    return ct.words + <size_t>node * ct.stride


# A node's words: [0] parent, [1] children, [2] slot in the parent, [3] leaf.
cdef inline uint32_t *ct_children(pg_counts *ct, uint32_t *node) noexcept nogil:
    return node + CT_HEAD


cdef inline uint32_t *ct_counts(pg_counts *ct, uint32_t *node) noexcept nogil:
    return node + CT_HEAD + ct.fanout


cdef inline uint32_t *ct_leads(pg_counts *ct, uint32_t *node) noexcept nogil:
    return node + CT_HEAD + 2 * ct.fanout


cdef void ct_init(pg_counts *ct, uint32_t fanout) noexcept nogil:
    """An empty tree of nodes of ``fanout`` (4..64) children (its
    ``where`` is the index's, grown with the page table)."""
    ct.words = NULL
    ct.fanout = fanout
    ct.stride = CT_HEAD + 3 * fanout
    ct.made = ct.cap = ct.nfree = ct.depth = 0
    ct.free_list = ct.root = CT_NONE


cdef void ct_clear(pg_counts *ct) noexcept nogil:
    """Free the nodes (``where`` stays: the page table's)."""
    free(ct.words)
    ct_init(ct, ct.fanout)


cdef int ct_reserve(pg_counts *ct, uint32_t nodes) noexcept nogil:
    """Room for ``nodes`` more nodes without allocating; -1 if out of memory."""
    cdef uint32_t want
    cdef void *grown
    if ct.nfree + (ct.cap - ct.made) >= nodes:
        return 0
    want = ct.made + nodes
    want += want // 2
    grown = realloc(ct.words, <size_t>want * ct.stride * 4)
    if grown == NULL:
        return -1
    ct.words = <uint32_t *>grown
    ct.cap = want
    return 0


cdef uint32_t ct_new_node(pg_counts *ct, bint leaf) noexcept nogil:
    """A node from the reserved room (see ``ct_reserve``)."""
    cdef uint32_t id
    cdef uint32_t *node
    if ct.free_list != CT_NONE:
        id = ct.free_list
        ct.free_list = ct_node(ct, id)[0]
        ct.nfree -= 1
    else:
        id = ct.made
        ct.made += 1
    node = ct_node(ct, id)
    node[0] = CT_NONE
    node[1] = 0
    node[2] = 0
    node[3] = leaf
    return id


cdef inline void ct_free_node(pg_counts *ct, uint32_t id) noexcept nogil:
    ct_node(ct, id)[0] = ct.free_list
    ct_node(ct, id)[1] = 0
    ct.free_list = id
    ct.nfree += 1


cdef inline uint32_t ct_slot(pg_counts *ct, uint32_t pno, uint32_t **leaf) noexcept nogil:
    """The slot of page ``pno`` in its leaf (``leaf[0]``)."""
    cdef uint32_t w = ct.where[pno]
    leaf[0] = ct_node(ct, w >> 6)
    return w & 63


cdef inline void ct_prefetch(pg_counts *ct, uint32_t pno, bint leaders) noexcept nogil:
    """Ask for what ``ct_before`` reads of page ``pno``'s leaf: the
    header and the counts up to its own (and the leaders', if ``leaders``)."""
    cdef uint32_t w = ct.where[pno]
    cdef uint32_t *node = ct_node(ct, w >> 6)
    cdef uint32_t slot = w & 63, i
    rk_prefetch(node)
    for i in range(0, slot + 1, 16):
        rk_prefetch(ct_counts(ct, node) + i)
        if leaders:
            rk_prefetch(ct_leads(ct, node) + i)


cdef inline uint32_t ct_sum(const uint32_t *counts, uint32_t n) noexcept nogil:
    cdef uint32_t s = 0, i
    for i in range(n):
        s += counts[i]
    return s


cdef inline Py_ssize_t ct_before(pg_counts *ct, uint32_t pno, Py_ssize_t *leaders) noexcept nogil:
    """The entries of the pages before page ``pno`` (and their leaders,
    if ``leaders`` is not NULL)."""
    cdef uint32_t *node
    cdef uint32_t slot = ct_slot(ct, pno, &node), parent
    cdef Py_ssize_t total = 0, lead = 0
    while True:
        total += ct_sum(ct_counts(ct, node), slot)
        if leaders != NULL:
            lead += ct_sum(ct_leads(ct, node), slot)
        parent = node[0]
        if parent == CT_NONE:
            if leaders != NULL:
                leaders[0] = lead
            return total
        slot = node[2]
        node = ct_node(ct, parent)


cdef uint32_t ct_page_at(pg_counts *ct, Py_ssize_t entries, Py_ssize_t *before) noexcept nogil:
    """The page holding the entry with ``entries`` entries before it (0 <=
    entries < the total); ``before`` gets the entries before that page.
    Down from the root, each node's counts summed until the child that
    holds it."""
    cdef uint32_t *node = ct_node(ct, ct.root)
    cdef uint32_t *counts
    cdef uint32_t i
    cdef Py_ssize_t passed = 0
    while True:
        counts = ct_counts(ct, node)
        i = 0
        while i + 1 < node[1] and passed + counts[i] <= entries:
            passed += counts[i]
            i += 1
        if node[3]:
            before[0] = passed
            return ct_children(ct, node)[i]
        node = ct_node(ct, ct_children(ct, node)[i])


cdef inline void ct_node_add(pg_counts *ct, uint32_t id, int64_t dn, int64_t dl) noexcept nogil:
    """The entries and leaders under node ``id`` changed by ``dn`` and
    ``dl``: its ancestors count them."""
    cdef uint32_t *node = ct_node(ct, id)
    cdef uint32_t *parent
    while node[0] != CT_NONE:
        parent = ct_node(ct, node[0])
        ct_counts(ct, parent)[node[2]] = <uint32_t>(<int64_t>ct_counts(ct, parent)[node[2]]
                                                    + dn)
        ct_leads(ct, parent)[node[2]] = <uint32_t>(<int64_t>ct_leads(ct, parent)[node[2]] + dl)
        node = parent


cdef inline void ct_add(pg_counts *ct, uint32_t pno, int64_t dn, int64_t dl) noexcept nogil:
    """Page ``pno`` gained ``dn`` entries and ``dl`` leaders."""
    cdef uint32_t *node
    cdef uint32_t slot = ct_slot(ct, pno, &node)
    ct_counts(ct, node)[slot] = <uint32_t>(<int64_t>ct_counts(ct, node)[slot] + dn)
    ct_leads(ct, node)[slot] = <uint32_t>(<int64_t>ct_leads(ct, node)[slot] + dl)
    ct_node_add(ct, ct.where[pno] >> 6, dn, dl)


cdef inline void ct_adopt(pg_counts *ct, uint32_t *node, uint32_t id, uint32_t start) noexcept nogil:
    """Point the children of ``node`` (id ``id``) from ``start`` on back at it."""
    cdef uint32_t i
    cdef uint32_t *ids = ct_children(ct, node)
    cdef uint32_t *child
    for i in range(start, node[1]):
        if node[3]:
            ct.where[ids[i]] = id << 6 | i
        else:
            child = ct_node(ct, ids[i])
            child[0] = id
            child[2] = i


cdef void ct_insert_at(pg_counts *ct, uint32_t id, uint32_t at, uint32_t child) noexcept nogil:
    """Put ``child`` (a page number in a leaf, else a node), counted as no
    entries, at slot ``at`` of node ``id``, splitting it if full.  A split
    takes the entries of the children it moves out of the ancestors'
    counts before the new node is put in its parent, and adds them back
    from there after, so that every count is exact whenever a node above
    splits in turn."""
    cdef uint32_t *node = ct_node(ct, id)
    cdef uint32_t *other
    cdef uint32_t *ids
    cdef uint32_t *counts
    cdef uint32_t half, moved, total, ltotal, sibling, root, n
    if node[1] == ct.fanout:
        sibling = ct_new_node(ct, node[3])
        node = ct_node(ct, id)
        other = ct_node(ct, sibling)
        half = ct.fanout if at == ct.fanout else ct.fanout // 2
        moved = ct.fanout - half
        memcpy(ct_children(ct, other), ct_children(ct, node) + half, moved * 4)
        memcpy(ct_counts(ct, other), ct_counts(ct, node) + half, moved * 4)
        memcpy(ct_leads(ct, other), ct_leads(ct, node) + half, moved * 4)
        other[1] = moved
        node[1] = half
        ct_adopt(ct, other, sibling, 0)
        total = ct_sum(ct_counts(ct, other), moved)
        ltotal = ct_sum(ct_leads(ct, other), moved)
        if node[0] == CT_NONE:
            root = ct_new_node(ct, False)
            node = ct_node(ct, id)
            other = ct_node(ct, sibling)
            ids = ct_children(ct, ct_node(ct, root))
            counts = ct_counts(ct, ct_node(ct, root))
            ids[0], ids[1] = id, sibling
            counts[0] = ct_sum(ct_counts(ct, node), half)
            counts[1] = total
            ct_leads(ct, ct_node(ct, root))[0] = ct_sum(ct_leads(ct, node), half)
            ct_leads(ct, ct_node(ct, root))[1] = ltotal
            ct_node(ct, root)[1] = 2
            ct_adopt(ct, ct_node(ct, root), root, 0)
            ct.root = root
            ct.depth += 1
        else:
            ct_node_add(ct, id, -<int64_t>total, -<int64_t>ltotal)
            ct_insert_at(ct, node[0], node[2] + 1, sibling)
            ct_node_add(ct, sibling, total, ltotal)
        if at > half or moved == 0:
            id, at = sibling, at - half
        node = ct_node(ct, id)
    n = node[1]
    ids = ct_children(ct, node)
    counts = ct_counts(ct, node)
    memmove(ids + at + 1, ids + at, (n - at) * 4)
    memmove(counts + at + 1, counts + at, (n - at) * 4)
    memmove(ct_leads(ct, node) + at + 1, ct_leads(ct, node) + at, (n - at) * 4)
    ids[at] = child
    counts[at] = 0
    ct_leads(ct, node)[at] = 0
    node[1] = n + 1
    ct_adopt(ct, node, id, at)


cdef void ct_insert_after(pg_counts *ct, uint32_t prev, uint32_t pno) noexcept nogil:
    """Put page ``pno`` (no entries) after page ``prev`` (CT_NONE: first)."""
    cdef uint32_t *node
    cdef uint32_t slot, id
    if ct.root == CT_NONE:
        id = ct_new_node(ct, True)
        ct.root = id
        ct.depth = 1
        ct_insert_at(ct, id, 0, pno)
        return
    if prev == CT_NONE:
        id = ct.root
        while not ct_node(ct, id)[3]:
            id = ct_children(ct, ct_node(ct, id))[0]
        ct_insert_at(ct, id, 0, pno)
        return
    slot = ct_slot(ct, prev, &node)
    ct_insert_at(ct, ct.where[prev] >> 6, slot + 1, pno)


cdef void ct_remove_at(pg_counts *ct, uint32_t id, uint32_t at) noexcept nogil:
    """Take slot ``at`` (counting no entries) out of node ``id``; a node
    left empty goes, one left a quarter full merges with a neighbour that
    has room, and an internal root of one child gives way to it."""
    cdef uint32_t *node = ct_node(ct, id)
    cdef uint32_t *parent
    cdef uint32_t *left
    cdef uint32_t *right
    cdef uint32_t n = node[1] - 1, slot, lid, rid, ln, pid
    cdef uint32_t *ids = ct_children(ct, node)
    cdef uint32_t *counts = ct_counts(ct, node)
    memmove(ids + at, ids + at + 1, (n - at) * 4)
    memmove(counts + at, counts + at + 1, (n - at) * 4)
    memmove(ct_leads(ct, node) + at, ct_leads(ct, node) + at + 1, (n - at) * 4)
    node[1] = n
    ct_adopt(ct, node, id, at)
    if node[0] == CT_NONE:
        if n == 0:
            ct_free_node(ct, id)
            ct.root = CT_NONE
            ct.depth = 0
        elif n == 1 and not node[3]:
            ct.root = ids[0]
            ct_node(ct, ct.root)[0] = CT_NONE
            ct_node(ct, ct.root)[2] = 0
            ct_free_node(ct, id)
            ct.depth -= 1
        return
    pid = node[0]
    parent = ct_node(ct, pid)
    slot = node[2]
    if n == 0:
        ct_free_node(ct, id)
        ct_remove_at(ct, pid, slot)
        return
    if n > ct.fanout // 4:
        return
    # A quarter full: merge with the next node, or the one before.
    if slot + 1 < parent[1]:
        lid, rid = id, ct_children(ct, parent)[slot + 1]
    elif slot > 0:
        lid, rid, slot = ct_children(ct, parent)[slot - 1], id, slot - 1
    else:
        return
    left = ct_node(ct, lid)
    right = ct_node(ct, rid)
    ln = left[1]
    if ln + right[1] > ct.fanout * 3 // 4:
        return
    memcpy(ct_children(ct, left) + ln, ct_children(ct, right), right[1] * 4)
    memcpy(ct_counts(ct, left) + ln, ct_counts(ct, right), right[1] * 4)
    memcpy(ct_leads(ct, left) + ln, ct_leads(ct, right), right[1] * 4)
    left[1] = ln + right[1]
    ct_adopt(ct, left, lid, ln)
    ct_counts(ct, parent)[slot] += ct_counts(ct, parent)[slot + 1]
    ct_counts(ct, parent)[slot + 1] = 0
    ct_leads(ct, parent)[slot] += ct_leads(ct, parent)[slot + 1]
    ct_leads(ct, parent)[slot + 1] = 0
    ct_free_node(ct, rid)
    ct_remove_at(ct, pid, slot + 1)


cdef uint32_t ct_remove(pg_counts *ct, uint32_t pno, uint32_t *leads) noexcept nogil:
    """Take page ``pno`` out; return the entries the tree counted for it,
    and its leaders in ``leads`` (the caller gives them to the page that
    took them, if any)."""
    cdef uint32_t *node
    cdef uint32_t slot = ct_slot(ct, pno, &node)
    cdef uint32_t count = ct_counts(ct, node)[slot]
    leads[0] = ct_leads(ct, node)[slot]
    if count or leads[0]:
        ct_add(ct, pno, -<int64_t>count, -<int64_t>leads[0])
    ct_remove_at(ct, ct.where[pno] >> 6, slot)
    return count


cdef size_t ct_bytes(pg_counts *ct) noexcept nogil:
    """The nodes' memory (``where`` is the page table's)."""
    return <size_t>ct.cap * ct.stride * 4
