# cython: language_level=3
"""Native rank index, compact layout: a skip list over pages of packed entries.

What it is
----------
The same index as :mod:`rankd._skiplist` (same contract, same results,
the same dump format but for boards tied by member, which dump version 2,
without seqs): a skip list ordered best-first plus a member hash map,
with the entries before each page counted (once by the skip list's
spans; since issue 47's step 16, by a count tree beside it alone).
What changes is the memory layout, which is where an in-memory
leaderboard spends its users' money.

Why pages
---------
A skip list of one node per member pays, per member, a malloc'd block, a
forward pointer and a span per level, a backward pointer, a cached key per
level and a hash slot pointer: about 107 bytes for a 19-byte name.  Here
level 0 is *unrolled*: a page holds up to ``page_size`` entries (64 by
default, and at most) in rank order, as parallel arrays of entry numbers
(a byte: see Members), 32-bit member ids, score keys and, on boards tied
by arrival, arrival sequences: a board tied by member never orders by a
seq, so its pages keep none and its dump leaves them out.

Keys and seqs start narrow, 4 bytes each: an entry is 9 bytes on a
board tied by member whose scores are integers (13 with f64 keys), 13
tied by arrival (17, and 21 with 64-bit seqs).  A page holds its keys as
the scores themselves, int32, while every score it was given is an
integer in int32's range and not -0.0 (game points, steps, wins, Elo:
most leaderboards), and as f64 keys once it is *wide* (a flag in its
header, read with the keys: one predictable branch a read).  A score
that does not fit widens only the page it enters (``_widened``: one
page copied, its links repointed as a reallocation's are), before
anything changes, and pages that take entries from a wide one (splits,
shares, merges) widen only if a moved key needs it; a wide page is
narrowed again, in place, by the write that leaves every key it holds
narrow (``_narrow_page``, checked by the writes that take an entry out
of a wide page or change one in it: a scan of its keys that stops at the
first wide one), and a load widens only the pages whose records need it.
So one fractional score costs a page while it is there, not the board,
and no write pays an O(n) pass: a board-wide widening took 22 ms
of one event-loop callback at 1M members.  Seqs count a board's score
changes, so only a replay that gives explicit seqs or four billion
writes pass 2^32: the first seq that does widens every page to 64-bit
seqs, once (O(n), every page allocated before any moves, so running out
of memory changes nothing; links name pages by number as well as
address, so the moved pages are re-linked from the page table).  Every
move of a page counts as a change of the index, so iterators and dumps
in chunks refuse to go on even when the write that moved it is then
refused.  Of the ways to fewer bytes a member this is the cheapest: a
per-page base with 32-bit offsets saves the same but needs a rebase when
a page's values span more than 2^32.

Only pages carry skip list levels, so the tower overhead is paid once
per page, not once per member.  Rank,
top-K, neighbours and range reads walk a few pages of contiguous arrays
instead of one pointer per member, and an update that stays inside its
page is a memmove, not an unlink and relink.

How ranks are counted
---------------------
A member's rank is the entries of the pages before its page + its
position in the page + 1.  The entries before a page are what the
*count tree* gives (``_pages_counts.pxi``, below): a B+ tree of each
page's entry count, in rank order.  The skip list's links once carried
spans (the entries from their page to the next at their level, as a
Pugh or Redis skip list's do), so that a search summed them on its way
down.  With the count tree they were the same counts kept twice, and
each write paid for both: an adjustment of one link per level, and a
removal or a change of leaders a search for those links alone.  Since
issue 47's step 16 the links hold no span: a search finds a place by
key, and the count tree counts.  ``range_by_rank`` goes down the count
tree to the page holding a rank; a count of entries below a score adds
the count before the page its search ends on.

How dense rank stays O(log n)
-----------------------------
The count tree counts *leaders* too (first entries of a run of equal
scores).  A page keeps its leader count (``lead``), recomputed by one
scan of its keys after a change (a page is a few cache lines); its first
entry's leadership depends on the previous page's last key, so a change
at a page's end re-counts the next page's first entry too.  Dense rank is
the leaders before the page (the count tree) plus the page's own leaders
up to the member.

Minimum fill
------------
Every page but the last holds at least ``page_size // 2`` entries, as a B
tree's nodes do: a removal that leaves a page below that merges it with a
neighbour when the two fit in one page, else evens the two out.  Deletes,
cheater removals and period resets therefore never leave memory behind in
sparse pages (Valkey 9.2's B+ tree lacks this).  A page that fills first
shares its entries with a neighbour that is at least 1/8 empty (as a B*
tree does), and splits in two halves only when neither is: random
arrivals then keep pages about 5/6 full, where halving alone leaves them
2/3 full.  A page appended at the end of the board (monotonic scores)
starts empty instead, and ``load`` packs pages 7/8 full.

A page is allocated for the entries it holds, not for ``page_size``: its
arrays have room for its entries and one more, rounded up to a step of
``CAP_STEP`` entries (4), and it grows by a step when full (``_grow``) and
gives back all but a step of spare room after removals, splits and shares
(``_shrink``).  The fill above then costs no memory but the per-page
overhead (header, tower, page table): entries at 5/6 or at 2/3 fill cost
what full ones do, plus two spare entries a page on average.  Growing may
move a page; the links to it hold its address, so the page table, the
next page's ``prev`` and the link before it on each of its levels are
repointed (``_repoint_moved``: one search for its first entry, through the
page table, since the link's own address may be the old one; the map's
codes name it by number, which stays).  A step of 4 moves a page at most
once per 4 inserts into it: the copy is a page's worth of bytes, about
what the insert's memmove moves, and the towers, which searches read,
never move.

Where pages live
----------------
Pages do not come from ``malloc``: an index keeps them in a page heap of
its own (``pg_pool``), because a board that shrinks must give memory
back and the C heap cannot.  glibc keeps freed chunks resident, and after
a random half of a board's members left, the freed pages lay one here and
one there among live ones: no 4 KiB page of the heap was wholly free, so
even ``malloc_trim`` gave back little (a board of 1M members that lost
half kept 64 B of RSS a remaining member, against 41.5 loaded fresh).
The C heap cannot move a chunk; the index can move a page (as a growth
does), so its heap compacts:

* blocks of memory (1 KiB growing to 256 KiB, an eighth of the heap;
  2 MiB on huge pages once the heap passes 64 MiB, as the towers), bumped
  into; a block of 64 KiB or more is a mapping of its own, unmapped the
  moment its last page leaves, so its memory goes back to the system at
  once, not to the C heap;
* a page is a chunk behind an 8-byte prefix (its size, live, listed and
  "the chunk before is dead" bits, its block's number): 8 bytes a page,
  as glibc's header, without its rounding to 16;
* a freed chunk is a *hole*: it merges with the dead chunks after it and
  the one before it (found by the size a hole keeps in its last 4 bytes,
  glibc's boundary tag) and goes to a list by exact size (pages come in a
  few dozen sizes); an allocation takes a hole of its size, or splits the
  smallest larger one, before it bumps, and a page that grows takes the
  hole after it in place, as ``realloc`` does;
* no hole smaller than the least page (``min_fill`` entries) is made:
  such a hole no allocation of the index would ever take (the C heap's
  other users took them, which the page heap has none of).  A split
  leaves no such rest, and a shrink that would leave one moves the page
  to a chunk of its new size instead (the whole chunk it leaves is a
  page's worth), unless the page is the last the current block bumped
  (its end goes back to the bump) or is narrowed from f64 keys (rare:
  it shrinks in place).  A random build leaves about 3% of the heap in holes;
* once holes are a sixteenth of the heap (and 256 KiB), writes *evacuate*
  the sparsest block (at most 15/16 live): its live pages move elsewhere,
  into the holes of other blocks first, ``EVAC_PAGES`` (2) a write, each
  repointed as a growth repoints, and the block is unmapped when the last
  leaves; the next sparsest follows until holes are under a 32nd.
  Moving a block's pages into holes elsewhere takes the whole block off
  the heap, so even a block 15/16 live is worth it.  The cost is a
  search and a page copy for each page moved, on the writes that follow
  the removals (bench/README.md, issue 47 step 11, measures what a board
  that lost half its members then holds).  An idle board evacuates
  nothing.

The map, the page table and the name arena are still ``malloc``'d: once
the memory freed since the last time reaches a sixteenth of what the index
holds (and 1 MiB), a removal calls ``malloc_trim`` (a walk of the heap's
free chunks: a millisecond or two for a heap of a million members), and
``clear`` does after freeing all.

Members
-------
Each member name is stored once, in the index's name arena: a record of
``u8 length - 1 | UTF-8 bytes`` padded to 4 bytes (at least 8: a freed
record keeps its length byte and holds its free list's link in its
second unit), addressed by a 32-bit id (its offset in 4-byte units): a
19-byte name takes 20 bytes.  Freed records go to free lists by size, so
deleting and re-adding members reuses their memory; when a quarter of
the arena is free records nobody took back, a sliding compaction moves
the live records down over them, 128 units a write, and the arena's
memory is given back at its end.  A record does not say whose it is:
the compaction finds a record's entry through the member map by the
record's name, and the record is live if that entry lists it (a freed
record's name finds no member, or one re-added under a new record; its
bytes from the fifth on are the link, so it may name nobody at all); a
moved record's id changes in its entry only.  Units of 4 bytes, not 8,
spare 4 bytes a member for half the name lengths and cost the arena's
reach (16 GiB, not 32).

Shared by a board's indexes
---------------------------
A board keeps an index per window and period (``all``, ``daily``,
``weekly``, ``monthly``, and the closed periods it retains), and they
hold mostly the same members: an arena of their own each stored every
name four times on a board of four windows.  They share one arena
(:class:`Names`, given as ``names=``), and every index of an arena that
holds a member lists the same record, so a name is stored once a board.
The indexes keep their own pages and member maps (a member's place
differs from window to window); the maps share the arena's SipHash key,
so a name is hashed once for all of them.  A record says neither whose
it is nor how many indexes list it (a count would cost a unit a record
for the 19-byte names whose record fills its units exactly), so:

* a member new to an index takes the record another index of the arena
  lists for it (a lookup in each other index's map, stopping at the
  first that holds it: for a member new to the board, one map slot an
  index, whose tag says "absent" 15 times in 16);
* an index that removes a member frees its record only if no other
  index lists it (the same lookups);
* an index emptied or freed (a period retired, a window dropped) does
  not look up each of its members in the others, which would be O(n) in
  one call: it looks up 64 of them, one a page over its pages, and adds
  its records times the share no other index lists to the arena's
  possibly dead units; the compaction, started once free and possibly
  dead records may be a quarter of the arena (at any size, if any may be
  dead), tells the live from the dead as it already did, by looking each
  record's name up, now in every index of the arena (a record is live if
  one lists it, and moved in each);
* a compaction step runs on a write to any index of the arena.

An arena is one object's state spread over several: its indexes are used
by one thread at a time, as one index is.  A load stores names without
the GIL, a run of records at a time, so no other thread may use an index
of the arena it loads into meanwhile.  The daemon builds a group's boards
in a worker thread on arenas of their own, and serves them from the event
loop only once built.

An index made without ``names`` has an arena of its own, as before.

The member map is open addressing with linear probing over an array of
32-bit *codes*, one per member (4 bytes a slot, at most 3/4 full), keyed
by SipHash-1-3 with a per-index random key (names come from players, so
collisions must not be predictable); it deletes by backward shift, so it
holds no tombstones.  A code names the member's entry and carries a tag
of the member's hash: ``(tag << 28 | page number << 6 | entry number) +
1`` (0 is an empty slot).  An entry number is a byte beside the entry,
unique in its page and kept while the entry moves inside it (a page
keeps the numbers in use as a 64-bit word, so pages hold at most 64
entries).  The tag is the hash's low 4 bits (the home slot comes from
its high bits, so the members of one probe sequence have independent
tags), from the same keyed SipHash.  Page numbers are therefore 22-bit:
an index numbers at most ``MAX_PAGES`` = 2^22 - 1 pages (over 134M
members at the default page size's minimum fill of 32, over 230M as a
load packs them; 8.4M at the smallest page size, 4), and a write or load
that needs a page past that is refused with ``OverflowError``, changing
nothing (``_need_pno``, ``_page_alloc``).  A lookup reads the home slot
and, for each slot from there whose tag is the member's, the page the
code names (the page table gives its address; its header, entry numbers
and ids are asked for at once), finds the entry by number (16 numbers a
compare) and compares the name its id leads to.  A probe that passes
another member's slot skips it on its tag 15 times in 16, reading
neither its page nor its name, so a lookup that misses (every new
member) reads about nothing but the slots.  Deletes and resizes, which
need each slot's home, still hash the slot's member's name, found the
same way.  Codes are unique (the page and entry numbers alone are), so
a slot is recognised by its code: entries that move to another page
(splits, shares and merges move up to a page's worth) take numbers
unused there, and their slots get the new codes, each found by the
name's hash (which also gives the tag both codes carry) and recognised
by the old code, no name compared; a move's names and slots are asked
for at once so that their misses overlap.  A member moved by its own
write gets its new entry before its old one goes (so that only the
insert, which alone may need memory, can fail, and fails changing
nothing): its slot follows the old entry, then takes the new one's code,
which keeps its tag.

Of the shapes weighed for issue 47, this is a page number, a stable
entry number and a tag.  A page number and a tag alone (a tag byte an
entry, no entry numbers) do not name the member: a tag may match two
entries of a page, and deletes and resizes could not tell whose a slot
is without hashing the names of the page.  Against a page number in the
record, entry numbers save 4 bytes a member and cost a byte an entry
and 8 bytes a page (the word of numbers in use): about 2.8 bytes a
member net for 19-byte names, and a hash and a slot write for each
entry a split, share or merge moves to another page.  The tag costs no
byte: it takes the page number's top 4 bits, which only a board of more
than 2^22 pages (134M members and up) would use.

The map's size is 2^k or 3 * 2^(k-1) slots (a hash's home slot is the
high bits of hash * size, Lemire's fast range, so any size works): it
grows by 3/2 or 4/3, never below half full after growing (doubling left
3/8), about 6.3 bytes a member at 1M where doubling gave 8.4; it shrinks
to the next smaller size once that would be at most 2/3 full.  It resizes
incrementally, as Redis's dict does: a new table takes the puts, and
every write moves 16 slots of the old one (marking them moved, so that
probes of the old table still walk over them); lookups probe both
meanwhile.  No write pays for moving the whole map.

Searching
---------
A search step must compare the target with the first entry of the page a
link leads to, and go on from that page's links.  Reading pages would be a
cache miss per step, so a search reads none: a page's links (its *tower*)
live apart from it, packed with the other towers in chunks that never
move, every link holds its forward page's number and tower, and a dense
array indexed by page number keeps each page's first key.  Towers and
first keys are a few dozen bytes a page (about one byte a member), small
enough to stay in cache on a big board; a search touches a page only to
break a tie of keys, and the one page it ends on.

A member's rank needs no search at all: its page is known (the map names
it), and the entries before that page are what a *count tree* gives
(``_pages_counts.pxi``): a B+ tree of entry counts over the pages in rank
order, whose leaf for a page the page table's ``where`` names (4 bytes a
page).  The leaf is asked for with the page, so its miss overlaps the
page's; the nodes above the leaves (some 0.5 MB at 100M members) stay in
cache.  The towers' spans gave the same sum until step 16 (a walk that
climbed as a search descends), but on a big board the lowest levels'
towers are not in cache: three or four dependent misses after the
page's at 100M (issue 47, steps 10, 13 and 15 in bench/README.md).  The
tree costs a write that changes a page's entry count a walk up its
leaf's ancestors, and the pages' order (links and unlinks) an insert or
removal in a leaf.

The tree counts leaders too, so a dense rank reads it as a rank does:
the leaders before the page, and the page's own up to the member (its
count less the runs that start after the member, read in the page, so
that the page before is not read).

The member map's table and the name arena are read at random places by
every lookup; once one is 32 MiB or more (a mapping of its own), it asks
for 2 MiB pages (``pg_advise_huge``), so that a lookup's misses do not
also miss the TLB; a load that knows its dump's size reserves the arena
at once, before touching it.  The arena, which fills from its start, asks
only once it holds 32 MiB of names: a huge page is resident whole from
its first touch, and the one being filled would otherwise cost a 1M
board about a byte a member.  A big board's towers (from its 32nd chunk,
some 3M members) come in 2 MiB chunks on huge pages too.

What it costs
-------------
Finding a member's entry is a slot, its page (by number: its header,
entry numbers and ids are asked for at once), its name and the key found
there: one or two more cache misses than the skip list's slot and node
(its rank adds the count tree's leaf, read beside the page);
finding that a member is absent is its slots (their tags), as the skip
list's is, but for a tag's false match one time in 16 per slot passed.  A name is read from
the arena, away from its entry, by every read that returns members (which
ask for the names of the window at once, so that their misses overlap)
and by ``dump`` (which asks for the names of the entries ahead).
``around`` reads the neighbours from the member's own entry, back over
``prev`` links and forward, so it needs its rank only (the count tree,
above), no search.  A batch warms its writes sixteen at a time: each
group's member strs, map slots, pages, entries and names are asked for
stage by stage across the group (and the count tree's leaf, for a write
whose new key stays in its page), then the searches its other writes
will make advance in lock step, so that the group's dependent misses
overlap; each member is hashed once, the hash
kept by the str's address for its write (the batch works on its own copy
of the operations, so an address names one str for the whole batch).
See bench/README.md for the measured price of each row.

How it differs from Pugh and from the B+ trees
----------------------------------------------
Pugh's skip list holds one key per node and counts nothing; Redis's
zskiplist adds spans that count nodes.  Here a node is a page of many,
and the skip list counts nothing either: searches by key use it, and the
counts live in the count tree, a B+ tree's counts without its keys.
Valkey's and Dragonfly's B+ tree sets keep keys and child counts in the
same nodes and search them; here the two are apart: the skip list's
towers, which a search reads, are a few bytes a page and stay in cache,
and the count tree answers only "how many entries (and leaders) come
before this page", so its nodes hold page numbers and counts, and the
search never reads it.  Its leader counts give dense rank in O(log n),
which neither B+ tree offers.
"""

cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.float cimport PyFloat_AS_DOUBLE
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.ref cimport Py_INCREF
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.math cimport INFINITY, isfinite, signbit
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memcmp, memcpy, memmove, memset

from rankd._skiplist cimport (
    PyUnicode_AsUTF8AndSize,
    rk_load_f64,
    rk_load_u16,
    rk_load_u64,
    rk_prefetch,
    rk_siphash13,
    rk_store_f64,
    rk_store_u16,
    rk_store_u32,
    rk_store_u64,
    rk_utf8_valid,
)

cdef extern from "Python.h":
    void PyObject_GC_UnTrack(void *op)
    # Borrowed: the batch's prefetch reads the pointers without a reference.
    void *PyList_GET_ITEM_PTR "PyList_GET_ITEM"(object list, Py_ssize_t i)
    void *PyTuple_GET_ITEM_PTR "PyTuple_GET_ITEM"(void *tuple, Py_ssize_t i)
    Py_ssize_t Py_SIZE_PTR "Py_SIZE"(void *o)
    void *Py_TYPE_PTR "Py_TYPE"(void *o)

cdef extern from *:
    """
    typedef struct pg_page pg_page;
    /* A link: the forward page, and what a search needs to go
       on without reading the forward page: its number (whose first key is
       in the dense first-key array) and its tower of links (flevel). */
    typedef struct pg_link pg_link;
    struct pg_link {
        pg_page *forward;
        pg_link *flevel;
        uint32_t fpno;
    };
    /* A page: header, then cap ids (the header and the first ids share a
       cache line, and finding a member scans the ids), cap keys and cap
       seqs.  Its levels (its
       tower) live apart, packed with the other pages' towers in chunks
       (see _tower_alloc), so that the levels a search walks stay in cache. */
    struct pg_page {
        pg_page *prev;            /* previous page on level 0 (NULL: first) */
        uint32_t n, lead, pno;    /* entries, leaders, page number */
        uint8_t height, wide;     /* levels; keys: 0 int32 scores, 1 f64 keys */
        uint16_t cap;
        pg_link *level;
        uint64_t used;            /* the entry numbers in use (bit e: e) */
    };
    /* After the header: cap entry numbers (u8, padded to 8 bytes), cap
       ids, cap keys, cap seqs.  The numbers come first: finding an entry
       by number scans them, in the header's lines. */
    #define PG_ENOS_BYTES(cap) (((size_t)(cap) + 7) & ~(size_t)7)
    #define PG_IDS_BYTES(cap) (((size_t)(cap) * 4 + 7) & ~(size_t)7)
    #define PG_ENOS(p) ((uint8_t *)((char *)(p) + sizeof(pg_page)))
    #define PG_IDS(p) ((uint32_t *)((char *)(p) + sizeof(pg_page) + PG_ENOS_BYTES((p)->cap)))
    /* A page's keys are its scores as int32 (PG_KEYS32) while every one
       it was given is an integer in int32's range (not -0.0), f64 keys
       (PG_KEYS) once it is widened (wide); PG_KEY_BYTES(p): 4 or 8 per
       entry, the array padded to 8 bytes. */
    #define PG_KEYS(p) ((double *)((char *)PG_IDS(p) + PG_IDS_BYTES((p)->cap)))
    #define PG_KEYS32(p) ((int32_t *)PG_KEYS(p))
    #define PG_KEYS_BYTES(cap, key_bytes) (((size_t)(cap) * (key_bytes) + 7) & ~(size_t)7)
    /* Seqs are 32-bit until a board's first seq past 2^32 - 1 widens every
       page to 64-bit; boards tied by member hold none.  seq_bytes: 0, 4 or
       8 per entry. */
    #define PG_KEY_BYTES(p) ((p)->wide ? 8 : 4)
    #define PG_SEQS(p) ((char *)PG_KEYS(p) + PG_KEYS_BYTES((p)->cap, PG_KEY_BYTES(p)))
    #define PG_SIZE(cap, key_bytes, seq_bytes) (sizeof(pg_page) + PG_ENOS_BYTES(cap) \
        + PG_IDS_BYTES(cap) + PG_KEYS_BYTES(cap, key_bytes) + (size_t)(cap) * (seq_bytes))
    #define PG_TOWER_CHUNK 4096   /* links a chunk of towers holds */
    /* From the PG_TOWER_BIG_AFTER-th chunk on (a board of some 3M members),
       a chunk holds PG_TOWER_BIG links: 2 MiB, one huge page. */
    #define PG_TOWER_BIG_AFTER 32
    #define PG_TOWER_BIG ((size_t)(2 << 20) / sizeof(pg_link))
    #define PG_MAX_LEVEL 32
    #define PG_NAME_CLASSES 67   /* records of 1..66 units of 4 bytes */
    /* An old table's slot whose id was moved.  A C constant: as a Cython
       DEF, a value past 2^31 - 1 was a Python int, and every comparison
       with it made one of the id too. */
    #define PG_MOVED 0xFFFFFFFFu
    /* A member map slot holds its member's code: a 4-bit tag of the
       member's hash, page number and entry number, PG_CODE(tag, pno, eno)
       = (tag << 28 | pno << 6 | eno) + 1 (0 is an empty slot), so page
       numbers are 22-bit and below PG_MAX_PNOS: the largest code, tag 15
       of page PG_MAX_PNOS - 1, stays below PG_MOVED, and the + 1 never
       carries into the tag. */
    #define PG_MAX_PNOS ((1u << 22) - 1)
    #define PG_CODE(tag, pno, eno) ((((uint32_t)(tag) << 28) | ((uint32_t)(pno) << 6) \
                                     | (uint32_t)(eno)) + 1)
    #define PG_CODE_PNO(c) ((((c) - 1) >> 6) & 0x3FFFFFu)
    #define PG_CODE_ENO(c) (((c) - 1) & 63)
    #define PG_CODE_TAG(c) (((c) - 1) >> 28)
    #define PG_CODE_ENTRY(c) (((c) - 1) & 0x0FFFFFFFu)   /* pno << 6 | eno */
    /* The tag of a hash: its low bits (the home slot is its high bits,
       pg_home), so the members of a probe sequence have independent tags. */
    #define PG_HASH_TAG(h) ((uint32_t)(h) & 15u)
    /* A code with another tag: the same entry. */
    #define PG_RETAG(c, tag) ((((c) - 1) & 0x0FFFFFFFu | ((uint32_t)(tag) << 28)) + 1)
    _Static_assert(PG_CODE(15, PG_MAX_PNOS - 1, 63) < PG_MOVED, "codes below PG_MOVED");
    /* The lowest entry number a page does not use (it holds fewer than
       64 entries). */
    static inline uint32_t pg_free_eno(uint64_t used) {
        return (uint32_t)__builtin_ctzll(~used);
    }
    /* The position of entry number e among a page's n entry numbers, or
       -1: 16 at a time.  It may read up to 15 bytes past the n numbers,
       still inside the page (the ids follow them); those bytes are
       masked off before they count. */
    #ifdef __SSE2__
    #include <emmintrin.h>
    static inline Py_ssize_t pg_find_eno(const uint8_t *enos, uint32_t n, uint32_t e) {
        __m128i t = _mm_set1_epi8((char)e);
        uint32_t i, m;
        for (i = 0; i < n; i += 16) {
            m = (uint32_t)_mm_movemask_epi8(
                _mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)(enos + i)), t));
            if (n - i < 16) m &= (1u << (n - i)) - 1;
            if (m) return (Py_ssize_t)(i + (uint32_t)__builtin_ctz(m));
        }
        return -1;
    }
    #else
    static inline Py_ssize_t pg_find_eno(const uint8_t *enos, uint32_t n, uint32_t e) {
        uint32_t i;
        for (i = 0; i < n; i++) if (enos[i] == e) return (Py_ssize_t)i;
        return -1;
    }
    #endif
    /* Units of 4 bytes a name record of mlen bytes takes: u8 length - 1
       and the name, at least 2 (a free record keeps its length byte and
       holds the free list's link in its second unit). */
    #define PG_NAME_UNITS(mlen) ((size_t)(mlen) < 4 ? (size_t)2 : ((size_t)(mlen) + 4) >> 2)
    /* A hash's home slot in a table of n slots, any n (Lemire's fast range:
       the high bits of h * n), so that the member map can grow by 3/2 and
       4/3, not only double. */
    static inline size_t pg_home(uint64_t h, size_t n) {
        return (size_t)(((unsigned __int128)h * n) >> 64);
    }
    /* Ask for a name record's line, and for the next one when a record of
       up to 32 bytes (a name of up to 27) would cross into it: records
       are 4-byte aligned, so 3 in 8 of the 24-byte records of 19-byte
       names cross a line (2 in 8 at 8-byte alignment). */
    static inline void pg_prefetch_rec(const uint32_t *rec) {
        __builtin_prefetch(rec);
        if (((uintptr_t)rec & 63) > 32) __builtin_prefetch((const char *)rec + 31);
    }
    /* One step of a search, at level i of tower lv, reads the forward
       page's first key and then, if it goes forward, that page's link at
       level i; if it stops, its own link at level i - 1 and that forward
       page's first key.  Each is a miss on a big board, and each waits
       for the one before: ask for the forward page's link and the first
       key below at once with this step's key, so that their misses
       overlap instead of queueing (about halving a rank's time at 10M
       members and up). */
    static inline void pg_prefetch_step(const pg_link *lv, int i, const double *firstkeys) {
        __builtin_prefetch(&lv[i].flevel[i]);
        if (i > 0 && lv[i - 1].forward != NULL)
            __builtin_prefetch(&firstkeys[lv[i - 1].fpno]);
    }
    /* Ask for 2 MiB pages under an array of n bytes at p, when it is big
       enough to be a mapping of its own (malloc maps every block of 32 MiB
       and more): a lookup on a big board misses the cache in the member
       map and the name arena at random places, and with 4 KiB pages each
       such miss also misses the TLB, whose page walk misses the cache in
       its turn.  Only whole 2 MiB pages inside the block are advised;
       transparent huge pages in "madvise" mode (the usual default) give
       them on first touch, and a block realloc moves or grows keeps the
       advice (mremap carries it).  A hint: the kernel may refuse it. */
    #include <sys/mman.h>
    #include <unistd.h>
    #define PG_HUGE_MIN ((size_t)32 << 20)
    #define PG_HUGE_PAGE ((uintptr_t)2 << 20)
    static inline void pg_advise_huge(void *p, size_t n) {
    #ifdef MADV_HUGEPAGE
        uintptr_t start, end;
        if (p == NULL || n < PG_HUGE_MIN) return;
        start = ((uintptr_t)p + PG_HUGE_PAGE - 1) & ~(PG_HUGE_PAGE - 1);
        end = ((uintptr_t)p + n) & ~(PG_HUGE_PAGE - 1);
        if (end > start) (void)madvise((void *)start, end - start, MADV_HUGEPAGE);
    #endif
    }
    /* An array that fills from its start as it grows (the name arena):
       advised only once it holds PG_HUGE_MIN bytes (or a load will fill
       that much), because a huge page is resident whole from its first
       touch: the one being filled costs up to 2 MiB, at most 1/16 of what
       the arena holds by then, not a byte a member of a 1M board. */
    static inline void pg_advise_huge_filled(void *p, size_t filled, size_t n) {
        if (filled >= PG_HUGE_MIN) pg_advise_huge(p, n);
    }
    /* An array that only grows (the page table): a C heap block while
       small, from 64 KiB on a mapping of its own grown by mremap, so that
       a growth leaves no freed copy behind.  glibc keeps a freed copy
       resident until a trim, and under the daemon's fixed mmap threshold
       (1 MiB) the page tables of boards of 0.5M to 7M members are heap
       blocks: their copies were about half a byte a member. */
    #define PG_ARRAY_MAP_MIN ((size_t)64 << 10)
    /* The kernel's page size (4 KiB here; 16 or 64 KiB on some arm64 and
       ppc64 kernels), read once. */
    static size_t pg_os_page_size = 0;
    static inline size_t pg_os_page(void) {
        if (pg_os_page_size == 0) {
            long n = sysconf(_SC_PAGESIZE);
            pg_os_page_size = n > 0 ? (size_t)n : 4096;
        }
        return pg_os_page_size;
    }
    static inline size_t pg_array_span(size_t n) {
        return (n + pg_os_page() - 1) & ~(pg_os_page() - 1);
    }
    static void *pg_array_grow(void *p, size_t old, size_t n) {
        void *q;
        if (n < PG_ARRAY_MAP_MIN) return realloc(p, n);
        if (old >= PG_ARRAY_MAP_MIN) {
            q = mremap(p, pg_array_span(old), pg_array_span(n), MREMAP_MAYMOVE);
            return q == MAP_FAILED ? NULL : q;
        }
        q = mmap(NULL, pg_array_span(n), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (q == MAP_FAILED) return NULL;
        if (old) memcpy(q, p, old);
        free(p);
        return q;
    }
    /* Room for ``want`` items of ``width`` bytes in the array ``*p`` of
       ``*cap`` items; -1 if out of memory (the array as it was). */
    static int pg_array_reserve(void **p, uint32_t *cap, size_t want, size_t width) {
        void *q;
        if (*cap >= want) return 0;
        q = pg_array_grow(*p, (size_t)*cap * width, want * width);
        if (q == NULL) return -1;
        *p = q;
        *cap = (uint32_t)want;
        return 0;
    }
    static void pg_array_free(void *p, size_t n) {
        if (p == NULL) return;
        if (n >= PG_ARRAY_MAP_MIN) munmap(p, pg_array_span(n));
        else free(p);
    }
    /* Give back the resident pages inside [p, p + n) of a block that
       stays allocated (MADV_DONTNEED: they read as zeros when touched
       again, which an unused end of an array never is before written).
       Only whole pages of the kernel's inside the range: the allocator's
       own words around a block are never touched. */
    static inline void pg_release(void *p, size_t n) {
        uintptr_t page = (uintptr_t)pg_os_page();
        uintptr_t start = ((uintptr_t)p + page - 1) & ~(page - 1);
        uintptr_t end = ((uintptr_t)p + n) & ~(page - 1);
        if (end > start) (void)madvise((void *)start, end - start, MADV_DONTNEED);
    }
    /* The page heap: where an index's pages live (see "Where pages
       live").  Blocks of memory, bumped into; a page is a chunk of a
       block behind an 8-byte prefix (its size, whether it is live,
       whether it is a listed hole, and its block's number).  A freed
       chunk becomes a hole, listed by exact size (pages come in a dozen
       sizes, so exact fits are the rule); an allocation takes a hole of
       its size before it bumps.  A block whose last live chunk is freed
       goes back to the C heap at once; a block left sparse is
       *evacuated* (its live pages moved elsewhere, a few a write, by the
       index, which knows how to repoint a moved page) until it is empty. */
    #define PG_CHUNK_LIVE 1u
    #define PG_CHUNK_LISTED 2u
    #define PG_CHUNK_PREV_DEAD 4u    /* the chunk before is dead: its size ends it */
    #define PG_CHUNK_SIZE(c) ((c)->size & ~7u)
    #define PG_HOLE_CLASSES 257      /* exact sizes 32..2040 bytes, by 8; 2048 and up */
    #define PG_HOLE_CLASS(size) ((size) >> 3 < PG_HOLE_CLASSES - 1 ? (size) >> 3 : PG_HOLE_CLASSES - 1)
    #define PG_HOLE_MIN 32           /* a prefix, two links and the size that ends it */
    #define PG_BLOCK_MIN ((size_t)1 << 10)
    #define PG_BLOCK_MAX ((size_t)256 << 10)
    #define PG_BLOCK_HUGE_AFTER ((size_t)64 << 20)
    #define PG_NO_BLOCK 0xFFFFFFFFu
    typedef struct pg_chunk { uint32_t size, block; } pg_chunk;
    typedef struct pg_hole { pg_chunk c; struct pg_hole *next, *prev; } pg_hole;
    typedef struct pg_block { char *base; uint32_t size, used, live, mapped; } pg_block;
    /* A mapping of n bytes (a multiple of 2 MiB) on a 2 MiB boundary,
       advised 2 MiB pages; NULL if out of memory.  Not posix_memalign:
       glibc serves that from its heap once its mmap threshold has risen
       past the request, in a chunk twice the size whose other half,
       touched before by whatever held it, stays resident. */
    static inline void *pg_huge_map(size_t n) {
        size_t extra = (size_t)PG_HUGE_PAGE;
        char *raw = (char *)mmap(NULL, n + extra, PROT_READ | PROT_WRITE,
                                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        char *p;
        size_t head;
        if (raw == (char *)MAP_FAILED) return NULL;
        p = (char *)(((uintptr_t)raw + PG_HUGE_PAGE - 1) & ~(PG_HUGE_PAGE - 1));
        head = (size_t)(p - raw);
        if (head) munmap(raw, head);
        if (extra - head) munmap(p + n, extra - head);
    #ifdef MADV_HUGEPAGE
        (void)madvise(p, n, MADV_HUGEPAGE);
    #endif
        return p;
    }
    static inline void pg_huge_unmap(void *p, size_t n) { munmap(p, n); }
    /* Blocks of this size and more are mappings of their own, unmapped
       when they empty: their memory goes back to the system at once, not
       to the C heap (which keeps it resident until trimmed). */
    #define PG_BLOCK_MAP_MIN ((size_t)64 << 10)
    static inline void pg_block_unmap(pg_block *blk) {
        if (blk->mapped) munmap(blk->base, blk->size);
        else free(blk->base);
    }
    typedef struct pg_pool {
        pg_block *blocks;             /* by number; base NULL: a number free */
        uint32_t nblocks, blocks_cap;
        uint32_t cur;                 /* the block bumped into, or PG_NO_BLOCK */
        uint32_t evac;                /* the block being evacuated, or PG_NO_BLOCK */
        uint32_t evac_off;            /* the evacuation's next chunk in it */
        size_t bytes, live;           /* all blocks' sizes; live chunks' bytes */
        uint32_t min_rest;            /* the least hole a split may leave (a page's) */
        pg_hole *holes[PG_HOLE_CLASSES];
        uint64_t listed[(PG_HOLE_CLASSES + 63) / 64];   /* classes with a hole */
    } pg_pool;
    static inline pg_hole *pg_hole_next(pg_hole *h) { return h->next; }
    static inline void pg_pool_init(pg_pool *pool) {
        memset(pool, 0, sizeof(*pool));
        pool->cur = pool->evac = PG_NO_BLOCK;
        pool->min_rest = PG_HOLE_MIN;
    }
    /* Bytes in holes and in blocks' ends no chunk reached but the
       current block's (which the next allocations bump into). */
    static inline size_t pg_pool_dead(const pg_pool *pool) {
        size_t room = 0;
        if (pool->cur != PG_NO_BLOCK)
            room = pool->blocks[pool->cur].size - pool->blocks[pool->cur].used;
        return pool->bytes - pool->live - room;
    }
    static inline void pg_hole_push(pg_pool *pool, pg_chunk *c) {
        pg_hole *h = (pg_hole *)c;
        uint32_t cls = PG_HOLE_CLASS(PG_CHUNK_SIZE(c));
        if (PG_CHUNK_SIZE(c) < PG_HOLE_MIN || c->block == pool->evac)
            return;  /* dead, unlisted: an evacuation or a block's release ends it */
        c->size |= PG_CHUNK_LISTED;
        h->prev = NULL;
        h->next = pool->holes[cls];
        if (h->next != NULL) h->next->prev = h;
        pool->holes[cls] = h;
        pool->listed[cls >> 6] |= (uint64_t)1 << (cls & 63);
    }
    static inline void pg_hole_unlink(pg_pool *pool, pg_chunk *c) {
        pg_hole *h = (pg_hole *)c;
        if (!(c->size & PG_CHUNK_LISTED)) return;
        c->size &= ~PG_CHUNK_LISTED;
        uint32_t cls = PG_HOLE_CLASS(PG_CHUNK_SIZE(c));
        if (h->prev != NULL) h->prev->next = h->next;
        else if ((pool->holes[cls] = h->next) == NULL)
            pool->listed[cls >> 6] &= ~((uint64_t)1 << (cls & 63));
        if (h->next != NULL) h->next->prev = h->prev;
    }
    /* The smallest class from cls on with a hole, or PG_HOLE_CLASSES. */
    static inline uint32_t pg_hole_class_from(const pg_pool *pool, uint32_t cls) {
        uint32_t w = cls >> 6;
        uint64_t bits;
        if (cls >= PG_HOLE_CLASSES) return PG_HOLE_CLASSES;
        bits = pool->listed[w] & (~(uint64_t)0 << (cls & 63));
        while (bits == 0) {
            if (++w >= (PG_HOLE_CLASSES + 63) / 64) return PG_HOLE_CLASSES;
            bits = pool->listed[w];
        }
        return w * 64 + (uint32_t)__builtin_ctzll(bits);
    }
    /* Merge the dead chunks that follow dead chunk c into it (holes
       unlisted first); c itself must not be listed. */
    static inline void pg_chunk_absorb(pg_pool *pool, pg_chunk *c) {
        pg_block *blk = &pool->blocks[c->block];
        char *end = blk->base + blk->used;
        pg_chunk *next = (pg_chunk *)((char *)c + PG_CHUNK_SIZE(c));
        while ((char *)next < end && !(next->size & PG_CHUNK_LIVE)) {
            pg_hole_unlink(pool, next);
            c->size += PG_CHUNK_SIZE(next);
            next = (pg_chunk *)((char *)c + PG_CHUNK_SIZE(c));
        }
    }
    /* The chunk after c in its block, or NULL at the block's bump. */
    static inline pg_chunk *pg_chunk_next(pg_pool *pool, pg_chunk *c) {
        pg_block *blk = &pool->blocks[c->block];
        char *next = (char *)c + PG_CHUNK_SIZE(c);
        return next < blk->base + blk->used ? (pg_chunk *)next : NULL;
    }
    /* Dead chunk c (of PG_HOLE_MIN bytes at least, or its block's last)
       ends in its size, and the chunk after it knows: a free merges
       with the dead chunk before it as with the ones after it, so that
       holes stay as big as the runs of free bytes they are. */
    static inline void pg_chunk_bury(pg_pool *pool, pg_chunk *c) {
        uint32_t size = PG_CHUNK_SIZE(c);
        pg_chunk *next = pg_chunk_next(pool, c);
        if (next == NULL) return;
        *(uint32_t *)((char *)c + size - 4) = size;
        next->size |= PG_CHUNK_PREV_DEAD;
    }
    /* Unlist every hole of block b (before it is released or evacuated). */
    static inline void pg_block_unlist(pg_pool *pool, uint32_t b) {
        pg_block *blk = &pool->blocks[b];
        uint32_t off = 0;
        pg_chunk *c;
        while (off < blk->used) {
            c = (pg_chunk *)(blk->base + off);
            pg_hole_unlink(pool, c);
            off += PG_CHUNK_SIZE(c);
        }
    }
    static inline void pg_block_release(pg_pool *pool, uint32_t b) {
        pg_block *blk = &pool->blocks[b];
        pg_block_unlist(pool, b);
        pool->bytes -= blk->size;
        pg_block_unmap(blk);
        blk->base = NULL;
        blk->size = blk->used = blk->live = 0;
        if (pool->evac == b) pool->evac = PG_NO_BLOCK;
        if (pool->cur == b) pool->cur = PG_NO_BLOCK;
    }
    /* A new current block with room for csize bytes: an eighth of the
       pool (from PG_BLOCK_MIN to PG_BLOCK_MAX), or 2 MiB on huge pages
       once the pool is big (a big board's pages are read at random by
       every lookup).  0 if out of memory. */
    static int pg_block_open(pg_pool *pool, size_t csize) {
        size_t size = PG_BLOCK_MIN;
        uint32_t b;
        char *base;
        pg_block *grown;
        pg_chunk *tail;
        int huge = pool->bytes >= PG_BLOCK_HUGE_AFTER;
        if (huge) size = (size_t)PG_HUGE_PAGE;
        else while (size < PG_BLOCK_MAX && size < pool->bytes / 8) size <<= 1;
        if (size < csize)
            size = huge ? (csize + PG_HUGE_PAGE - 1) & ~(size_t)(PG_HUGE_PAGE - 1) : csize;
        for (b = 0; b < pool->nblocks; b++) if (pool->blocks[b].base == NULL) break;
        if (b == pool->nblocks && pool->nblocks == pool->blocks_cap) {
            grown = (pg_block *)realloc(pool->blocks, (pool->blocks_cap * 2 + 8) * sizeof(pg_block));
            if (grown == NULL) return 0;
            pool->blocks = grown;
            pool->blocks_cap = pool->blocks_cap * 2 + 8;
        }
        if (huge) {
            base = (char *)pg_huge_map(size);
        } else if (size >= PG_BLOCK_MAP_MIN) {
            base = (char *)mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (base == (char *)MAP_FAILED) base = NULL;
        } else {
            base = (char *)malloc(size);
        }
        if (base == NULL) return 0;
        if (pool->cur != PG_NO_BLOCK) {
            /* The old current block's end becomes a hole. */
            pg_block *old = &pool->blocks[pool->cur];
            if (old->size - old->used >= sizeof(pg_chunk)) {
                tail = (pg_chunk *)(old->base + old->used);
                tail->size = old->size - old->used;
                tail->block = pool->cur;
                old->used = old->size;
                pg_hole_push(pool, tail);
            }
        }
        if (pool->cur != PG_NO_BLOCK && pool->blocks[pool->cur].live == 0)
            pg_block_release(pool, pool->cur);
        if (b == pool->nblocks) pool->nblocks++;
        pool->blocks[b].base = base;
        pool->blocks[b].size = (uint32_t)size;
        pool->blocks[b].used = pool->blocks[b].live = 0;
        pool->blocks[b].mapped = size >= PG_BLOCK_MAP_MIN;
        pool->bytes += size;
        pool->cur = b;
        return 1;
    }
    /* n bytes (8-aligned) for a page, or NULL if out of memory. */
    static void *pg_pool_alloc(pg_pool *pool, size_t n) {
        size_t csize = ((n + 7) & ~(size_t)7) + sizeof(pg_chunk);
        uint32_t cls = (uint32_t)(csize >> 3);  /* (past the exact classes: bumped) */
        pg_chunk *c;
        pg_block *blk;
        uint32_t fit = pg_hole_class_from(pool, cls);
        pg_chunk *rest;
        if (fit != PG_HOLE_CLASSES && fit != cls && fit < cls + pool->min_rest / 8)
            fit = pg_hole_class_from(pool, cls + pool->min_rest / 8);  /* a rest no page fits */
        if (fit != PG_HOLE_CLASSES) {
            c = &pool->holes[fit]->c;
            pg_hole_unlink(pool, c);
            if (PG_CHUNK_SIZE(c) != csize) {  /* split: the rest stays a hole */
                rest = (pg_chunk *)((char *)c + csize);
                rest->size = (uint32_t)(PG_CHUNK_SIZE(c) - csize);
                rest->block = c->block;
                c->size = (uint32_t)csize | (c->size & PG_CHUNK_PREV_DEAD);
                pg_chunk_bury(pool, rest);
                pg_hole_push(pool, rest);
            } else if ((rest = pg_chunk_next(pool, c)) != NULL) {
                rest->size &= ~PG_CHUNK_PREV_DEAD;
            }
        } else {
            if (pool->cur == PG_NO_BLOCK
                    || pool->blocks[pool->cur].size - pool->blocks[pool->cur].used < csize) {
                if (!pg_block_open(pool, csize)) return NULL;
            }
            blk = &pool->blocks[pool->cur];
            c = (pg_chunk *)(blk->base + blk->used);
            blk->used += (uint32_t)csize;
            c->size = (uint32_t)csize;
            c->block = pool->cur;
        }
        c->size |= PG_CHUNK_LIVE;
        pool->blocks[c->block].live += (uint32_t)csize;
        pool->live += csize;
        return (char *)c + sizeof(pg_chunk);
    }
    static inline pg_chunk *pg_chunk_of(void *p) {
        return (pg_chunk *)((char *)p - sizeof(pg_chunk));
    }
    /* The bytes a page's chunk has room for. */
    static inline size_t pg_pool_room(void *p) {
        return PG_CHUNK_SIZE(pg_chunk_of(p)) - sizeof(pg_chunk);
    }
    static void pg_pool_free(pg_pool *pool, void *p) {
        pg_chunk *c = pg_chunk_of(p);
        uint32_t size = PG_CHUNK_SIZE(c), b = c->block;
        pg_block *blk = &pool->blocks[b];
        pg_chunk *before;
        c->size &= ~PG_CHUNK_LIVE;
        blk->live -= size;
        pool->live -= size;
        if (blk->live == 0 && b != pool->cur) {
            pg_block_release(pool, b);
            return;
        }
        if (c->size & PG_CHUNK_PREV_DEAD) {  /* merge with the dead chunk before */
            before = (pg_chunk *)((char *)c - *(uint32_t *)((char *)c - 4));
            pg_hole_unlink(pool, before);
            before->size += size;
            c = before;
        }
        pg_chunk_absorb(pool, c);
        if (b == pool->cur && (char *)c + PG_CHUNK_SIZE(c) == blk->base + blk->used) {
            blk->used -= PG_CHUNK_SIZE(c);  /* the last chunks bumped: bump back */
        } else {
            pg_chunk_bury(pool, c);
            pg_hole_push(pool, c);
        }
    }
    /* Grow p's chunk to n bytes in place, as realloc does where it can:
       into the current block's room if it is the last chunk bumped, or
       into the dead chunk after it (the rest of which stays a hole);
       whether it did. */
    static int pg_pool_grow_in_place(pg_pool *pool, void *p, size_t n) {
        pg_chunk *c = pg_chunk_of(p), *next, *rest;
        uint32_t size = PG_CHUNK_SIZE(c), avail;
        uint32_t want = (uint32_t)(((n + 7) & ~(size_t)7) + sizeof(pg_chunk));
        pg_block *blk = &pool->blocks[c->block];
        if (want <= size) return 1;
        if (c->block == pool->cur && (char *)c + size == blk->base + blk->used) {
            if (blk->size - blk->used < want - size) return 0;
            blk->used += want - size;
        } else {
            next = pg_chunk_next(pool, c);
            if (c->block == pool->evac || next == NULL || (next->size & PG_CHUNK_LIVE)) return 0;
            avail = size + PG_CHUNK_SIZE(next);
            if (avail < want) return 0;
            pg_hole_unlink(pool, next);
            if (avail - want >= pool->min_rest) {
                rest = (pg_chunk *)((char *)c + want);
                rest->size = avail - want;
                rest->block = c->block;
                pg_chunk_bury(pool, rest);
                pg_hole_push(pool, rest);
            } else {
                want = avail;  /* (the whole hole: a rest no page fits) */
                c->size = avail | (c->size & 7u);
                if ((rest = pg_chunk_next(pool, c)) != NULL) rest->size &= ~PG_CHUNK_PREV_DEAD;
            }
        }
        blk->live += want - size;
        pool->live += want - size;
        c->size = want | PG_CHUNK_LIVE | (c->size & PG_CHUNK_PREV_DEAD);
        return 1;
    }
    /* Whether p's chunk is the last the current block bumped (a shrink
       in place then gives its end back to the bump). */
    static inline int pg_pool_is_last(const pg_pool *pool, void *p) {
        pg_chunk *c = pg_chunk_of(p);
        const pg_block *blk;
        if (c->block != pool->cur) return 0;
        blk = &pool->blocks[c->block];
        return (char *)c + PG_CHUNK_SIZE(c) == blk->base + blk->used;
    }
    /* Give back the end of p's chunk past n bytes, in place. */
    static void pg_pool_shrink(pg_pool *pool, void *p, size_t n) {
        pg_chunk *c = pg_chunk_of(p), *tail;
        uint32_t size = PG_CHUNK_SIZE(c);
        uint32_t keep = (uint32_t)(((n + 7) & ~(size_t)7) + sizeof(pg_chunk));
        pg_block *blk = &pool->blocks[c->block];
        if (keep + PG_HOLE_MIN > size) return;  /* (no hole too small to merge) */
        c->size = keep | PG_CHUNK_LIVE | (c->size & PG_CHUNK_PREV_DEAD);
        blk->live -= size - keep;
        pool->live -= size - keep;
        if (c->block == pool->cur && (char *)c + size == blk->base + blk->used) {
            blk->used -= size - keep;
            return;
        }
        tail = (pg_chunk *)((char *)c + keep);
        tail->size = size - keep;
        tail->block = c->block;
        pg_chunk_absorb(pool, tail);
        if (c->block == pool->cur && (char *)tail + PG_CHUNK_SIZE(tail) == blk->base + blk->used) {
            blk->used -= PG_CHUNK_SIZE(tail);
        } else {
            pg_chunk_bury(pool, tail);
            pg_hole_push(pool, tail);
        }
    }
    /* Start evacuating the sparsest block other than the current one, if
       the pool's dead bytes are a share of it (1 / divisor) and that block
       is at most 15/16 live; 0 if there is nothing to do.  (The index
       decides whether its dead bytes are enough to look at all.) */
    static int pg_pool_pick_evac(pg_pool *pool, size_t divisor) {
        uint32_t b, best = PG_NO_BLOCK;
        double fill, best_fill = 0.9375;
        size_t dead = pg_pool_dead(pool);
        if (dead < pool->bytes / divisor) return 0;
        for (b = 0; b < pool->nblocks; b++) {
            if (pool->blocks[b].base == NULL || b == pool->cur) continue;
            fill = (double)pool->blocks[b].live / pool->blocks[b].size;
            if (fill <= best_fill) { best_fill = fill; best = b; }
        }
        if (best == PG_NO_BLOCK) return 0;
        pg_block_unlist(pool, best);
        pool->evac = best;
        pool->evac_off = 0;
        return 1;
    }
    /* The evacuation's next live page, or NULL when it has walked the
       block (ended: the block keeps only pages it may not move). */
    static void *pg_pool_evac_next(pg_pool *pool) {
        pg_block *blk;
        pg_chunk *c;
        if (pool->evac == PG_NO_BLOCK) return NULL;
        blk = &pool->blocks[pool->evac];
        while (pool->evac_off < blk->used) {
            c = (pg_chunk *)(blk->base + pool->evac_off);
            pool->evac_off += PG_CHUNK_SIZE(c);
            if (c->size & PG_CHUNK_LIVE) return (char *)c + sizeof(pg_chunk);
        }
        pool->evac = PG_NO_BLOCK;
        return NULL;
    }
    static void pg_pool_destroy(pg_pool *pool) {
        uint32_t b, min_rest = pool->min_rest;
        for (b = 0; b < pool->nblocks; b++)
            if (pool->blocks[b].base != NULL) pg_block_unmap(&pool->blocks[b]);
        free(pool->blocks);
        pg_pool_init(pool);
        pool->min_rest = min_rest;
    }
    /* Copy a name (a few dozen bytes at most, usually): whole words, the
       last one overlapping the one before, where a memcpy of a size not
       known at compile time became an inline ``rep movsq`` whose start-up
       cost was most of a range read's time per member. */
    static inline void pg_copy_short(char *d, const char *s, Py_ssize_t n) {
        uint64_t w;
        uint32_t h;
        Py_ssize_t i;
        if (n >= 8) {
            for (i = 0; i + 8 < n; i += 8) { memcpy(&w, s + i, 8); memcpy(d + i, &w, 8); }
            memcpy(&w, s + n - 8, 8);
            memcpy(d + n - 8, &w, 8);
        } else if (n >= 4) {
            memcpy(&h, s, 4);
            memcpy(d, &h, 4);
            memcpy(&h, s + n - 4, 4);
            memcpy(d + n - 4, &h, 4);
        } else {
            for (i = 0; i < n; i++) d[i] = s[i];
        }
    }
    /* A member's str from its UTF-8 bytes: an ASCII name (the common
       case) is copied into a new str at once.  CPython's decoder reads a
       name byte by byte up to its first 8-byte boundary, and a name in
       4-byte units starts at either of two offsets from one. */
    static PyObject *pg_name_str(const char *s, Py_ssize_t n) {
        Py_ssize_t i = 0;
        uint64_t acc = 0, w;
        PyObject *u;
        for (; i + 8 <= n; i += 8) { memcpy(&w, s + i, 8); acc |= w; }
        for (; i < n; i++) acc |= (unsigned char)s[i];
        if (acc & 0x8080808080808080ULL) return PyUnicode_DecodeUTF8(s, n, NULL);
        u = PyUnicode_New(n, 127);
        if (u != NULL) pg_copy_short((char *)PyUnicode_1BYTE_DATA(u), s, n);
        return u;
    }
    /* Give the C heap's free memory back to the system (glibc keeps freed
       chunks resident, even whole free pages inside its heap); a no-op
       with other C libraries. */
    #ifdef __GLIBC__
    #include <malloc.h>
    static inline void pg_trim(void) { malloc_trim(0); }
    #else
    static inline void pg_trim(void) {}
    #endif
    """
    ctypedef struct pg_page
    ctypedef struct pg_link:
        pg_page *forward
        pg_link *flevel
        uint32_t fpno
    ctypedef struct pg_page:
        pg_page *prev
        uint32_t n
        uint32_t lead
        uint32_t pno
        uint8_t height
        uint8_t wide
        uint16_t cap
        pg_link *level
        uint64_t used
    double *PG_KEYS(pg_page *p) nogil
    int32_t *PG_KEYS32(pg_page *p) nogil
    char *PG_SEQS(pg_page *p) nogil
    int PG_KEY_BYTES(pg_page *p) nogil
    uint8_t *PG_ENOS(pg_page *p) nogil
    size_t PG_ENOS_BYTES(int cap) nogil
    uint32_t PG_CODE(uint32_t tag, uint32_t pno, uint32_t eno) nogil
    uint32_t PG_CODE_PNO(uint32_t code) nogil
    uint32_t PG_CODE_ENO(uint32_t code) nogil
    uint32_t PG_CODE_TAG(uint32_t code) nogil
    uint32_t PG_CODE_ENTRY(uint32_t code) nogil
    uint32_t PG_HASH_TAG(uint64_t h) nogil
    uint32_t PG_RETAG(uint32_t code, uint32_t tag) nogil
    uint32_t pg_free_eno(uint64_t used) nogil
    Py_ssize_t pg_find_eno(const uint8_t *enos, uint32_t n, uint32_t e) nogil
    size_t PG_NAME_UNITS(Py_ssize_t mlen) nogil
    uint32_t *PG_IDS(pg_page *p) nogil
    size_t PG_SIZE(int cap, int key_bytes, int seq_bytes) nogil
    size_t PG_IDS_BYTES(int cap) nogil
    size_t pg_home(uint64_t h, size_t n) nogil
    const uint32_t MOVED "PG_MOVED"
    const uint32_t MAX_PNOS "PG_MAX_PNOS"
    void pg_trim() nogil
    void pg_prefetch_rec(const uint32_t *rec) nogil
    void pg_prefetch_step(const pg_link *lv, int i, const double *firstkeys) nogil
    void pg_advise_huge(void *p, size_t n) nogil
    void pg_advise_huge_filled(void *p, size_t filled, size_t n) nogil
    void pg_release(void *p, size_t n) nogil
    int pg_array_reserve(void **p, uint32_t *cap, size_t want, size_t width) nogil
    void pg_array_free(void *p, size_t n) nogil
    void *pg_huge_map(size_t n) nogil
    void pg_huge_unmap(void *p, size_t n) nogil
    ctypedef struct pg_chunk:
        uint32_t size
        uint32_t block
    ctypedef struct pg_block:
        char *base
        uint32_t size
        uint32_t used
        uint32_t live
    ctypedef struct pg_pool:
        pg_block *blocks
        uint32_t nblocks
        uint32_t cur
        uint32_t evac
        size_t bytes
        size_t live
        uint32_t min_rest
        void *holes[1]
    void pg_pool_init(pg_pool *pool) nogil
    void pg_pool_destroy(pg_pool *pool) nogil
    void *pg_pool_alloc(pg_pool *pool, size_t n) nogil
    void pg_pool_free(pg_pool *pool, void *p) nogil
    void pg_pool_shrink(pg_pool *pool, void *p, size_t n) nogil
    bint pg_pool_grow_in_place(pg_pool *pool, void *p, size_t n) nogil
    bint pg_pool_is_last(const pg_pool *pool, void *p) nogil
    size_t pg_pool_room(void *p) nogil
    size_t pg_pool_dead(const pg_pool *pool) nogil
    bint pg_pool_pick_evac(pg_pool *pool, size_t divisor) nogil
    void *pg_pool_evac_next(pg_pool *pool) nogil
    pg_chunk *pg_chunk_of(void *p) nogil
    ctypedef void *pg_hole_ptr "pg_hole *"
    pg_hole_ptr pg_hole_next(pg_hole_ptr h) nogil
    const uint32_t CHUNK_LIVE "PG_CHUNK_LIVE"
    const uint32_t CHUNK_LISTED "PG_CHUNK_LISTED"
    const uint32_t CHUNK_PREV_DEAD "PG_CHUNK_PREV_DEAD"
    const uint32_t NO_BLOCK "PG_NO_BLOCK"
    enum:
        HOLE_CLASSES "PG_HOLE_CLASSES"
    str pg_name_str(const char *s, Py_ssize_t n)
    void pg_copy_short(char *d, const char *s, Py_ssize_t n) nogil
    enum:
        TOWER_CHUNK "PG_TOWER_CHUNK"
        TOWER_BIG "PG_TOWER_BIG"
        TOWER_BIG_AFTER "PG_TOWER_BIG_AFTER"
        MAX_LEVEL "PG_MAX_LEVEL"
        NAME_CLASSES "PG_NAME_CLASSES"

import os
import zlib

# Pages an index numbers at most: a map slot's code holds a 22-bit page
# number beside its tag and entry number (see Members).
MAX_PAGES = MAX_PNOS


cdef object _pages_full(uint32_t limit):
    """The error of a write or load that needs a page past ``limit``."""
    return OverflowError(
        f"a rank index holds at most {limit} pages (page numbers are 22-bit: "
        f"at least {limit * 32} members at the default page size); it has no page "
        "number left for this write")


# A dump's tie-break byte, by value.
TIE_BREAK_CODES = ("first", "member", "member_desc")

DEF DEFAULT_PAGE_SIZE = 64
DEF MIN_PAGE_SIZE = 4
DEF MAX_PAGE_SIZE = 64      # entry numbers are 6-bit (see Members)
DEF MIN_TABLE_SIZE = 8
DEF MAX_MEMBER_BYTES = 256
DEF MAX_EXACT_INT = 9007199254740992
DEF MAX_SEQ = 9223372036854775807
DEF MAX_LENGTH = 4294967294
DEF DUMP_VERSION = 1
DEF DUMP_VERSION_NO_SEQS = 2   # records without seqs (boards tied by member)
DEF DUMP_HEADER_SIZE = 24
DEF DUMP_RECORD_SIZE = 18
DEF DUMP_AHEAD = 16
DEF LOAD_AHEAD = 8   # records a load hashes ahead (its ring holds 16)
DEF WARM_GROUP = 16   # a batch's writes whose walks advance in lock step (the ring holds 16)
DEF PREFETCH_MIN_LENGTH = 32768
DEF MIN_COMPACT_UNITS = 8192   # arenas below 32 KiB are not compacted
DEF COMPACT_STEP = 128          # arena units a write's compaction step looks at
DEF DEAD_SAMPLES = 64           # entries an index leaving a shared arena looks up
DEF MAP_STEP = 16               # old-table slots a write's resize step moves
DEF SHARE_ROOM_DIVISOR = 8   # a full page shares with a neighbour 1/8 empty
DEF CAP_STEP = 4             # entries a page's allocation grows or shrinks by
DEF EVAC_PAGES = 2           # pages a write's evacuation step moves
DEF EVAC_MIN_DEAD = 262144   # dead page-heap bytes before any block is evacuated
DEF OP_SET = 0
DEF OP_SET_NEW = 1
DEF OP_SET_EXISTS = 2
DEF OP_SET_BETTER = 3
DEF OP_SET_WORSE = 4
DEF OP_INCR = 5
DEF OP_REMOVE = 6

# Pages and name records alive in every index of the process: tests use
# them to prove that indexes free everything they allocate.
cdef Py_ssize_t _live_pages = 0
cdef Py_ssize_t _live_names = 0


def live_pages():
    """Number of pages currently allocated, across all indexes."""
    return _live_pages


def live_names():
    """Number of member name records currently stored, across all arenas
    (a record shared by a board's indexes counts once; one that only
    indexes gone or cleared listed counts until a compaction drops it)."""
    return _live_names


# --- input validation, shared with the other native index (see the .pxi) ---

include "_index_common.pxi"

# --- the count tree: entries before a page (see the .pxi) ---

include "_pages_counts.pxi"


# A search result: the page a target belongs to, with the page whose link
# at each level leads to it or past it (the links a page linked after it
# splices in, or one unlinked splices out).
ctypedef struct pg_path:
    pg_page *update[MAX_LEVEL]


# A load's place (see _load): the page being filled, the last page on each
# level, the last entry's key, and the pages made without the GIL not yet
# counted in _live_pages.
ctypedef struct pg_loading:
    pg_page *page
    int fill
    double prev_key
    Py_ssize_t pages
    Py_ssize_t names             # names stored without the GIL, not yet counted in _live_names
    pg_page *last[MAX_LEVEL]
    pg_page *before[MAX_LEVEL]   # the page being filled: the page before it on each level


@cython.final
@cython.no_gc
cdef class Names:
    """The name arena of a board's indexes: each member's name stored once
    for all the windows and periods that hold it (see Members, "Shared
    by a board's indexes").  Give it to each index as ``names=``; an index
    made without one has an arena of its own.  Opaque: only the indexes
    of this module read it.  Not thread-safe: while one thread uses an
    index of the arena (a load runs without the GIL), no other may use
    another."""

    cdef uint32_t *names            # 4-byte units; id = offset in units (0 is never used)
    cdef size_t names_used, names_cap
    cdef uint32_t free_names[NAME_CLASSES]
    cdef size_t free_units          # units in the free lists' records
    cdef size_t dead_units          # units, about, of records that indexes gone or
                                    # cleared may have left listed by none
    cdef bint compacting            # a compaction is under way (see _compact_step)
    cdef size_t compact_src, compact_dst
    cdef Py_ssize_t records         # records stored, not in a free list nor swept away
    cdef Py_ssize_t sweep_kept      # during a compaction: records it kept, and
    cdef Py_ssize_t sweep_freed     # records freed behind it since it started
    cdef uint64_t hash_k0, hash_k1  # the member maps' key, shared so a name hashes once
    cdef void **members             # the indexes using the arena (borrowed: each
    cdef Py_ssize_t nmembers, members_cap  # leaves in its __dealloc__)

    def __cinit__(self):
        key = os.urandom(16)
        self.hash_k0 = int.from_bytes(key[:8], "little")
        self.hash_k1 = int.from_bytes(key[8:], "little")
        self._clear()

    def __dealloc__(self):
        global _live_names
        _live_names -= self.records
        free(self.names)
        free(self.members)

    cdef void _clear(self) noexcept:
        """Drop every record (no index lists any); ``names`` is NULL if
        out of memory (the index's ``_reset`` raises MemoryError)."""
        global _live_names
        _live_names -= self.records
        self.records = 0
        free(self.names)
        self.names_cap = 128
        self.names_used = 1
        self.free_units = self.dead_units = 0
        self.compacting = False
        self.compact_src = self.compact_dst = 0
        memset(self.free_names, 0, sizeof(self.free_names))
        self.names = <uint32_t *>malloc(self.names_cap * 4)

    cdef int _join(self, void *index) except -1:
        cdef void *grown
        if self.nmembers == self.members_cap:
            grown = realloc(self.members, (self.members_cap * 2 + 4) * sizeof(void *))
            if grown == NULL:
                raise MemoryError()
            self.members = <void **>grown
            self.members_cap = self.members_cap * 2 + 4
        self.members[self.nmembers] = index
        self.nmembers += 1
        return 0

    cdef void _leave(self, void *index) noexcept:
        cdef Py_ssize_t k
        for k in range(self.nmembers):
            if self.members[k] == index:
                self.members[k] = self.members[self.nmembers - 1]
                self.nmembers -= 1
                return

    @property
    def indexes(self):
        """How many indexes use the arena now."""
        return self.nmembers

    def _state(self):
        """``(records, units used, free units, compacting)`` (for tests)."""
        return self.records, self.names_used, self.free_units, bool(self.compacting)


@cython.final
# The collector must not drop ``arena`` before __dealloc__ leaves it (a
# freed index left listed in a shared arena is read by its siblings);
# the index refers to nothing else, so it is in no cycle to break.
@cython.no_gc_clear
cdef class RankIndex:
    """A leaderboard index in the compact paged layout: members ordered by
    score, best first.  See :mod:`rankd.index._contract` for the contract.

    Besides the contract's knobs, ``page_size`` (4..64, default 64: entry
    numbers are 6 bits) sets the entries a page holds; tests shrink it to
    force splits and merges.
    ``branching`` defaults to 2, not 4: a page is tall more often, but the
    levels are over pages, few enough that the height costs little, and a
    search steps onto fewer pages (each step onto a page is a cache miss).
    """

    cdef pg_page *header
    cdef Py_ssize_t length
    cdef Py_ssize_t ndistinct
    cdef Py_ssize_t member_bytes
    cdef Py_ssize_t peak_length
    cdef Py_ssize_t peak_member_bytes
    cdef int height
    cdef int max_level
    cdef uint32_t branching
    cdef uint64_t rng_state
    cdef int page_size
    cdef int min_fill
    cdef bint descending
    cdef bint tie_by_member
    cdef bint tie_member_desc
    cdef int seq_bytes              # per page entry: 0 (tied by member), 4 or 8
    cdef double key_sign            # a key is the score times this (-1: desc)
    cdef uint64_t _next_seq
    cdef uint64_t hash_k0, hash_k1
    cdef Py_ssize_t mutations
    cdef uint32_t memo_code         # the entry last written (its code), its rank, and
    cdef Py_ssize_t memo_rank       # the mutation count that rank is good for
    cdef Py_ssize_t memo_mutations
    cdef uint32_t put_code          # the code of the entry _put placed last
    cdef Py_ssize_t last_pos        # the position _locate found last (a hint)
    cdef Py_ssize_t locate_bytes    # a page's header, entry numbers and ids
    cdef uint8_t *load_tags         # while loading: a hash byte by code (see _load)
    # the name arena (the board's, shared by its indexes, or this one's own)
    cdef Names arena
    # member map: slots of codes (page number and entry number, see PG_CODE)
    cdef uint32_t *slot_ids
    cdef size_t nslots              # slots in the table (any size: see pg_home)
    cdef uint32_t *old_ids          # a resize under way: the table being emptied
    cdef size_t old_nslots, migrate_pos
    cdef Py_ssize_t map_moves       # ids a resize moved, ever (for tests)
    # page table
    cdef pg_page **pages
    cdef double *firstkeys          # by page number: the key of its first entry
    cdef pg_counts counts           # entries by page, for ranks (see _pages_counts.pxi)
    # towers: the pages' links, packed in chunks that never move
    cdef pg_link *free_towers[MAX_LEVEL + 1]
    cdef pg_link *tower_next
    cdef size_t tower_room
    cdef void **chunks
    cdef size_t nchunks, chunks_cap
    cdef uint32_t pages_cap         # room in pages (and at least in the three below)
    cdef uint32_t keys_cap, free_cap  # room in firstkeys and free_pnos
    cdef uint32_t *free_pnos
    cdef uint32_t nfree_pnos, pnos_used
    cdef uint32_t max_pnos          # page numbers are below it (MAX_PNOS; tests lower it)
    cdef size_t freed_bytes         # pages and tables freed since the last trim
    cdef Py_ssize_t left_sparse     # merges out of memory left a page sparse (ever: _check)
    cdef pg_pool pool               # the page heap (see "Where pages live")
    cdef size_t evac_at             # dead page bytes from which a write looks for a sparse block
    cdef bint evacuating            # blocks are being evacuated, one after another
    cdef size_t evac_min_dead       # EVAC_MIN_DEAD (tests lower it)
    cdef Py_ssize_t evacuated       # pages an evacuation moved, ever (for tests)
    # A batch's member hashes, by position & 15, and the str each is of
    # (see apply_batch); the hash the next _write takes instead of its own.
    cdef uint64_t ring_hash[16]
    cdef void *ring_obj[16]
    cdef bint has_hint
    cdef uint64_t hint_hash
    cdef Py_ssize_t trims           # heap trims, ever (for tests)
    cdef Py_ssize_t warmed          # operations apply_batch warmed (for tests)
    cdef Py_ssize_t warmed_ahead    # of which stay in their page (for tests)

    def __cinit__(self, order="desc", tie_break="first", *, int max_level=MAX_LEVEL,
                  int branching=2, seed=None, int page_size=DEFAULT_PAGE_SIZE,
                  Names names=None):
        pg_pool_init(&self.pool)
        ct_init(&self.counts, MIN_PAGE_SIZE)
        _options(order, tie_break, max_level, branching, seed)
        if not MIN_PAGE_SIZE <= page_size <= MAX_PAGE_SIZE:
            raise ValueError(f"page_size must be between {MIN_PAGE_SIZE} and "
                             f"{MAX_PAGE_SIZE}, got {page_size}")
        self.descending = order == "desc"
        self.tie_by_member = tie_break != "first"
        self.tie_member_desc = tie_break == "member_desc"
        self.seq_bytes = 0 if self.tie_by_member else 4
        self.key_sign = -1.0 if self.descending else 1.0
        self.max_level = max_level
        self.branching = branching
        self.page_size = page_size
        self.min_fill = page_size // 2
        ct_init(&self.counts, page_size)  # (a node of counts per page's worth of pages)
        self.max_pnos = MAX_PNOS
        self.evac_min_dead = EVAC_MIN_DEAD
        self._set_min_rest()
        self.locate_bytes = <Py_ssize_t>(sizeof(pg_page) + PG_ENOS_BYTES(page_size)
                                         + PG_IDS_BYTES(page_size))
        if seed is None:
            self.rng_state = int.from_bytes(os.urandom(8), "little")
        else:
            self.rng_state = (seed * 0x9E3779B97F4A7C15 + 1) & 0xFFFFFFFFFFFFFFFF
        if self.rng_state == 0:
            self.rng_state = 0x9E3779B97F4A7C15
        # The board's arena, or one of its own; the map is keyed by the
        # arena's key, so a name hashes the same in every index of it.
        self.arena = Names() if names is None else names
        self.hash_k0 = self.arena.hash_k0
        self.hash_k1 = self.arena.hash_k1
        self.arena._join(<void *>self)
        self.header = <pg_page *>calloc(1, PG_SIZE(0, 0, 0) + MAX_LEVEL * sizeof(pg_link))
        if self.header == NULL:
            raise MemoryError()
        self.header.level = <pg_link *>(<char *>self.header + PG_SIZE(0, 0, 0))
        self.header.height = MAX_LEVEL
        self._reset()

    def __dealloc__(self):
        self._free_all()
        free(self.header)
        if self.arena is not None:
            self.arena._leave(<void *>self)

    # --- memory: pages, names, member map --------------------------------------

    cdef void _free_all(self) noexcept:
        global _live_pages, _live_names
        cdef size_t i
        cdef pg_page *p
        cdef pg_page *nxt
        if self.header == NULL:
            return
        self._release_names()  # (first: it samples the pages)
        p = self.header.level[0].forward
        while p != NULL:
            _live_pages -= 1
            p = p.level[0].forward
        pg_pool_destroy(&self.pool)  # (every page at once)
        self.evac_at = self.evac_min_dead
        self.evacuating = False
        free(self.slot_ids)
        free(self.old_ids)
        self.old_ids = NULL
        self.old_nslots = self.migrate_pos = 0
        pg_array_free(self.pages, <size_t>self.pages_cap * 8)
        pg_array_free(self.firstkeys, <size_t>self.keys_cap * 8)
        pg_array_free(self.free_pnos, <size_t>self.free_cap * 4)
        pg_array_free(self.counts.where, <size_t>self.counts.where_cap * 4)
        self.pages_cap = self.keys_cap = self.free_cap = 0
        self.counts.where_cap = 0
        self.firstkeys = NULL
        self.counts.where = NULL
        ct_clear(&self.counts)
        free(self.load_tags)
        self.load_tags = NULL
        for i in range(self.nchunks):
            if i >= TOWER_BIG_AFTER:  # (a mapping: see _tower_alloc)
                pg_huge_unmap(self.chunks[i], TOWER_BIG * sizeof(pg_link))
            else:
                free(self.chunks[i])
        free(self.chunks)
        self.chunks = NULL
        self.nchunks = self.chunks_cap = 0
        self.tower_next = NULL
        self.tower_room = 0
        memset(self.free_towers, 0, sizeof(self.free_towers))
        self.slot_ids = NULL
        self.pages = NULL
        self.free_pnos = NULL

    cdef int _reset(self) except -1:
        """An empty index (the memory of any previous state freed first).
        MemoryError changes nothing; a page table it could not make is
        made by the first page (``_page_alloc``)."""
        cdef int i
        cdef uint32_t *ids = <uint32_t *>calloc(MIN_TABLE_SIZE, 4)
        if ids == NULL or self.arena.names == NULL:
            free(ids)
            raise MemoryError()
        self._free_all()
        for i in range(MAX_LEVEL):
            self.header.level[i].forward = NULL
            self.header.level[i].flevel = NULL
        self.height = 1
        self.length = 0
        self.ndistinct = 0
        self.member_bytes = 0
        self.peak_length = 0
        self.peak_member_bytes = 0
        self.nslots = MIN_TABLE_SIZE
        self.slot_ids = ids
        self.pages_cap = self.keys_cap = self.free_cap = 0
        self.counts.where_cap = 0
        self.nfree_pnos = 0
        self.pnos_used = 0
        self._grow_page_table(16)  # (out of memory: the first page makes it)
        return 0

    cdef int _random_height(self) noexcept nogil:
        cdef int level = 1
        cdef uint64_t x
        while level < self.max_level:
            x = self.rng_state
            x ^= x << 13
            x ^= x >> 7
            x ^= x << 17
            self.rng_state = x
            if (x >> 32) % self.branching != 0:
                break
            level += 1
        return level

    cdef pg_page *_new_page(self, int cap=0, bint wide=False) except NULL:
        """A fresh, unlinked, empty page with a page number, room for
        ``cap`` entries (0: ``_cap_for(0)``, the growth step).  Raises
        OverflowError (the page table is full) or MemoryError."""
        global _live_pages
        cdef pg_page *p = self._page_alloc(cap, wide)
        if p == NULL:
            if self.nfree_pnos == 0 and self.pnos_used >= self.max_pnos:
                raise _pages_full(self.max_pnos)
            raise MemoryError()
        _live_pages += 1
        return p

    cdef int _grow_page_table(self, size_t cap) noexcept nogil:
        """Room for ``cap`` page numbers; -1 if out of memory (the arrays
        grown so far keep their room: ``pages_cap``, grown last, says what
        all four hold).  Each array grows by ``pg_array_grow``: from
        64 KiB on, by mremap, so that no growth copies a big table (the
        kernel moves its page-table entries, not its bytes) or leaves a
        freed copy resident."""
        if (pg_array_reserve(<void **>&self.firstkeys, &self.keys_cap, cap, 8) < 0
                or pg_array_reserve(<void **>&self.counts.where, &self.counts.where_cap,
                                    cap, 4) < 0
                or pg_array_reserve(<void **>&self.free_pnos, &self.free_cap, cap, 4) < 0
                or pg_array_reserve(<void **>&self.pages, &self.pages_cap, cap, 8) < 0):
            return -1
        return 0

    cdef pg_page *_page_alloc(self, int cap, bint wide=False) noexcept nogil:
        """``_new_page`` without the GIL: NULL where it raises (nothing
        changed but the page table's room), and not counted in
        ``_live_pages`` (a C global other threads change with the GIL)."""
        cdef int h = self._random_height()
        cdef pg_page *p
        cdef uint32_t pno
        cdef size_t cap_pnos
        cdef void *grown
        if self.nfree_pnos == 0 and self.pnos_used >= self.max_pnos:
            return NULL  # every page number is taken (see Members)
        if self.nfree_pnos == 0 and self.pnos_used >= self.pages_cap:
            # By 3/2, not 2: the table (32 bytes a page number) is then at
            # least 2/3 used, not 1/2.
            cap_pnos = <size_t>self.pages_cap + self.pages_cap // 2
            if cap_pnos < 16:
                cap_pnos = 16  # (a table _reset could not make)
            if cap_pnos > MAX_PNOS:
                cap_pnos = MAX_PNOS
            if self._grow_page_table(cap_pnos) < 0:
                return NULL
        # (the nodes linking the page can make: a split a level and a root)
        if ct_reserve(&self.counts, self.counts.depth + 2) < 0:
            return NULL
        cdef pg_link *tower = self._tower_alloc(h)
        if tower == NULL:
            return NULL
        if cap <= 0:
            cap = self._cap_for(0)
        p = <pg_page *>pg_pool_alloc(&self.pool, PG_SIZE(cap, 8 if wide else 4, self.seq_bytes))
        if p == NULL:
            self._tower_free(tower, h)
            return NULL
        p.level = tower
        if self.nfree_pnos:
            self.nfree_pnos -= 1
            pno = self.free_pnos[self.nfree_pnos]
        else:
            pno = self.pnos_used
            self.pnos_used += 1
        p.prev = NULL
        p.n = 0
        p.lead = 0
        p.used = 0
        p.pno = pno
        p.height = h
        p.wide = wide
        p.cap = cap
        self.pages[pno] = p
        return p

    cdef void _free_page(self, pg_page *p) noexcept:
        global _live_pages
        self.pages[p.pno] = NULL
        self.free_pnos[self.nfree_pnos] = p.pno
        self.nfree_pnos += 1
        self._tower_free(p.level, p.height)
        self.freed_bytes += PG_SIZE(p.cap, PG_KEY_BYTES(p), self.seq_bytes)
        pg_pool_free(&self.pool, p)
        _live_pages -= 1

    # --- page allocations at their entries' size ------------------------------------

    cdef inline int _cap_for(self, Py_ssize_t n) noexcept nogil:
        """The allocation for a page of ``n`` entries: room for one more,
        rounded up to ``CAP_STEP`` entries, at most ``page_size``."""
        cdef Py_ssize_t cap = (n + CAP_STEP) // CAP_STEP * CAP_STEP
        return <int>(cap if cap < self.page_size else self.page_size)

    cdef pg_page *_resize(self, pg_page *p, int cap) noexcept:
        """Reallocate ``p`` (at least one entry) for ``cap`` entries, which
        hold its ``n``; return it at its new place, or NULL if out of memory
        (``p`` unchanged).  The arrays move to their offsets for ``cap``
        (keys and seqs follow the ids); if the page itself moved, the page
        table, the next page's ``prev`` and the links to it are repointed
        (``_repoint_moved``), so callers must take page pointers again."""
        cdef int old_cap = p.cap
        cdef size_t n = p.n, sb = <size_t>self.seq_bytes, kb = <size_t>PG_KEY_BYTES(p)
        cdef pg_page *q
        cdef char *old_ids
        cdef char *old_keys
        cdef char *old_seqs
        if cap == old_cap:
            return p
        if cap < old_cap:
            # Shrinking: move the arrays down first (lowest first), then
            # give back the end.
            old_ids = <char *>PG_IDS(p)
            old_keys = <char *>PG_KEYS(p)
            old_seqs = PG_SEQS(p)
            p.cap = <uint16_t>cap
            memmove(PG_IDS(p), old_ids, n * 4)
            memmove(PG_KEYS(p), old_keys, n * kb)
            if sb:
                memmove(PG_SEQS(p), old_seqs, n * sb)
            q = NULL
            if (pg_pool_room(p) - PG_SIZE(cap, kb, sb) < self.pool.min_rest
                    and not pg_pool_is_last(&self.pool, p)):
                # The end given back could hold no page: a hole no
                # allocation would take.  Move instead (the whole chunk
                # left is a page's worth), unless out of memory.
                q = self._page_move(p, PG_SIZE(cap, kb, sb))
            if q == NULL:
                pg_pool_shrink(&self.pool, p, PG_SIZE(cap, kb, sb))  # (in place)
                q = p
        else:
            if pg_pool_grow_in_place(&self.pool, p, PG_SIZE(cap, kb, sb)):
                q = p
            else:
                q = self._page_move(p, PG_SIZE(cap, kb, sb))
                if q == NULL:
                    return NULL
            # Growing: the seqs (last) move up first, then the keys, then
            # the ids (the entry numbers stay).
            old_ids = <char *>PG_IDS(q)
            old_keys = <char *>PG_KEYS(q)
            old_seqs = PG_SEQS(q)
            q.cap = <uint16_t>cap
            if sb:
                memmove(PG_SEQS(q), old_seqs, n * sb)
            memmove(PG_KEYS(q), old_keys, n * kb)
            memmove(PG_IDS(q), old_ids, n * 4)
        if q != p:
            self._repoint_moved(q)
            self.mutations += 1  # (a page moved: iterators must not go on)
        return q

    cdef void _set_min_rest(self) noexcept:
        """The least hole the page heap may leave: the chunk of the least
        page (``min_fill`` entries, narrow keys, this index's seqs).  A
        smaller hole is of no use to any page: splits and shrinks leave
        none (see ``_resize``)."""
        self.pool.min_rest = <uint32_t>(
            PG_SIZE(self._cap_for(self.min_fill - 1), 4, self.seq_bytes) + sizeof(pg_chunk))

    cdef pg_page *_page_move(self, pg_page *p, size_t size) noexcept:
        """``p`` copied to a chunk of ``size`` bytes (at least its own)
        and freed: the new page, not yet repointed, or NULL if out of
        memory (``p`` unchanged)."""
        cdef size_t old = pg_pool_room(p)
        cdef pg_page *q = <pg_page *>pg_pool_alloc(&self.pool, size)
        if q == NULL:
            return NULL
        memcpy(q, p, old if old < size else size)
        pg_pool_free(&self.pool, p)
        return q

    cdef void _evacuate_step(self) noexcept:
        """A write's step of the page heap's evacuation (see "Where pages
        live"): once its holes are a sixteenth of it (and
        ``evac_min_dead``), move the live pages of its sparsest block
        elsewhere, ``EVAC_PAGES`` a write, so that the block is freed when
        its last one leaves, and go on to the next sparsest until holes are
        under a 32nd; out of memory, it stops and waits as a failed pick
        does."""
        cdef pg_page *p
        cdef pg_page *q
        cdef int moved
        cdef size_t dead
        if self.pool.evac == NO_BLOCK:
            dead = pg_pool_dead(&self.pool)  # (at least evac_at: see _write)
            # Start at a sixteenth dead, go on down to a 32nd.
            if not pg_pool_pick_evac(&self.pool, 32 if self.evacuating else 16):
                self.evacuating = False
                # Nothing to do: look again once another sixteenth of
                # the heap is dead, not at every write.
                self.evac_at = dead + self.pool.bytes // 16
                return
            self.evacuating = True
            self.evac_at = self.evac_min_dead
        for moved in range(EVAC_PAGES):
            p = <pg_page *>pg_pool_evac_next(&self.pool)
            if p == NULL:
                return
            q = self._page_move(p, PG_SIZE(p.cap, PG_KEY_BYTES(p), self.seq_bytes))
            if q == NULL:
                self.pool.evac = NO_BLOCK
                self.evacuating = False
                self.evac_at = pg_pool_dead(&self.pool) + self.pool.bytes // 16
                return
            self._repoint_moved(q)
            self.mutations += 1  # (a page moved: iterators must not go on)
            self.evacuated += 1

    cdef void _repoint_moved(self, pg_page *q) noexcept:
        """``q`` (at least one entry, its first key in ``firstkeys``) was
        reallocated: point the page table, its next page's ``prev`` and the
        link before it on each of its levels at its new place.  The links
        are found by a search for its first entry that reads pages through
        the page table (a link's own ``forward`` may be the old address) and
        stops at the link whose forward page number is ``q``'s."""
        cdef pg_link *lv = self.header.level
        cdef pg_page *nxt = q.level[0].forward
        cdef double key = self._key_at(q, 0), k
        cdef uint64_t seq = self._seq(q, 0)
        cdef Py_ssize_t mlen
        cdef const char *name = self._name(PG_IDS(q)[0], &mlen)
        cdef int i, c
        self.pages[q.pno] = q
        if nxt != NULL:
            nxt.prev = q
        if q.height == 1:  # (half the pages) the link before it is prev's
            (q.prev if q.prev != NULL else self.header).level[0].forward = q
            return
        for i in range(self.height - 1, -1, -1):
            while lv[i].forward != NULL and lv[i].fpno != q.pno:
                k = self.firstkeys[lv[i].fpno]
                if k != key:
                    c = -1 if k < key else 1
                else:
                    c = self._cmp(self.pages[lv[i].fpno], 0, key, seq, name, mlen)
                if c >= 0:
                    break
                lv = lv[i].flevel
            if i < q.height:
                lv[i].forward = q

    cdef pg_page *_grow(self, pg_page *p, pg_page **cover) except NULL:
        """Room for one more entry in ``p`` (which holds fewer than
        ``page_size``): ``p`` at its place after growing by ``CAP_STEP``
        entries, with ``cover`` (a search path's covering pages) repointed.
        Raises MemoryError, changing nothing."""
        cdef pg_page *q
        if p.n < p.cap:
            return p
        q = self._resize(p, self._cap_for(p.n))
        if q == NULL:
            raise MemoryError()
        self._repoint_cover(p, q, cover)
        return q

    cdef inline void _repoint_cover(self, pg_page *old, pg_page *new, pg_page **cover) noexcept:
        """Point ``cover`` (a search path's covering pages, or NULL) at
        ``new`` wherever it held ``old``, a page that moved."""
        cdef int i
        if new != old and cover != NULL:
            for i in range(self.height):
                if cover[i] == old:
                    cover[i] = new

    cdef pg_page *_widen_copy(self, pg_page *p) noexcept nogil:
        """A copy of ``p`` with f64 keys (its int32 scores made keys), ``p``
        freed; NULL if out of memory (``p`` unchanged).  Nothing that points
        at ``p`` is repointed."""
        cdef pg_page *q = <pg_page *>pg_pool_alloc(&self.pool, PG_SIZE(p.cap, 8, self.seq_bytes))
        cdef Py_ssize_t i
        if q == NULL:
            return NULL
        memcpy(q, p, PG_SIZE(p.cap, 0, 0))  # header, numbers, ids
        q.wide = 1
        for i in range(p.n):
            PG_KEYS(q)[i] = self._key_at(p, i)
        if self.seq_bytes:
            memcpy(PG_SEQS(q), PG_SEQS(p), p.n * self.seq_bytes)
        self.freed_bytes += PG_SIZE(p.cap, 4, self.seq_bytes)
        pg_pool_free(&self.pool, p)
        # A page moved: iterators and dumps in chunks must not go on, even
        # if the write that moved it is then refused.
        self.mutations += 1
        return q

    cdef pg_page *_widen_page(self, pg_page *p) noexcept:
        """``p`` (linked, at least one entry) with f64 keys, at its new
        place, the page table, its next page's ``prev`` and the links to it
        repointed (``_repoint_moved``); NULL if out of memory (``p``
        unchanged).  Callers must take page pointers again."""
        cdef pg_page *q
        if p.wide:
            return p
        q = self._widen_copy(p)
        if q != NULL:
            self._repoint_moved(q)
        return q

    cdef pg_page *_widened(self, pg_page *p, pg_page **cover) except NULL:
        """``_widen_page``, with ``cover`` (a search path's covering pages,
        or NULL) repointed too; raises MemoryError, changing nothing."""
        cdef pg_page *q = self._widen_page(p)
        if q == NULL:
            raise MemoryError()
        self._repoint_cover(p, q, cover)
        return q

    cdef bint _all_narrow(self, pg_page *p, Py_ssize_t start, Py_ssize_t count) noexcept:
        """Whether entries ``start``..``start + count - 1`` of ``p`` have
        keys a narrow page can hold."""
        cdef Py_ssize_t i
        if not p.wide:
            return True
        for i in range(start, start + count):
            if not self._narrow(PG_KEYS(p)[i]):
                return False
        return True

    cdef void _shrink(self, pg_page *p) noexcept:
        """Give back a page's room beyond ``CAP_STEP`` spare entries (none
        in a full page is kept), and a wide page's 4 bytes a key once a
        narrow page holds its keys again (``_narrow_page``); nothing if out
        of memory.  ``p`` may move (callers take page pointers again)."""
        if p.wide and p.n >= 1 and self._all_narrow(p, 0, p.n):
            p = self._narrow_page(p)
        if p.n >= 1 and p.cap >= p.n + 2 * CAP_STEP:
            self._resize(p, self._cap_for(p.n))

    cdef pg_page *_narrow_page(self, pg_page *p) noexcept:
        """``p`` (linked, wide, at least one entry, every key ``_narrow``)
        with int32 keys, converted in place and given back the bytes it no
        longer needs, in place (returned: it does not move).  So
        a page that took a fraction (or a score past int32) once does not
        stay wide after the key leaves: the writes that take the wide key
        out or change it call this through ``_shrink``."""
        cdef size_t n = p.n, sb = <size_t>self.seq_bytes
        cdef char *old_seqs = PG_SEQS(p)
        cdef Py_ssize_t i
        cdef pg_page *q
        cdef int32_t scores[MAX_PAGE_SIZE]
        # Through a copy: the int32 keys overlay the f64 keys they come from.
        for i in range(p.n):
            scores[i] = <int32_t>(PG_KEYS(p)[i] * self.key_sign)
        memcpy(PG_KEYS32(p), scores, n * 4)
        p.wide = 0
        if sb:
            memmove(PG_SEQS(p), old_seqs, n * sb)
        self.freed_bytes += PG_SIZE(p.cap, 8, sb) - PG_SIZE(p.cap, 4, sb)
        self.mutations += 1  # (its keys changed width: iterators must not go on)
        pg_pool_shrink(&self.pool, p, PG_SIZE(p.cap, 4, sb))  # (in place)
        return p

    cdef inline size_t _held(self) noexcept:
        """Bytes in the pages, the map and the name arena (an estimate)."""
        return (<size_t>(self.pnos_used - self.nfree_pnos) * PG_SIZE(self.page_size, 4, self.seq_bytes)
                + self.nslots * 4 + self.arena.names_used * 4)

    cdef void _trim_step(self) noexcept:
        """After removals: once the pages and tables freed since the last
        trim reach a sixteenth of what the index holds (and 1 MiB), give the
        heap's free memory back to the system.  glibc keeps freed pages
        resident otherwise, so a board that lost half its members would
        keep the RSS of the full one.  The cadence bounds the cost: a trim
        walks the heap's free chunks (about 1.5 ms on a heap holding a 1M
        board, bench/README.md), and comes at most once per sixteenth of the
        board removed."""
        if self.freed_bytes >= (1 << 20) and self.freed_bytes >= self._held() // 16:
            self.freed_bytes = 0
            self.trims += 1
            with nogil:
                pg_trim()

    cdef pg_link *_tower_alloc(self, int height) noexcept nogil:
        """Links for a page of ``height`` levels, from the chunks of towers
        (a freed tower of that height first); NULL if out of memory."""
        cdef pg_link *tower = self.free_towers[height]
        cdef void *grown
        cdef size_t room
        if tower != NULL:
            self.free_towers[height] = tower[0].flevel  # the next free one
            return tower
        if self.tower_room < <size_t>height:
            if self.nchunks == self.chunks_cap:
                grown = realloc(self.chunks, (self.chunks_cap * 2 + 4) * sizeof(void *))
                if grown == NULL:
                    return NULL
                self.chunks = <void **>grown
                self.chunks_cap = self.chunks_cap * 2 + 4
            room = TOWER_BIG if self.nchunks >= TOWER_BIG_AFTER else TOWER_CHUNK
            if room == TOWER_BIG:
                self.tower_next = <pg_link *>pg_huge_map(room * sizeof(pg_link))
            else:
                self.tower_next = <pg_link *>malloc(room * sizeof(pg_link))
            if self.tower_next == NULL:
                self.tower_room = 0
                return NULL
            self.chunks[self.nchunks] = self.tower_next
            self.nchunks += 1
            self.tower_room = room
        tower = self.tower_next
        self.tower_next += height
        self.tower_room -= height
        return tower

    cdef void _tower_free(self, pg_link *tower, int height) noexcept nogil:
        """Keep ``tower`` for the next page of that height (a free list by
        height, linked through the first link's ``flevel``)."""
        tower[0].flevel = self.free_towers[height]
        self.free_towers[height] = tower

    cdef inline const char *_name(self, uint32_t mid, Py_ssize_t *mlen) noexcept nogil:
        cdef const uint8_t *rec = <const uint8_t *>&self.arena.names[mid]
        mlen[0] = <Py_ssize_t>rec[0] + 1
        return <const char *>(rec + 1)

    cdef inline uint64_t _seq(self, pg_page *p, Py_ssize_t i) noexcept nogil:
        """Entry ``i``'s arrival sequence (0 on boards tied by member, whose
        pages keep none: the order never reads it)."""
        if self.seq_bytes == 4:
            return (<uint32_t *>PG_SEQS(p))[i]
        return 0 if self.seq_bytes == 0 else (<uint64_t *>PG_SEQS(p))[i]

    cdef inline void _set_seq(self, pg_page *p, Py_ssize_t i, uint64_t seq) noexcept nogil:
        """Store entry ``i``'s seq (which ``_fit_seq`` made fit)."""
        if self.seq_bytes == 4:
            (<uint32_t *>PG_SEQS(p))[i] = <uint32_t>seq
        elif self.seq_bytes == 8:
            (<uint64_t *>PG_SEQS(p))[i] = seq

    cdef inline double _key_at(self, pg_page *p, Py_ssize_t i) noexcept nogil:
        """Entry ``i``'s key (a narrow entry holds the score: 0 is +0.0's key)."""
        if not p.wide:
            return <double>PG_KEYS32(p)[i] * self.key_sign
        return PG_KEYS(p)[i]

    cdef inline void _set_key(self, pg_page *p, Py_ssize_t i, double key) noexcept nogil:
        """Store entry ``i``'s key (``p`` is wide unless it is ``_narrow``)."""
        if not p.wide:
            PG_KEYS32(p)[i] = <int32_t>(key * self.key_sign)
        else:
            PG_KEYS(p)[i] = key

    cdef inline bint _narrow(self, double key) noexcept nogil:
        """Whether ``key``'s score is an int32 (and not -0.0), which a
        narrow entry holds exactly."""
        cdef double score = key * self.key_sign
        return (-2147483648.0 <= score <= 2147483647.0
                and score == <double><int32_t>score
                and not (score == 0.0 and signbit(score)))

    cdef int _fit_seq(self, uint64_t seq) except -1:
        """Make the pages able to hold ``seq``: the first seq past 2^32 - 1
        widens every page's seqs to 64 bits, once (O(n)).  Returns 1 if it
        did (every page moved: page pointers held are stale); a MemoryError
        leaves every page as it was."""
        if not self._seq_widens(seq):
            return 0
        self._rewiden_seqs()
        return 1

    cdef inline bint _seq_widens(self, uint64_t seq) noexcept:
        """Whether holding ``seq`` widens every page's seqs (``_fit_seq``)."""
        return self.seq_bytes == 4 and seq >> 32 != 0  # (a C test: no Python int)

    cdef int _rewiden_seqs(self) except -1:
        """Move every page to 64-bit seqs (O(n)); a MemoryError changes
        nothing.  Each page keeps its key width."""
        cdef uint32_t pno, i
        cdef pg_page *p
        cdef pg_page *q
        cdef pg_page **fresh
        cdef int level
        fresh = <pg_page **>calloc(self.pnos_used + 1, sizeof(pg_page *))
        if fresh == NULL:
            raise MemoryError()
        # Allocate every wider page first, so that running out of memory
        # changes nothing.
        for pno in range(self.pnos_used):
            p = self.pages[pno]
            if p != NULL:
                fresh[pno] = <pg_page *>pg_pool_alloc(&self.pool, PG_SIZE(p.cap, PG_KEY_BYTES(p), 8))
                if fresh[pno] == NULL:
                    for i in range(pno):
                        if fresh[i] != NULL:
                            pg_pool_free(&self.pool, fresh[i])
                    free(fresh)
                    raise MemoryError()
        for pno in range(self.pnos_used):
            p = self.pages[pno]
            if p == NULL:
                continue
            q = fresh[pno]
            memcpy(q, p, PG_SIZE(p.cap, PG_KEY_BYTES(p), 0))  # header, numbers, ids, keys
            for i in range(p.n):
                (<uint64_t *>PG_SEQS(q))[i] = (<uint32_t *>PG_SEQS(p))[i]
            self.freed_bytes += PG_SIZE(p.cap, PG_KEY_BYTES(p), 4)
            pg_pool_free(&self.pool, p)
            self.pages[pno] = q
        free(fresh)
        self.seq_bytes = 8
        self._set_min_rest()
        self.mutations += 1  # (every page moved: see _widen_copy)
        # Links and prev pointers name pages by address: repoint them (the
        # towers themselves do not move).
        for pno in range(self.pnos_used):
            p = self.pages[pno]
            if p == NULL:
                continue
            for level in range(p.height):
                if p.level[level].forward != NULL:
                    p.level[level].forward = self.pages[p.level[level].fpno]
        for level in range(self.height):
            if self.header.level[level].forward != NULL:
                self.header.level[level].forward = self.pages[self.header.level[level].fpno]
        q = NULL
        p = self.header.level[0].forward
        while p != NULL:
            p.prev = q
            q = p
            p = p.level[0].forward
        return 0

    cdef uint32_t _name_new(self, const char *member, Py_ssize_t mlen,
                            uint64_t h) except 0:
        """The id of a name for a member new to this index (``h``: its
        hash): another index of the arena's record of it, or a new record.
        Raises OverflowError (the arena is full) or MemoryError."""
        global _live_names
        cdef uint32_t mid = 0
        if self.arena.nmembers > 1:  # (an arena of its own: nothing to look up)
            mid = self._shared_id(member, mlen, h)
            if mid != 0:
                return mid
        mid = self._name_put(member, mlen)
        if mid == 0:
            if self.arena.names_used + PG_NAME_UNITS(mlen) >= MOVED:
                raise OverflowError("the name arena of a rank index is full (16 GiB)")
            raise MemoryError()
        _live_names += 1
        return mid

    cdef uint32_t _shared_id(self, const char *member, Py_ssize_t mlen,
                             uint64_t h) noexcept nogil:
        """The record another index of the arena lists for ``member``
        (``h``: its hash), or 0.  Every index of an arena that holds a
        member lists the same record (a member new to one takes another's
        record, here), so the first found is the one."""
        cdef Py_ssize_t k
        cdef uint32_t mid
        for k in range(self.arena.nmembers):
            if self.arena.members[k] != <void *>self:
                mid = (<RankIndex>self.arena.members[k])._listed_id(member, mlen, h)
                if mid != 0:
                    return mid
        return 0

    cdef uint32_t _listed_id(self, const char *member, Py_ssize_t mlen,
                             uint64_t h) noexcept nogil:
        """The record this index lists for ``member``, or 0 if absent: a
        probe that reads, of each slot with the member's tag, the entry
        number, id and name only (another index's pages, which its
        ``_prefetch_listed`` asked for line by line, not ``_locate``'s
        whole head of a page)."""
        cdef size_t i
        cdef uint32_t code, tag = PG_HASH_TAG(h), mid
        cdef pg_page *p
        cdef Py_ssize_t pos, nlen
        cdef const char *name
        if self.old_ids != NULL:  # a resize under way: both tables
            code = self._slot_code(self._slot(member, mlen, h))
            if code == 0:
                return 0
            return PG_IDS(self._locate(code, &pos))[pos]
        i = pg_home(h, self.nslots)
        while True:
            code = self.slot_ids[i]
            if code == 0:
                return 0
            if PG_CODE_TAG(code) == tag:
                p = self.pages[PG_CODE_PNO(code)]
                pos = pg_find_eno(PG_ENOS(p), p.n, PG_CODE_ENO(code))
                mid = PG_IDS(p)[pos]
                name = self._name(mid, &nlen)
                if nlen == mlen and memcmp(name, member, mlen) == 0:
                    return mid
            i = i + 1 if i + 1 < self.nslots else 0

    cdef inline void _prefetch_listed(self, uint64_t h, int stage) noexcept nogil:
        """Ask for what ``_listed_id`` of the hash ``h`` will read, a stage
        at a time, each after the one before had time to arrive: 0 the
        home slot; then of the first slot with ``h``'s tag, 1 its page's
        header and entry numbers, 2 the line of the entry's id, 3 the
        name (only the lines the lookup reads: a page's ids are a few
        lines, one of them this entry's)."""
        cdef uint32_t code
        cdef pg_page *p
        cdef Py_ssize_t pos
        if stage == 0:
            rk_prefetch(&self.slot_ids[pg_home(h, self.nslots)])
            return
        code = self._tagged_code(h)
        if code == 0:
            return
        p = self.pages[PG_CODE_PNO(code)]
        if stage == 1:
            rk_prefetch(p)
            rk_prefetch(<char *>p + 64)
            return
        pos = pg_find_eno(PG_ENOS(p), p.n, PG_CODE_ENO(code))
        if pos < 0:
            return
        if stage == 2:
            rk_prefetch(&PG_IDS(p)[pos])
        else:
            pg_prefetch_rec(&self.arena.names[PG_IDS(p)[pos]])

    cdef void _names_reserve(self, size_t units, size_t filled) noexcept:
        """Room for ``units`` more units of records at the arena's end, in
        one block (a hint: out of memory, the arena grows as it goes).  A
        load that knows its names' bytes takes it before storing any, so
        that a big arena is advised 2 MiB pages before it is touched (a
        block that doubles as it fills moves, and its pages touched
        before the advice stay small)."""
        cdef size_t cap = self.arena.names_used + units
        cdef void *grown
        if cap <= self.arena.names_cap or cap >= MOVED:
            return
        grown = realloc(self.arena.names, cap * 4)
        if grown == NULL:
            return
        pg_advise_huge_filled(grown, (self.arena.names_used + filled) * 4, cap * 4)
        self.arena.names = <uint32_t *>grown
        self.arena.names_cap = cap

    cdef inline uint32_t _name_put(self, const char *member, Py_ssize_t mlen) noexcept nogil:
        """A new record of a name, without the GIL: 0 where ``_name_new``
        raises (nothing changed), and not counted in ``_live_names``."""
        cdef size_t units = PG_NAME_UNITS(mlen)
        cdef uint32_t mid = 0 if self.arena.compacting else self.arena.free_names[units]
        cdef uint8_t *rec
        cdef void *grown
        cdef size_t cap
        if mid != 0:
            self.arena.free_names[units] = self.arena.names[mid + 1]
            self.arena.free_units -= units
        else:
            if self.arena.names_used + units > self.arena.names_cap:
                cap = self.arena.names_cap * 2
                while cap < self.arena.names_used + units:
                    cap *= 2
                if self.arena.names_used + units >= MOVED:
                    return 0
                if cap > MOVED:
                    cap = MOVED
                grown = realloc(self.arena.names, cap * 4)
                if grown == NULL:
                    return 0
                pg_advise_huge_filled(grown, self.arena.names_used * 4, cap * 4)
                self.arena.names = <uint32_t *>grown
                self.arena.names_cap = cap
            mid = <uint32_t>self.arena.names_used
            self.arena.names_used += units
        self.arena.records += 1
        rec = <uint8_t *>&self.arena.names[mid]
        rec[0] = <uint8_t>(mlen - 1)
        pg_copy_short(<char *>rec + 1, member, mlen)
        return mid

    cdef void _name_free(self, uint32_t mid) noexcept:
        """Give up the record ``mid`` of a member this index no longer
        lists: freed, unless another index of the arena lists it."""
        global _live_names
        cdef Names arena = self.arena
        cdef Py_ssize_t mlen
        cdef const char *name = self._name(mid, &mlen)
        cdef size_t units = PG_NAME_UNITS(mlen)
        if arena.nmembers > 1 and self._shared_id(name, mlen, self._hash(name, mlen)) == mid:
            return
        _live_names -= 1
        arena.records -= 1
        if arena.compacting and mid >= arena.compact_dst:
            return  # past the compacted part: the sweep leaves it out
        if arena.compacting:
            arena.sweep_freed += 1  # (kept by the sweep, then freed)
        # (the length byte stays: the compaction's sweep reads every
        # record's size; the link takes the second unit)
        arena.names[mid + 1] = arena.free_names[units]
        arena.free_names[units] = mid
        arena.free_units += units
        self._compact_if_due()

    cdef void _compact_if_due(self) noexcept:
        """Start a compaction once a quarter of the arena is free records
        (that arrivals did not take back) or, about, records that indexes
        gone or cleared may have left listed by none."""
        cdef Names arena = self.arena
        # A small arena's free records are taken back by arrivals, so it
        # is not compacted for them; records left by indexes gone or
        # cleared are in no free list, and only the compaction drops them.
        if (not arena.compacting
                and (arena.names_used > MIN_COMPACT_UNITS or arena.dead_units > 0)
                and (arena.free_units + arena.dead_units) * 4 > arena.names_used):
            # Compact it, a few records per write.
            arena.compacting = True
            arena.compact_src = arena.compact_dst = 1
            memset(arena.free_names, 0, sizeof(arena.free_names))
            arena.free_units = arena.dead_units = 0
            arena.sweep_kept = arena.sweep_freed = 0

    cdef void _release_names(self) noexcept:
        """Give up every member's name (the index is being emptied or
        freed).  Alone in its arena, the index drops every record.  An
        arena shared with other indexes keeps them: finding which are
        listed by none would be a lookup per member in each other index,
        O(n) in one call.  The arena's compaction tells the live records
        from the dead by looking them up anyway, a few per write: it is
        started once, by this estimate, a quarter of the arena may be
        dead.  The estimate is the index's records times the share of
        ``DEAD_SAMPLES`` of its entries (one a page, pages spread over
        the board) that no other index lists, plus one: a retired period
        whose members all stay on ``all`` adds about a 65th of its
        records, not all of them, so it does not start a sweep of the
        arena that would find nothing to drop."""
        cdef Names arena = self.arena
        cdef size_t units, step, pno
        cdef Py_ssize_t sampled = 0, unlisted = 0, mlen
        cdef pg_page *p
        cdef uint32_t mid
        cdef const char *name
        if arena is None:
            return
        if arena.nmembers <= 1:
            arena._clear()
            return
        if self.length == 0:
            return
        step = self.pnos_used // DEAD_SAMPLES + 1
        for pno in range(0, self.pnos_used, step):
            p = self.pages[pno]
            if p == NULL or p.n == 0:
                continue
            mid = PG_IDS(p)[p.n // 2]
            name = self._name(mid, &mlen)
            sampled += 1
            unlisted += self._shared_id(name, mlen, self._hash(name, mlen)) != mid
        # (units of the records: a length byte and the name, in 4-byte units)
        units = <size_t>(self.member_bytes + 4 * self.length) // 4 + <size_t>self.length
        arena.dead_units += units * <size_t>(unlisted + 1) // <size_t>(sampled + 1)
        self._compact_if_due()

    cdef void _compact_step(self) noexcept:
        """Move the next live records of the arena down over the free ones
        (a sliding compaction: ``compact_dst`` and ``compact_src`` walk up
        the arena; live records below ``compact_dst`` are packed, those at
        or above ``compact_src`` are not yet looked at).  It looks at
        ``COMPACT_STEP`` units a call, once per write of any index of the
        arena, so no write stalls; new names go to the arena's end
        meanwhile (the free lists are emptied when a compaction starts,
        and only records freed below ``compact_dst`` join them).  When the
        sweep reaches the end, the arena is cut to its live records and its
        memory given back."""
        global _live_names
        cdef Names arena = self.arena
        cdef size_t budget = COMPACT_STEP, units, cap, swept
        cdef uint32_t src, dst
        cdef Py_ssize_t mlen, live
        cdef void *shrunk
        while budget > 0 and arena.compact_src < arena.names_used:
            src = <uint32_t>arena.compact_src
            self._name(src, &mlen)
            units = PG_NAME_UNITS(mlen)
            if self._repoint(src, <uint32_t>arena.compact_dst):
                dst = <uint32_t>arena.compact_dst
                memmove(&arena.names[dst], &arena.names[src], units * 4)
                arena.compact_dst += units
                arena.sweep_kept += 1
            arena.compact_src += units
            budget -= units if units < budget else budget
        if arena.compact_src >= arena.names_used:
            swept = arena.names_used
            arena.names_used = arena.compact_dst
            arena.compacting = False
            # The records it did not keep and nobody freed were listed by
            # none (left by indexes gone or cleared): dropped with it.
            live = arena.sweep_kept - arena.sweep_freed
            _live_names -= arena.records - live
            arena.records = live
            # Room for an eighth more, in whole 4 KiB pages (a power of
            # two kept up to twice the live records); the room was touched
            # before the removals, so its pages are given back too (they
            # cost nothing resident until names are stored there again).
            cap = (arena.names_used + arena.names_used // 8 + 1023) // 1024 * 1024
            if cap < 128:
                cap = 128
            if cap < arena.names_cap:
                self.freed_bytes += (arena.names_cap - cap) * 4
                shrunk = realloc(arena.names, cap * 4)
                if shrunk != NULL:
                    arena.names = <uint32_t *>shrunk
                    arena.names_cap = cap
            if swept > arena.names_cap:
                swept = arena.names_cap
            if swept > arena.names_used:
                pg_release(&arena.names[arena.names_used], (swept - arena.names_used) * 4)

    cdef bint _repoint(self, uint32_t old, uint32_t new) noexcept:
        """If the record ``old`` is a live member's, give it the id ``new``
        in every index of the arena that lists it.  The entries are found
        through the member maps by the record's name: a live record's name
        finds its member, whose entry lists it; a free or dead record's
        name (a free one's bytes from the fifth on hold the free list's
        link) finds no member or another record's member, whose entry
        lists another id.  The maps' codes name entries, not records, so
        nothing else changes."""
        cdef Names arena = self.arena
        cdef Py_ssize_t pos, mlen, k
        cdef const char *name = self._name(old, &mlen)
        cdef uint64_t h = self._hash(name, mlen)
        cdef RankIndex index
        cdef uint32_t code
        cdef pg_page *p
        cdef bint live = False
        for k in range(arena.nmembers):
            index = <RankIndex>arena.members[k]
            code = index._slot_code(index._slot(name, mlen, h))
            if code == 0:
                continue
            p = index._locate(code, &pos)
            if PG_IDS(p)[pos] == old:
                PG_IDS(p)[pos] = new
                live = True
        return live

    cdef inline uint64_t _hash(self, const char *member, Py_ssize_t mlen) noexcept nogil:
        return rk_siphash13(self.hash_k0, self.hash_k1, member, mlen)

    cdef inline Py_ssize_t _slot(self, const char *member, Py_ssize_t mlen,
                                 uint64_t h) noexcept nogil:
        """The map slot holding ``member``: ``i >= 0`` in the table, ``-2 - i``
        in the old table of a resize under way, or -1 if it is in neither.
        During a resize a member whose old home slot the step has not
        reached yet is most likely still in the old table: that one is
        probed first (a probe that misses reads a name per slot it passes,
        so probing the wrong table first cost every lookup of a resize a
        few more misses)."""
        cdef Py_ssize_t found
        if self.old_ids != NULL and pg_home(h, self.old_nslots) >= self.migrate_pos:
            found = self._probe_old(member, mlen, h)
            return found if found != -1 else self._probe_new(member, mlen, h)
        found = self._probe_new(member, mlen, h)
        if found != -1 or self.old_ids == NULL:
            return found
        return self._probe_old(member, mlen, h)

    cdef inline Py_ssize_t _probe_new(self, const char *member, Py_ssize_t mlen,
                                      uint64_t h) noexcept nogil:
        """``_slot`` in the table only."""
        cdef size_t i = pg_home(h, self.nslots)
        cdef uint32_t code, tag = PG_HASH_TAG(h)
        cdef Py_ssize_t nlen
        cdef const char *name
        while True:
            code = self.slot_ids[i]
            if code == 0:
                return -1
            # Another tag is another member: its page and name stay unread.
            if PG_CODE_TAG(code) == tag:
                name = self._code_name(code, &nlen)
                if nlen == mlen and memcmp(name, member, mlen) == 0:
                    return <Py_ssize_t>i
            i = i + 1 if i + 1 < self.nslots else 0

    cdef Py_ssize_t _probe_old(self, const char *member, Py_ssize_t mlen,
                               uint64_t h) noexcept nogil:
        """``_slot`` in the old table of a resize under way only."""
        cdef size_t i = pg_home(h, self.old_nslots), left
        cdef uint32_t code, tag = PG_HASH_TAG(h)
        cdef Py_ssize_t nlen
        cdef const char *name
        # Slots before the resize step are all moved marks, so a probe
        # jumps over them; it looks at each other slot once at most (near
        # the end of a resize they may hold no empty slot).
        left = self.old_nslots - self.migrate_pos
        while left > 0:
            if i < self.migrate_pos:
                i = self.migrate_pos
            code = self.old_ids[i]
            if code == 0:
                return -1
            if PG_CODE_TAG(code) == tag and code != MOVED:
                name = self._code_name(code, &nlen)
                if nlen == mlen and memcmp(name, member, mlen) == 0:
                    return -2 - <Py_ssize_t>i
            i = i + 1 if i + 1 < self.old_nslots else 0
            left -= 1
        return -1

    cdef inline uint32_t _tagged_code(self, uint64_t h) noexcept nogil:
        """The first code from the hash ``h``'s home slot on (up to 8
        slots, in the table only) whose tag is ``h``'s, or 0: the entry a
        lookup will most likely read, for the prefetches (a member absent
        gives 0 15 times in 16 per slot passed, and nothing is asked for)."""
        cdef size_t i = pg_home(h, self.nslots)
        cdef uint32_t code, tag = PG_HASH_TAG(h)
        cdef int k
        for k in range(8):
            code = self.slot_ids[i]
            if code == 0:
                return 0
            if PG_CODE_TAG(code) == tag:
                return code
            i = i + 1 if i + 1 < self.nslots else 0
        return 0

    cdef inline uint32_t _slot_code(self, Py_ssize_t slot) noexcept nogil:
        """The code in a slot that ``_slot`` found (0 for -1)."""
        if slot >= 0:
            return self.slot_ids[slot]
        return 0 if slot == -1 else self.old_ids[-2 - slot]

    cdef inline void _slot_set(self, Py_ssize_t slot, uint32_t code) noexcept nogil:
        """Give a slot that ``_slot`` found (not -1) another code."""
        if slot >= 0:
            self.slot_ids[slot] = code
        else:
            self.old_ids[-2 - slot] = code

    cdef inline uint32_t _lookup(self, const char *member, Py_ssize_t mlen) noexcept:
        """The code of ``member``'s entry, or 0 if absent."""
        return self._slot_code(self._slot(member, mlen, self._hash(member, mlen)))

    cdef void _map_put(self, uint32_t code, uint64_t h) noexcept nogil:
        cdef size_t i = pg_home(h, self.nslots)
        while self.slot_ids[i] != 0:
            i = i + 1 if i + 1 < self.nslots else 0
        self.slot_ids[i] = code

    cdef inline void _hash_names(self, const uint32_t *ids, Py_ssize_t count,
                                 uint64_t *hashes) noexcept nogil:
        """Hash the names of the records ``ids`` into ``hashes`` and ask for
        their home slots: in two passes, so that the names' misses overlap
        (all asked for first), then the slots'."""
        cdef Py_ssize_t k, mlen
        cdef const char *name
        for k in range(count):
            pg_prefetch_rec(&self.arena.names[ids[k]])
        for k in range(count):
            name = self._name(ids[k], &mlen)
            hashes[k] = self._hash(name, mlen)
            rk_prefetch(&self.slot_ids[pg_home(hashes[k], self.nslots)])

    cdef void _reslot(self, const uint32_t *olds, const uint32_t *news,
                      const uint32_t *ids, Py_ssize_t count) noexcept:
        """Entries moved to another page: give the slots holding the codes
        ``olds`` the codes ``news`` (both without their tags, which the
        members' hashes give: the members' name ids are ``ids``).  A slot
        is found by its member's hash and holds exactly one code, so it is
        recognised by the code, not by comparing names.  In three passes,
        so that the misses overlap: the names, their hashes (and home
        slots), the slots."""
        cdef Py_ssize_t k
        cdef uint64_t hashes[64]
        cdef size_t i, left
        cdef uint32_t old, new
        self._hash_names(ids, count, hashes)
        for k in range(count):
            old = PG_RETAG(olds[k], PG_HASH_TAG(hashes[k]))
            new = PG_RETAG(news[k], PG_HASH_TAG(hashes[k]))
            i = pg_home(hashes[k], self.nslots)
            while self.slot_ids[i] != 0:
                if self.slot_ids[i] == old:
                    self.slot_ids[i] = new
                    break
                i = i + 1 if i + 1 < self.nslots else 0
            else:
                # Not in the table: in the old table of a resize under way
                # (as _probe_old walks it).
                i = pg_home(hashes[k], self.old_nslots)
                left = self.old_nslots - self.migrate_pos
                while left > 0:
                    if i < self.migrate_pos:
                        i = self.migrate_pos
                    if self.old_ids[i] == old:
                        self.old_ids[i] = new
                        break
                    i = i + 1 if i + 1 < self.old_nslots else 0
                    left -= 1

    cdef int _map_reserve(self, Py_ssize_t members) except -1:
        """Make room for ``members`` (at most 3/4 of the table).  Growing to
        hold one more member starts an incremental resize (each later write
        moves a step of it); growing by more (a load) resizes at once.
        Tables grow through the sizes 2^k and 3 * 2^(k-1) (steps of 3/2 and
        4/3, not 2: a map 3/8 to 3/4 full after doubling is 1/2 to 3/4 full
        here, about a sixth fewer bytes a member on average)."""
        cdef size_t size = self.nslots
        while <size_t>members * 4 > size * 3:
            size = _next_table_size(size)
        if size == self.nslots:
            pass
        elif <size_t>members <= <size_t>self.length + 1:
            self._map_resize(size, False)
        else:
            self._map_resize(size, True)
        return 0

    cdef void _map_shrink(self) noexcept:
        """After a removal: shrink the map once the next smaller table size
        (2^k or 3 * 2^(k-1)) would hold it at most 2/3 full (it is then
        below 1/2 or 4/9 full), to the smallest size that does, so removals
        give the memory back: a board that lost a random half of its
        members has the map a board of the rest grows to.  Growing and
        shrinking never chase each other: a growth at 3/4 leaves the map at
        least 1/2 full in a 3 * 2^(k-1) table and 9/16 in a 2^k one, 1/9
        fewer members from the next shrink, and moving the old table takes
        1/12 of the members in writes (at most 4/3 slots a member,
        ``MAP_STEP`` a write); a shrink leaves it at most 2/3 full, 1/8
        more members from the next growth, and moving the old table takes
        1/14 (at most 9/4 slots a member, twice ``MAP_STEP`` a write)."""
        cdef size_t size
        if self.nslots <= MIN_TABLE_SIZE or self.old_ids != NULL:
            return
        size = _prev_table_size(self.nslots)
        if <size_t>self.length * 3 > size * 2:
            return
        while size > MIN_TABLE_SIZE and <size_t>self.length * 3 <= _prev_table_size(size) * 2:
            size = _prev_table_size(size)
        if size >= self.nslots:
            return
        try:
            self._map_resize(size, False)
        except MemoryError:
            pass  # the bigger map stays: still correct

    cdef int _map_resize(self, size_t size, bint now) except -1:
        """Give the map a new, empty table of ``size`` slots and keep the
        current one as the old table, whose ids ``_map_step`` moves over a
        few slots per later insert or removal (as Redis's dict rehashes):
        no single write pays for moving the whole map.  Lookups meanwhile
        probe both tables, puts go to the new one.  With ``now`` (or when
        a resize is still under way) the old table is emptied at once."""
        cdef uint32_t *ids
        self._map_finish()
        ids = <uint32_t *>calloc(size, 4)
        if ids == NULL:
            raise MemoryError()
        pg_advise_huge(ids, size * 4)
        self.old_ids = self.slot_ids
        self.old_nslots = self.nslots
        self.migrate_pos = 0
        self.slot_ids = ids
        self.nslots = size
        if now:
            self._map_finish()
        return 0

    cdef inline void _map_advance(self) noexcept:
        """A write's share of a resize under way: ``MAP_STEP`` slots of
        the old table; while it shrinks, enough steps that the old table
        is empty before the map can grow again, which is at least 1/12 of
        the new table's size in inserts away (see ``_map_shrink``): twice
        the step after a shrink by one size, more after a load that sized
        the map for more records than it kept members (a walked dump)."""
        cdef size_t steps
        self._map_step()
        if self.old_ids != NULL and self.old_nslots > self.nslots:
            steps = (12 * self.old_nslots + MAP_STEP * self.nslots - 1) // (MAP_STEP * self.nslots)
            while steps > 1 and self.old_ids != NULL:
                self._map_step()
                steps -= 1

    cdef void _map_finish(self) noexcept nogil:
        """Move what is left of an old table."""
        while self.old_ids != NULL:
            self._map_step()

    cdef void _map_step(self) noexcept nogil:
        """Move the codes of the next ``MAP_STEP`` slots of the old table to
        the new one (a moved slot reads ``MOVED``, so that probes for the
        codes past it still walk over it); free the old table at its end."""
        cdef size_t i, end
        cdef Py_ssize_t pos, j, k = 0
        cdef uint32_t codes[MAP_STEP]
        cdef uint64_t hashes[MAP_STEP]
        cdef uint32_t ids[MAP_STEP]
        cdef uint32_t *at[MAP_STEP]
        cdef pg_page *pgs[MAP_STEP]
        cdef pg_page *p
        if self.old_ids == NULL:
            return
        end = self.migrate_pos + MAP_STEP
        if end > self.old_nslots:
            end = self.old_nslots
        # In passes over the step's codes, so that the misses overlap
        # instead of queueing: ask for the pages the codes name (header
        # and entry numbers), then for the ids of the entries found there,
        # then for the names; hash them and ask for their new slots; put.
        for i in range(self.migrate_pos, end):
            codes[k] = self.old_ids[i]
            self.old_ids[i] = MOVED
            if codes[k] != 0 and codes[k] != MOVED:
                p = self.pages[PG_CODE_PNO(codes[k])]
                pgs[k] = p
                rk_prefetch(p)
                rk_prefetch(<char *>p + 64)
                k += 1
        for j in range(k):
            p = pgs[j]
            pos = pg_find_eno(PG_ENOS(p), p.n, PG_CODE_ENO(codes[j]))
            at[j] = &PG_IDS(p)[pos]
            rk_prefetch(at[j])
        for j in range(k):
            ids[j] = at[j][0]
        self._hash_names(ids, k, hashes)
        for j in range(k):
            self._map_put(codes[j], hashes[j])
        self.map_moves += k
        self.migrate_pos = end
        if end == self.old_nslots:
            self.freed_bytes += self.old_nslots * 4
            free(self.old_ids)
            self.old_ids = NULL
            self.old_nslots = 0
            self.migrate_pos = 0

    cdef void _map_remove(self, Py_ssize_t slot) noexcept:
        """Empty a slot that ``_slot`` found: by backward shift in the table,
        by marking it moved in an old table (which takes no puts)."""
        if slot >= 0:
            self._map_delete(slot)
        else:
            self.old_ids[-2 - slot] = MOVED

    cdef void _map_delete(self, size_t hole) noexcept:
        """Empty slot ``hole`` by backward shift (no tombstones)."""
        cdef size_t j = hole, home
        cdef Py_ssize_t mlen
        cdef const char *name
        while True:
            j = j + 1 if j + 1 < self.nslots else 0
            if self.slot_ids[j] == 0:
                break
            name = self._code_name(self.slot_ids[j], &mlen)
            home = pg_home(self._hash(name, mlen), self.nslots)
            # Move j into the hole unless its home lies cyclically in (hole, j].
            if (j > hole and (home <= hole or home > j)) or (j < hole and home <= hole and home > j):
                self.slot_ids[hole] = self.slot_ids[j]
                hole = j
        self.slot_ids[hole] = 0

    # --- ordering ----------------------------------------------------------------

    cdef inline double _key(self, double score) noexcept nogil:
        return -score if self.descending else score

    cdef inline double _score_of(self, double key) noexcept nogil:
        return -key if self.descending else key

    cdef inline int _cmp(self, pg_page *p, Py_ssize_t i, double key, uint64_t seq,
                         const char *member, Py_ssize_t mlen) noexcept nogil:
        """Entry ``i`` of ``p`` against the target: < 0 before, 0 same, > 0 after."""
        cdef double k = self._key_at(p, i)
        cdef uint64_t s
        cdef Py_ssize_t nlen
        cdef const char *name
        cdef int c
        if k != key:
            return -1 if k < key else 1
        if not self.tie_by_member:
            s = self._seq(p, i)
            if s != seq:
                return -1 if s < seq else 1
        name = self._name(PG_IDS(p)[i], &nlen)
        c = memcmp(name, member, nlen if nlen < mlen else mlen)
        if c == 0:
            c = (nlen > mlen) - (nlen < mlen)
        return -c if self.tie_member_desc else c

    cdef inline Py_ssize_t _lower(self, pg_page *p, double key, uint64_t seq,
                                  const char *member, Py_ssize_t mlen) noexcept:
        """Entries of ``p`` sorting strictly before the target."""
        cdef Py_ssize_t lo = 0, hi = p.n, mid
        while lo < hi:
            mid = (lo + hi) >> 1
            if self._cmp(p, mid, key, seq, member, mlen) < 0:
                lo = mid + 1
            else:
                hi = mid
        return lo

    # --- searching ---------------------------------------------------------------

    cdef pg_page *_search(self, double key, uint64_t seq, const char *member,
                          Py_ssize_t mlen, bint strict, pg_path *path) noexcept:
        """The page the target belongs in: the last page whose first entry
        sorts before the target (``strict``) or at or before it, else the
        first page (NULL if there is none).  ``path`` gets, per level, the
        last page before it (or the header) of those that level links."""
        cdef pg_page *x = self.header
        cdef pg_link *lv = x.level     # x's tower: a search reads no page but ties
        cdef pg_page *f
        cdef int i, c
        cdef double k
        for i in range(self.height - 1, -1, -1):
            while True:
                f = lv[i].forward
                if f == NULL:
                    break
                pg_prefetch_step(lv, i, self.firstkeys)
                k = self.firstkeys[lv[i].fpno]
                if k != key:
                    c = -1 if k < key else 1
                else:
                    c = self._cmp(f, 0, key, seq, member, mlen)
                if c > 0 or (strict and c == 0):
                    break
                lv = lv[i].flevel
                x = f
            path.update[i] = x
        if x == self.header:
            return x.level[0].forward
        return x

    cdef pg_page *_search_key(self, double key, bint inclusive) noexcept:
        """The last page whose first key is < ``key`` (<= if ``inclusive``),
        or the header."""
        cdef pg_page *x = self.header
        cdef pg_link *lv = x.level
        cdef pg_page *f
        cdef int i
        cdef double k
        for i in range(self.height - 1, -1, -1):
            while True:
                f = lv[i].forward
                if f == NULL:
                    break
                pg_prefetch_step(lv, i, self.firstkeys)
                k = self.firstkeys[lv[i].fpno]
                if k > key or (k == key and not inclusive):
                    break
                lv = lv[i].flevel
                x = f
        return x

    cdef Py_ssize_t _count_before_key(self, double key, bint inclusive) noexcept:
        """Entries whose key is < ``key`` (<= with ``inclusive``)."""
        cdef Py_ssize_t lo, hi, mid
        cdef pg_page *p = self._search_key(key, inclusive)
        cdef double k
        if p == self.header:
            return 0
        ct_prefetch(&self.counts, p.pno, False)  # (its miss overlaps the page's)
        lo = 0
        hi = p.n
        while lo < hi:
            mid = (lo + hi) >> 1
            k = self._key_at(p, mid)
            if k < key or (inclusive and k == key):
                lo = mid + 1
            else:
                hi = mid
        return ct_before(&self.counts, p.pno, NULL) + lo

    cdef Py_ssize_t _better_than(self, pg_page *p, Py_ssize_t pos) noexcept:
        """Entries whose key is < entry ``pos`` of ``p``'s (``_count_before_key``
        of its key): those before the run of equal keys it is in.  A run
        that starts in ``p`` (or at its first entry) needs only the count
        tree's entries before ``p``; one that comes from an earlier page,
        a search by key."""
        cdef Py_ssize_t i = pos
        cdef pg_page *q = p.prev
        while i > 0 and self._same_key(p, i - 1, p, pos):
            i -= 1
        if i > 0 or q == NULL or not self._same_key(q, q.n - 1, p, pos):
            return ct_before(&self.counts, p.pno, NULL) + i
        return self._count_before_key(self._key_at(p, pos), False)

    cdef pg_page *_page_at(self, Py_ssize_t rank, Py_ssize_t *pos) noexcept:
        """The page and position of 1-based ``rank`` (1 <= rank <= length):
        down the count tree."""
        cdef Py_ssize_t before = 0
        cdef pg_page *p = self.pages[ct_page_at(&self.counts, rank - 1, &before)]
        pos[0] = rank - before - 1
        return p

    cdef inline pg_page *_locate(self, uint32_t code, Py_ssize_t *pos) noexcept nogil:
        """The page and position of the entry whose code is ``code``."""
        cdef pg_page *p = self.pages[PG_CODE_PNO(code)]
        cdef uint32_t e = PG_CODE_ENO(code)
        cdef Py_ssize_t i
        # The header, the entry numbers and the ids are a few lines at a
        # known place: ask for them all at once, so that their misses
        # overlap (the numbers give the position, the ids the name).
        for i in range(64, self.locate_bytes, 64):
            rk_prefetch(<char *>p + i)
        # A lookup locates its entry twice (its probe compares the name,
        # the caller reads the entry): the place found last is tried
        # first, and is right if the page holds that number there.
        i = self.last_pos
        if <size_t>i < p.n and PG_ENOS(p)[i] == e:
            pos[0] = i
            return p
        i = pg_find_eno(PG_ENOS(p), p.n, e)
        pos[0] = i
        if i >= 0:
            self.last_pos = i
        return p

    cdef inline const char *_code_name(self, uint32_t code, Py_ssize_t *mlen) noexcept nogil:
        """The name of the member whose entry's code is ``code``."""
        cdef Py_ssize_t pos
        cdef pg_page *p = self._locate(code, &pos)
        return self._name(PG_IDS(p)[pos], mlen)

    cdef Py_ssize_t _rank_of(self, uint32_t code, Py_ssize_t *dense) noexcept:
        """Unique rank of a present member, by its code (and its dense
        rank if asked): the count tree's entries (and leaders) before the
        page, whose leaf is asked for with the page, so that its miss
        overlaps the page's (see _pages_counts.pxi), and the member's
        place in the page."""
        cdef Py_ssize_t pos, rank, leaders
        cdef pg_page *p
        cdef uint32_t pno = PG_CODE_PNO(code)
        if dense == NULL and code == self.memo_code and self.memo_mutations == self.mutations:
            return self.memo_rank
        ct_prefetch(&self.counts, pno, dense != NULL)
        p = self._locate(code, &pos)
        if dense == NULL:
            return ct_before(&self.counts, pno, NULL) + pos + 1
        rank = ct_before(&self.counts, pno, &leaders) + pos + 1
        # (the page's leaders up to the member: its own count, less the
        # runs that start after it; the page before is not read)
        dense[0] = leaders + p.lead - self._key_changes(p, pos + 1, p.n)
        return rank

    cdef Py_ssize_t _rank_in(self, uint32_t code, pg_page *p, Py_ssize_t pos) noexcept:
        """Unique rank of the entry whose code is ``code``, found at ``pos``
        of ``p``."""
        if code == self.memo_code and self.memo_mutations == self.mutations:
            return self.memo_rank
        return self._rank_at(p, pos)

    cdef inline Py_ssize_t _rank_at(self, pg_page *p, Py_ssize_t pos) noexcept nogil:
        """Unique rank of entry ``pos`` of ``p``: the count tree's entries
        before ``p`` and its position."""
        return ct_before(&self.counts, p.pno, NULL) + pos + 1

    # --- leaders ---------------------------------------------------------------

    cdef inline bint _lead0(self, pg_page *p) noexcept:
        """Whether ``p``'s first entry starts a run of equal scores."""
        cdef pg_page *q = p.prev
        return q == NULL or not self._same_key(q, q.n - 1, p, 0)

    cdef inline bint _alone(self, pg_page *p, Py_ssize_t i) noexcept:
        """Whether entry ``i`` of ``p`` ties neither neighbour (the one
        before entry 0 is the previous page's last, read only then).  Keys
        are sorted, so taking such an entry out of a page, or putting one
        in, changes the page's leaders by one, and any other by none:
        writes count leaders around the entry, not over the page."""
        cdef pg_page *q
        if i + 1 < p.n and self._same_key(p, i + 1, p, i):
            return False
        if i > 0:
            return not self._same_key(p, i - 1, p, i)
        q = p.prev
        return q == NULL or not self._same_key(q, q.n - 1, p, 0)

    cdef inline bint _same_key(self, pg_page *p, Py_ssize_t i, pg_page *q,
                               Py_ssize_t j) noexcept nogil:
        """Whether entry ``i`` of ``p`` and entry ``j`` of ``q`` have equal keys."""
        if not p.wide and not q.wide:
            return PG_KEYS32(p)[i] == PG_KEYS32(q)[j]
        return self._key_at(p, i) == self._key_at(q, j)

    cdef inline uint32_t _key_changes(self, pg_page *p, Py_ssize_t start,
                                      Py_ssize_t end) noexcept nogil:
        """How many of entries start..end-1 of ``p`` (start >= 1) differ
        from the one before."""
        cdef uint32_t count = 0
        cdef Py_ssize_t i
        cdef double *keys
        cdef int32_t *narrow
        if not p.wide:
            narrow = PG_KEYS32(p)
            for i in range(start, end):
                count += narrow[i] != narrow[i - 1]
        else:
            keys = PG_KEYS(p)
            for i in range(start, end):
                count += keys[i] != keys[i - 1]
        return count

    cdef inline bint _next_lead(self, pg_page *p) noexcept:
        """Whether the first entry of the page after ``p`` (non-empty)
        starts a run: from the first-key array, without reading that page."""
        if p.level[0].forward == NULL:
            return False
        return self._key_at(p, p.n - 1) != self.firstkeys[p.level[0].fpno]

    cdef uint32_t _leaders(self, pg_page *p, bint first=True) noexcept:
        """Leaders in ``p`` (without its first entry unless ``first``)."""
        cdef uint32_t count = 0
        if p.n == 0:
            return 0
        if first:
            count = self._lead0(p)
        return count + self._key_changes(p, 1, p.n)

    # --- accounting: the count tree counts each page's entries and leaders ---

    cdef inline void _account(self, pg_page *p, int64_t dn, int64_t dl) noexcept:
        """``p`` gained ``dn`` entries and ``dl`` leaders: the count tree
        counts them (the only count kept above the pages)."""
        if dn or dl:
            ct_add(&self.counts, p.pno, dn, dl)
        self.ndistinct += dl

    cdef void _relead(self, pg_page *p) noexcept:
        """Re-count the leaders of ``p`` (non-empty) and account the change."""
        cdef uint32_t lead
        if p == NULL:
            return
        lead = self._leaders(p)
        if lead != p.lead:
            self._account(p, 0, <int64_t>lead - p.lead)
            p.lead = lead

    cdef void _relead_next(self, pg_page *p, bint before) noexcept:
        """After a change at the end of ``p``: the next page's first entry
        was a leader (``before``); account any change of that."""
        cdef pg_page *q = p.level[0].forward
        cdef bint after
        if q == NULL:
            return
        after = self._next_lead(p)
        if after != before:
            q.lead += <int>after - <int>before
            self._account(q, 0, <int>after - <int>before)

    # --- entries in pages ---------------------------------------------------------

    cdef void _move_entries(self, pg_page *dst, Py_ssize_t at, pg_page *src,
                            Py_ssize_t start, Py_ssize_t count) noexcept:
        """Move entries src[start:start+count] to dst[at:] (another page,
        with room): they take entry numbers ``dst`` does not use and give
        theirs back to ``src``, and their map slots get the new codes."""
        cdef Py_ssize_t i
        cdef uint32_t e
        cdef uint32_t olds[64]
        cdef uint32_t news[64]
        cdef uint8_t *src_enos = PG_ENOS(src)
        cdef uint8_t *dst_enos = PG_ENOS(dst)
        cdef size_t kb = <size_t>PG_KEY_BYTES(src)
        if dst.wide == src.wide:
            memcpy(<char *>PG_KEYS(dst) + at * kb, <char *>PG_KEYS(src) + start * kb, count * kb)
        else:  # (converted: a narrow page is never given a key it cannot hold)
            for i in range(count):
                self._set_key(dst, at + i, self._key_at(src, start + i))
        if self.seq_bytes:
            memcpy(PG_SEQS(dst) + at * self.seq_bytes,
                   PG_SEQS(src) + start * self.seq_bytes, count * self.seq_bytes)
        memcpy(&PG_IDS(dst)[at], &PG_IDS(src)[start], count * 4)
        for i in range(count):
            e = src_enos[start + i]
            src.used &= ~(<uint64_t>1 << e)
            olds[i] = PG_CODE(0, src.pno, e)   # (_reslot tags them)
            e = pg_free_eno(dst.used)
            dst.used |= <uint64_t>1 << e
            dst_enos[at + i] = <uint8_t>e
            news[i] = PG_CODE(0, dst.pno, e)
        self._reslot(olds, news, &PG_IDS(dst)[at], count)

    cdef inline void _shift_entries(self, pg_page *p, Py_ssize_t start, Py_ssize_t end,
                                    Py_ssize_t by) noexcept:
        """Move entries start..end-1 of ``p`` by ``by`` places (memmove)."""
        cdef size_t kb = <size_t>PG_KEY_BYTES(p)
        memmove(<char *>PG_KEYS(p) + (start + by) * kb, <char *>PG_KEYS(p) + start * kb,
                (end - start) * kb)
        if self.seq_bytes:
            memmove(PG_SEQS(p) + (start + by) * self.seq_bytes,
                    PG_SEQS(p) + start * self.seq_bytes, (end - start) * self.seq_bytes)
        memmove(&PG_IDS(p)[start + by], &PG_IDS(p)[start], (end - start) * 4)
        memmove(&PG_ENOS(p)[start + by], &PG_ENOS(p)[start], end - start)

    cdef void _link_after(self, pg_page *p, pg_page *r, pg_path *path) noexcept:
        """Link the empty page ``r`` right after ``p`` (a page, or the
        header of an empty index), whose search gave ``path``."""
        cdef int i
        cdef pg_page *x
        cdef pg_page *nxt
        while self.height < r.height:
            i = self.height
            self.header.level[i].forward = NULL
            self.header.level[i].flevel = NULL
            path.update[i] = self.header
            self.height += 1
        for i in range(r.height):
            x = p if i < p.height else path.update[i]
            r.level[i].forward = x.level[i].forward
            r.level[i].flevel = x.level[i].flevel
            r.level[i].fpno = x.level[i].fpno
            x.level[i].forward = r
            x.level[i].flevel = r.level
            x.level[i].fpno = r.pno
        r.prev = NULL if p == self.header else p
        nxt = r.level[0].forward
        if nxt != NULL:
            nxt.prev = r
        ct_insert_after(&self.counts, CT_NONE if p == self.header else p.pno, r.pno)

    cdef void _unlink_page(self, pg_page *r, pg_page **preds) noexcept:
        """Unlink ``r``, whose entries are gone or were moved into its
        previous page: ``preds[i]`` is the page before it on level ``i``."""
        cdef int i
        cdef pg_page *nxt = r.level[0].forward
        # Its entries, if any, went to the page before it.
        cdef uint32_t leads
        cdef uint32_t moved = ct_remove(&self.counts, r.pno, &leads)
        if moved or leads:
            ct_add(&self.counts, r.prev.pno, moved, leads)
        for i in range(self.height):
            if i < r.height:
                preds[i].level[i].forward = r.level[i].forward
                preds[i].level[i].flevel = r.level[i].flevel
                preds[i].level[i].fpno = r.level[i].fpno
        if nxt != NULL:
            nxt.prev = r.prev
        while self.height > 1 and self.header.level[self.height - 1].forward == NULL:
            self.height -= 1
        self._free_page(r)

    cdef Py_ssize_t _insert(self, double key, uint64_t seq, uint32_t mid,
                            uint32_t tag) except -1:
        """Place a new entry for the name ``mid`` (whose hash's tag is
        ``tag``); return its unique rank (its code is left in
        ``put_code``: the caller puts it in the map)."""
        cdef Py_ssize_t mlen, pos, half, rank
        cdef const char *name = self._name(mid, &mlen)
        cdef pg_path path
        cdef pg_page *p = self._search(key, seq, name, mlen, False, &path)
        cdef pg_page *r
        cdef pg_page *nxt
        cdef uint32_t lead
        cdef int room
        cdef bint wide = not self._narrow(key)
        if p == NULL:  # empty index
            r = self._new_page(0, wide)
            self._link_after(self.header, r, &path)
            return self._put(r, 0, key, seq, mid, tag)
        pos = self._lower(p, key, seq, name, mlen)
        if p.n < self.page_size:
            p = self._grow(p, path.update)
            if wide and not p.wide:  # (a key its int32 scores cannot hold)
                p = self._widened(p, path.update)
            return self._put(p, pos, key, seq, mid, tag)
        nxt = p.level[0].forward
        if pos == p.n and nxt == NULL:
            # At the end of the last page, start an empty page (monotonic
            # arrivals then fill pages whole).
            r = self._new_page(0, wide)
            self._link_after(p, r, &path)
            return self._put(r, 0, key, seq, mid, tag)
        # Full: a neighbour with room takes a share first (B*-tree style),
        # so that pages split only when both are nearly full and random
        # arrivals keep pages about 5/6 full, not 2/3; else split in halves.
        room = max(2, p.cap // SHARE_ROOM_DIVISOR)  # 2: both keep room after
        if nxt != NULL and nxt.n + room <= self.page_size:
            if self._even(p, nxt) < 0:
                raise MemoryError()
            return self._insert(key, seq, mid, tag)
        if p.prev != NULL and p.prev.n + room <= self.page_size:
            if self._even(p.prev, p) < 0:
                raise MemoryError()
            return self._insert(key, seq, mid, tag)
        half = p.n // 2
        if wide and pos <= half and not p.wide:
            p = self._widened(p, path.update)
        # The new page is wide only if it takes a key a narrow one cannot hold.
        r = self._new_page(self._cap_for(p.n - half),
                           (wide and pos > half) or not self._all_narrow(p, half, p.n - half))
        self._link_after(p, r, &path)
        self._move_entries(r, 0, p, half, p.n - half)
        self.firstkeys[r.pno] = self._key_at(r, 0)
        r.n = p.n - half
        p.n = half
        lead = self._leaders(p)
        r.lead = self._leaders(r)
        self._account(p, -<int64_t>r.n, <int64_t>lead - p.lead)
        self._account(r, r.n, r.lead)
        self.ndistinct -= <int64_t>lead - p.lead + r.lead  # moved, not new
        p.lead = lead
        if pos <= half:
            rank = self._put(p, pos, key, seq, mid, tag)
        else:
            rank = self._put(r, pos - half, key, seq, mid, tag)
        self._shrink(p)
        return rank

    cdef Py_ssize_t _put(self, pg_page *p, Py_ssize_t pos, double key,
                         uint64_t seq, uint32_t mid, uint32_t tag) noexcept:
        """Insert an entry at ``pos`` of ``p`` (not full); return its rank.
        Its leaders change only around ``pos`` (the new entry and the one it
        pushes on): counted there, not over the page; the next page is read
        only if its first entry's leadership changes."""
        cdef bint next_lead = False
        cdef int64_t dl
        if pos == p.n:
            next_lead = self._next_lead(p)
        cdef uint32_t e = pg_free_eno(p.used)
        self._shift_entries(p, pos, p.n, 1)
        self._set_key(p, pos, key)
        self._set_seq(p, pos, seq)
        PG_IDS(p)[pos] = mid
        PG_ENOS(p)[pos] = <uint8_t>e
        p.used |= <uint64_t>1 << e
        self.put_code = PG_CODE(tag, p.pno, e)
        if pos == 0:
            self.firstkeys[p.pno] = key
        p.n += 1
        self.length += 1
        dl = self._alone(p, pos)
        self._account(p, 1, dl)
        p.lead = <uint32_t>(p.lead + dl)
        if pos == p.n - 1:
            self._relead_next(p, next_lead)
        return self._rank_at(p, pos)  # (the count tree's lines ct_add just read)

    cdef void _remove(self, uint32_t code) noexcept:
        """Take a present member's entry out, by its code (its name stays,
        and its map slot: the caller empties it or gives it another code first,
        since the entries this moves are found in the map by code)."""
        cdef Py_ssize_t pos, mlen
        cdef pg_page *p = self._locate(code, &pos)
        cdef const char *name = self._name(PG_IDS(p)[pos], &mlen)
        cdef double key = self._key_at(p, pos)
        cdef uint64_t seq = self._seq(p, pos)
        cdef pg_path path
        cdef pg_page *nxt
        cdef bint next_lead = False
        cdef int64_t dl
        self.length -= 1
        p.used &= ~(<uint64_t>1 << PG_ENOS(p)[pos])
        if p.n == 1:
            self._search(key, seq, name, mlen, True, &path)
            nxt = p.level[0].forward
            self._account(p, -1, -<int64_t>p.lead)
            p.n = 0
            p.lead = 0
            self._unlink_page(p, path.update)
            self._relead(nxt)
            return
        if pos == p.n - 1:
            next_lead = self._next_lead(p)
        dl = -<int64_t>self._alone(p, pos)
        self._shift_entries(p, pos + 1, p.n, -1)
        p.n -= 1
        self.firstkeys[p.pno] = self._key_at(p, 0)
        self._account(p, -1, dl)
        p.lead = <uint32_t>(p.lead + dl)
        if pos == p.n:
            self._relead_next(p, next_lead)
        elif pos == 0:
            pass  # its own first entry's leadership was re-counted above
        if p.n < self.min_fill and p.level[0].forward != NULL:
            self._rebalance(p)
        else:
            self._shrink(p)

    cdef void _rebalance(self, pg_page *p) noexcept:
        """``p`` fell below the minimum fill: merge it with a neighbour when
        the two fit in one page, else even the two out."""
        cdef pg_page *a
        cdef pg_page *b
        cdef pg_path path
        cdef Py_ssize_t mlen
        cdef const char *name
        if p.level[0].forward == NULL:
            return  # the last page may hold fewer
        a, b = p, p.level[0].forward
        if a.n + b.n <= self.page_size:
            if a.n + b.n > a.cap:
                a = self._resize(a, self._cap_for(a.n + b.n))
                if a == NULL:
                    self.left_sparse += 1
                    return  # out of memory: the page stays sparse
                b = a.level[0].forward
            if not a.wide and not self._all_narrow(b, 0, b.n):
                a = self._widen_page(a)
                if a == NULL:
                    self.left_sparse += 1
                    return  # out of memory: the page stays sparse
                b = a.level[0].forward
            name = self._name(PG_IDS(b)[0], &mlen)
            self._search(self._key_at(b, 0), self._seq(b, 0), name, mlen, True, &path)
            self._move_entries(a, a.n, b, 0, b.n)
            a.n += b.n
            a.lead += b.lead
            b.n = 0
            self._unlink_page(b, path.update)
            self._shrink(a)  # (the entry that left it may have been its last wide key)
            return
        if self._even(a, b) < 0:
            self.left_sparse += 1  # out of memory: the page stays sparse

    cdef int _even(self, pg_page *a, pg_page *b) noexcept:
        """Share the entries of ``a`` and its next page ``b`` out evenly
        (the second of them gets the odd one); -1 if out of memory for the
        page that gains (nothing changed)."""
        cdef Py_ssize_t move, total
        cdef uint32_t lead_a, lead_b
        cdef int64_t dn
        total = a.n + b.n
        # The page that gains grows first (it may move), the other shrinks
        # after.
        if a.n < b.n and <Py_ssize_t>a.cap < total // 2:
            a = self._resize(a, self._cap_for(total // 2))
            if a == NULL:
                return -1
            b = a.level[0].forward
        elif a.n >= b.n and <Py_ssize_t>b.cap < total - total // 2:
            b = self._resize(b, self._cap_for(total - total // 2))
            if b == NULL:
                return -1
            a = b.prev
        # The page that gains widens if it takes a key it cannot hold.
        if a.n < b.n and not a.wide and not self._all_narrow(b, 0, total // 2 - a.n):
            a = self._widen_page(a)
            if a == NULL:
                return -1
            b = a.level[0].forward
        elif (a.n >= b.n and not b.wide
                and not self._all_narrow(a, total // 2, a.n - total // 2)):
            b = self._widen_page(b)
            if b == NULL:
                return -1
            a = b.prev
        lead_a, lead_b = a.lead, b.lead
        if a.n < b.n:
            move = total // 2 - a.n
            self._move_entries(a, a.n, b, 0, move)
            self._shift_entries(b, move, b.n, -move)
            dn = move
        else:
            move = a.n - total // 2
            self._shift_entries(b, 0, b.n, move)
            self._move_entries(b, 0, a, a.n - move, move)
            dn = -move
        a.n += dn
        b.n -= dn
        self.firstkeys[a.pno] = self._key_at(a, 0)
        self.firstkeys[b.pno] = self._key_at(b, 0)
        # Entries moved between two neighbours: the count tree moves them.
        a.lead = self._leaders(a)
        b.lead = self._leaders(b)
        self._account(a, dn, <int64_t>a.lead - lead_a)
        self._account(b, -dn, <int64_t>b.lead - lead_b)
        self.ndistinct -= (<int64_t>a.lead - lead_a) + (<int64_t>b.lead - lead_b)
        self._shrink(b if dn > 0 else a)
        # The page that gained may have lost its last wide key before (a
        # removal that left it sparse): it narrows too.
        if (a if dn > 0 else b).wide:
            self._shrink(a if dn > 0 else b)
        return 0

    # --- the one write path ---------------------------------------------------------

    cdef Py_ssize_t _write(self, const char *data, Py_ssize_t size, double value, int op,
                           bint has_seq, uint64_t seq, bint want_rank, double *old, bint *had,
                           double *new, bint *has_new, bint *changed) except -2:
        """Apply one write of a checked member and number; return the unique
        rank after it (0 if absent or not wanted).  Raises, changing
        nothing, on a non-finite increment result or a full index."""
        # Every write moves a step of a map resize or arena compaction under way.
        if self.old_ids != NULL:
            self._map_advance()
        if self.arena.compacting:
            self._compact_step()
        if self.pool.evac != NO_BLOCK or pg_pool_dead(&self.pool) >= self.evac_at:
            self._evacuate_step()
        cdef uint64_t h
        if self.has_hint:  # apply_batch's, of this very member
            h = self.hint_hash
            self.has_hint = False
        else:
            h = self._hash(data, size)
        cdef Py_ssize_t slot = self._slot(data, size, h)
        cdef uint32_t code = self._slot_code(slot), mid = 0
        cdef Py_ssize_t pos, rank
        cdef pg_page *p
        cdef double key, target, old_key = 0.0
        if code != 0:
            p = self._locate(code, &pos)
            mid = PG_IDS(p)[pos]
            old_key = self._key_at(p, pos)
            old[0] = self._score_of(old_key)
        had[0] = code != 0
        changed[0] = False
        if op == OP_REMOVE:
            has_new[0] = False
            if code == 0:
                return 0
            # Out of the map first: the entries the removal moves (a merge)
            # are found in the map by their codes.
            self._map_remove(slot)
            self._remove(code)
            self._map_shrink()
            self.member_bytes -= size
            self._name_free(mid)
            self._trim_step()
            if self.length == 0:
                self.peak_length = self.peak_member_bytes = 0
            self.mutations += 1
            changed[0] = True
            return 0
        if op == OP_INCR:
            target = (old[0] + value) if mid != 0 else value
            if not isfinite(target):
                raise ValueError(f"incrementing by {value!r} gives a non-finite score")
        else:
            target = value
            if mid != 0:
                key = self._key(value)
                if (op == OP_SET_NEW
                        or (op == OP_SET_BETTER and not key < old_key)
                        or (op == OP_SET_WORSE and not key > old_key)):
                    op = -1
            elif op == OP_SET_EXISTS:
                has_new[0] = False
                return 0
        if op == -1 or (code != 0 and old[0] == target):
            new[0] = old[0]
            has_new[0] = True
            return self._rank_in(code, p, pos) if want_rank else 0
        if not has_seq and self._next_seq > MAX_SEQ:
            raise ValueError("arrival sequences are exhausted (next_seq is past 2**63 - 1); "
                             "pass seq explicitly")
        # Before anything changes; a widening moves every page, so find
        # the member's entry again.  (A write that would then be refused
        # for want of a page is refused before the seqs widen.)
        if (self._seq_widens(seq if has_seq else self._next_seq)
                and (code == 0 or not self._stays(p, pos, self._key(target)))):
            self._need_pno()
        if self._fit_seq(seq if has_seq else self._next_seq) and code != 0:
            p = self._locate(code, &pos)
        if code != 0:
            key = self._key(target)
            if self._stays(p, pos, key):
                if not p.wide and not self._narrow(key):
                    p = self._widened(p, NULL)  # (before anything changes)
                seq = self._stamp(has_seq, seq)
                new[0] = target
                has_new[0] = True
                changed[0] = True
                self.mutations += 1
                rank = 0
                pos = self._move_in_page(p, pos, key, seq, mid, want_rank, &rank)
                if p.wide:  # (it may have left a page narrow keys fit again)
                    self._shrink(p)
                if rank != 0:
                    self._remember(code, rank)
                return rank if want_rank else 0
        self._need_pno()
        if code == 0:
            if self.length >= MAX_LENGTH:
                raise OverflowError("a rank index holds fewer than 2**32 members")
            rank = self._add_member(data, size, h, self._key(target), has_seq, seq)
        else:
            rank = self._move_entry(slot, code, self._key(target), self._stamp(has_seq, seq))
        new[0] = target
        has_new[0] = True
        changed[0] = True
        self.mutations += 1
        return self._remember(self.put_code, rank)

    cdef Py_ssize_t _add_member(self, const char *data, Py_ssize_t size, uint64_t h,
                                double key, bint has_seq, uint64_t seq) except -1:
        """A member not in the index (its name ``data``, hashed ``h``) at
        ``key``: its name, its entry, its slot; return its rank.  Its seq
        is stamped once its name is stored.  MemoryError leaves no name
        behind (a page may have moved meanwhile, widened or shared: the
        mutation is counted)."""
        cdef uint32_t mid
        cdef Py_ssize_t rank
        self._map_reserve(self.length + 1)
        mid = self._name_new(data, size, h)
        try:
            rank = self._insert(key, self._stamp(has_seq, seq), mid, PG_HASH_TAG(h))
        except MemoryError:
            self._name_free(mid)
            self.mutations += 1
            raise
        self._map_put(self.put_code, h)
        self.member_bytes += size
        if self.length > self.peak_length:
            self.peak_length = self.length
        if size > self.peak_member_bytes:
            self.peak_member_bytes = size
        return rank

    cdef Py_ssize_t _move_entry(self, Py_ssize_t slot, uint32_t code, double key,
                                uint64_t seq) except -1:
        """Give the member of ``slot`` (its entry ``code``) the place of
        ``key`` and ``seq``; return its rank.  The new entry goes in first
        and the old one out after: only the insert can need memory (a
        split), and its MemoryError changes nothing; a removal needs none
        (out of memory, a merge leaves a page sparse).  Meanwhile the
        member has two entries: its slot follows the old one while the
        insert moves entries (by code, as every moved entry's does), then
        takes the new one's before the old one goes, whose removal may
        move the new one in turn."""
        cdef Py_ssize_t pos, mlen, rank
        cdef pg_page *p = self._locate(code, &pos)
        cdef uint32_t mid = PG_IDS(p)[pos]
        cdef const char *name = self._name(mid, &mlen)
        rank = self._insert(key, seq, mid, PG_CODE_TAG(code))
        code = self._slot_code(slot)  # (the old entry's, wherever the insert moved it)
        p = self._locate(code, &pos)
        if self._cmp(p, pos, key, seq, name, mlen) < 0:
            rank -= 1  # (it counted the old entry, which goes)
        self._slot_set(slot, self.put_code)
        self._remove(code)
        self.put_code = self._slot_code(slot)
        return rank

    cdef int _need_pno(self) except -1:
        """Before a write that may make a page (one at most): raise
        OverflowError, changing nothing, if the page table is full."""
        if self.nfree_pnos == 0 and self.pnos_used >= self.max_pnos:
            raise _pages_full(self.max_pnos)
        return 0

    cdef inline Py_ssize_t _remember(self, uint32_t code, Py_ssize_t rank) noexcept:
        """Keep the rank a write found for the entry ``code``, good until the
        next change (which alone moves an entry to another code): ``rank()``
        of the member just written then needs no second search."""
        self.memo_code = code
        self.memo_rank = rank
        self.memo_mutations = self.mutations
        return rank

    cdef bint _stays(self, pg_page *p, Py_ssize_t pos, double key) noexcept:
        """Whether the entry at ``pos`` of ``p`` given ``key`` still sorts
        between the pages around ``p`` (a tie with a neighbour page takes
        the full path).  The next page's first key is in the first-key
        array; the previous page is read only when the entry may become
        or was the first of ``p``."""
        cdef pg_page *q = p.prev
        if q != NULL and (pos == 0 or not key > self._key_at(p, 0)) \
                and not self._key_at(q, q.n - 1) < key:
            return False
        return p.level[0].forward == NULL or key < self.firstkeys[p.level[0].fpno]

    cdef Py_ssize_t _move_in_page(self, pg_page *p, Py_ssize_t pos, double key, uint64_t seq,
                                  uint32_t mid, bint want_rank, Py_ssize_t *rank) noexcept:
        """Give the entry at ``pos`` of ``p`` a new place in ``p`` (a memmove)
        and its new key; return its new position.  ``rank`` gets its unique
        rank if ``want_rank``."""
        cdef Py_ssize_t mlen, t
        cdef const char *name = self._name(mid, &mlen)
        cdef pg_page *nxt = p.level[0].forward
        cdef double old_last = self._key_at(p, p.n - 1), new_last, first
        cdef uint8_t eno = PG_ENOS(p)[pos]   # (it stays in its page: so does its code)
        cdef int64_t dl = -<int64_t>self._alone(p, pos)   # (see _alone)
        t = self._lower(p, key, seq, name, mlen)
        if t > pos:
            t -= 1
            self._shift_entries(p, pos + 1, t + 1, -1)
        elif t < pos:
            self._shift_entries(p, t, pos, 1)
        self._set_key(p, t, key)
        self._set_seq(p, t, seq)
        PG_IDS(p)[t] = mid
        PG_ENOS(p)[t] = eno
        self.firstkeys[p.pno] = self._key_at(p, 0)
        dl += self._alone(p, t)
        if dl != 0:
            self._account(p, 0, dl)
            p.lead = <uint32_t>(p.lead + dl)
        if want_rank:
            rank[0] = self._rank_at(p, t)
        if nxt != NULL:
            # The next page's first entry leads unless it ties p's last.
            new_last = self._key_at(p, p.n - 1)
            first = self.firstkeys[p.level[0].fpno]
            if (old_last != first) != (new_last != first):
                self._relead(nxt)
        return t

    cdef inline uint64_t _stamp(self, bint has_seq, uint64_t seq) noexcept:
        """The arrival sequence of a write that changes a score."""
        if not has_seq:
            seq = self._next_seq
        if seq >= self._next_seq:
            self._next_seq = seq + 1
        return seq

    cdef tuple _write_result(self, bint had, double old, bint has_new, double new,
                             bint changed):
        return _untracked((_float_or_none(had, old), _float_or_none(has_new, new), changed))

    # --- writes -------------------------------------------------------------------

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
        ``(old, new, changed)``.  Runtime complexity: O(log n)."""
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
        cdef size_t held = self._held()
        self._reset()
        self.freed_bytes += held
        self._trim_step()
        self.mutations += 1

    def apply_batch(self, ops):
        """Apply ``(op, member, value[, seq])`` operations in order.

        Returns one ``(old, new, changed, rank)`` per operation, or the
        ``TypeError``/``ValueError`` of an invalid one, or the
        ``OverflowError`` of one the index has no room for, which changes
        nothing while the others still apply.

        Runtime complexity: O(k log n) for k operations.
        """
        # A private copy: the batch keeps every operation's member alive
        # and in place (a value's __float__ cannot change the list), so a
        # hash kept by the str's address (the ring) is that str's.
        cdef list items = list(ops)
        cdef list results = []
        cdef void *obj
        cdef double value = 0.0, old = 0.0, new = 0.0
        cdef bint had, has_new, changed
        cdef uint64_t s = 0
        cdef Py_ssize_t rank, position, size
        cdef const char *data
        cdef int op
        cdef bint has_seq
        cdef Py_ssize_t count = len(items)
        memset(self.ring_obj, 0, sizeof(self.ring_obj))
        for position in range(count):
            item = items[position]
            if (position % WARM_GROUP == 0 and count > 1
                    and self.length >= PREFETCH_MIN_LENGTH):
                self.warmed += self._warm_group(items, position, count)
            try:
                _operation(item, &op, &value, &has_seq, &s, &data, &size)
                # The group's warm hashed this member already (the same str:
                # _operation took it from the same tuple).
                obj = PyTuple_GET_ITEM_PTR(<void *>item, 1)
                if self.ring_obj[position & 15] == obj:
                    self.hint_hash = self.ring_hash[position & 15]
                    self.has_hint = True
                rank = self._write(data, size, value, op, has_seq, s, True,
                                   &old, &had, &new, &has_new, &changed)
            except (TypeError, ValueError, OverflowError) as exc:
                results.append(exc)
                continue
            results.append(_untracked((_float_or_none(had, old), _float_or_none(has_new, new),
                                       changed, rank if has_new else None)))
        return results

    cdef int _warm_group(self, list items, Py_ssize_t start, Py_ssize_t count):
        """Warm the cache for the next ``WARM_GROUP`` writes of a batch.

        A write's search for its rank is a chain of dependent misses (a
        link, then the first key it names, then the next link), and so are
        its slot, page, entry and name; one write cannot overlap them.
        Here the chains of a whole group advance in lock step, one link of
        each per round, so that the group's misses overlap, as the skip
        list's batches do.  Nothing is written or trusted: a stale or wrong
        guess (a tag's collision, a write earlier in the group that moves
        things) costs a useless prefetch; operations that are not plain
        tuples of an int op, a str member and a number are not warmed.
        The member hashes go to the ring for the writes to reuse.  Returns
        how many operations it walked."""
        cdef Py_ssize_t stop = min(start + WARM_GROUP, count)
        cdef Py_ssize_t position, size, pos
        cdef const char *data
        cdef uint64_t hashes[WARM_GROUP]
        cdef uint32_t codes[WARM_GROUP]
        cdef double values[WARM_GROUP]
        cdef double target[WARM_GROUP]
        cdef int ops[WARM_GROUP]
        cdef pg_page *pg[WARM_GROUP]
        cdef pg_link *lv[WARM_GROUP]
        cdef int level[WARM_GROUP]
        cdef bint keyed[WARM_GROUP]
        cdef bint phase[WARM_GROUP]
        cdef Py_ssize_t entry[WARM_GROUP]
        cdef int lanes = 0, walked = 0, active = 0, j, i, overflow
        cdef long long op_code
        cdef uint32_t code, pno
        cdef pg_page *page
        cdef pg_link *link
        cdef void *tup
        cdef void *obj
        # The group's tuples were asked for by the group before (the first
        # group's now); their member strs are objects anywhere in memory:
        # ask for them all before the first is read.
        for position in range(start, stop):
            tup = PyList_GET_ITEM_PTR(items, position)
            if Py_TYPE_PTR(tup) == <void *>tuple and Py_SIZE_PTR(tup) >= 3:
                obj = PyTuple_GET_ITEM_PTR(tup, 1)
                rk_prefetch(obj)
                rk_prefetch(<char *>obj + 64)
        for position in range(stop, min(stop + WARM_GROUP, count)):
            rk_prefetch(PyList_GET_ITEM_PTR(items, position))
        for position in range(start, stop):
            self.ring_obj[position & 15] = NULL
            item = items[position]
            if type(item) is not tuple or len(<tuple>item) < 3:
                continue
            op_obj = (<tuple>item)[0]
            member = (<tuple>item)[1]
            value = (<tuple>item)[2]
            if type(member) is not str or isinstance(op_obj, bool) or not isinstance(op_obj, int):
                continue
            op_code = PyLong_AsLongLongAndOverflow(op_obj, &overflow)
            if overflow or not OP_SET <= op_code <= OP_REMOVE:
                continue
            if type(value) is float:
                values[lanes] = PyFloat_AS_DOUBLE(value)
            elif type(value) is int:
                values[lanes] = <double>PyLong_AsLongLongAndOverflow(value, &overflow)
                if overflow:
                    continue
            elif op_code != OP_REMOVE:
                continue
            try:
                data = PyUnicode_AsUTF8AndSize(member, &size)
            except UnicodeEncodeError:
                continue  # an invalid member: its own turn reports it
            hashes[lanes] = self._hash(data, size)
            self.ring_hash[position & 15] = hashes[lanes]
            self.ring_obj[position & 15] = <void *>member
            rk_prefetch(&self.slot_ids[pg_home(hashes[lanes], self.nslots)])
            ops[lanes] = <int>op_code
            lanes += 1
        # The member's page: its header and entry numbers (and its leaf's
        # place in the count tree's ``where``) ...
        for j in range(lanes):
            pg[j] = NULL
            code = codes[j] = self._tagged_code(hashes[j])
            if code == 0:
                continue
            pno = PG_CODE_PNO(code)
            if pno >= self.pnos_used or self.pages[pno] == NULL:
                continue
            page = self.pages[pno]
            pg[j] = page
            rk_prefetch(page)
            rk_prefetch(&self.counts.where[pno])
            rk_prefetch(<char *>PG_ENOS(page) + PG_ENOS_BYTES(self.page_size) - 1)
            if sizeof(pg_page) > 64:
                rk_prefetch(<char *>page + 64)
        # ... then its entry's id and key ...
        for j in range(lanes):
            if pg[j] == NULL:
                continue
            pos = pg_find_eno(PG_ENOS(pg[j]), pg[j].n, PG_CODE_ENO(codes[j]))
            if pos < 0:
                pg[j] = NULL
                continue
            entry[j] = pos
            rk_prefetch(&PG_IDS(pg[j])[pos])
            rk_prefetch(<char *>PG_KEYS(pg[j]) + pos * PG_KEY_BYTES(pg[j]))
            rk_prefetch(<char *>PG_KEYS(pg[j]) + (pg[j].n - 1) * PG_KEY_BYTES(pg[j]))
        # ... then its name, and the key the write searches for: the new
        # one (a removal's, the old).
        for j in range(lanes):
            keyed[j] = True
            if pg[j] != NULL:
                pos = entry[j]
                if PG_IDS(pg[j])[pos] < self.arena.names_used:
                    pg_prefetch_rec(&self.arena.names[PG_IDS(pg[j])[pos]])
                if ops[j] == OP_REMOVE:
                    target[j] = self._key_at(pg[j], pos)
                elif ops[j] == OP_INCR:
                    target[j] = self._key(self._score_of(self._key_at(pg[j], pos)) + values[j])
                else:
                    target[j] = self._key(values[j])
            elif ops[j] == OP_REMOVE:
                keyed[j] = False  # absent: nothing to walk to
            else:
                target[j] = self._key(values[j])
            if target[j] != target[j]:  # a NaN: its own turn refuses it
                keyed[j] = False
            lv[j] = self.header.level
            level[j] = self.height - 1
            if pg[j] != NULL:
                # (the write changes its page's count, or reads its rank there)
                ct_prefetch(&self.counts, pg[j].pno, True)
            if (keyed[j] and pg[j] != NULL and ops[j] != OP_REMOVE
                    and self.firstkeys[pg[j].pno] <= target[j] <= self._key_at(pg[j], pg[j].n - 1)):
                # It stays in its page: its rank is the count tree's, not
                # a search.
                self.warmed_ahead += 1
                level[j] = -1
        # The walks, one step of each per round: a lane asks for the first
        # key its link names and yields; in its next round (the group's
        # other lanes between) it reads the key, and either steps on,
        # asking for the next page's link, or goes down its own tower.
        for j in range(lanes):
            phase[j] = 0
            walked += keyed[j]
            if not keyed[j] or level[j] < 0:
                level[j] = -1
            else:
                active += 1
        while active > 0:
            for j in range(lanes):
                i = level[j]
                while i >= 0:
                    link = &lv[j][i]
                    if phase[j] == 0:
                        if link.forward == NULL:
                            i -= 1
                            continue
                        rk_prefetch(&self.firstkeys[link.fpno])
                        phase[j] = 1
                        break
                    phase[j] = 0
                    if self.firstkeys[link.fpno] <= target[j]:
                        lv[j] = link.flevel
                        rk_prefetch(&lv[j][i])
                        break
                    i -= 1
                if i < 0 and level[j] >= 0:
                    active -= 1
                level[j] = i
        return walked

    def set_states_packed(self, states):
        """``set_states`` for a packed run (``rankd.index.packed``), read
        back as tuples here; returns how many states it held."""
        from rankd.index.packed import unpack_states

        unpacked = unpack_states(states)
        self.set_states(unpacked)
        return len(unpacked)

    def set_states(self, states):
        """Give members exact ``(member, score, seq)`` states; a later entry
        for the same member wins.  Every entry is validated before anything
        changes; the arrival sequence is taken as given even when the score
        does not change.

        Runtime complexity: O(k log n) for k entries.
        """
        cdef list items = list(states)
        cdef Py_ssize_t k = len(items), i, fresh = 0, size, mlen
        cdef double score
        cdef uint64_t s, top = 0
        cdef const char *data
        cdef uint32_t code
        cdef Py_ssize_t slot
        cdef uint64_t h
        cdef list checked = []
        cdef set seen = set()
        if k == 0:
            return None
        for i in range(k):
            item = items[i]
            if type(item) is not tuple:
                raise TypeError(f"a state must be a tuple, got {type(item).__name__}")
            if len(<tuple>item) != 3:
                raise TypeError(
                    f"a state is (member, score, seq), got {len(<tuple>item)} items")
            _member_bytes((<tuple>item)[0], &data, &size)
            _number((<tuple>item)[1], &score, "score")
            _seq((<tuple>item)[2], &s)
            if s > top:
                top = s
            member = (<tuple>item)[0]
            if member not in seen:
                seen.add(member)
                if self._lookup(data, size) == 0:
                    fresh += 1
            checked.append((member, score, s))
        if self.length + fresh > MAX_LENGTH:
            raise OverflowError("a rank index holds fewer than 2**32 members")
        # Each state makes a page at most (a split).
        if (self.nfree_pnos + <Py_ssize_t>(self.max_pnos - self.pnos_used)) < k:
            raise _pages_full(self.max_pnos)
        self._fit_seq(top)
        try:
            for member, score, s in checked:
                _member_bytes(member, &data, &size)
                if self.old_ids != NULL:
                    self._map_advance()  # as a write does (before the slot is found)
                h = self._hash(data, size)
                slot = self._slot(data, size, h)
                code = self._slot_code(slot)
                if code == 0:
                    self._add_member(data, size, h, self._key(score), True, s)
                else:
                    self._move_entry(slot, code, self._key(score), s)
        finally:  # (out of memory, the states before it were set)
            self.mutations += 1
        if top >= self._next_seq:
            self._next_seq = top + 1
        return None

    # --- properties -------------------------------------------------------------

    @property
    def order(self):
        """``"desc"`` (highest score ranks first) or ``"asc"``."""
        return "desc" if self.descending else "asc"

    @property
    def tie_break(self):
        """``"first"``, ``"member"`` (A to Z) or ``"member_desc"`` (Z to A)."""
        if self.tie_member_desc:
            return "member_desc"
        return "member" if self.tie_by_member else "first"

    @property
    def next_seq(self):
        """The arrival sequence the next unsequenced write will get."""
        return self._next_seq

    @property
    def _page_size(self):
        """Entries a page holds at most (for tests)."""
        return self.page_size

    @property
    def _tower_chunks(self):
        """``(chunks of towers, links the newest holds)`` (for tests)."""
        cdef size_t room = 0
        if self.nchunks > 0:
            room = TOWER_BIG if self.nchunks > TOWER_BIG_AFTER else TOWER_CHUNK
        return self.nchunks, room

    def _pages(self):
        """Entries per page in rank order (for tests)."""
        cdef pg_page *p = self.header.level[0].forward
        cdef list out = []
        while p != NULL:
            out.append(p.n)
            p = p.level[0].forward
        return out

    def _memory(self):
        """Bytes held, by part: ``{"pages", "page_heap", "names", "map",
        "page_table", "counts"}`` (allocated sizes, without the C
        allocator's own overhead): ``pages`` the pages at their sizes and
        their towers, ``counts`` the count tree's nodes,
        ``page_heap`` the rest of the page heap's blocks (chunk prefixes
        and holes, but not the end of the block allocations bump into);
        ``names`` counts the arena up to its high-water mark, free records
        included, not the capacity its doubling reserved but never touched:
        the whole arena, which a board's indexes share)."""
        cdef pg_page *p = self.header.level[0].forward
        cdef Py_ssize_t pages = 0, sizes = 0
        while p != NULL:
            sizes += PG_SIZE(p.cap, PG_KEY_BYTES(p), self.seq_bytes)
            pages += p.height * sizeof(pg_link)
            p = p.level[0].forward
        return {"pages": pages + sizes,
                "page_heap": <Py_ssize_t>(self.pool.live + pg_pool_dead(&self.pool)) - sizes,
                "names": self.arena.names_used * 4,  # (the arena's, shared)
                "map": (self.nslots + (self.old_nslots if self.old_ids else 0)) * 4,
                "page_table": <size_t>self.pages_cap * 8 + <size_t>self.keys_cap * 8
                              + <size_t>self.free_cap * 4
                              + <size_t>self.counts.where_cap * 4,
                "counts": ct_bytes(&self.counts)}

    def _page_heap(self):
        """The page heap's state (for tests and benchmarks): ``{"bytes",
        "live", "dead", "blocks", "evacuated"}``: its blocks' bytes, the
        pages' (with their chunks' prefixes), the bytes of holes and
        blocks' ends no allocation is bumping into, its blocks, and the
        pages evacuations moved, ever."""
        cdef uint32_t b, blocks = 0
        for b in range(self.pool.nblocks):
            blocks += self.pool.blocks[b].base != NULL
        return {"bytes": self.pool.bytes, "live": self.pool.live,
                "dead": pg_pool_dead(&self.pool), "blocks": blocks,
                "evacuated": self.evacuated}

    @property
    def _trims(self):
        """Heap trims this index asked for (for tests)."""
        return self.trims

    @property
    def _warmed(self):
        """Operations whose walks apply_batch warmed (for tests)."""
        return self.warmed

    def _count_tree(self):
        """The count tree as nested lists (for tests): a leaf is a list of
        (page number, entries), a node a list of (child, entries)."""
        return [] if self.counts.root == CT_NONE else self._count_node(self.counts.root)

    cdef object _count_node(self, uint32_t id):
        cdef uint32_t *node = ct_node(&self.counts, id)
        cdef uint32_t i
        cdef list out = []
        for i in range(node[1]):
            child = ct_children(&self.counts, node)[i]
            out.append((child if node[3] else self._count_node(child),
                        ct_counts(&self.counts, node)[i]))
        return out

    @property
    def _warmed_ahead(self):
        """Of those, the ones warmed as staying in their page: their walk
        forward from it (for tests)."""
        return self.warmed_ahead

    def _wide_pages(self):
        """Pages whose keys are f64 (for tests): a page's keys are int32
        scores until it is given one that is not."""
        cdef pg_page *p = self.header.level[0].forward
        cdef Py_ssize_t wide = 0
        while p != NULL:
            wide += p.wide
            p = p.level[0].forward
        return wide

    @property
    def _seq_bytes(self):
        """Bytes of a seq per entry (for tests): 4 while below 2^32."""
        return self.seq_bytes

    def _names_arena(self):
        """The :class:`Names` this index stores its names in (for tests)."""
        return self.arena

    def _hash_of(self, member):
        """``member``'s hash under the map's key (for tests)."""
        cdef const char *data
        cdef Py_ssize_t size
        _member_bytes(member, &data, &size)
        return self._hash(data, size)

    def _arena_state(self):
        """``(units used, units of capacity)`` of the name arena (for tests)."""
        return self.arena.names_used, self.arena.names_cap

    def _tags(self, member):
        """``(the tag in member's slot, its hash's tag)``, or None if absent
        (for tests)."""
        cdef const char *data
        cdef Py_ssize_t size
        cdef uint32_t code
        _member_bytes(member, &data, &size)
        code = self._lookup(data, size)
        if code == 0:
            return None
        return PG_CODE_TAG(code), PG_HASH_TAG(self._hash(data, size))

    def _corrupt_tag(self, member):
        """Give member's slot another tag (for tests of ``_check``: the
        member is then lost to lookups)."""
        cdef const char *data
        cdef Py_ssize_t size
        cdef Py_ssize_t slot
        cdef uint32_t code
        _member_bytes(member, &data, &size)
        slot = self._slot(data, size, self._hash(data, size))
        code = self._slot_code(slot)
        if code != 0:
            self._slot_set(slot, PG_RETAG(code, (PG_CODE_TAG(code) + 1) & 15))

    def _corrupt_count(self, member, int entries=1, int leaders=0):
        """Add ``entries`` and ``leaders`` to the count tree's counts for
        member's page (for tests of ``_check`` and of which ranks read
        the tree)."""
        cdef uint32_t code = self._find(member)
        if code != 0:
            ct_add(&self.counts, PG_CODE_PNO(code), entries, leaders)

    def _evacuate_from(self, size_t dead):
        """Evacuate the page heap's sparse blocks from ``dead`` bytes of
        holes on, not ``EVAC_MIN_DEAD`` (for tests: small boards then meet
        evacuations)."""
        self.evac_min_dead = self.evac_at = dead

    def _limit_pages(self, Py_ssize_t limit):
        """Number pages below ``limit`` from now on, not ``MAX_PAGES`` (for
        tests: reaching the real limit takes over a hundred million
        members).  ``limit`` must cover the page numbers in use."""
        if not self.pnos_used <= limit <= MAX_PNOS:
            raise ValueError(f"a page limit must be between {self.pnos_used} and {MAX_PNOS}")
        self.max_pnos = <uint32_t>limit

    def _probe_info(self, member):
        """``(slots read, slots of its tag)`` of a lookup of ``member`` up
        to its own slot or the run's end (for benchmarks; a map resize
        under way is finished first, so that there is one table)."""
        cdef const char *data
        cdef Py_ssize_t size, found
        cdef uint64_t h
        cdef size_t i
        cdef uint32_t code
        cdef int read = 1, tagged = 0
        _member_bytes(member, &data, &size)
        self._map_finish()
        h = self._hash(data, size)
        found = self._probe_new(data, size, h)
        i = pg_home(h, self.nslots)
        while True:  # (the slots the probe read: to its own, or to an empty one)
            code = self.slot_ids[i]
            tagged += code != 0 and PG_CODE_TAG(code) == PG_HASH_TAG(h)
            if code == 0 or <Py_ssize_t>i == found:
                return read, tagged
            read += 1
            i = i + 1 if i + 1 < self.nslots else 0

    def _map_state(self):
        """``(slots, old slots or 0, old slots moved so far, ids moved ever)``
        of the member map (for tests: a resize moves ``MAP_STEP`` slots a
        write)."""
        return (self.nslots, self.old_nslots if self.old_ids != NULL else 0,
                self.migrate_pos, self.map_moves)

    def __len__(self):
        return self.length

    @property
    def peaks(self):
        """``(length, member bytes)``: the most members held and the longest
        member taken since made, cleared, emptied or :meth:`reset_peaks`."""
        return self.peak_length, self.peak_member_bytes

    @property
    def full(self):
        """Whether a write that changes a score may be refused with
        ``OverflowError``: every page number is taken (a write may need
        one, see Members), the name arena has no room for a longest name,
        or the index holds ``2**32 - 2`` members.  The engine asks before a
        submission changes any window, so such a write is refused whole."""
        return self._full()

    cdef bint _full(self) noexcept:
        return ((self.nfree_pnos == 0 and self.pnos_used >= self.max_pnos)
                or self.length >= MAX_LENGTH
                or self.arena.names_used + PG_NAME_UNITS(MAX_MEMBER_BYTES) >= MOVED)

    def reach(self, Py_ssize_t length):
        """Count ``length`` members as held (in :attr:`peaks`)."""
        if length > self.peak_length:
            self.peak_length = length

    def reset_peaks(self):
        """Set :attr:`peaks` to what the index holds now.  Runtime complexity: O(n)."""
        cdef pg_page *p = self.header.level[0].forward
        cdef Py_ssize_t i, mlen
        self.peak_length = self.length
        self.peak_member_bytes = 0
        while p != NULL:
            for i in range(p.n):
                self._name(PG_IDS(p)[i], &mlen)
                if mlen > self.peak_member_bytes:
                    self.peak_member_bytes = mlen
            p = p.level[0].forward

    def positive_zeros(self):
        """Make every score of -0.0 0.0 (no member moves); return how many
        were.  Runtime complexity: O(n)."""
        cdef pg_page *p = self.header.level[0].forward
        cdef Py_ssize_t changed = 0, i, before
        cdef double key = self._key(0.0)
        cdef double *keys
        while p != NULL:
            if not p.wide:  # (a narrow entry's 0 is 0.0: -0.0 widens)
                self.firstkeys[p.pno] = self._key_at(p, 0)
                p = p.level[0].forward
                continue
            keys = PG_KEYS(p)
            before = changed
            for i in range(p.n):
                if keys[i] == 0.0 and signbit(keys[i]) != signbit(key):
                    keys[i] = key
                    changed += 1
            self.firstkeys[p.pno] = keys[0]
            if changed != before and self._all_narrow(p, 0, p.n):
                p = self._narrow_page(p)  # (its -0.0 may have been its only wide key)
            p = p.level[0].forward
        if changed:
            self.mutations += 1
        return changed

    # --- reads ----------------------------------------------------------------------

    cdef inline uint32_t _find(self, object member) except? 0:
        cdef const char *data
        cdef Py_ssize_t size
        _member_bytes(member, &data, &size)
        return self._lookup(data, size)

    def __contains__(self, member):
        if not isinstance(member, str):
            return False
        try:
            return self._find(member) != 0
        except ValueError:
            return False

    def __repr__(self):
        return (f"RankIndex(order={self.order!r}, tie_break={self.tie_break!r}, "
                f"members={self.length})")

    def __iter__(self):
        return _Iterator(self)

    def __reduce__(self):
        return (_load_from_dump, (self.dump(),))

    cdef inline double _score_at(self, pg_page *p, Py_ssize_t pos) noexcept nogil:
        if not p.wide:
            return <double>PG_KEYS32(p)[pos]  # (a narrow entry holds the score)
        return self._score_of(PG_KEYS(p)[pos])

    cdef inline str _member_str(self, pg_page *p, Py_ssize_t pos):
        cdef Py_ssize_t mlen
        cdef const char *name = self._name(PG_IDS(p)[pos], &mlen)
        return pg_name_str(name, mlen)

    def score(self, member):
        """``member``'s score, or ``None``.  Runtime complexity: O(1)."""
        cdef uint32_t code = self._find(member)
        cdef Py_ssize_t pos
        cdef pg_page *p
        if code == 0:
            return None
        p = self._locate(code, &pos)
        return self._score_at(p, pos)

    def rank(self, member):
        """Unique 1-based rank, or ``None``.  Runtime complexity: O(log n)."""
        cdef uint32_t code = self._find(member)
        return None if code == 0 else self._rank_of(code, NULL)

    def competition_rank(self, member):
        """1 + members with a strictly better score, or ``None``.  O(log n)."""
        cdef uint32_t code = self._find(member)
        cdef Py_ssize_t pos
        cdef pg_page *p
        if code == 0:
            return None
        p = self._locate(code, &pos)
        return self._better_than(p, pos) + 1

    def dense_rank(self, member):
        """1 + distinct scores strictly better, or ``None``.  O(log n)."""
        cdef uint32_t code = self._find(member)
        cdef Py_ssize_t dense = 0
        if code == 0:
            return None
        self._rank_of(code, &dense)
        return dense

    def percentile(self, member):
        """Share of members scoring equal or worse, in percent.  O(log n)."""
        cdef uint32_t code = self._find(member)
        cdef Py_ssize_t pos
        cdef pg_page *p
        if code == 0:
            return None
        p = self._locate(code, &pos)
        return 100.0 * (self.length - self._better_than(p, pos)) / self.length

    def ranks(self, members):
        """Unique ranks of many members (``None`` for absent ones).  O(k log n)."""
        cdef list result = []
        cdef uint32_t code
        for member in members:
            code = self._find(member)
            result.append(None if code == 0 else self._rank_of(code, NULL))
        return result

    def member_at(self, rank):
        """``(member, score)`` at a 1-based rank, ``None`` past the end.  O(log n)."""
        cdef Py_ssize_t pos
        cdef pg_page *p
        if isinstance(rank, bool) or not isinstance(rank, int):
            raise TypeError(f"rank must be an int, got {type(rank).__name__}")
        if rank < 1:
            raise ValueError(f"rank must be at least 1, got {rank}")
        if rank > self.length:
            return None
        p = self._page_at(rank, &pos)
        return (self._member_str(p, pos), self._score_at(p, pos))

    cdef list _collect(self, Py_ssize_t first, Py_ssize_t last, bint reverse):
        """Entries of ranks first..last (1-based, inclusive, clipped by the
        caller), best first or, with ``reverse``, worst first."""
        cdef pg_page *p
        cdef Py_ssize_t pos
        if first > last:
            return []
        p = self._page_at(last if reverse else first, &pos)
        return self._walk(p, pos, last if reverse else first, first, last, reverse)

    cdef void _prefetch_names(self, pg_page *p, Py_ssize_t pos, Py_ssize_t count,
                              bint reverse) noexcept:
        """Ask for the names of ``count`` entries from ``pos`` of ``p`` on
        (back with ``reverse``) at once: names lie in arrival order, away
        from their entries, and a read that returns members would otherwise
        wait for each miss in turn.  At most 64 (a window's first names)."""
        if count > 64:
            count = 64
        while count > 0 and p != NULL:
            pg_prefetch_rec(&self.arena.names[PG_IDS(p)[pos]])
            count -= 1
            if reverse:
                pos -= 1
                if pos < 0:
                    p = p.prev
                    if p != NULL:
                        pos = p.n - 1
            else:
                pos += 1
                if pos == p.n:
                    p = p.level[0].forward
                    pos = 0

    cdef list _walk(self, pg_page *p, Py_ssize_t pos, Py_ssize_t rank, Py_ssize_t first,
                    Py_ssize_t last, bint reverse):
        """Entries from ``pos`` of ``p``, whose rank is ``rank``, on to
        ``last`` (back to ``first`` with ``reverse``)."""
        cdef Py_ssize_t count = (rank - first if reverse else last - rank) + 1, i
        # Made at its size, not grown by appends: a top-10 is a list, ten
        # tuples and their items, and the growth was a tenth of it.
        cdef list entries = PyList_New(count)
        cdef tuple entry
        self._prefetch_names(p, pos, count, reverse)
        for i in range(count):
            entry = (rank, self._member_str(p, pos), self._score_at(p, pos))
            Py_INCREF(entry)
            PyList_SET_ITEM(entries, i, entry)
            if i + 1 == count:
                break
            if reverse:
                rank -= 1
                pos -= 1
                if pos < 0:
                    p = p.prev
                    pos = p.n - 1
            else:
                rank += 1
                pos += 1
                if pos == p.n:
                    p = p.level[0].forward
                    pos = 0
        return entries

    cdef list _window(self, Py_ssize_t lo, Py_ssize_t hi, object offset, object limit,
                      bint reverse):
        cdef Py_ssize_t first, last
        if not _window_ranks(lo, hi, offset, limit, reverse, &first, &last):
            return []
        return self._collect(first, last, reverse)

    def range_by_rank(self, offset=0, limit=None, *, reverse=False):
        """Entries ``(rank, member, score)`` by rank after ``offset``, at most
        ``limit``; ``reverse`` starts from the worst.  O(log n + limit)."""
        return self._window(1, self.length, offset, limit, reverse)

    cdef int _key_range(self, object low, object high, bint low_exclusive,
                        bint high_exclusive, Py_ssize_t *lo, Py_ssize_t *hi) except -1:
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
        from the worst), after ``offset``, at most ``limit``.  O(log n + limit)."""
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
        ``below`` worse-ranked ones; ``None`` if absent.  O(log n + above + below)."""
        cdef uint32_t code = self._find(member)
        cdef Py_ssize_t rank, pos, first, back
        cdef pg_page *p
        _count(above, "above")
        _count(below, "below")
        if code == 0:
            return None
        # The neighbours are read from the member's own entry on, back over
        # ``prev`` links and forward: one walk (for its rank), not two.
        rank = self._rank_of(code, NULL)
        p = self._locate(code, &pos)
        first = max(1, rank - above)
        back = rank - first
        while back > pos:
            back -= pos + 1
            p = p.prev
            pos = p.n - 1
        pos -= back
        return self._walk(p, pos, first, first, min(self.length, rank + below), False)

    # --- snapshots -------------------------------------------------------------------

    def dump(self):
        """The whole index as bytes (format in rankd.index._contract: version
        1, or version 2 without seqs for a board tied by member).  O(n)."""
        cdef Py_ssize_t record = DUMP_RECORD_SIZE - 8 * self.tie_by_member
        cdef Py_ssize_t size = (DUMP_HEADER_SIZE + self.length * record
                                + self.member_bytes + 4)
        cdef bytes out = PyBytes_FromStringAndSize(NULL, size)
        cdef char *p = PyBytes_AS_STRING(out)
        cdef pg_page *page = self.header.level[0].forward
        cdef Py_ssize_t pos = 0
        self._write_dump_header(p)
        p += DUMP_HEADER_SIZE
        with nogil:
            p = self._dump_pages(&page, &pos, p, p + size)
        crc = zlib.crc32(memoryview(out)[:size - 4])
        rk_store_u32(p, <uint32_t>crc)
        return out

    cdef void _write_dump_header(self, char *p) noexcept:
        _dump_header_write(p, DUMP_VERSION_NO_SEQS if self.tie_by_member else DUMP_VERSION,
                           self.descending, self.tie_by_member + self.tie_member_desc,
                           self.length, self._next_seq)

    cdef char *_dump_pages(self, pg_page **at, Py_ssize_t *at_pos, char *out,
                           const char *limit) noexcept nogil:
        """Write the dump records from entry ``at_pos[0]`` of page ``at[0]``
        on at ``out`` while each fits before ``limit``; ``at``/``at_pos``
        are left at the first entry not written."""
        cdef pg_page *p = at[0]
        cdef Py_ssize_t i = at_pos[0], mlen
        cdef Py_ssize_t record = DUMP_RECORD_SIZE - 8 * self.tie_by_member
        cdef const char *name
        cdef uint32_t *ids
        cdef pg_page *q
        cdef Py_ssize_t half, b
        while p != NULL:
            ids = PG_IDS(p)
            # The next page is a block of its own: ask for its header,
            # entry numbers and ids now, and for the rest of it and its
            # tower halfway through this page (by then its header is in),
            # so that reading on into it, and the names prefetched ahead
            # across the boundary, wait for no miss (they took a third of
            # a dump's time).
            q = p.level[0].forward
            half = p.n >> 1
            if q != NULL:
                for b in range(0, self.locate_bytes, 64):
                    rk_prefetch(<char *>q + b)
            while i < p.n:
                if i == half and q != NULL:
                    for b in range(self.locate_bytes, <Py_ssize_t>PG_SIZE(q.cap, PG_KEY_BYTES(q), self.seq_bytes), 64):
                        rk_prefetch(<char *>q + b)
                    rk_prefetch(q.level)
                # Names lie in arrival order, not rank order: ask for the
                # ones a few entries ahead so that their misses overlap.
                if i + DUMP_AHEAD < p.n:
                    pg_prefetch_rec(&self.arena.names[ids[i + DUMP_AHEAD]])
                elif p.level[0].forward != NULL and i + DUMP_AHEAD - p.n < p.level[0].forward.n:
                    pg_prefetch_rec(&self.arena.names[PG_IDS(p.level[0].forward)[i + DUMP_AHEAD - p.n]])
                name = self._name(ids[i], &mlen)
                if limit - out < record + mlen:
                    at[0] = p
                    at_pos[0] = i
                    return out
                rk_store_f64(out, self._score_at(p, i))
                if self.tie_by_member:
                    rk_store_u16(out + 8, <uint16_t>mlen)
                else:
                    rk_store_u64(out + 8, self._seq(p, i))
                    rk_store_u16(out + 16, <uint16_t>mlen)
                pg_copy_short(out + record, name, mlen)
                out += record + mlen
                i += 1
            p = p.level[0].forward
            i = 0
        at[0] = NULL
        at_pos[0] = 0
        return out

    def dump_chunks(self, Py_ssize_t max_bytes):
        """:meth:`dump` in pieces (as rankd._skiplist's: see the contract)."""
        return _DumpChunks(self, max_bytes)

    def dump_walk(self, Py_ssize_t max_bytes):
        """A walked dump's records in pieces (as rankd._skiplist's: see the
        contract); the index may change between pieces."""
        return _DumpWalk(self, max_bytes)

    cdef pg_page *_after(self, double key, uint64_t seq, const char *member,
                         Py_ssize_t mlen, Py_ssize_t *pos) noexcept:
        """The page and entry (``pos``) of the first entry sorting after the
        target (which may no longer be in the index); NULL if none does."""
        cdef pg_path path
        cdef pg_page *p = self._search(key, seq, member, mlen, False, &path)
        cdef Py_ssize_t i
        if p == NULL:
            return NULL
        i = self._lower(p, key, seq, member, mlen)
        if i < p.n and self._cmp(p, i, key, seq, member, mlen) == 0:
            i += 1  # the target itself
        if i == p.n:
            p, i = p.level[0].forward, 0
        pos[0] = i
        return p

    @classmethod
    def load(cls, data, *, Names names=None):
        """Rebuild an index from :meth:`dump` output (by either implementation).

        Raises ``ValueError`` if the data is corrupt.  Records arrive in rank
        order, so pages are filled to 7/8 and appended without a search.
        ``names``: the arena to store the names in (a board's, shared by
        its indexes: see :class:`Names`); the index's own if not given.

        Runtime complexity: O(n).
        """
        return _load(cls, _DumpReader((data,), False),
                     _checked_dump_size(data, DUMP_VERSION_NO_SEQS), names)

    @classmethod
    def load_chunks(cls, pieces, size=None, *, Names names=None):
        """:meth:`load` of pieces (as rankd._skiplist's: see the contract)."""
        return _load(cls, _DumpReader(pieces), -1 if size is None else size, names)

    cdef void _append_page(self, pg_page *r, pg_loading *ld) noexcept nogil:
        """Link an empty page after every page (loading).  The page before
        it is full now: the count tree takes its entries."""
        cdef int i
        cdef pg_page *tail = ld.last[0]
        if ld.page != NULL:
            ct_add(&self.counts, ld.page.pno, ld.page.n, ld.page.lead)
        ct_insert_after(&self.counts, CT_NONE if tail == self.header else tail.pno, r.pno)
        if r.height > self.height:
            self.height = r.height
        for i in range(r.height):
            ld.last[i].level[i].forward = r
            ld.last[i].level[i].flevel = r.level
            ld.last[i].level[i].fpno = r.pno
            ld.before[i] = ld.last[i]
            ld.last[i] = r
            r.level[i].forward = NULL
            r.level[i].flevel = NULL
        r.prev = NULL if tail == self.header else tail
        ld.page = r

    cdef int _widen_loading(self, pg_loading *ld) except -1:
        """While loading: the page being filled, given a key its int32
        scores cannot hold, widened.  It is the last page on each of its
        levels, so what points at it is the page table, the load's own
        pointers and the links of the pages before it (``ld.before``)."""
        cdef pg_page *q = self._widen_copy(ld.page)
        cdef int level
        if q == NULL:
            raise MemoryError()
        self.pages[q.pno] = q
        for level in range(q.height):
            ld.before[level].level[level].forward = q
            ld.last[level] = q
        ld.page = q
        return 0

    cdef inline bint _loaded_in_order(self, pg_loading *ld, double key, uint64_t seq,
                                      const char *member, Py_ssize_t mlen) noexcept nogil:
        """Whether a loaded record sorts after every entry loaded before it."""
        return ld.page == NULL or self._cmp(ld.page, ld.page.n - 1, key, seq, member,
                                            mlen) < 0

    cdef inline bint _load_needs_page(self, pg_loading *ld) noexcept nogil:
        """Whether the next loaded entry starts a page (pages are packed
        to ``ld.fill``, with no room kept)."""
        return ld.page == NULL or ld.page.n >= <uint32_t>ld.fill

    cdef void _place_loaded(self, pg_loading *ld, double key, uint64_t seq, uint32_t mid,
                            uint64_t h, Py_ssize_t mlen) noexcept nogil:
        """A loaded record, its name stored as ``mid``, at the end of the
        page being filled (which has room) and in the member map."""
        cdef pg_page *page = ld.page
        cdef bint leader = self.length == 0 or key != ld.prev_key
        cdef uint32_t e = page.n   # (a loaded page's numbers are its positions)
        cdef uint32_t code = PG_CODE(PG_HASH_TAG(h), page.pno, e)
        self._map_put(code, h)
        if self.load_tags != NULL:
            self.load_tags[PG_CODE_ENTRY(code)] = <uint8_t>(h >> 4)  # (past the slot's tag)
        self.member_bytes += mlen
        if page.n == 0:
            self.firstkeys[page.pno] = key
        self._set_key(page, page.n, key)
        self._set_seq(page, page.n, seq)
        PG_IDS(page)[page.n] = mid
        PG_ENOS(page)[page.n] = <uint8_t>e
        page.used |= <uint64_t>1 << e
        page.n += 1
        page.lead += leader
        self.ndistinct += leader
        self.length += 1
        ld.prev_key = key

    cdef inline bint _hash_ahead(self, const char **at, const char *end, bint has_seq,
                                 uint64_t *h) noexcept nogil:
        """Hash the member of the record at ``at[0]``, ask for its map
        slot, and move ``at[0]`` past it; False (unmoved) if the record is
        not whole before ``end`` (``_load_run`` checks it when it gets there)."""
        cdef Py_ssize_t record = DUMP_RECORD_SIZE if has_seq else DUMP_RECORD_SIZE - 8
        cdef const char *q = at[0]
        cdef uint16_t mlen
        if end - q < record:
            return False
        mlen = rk_load_u16(q + record - 2)
        if end - q - record < mlen:
            return False
        h[0] = self._hash(q + record, mlen)
        rk_prefetch(&self.slot_ids[pg_home(h[0], self.nslots)])
        at[0] = q + record + mlen
        return True

    cdef inline uint32_t *_loaded_id(self, uint32_t code, int fill) noexcept nogil:
        """Where a loading index keeps the id of the entry ``code``: every
        page it made has room for ``fill`` entries, and an entry's number
        is its position (no entry has moved), so the place is known
        without reading the page's header."""
        return <uint32_t *>(<char *>self.pages[PG_CODE_PNO(code)] + sizeof(pg_page)
                            + PG_ENOS_BYTES(fill)) + PG_CODE_ENO(code)

    cdef inline bint _loaded_has(self, const char *member, Py_ssize_t mlen,
                                 uint64_t h, int fill) noexcept nogil:
        """Whether a loading index holds ``member`` already: ``_slot`` for
        an index that only ``_place_loaded`` filled (see ``_loaded_id``),
        where no resize is under way."""
        cdef size_t i = pg_home(h, self.nslots)
        cdef uint32_t code = self.slot_ids[i], tag = PG_HASH_TAG(h)
        cdef Py_ssize_t nlen
        cdef const char *name
        while code != 0:
            # (the tags first: a name is two misses away)
            if PG_CODE_TAG(code) == tag and (
                    self.load_tags == NULL
                    or self.load_tags[PG_CODE_ENTRY(code)] == <uint8_t>(h >> 4)):
                name = self._name(self._loaded_id(code, fill)[0], &nlen)
                if nlen == mlen and memcmp(name, member, mlen) == 0:
                    return True
            i = i + 1 if i + 1 < self.nslots else 0
            code = self.slot_ids[i]
        return False

    cdef inline void _prefetch_probe(self, uint64_t h, int stage, int fill) noexcept nogil:
        """Ask for what a probe for the hash ``h`` reads of the entries it
        compares (up to 8: the slots from its home to the first empty
        one), a stage at a time, the second after the first had time to
        arrive: 0 their ids, 1 the names; with the load's tags, only the
        tags.  Only while loading (see ``_loaded_id``)."""
        cdef size_t i = pg_home(h, self.nslots)
        cdef uint32_t code, tag = PG_HASH_TAG(h)
        cdef int k
        if self.load_tags != NULL and stage != 0:
            return  # (the tags filter the names: a match is rare)
        for k in range(8):
            code = self.slot_ids[i]
            if code == 0:
                return
            if PG_CODE_TAG(code) != tag:
                pass  # another member (the slot's tag says so)
            elif self.load_tags != NULL:
                rk_prefetch(&self.load_tags[PG_CODE_ENTRY(code)])
            elif stage == 0:
                rk_prefetch(self._loaded_id(code, fill))
            else:
                pg_prefetch_rec(&self.arena.names[self._loaded_id(code, fill)[0]])
            i = i + 1 if i + 1 < self.nslots else 0

    cdef uint64_t _load_run(self, const char **p, const char *end, uint64_t i, uint64_t stop,
                            uint64_t next_seq, bint has_seq, pg_loading *ld) noexcept nogil:
        """The dump's records from ``i`` on (below ``stop``, at ``p[0]``;
        ``end``: the end of the bytes read so far) loaded without the GIL,
        as the skip list's run does: while each lies whole before ``end``,
        is sound, in order and new, and its name (and a page, when the one
        being filled is full) finds memory.  Returns the first record not
        loaded, which ``_load`` then takes with the GIL."""
        cdef pg_page *page
        cdef uint32_t mid
        cdef uint64_t seq, h
        cdef double score, key
        cdef uint16_t mlen
        cdef const char *q
        # The records ahead, hashed (ring, by record & 15) and their map
        # slots asked for, LOAD_AHEAD records before their probe: a probe is
        # a miss in the map and one in the names of the slots it passes.
        cdef uint64_t ring[16]
        cdef const char *ahead = p[0]
        cdef uint64_t hashed = i
        # Sharing an arena: the first other index, where a member of this
        # one is most likely listed already (a board's windows hold the
        # same members), is asked for ahead as this index's own map is.
        cdef void *other = NULL
        if self.arena.nmembers > 1:
            other = self.arena.members[1 if self.arena.members[0] == <void *>self else 0]
        while hashed < stop and hashed < i + LOAD_AHEAD and self._hash_ahead(
                &ahead, end, has_seq, &ring[hashed & 15]):
            hashed += 1
        while i < stop:
            q = p[0]
            if not _dump_record_whole(&q, end, next_seq, &score, &seq, &mlen, has_seq):
                break
            key = self._key(score)
            if not self._narrow(key) and (self._load_needs_page(ld) or not ld.page.wide):
                break  # (a wide page: with the GIL, in _load)
            if not self._loaded_in_order(ld, key, seq, q, mlen):
                break
            h = ring[i & 15] if i < hashed else self._hash(q, mlen)
            if hashed < stop and hashed == i + LOAD_AHEAD and self._hash_ahead(
                    &ahead, end, has_seq, &ring[hashed & 15]):
                hashed += 1
            # (the slots asked for earlier are here now: ask for the
            # ids and then the names their probes will compare)
            if i + 6 < hashed:
                self._prefetch_probe(ring[(i + 6) & 15], 0, ld.fill)
            if i + 3 < hashed:
                self._prefetch_probe(ring[(i + 3) & 15], 1, ld.fill)
            if other != NULL:
                if i + 7 < hashed:
                    (<RankIndex>other)._prefetch_listed(ring[(i + 7) & 15], 0)
                if i + 5 < hashed:
                    (<RankIndex>other)._prefetch_listed(ring[(i + 5) & 15], 1)
                if i + 3 < hashed:
                    (<RankIndex>other)._prefetch_listed(ring[(i + 3) & 15], 2)
                if i + 1 < hashed:
                    (<RankIndex>other)._prefetch_listed(ring[(i + 1) & 15], 3)
            if self._loaded_has(q, mlen, h, ld.fill):
                break
            if self._load_needs_page(ld):
                # (before the name: a page left empty by a name that
                # found no memory is filled by the load with the GIL)
                page = self._page_alloc(ld.fill)
                if page == NULL:
                    break
                self._append_page(page, ld)
                ld.pages += 1
            # Another index of the arena's record of the name (a board's
            # windows hold the same members), or a new one.
            mid = self._shared_id(q, mlen, h) if self.arena.nmembers > 1 else 0
            if mid == 0:
                mid = self._name_put(q, mlen)
                if mid == 0:
                    break
                ld.names += 1
            self._place_loaded(ld, key, seq, mid, h, mlen)
            p[0] = q + mlen
            i += 1
        return i

    # --- invariants -----------------------------------------------------------------

    cdef _check_tag(self, uint32_t code):
        """A slot's code (0: empty) names a live entry whose member's hash
        has the code's tag."""
        cdef Py_ssize_t pos, mlen
        cdef pg_page *p
        cdef const char *name
        if code == 0:
            return
        assert PG_CODE_PNO(code) < self.pnos_used and self.pages[PG_CODE_PNO(code)] != NULL, \
            "a slot names no page"
        p = self.pages[PG_CODE_PNO(code)]
        pos = pg_find_eno(PG_ENOS(p), p.n, PG_CODE_ENO(code))
        assert pos >= 0, "a slot names no entry"
        name = self._name(PG_IDS(p)[pos], &mlen)
        assert PG_CODE_TAG(code) == PG_HASH_TAG(self._hash(name, mlen)), \
            "a slot's tag is not its member's hash's"

    def _check(self):
        """Verify every invariant; ``AssertionError`` names the first broken one.

        Checks the strict order of all entries, page fills (1..page_size,
        at least page_size // 2 but on the last page), every level's links
        (page numbers and towers, each level linking its tall pages in
        order), ``prev`` links, entry numbers, the member map (each member's slot holds
        its entry's code, and every slot's tag is its member's hash's) and
        counters.
        Runtime complexity: O(n * levels).
        """
        cdef pg_page *p = self.header.level[0].forward
        cdef pg_page *prevp = NULL
        cdef pg_page *x
        cdef pg_page *nxt
        cdef Py_ssize_t n = 0, leaders = 0, nbytes = 0, i, mlen, pidx, count
        cdef Py_ssize_t slots_used = 0
        cdef int level
        cdef double prev_key = 0.0
        cdef uint32_t mid
        cdef uint64_t used, h
        cdef const char *name
        cdef list pages = []
        assert self.seq_bytes == 0 if self.tie_by_member else self.seq_bytes in (4, 8), \
            "seq width"
        while p != NULL:
            assert p.prev == prevp, "prev link broken"
            assert 1 <= p.n <= p.cap <= self.page_size, f"page holds {p.n} entries"
            if p.level[0].forward != NULL and not self.left_sparse:
                assert p.n >= self.min_fill, (
                    f"page below minimum fill: {p.n} < {self.min_fill}")
            assert self.pages[p.pno] == p, "page table does not point at the page"
            assert self.firstkeys[p.pno] == self._key_at(p, 0), "first key not kept"
            assert signbit(self.firstkeys[p.pno]) == signbit(self._key_at(p, 0)), "first key's zero"
            pages.append(<size_t>p)
            count = 0
            used = 0
            for i in range(p.n):
                assert PG_ENOS(p)[i] < self.page_size, "entry number past the page size"
                assert not (used >> PG_ENOS(p)[i]) & 1, "entry number used twice in a page"
                used |= <uint64_t>1 << PG_ENOS(p)[i]
            assert used == p.used, "page's entry numbers in use are wrong"
            for i in range(p.n):
                mid = PG_IDS(p)[i]
                name = self._name(mid, &mlen)
                nbytes += mlen
                if i > 0:
                    assert self._cmp(p, i - 1, self._key_at(p, i), self._seq(p, i), name, mlen) < 0, \
                        "entries out of order"
                elif prevp != NULL:
                    assert self._cmp(prevp, prevp.n - 1, self._key_at(p, 0), self._seq(p, 0),
                                     name, mlen) < 0, "entries out of order across pages"
                if n == 0 or self._key_at(p, i) != prev_key:
                    leaders += 1
                    count += 1
                prev_key = self._key_at(p, i)
                n += 1
                h = self._hash(name, mlen)
                pidx = self._slot(name, mlen, h)
                assert PG_CODE_ENTRY(self._slot_code(pidx)) == PG_CODE_ENTRY(
                    PG_CODE(0, p.pno, PG_ENOS(p)[i])), \
                    "member map misses a member or names another entry"
                assert PG_CODE_TAG(self._slot_code(pidx)) == PG_HASH_TAG(h), \
                    "a slot's tag is not its member's hash's"
            assert count == p.lead, f"page leader count {p.lead} != {count}"
            prevp = p
            p = p.level[0].forward
        assert n == self.length, f"length {self.length} != {n} entries"
        assert leaders == self.ndistinct, f"ndistinct {self.ndistinct} != {leaders}"
        assert nbytes == self.member_bytes, "member_bytes is wrong"
        for i in range(self.nslots):
            slots_used += self.slot_ids[i] != 0
            assert self.slot_ids[i] != MOVED, "a moved mark in the table"
            self._check_tag(self.slot_ids[i])
        if self.old_ids != NULL:
            for i in range(self.old_nslots):
                assert i >= self.migrate_pos or self.old_ids[i] == MOVED, "an id behind the step"
                slots_used += self.old_ids[i] != 0 and self.old_ids[i] != MOVED
                if self.old_ids[i] != MOVED:
                    self._check_tag(self.old_ids[i])
        assert slots_used == self.length, "member map holds stale ids"
        self._check_arena()
        assert self.height >= 1
        for level in range(self.height):
            x = self.header
            while x != NULL:
                nxt = x.level[level].forward
                assert x == self.header or x.height > level, f"a link above its page's height"
                assert nxt == NULL or x.level[level].fpno == nxt.pno, "link's page number"
                assert nxt == NULL or x.level[level].flevel == nxt.level, "link's tower"
                x = nxt
        for level in range(self.height, MAX_LEVEL):
            assert self.header.level[level].forward == NULL
        # level i links every page of height > i, in order
        for level in range(1, self.height):
            x = self.header.level[level].forward
            expected = [q for q in pages if (<pg_page *><size_t>q).height > level]
            got = []
            while x != NULL:
                got.append(<size_t>x)
                x = x.level[level].forward
            assert got == expected, f"level {level} skips a tall page"
        self._check_counts(pages)

    cdef _check_counts(self, list pages):
        """The count tree lists ``pages`` (addresses, in rank order) in its
        leaves, left to right, each with its entries and leaders; every
        node counts the entries and leaders under it, knows its parent and its slot there, and is not
        empty; the tree is ``depth`` levels everywhere; ``where`` gives
        each page's leaf and slot; the free nodes are the ones not in the tree."""
        cdef pg_counts *ct = &self.counts
        cdef list level = [] if ct.root == CT_NONE else [ct.root]
        cdef list below, listed = []
        cdef uint32_t *node
        cdef uint32_t *ids
        cdef uint32_t *counts
        cdef uint32_t id, i, free_id
        cdef size_t depth = 0, seen = 0
        cdef set nodes = set()
        cdef pg_page *p
        if not pages:
            assert ct.root == CT_NONE and ct.depth == 0, "a count tree over no page"
        else:
            assert ct_node(ct, ct.root)[0] == CT_NONE, "the root has a parent"
        while level:
            depth += 1
            below = []
            for id in level:
                assert id < ct.made and id not in nodes, "a node listed twice or never made"
                nodes.add(id)
                node = ct_node(ct, id)
                ids = ct_children(ct, node)
                counts = ct_counts(ct, node)
                assert 1 <= node[1] <= ct.fanout, f"a node of {node[1]} children"
                assert (node[3] != 0) == (depth == ct.depth), "leaves not all at the bottom"
                for i in range(node[1]):
                    if node[3]:
                        listed.append((ids[i], counts[i], ct_leads(ct, node)[i]))
                        assert ct.where[ids[i]] == id << 6 | i, "where names another place"
                    else:
                        assert ct_node(ct, ids[i])[0] == id, "a child's parent is wrong"
                        assert ct_node(ct, ids[i])[2] == i, "a child's slot is wrong"
                        assert counts[i] == ct_sum(ct_counts(ct, ct_node(ct, ids[i])),
                                                   ct_node(ct, ids[i])[1]), \
                            "a node's count is not its children's sum"
                        assert ct_leads(ct, node)[i] == ct_sum(
                            ct_leads(ct, ct_node(ct, ids[i])), ct_node(ct, ids[i])[1]), \
                            "a node's leaders are not its children's sum"
                        below.append(ids[i])
            level = below
        assert depth == ct.depth, f"count tree depth {ct.depth} != {depth}"
        assert len(listed) == len(pages), "the count tree lists other pages"
        for i in range(len(pages)):
            p = <pg_page *><size_t>pages[i]
            assert listed[i] == (p.pno, p.n, p.lead), \
                f"count tree: page {i} listed as {listed[i]}, is {(p.pno, p.n, p.lead)}"
        free_id = ct.free_list
        while free_id != CT_NONE:
            assert free_id < ct.made and free_id not in nodes, "a free node in use"
            seen += 1
            assert seen <= ct.nfree, "the free list runs on"
            free_id = ct_node(ct, free_id)[0]
        assert seen == ct.nfree and seen + len(nodes) == ct.made, "nodes lost"

    cdef _check_arena(self):
        """The free lists hold ``free_units`` units of records that no page
        of any index of the arena lists; during a compaction no live record
        lies between its cursors; the indexes that list a member list the
        same record, whose name is the member's."""
        cdef size_t units = 0, c
        cdef uint32_t mid
        cdef Py_ssize_t mlen, i, k
        cdef pg_page *p
        cdef RankIndex index
        cdef const char *at
        cdef set live = set()
        cdef dict named = {}
        for k in range(self.arena.nmembers):
            index = <RankIndex>self.arena.members[k]
            p = index.header.level[0].forward
            while p != NULL:
                for i in range(p.n):
                    mid = PG_IDS(p)[i]
                    live.add(mid)
                    at = self._name(mid, &mlen)
                    name = at[:mlen]
                    assert named.setdefault(name, mid) == mid, "two records of one member"
                p = p.level[0].forward
        assert len(live) <= self.arena.records, "records uncounted"
        for c in range(NAME_CLASSES):
            mid = self.arena.free_names[c]
            while mid != 0:
                assert mid not in live, "a free record is a member's"
                self._name(mid, &mlen)
                assert PG_NAME_UNITS(mlen) == c, "a free record is in the wrong list"
                assert not self.arena.compacting or mid < self.arena.compact_dst, "free record past the sweep"
                units += c
                mid = self.arena.names[mid + 1]
        assert units == self.arena.free_units, f"free units {self.arena.free_units} != {units}"
        if self.arena.compacting:
            assert all(m < self.arena.compact_dst or m >= self.arena.compact_src for m in live), \
                "a live record in the compaction's gap"
        assert all(m < self.arena.names_used for m in live), "a record past the arena's end"
        self._check_pool()

    cdef void _check_pool(self) except *:
        """The page heap's invariants: its blocks tile into chunks, the
        live chunks are exactly the pages in the page table, the counts of
        live and total bytes add up, and every listed hole is dead, the
        size of its list and outside the block being evacuated."""
        cdef pg_pool *pool = &self.pool
        cdef uint32_t b, off
        cdef size_t total = 0, live = 0, blive
        cdef pg_chunk *c
        cdef set pages = set()
        cdef set listed = set()
        cdef Py_ssize_t cls
        cdef uint32_t pno
        cdef pg_hole_ptr h
        cdef bint prev_dead
        for pno in range(self.pnos_used):
            if self.pages[pno] != NULL:
                pages.add(<size_t>self.pages[pno])
        for cls in range(HOLE_CLASSES):
            h = pool.holes[cls]
            while h != NULL:
                c = <pg_chunk *>h
                assert c.size & CHUNK_LISTED and not c.size & CHUNK_LIVE, "a listed hole is not dead"
                assert min((c.size & ~7u) >> 3, HOLE_CLASSES - 1) == <uint32_t>cls, \
                    "a hole in the wrong list"
                assert c.block != pool.evac, "a listed hole in the block being evacuated"
                listed.add(<size_t>c)
                h = pg_hole_next(h)
        for b in range(pool.nblocks):
            if pool.blocks[b].base == NULL:
                continue
            total += pool.blocks[b].size
            assert pool.blocks[b].used <= pool.blocks[b].size, "a block bumped past its end"
            off = 0
            blive = 0
            prev_dead = False
            while off < pool.blocks[b].used:
                c = <pg_chunk *>(pool.blocks[b].base + off)
                assert c.block == b, "a chunk names another block"
                assert c.size & ~7u >= 8, "a chunk of no size"
                assert bool(c.size & CHUNK_PREV_DEAD) == prev_dead, "a chunk's prev-dead flag"
                if not c.size & CHUNK_LIVE:
                    assert not prev_dead, "two dead chunks side by side"
                    if off + (c.size & ~7u) < pool.blocks[b].used:
                        assert c.size & ~7u >= 32, "a dead chunk too small to merge"
                        assert (<uint32_t *>(<char *>c + (c.size & ~7u) - 4))[0] == c.size & ~7u, \
                            "a dead chunk's size does not end it"
                prev_dead = not c.size & CHUNK_LIVE
                if c.size & CHUNK_LIVE:
                    blive += c.size & ~7u
                    assert <size_t>(<char *>c + 8) in pages, "a live chunk is no page"
                    pages.discard(<size_t>(<char *>c + 8))
                elif c.size & CHUNK_LISTED:
                    listed.discard(<size_t>c)
                off += c.size & ~7u
            assert off == pool.blocks[b].used, "chunks overrun their block"
            assert blive == pool.blocks[b].live, "a block's live bytes"
            assert blive > 0 or b == pool.cur, "an empty block kept"
            live += blive
        assert not pages, "a page outside the page heap"
        assert not listed, "a listed hole outside every block"
        assert total == pool.bytes and live == pool.live, "the page heap's totals"


cdef inline size_t _prev_table_size(size_t size) noexcept:
    """The member map's size before ``size`` (2^k or 3 * 2^(k-1), at least
    ``MIN_TABLE_SIZE``): 3 * 2^(k-1) -> 2^k -> 3 * 2^(k-2)."""
    if size <= MIN_TABLE_SIZE:
        return MIN_TABLE_SIZE
    if size & (size - 1) == 0:
        return size // 4 * 3
    return size // 3 * 2


cdef inline size_t _next_table_size(size_t size) noexcept:
    """The member map's next size: 2^k -> 3 * 2^(k-1) -> 2^(k+1) (a size
    that is neither, after a shrink, goes to the next that is)."""
    cdef size_t power = MIN_TABLE_SIZE
    while power * 2 <= size:
        power *= 2
    if size < power + power // 2:
        return power + power // 2
    return power * 2


cdef enum:
    # A load takes the GIL again after each run of this many + 1 records
    # loaded without it (about a millisecond).
    LOAD_YIELD_MASK = 2047


cdef object _load(type cls, _DumpReader reader, Py_ssize_t size, Names names):
    global _live_pages, _live_names
    cdef RankIndex index
    cdef pg_loading ld
    cdef const char *p
    cdef const char *at
    cdef bint has_seq, walked
    cdef Py_ssize_t name_bytes
    cdef uint64_t count, next_seq, seq, i, stop, loaded
    cdef uint16_t mlen
    cdef double score, key
    cdef uint32_t mid
    cdef uint64_t h
    cdef int level
    reader.need(DUMP_HEADER_SIZE)
    _dump_header_fields(reader.p, size, &count, &next_seq, DUMP_VERSION_NO_SEQS)
    has_seq = reader.p[4] == DUMP_VERSION
    walked = reader.p[7] == DUMP_WALKED
    index = cls("desc" if reader.p[5] == 0 else "asc", TIE_BREAK_CODES[reader.p[6]],
                names=names)
    reader.p += DUMP_HEADER_SIZE
    index._next_seq = next_seq
    if next_seq > 0:
        index._fit_seq(next_seq - 1)  # seqs are below next_seq
    index._map_reserve(count)  # (at once: no resize under way while loading)
    if size >= 0:
        # The names' bytes are what the records' fixed parts leave of the
        # dump (count was checked against size); each takes a record of
        # its bytes and a length byte, rounded up to 4, at least 8: at
        # most a quarter of its bytes + 2 units.
        name_bytes = (size - DUMP_HEADER_SIZE - 4
                      - <Py_ssize_t>count * (DUMP_RECORD_SIZE - 8 * (not has_seq)))
        if name_bytes >= <Py_ssize_t>count:
            index._names_reserve(<size_t>name_bytes // 4 + 2 * <size_t>count, <size_t>name_bytes // 4)
    ld.page = NULL
    ld.fill = index.page_size - index.page_size // 8
    # A byte of each loaded member's hash, by code, for the repeat checks
    # to compare before a name (a code's name is two misses away: its
    # page's id, then the record); about a byte a member, freed at the
    # end.  Without the memory the checks compare names.
    index.load_tags = <uint8_t *>calloc(((count + ld.fill - 1) // ld.fill + 1) * 64 + 1, 1)
    ld.prev_key = 0.0
    ld.pages = ld.names = 0
    for level in range(MAX_LEVEL):
        ld.last[level] = index.header
    i = 0
    while i < count:
        # A big index is loaded in a worker thread (a cluster node taking a
        # group): its records are loaded without the GIL, a run at a time,
        # so that the event loop's thread, which takes the GIL for each of
        # its callbacks, never waits for more than a run.
        stop = min(count, (i | LOAD_YIELD_MASK) + 1)
        at = reader.p
        with nogil:
            loaded = index._load_run(&at, reader.end, i, stop, next_seq, has_seq, &ld)
        reader.p = at
        _live_names += ld.names
        _live_pages += ld.pages
        ld.pages = ld.names = 0
        i = loaded
        if i == stop:
            continue
        # A record that straddles the pieces read so far, or is not sound,
        # or found no memory: as it always was, with the GIL (reading on,
        # or raising).
        _dump_record_read(reader, i, next_seq, &score, &seq, &mlen, has_seq)
        p = reader.p
        key = index._key(score)
        if not index._loaded_in_order(&ld, key, seq, p, mlen):
            raise ValueError(f"rank index dump is out of order at record {i}")
        h = index._hash(p, mlen)
        if index._slot(p, mlen, h) != -1:
            if not walked:
                raise ValueError(f"rank index dump repeats a member at record {i}")
            reader.p += mlen  # written again while walked: its first record stays
            i += 1
            continue
        if index._load_needs_page(&ld):
            # (before the name: a page left empty by a failed name is
            # freed with the index, a name without its entry is not)
            index._append_page(index._new_page(ld.fill, not index._narrow(key)), &ld)  # packed
        elif not ld.page.wide and not index._narrow(key):
            index._widen_loading(&ld)
        mid = index._name_new(p, mlen, h)
        index._place_loaded(&ld, key, seq, mid, h, mlen)
        reader.p += mlen
        i += 1
    reader.finish()
    free(index.load_tags)
    index.load_tags = NULL
    if ld.page != NULL:
        ct_add(&index.counts, ld.page.pno, ld.page.n, ld.page.lead)  # (see _append_page)
        index._shrink(ld.page)  # the last page may be short
    # The map was sized for every record; a walked dump's repeats leave it
    # roomier than its members need: shrink it as a removal would, and
    # move the old table now (without the GIL, as the records were): the
    # load was already as long as its records, and a write after it would
    # scan an old table of any size (a dump of many repeats).
    index._map_shrink()
    if index.old_ids != NULL:
        with nogil:
            index._map_finish()
    index.peak_length = index.length
    index.reset_peaks()
    return index


@cython.final
cdef class _DumpChunks(_DumpPieces):
    """``RankIndex.dump_chunks``: the pieces, from entry ``pos`` of ``page`` on."""

    cdef RankIndex index
    cdef pg_page *page
    cdef Py_ssize_t pos

    def __cinit__(self, RankIndex index, Py_ssize_t max_bytes):
        cdef Py_ssize_t record = DUMP_RECORD_SIZE - 8 * index.tie_by_member
        self.index = index
        self.page = index.header.level[0].forward
        self.pos = 0
        self.mutations = index.mutations
        self.size = DUMP_HEADER_SIZE + index.length * record + index.member_bytes + 4

    def __next__(self):
        cdef char *p = self.scratch
        cdef char *first
        cdef pg_page *page = self.page
        cdef Py_ssize_t pos = self.pos
        if self.done:
            raise StopIteration
        if self.index.mutations != self.mutations:
            raise RuntimeError("rank index changed during its dump")
        if not self.started:
            self.index._write_dump_header(p)
            p += DUMP_HEADER_SIZE
            self.started = True
        first = p
        with nogil:
            p = self.index._dump_pages(&page, &pos, p, self.scratch + self.max_bytes)
            if p == first and page != NULL:  # one record at least
                p = self.index._dump_pages(&page, &pos, p, self.scratch + _dump_chunk_room(0))
        self.page = page
        self.pos = pos
        return self._piece(p - self.scratch, page == NULL)


@cython.final
cdef class _DumpWalk(_WalkPieces):
    """``RankIndex.dump_walk``: a walked dump's records, a piece at a time,
    each from the first entry after the last record written."""

    cdef RankIndex index

    def __cinit__(self, RankIndex index, Py_ssize_t max_bytes):
        self.index = index

    def __next__(self):
        cdef RankIndex index = self.index
        cdef pg_page *page
        cdef Py_ssize_t pos = 0, last_pos = 0
        cdef Py_ssize_t record = DUMP_RECORD_SIZE - 8 * index.tie_by_member
        cdef char *p = self.scratch
        cdef char *q
        if self.done:
            raise StopIteration
        if self.started:
            page = index._after(self.key, self.seq, self.member, self.mlen, &pos)
        else:
            page = index.header.level[0].forward
            self.started = True
        if page == NULL:
            self.done = True
            raise StopIteration
        p = index._dump_pages(&page, &pos, p, self.scratch + self.max_bytes)
        if p == self.scratch:  # one record at least
            p = index._dump_pages(&page, &pos, p,
                                  self.scratch + DUMP_RECORD_SIZE + MAX_MEMBER_BYTES)
        # The last record written: found again by reading the piece.
        q = self.scratch
        while q < p:
            last_pos = q - self.scratch
            q += record + rk_load_u16(q + record - 2)
            self.records += 1
        q = self.scratch + last_pos
        self._written(index._key(rk_load_f64(q)),
                      0 if index.tie_by_member else rk_load_u64(q + 8),
                      q + record, rk_load_u16(q + record - 2))
        self.done = page == NULL
        return PyBytes_FromStringAndSize(self.scratch, p - self.scratch)

    def header(self):
        """The walked dump's header: the records written so far, and the
        index's next seq now (above every seq written)."""
        cdef RankIndex index = self.index
        return _walked_header(DUMP_VERSION_NO_SEQS if index.tie_by_member else DUMP_VERSION,
                              index.descending, index.tie_by_member + index.tie_member_desc,
                              self.records, index._next_seq)


def _load_from_dump(data):
    return RankIndex.load(data)


@cython.final
cdef class _Iterator:
    """Walks an index in rank order; any write to the index invalidates it."""

    cdef RankIndex index
    cdef pg_page *page
    cdef Py_ssize_t pos
    cdef Py_ssize_t mutations

    def __cinit__(self, RankIndex index):
        self.index = index
        self.page = index.header.level[0].forward
        self.pos = 0
        self.mutations = index.mutations

    def __iter__(self):
        return self

    def __next__(self):
        cdef pg_page *p = self.page
        cdef Py_ssize_t pos = self.pos
        if self.index.mutations != self.mutations:
            raise RuntimeError("rank index changed during iteration")
        if p == NULL:
            raise StopIteration
        self.pos += 1
        if self.pos == p.n:
            self.page = p.level[0].forward
            self.pos = 0
        return (self.index._member_str(p, pos), self.index._score_at(p, pos))


# --- C entry points for the daemon's native lanes (see _pages.pxd) ---

include "_pages_lanes.pxi"
