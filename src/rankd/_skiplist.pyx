# cython: language_level=3
"""Native rank index: a span-counting skip list plus a member hash table.

Why two structures
------------------
A leaderboard is asked two kinds of questions: "what is member M's score
and rank?" and "who is at ranks K..K+n?".  The hash table answers the first
half of the first question in O(1) and hands over the member's node; the
skip list, ordered best-first, answers everything positional in O(log n).
Both point at the same node: the hash table owns no memory of its own
beyond its slot array, and the skip list owns the nodes.

How this skip list differs from Pugh's paper (and what it shares with the
one in Redis's t_zset.c)
---------------------------------------------------------------------------
* Scores repeat.  Nodes are ordered by a total key: ``(key, seq, member)``
  for the "first" tie-break and ``(key, member)`` for "member" (members
  compared the other way round for "member_desc"), where
  ``key`` is the score negated on descending boards, so that "lower key is
  better" holds for both orders and one comparison routine serves both.
* Every forward link carries a *span*: how many nodes it skips over.
  Summing spans along a search path gives a node's rank in O(log n).
  A link to NULL spans to the end of the list.
* Every forward link also carries a *distinct span*: how many *leaders* it
  skips over, a leader being the first node of a run of equal scores.  The
  number of leaders up to a node is its dense rank, so dense rank is
  O(log n) like unique rank, with no second ordered structure.  Inserting or
  deleting a node changes the leadership of at most itself and its level-0
  successor, so the distinct spans are kept exact with the same update path
  that keeps the ordinary spans.
* Every link caches its forward node's key, so a search step reads only
  the node it stands on unless the keys tie; at a million members this
  saves about one cache miss per level (8 bytes per level entry).
* Level 0 is doubly linked (``backward``) so ranges can be walked from the
  worst member, and ``tail`` points at the worst node.
* A node that keeps its place when its score changes is updated in place,
  as Redis's zslUpdateScore does, even when it joins or leaves a run of
  tied scores (the distinct spans over it and its successor are fixed on
  the one search path).  A node of one level that moves past a
  few neighbours of one level is relinked on level 0 alone (no span above
  it changes) and found by one search; otherwise it is unlinked and
  relinked without freeing it.
* ``apply_batch`` walks the searches of a group of operations in lock step
  before writing them, so that their cache misses overlap (see
  ``_prefetch_group``).
* Nodes are laid out in rank order.  A board that grows by random
  arrivals scatters list neighbours over its whole arena, so every step of
  a search is a miss somewhere at random.  Once one node in eight was
  allocated since the last layout began (past 32,768 members), the nodes
  are copied in rank order into fresh memory, the nodes of three levels or
  more in a region of their own, a few hundred a write, paced by the clock,
  so that no write nor run of writes waits long (``_relayout_begin``).  A search then finds its last steps
  close together and prefetches them: the memory around the node it looks
  for (levels 0 and 1) and after the tall node it goes down from (levels
  2 and 3).
* ``rank()`` of the member a write just placed reuses the rank that write
  found, until the next change (``_remember``).

Memory
------
A node is one block from the index's arena (see the C section of _skiplist.pxd): the
header fields, ``nlevels`` level entries and the member's UTF-8 bytes, no
Python object per member.  The hash table is
open addressing with linear probing over node pointers, keyed by SipHash-1-3
with a per-index random key (member names come from players, so collisions
must not be predictable), and deletes by backward shift, so it never holds
tombstones, but for the old table of a doubling under way, which moves into
the new one a few slots a write (``_table_begin``).
"""

cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.float cimport PyFloat_AS_DOUBLE
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.ref cimport PyObject
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.math cimport INFINITY, isfinite, signbit
from libc.stdint cimport int64_t, uint8_t, uint16_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcmp, memcpy

cdef extern from "Python.h":
    void PyObject_GC_UnTrack(void *op)

import os
import zlib

# A dump's tie-break byte, by value.
TIE_BREAK_CODES = ("first", "member", "member_desc")

# The C structures (nodes, arena, hash) and RankIndex's fields and C methods
# are declared in _skiplist.pxd, so that other native modules can cimport the index.

# Nodes alive in every index of the process; tests use it to prove that
# indexes free everything they allocate.
cdef Py_ssize_t _live_nodes = 0


def live_nodes():
    """Number of skip list nodes currently allocated, across all indexes."""
    return _live_nodes


# --- input validation, shared with the other native index (see the .pxi) ---

include "_index_common.pxi"


@cython.final
cdef class RankIndex:
    """A leaderboard index: members ordered by score, best first.

    See :mod:`rankd.index._contract` for the full contract.  Example::

        >>> board = RankIndex("desc")
        >>> board.incr("alice", 10)
        (None, 10.0, True)
        >>> board.set("bob", 7)
        (None, 7.0, True)
        >>> board.rank("bob"), board.range_by_rank(0, 1)
        (2, [(1, 'alice', 10.0)])
    """


    def __cinit__(self, order="desc", tie_break="first", *, int max_level=MAX_LEVEL,
                  int branching=DEFAULT_BRANCHING, seed=None):
        _options(order, tie_break, max_level, branching, seed)
        self.descending = order == "desc"
        self.tie_by_member = tie_break != "first"
        self.tie_member_desc = tie_break == "member_desc"
        self.max_level = max_level
        self.branching = branching
        if seed is None:
            self.rng_state = int.from_bytes(os.urandom(8), "little")
        else:
            self.rng_state = (seed * 0x9E3779B97F4A7C15 + 1) & 0xFFFFFFFFFFFFFFFF
        if self.rng_state == 0:
            self.rng_state = 0x9E3779B97F4A7C15  # xorshift must not start at 0
        key = os.urandom(16)
        self.hash_k0 = int.from_bytes(key[:8], "little")
        self.hash_k1 = int.from_bytes(key[8:], "little")
        rk_arena_init(&self.arena)
        rk_arena_init(&self.tall_arena)
        self.relayout_min_length = RELAYOUT_MIN_LENGTH
        self.relayout_moves = RELAYOUT_MOVES
        self.relayout_pace_ns = RELAYOUT_PACE_NS
        self.header = <rk_node *>calloc(1, RK_NODE_SIZE(MAX_LEVEL, 0))
        if self.header == NULL:
            raise MemoryError()
        self.header.nlevels = MAX_LEVEL
        self.slots = _table_alloc(MIN_TABLE_SIZE)
        self.mask = MIN_TABLE_SIZE - 1
        self.table_migrate_min = TABLE_MIGRATE_MIN
        self.table_moves = TABLE_MOVES
        self._reset_header()

    def __dealloc__(self):
        self._free_nodes()
        free(self.header)
        _table_free(self.slots, self.mask + 1)
        self._drop_old_table()

    # --- node memory --------------------------------------------------------

    cdef rk_node *_new_node(self, int nlevels, const char *member, Py_ssize_t mlen) except NULL:
        cdef rk_node *node = self._alloc_node(nlevels, member, mlen)
        if node == NULL:
            raise MemoryError()
        global _live_nodes
        _live_nodes += 1
        return node

    cdef rk_node *_alloc_node(self, int nlevels, const char *member,
                              Py_ssize_t mlen) noexcept nogil:
        """:meth:`_new_node` without the GIL: NULL if there is no memory,
        and not counted in ``_live_nodes`` (the caller counts it, holding
        the GIL)."""
        cdef rk_node *node = <rk_node *>rk_arena_alloc(&self.arena, RK_NODE_SIZE(nlevels, mlen))
        if node == NULL:
            return NULL
        self.unplaced += 1
        node.nlevels = nlevels
        node.queued = 0
        node.mlen = mlen
        node.backward = NULL
        node.seq = 0
        node.key = 0.0
        node.hash = 0
        if mlen:
            memcpy(RK_MEMBER(node), member, mlen)
        if mlen > self.peak_member_bytes:
            self.peak_member_bytes = mlen
        return node

    cdef void _free_nodes(self) noexcept:
        """Free every member node (not the header) by releasing the arenas."""
        _count_free(self.length)
        if self.relaying:
            self._relayout_end()
        rk_arena_release(&self.arena)
        rk_arena_release(&self.tall_arena)

    cdef void _free_node(self, rk_node *node) noexcept:
        # A node in an old arena goes with it when the relayout ends.
        if not self.relaying or not rk_ranges_hold(&self.old_ranges, node):
            rk_arena_free(&self.arena, node, RK_NODE_SIZE(node.nlevels, node.mlen))
        _count_free(1)

    cdef void _reset_header(self) noexcept:
        cdef int i
        for i in range(MAX_LEVEL):
            self.header.level[i].forward = NULL
            self.header.level[i].span = 0
            self.header.level[i].dspan = 0
        self.header.backward = NULL
        self.tail = NULL
        self.length = 0
        self.ndistinct = 0
        self.member_bytes = 0
        self.peak_length = 0
        self.peak_member_bytes = 0
        self.height = 1

    @cython.cdivision(True)
    cdef int _random_level(self) noexcept nogil:
        """Level of a new node: 1, then one more with probability 1/branching."""
        cdef int level = 1
        cdef uint64_t x
        while level < self.max_level:
            x = self.rng_state  # xorshift64*
            x ^= x >> 12
            x ^= x << 25
            x ^= x >> 27
            self.rng_state = x
            if ((x * 2685821657736338717ULL) >> 32) % self.branching != 0:
                break
            level += 1
        return level

    # --- ordering -------------------------------------------------------------
    #
    # A target is described by (key, seq, member bytes); node order is total.

    cdef inline bint _before(self, rk_node *node, double key, uint64_t seq,
                             const char *member, Py_ssize_t mlen) noexcept nogil:
        """Whether ``node`` sorts strictly before the target."""
        cdef int cmp
        if node.key != key:
            return node.key < key
        if not self.tie_by_member and node.seq != seq:
            return node.seq < seq
        cmp = memcmp(RK_MEMBER(node), member, node.mlen if node.mlen < mlen else mlen)
        if self.tie_member_desc:  # Z to A: the longer of two members where one is a prefix
            return cmp > 0 if cmp != 0 else node.mlen > mlen
        if cmp != 0:
            return cmp < 0
        return node.mlen < mlen

    cdef inline bint _link_before(self, rk_level *link, double key, uint64_t seq,
                                  const char *member, Py_ssize_t mlen) noexcept:
        """Whether ``link`` leads to a node sorting strictly before the target."""
        if link.forward == NULL:
            return False
        if link.fkey != key:
            return link.fkey < key
        return self._before(link.forward, key, seq, member, mlen)

    cdef inline bint _node_before(self, rk_node *a, rk_node *b) noexcept:
        return self._before(a, b.key, b.seq, RK_MEMBER(b), b.mlen)

    cdef inline double _score(self, rk_node *node) noexcept:
        return -node.key if self.descending else node.key

    cdef inline double _key(self, double score) noexcept nogil:
        # Either zero negates to the other, and the two compare equal: a
        # score of -0.0 ranks exactly as 0.0 (ties by seq or member).
        return -score if self.descending else score

    cdef inline bint _is_leader(self, rk_node *node) noexcept:
        return node.backward == NULL or node.backward.key != node.key

    cdef inline void _prefetch_ahead(self, rk_node *node, int finished) noexcept:
        """Start loading the memory after ``node`` that a search leaving it
        down from level ``finished`` will step through next, when that is
        level TALL - 1 or TALL and the tall nodes there are laid out in rank
        order (see ``_relayout_begin``): its next node on that level is then close
        behind it.  Its steps on level TALL - 1 go to the tall nodes right
        after this one, those on level TALL to every fourth or so."""
        cdef int level = finished - 1
        cdef uintptr_t at = <uintptr_t>node
        cdef uintptr_t window
        cdef rk_node *forward
        if level != TALL - 1 and level != TALL or node == self.header:
            return
        window = AHEAD_LOW if level == TALL - 1 else AHEAD_HIGH
        forward = node.level[level].forward
        if forward != NULL and <uintptr_t>forward - at <= window:
            rk_prefetch_lines(at + 64, at + window)

    cdef inline void _prefetch_neighbourhood(self, rk_node *x) noexcept:
        """Start loading the memory around present node ``x`` when its
        level-0 predecessor lies there.

        The nodes are then laid out in rank order (see ``_relayout_begin``), and
        a search for x ends with steps through the nodes just before it on
        levels 0 and 1 (about four nodes a step on level 1): fetched
        together, they cost one round trip to memory instead of one a step.
        Elsewhere the memory around x holds unrelated nodes: nothing is
        fetched."""
        cdef uintptr_t at = <uintptr_t>x
        if x.backward != NULL and <uintptr_t>x.backward - at + NEIGHBOURHOOD <= 2 * NEIGHBOURHOOD:
            rk_prefetch_lines(at - NEIGHBOURHOOD, at + 256)

    # --- hash table -------------------------------------------------------------

    cdef inline uint32_t _hash(self, const char *member, Py_ssize_t mlen) noexcept nogil:
        return rk_hash_memo_get(&self.hash_memo, self.hash_k0, self.hash_k1, member, mlen)

    cdef inline rk_node *_lookup(self, const char *member, Py_ssize_t mlen,
                                 uint32_t h) noexcept nogil:
        cdef size_t i = h & self.mask
        cdef rk_node *node = self.slots[i]
        while node != NULL:
            if node.hash == h and node.mlen == mlen and memcmp(RK_MEMBER(node), member, mlen) == 0:
                return node
            i = (i + 1) & self.mask
            node = self.slots[i]
        if self.old_slots != NULL:
            return self._lookup_old(member, mlen, h)
        return NULL

    cdef rk_node *_lookup_old(self, const char *member, Py_ssize_t mlen,
                              uint32_t h) noexcept nogil:
        """While the table doubles, a member only the old table holds.  Its
        slots below ``migrated`` were copied to the new table and are not
        read (the nodes they point to may have moved or gone)."""
        cdef size_t i = h & self.old_mask
        cdef rk_node *node = self.old_slots[i]
        while node != NULL:
            if (i >= self.migrated and node != TOMBSTONE and node.hash == h
                    and node.mlen == mlen and memcmp(RK_MEMBER(node), member, mlen) == 0):
                return node
            i = (i + 1) & self.old_mask
            node = self.old_slots[i]
        return NULL

    cdef inline rk_node *_find(self, object member) except? NULL:
        cdef const char *data
        cdef Py_ssize_t size
        _member_bytes(member, &data, &size)
        return self._lookup(data, size, self._hash(data, size))

    cdef int _table_reserve(self, Py_ssize_t members) except -1:
        """Grow the table so ``members`` entries keep it at most 3/4 full,
        and begin laying the nodes out afresh once many were placed at
        random (see ``_relayout_begin``).  Called before nodes are added."""
        cdef size_t size = self.mask + 1
        while <size_t>members * 4 > size * 3:
            size *= 2
        if size != self.mask + 1:
            if self.old_slots != NULL:  # the last doubling is not done: finish it
                self._table_migrate(self.old_mask + 1)
            if size == 2 * (self.mask + 1) and size >= self.table_migrate_min:
                self._table_begin(size)
            else:
                self._table_resize(size)
        if (not self.relaying and self.length >= self.relayout_min_length
                and self.unplaced * RELAYOUT_SHARE >= self.length):
            self._relayout_begin()
        return 0

    cdef void _table_insert(self, rk_node *node) noexcept nogil:
        """Add a node known to be absent; the caller reserved room for it."""
        cdef size_t i = node.hash & self.mask
        while self.slots[i] != NULL:
            i = (i + 1) & self.mask
        self.slots[i] = node

    cdef int _table_resize(self, size_t size) except -1:
        """Move every member to a new table of ``size`` slots at once."""
        cdef rk_node **old = self.slots
        cdef size_t old_size = self.mask + 1
        cdef rk_node **slots = _table_alloc(size, True)
        cdef size_t i, j
        self.slots = slots
        self.mask = size - 1
        for i in range(old_size):
            if old[i] != NULL:
                j = old[i].hash & self.mask
                while slots[j] != NULL:
                    j = (j + 1) & self.mask
                slots[j] = old[i]
        _table_free(old, old_size)
        return 0

    cdef int _table_begin(self, size_t size) except -1:
        """Begin doubling the table into a new one of ``size`` slots.

        The members move a few slots of the old table a write
        (``_table_migrate``, from every write that changes the index),
        in slot order; the old table goes once the last slot has moved.
        Meanwhile new members go to the new table, a lookup that misses it
        looks in the old one, and a member removed from the old one leaves
        a tombstone there (shifting entries back could carry one past the
        slots already moved).  Doubled at once, at millions of members, it
        stopped the event loop for 13 ms at 786K members and 47-198 ms at
        3.15M, most of it the kernel zeroing the new table's memory, which
        it now does a page at a time as the members move in.  Moved in slot
        order, they fill the new table from two ends at a time (a member
        of old slot i lands near slot i or i + old size), so it is in huge
        pages from the start: each is faulted in as the fill reaches it,
        where a table left in small pages until khugepaged collapsed it
        made lookups 7-17 % slower in bench_index.py meanwhile."""
        cdef rk_node **slots = _table_alloc(size, True)
        self.old_slots = self.slots
        self.old_mask = self.mask
        self.migrated = 0
        self.slots = slots
        self.mask = size - 1
        return 0

    cdef void _table_migrate(self, size_t count) noexcept:
        """Move the members of the next ``count`` slots of the old table to
        the new one; free the old one after its last slot."""
        cdef rk_node **old = self.old_slots
        cdef size_t n = self.old_mask + 1
        cdef size_t end = self.migrated + count if count < n - self.migrated else n
        cdef size_t i, j
        cdef rk_node *x
        for i in range(self.migrated, end):
            if i + 8 < end and old[i + 8] > TOMBSTONE:
                rk_prefetch(old[i + 8])  # its hash, a miss in a random place
            x = old[i]
            if x != NULL and x != TOMBSTONE:
                j = x.hash & self.mask
                while self.slots[j] != NULL:
                    j = (j + 1) & self.mask
                self.slots[j] = x
        self.migrated = end
        if end == n:
            self._drop_old_table()

    cdef void _drop_old_table(self) noexcept:
        """Free the old table of a doubling, if any."""
        if self.old_slots != NULL:
            _table_free(self.old_slots, self.old_mask + 1)
            self.old_slots = NULL
            self.old_mask = self.migrated = 0

    cdef rk_node **_slot_of(self, rk_node *node) noexcept:
        """The slot that holds present node ``node``, in either table."""
        cdef size_t i = node.hash & self.mask
        while self.slots[i] != node:
            if self.slots[i] == NULL:
                return self._old_slot_of(node)
            i = (i + 1) & self.mask
        return &self.slots[i]

    cdef rk_node **_old_slot_of(self, rk_node *node) noexcept:
        """The old table's slot of a present node not moved yet (at or past
        ``migrated``) while the table doubles."""
        cdef size_t i = node.hash & self.old_mask
        while self.old_slots[i] != node or i < self.migrated:
            i = (i + 1) & self.old_mask
        return &self.old_slots[i]

    cdef int _relayout_begin(self) except -1:
        """Start laying the nodes out afresh in rank order.

        Nodes are placed where they were allocated: on a board that grew
        by random arrivals, neighbours in the list are scattered over the
        whole arena, and each step of a search is a miss in a random page.
        Laid out in rank order, the nodes a search visits on the lower
        levels sit a few hundred bytes to a few kilobytes apart (a node of
        level i is followed on that level by one about 4**i nodes further).
        The nodes of TALL levels or more (one in sixteen) go to an arena of
        their own, the others to another, each in rank order: the search's
        steps on levels TALL - 1 and up visit tall nodes only, which then
        sit close together too (the next one on level TALL - 1 is the next
        tall node in memory), and the steps on levels 0 and 1 stay among
        the nodes around the one searched for.

        Begun before a new member is added once one node in RELAYOUT_SHARE
        (8) was allocated since the last layout began, by growth or by
        members removed and added: at most one node in eight is out of
        place, and each costs a miss to every search that passes it.

        A relayout moves the nodes a few at a time: every write moves the
        next RELAYOUT_MOVES (``_relayout_step``; fewer when many writes
        come at once: see ``_relayout_share``), in rank order, into
        fresh arenas, and the old ones are freed once it has passed the
        last node.  Copied all at once, at millions of members, it stopped
        the event loop for 0.1-0.4 s each time.  Meanwhile new nodes come
        from the fresh arena, a node moved from beyond the relayout's
        position to before it is moved into the fresh memory at once
        (``_placed``), and a node removed from the old memory is left
        there, which goes as a whole.  Every node pointer may change at
        every write: callers hold none across one.
        """
        cdef size_t tall_chunk
        if rk_ranges_of(&self.old_ranges, &self.arena, &self.tall_arena) != 0:
            raise MemoryError()
        self.old_arena = self.arena
        self.old_tall_arena = self.tall_arena
        rk_arena_init_from(&self.arena, HUGE_CHUNK)
        # One node in 16 is tall, of about 128 bytes.
        tall_chunk = RK_FIRST_CHUNK
        while tall_chunk < HUGE_CHUNK and tall_chunk < <size_t>self.length * 8:
            tall_chunk *= 2
        rk_arena_init_from(&self.tall_arena, tall_chunk)
        self.relaying = True
        self.relayout_next = self.header.level[0].forward
        self.unplaced = 0
        self.relayout_credit = RELAYOUT_CREDIT
        self.relayout_clock = rk_now_ns()
        return 0

    cdef void _relayout_step(self, Py_ssize_t moves) noexcept:
        """Move up to ``moves`` more nodes of a relayout under way; end it
        after the last one."""
        cdef rk_node *update[MAX_LEVEL]
        # The hash slots of the nodes moved are repointed a batch at a
        # time, once they had time to arrive: a slot is a miss in a random
        # place, most of a move's cost when taken one at a time.
        cdef rk_node *moved_from[REPOINT_BATCH]
        cdef rk_node *moved_to[REPOINT_BATCH]
        cdef rk_node *x = self.relayout_next
        cdef rk_node *y
        cdef int i, batch = 0
        cdef bint memo_valid
        if x == NULL:
            self._relayout_end()
            return
        # The last node before x on every level: the links that lead to it.
        self._path_to(x, update)
        while x != NULL and moves > 0:
            if x.level[0].forward != NULL:
                rk_prefetch_node(x.level[0].forward)
            if rk_ranges_hold(&self.old_ranges, x):
                rk_prefetch(&self.slots[x.hash & self.mask])
                y = self._move_node(x, update)
                if y == NULL:
                    break  # no memory: x stays next, for a later write
                moved_from[batch] = x
                moved_to[batch] = y
                batch += 1
                if batch == REPOINT_BATCH:
                    self._repoint_slots(moved_from, moved_to, batch)
                    batch = 0
                x = y
                moves -= 1
            for i in range(x.nlevels):
                update[i] = x
            x = x.level[0].forward
        self._repoint_slots(moved_from, moved_to, batch)
        self.relayout_next = x
        # Nodes moved (iterators stop), ranks unchanged (the memo stands).
        memo_valid = self.memo_mutations == self.mutations
        self.mutations += 1
        if memo_valid:
            self.memo_mutations = self.mutations
        if x == NULL:
            self._relayout_end()

    cdef void _relayout_end(self) noexcept:
        """Free the old arenas: no node is left in them."""
        rk_arena_release(&self.old_arena)
        rk_arena_release(&self.old_tall_arena)
        rk_ranges_free(&self.old_ranges)
        self.relaying = False
        self.relayout_next = NULL

    cdef rk_node *_move_node(self, rk_node *x, rk_node **update) noexcept:
        """Copy present node ``x`` to the end of its fresh arena and link the
        copy in its place (``update[i]``: the last node before x on level i);
        x's memory stays in the old arena, and its hash slot still points
        there (see ``_repoint_slots``).  NULL, with nothing changed, if
        there is no memory."""
        cdef size_t size = RK_NODE_SIZE(x.nlevels, x.mlen)
        cdef rk_node *y = <rk_node *>rk_arena_alloc(
            &self.tall_arena if x.nlevels >= TALL else &self.arena, size)
        cdef rk_node *succ = x.level[0].forward
        cdef int i
        if y == NULL:
            return NULL
        memcpy(y, x, size)
        for i in range(x.nlevels):
            update[i].level[i].forward = y
        if succ != NULL:
            succ.backward = y
        else:
            self.tail = y
        if self.memo_node == x:
            self.memo_node = y
        return y

    cdef void _repoint_slots(self, rk_node **moved_from, rk_node **moved_to,
                             int count) noexcept:
        """Point the hash slots of ``count`` moved nodes at their copies."""
        cdef rk_node **slot
        cdef int k
        for k in range(count):
            slot = self._slot_of(moved_from[k])
            slot[0] = moved_to[k]

    cdef inline void _after_write(self) noexcept:
        """The share of a table doubling or relayout under way that each
        write that changes the index does."""
        if self.old_slots != NULL:
            self._table_migrate(self.table_moves)
        cdef Py_ssize_t moves
        if self.relaying:
            moves = self._relayout_share()
            if moves:
                self._relayout_step(moves)
                # The step's own time earns no credit: counted, a move
                # costing about the pace would pay for the next one, and
                # every write of a run would move the most it may.
                self.relayout_clock = rk_now_ns()

    cdef inline Py_ssize_t _relayout_share(self) noexcept:
        """How many nodes of the relayout under way this write moves: up
        to ``relayout_moves``, from a credit that each write and the clock
        fill (see RK_RELAYOUT_PACE_NS), none while it holds less than a
        step's worth."""
        cdef uint64_t now, earned
        cdef Py_ssize_t moves
        if self.relayout_pace_ns == 0:
            return self.relayout_moves
        now = rk_now_ns()
        earned = (now - self.relayout_clock) // self.relayout_pace_ns
        self.relayout_clock += earned * self.relayout_pace_ns
        self.relayout_credit = min(<uint64_t>RELAYOUT_CREDIT,
                                   self.relayout_credit + earned + RELAYOUT_PER_WRITE)
        if self.relayout_credit < RELAYOUT_MIN_STEP:
            return 0
        moves = min(self.relayout_moves, self.relayout_credit)
        self.relayout_credit -= moves
        return moves

    cdef rk_node *_placed(self, rk_node *x) noexcept:
        """``x``, just written, or the copy it moved to: a node of the old
        arenas that a write moved before the relayout's position is moved
        into the fresh memory now (the relayout would not reach it)."""
        cdef rk_node *update[MAX_LEVEL]
        cdef rk_node *y
        if not self.relaying or (self.relayout_next != NULL
                                 and not self._node_before(x, self.relayout_next)):
            return x
        if not rk_ranges_hold(&self.old_ranges, x):
            return x
        self._path_to(x, update)
        y = self._move_node(x, update)
        if y != NULL:
            self._repoint_slots(&x, &y, 1)
            return y
        # No memory: the relayout goes back to x and passes over the
        # moved nodes from there again.
        self.relayout_next = x
        return x

    cdef void _table_remove(self, rk_node *node) noexcept:
        """Remove a present node, shifting later entries of its probe run back
        into the hole so lookups never need tombstones (Knuth's Algorithm R);
        in the old table of a doubling under way, it leaves a tombstone."""
        cdef size_t hole = node.hash & self.mask
        cdef size_t j, home
        cdef rk_node **slot
        while self.slots[hole] != node:
            if self.slots[hole] == NULL:
                slot = self._old_slot_of(node)
                slot[0] = TOMBSTONE
                return
            hole = (hole + 1) & self.mask
        j = hole
        while True:
            j = (j + 1) & self.mask
            if self.slots[j] == NULL:
                break
            home = self.slots[j].hash & self.mask
            # The entry at j may move into the hole unless its home lies
            # cyclically in (hole, j].
            if hole <= j:
                if hole < home <= j:
                    continue
            elif hole < home or home <= j:
                continue
            self.slots[hole] = self.slots[j]
            hole = j
        self.slots[hole] = NULL

    # --- skip list core -----------------------------------------------------------

    cdef Py_ssize_t _link(self, rk_node *x, bint newest=False) noexcept:
        """Insert node ``x`` (key, seq, member and nlevels set; absent from the
        list) at its place.  Returns its 1-based rank.

        ``newest``: x's seq is above every other node's.  On a "first" board
        x then follows every node of its score, so each search step decides
        on the cached key alone, without visiting the forward node to compare
        sequences (on boards with many tied scores most steps tie).

        Spans follow Redis's zslInsert; distinct spans additionally count the
        leadership changes: ``dx`` for x itself, ``ds`` for its successor,
        which stops leading its run when x joins that run in front of it.
        """
        cdef rk_node *update[MAX_LEVEL]
        cdef Py_ssize_t rank[MAX_LEVEL]
        cdef Py_ssize_t drank[MAX_LEVEL]
        cdef rk_node *node = self.header
        cdef rk_node *pred
        cdef rk_node *succ
        cdef int i, level = x.nlevels
        cdef int dx, ds = 0
        cdef uint32_t old_span, old_dspan
        cdef const char *member = RK_MEMBER(x)
        cdef bint after_ties = newest and not self.tie_by_member

        for i in range(self.height - 1, -1, -1):
            rank[i] = 0 if i == self.height - 1 else rank[i + 1]
            drank[i] = 0 if i == self.height - 1 else drank[i + 1]
            while (node.level[i].forward != NULL and node.level[i].fkey <= x.key
                   if after_ties else
                   self._link_before(&node.level[i], x.key, x.seq, member, x.mlen)):
                rank[i] += node.level[i].span
                drank[i] += node.level[i].dspan
                node = node.level[i].forward
            update[i] = node
            self._prefetch_ahead(node, i)

        pred = update[0]
        succ = pred.level[0].forward
        dx = pred == self.header or pred.key != x.key
        if succ != NULL:
            ds = (succ.key != x.key) - (pred == self.header or pred.key != succ.key)

        if level > self.height:
            for i in range(self.height, level):
                rank[i] = 0
                drank[i] = 0
                update[i] = self.header
                self.header.level[i].forward = NULL
                self.header.level[i].span = self.length
                self.header.level[i].dspan = self.ndistinct
            self.height = level

        for i in range(level):
            old_span = update[i].level[i].span
            old_dspan = update[i].level[i].dspan
            x.level[i].forward = update[i].level[i].forward
            x.level[i].fkey = update[i].level[i].fkey
            update[i].level[i].forward = x
            update[i].level[i].fkey = x.key
            x.level[i].span = old_span - (rank[0] - rank[i])
            update[i].level[i].span = rank[0] - rank[i] + 1
            x.level[i].dspan = old_dspan - (drank[0] - drank[i]) + ds
            update[i].level[i].dspan = drank[0] - drank[i] + dx
        for i in range(level, self.height):
            update[i].level[i].span += 1
            update[i].level[i].dspan += dx + ds

        x.backward = NULL if pred == self.header else pred
        if succ != NULL:
            succ.backward = x
        else:
            self.tail = x
        self.length += 1
        if self.length > self.peak_length:
            self.peak_length = self.length
        self.ndistinct += dx + ds
        return rank[0] + 1

    cdef Py_ssize_t _path_to(self, rk_node *x, rk_node **update, int lowest=0) noexcept:
        """Fill ``update[i]`` with the last node before present node ``x`` on
        every level in use from ``lowest`` up; return x's 1-based rank
        (only when ``lowest`` is 0)."""
        cdef rk_node *node = self.header
        cdef Py_ssize_t rank = 0
        cdef int i
        cdef const char *member = RK_MEMBER(x)
        cdef rk_level *link
        self._prefetch_neighbourhood(x)
        for i in range(self.height - 1, lowest - 1, -1):
            while True:
                link = &node.level[i]
                if i > 0 and link.forward != NULL and link.fkey == x.key:
                    # A tie: the forward node's sequence decides, a cache miss
                    # on a board of tied scores.  Load the candidate one level
                    # down meanwhile: if this one is not before x, it is next.
                    rk_prefetch(node.level[i - 1].forward)
                if not self._link_before(link, x.key, x.seq, member, x.mlen):
                    break
                rank += link.span
                node = link.forward
            update[i] = node
            self._prefetch_ahead(node, i)
        return rank + 1

    cdef Py_ssize_t _rekey(self, rk_node *x, double key, uint64_t seq) noexcept:
        """Give present node ``x`` a key it can take in place (see
        ``_can_stay``), refreshing the keys its predecessors cache and the
        distinct spans over x and its successor, whose leadership the new
        score may change.  Returns its rank."""
        cdef rk_node *update[MAX_LEVEL]
        cdef Py_ssize_t rank = self._path_to(x, update)
        cdef rk_level *to_succ = &x.level[0]
        cdef int i, ds = 0
        # The changes in leadership of x and of its successor (read from
        # the key x caches for it, sparing a visit).
        cdef int dx = -self._is_leader(x)
        if to_succ.forward != NULL:
            ds = (to_succ.fkey != key) - (to_succ.fkey != x.key)
        x.key = key
        x.seq = seq
        dx += self._is_leader(x)
        for i in range(self.height):
            if i < x.nlevels:
                update[i].level[i].fkey = key
                update[i].level[i].dspan += dx
                x.level[i].dspan += ds  # its successor is in every link it starts
            else:
                update[i].level[i].dspan += dx + ds
        self.ndistinct += dx + ds
        return rank

    cdef void _unlink(self, rk_node *x) noexcept:
        """Remove node ``x`` from the list without freeing it."""
        cdef rk_node *update[MAX_LEVEL]
        cdef rk_node *pred
        cdef rk_node *succ = x.level[0].forward
        cdef int i, dx, ds = 0

        if x == self.relayout_next:
            self.relayout_next = succ
        # Level 0 needs no search: x's predecessor there is its backward
        # node (a search through a run of tied scores visits a node per step).
        self._path_to(x, update, 1)
        update[0] = pred = self.header if x.backward == NULL else x.backward
        dx = pred == self.header or pred.key != x.key
        if succ != NULL:
            ds = (pred == self.header or pred.key != succ.key) - (x.key != succ.key)

        for i in range(self.height):
            if update[i].level[i].forward == x:
                update[i].level[i].span += x.level[i].span - 1
                update[i].level[i].dspan += x.level[i].dspan - dx + ds
                update[i].level[i].forward = x.level[i].forward
                update[i].level[i].fkey = x.level[i].fkey
            else:
                update[i].level[i].span -= 1
                update[i].level[i].dspan += ds - dx
        if succ != NULL:
            succ.backward = x.backward
        else:
            self.tail = x.backward
        while self.height > 1 and self.header.level[self.height - 1].forward == NULL:
            self.height -= 1
        self.length -= 1
        self.ndistinct += ds - dx

    cdef Py_ssize_t _shift(self, rk_node *x, double key, uint64_t seq) noexcept:
        """Move present node ``x`` to (key, seq) along level 0 alone, when it
        can: x has one level and passes at most SHIFT_MAX nodes, all of one
        level too.  No span above level 0 then changes (x stays inside the
        same link on every upper level), so instead of a search to unlink x
        and another to link it back, x is relinked between its new
        neighbours and one search from the header counts its rank and adds
        the change in distinct scores to the links above it.  Returns the
        new rank, or 0 with nothing changed when x does not qualify.

        This is the common write of a busy board: a small increment moves a
        member past a few neighbours, and three nodes in four have one level.
        """
        cdef rk_node *pred        # x's new neighbours on level 0 (NULL: header / end)
        cdef rk_node *succ
        cdef rk_node *node
        cdef rk_node *old_pred = x.backward
        cdef rk_node *old_succ = x.level[0].forward
        cdef rk_node *before
        cdef rk_node *touched[3]
        cdef rk_node *update[MAX_LEVEL]
        cdef const char *member = RK_MEMBER(x)
        cdef Py_ssize_t rank
        cdef int passed = 0, i, net
        if x.nlevels != 1:
            return 0
        if old_pred != NULL and not self._before(old_pred, key, seq, member, x.mlen):
            # Toward the head: past the nodes that sort after the new place.
            node = old_pred
            while node != NULL and not self._before(node, key, seq, member, x.mlen):
                passed += 1
                if node.nlevels != 1 or passed > SHIFT_MAX:
                    return 0
                node = node.backward
            pred = node
            succ = self.header.level[0].forward if node == NULL else node.level[0].forward
        else:
            # Toward the tail: past the nodes before it.
            node = old_succ
            pred = old_pred
            while node != NULL and self._before(node, key, seq, member, x.mlen):
                passed += 1
                if node.nlevels != 1 or passed > SHIFT_MAX:
                    return 0
                pred = node
                node = node.level[0].forward
            succ = node

        net = -(self._alone(old_pred, x, old_succ))
        if x == self.relayout_next:
            self.relayout_next = old_succ
        # Unlink x on level 0.
        before = self.header if old_pred == NULL else old_pred
        before.level[0].forward = old_succ
        before.level[0].fkey = x.level[0].fkey
        before.level[0].span = old_succ != NULL
        if old_succ != NULL:
            old_succ.backward = old_pred
        else:
            self.tail = old_pred
        # Link it back after pred, whose link now leads to succ.
        x.key = key
        x.seq = seq
        before = self.header if pred == NULL else pred
        x.level[0].forward = succ
        x.level[0].fkey = before.level[0].fkey
        before.level[0].forward = x
        before.level[0].fkey = key
        before.level[0].span = 1
        x.level[0].span = succ != NULL
        x.backward = pred
        if succ != NULL:
            succ.backward = x
        else:
            self.tail = x
        net += self._alone(pred, x, succ)
        # Level 0's distinct spans: whether each changed link leads to a leader.
        touched[0] = self.header if old_pred == NULL else old_pred
        touched[1] = self.header if pred == NULL else pred
        touched[2] = x
        for i in range(3):
            node = touched[i].level[0].forward
            touched[i].level[0].dspan = node != NULL and self._is_leader(node)
        # One search: the rank, and the links above x, whose distinct counts change.
        rank = self._path_to(x, update)
        for i in range(1, self.height):
            update[i].level[i].dspan += net
        self.ndistinct += net
        return rank

    cdef inline bint _alone(self, rk_node *pred, rk_node *x, rk_node *succ) noexcept:
        """Whether x's score is held by neither neighbour."""
        return ((pred == NULL or pred.key != x.key)
                and (succ == NULL or succ.key != x.key))

    cdef bint _can_stay(self, rk_node *x, double key, uint64_t seq) noexcept:
        """Whether ``x`` can take (key, seq) in place: it would not move."""
        if x.backward != NULL and not self._before(x.backward, key, seq, RK_MEMBER(x), x.mlen):
            return False
        # The successor's cached key spares a visit unless the keys tie.
        return not self._link_before(&x.level[0], key, seq, RK_MEMBER(x), x.mlen)

    cdef Py_ssize_t _rank_of(self, rk_node *x, Py_ssize_t *dense) noexcept:
        """1-based unique rank of a present node; its dense rank into ``dense``."""
        cdef rk_node *node = self.header
        cdef Py_ssize_t rank = 0, drank = 0
        cdef int i
        cdef const char *member = RK_MEMBER(x)
        if dense == NULL and self.memo_mutations == self.mutations and self.memo_node == x:
            return self.memo_rank
        self._prefetch_neighbourhood(x)
        for i in range(self.height - 1, -1, -1):
            while node.level[i].forward == x or self._link_before(
                    &node.level[i], x.key, x.seq, member, x.mlen):
                rank += node.level[i].span
                drank += node.level[i].dspan
                node = node.level[i].forward
            if node == x:
                break
            self._prefetch_ahead(node, i)
        if dense != NULL:
            dense[0] = drank
        return rank

    cdef Py_ssize_t _count_before_key(self, double key, bint inclusive) noexcept:
        """Members whose key is < ``key`` (or <= with ``inclusive``)."""
        cdef rk_node *node = self.header
        cdef Py_ssize_t rank = 0
        cdef int i
        for i in range(self.height - 1, -1, -1):
            while node.level[i].forward != NULL and (
                    node.level[i].fkey < key or (inclusive and node.level[i].fkey == key)):
                rank += node.level[i].span
                node = node.level[i].forward
        return rank

    cdef rk_node *_node_at(self, Py_ssize_t rank) noexcept:
        """Node at a 1-based rank in 1..length."""
        cdef rk_node *node = self.header
        cdef Py_ssize_t traversed = 0
        cdef int i
        for i in range(self.height - 1, -1, -1):
            while node.level[i].forward != NULL and traversed + node.level[i].span <= rank:
                traversed += node.level[i].span
                node = node.level[i].forward
            if traversed == rank:
                return node
        return NULL

    # --- the one write path -----------------------------------------------------------

    cdef Py_ssize_t _write(self, const char *data, Py_ssize_t size, double value, int op,
                           bint has_seq, uint64_t seq, bint want_rank, double *old, bint *had,
                           double *new, bint *has_new, bint *changed) except -2:
        """Apply one write of a checked member (UTF-8 ``data``) and a checked
        number.  Returns the unique rank after it (0 if absent or not
        wanted).  Raises, changing nothing, on a non-finite increment
        result or a full index."""
        cdef Py_ssize_t rank = 0
        cdef uint32_t h
        cdef rk_node *x
        cdef double key, target
        cdef bint newest
        h = self._hash(data, size)
        x = self._lookup(data, size, h)
        had[0] = x != NULL
        changed[0] = False
        if x != NULL:
            old[0] = self._score(x)
        if op == OP_REMOVE:
            has_new[0] = False
            if x == NULL:
                return 0
            self._unlink(x)
            self._table_remove(x)
            self.member_bytes -= x.mlen
            self._free_node(x)
            if self.length == 0:
                self.peak_length = self.peak_member_bytes = 0  # emptied: as new
            self.mutations += 1
            changed[0] = True
            self._after_write()
            return 0

        if op == OP_INCR:
            target = (old[0] + value) if x != NULL else value
            if not isfinite(target):
                raise ValueError(f"incrementing by {value!r} gives a non-finite score")
        else:
            target = value
            if x != NULL:
                key = self._key(value)
                if (op == OP_SET_NEW
                        or (op == OP_SET_BETTER and not key < x.key)
                        or (op == OP_SET_WORSE and not key > x.key)):
                    op = -1  # refused by the condition
            elif op == OP_SET_EXISTS:
                has_new[0] = False
                return 0

        if op == -1 or (x != NULL and old[0] == target):
            new[0] = old[0]
            has_new[0] = True
            return self._rank_of(x, NULL) if want_rank else 0

        if not has_seq and self._next_seq > MAX_SEQ:
            raise ValueError("arrival sequences are exhausted (next_seq is past 2**63 - 1); "
                             "pass seq explicitly")
        if x == NULL:
            # Everything that can fail happens before the first change.
            if self.length >= MAX_LENGTH:
                raise OverflowError("a rank index holds fewer than 2**32 members")
            self._table_reserve(self.length + 1)
            x = self._new_node(self._random_level(), data, size)
            x.hash = h
            self._table_insert(x)
            self.member_bytes += size
            x.key = self._key(target)
            newest = not has_seq or seq >= self._next_seq
            x.seq = self._stamp(has_seq, seq)
            self._set_new(target, new, has_new, changed)
            rank = self._link(x, newest)
        else:
            key = self._key(target)
            newest = not has_seq or seq >= self._next_seq
            seq = self._stamp(has_seq, seq)
            self._set_new(target, new, has_new, changed)
            if self._can_stay(x, key, seq):
                rank = self._rekey(x, key, seq)
            else:
                rank = self._shift(x, key, seq)
                if not rank:
                    self._unlink(x)
                    x.key = key
                    x.seq = seq
                    rank = self._link(x, newest)
                x = self._placed(x)
        self._remember(x, rank)
        self._after_write()
        return rank

    cdef inline Py_ssize_t _remember(self, rk_node *x, Py_ssize_t rank) noexcept:
        """Keep the rank a write found for ``x``, good until the next change:
        ``rank()`` of the member just written (a leaderboard's commonest
        read, "where am I now?") then needs no second search."""
        self.memo_node = x
        self.memo_rank = rank
        self.memo_mutations = self.mutations
        return rank

    cdef inline uint64_t _stamp(self, bint has_seq, uint64_t seq) noexcept:
        """The arrival sequence of a write that changes a score."""
        if not has_seq:
            seq = self._next_seq
        if seq >= self._next_seq:
            self._next_seq = seq + 1
        return seq

    cdef inline void _set_new(self, double target, double *new, bint *has_new,
                              bint *changed) noexcept:
        new[0] = target
        has_new[0] = True
        changed[0] = True
        self.mutations += 1

    cdef tuple _write_result(self, bint had, double old, bint has_new, double new,
                             bint changed):
        return _untracked((_float_or_none(had, old), _float_or_none(has_new, new), changed))

    # --- entry points for other native modules (see _skiplist.pxd) ----------------
    #
    # The member is UTF-8 bytes the caller has checked (non-empty, at most
    # MAX_MEMBER_BYTES); the score is finite.  They skip the Python-level
    # validation and result tuples of the public methods.

    cdef void c_prefetch_slot(self, const char *member, Py_ssize_t mlen) noexcept:
        """Start loading ``member``'s hash slot (a batch warms its next lookups)."""
        rk_prefetch(&self.slots[self._hash(member, mlen) & self.mask])

    cdef void c_prefetch_node(self, const char *member, Py_ssize_t mlen) noexcept:
        """Start loading the node ``member``'s hash slot points to (after
        :meth:`c_prefetch_slot` had time to load the slot)."""
        cdef rk_node *node = self.slots[self._hash(member, mlen) & self.mask]
        if node != NULL:
            rk_prefetch_node(node)

    cdef bint c_get(self, const char *member, Py_ssize_t mlen, double *score) noexcept:
        """Whether ``member`` is present; its score into ``score`` if so."""
        cdef rk_node *x = self._lookup(member, mlen, self._hash(member, mlen))
        if x == NULL:
            return False
        score[0] = self._score(x)
        return True

    cdef Py_ssize_t c_put(self, const char *member, Py_ssize_t mlen, double score,
                          uint64_t seq) except -1:
        """``set(member, score, seq=seq)``: returns the member's unique rank after it."""
        cdef double old = 0.0, new = 0.0
        cdef bint had, has_new, changed
        return self._write(member, mlen, score, OP_SET, True, seq, True,
                           &old, &had, &new, &has_new, &changed)

    cdef Py_ssize_t c_rank(self, const char *member, Py_ssize_t mlen) noexcept:
        """The unique rank of ``member``, 0 if absent."""
        cdef rk_node *x = self._lookup(member, mlen, self._hash(member, mlen))
        return 0 if x == NULL else self._rank_of(x, NULL)

    # --- public writes ------------------------------------------------------------

    def set(self, member, score, int when=OP_SET, seq=None):
        """Set ``member``'s score if ``when`` allows it: ``(old, new, changed)``.

        Runtime complexity: O(log n).
        """
        cdef double value, old = 0.0, new = 0.0
        cdef bint had, has_new, changed
        cdef uint64_t s = 0
        cdef const char *data
        cdef Py_ssize_t size
        if not OP_SET <= when <= OP_SET_WORSE:
            raise ValueError(f"when must be a When value (0..4), got {when}")
        _write_input(member, score, "score", seq, &value, &s, &data, &size)
        self._write(data, size, value, when, seq is not None, s, False,
                    &old, &had, &new, &has_new, &changed)
        return self._write_result(had, old, has_new, new, changed)

    def incr(self, member, delta, seq=None):
        """Add ``delta`` to ``member``'s score (absent members start at 0):
        ``(old, new, changed)``.

        Runtime complexity: O(log n).
        """
        cdef double value, old = 0.0, new = 0.0
        cdef bint had, has_new, changed
        cdef uint64_t s = 0
        cdef const char *data
        cdef Py_ssize_t size
        _write_input(member, delta, "delta", seq, &value, &s, &data, &size)
        self._write(data, size, value, OP_INCR, seq is not None, s, False,
                    &old, &had, &new, &has_new, &changed)
        return self._write_result(had, old, has_new, new, changed)

    def remove(self, member):
        """Remove ``member``: ``(old, None, True)``, or ``(None, None, False)``.

        Runtime complexity: O(log n).
        """
        cdef double old = 0.0, new = 0.0
        cdef bint had, has_new, changed
        cdef const char *data
        cdef Py_ssize_t size
        _member_bytes(member, &data, &size)
        self._write(data, size, 0.0, OP_REMOVE, False, 0, False,
                    &old, &had, &new, &has_new, &changed)
        return self._write_result(had, old, has_new, new, changed)

    def clear(self):
        """Remove every member; ``next_seq`` is kept.  Runtime complexity: O(n)."""
        self._free_nodes()
        self._reset_header()
        slots = _table_alloc(MIN_TABLE_SIZE)
        _table_free(self.slots, self.mask + 1)
        self._drop_old_table()
        self.slots = slots
        self.mask = MIN_TABLE_SIZE - 1
        self.unplaced = 0
        self.mutations += 1

    def apply_batch(self, ops):
        """Apply ``(op, member, value[, seq])`` operations in order.

        Returns one ``(old, new, changed, rank)`` per operation, or the
        ``TypeError``/``ValueError`` of an invalid one, or the
        ``OverflowError`` of one the index has no room for, which changes
        nothing while the others still apply.  This is the ingest path: one call, no
        Python-level dispatch per operation.

        Runtime complexity: O(k log n) for k operations.
        """
        cdef list items = ops if type(ops) is list else list(ops)
        cdef list results = []
        cdef double value = 0.0, old = 0.0, new = 0.0
        cdef bint had, has_new, changed
        cdef uint64_t s = 0
        cdef Py_ssize_t rank, position, size
        cdef const char *data
        cdef int op
        cdef bint has_seq
        for position in range(len(items)):
            item = items[position]
            if position % PREFETCH_GROUP == 0 and self.length >= PREFETCH_MIN_LENGTH:
                self.warmed += self._prefetch_group(items, position)
            try:
                _operation(item, &op, &value, &has_seq, &s, &data, &size)
                rank = self._write(data, size, value, op, has_seq, s, True,
                                   &old, &had, &new, &has_new, &changed)
            except (TypeError, ValueError, OverflowError) as exc:
                results.append(exc)
                continue
            results.append(_untracked((_float_or_none(had, old), _float_or_none(has_new, new),
                                       changed, rank if has_new else None)))
        return results

    def set_states(self, states):
        """Give members exact ``(member, score, seq)`` states; a later entry
        for the same member wins.

        For replaying a log of absolute states: the arrival sequence is
        taken as given even when the score does not change, so a log
        collapsed to each member's last state replays to the same index.
        Every entry is validated before anything changes.

        Runtime complexity: O(k log n) for k entries; a batch of at least
        RK_RETHREAD_MIN (1024) entries and n / RK_RETHREAD_RATIO (n / 8), or
        n / 16 on an index of 2M members or more, re-threads the list in one
        ordered pass instead, O(n + k log k).
        """
        cdef list items = list(states)
        cdef Py_ssize_t k = len(items), i
        cdef rk_state *batch
        cdef double score
        cdef uint64_t top = 0
        if k == 0:
            return None
        batch = <rk_state *>malloc(k * sizeof(rk_state))
        if batch == NULL:
            raise MemoryError()
        try:
            for i in range(k):
                item = items[i]
                if type(item) is not tuple:
                    raise TypeError(f"a state must be a tuple, got {type(item).__name__}")
                if len(<tuple>item) != 3:
                    raise TypeError(
                        f"a state is (member, score, seq), got {len(<tuple>item)} items")
                _member_bytes((<tuple>item)[0], &batch[i].member, &batch[i].mlen)
                _number((<tuple>item)[1], &score, "score")
                _seq((<tuple>item)[2], &batch[i].seq)
                batch[i].key = self._key(score)
                batch[i].hash = self._hash(batch[i].member, batch[i].mlen)
                if batch[i].seq > top:
                    top = batch[i].seq
            self._set_batch(batch, k, top)
        finally:
            free(batch)
        return None

    def set_states_packed(self, states):
        """``set_states`` for a packed run (``rankd.index.packed``: any
        buffer of ``f64 score | u64 seq | u16 n | member`` entries), read in
        place, no object per state; returns how many states it held.

        A run the index cannot take (cut short, a member empty, too long or
        not UTF-8, a score not finite, a seq beyond ``MAX_SEQ``) raises
        ``ValueError`` and changes nothing.
        """
        cdef Py_buffer view
        cdef const char *p
        cdef const char *end
        cdef Py_ssize_t k = 0, i, mlen
        cdef rk_state *batch = NULL
        cdef double score
        cdef uint64_t top = 0
        PyObject_GetBuffer(states, &view, PyBUF_SIMPLE)
        try:
            p = <const char *>view.buf
            end = p + view.len
            # Count first: one allocation, and the run's shape checked.
            while p < end:
                if end - p < PACKED_HEAD:
                    raise ValueError("a packed state run ends inside an entry's head")
                mlen = rk_load_u16(p + 16)
                if mlen == 0 or mlen > MAX_MEMBER_BYTES or end - p - PACKED_HEAD < mlen:
                    raise ValueError(f"a packed state's member of {mlen} bytes does not fit")
                p += PACKED_HEAD + mlen
                k += 1
            if k == 0:
                return 0
            batch = <rk_state *>malloc(k * sizeof(rk_state))
            if batch == NULL:
                raise MemoryError()
            p = <const char *>view.buf
            for i in range(k):
                score = rk_load_f64(p)
                batch[i].seq = rk_load_u64(p + 8)
                batch[i].mlen = rk_load_u16(p + 16)
                batch[i].member = p + PACKED_HEAD
                p += PACKED_HEAD + batch[i].mlen
                if not isfinite(score):
                    raise ValueError(f"score must be finite, got {score!r}")
                if batch[i].seq > <uint64_t>MAX_SEQ:
                    raise ValueError(f"seq must be between 0 and 2**63 - 1, got {batch[i].seq}")
                if not rk_utf8_valid(<const uint8_t *>batch[i].member, batch[i].mlen):
                    raise ValueError("a packed state's member is not UTF-8")
                batch[i].key = self._key(score)
                batch[i].hash = self._hash(batch[i].member, batch[i].mlen)
                if batch[i].seq > top:
                    top = batch[i].seq
            self._set_batch(batch, k, top)
        finally:
            free(batch)
            PyBuffer_Release(&view)
        return k

    cdef int _set_batch(self, rk_state *batch, Py_ssize_t k, uint64_t top) except -1:
        """Apply ``k`` checked states (``top``: their largest seq), a later
        entry for the same member winning: set_states' common part."""
        cdef Py_ssize_t i, fresh = 0
        cdef rk_node *ahead
        # Each lookup is two cache misses (slot, node) on a big index:
        # prefetching ahead lets the misses of many lookups overlap.
        for i in range(k):
            if i + SLOT_AHEAD < k:
                rk_prefetch(&self.slots[batch[i + SLOT_AHEAD].hash & self.mask])
            if i + NODE_AHEAD < k:
                ahead = self.slots[batch[i + NODE_AHEAD].hash & self.mask]
                if ahead != NULL:
                    rk_prefetch_node(ahead)
            batch[i].node = self._lookup(batch[i].member, batch[i].mlen, batch[i].hash)
            fresh += batch[i].node == NULL
        if self.length + fresh > MAX_LENGTH:
            raise OverflowError("a rank index holds fewer than 2**32 members")
        if k >= RETHREAD_MIN and (
                k * RETHREAD_RATIO >= self.length
                or (self.length >= RETHREAD_BIG and k * RETHREAD_RATIO_BIG >= self.length)):
            self._rethread(batch, k, fresh)
        else:
            for i in range(k):
                self._assign(&batch[i])
        if top >= self._next_seq:
            self._next_seq = top + 1
        self.mutations += 1
        return 0

    cdef int _assign(self, rk_state *state) except -1:
        """Give one member an exact (key, seq), searching for its place."""
        cdef rk_node *x = self._lookup(state.member, state.mlen, state.hash)
        if x == NULL:
            self._table_reserve(self.length + 1)
            x = self._new_node(self._random_level(), state.member, state.mlen)
            x.hash = state.hash
            x.key = state.key
            x.seq = state.seq
            self._table_insert(x)
            self.member_bytes += state.mlen
            self._link(x)
        elif self._can_stay(x, state.key, state.seq):
            self._rekey(x, state.key, state.seq)
        else:
            self._unlink(x)
            x.key = state.key
            x.seq = state.seq
            self._link(x)
            self._placed(x)
        self._after_write()
        return 0

    cdef int _rethread(self, rk_state *batch, Py_ssize_t k, Py_ssize_t fresh) except -1:
        """set_states for a batch large against the index: update the nodes in
        place, then rebuild every link in one pass that merges the untouched
        nodes (already in order) with the moved ones (sorted).  Node heights
        are kept, so the list stays a fair skip list."""
        cdef rk_moved *moved = <rk_moved *>malloc(k * sizeof(rk_moved))
        cdef rk_node **kept = <rk_node **>malloc((self.length + 1) * sizeof(rk_node *))
        cdef rk_node *last[MAX_LEVEL]
        cdef Py_ssize_t last_rank[MAX_LEVEL]
        cdef Py_ssize_t last_drank[MAX_LEVEL]
        cdef Py_ssize_t i, nmoved = 0, nkept = 0, a = 0, b = 0, member_bytes
        cdef rk_node *x
        cdef int level
        cdef bint relaid
        try:
            if moved == NULL or kept == NULL:
                raise MemoryError()
            # 1. Everything that can fail: room in the table, nodes for new members.
            self._table_reserve(self.length + fresh)
            # The links are rebuilt from the nodes in order: a relayout
            # under way finishes first, in one go (this pass is O(n) too).
            # It moves nodes: only then are the nodes set_states found stale.
            relaid = self.relaying
            while self.relaying:
                self._relayout_step(self.length + 1)
            try:
                for i in range(k):
                    x = NULL if relaid else batch[i].node
                    if x == NULL:  # (or a member new earlier in the batch)
                        x = self._lookup(batch[i].member, batch[i].mlen, batch[i].hash)
                    if x == NULL:
                        x = self._new_node(self._random_level(), batch[i].member, batch[i].mlen)
                        x.hash = batch[i].hash
                        x.queued = 2  # new: in no list yet
                        self._table_insert(x)
                        self.member_bytes += batch[i].mlen
                    batch[i].node = x
            except MemoryError:
                for i in range(k):
                    x = batch[i].node
                    if x != NULL and x.queued == 2:
                        x.queued = 0
                        self._table_remove(x)
                        self.member_bytes -= x.mlen
                        self._free_node(x)
                raise
            # 2. The moved nodes with their final states: the batch read
            # backwards, so a member's last entry is the first seen (each
            # node is reached once, its miss overlapped by a prefetch).
            for i in range(k - 1, -1, -1):
                if i >= NODE_AHEAD:
                    rk_prefetch(batch[i - NODE_AHEAD].node)
                x = batch[i].node
                if x.queued != 1:
                    x.queued = 1  # (until the merge below takes it)
                    x.key = moved[nmoved].key = batch[i].key
                    x.seq = moved[nmoved].seq = batch[i].seq
                    moved[nmoved].node = x
                    nmoved += 1
            # The untouched nodes, in their order (read before any link changes).
            x = self.header.level[0].forward
            while x != NULL:
                if not x.queued:
                    kept[nkept] = x
                    nkept += 1
                x = x.level[0].forward
            # 3. The moved nodes, sorted by their final keys.
            with nogil:
                rk_sort_moved(moved, nmoved, self.tie_by_member + self.tie_member_desc)
            # 4. Re-thread: append the merge of both runs at the tail.
            member_bytes = self.member_bytes
            self._reset_header()
            self.member_bytes = member_bytes
            for level in range(MAX_LEVEL):
                last[level] = self.header
                last_rank[level] = 0
                last_drank[level] = 0
            while a < nkept or b < nmoved:
                if b == nmoved or (a < nkept and self._node_before(kept[a], moved[b].node)):
                    x = kept[a]
                    a += 1
                else:
                    x = moved[b].node
                    x.queued = 0
                    b += 1
                    if b + NODE_AHEAD < nmoved:
                        rk_prefetch(moved[b + NODE_AHEAD].node)
                self._append_loaded(x, last, last_rank, last_drank)
            for level in range(self.height):
                last[level].level[level].span = self.length - last_rank[level]
                last[level].level[level].dspan = self.ndistinct - last_drank[level]
        finally:
            free(moved)
            free(kept)
        return 0

    @cython.boundscheck(False)
    @cython.wraparound(False)
    cdef int _prefetch_group(self, list items, Py_ssize_t start):
        """Warm the cache for the next PREFETCH_GROUP operations.

        A single search is a chain of dependent cache misses, ~20 deep at a
        million members, and the CPU cannot overlap them.  Here the walks
        of a whole group (to each member's node, then down the list to the
        later of its current and new places) advance in lock step, one node
        each per round, issuing prefetches, so their misses overlap.
        Nothing is written and nothing is validated: a wrong guess only
        costs a useless prefetch, and operations that are not plain
        ASCII-member, float/int-valued tuples are simply not warmed.
        Returns how many operations it walked.
        """
        cdef rk_node *cursor[PREFETCH_GROUP]
        cdef double target[PREFETCH_GROUP]
        cdef int level[PREFETCH_GROUP]
        cdef const char *data[PREFETCH_GROUP]
        cdef Py_ssize_t size[PREFETCH_GROUP]
        cdef uint32_t hashes[PREFETCH_GROUP]
        cdef double values[PREFETCH_GROUP]
        cdef int codes[PREFETCH_GROUP]
        cdef Py_ssize_t stop = min(start + PREFETCH_GROUP, len(items))
        cdef int count = 0, lanes = 0, active, j, i
        cdef long long as_int
        cdef int overflow
        cdef rk_node *x
        cdef rk_node *node
        cdef rk_level *link
        cdef double score
        for position in range(start, stop):
            item = items[position]
            if type(item) is tuple and len(<tuple>item) >= 3:
                rk_prefetch(<PyObject *>(<tuple>item)[1])
        for position in range(start, stop):
            item = items[position]
            if type(item) is not tuple or len(<tuple>item) < 3:
                continue
            op_obj = (<tuple>item)[0]
            member = (<tuple>item)[1]
            value = (<tuple>item)[2]
            # Op is an IntEnum: any int but a bool, as apply_batch takes.
            if (not isinstance(op_obj, int) or isinstance(op_obj, bool)
                    or type(member) is not str):
                continue
            if not PyUnicode_IS_COMPACT_ASCII(member):
                continue
            codes[count] = <int>PyLong_AsLongLongAndOverflow(op_obj, &overflow)
            if overflow or not OP_SET <= codes[count] <= OP_REMOVE:
                continue
            if type(value) is float:
                values[count] = PyFloat_AS_DOUBLE(value)
            elif type(value) is int:
                as_int = PyLong_AsLongLongAndOverflow(value, &overflow)
                if overflow:
                    continue
                values[count] = <double>as_int
            elif codes[count] != OP_REMOVE:
                continue
            data[count] = <const char *>PyUnicode_DATA(member)
            size[count] = PyUnicode_GET_LENGTH(member)
            if size[count] == 0 or size[count] > MAX_MEMBER_BYTES:
                continue
            hashes[count] = self._hash(data[count], size[count])
            rk_prefetch(&self.slots[hashes[count] & self.mask])
            count += 1
        for j in range(count):
            node = self.slots[hashes[j] & self.mask]
            if node != NULL:
                rk_prefetch_node(node)
        for j in range(count):
            x = self._lookup(data[j], size[j], hashes[j])
            if x != NULL and x.backward != NULL:
                rk_prefetch(x.backward)  # its key, for _can_stay
            if codes[j] == OP_REMOVE:
                if x == NULL:
                    continue
                target[lanes] = x.key
            else:
                if codes[j] == OP_INCR and x != NULL:
                    score = self._score(x) + values[j]
                else:
                    score = values[j]
                # One walk, to the later of x's current and new keys: on
                # most levels it passes by the earlier one.
                target[lanes] = self._key(score)
                if x != NULL and x.key > target[lanes]:
                    target[lanes] = x.key
            lanes += 1
        for j in range(lanes):
            cursor[j] = self.header
            level[j] = self.height - 1
        active = lanes
        while active > 0:
            for j in range(lanes):
                i = level[j]
                if i < 0:
                    continue
                node = cursor[j]
                while i >= 0:
                    link = &node.level[i]
                    if link.forward != NULL and link.fkey < target[j]:
                        cursor[j] = link.forward
                        rk_prefetch_level(link.forward, i)
                        break
                    i -= 1
                level[j] = i
                if i < 0:
                    active -= 1
        return lanes

    # --- public reads ------------------------------------------------------------

    @property
    def order(self):
        """``"desc"`` (highest score ranks first) or ``"asc"``."""
        return "desc" if self.descending else "asc"

    @property
    def tie_break(self):
        """``"first"`` (earliest arrival wins ties), ``"member"`` (A to Z) or
        ``"member_desc"`` (Z to A)."""
        if self.tie_member_desc:
            return "member_desc"
        return "member" if self.tie_by_member else "first"

    @property
    def next_seq(self):
        """The arrival sequence the next unsequenced write will get."""
        return self._next_seq

    @property
    def _warmed(self):
        """Operations apply_batch walked ahead of their write (for tests)."""
        return self.warmed

    @property
    def _table(self):
        """``(slots, old slots, migrated)`` of the member table, for tests;
        ``old slots`` is 0 unless it is doubling."""
        return (self.mask + 1, self.old_mask + 1 if self.old_slots != NULL else 0,
                self.migrated)

    @property
    def _relaying(self):
        """Whether a relayout is under way (for tests)."""
        return self.relaying

    def _growth_knobs(self, Py_ssize_t relayout_min_length, Py_ssize_t relayout_moves,
                      size_t table_migrate_min=TABLE_MIGRATE_MIN, size_t table_moves=TABLE_MOVES,
                      uint64_t pace_ns=0):
        """For tests: relayouts from ``relayout_min_length`` members (32,768
        by default), moving ``relayout_moves`` nodes a write (256), and
        table doublings a few slots a write once the new table has
        ``table_migrate_min`` slots (262,144), moving ``table_moves`` slots
        a write (64).  A pace of 1 keeps one under way across many writes;
        more than the board holds makes it all happen in the write that
        begins it.  Relayouts are then unpaced by the clock unless
        ``pace_ns`` says how often the credit gains a move (see
        RK_RELAYOUT_PACE_NS)."""
        if relayout_min_length < 1 or relayout_moves < 1 or table_moves < 1:
            raise ValueError("growth needs at least one member and one move a write")
        self.relayout_min_length = relayout_min_length
        self.relayout_moves = relayout_moves
        self.relayout_pace_ns = pace_ns
        self.table_migrate_min = table_migrate_min
        self.table_moves = table_moves

    @property
    def _layout(self):
        """``(ascending, reserved, unplaced)`` for tests: of the nodes in
        rank order, how many lie at a higher address than the node before
        them of their kind (tall or not: all but the first of each, right
        after a relayout), the bytes of node memory the index holds, and
        how many nodes were allocated since the last layout."""
        cdef rk_node *x = self.header.level[0].forward
        cdef rk_node *last[2]
        cdef Py_ssize_t ascending = 0
        cdef bint tall
        last[0] = last[1] = NULL
        while x != NULL:
            tall = x.nlevels >= TALL
            if last[tall] != NULL:
                ascending += <uintptr_t>x > <uintptr_t>last[tall]
            last[tall] = x
            x = x.level[0].forward
        return ascending, self.arena.reserved + self.tall_arena.reserved + (
            self.old_arena.reserved + self.old_tall_arena.reserved if self.relaying else 0
        ), self.unplaced

    def __len__(self):
        return self.length

    @property
    def peaks(self):
        """``(length, member bytes)``: the most members the index held, and
        the longest member (UTF-8 bytes) it took, since it was made, cleared,
        emptied by a removal or :meth:`reset_peaks`."""
        return self.peak_length, self.peak_member_bytes

    @property
    def full(self):
        """Whether a write that changes a score may be refused with
        ``OverflowError``: the index holds ``2**32 - 2`` members."""
        return self.length >= MAX_LENGTH

    def reach(self, Py_ssize_t length):
        """Count ``length`` members as held (in :attr:`peaks`), as if it had
        held them: a Redis ZADD of that many pairs converts its set first."""
        if length > self.peak_length:
            self.peak_length = length

    def reset_peaks(self):
        """Set :attr:`peaks` to what the index holds now.  Runtime complexity: O(n)."""
        cdef rk_node *x = self.header.level[0].forward
        self.peak_length = self.length
        self.peak_member_bytes = 0
        while x != NULL:
            if x.mlen > self.peak_member_bytes:
                self.peak_member_bytes = x.mlen
            x = x.level[0].forward

    def positive_zeros(self):
        """Make every score of -0.0 0.0 (their places do not change); return
        how many were.  Runtime complexity: O(n)."""
        cdef rk_node *x = self.header.level[0].forward
        cdef Py_ssize_t changed = 0
        cdef double key = self._key(0.0)
        while x != NULL:
            if x.key == 0.0 and signbit(x.key) != signbit(key):
                x.key = key
                changed += 1
            x = x.level[0].forward
        if changed:
            self.mutations += 1
        return changed

    def __contains__(self, member):
        if not isinstance(member, str):
            return False
        try:
            return self._find(member) != NULL
        except ValueError:
            return False

    def __repr__(self):
        return (f"RankIndex(order={self.order!r}, tie_break={self.tie_break!r}, "
                f"members={self.length})")

    def __iter__(self):
        return _Iterator(self)

    def __reduce__(self):
        return (_load_from_dump, (self.dump(),))

    def score(self, member):
        """``member``'s score, or ``None``.  Runtime complexity: O(1)."""
        cdef rk_node *x = self._find(member)
        return None if x == NULL else self._score(x)

    def rank(self, member):
        """Unique 1-based rank, or ``None``.  Runtime complexity: O(log n)."""
        cdef rk_node *x = self._find(member)
        return None if x == NULL else self._rank_of(x, NULL)

    def competition_rank(self, member):
        """1 + members with a strictly better score, or ``None``.

        Runtime complexity: O(log n).
        """
        cdef rk_node *x = self._find(member)
        if x == NULL:
            return None
        return self._count_before_key(x.key, False) + 1

    def dense_rank(self, member):
        """1 + distinct scores strictly better, or ``None``.

        Runtime complexity: O(log n).
        """
        cdef rk_node *x = self._find(member)
        cdef Py_ssize_t dense = 0
        if x == NULL:
            return None
        self._rank_of(x, &dense)
        return dense

    def percentile(self, member):
        """Share of members scoring equal or worse, in percent.

        Runtime complexity: O(log n).
        """
        cdef rk_node *x = self._find(member)
        if x == NULL:
            return None
        return 100.0 * (self.length - self._count_before_key(x.key, False)) / self.length

    def ranks(self, members):
        """Unique ranks of many members (``None`` for absent ones).

        Runtime complexity: O(k log n).
        """
        cdef list result = []
        cdef rk_node *x
        for member in members:
            x = self._find(member)
            result.append(None if x == NULL else self._rank_of(x, NULL))
        return result

    def member_at(self, rank):
        """``(member, score)`` at a 1-based rank, ``None`` past the end.

        Runtime complexity: O(log n).
        """
        cdef rk_node *x
        if isinstance(rank, bool) or not isinstance(rank, int):
            raise TypeError(f"rank must be an int, got {type(rank).__name__}")
        if rank < 1:
            raise ValueError(f"rank must be at least 1, got {rank}")
        if rank > self.length:
            return None
        x = self._node_at(rank)
        return (self._member_str(x), self._score(x))

    cdef inline str _member_str(self, rk_node *x):
        return PyUnicode_DecodeUTF8(RK_MEMBER(x), x.mlen, NULL)

    cdef list _collect(self, Py_ssize_t first, Py_ssize_t last, bint reverse):
        """Entries of ranks first..last (1-based, inclusive, clipped by the
        caller), best first or, with ``reverse``, worst first."""
        cdef list entries = []
        cdef rk_node *x
        cdef Py_ssize_t rank
        if first > last:
            return entries
        if reverse:
            rank = last
            x = self._node_at(last)
            while rank >= first:
                entries.append((rank, self._member_str(x), self._score(x)))
                x = x.backward
                rank -= 1
        else:
            rank = first
            x = self._node_at(first)
            while rank <= last:
                entries.append((rank, self._member_str(x), self._score(x)))
                x = x.level[0].forward
                rank += 1
        return entries

    cdef list _window(self, Py_ssize_t lo, Py_ssize_t hi, object offset, object limit,
                      bint reverse):
        """Entries among ranks lo..hi after skipping ``offset`` and keeping at
        most ``limit``, from the chosen end."""
        cdef Py_ssize_t first, last
        if not _window_ranks(lo, hi, offset, limit, reverse, &first, &last):
            return []
        return self._collect(first, last, reverse)

    def range_by_rank(self, offset=0, limit=None, *, reverse=False):
        """Entries ``(rank, member, score)`` by rank after ``offset``, at most
        ``limit`` (``None``: to the end); ``reverse`` starts from the worst.

        Runtime complexity: O(log n + limit).
        """
        return self._window(1, self.length, offset, limit, reverse)

    cdef int _key_range(self, object low, object high, bint low_exclusive,
                        bint high_exclusive, Py_ssize_t *lo, Py_ssize_t *hi) except -1:
        """Ranks lo..hi (1-based, empty when lo > hi) of the score range."""
        cdef double key_low, key_high
        cdef bint ex_low, ex_high
        _score_keys(low, high, low_exclusive, high_exclusive, self.descending,
                    &key_low, &key_high, &ex_low, &ex_high)
        if key_low > key_high:
            lo[0], hi[0] = 1, 0
            return 0
        lo[0] = self._count_before_key(key_low, ex_low) + 1
        hi[0] = self._count_before_key(key_high, not ex_high)
        return 0

    def range_by_score(self, low, high, *, low_exclusive=False, high_exclusive=False,
                       offset=0, limit=None, reverse=False):
        """Entries with ``low <= score <= high`` in rank order (``reverse``:
        from the worst), after ``offset``, at most ``limit``.

        Runtime complexity: O(log n + limit).
        """
        cdef Py_ssize_t lo, hi
        self._key_range(low, high, low_exclusive, high_exclusive, &lo, &hi)
        if lo > hi:
            _paging(offset, limit)
            return []
        return self._window(lo, hi, offset, limit, reverse)

    def count(self, low, high, *, low_exclusive=False, high_exclusive=False):
        """Members with a score in the range.  Runtime complexity: O(log n)."""
        cdef Py_ssize_t lo, hi
        self._key_range(low, high, low_exclusive, high_exclusive, &lo, &hi)
        return hi - lo + 1 if hi >= lo else 0

    def around(self, member, above=5, below=5):
        """Up to ``above`` better-ranked entries, the member, and up to
        ``below`` worse-ranked ones; ``None`` if absent.

        Runtime complexity: O(log n + above + below).
        """
        cdef rk_node *x = self._find(member)
        cdef Py_ssize_t rank
        _count(above, "above")
        _count(below, "below")
        if x == NULL:
            return None
        rank = self._rank_of(x, NULL)
        return self._collect(max(1, rank - above), min(self.length, rank + below), False)

    # --- snapshots -----------------------------------------------------------------

    def dump(self):
        """The whole index as bytes (format in rankd.index._contract).

        Runtime complexity: O(n).
        """
        cdef Py_ssize_t size = _dump_size(self)
        cdef bytes out = PyBytes_FromStringAndSize(NULL, size)
        cdef char *p = PyBytes_AS_STRING(out)
        cdef rk_node *x = self.header.level[0].forward
        _dump_head(self, p)
        p += DUMP_HEADER_SIZE
        # The copy needs no Python objects, so other threads run meanwhile;
        # the engine snapshots an index from a worker thread while making
        # sure nothing writes to it.
        with nogil:
            p = _dump_nodes(&x, p, p + size, self.descending)
        # ``out`` is not shared yet, so finishing it in place is safe.
        crc = zlib.crc32(memoryview(out)[:size - 4])
        rk_store_u32(p, <uint32_t>crc)
        return out

    def dump_chunks(self, Py_ssize_t max_bytes):
        """:meth:`dump`'s bytes as pieces of at most ``max_bytes`` (cut
        between records; a piece holds one record at least), made one at a
        time as they are iterated; ``size`` is their total.  The index must
        not change meanwhile (``RuntimeError``).  O(n)."""
        return _DumpChunks(self, max_bytes)

    def dump_walk(self, Py_ssize_t max_bytes):
        """The records of a walked dump (see rankd.index._contract), in
        pieces of about ``max_bytes`` made one at a time as they are
        iterated; the index may change between pieces.  Each piece goes on
        after the last record written (found again by its key, O(log n)), so
        the records stay in rank order; a member written meanwhile may be
        missing or repeat.  ``header()`` after the last piece gives the
        dump's header.  O(n) in all."""
        return _DumpWalk(self, max_bytes)

    cdef rk_node *_after(self, double key, uint64_t seq, const char *member,
                         Py_ssize_t mlen) noexcept:
        """The first node sorting after the target (``(key, seq, member)``,
        which may no longer be in the index)."""
        cdef rk_node *x = self.header
        cdef int i
        for i in range(self.height - 1, -1, -1):
            while self._link_before(&x.level[i], key, seq, member, mlen):
                x = x.level[i].forward
        x = x.level[0].forward  # the first node not before the target
        if (x != NULL and x.key == key and (self.tie_by_member or x.seq == seq)
                and x.mlen == mlen and memcmp(RK_MEMBER(x), member, mlen) == 0):
            x = x.level[0].forward  # the target itself
        return x

    @classmethod
    def load(cls, data):
        """Rebuild an index from :meth:`dump` output.

        Raises ``ValueError`` if the data is corrupt.  Records arrive in rank
        order, so each node is appended at the tail in O(1) without a search.

        Runtime complexity: O(n).
        """
        return _load(cls, _DumpReader((data,), False), _checked_dump_size(data, 2))

    @classmethod
    def load_chunks(cls, pieces, size=None):
        """Rebuild an index from :meth:`dump` output given as an iterable of
        buffers cut anywhere (:meth:`dump_chunks`, or a file read in
        windows), each let go before the next is read; ``size``: their
        total, if known.  ``ValueError`` as :meth:`load`.  O(n)."""
        return _load(cls, _DumpReader(pieces), -1 if size is None else size)

    cdef int _append_loaded(self, rk_node *x, rk_node **last, Py_ssize_t *last_rank,
                            Py_ssize_t *last_drank) noexcept nogil:
        """Append a node that sorts after every present node."""
        cdef int i
        cdef rk_node *prev = self.tail
        cdef bint leader = prev == NULL or prev.key != x.key
        self.length += 1
        if self.length > self.peak_length:
            self.peak_length = self.length
        self.ndistinct += leader
        if x.nlevels > self.height:
            self.height = x.nlevels
        for i in range(x.nlevels):
            last[i].level[i].forward = x
            last[i].level[i].fkey = x.key
            last[i].level[i].span = self.length - last_rank[i]
            last[i].level[i].dspan = self.ndistinct - last_drank[i]
            last[i] = x
            last_rank[i] = self.length
            last_drank[i] = self.ndistinct
            x.level[i].forward = NULL
        x.backward = prev
        self.tail = x
        return 0

    cdef uint64_t _load_run(self, const char **p, const char *end, uint64_t i, uint64_t stop,
                            uint64_t next_seq, bint has_seq, rk_node **last,
                            Py_ssize_t *last_rank, Py_ssize_t *last_drank,
                            rk_node **prev) noexcept nogil:
        """Load records ``i`` to ``stop`` of a dump at ``p[0]`` (``end``:
        where the bytes read so far end) without the GIL, as ``_load``
        does, while each is whole before ``end`` and sound, in order, new
        and given memory.  Returns the first record not loaded: ``_load``
        loads that one with the GIL (reading more bytes, or raising)."""
        cdef const char *q
        cdef double score, key
        cdef uint64_t seq
        cdef uint16_t mlen
        cdef uint32_t h
        cdef rk_node *x
        while i < stop:
            q = p[0]
            if not _dump_record_whole(&q, end, next_seq, &score, &seq, &mlen, has_seq):
                break
            key = self._key(score)
            if prev[0] != NULL and not self._before(prev[0], key, seq, q, mlen):
                break
            h = self._hash(q, mlen)
            if self._lookup(q, mlen, h) != NULL:
                break
            x = self._alloc_node(self._random_level(), q, mlen)
            if x == NULL:
                break
            self._place_loaded(x, key, seq, h, last, last_rank, last_drank)
            prev[0] = x
            p[0] = q + mlen
            i += 1
        return i

    cdef void _place_loaded(self, rk_node *x, double key, uint64_t seq, uint32_t h,
                            rk_node **last, Py_ssize_t *last_rank,
                            Py_ssize_t *last_drank) noexcept nogil:
        """A loaded record's new node ``x`` keyed, in the table and at the tail."""
        x.key = key
        x.seq = seq
        x.hash = h
        self._table_insert(x)
        self._append_loaded(x, last, last_rank, last_drank)
        self.member_bytes += x.mlen

    # --- invariants ------------------------------------------------------------------

    def _check(self):
        """Verify every invariant; ``AssertionError`` names the first broken one.

        Checks, for every level, that spans and distinct spans match the
        nodes and leaders they skip (links to NULL span to the end), that
        the order is strict, that backward pointers and the tail are right,
        that the hash table holds exactly the listed nodes, the counters,
        and, while a relayout is under way, that every node before its
        position has left the old arenas.
        Runtime complexity: O(n * levels).
        """
        cdef rk_node *x
        cdef rk_node *prev = NULL
        cdef rk_node *node
        cdef Py_ssize_t n = 0, leaders = 0, nbytes = 0, pos, dpos, i, found
        cdef bint reached = self.relayout_next == NULL
        cdef int level
        cdef dict position = {}
        cdef list nodes = []
        cdef list dense = []
        assert self.height >= 1 and self.height <= self.max_level or self.length == 0, \
            f"height {self.height} outside 1..{self.max_level}"
        x = self.header.level[0].forward
        while x != NULL:
            n += 1
            assert x.backward == prev, f"backward pointer of rank {n} is wrong"
            if prev != NULL:
                assert self._node_before(prev, x), f"rank {n - 1} does not sort before rank {n}"
            leaders += self._is_leader(x)
            assert self._next_seq > x.seq, f"next_seq {self._next_seq} <= seq {x.seq}"
            assert 1 <= x.nlevels <= self.height, f"rank {n} has {x.nlevels} levels"
            nbytes += x.mlen
            reached = reached or x == self.relayout_next
            if self.relaying and not reached:
                assert not rk_ranges_hold(&self.old_ranges, x), \
                    f"rank {n} is in an old arena, before the relayout's position"
            position[<size_t>x] = n
            nodes.append(<size_t>x)
            dense.append(leaders)
            prev = x
            x = x.level[0].forward
        assert self.tail == prev, "tail is not the last node"
        assert reached, "the relayout's position is not a node of the list"
        assert self.relaying or self.relayout_next == NULL, "a relayout position, none under way"
        assert n == self.length, f"list holds {n} nodes, length says {self.length}"
        assert leaders == self.ndistinct, f"{leaders} leaders, ndistinct says {self.ndistinct}"
        assert nbytes == self.member_bytes, "member byte count is wrong"
        for level in range(self.height):
            node = self.header
            pos = 0
            dpos = 0
            while True:
                x = node.level[level].forward
                if x == NULL:
                    assert node.level[level].span == n - pos, \
                        f"level {level}: span to the end is {node.level[level].span}, " \
                        f"expected {n - pos}"
                    assert node.level[level].dspan == leaders - dpos, \
                        f"level {level}: distinct span to the end is wrong"
                    break
                assert x.nlevels > level, f"level {level} links a node of {x.nlevels} levels"
                assert node.level[level].fkey == x.key, f"level {level}: stale cached key"
                i = position[<size_t>x]
                assert node.level[level].span == i - pos, \
                    f"level {level}: span into rank {i} is {node.level[level].span}, " \
                    f"expected {i - pos}"
                assert node.level[level].dspan == dense[i - 1] - dpos, \
                    f"level {level}: distinct span into rank {i} is wrong"
                pos = i
                dpos = dense[i - 1]
                node = x
        found = 0
        if self.old_slots != NULL:
            for i in range(<Py_ssize_t>self.migrated, <Py_ssize_t>(self.old_mask + 1)):
                node = self.old_slots[i]
                if node != NULL and node != TOMBSTONE:
                    found += 1
                    assert <size_t>node in position, "old table holds a node not in the list"
                    assert self._lookup(RK_MEMBER(node), node.mlen, node.hash) == node, \
                        "a member of the old table is not reachable"
        for i in range(<Py_ssize_t>(self.mask + 1)):
            if self.slots[i] != NULL:
                found += 1
                node = self.slots[i]
                assert node != TOMBSTONE, "a tombstone in the new table"
                assert <size_t>node in position, "hash table holds a node not in the list"
                assert self._lookup(RK_MEMBER(node), node.mlen, node.hash) == node, \
                    "a member is not reachable through the hash table"
                assert node.hash == self._hash(RK_MEMBER(node), node.mlen), "stale hash"
        assert found == n, f"hash table holds {found} nodes, list holds {n}"
        assert (self.mask + 1) & self.mask == 0, "table size is not a power of two"
        assert <size_t>n * 4 <= (self.mask + 1) * 3 or n == 0, "hash table over 3/4 full"


cdef char *_dump_nodes(rk_node **at, char *p, const char *limit,
                       bint descending, uint64_t *written=NULL) noexcept nogil:
    """Write the dump records of ``at[0]`` and the nodes after it at ``p``
    while each fits before ``limit``; ``at[0]`` is left at the first node
    not written (``written``, if given, counts the records)."""
    cdef rk_node *x = at[0]
    cdef uint64_t n = 0
    while x != NULL and limit - p >= DUMP_RECORD_SIZE + x.mlen:
        rk_store_f64(p, -x.key if descending else x.key)
        rk_store_u64(p + 8, x.seq)
        rk_store_u16(p + 16, x.mlen)
        memcpy(p + DUMP_RECORD_SIZE, RK_MEMBER(x), x.mlen)
        p += DUMP_RECORD_SIZE + x.mlen
        x = x.level[0].forward
        n += 1
    at[0] = x
    if written != NULL:
        written[0] += n
    return p


cdef inline Py_ssize_t _dump_size(RankIndex index) noexcept:
    """The bytes of ``index``'s dump (``dump``, ``dump_chunks``)."""
    return DUMP_HEADER_SIZE + index.length * DUMP_RECORD_SIZE + index.member_bytes + 4


cdef inline void _dump_head(RankIndex index, char *p) noexcept:
    """``index``'s dump header at ``p``."""
    _dump_header_write(p, DUMP_VERSION, index.descending,
                       index.tie_by_member + index.tie_member_desc, index.length,
                       index._next_seq)


@cython.final
cdef class _DumpChunks(_DumpPieces):
    """``RankIndex.dump_chunks``: the pieces, from the node ``node`` on."""

    cdef RankIndex index
    cdef rk_node *node

    def __cinit__(self, RankIndex index, Py_ssize_t max_bytes):
        self.index = index
        self.node = index.header.level[0].forward
        self.mutations = index.mutations
        self.size = _dump_size(index)

    def __next__(self):
        cdef char *p = self.scratch
        cdef const char *limit = self.scratch + self.max_bytes
        cdef rk_node *x = self.node
        cdef bint descending = self.index.descending
        if self.done:
            raise StopIteration
        if self.index.mutations != self.mutations:
            raise RuntimeError("rank index changed during its dump")
        if not self.started:
            _dump_head(self.index, p)
            p += DUMP_HEADER_SIZE
            self.started = True
        with nogil:
            if x != NULL and limit - p < DUMP_RECORD_SIZE + x.mlen:
                limit = p + DUMP_RECORD_SIZE + x.mlen  # one record at least
            p = _dump_nodes(&x, p, limit, descending)
        self.node = x
        return self._piece(p - self.scratch, x == NULL)


@cython.final
cdef class _DumpWalk(_WalkPieces):
    """``RankIndex.dump_walk``: a walked dump's records, a piece at a time,
    each from the first node after the last record written."""

    cdef RankIndex index

    def __cinit__(self, RankIndex index, Py_ssize_t max_bytes):
        self.index = index

    def __next__(self):
        cdef RankIndex index = self.index
        cdef rk_node *x
        cdef rk_node *last
        cdef char *p = self.scratch
        cdef const char *limit = self.scratch + self.max_bytes
        if self.done:
            raise StopIteration
        if self.started:
            x = index._after(self.key, self.seq, self.member, self.mlen)
        else:
            x = index.header.level[0].forward
            self.started = True
        if x == NULL:
            self.done = True
            raise StopIteration
        if limit - p < DUMP_RECORD_SIZE + x.mlen:
            limit = p + DUMP_RECORD_SIZE + x.mlen  # one record at least
        p = _dump_nodes(&x, p, limit, index.descending, &self.records)
        last = index.tail if x == NULL else x.backward
        self._written(last.key, last.seq, RK_MEMBER(last), last.mlen)
        self.done = x == NULL
        return PyBytes_FromStringAndSize(self.scratch, p - self.scratch)

    def header(self):
        """The walked dump's header: the records written so far, and the
        index's next seq now (above every seq written)."""
        return _walked_header(DUMP_VERSION, self.index.descending,
                              self.index.tie_by_member + self.index.tie_member_desc,
                              self.records, self.index._next_seq)


cdef rk_node **_table_alloc(size_t size, bint huge=False) except NULL:
    """A zeroed slot array (``rk_zeroed_table``; ``huge``: once large, in
    huge pages from the start)."""
    cdef rk_node **slots = <rk_node **>rk_zeroed_table(size * sizeof(rk_node *), huge)
    if slots == NULL:
        raise MemoryError()
    return slots


cdef void _table_free(rk_node **slots, size_t size) noexcept:
    rk_free_table(slots, size * sizeof(rk_node *))


cdef inline void _count_free(Py_ssize_t n) noexcept:
    global _live_nodes
    _live_nodes -= n


cdef enum:
    # A load takes the GIL again after each run of this many + 1 records
    # loaded without it (a ms or two).
    LOAD_YIELD_MASK = 2047


cdef inline void _count_new(Py_ssize_t n) noexcept:
    global _live_nodes
    _live_nodes += n


cdef object _load(type cls, _DumpReader reader, Py_ssize_t size):
    cdef RankIndex index
    cdef rk_node *last[MAX_LEVEL]
    cdef Py_ssize_t last_rank[MAX_LEVEL]
    cdef Py_ssize_t last_drank[MAX_LEVEL]
    cdef const char *p
    cdef bint has_seq, walked
    cdef uint64_t count, next_seq, seq, i
    cdef uint32_t h
    cdef uint16_t mlen
    cdef double score, key
    cdef rk_node *x
    cdef rk_node *prev = NULL
    cdef int level
    cdef uint64_t stop, loaded
    cdef const char *at
    # Version 2 (no seqs: a board tied by member, written by rankd._pages)
    # loads too, its seqs 0: such a board never orders by them.
    reader.need(DUMP_HEADER_SIZE)
    _dump_header_fields(reader.p, size, &count, &next_seq, 2)
    has_seq = reader.p[4] == DUMP_VERSION
    walked = reader.p[7] == DUMP_WALKED
    index = cls("desc" if reader.p[5] == 0 else "asc", TIE_BREAK_CODES[reader.p[6]])
    reader.p += DUMP_HEADER_SIZE
    index._next_seq = next_seq
    index._table_reserve(count)
    for level in range(MAX_LEVEL):
        last[level] = index.header
        last_rank[level] = 0
        last_drank[level] = 0
    i = 0
    while i < count:
        # A big index is loaded in a worker thread (a cluster node taking a
        # group): its records are loaded without the GIL, a run at a time.
        # Only letting go of it between runs left the event loop's thread
        # waiting up to the switch interval (5 ms) for each of its callbacks.
        stop = min(count, (i | LOAD_YIELD_MASK) + 1)
        at = reader.p
        with nogil:
            loaded = index._load_run(&at, reader.end, i, stop, next_seq, has_seq, last,
                                     last_rank, last_drank, &prev)
        reader.p = at
        _count_new(<Py_ssize_t>(loaded - i))
        i = loaded
        if i == stop:
            continue
        # A record that straddles the pieces read so far, or is not sound: as
        # it always was, with the GIL (reading on, or raising).
        _dump_record_read(reader, i, next_seq, &score, &seq, &mlen, has_seq)
        p = reader.p
        key = index._key(score)
        if prev != NULL and not index._before(prev, key, seq, p, mlen):
            raise ValueError(f"rank index dump is out of order at record {i}")
        h = index._hash(p, mlen)
        if index._lookup(p, mlen, h) != NULL:
            if not walked:
                raise ValueError(f"rank index dump repeats a member at record {i}")
            reader.p += mlen  # written again while walked: its first record stays
            i += 1
            continue
        x = index._new_node(index._random_level(), p, mlen)
        index._place_loaded(x, key, seq, h, last, last_rank, last_drank)
        prev = x
        reader.p += mlen
        i += 1
    reader.finish()
    # Links still pointing at NULL span to the end of the list.
    for level in range(index.height):
        last[level].level[level].span = index.length - last_rank[level]
        last[level].level[level].dspan = index.ndistinct - last_drank[level]
    index.unplaced = 0  # allocated in rank order
    return index


def _load_from_dump(data):
    return RankIndex.load(data)


@cython.final
cdef class _Iterator:
    """Walks an index in rank order; any write to the index invalidates it."""

    cdef RankIndex index
    cdef rk_node *node
    cdef Py_ssize_t mutations

    def __cinit__(self, RankIndex index):
        self.index = index
        self.node = index.header.level[0].forward
        self.mutations = index.mutations

    def __iter__(self):
        return self

    def __next__(self):
        cdef rk_node *x = self.node
        if self.index.mutations != self.mutations:
            raise RuntimeError("rank index changed during iteration")
        if x == NULL:
            raise StopIteration
        self.node = x.level[0].forward
        return (self.index._member_str(x), self.index._score(x))
