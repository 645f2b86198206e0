# cython: language_level=3
"""C-level declarations of the native rank index.

The C structures (nodes, levels, the arena, SipHash) and :class:`RankIndex`'s
fields and C methods live here so that other native modules (the engine's
ingest kernel, ``rankd.engine._ingest``) can cimport the index and write to it
without a Python call per operation.  The skip list itself is explained in
``_skiplist.pyx``; the ``c_*`` methods at the end are the entry points meant
for other modules.
"""

cimport cython
from libc.stdint cimport int64_t, uint8_t, uint16_t, uint32_t, uint64_t, uintptr_t

cdef extern from "Python.h":
    const char *PyUnicode_AsUTF8AndSize(object unicode, Py_ssize_t *size) except NULL

cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>

    typedef struct rk_node rk_node;

    typedef struct rk_level {
        rk_node *forward;
        double fkey;     /* forward->key: most search steps decide on it
                            without touching the (likely uncached) forward node */
        uint32_t span;   /* nodes in (this, forward]; to NULL: to the end */
        uint32_t dspan;  /* leaders in (this, forward] */
    } rk_level;

    struct rk_node {
        double key;          /* score, negated on descending boards */
        uint64_t seq;        /* arrival sequence */
        rk_node *backward;   /* level-0 predecessor; NULL for the first node */
        uint32_t hash;       /* low bits of the member's SipHash */
        uint16_t mlen;       /* member length in bytes */
        uint8_t nlevels;
        uint8_t queued;      /* set_states: already in its batch of moved nodes */
        rk_level level[];    /* nlevels entries, then the member's bytes */
    };

    #define RK_MEMBER(n) ((char *)&(n)->level[(n)->nlevels])
    #define RK_NODE_SIZE(nlevels, mlen) \\
        (sizeof(rk_node) + (size_t)(nlevels) * sizeof(rk_level) + (size_t)(mlen))

    /* SipHash-1-3 (Aumasson and Bernstein), the variant CPython uses for
       str hashes: fast on short keys, and keyed so that colliding member
       names cannot be precomputed. */
    #define RK_ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))
    #define RK_SIPROUND do { \\
        v0 += v1; v1 = RK_ROTL(v1, 13); v1 ^= v0; v0 = RK_ROTL(v0, 32); \\
        v2 += v3; v3 = RK_ROTL(v3, 16); v3 ^= v2; \\
        v0 += v3; v3 = RK_ROTL(v3, 21); v3 ^= v0; \\
        v2 += v1; v1 = RK_ROTL(v1, 17); v1 ^= v2; v2 = RK_ROTL(v2, 32); \\
    } while (0)

    static uint64_t rk_siphash13(uint64_t k0, uint64_t k1, const char *src, size_t len) {
        uint64_t b = (uint64_t)len << 56;
        uint64_t v0 = k0 ^ 0x736f6d6570736575ULL;
        uint64_t v1 = k1 ^ 0x646f72616e646f6dULL;
        uint64_t v2 = k0 ^ 0x6c7967656e657261ULL;
        uint64_t v3 = k1 ^ 0x7465646279746573ULL;
        const uint8_t *in = (const uint8_t *)src;
        uint64_t t = 0, m;
        while (len >= 8) {
            memcpy(&m, in, 8);   /* little-endian hosts only; see setup.py */
            v3 ^= m; RK_SIPROUND; v0 ^= m;
            in += 8; len -= 8;
        }
        switch (len) {
            case 7: t |= ((uint64_t)in[6]) << 48; /* fall through */
            case 6: t |= ((uint64_t)in[5]) << 40; /* fall through */
            case 5: t |= ((uint64_t)in[4]) << 32; /* fall through */
            case 4: t |= ((uint64_t)in[3]) << 24; /* fall through */
            case 3: t |= ((uint64_t)in[2]) << 16; /* fall through */
            case 2: t |= ((uint64_t)in[1]) << 8;  /* fall through */
            case 1: t |= ((uint64_t)in[0]);
        }
        b |= t;
        v3 ^= b; RK_SIPROUND; v0 ^= b;
        v2 ^= 0xff;
        RK_SIPROUND; RK_SIPROUND; RK_SIPROUND;
        return v0 ^ v1 ^ v2 ^ v3;
    }

    /* Strict UTF-8 validation (no overlong forms, no surrogates, nothing
       above U+10FFFF): load() must not hand Python undecodable members. */
    static int rk_utf8_valid(const uint8_t *s, size_t n) {
        size_t i = 0;
        while (i < n) {
            uint8_t c = s[i];
            if (c < 0x80) { i++; continue; }
            size_t need; uint32_t cp;
            if (c >= 0xC2 && c <= 0xDF) { need = 1; cp = c & 0x1F; }
            else if (c >= 0xE0 && c <= 0xEF) { need = 2; cp = c & 0x0F; }
            else if (c >= 0xF0 && c <= 0xF4) { need = 3; cp = c & 0x07; }
            else return 0;
            if (n - i <= need) return 0;
            for (size_t k = 1; k <= need; k++) {
                uint8_t cc = s[i + k];
                if ((cc & 0xC0) != 0x80) return 0;
                cp = (cp << 6) | (cc & 0x3F);
            }
            if ((need == 2 && cp < 0x800) || (need == 3 && cp < 0x10000)) return 0;
            if (cp >= 0xD800 && cp <= 0xDFFF) return 0;
            if (cp > 0x10FFFF) return 0;
            i += need + 1;
        }
        return 1;
    }

    /* Tunables, with their reasons.  32 levels hold 2**64 nodes at
       branching 4, far past the 2**32 limit the 32-bit spans set. */
    #define RK_MAX_LEVEL 32
    /* Redis's ZSKIPLIST_P of 1/4: ~1.33 level entries per node. */
    #define RK_DEFAULT_BRANCHING 4
    #define RK_MIN_TABLE_SIZE 8
    #define RK_MAX_LENGTH 4294967294LL
    /* Mirrors of rankd.index._contract (this module must not import the
       rankd.index package, whose __init__ imports this module). */
    #define RK_MAX_MEMBER_BYTES 256
    #define RK_MAX_EXACT_INT 9007199254740992LL
    #define RK_MAX_SEQ 9223372036854775807LL
    #define RK_DUMP_VERSION 1
    #define RK_DUMP_HEADER_SIZE 24
    #define RK_DUMP_RECORD_SIZE 18
    enum { RK_SET, RK_SET_NEW, RK_SET_EXISTS, RK_SET_BETTER, RK_SET_WORSE, RK_INCR,
           RK_REMOVE };

    /* The last two members an index hashed, and their hashes.  A batch's
       write asks for one member's hash up to four times (its slot and its
       node warmed a submission apart, then the lookup and the write), and
       a short member costs SipHash far more than a compare.  Members are
       never empty, so a size of 0 is an empty entry. */
    typedef struct rk_hash_memo {
        uint32_t value[2];
        uint16_t size[2];
        uint8_t next;
        char member[2][RK_MAX_MEMBER_BYTES];
    } rk_hash_memo;

    static inline uint32_t rk_hash_memo_get(rk_hash_memo *m, uint64_t k0, uint64_t k1,
                                            const char *member, size_t mlen) {
        for (int i = 0; i < 2; i++)
            if (m->size[i] == mlen && memcmp(m->member[i], member, mlen) == 0)
                return m->value[i];
        uint32_t h = (uint32_t)rk_siphash13(k0, k1, member, mlen);
        if (mlen <= RK_MAX_MEMBER_BYTES) {
            int i = m->next;
            memcpy(m->member[i], member, mlen);
            m->size[i] = (uint16_t)mlen;
            m->value[i] = h;
            m->next = (uint8_t)(i ^ 1);
        }
        return h;
    }

    /* Node arena.  Nodes come from chunks owned by their index, with one
       free list per 8-byte size class, instead of one malloc each:
       no per-node malloc header (memory per member), no walk over the
       nodes to free an index (it frees its chunks), and chunks from 2 MiB
       up are 2 MiB aligned and advised into transparent huge pages, which
       takes most TLB misses out of the random walks a skip list does.
       Chunks double from 4 KiB so a small board stays small.  Freed nodes
       are reused; memory returns to the system on clear(), on dealloc, and
       when a relayout replaces the whole arena. */
    #include <stdlib.h>
    #include <sys/mman.h>
    #define RK_HUGE_PAGE ((size_t)2 << 20)
    #define RK_FIRST_CHUNK ((size_t)4 << 10)
    #define RK_SIZE_CLASSES 128   /* 8-byte classes up to 1 KiB > largest node */

    typedef struct rk_arena {
        char *cur, *end;          /* bump region of the newest chunk */
        void **chunks;
        size_t nchunks, cap, next_chunk;
        size_t first_chunk;       /* chunk i holds min(first_chunk << i, 2 MiB) */
        void *free_list[RK_SIZE_CLASSES];
        size_t reserved;          /* bytes of chunks held */
    } rk_arena;

    /* Advise [p, p + bytes) into huge pages; khugepaged collapses what is
       already in small ones, in the background. */
    static void rk_advise_huge(void *p, size_t bytes) {
    #ifdef MADV_HUGEPAGE
        madvise(p, bytes, MADV_HUGEPAGE);
    #endif
    }

    static void *rk_big_alloc(size_t bytes) {
        /* Page-aligned, and huge-page backed when it spans whole huge pages. */
        void *p = NULL;
        size_t align = bytes >= RK_HUGE_PAGE ? RK_HUGE_PAGE : 4096;
        if (posix_memalign(&p, align, bytes) != 0) return NULL;
        if (bytes >= RK_HUGE_PAGE) rk_advise_huge(p, bytes);
        return p;
    }

    static void rk_unmap(void *p, size_t bytes) {
        if (p != NULL) munmap(p, bytes ? bytes : 1);
    }

    /* ``bytes`` of fresh mappings at a 2 MiB aligned address (``prot``:
       PROT_NONE to reserve the range only); NULL if there is none. */
    static char *rk_aligned_map(size_t bytes, int prot) {
        size_t len = bytes + RK_HUGE_PAGE;
        int flags = MAP_PRIVATE | MAP_ANONYMOUS | (prot == PROT_NONE ? MAP_NORESERVE : 0);
        char *p = mmap(NULL, len, prot, flags, -1, 0);
        if (p == MAP_FAILED) return NULL;
        char *start = (char *)(((uintptr_t)p + RK_HUGE_PAGE - 1) & ~(uintptr_t)(RK_HUGE_PAGE - 1));
        if (start > p) munmap(p, (size_t)(start - p));
        if (p + len > start + bytes) munmap(start + bytes, (size_t)(p + len - (start + bytes)));
        return start;
    }

    /* A 2 MiB chunk straight from mmap, 2 MiB aligned: unmapping it gives
       the memory back at once, where free() may keep it in the heap (glibc
       serves blocks of this size from the heap once one has been freed),
       which matters when a relayout frees a whole arena. */
    static void *rk_huge_chunk_alloc(void) {
        char *start = rk_aligned_map(RK_HUGE_PAGE, PROT_READ | PROT_WRITE);
        if (start == NULL) return NULL;
        rk_advise_huge(start, RK_HUGE_PAGE);
        return start;
    }

    /* Memory that doubles without a stall: a mapping at a 2 MiB aligned
       address (advised into huge pages if ``huge``), grown from
       ``old_bytes`` (``old`` NULL: none yet) to ``new_bytes`` (multiples
       of 2 MiB) by moving it to another aligned address, where the kernel
       moves whole page tables: a fraction of a millisecond at any size.
       realloc() moves a big block to an address of another alignment,
       where the kernel splits and copies huge pages instead, about 0.4 ms
       a megabyte (a 200 ms stall of the event loop to grow a 512 MiB log).
       NULL, with ``old`` untouched, if there is no memory. */
    static char *rk_grow_map(char *old, size_t old_bytes, size_t new_bytes, int huge) {
    #if defined(__linux__) && defined(MREMAP_FIXED)
        char *dest = rk_aligned_map(new_bytes, PROT_NONE);
        if (dest == NULL) return NULL;
        void *moved = old == NULL
            ? mmap(dest, new_bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0)
            : mremap(old, old_bytes, new_bytes, MREMAP_MAYMOVE | MREMAP_FIXED, dest);
        if (moved == MAP_FAILED) {
            munmap(dest, new_bytes);
            return NULL;
        }
    #else
        char *dest = rk_aligned_map(new_bytes, PROT_READ | PROT_WRITE);
        if (dest == NULL) return NULL;
        if (old != NULL) {
            memcpy(dest, old, old_bytes);
            munmap(old, old_bytes);
        }
    #endif
        if (huge) rk_advise_huge(dest, new_bytes);
        return dest;
    }

    /* A zeroed table of ``bytes``; NULL if there is no memory.  A big one
       (2 MiB or more, a multiple of it) is a fresh mapping, which the kernel
       zeroes a page at a time as it is written: zeroing it all at once
       stalled a resize (0.3 s for 128 MiB on a virtual machine's fresh
       memory).  It stays in small pages until its owner has filled it and
       advises it into huge ones (rk_advise_huge): a huge page's first write
       costs 2.5 to 5 ms there, and a resize's first entries, scattered over
       the table, would take dozens of them at once.  ``huge``: advised
       into huge pages from the start, for a table filled from one end
       (its huge pages are then faulted in one at a time). */
    static void *rk_zeroed_table(size_t bytes, int huge) {
        if (bytes >= RK_HUGE_PAGE) return rk_grow_map(NULL, 0, bytes, huge);
        return calloc(bytes, 1);
    }

    /* Free what rk_zeroed_table(bytes) gave. */
    static void rk_free_table(void *p, size_t bytes) {
        if (p == NULL) return;
        if (bytes >= RK_HUGE_PAGE) munmap(p, bytes);
        else free(p);
    }

    static void rk_arena_init_from(rk_arena *a, size_t first_chunk) {
        memset(a, 0, sizeof(*a));
        a->next_chunk = a->first_chunk = first_chunk;
    }

    static void rk_arena_init(rk_arena *a) {
        rk_arena_init_from(a, RK_FIRST_CHUNK);
    }

    static void rk_arena_release(rk_arena *a) {
        size_t size = a->first_chunk;
        for (size_t i = 0; i < a->nchunks; i++) {
            if (size == RK_HUGE_PAGE) munmap(a->chunks[i], size);
            else free(a->chunks[i]);
            if (size < RK_HUGE_PAGE) size *= 2;
        }
        free(a->chunks);
        rk_arena_init(a);
    }

    static void *rk_arena_alloc(rk_arena *a, size_t size) {
        size_t cls = (size + 7) >> 3;
        void *p = a->free_list[cls];
        if (p != NULL) {
            a->free_list[cls] = *(void **)p;
            return p;
        }
        size = cls << 3;
        if ((size_t)(a->end - a->cur) < size) {
            if (a->nchunks == a->cap) {
                size_t cap = a->cap ? a->cap * 2 : 16;
                void **chunks = realloc(a->chunks, cap * sizeof(void *));
                if (chunks == NULL) return NULL;
                a->chunks = chunks;
                a->cap = cap;
            }
            char *chunk = a->next_chunk == RK_HUGE_PAGE ? rk_huge_chunk_alloc()
                                                        : rk_big_alloc(a->next_chunk);
            if (chunk == NULL) return NULL;
            a->chunks[a->nchunks++] = chunk;
            a->cur = chunk;
            a->end = chunk + a->next_chunk;
            a->reserved += a->next_chunk;
            if (a->next_chunk < RK_HUGE_PAGE) a->next_chunk *= 2;
        }
        p = a->cur;
        a->cur += size;
        return p;
    }

    static void rk_arena_free(rk_arena *a, void *p, size_t size) {
        size_t cls = (size + 7) >> 3;
        *(void **)p = a->free_list[cls];
        a->free_list[cls] = p;
    }

    /* The chunks of the arenas a relayout empties, as sorted address
       ranges: a node in them has not been moved yet (see RankIndex._relayout_begin). */
    typedef struct rk_range { uintptr_t start, end; } rk_range;
    typedef struct rk_ranges { rk_range *range; size_t n, last; } rk_ranges;

    static int rk_range_cmp(const void *a, const void *b) {
        uintptr_t x = ((const rk_range *)a)->start, y = ((const rk_range *)b)->start;
        return (x > y) - (x < y);
    }

    static size_t rk_arena_ranges(const rk_arena *a, rk_range *out) {
        size_t size = a->first_chunk;
        for (size_t i = 0; i < a->nchunks; i++) {
            out[i].start = (uintptr_t)a->chunks[i];
            out[i].end = (uintptr_t)a->chunks[i] + size;
            if (size < RK_HUGE_PAGE) size *= 2;
        }
        return a->nchunks;
    }

    /* The ranges of arenas a and b; -1 (r empty) if there is no memory. */
    static int rk_ranges_of(rk_ranges *r, const rk_arena *a, const rk_arena *b) {
        r->range = malloc((a->nchunks + b->nchunks + 1) * sizeof(rk_range));
        r->n = r->last = 0;
        if (r->range == NULL) return -1;
        r->n = rk_arena_ranges(a, r->range);
        r->n += rk_arena_ranges(b, r->range + r->n);
        qsort(r->range, r->n, sizeof(rk_range), rk_range_cmp);
        return 0;
    }

    static inline int rk_ranges_hold(rk_ranges *r, const void *p) {
        uintptr_t at = (uintptr_t)p;
        size_t lo = 0, hi = r->n;
        /* A relayout meets the nodes of one chunk after another. */
        if (r->last < r->n && r->range[r->last].start <= at && at < r->range[r->last].end)
            return 1;
        while (lo < hi) {  /* the first range starting after p */
            size_t mid = (lo + hi) / 2;
            if (r->range[mid].start <= at) lo = mid + 1; else hi = mid;
        }
        if (lo == 0 || at >= r->range[lo - 1].end) return 0;
        r->last = lo - 1;
        return 1;
    }

    static void rk_ranges_free(rk_ranges *r) {
        free(r->range);
        r->range = NULL;
        r->n = 0;
    }

    #define rk_prefetch(p) __builtin_prefetch(p)
    /* A node of one or two levels spans two cache lines. */
    #define rk_prefetch_node(n) do { \
        __builtin_prefetch(n); __builtin_prefetch((const char *)(n) + 64); } while (0)
    /* The line(s) of a node's level[i] entry: where a search that reaches
       it on level i reads next (the entries below it are usually on the
       same line, or belong to a node tall enough to be cached anyway).
       Prefetching all of a node's levels issued more misses than the
       memory system overlaps. */
    /* Every cache line of [from, to). */
    static inline void rk_prefetch_lines(uintptr_t from, uintptr_t to) {
        for (; from < to; from += 64) __builtin_prefetch((const void *)from);
    }
    static inline void rk_prefetch_level(const rk_node *n, int i) {
        __builtin_prefetch(&n->level[i]);
        __builtin_prefetch((const char *)&n->level[i + 1] - 1);
    }
    /* apply_batch warms the cache for GROUP operations at a time, and only
       once the index outgrows the caches (below that it costs more than it
       saves).  A round of the walk waits on its first lane's miss, so more
       lanes hide more of it, until they outrun the misses a core keeps in
       flight and what they bring in outgrows L1: at a million members 24
       beat 12, 16, 20, 28 and 32 by 3-10% (bench/README.md).  Settable
       with -DRK_PREFETCH_GROUP=N to measure another. */
    #ifndef RK_PREFETCH_GROUP
    #define RK_PREFETCH_GROUP 24
    #endif
    #define RK_PREFETCH_MIN_LENGTH 32768
    /* From this many members, the nodes are laid out afresh in rank order
       (RankIndex._relayout_begin) once one node in RK_RELAYOUT_SHARE was
       allocated since the last layout; smaller boards sit in the caches
       whatever their layout.  A share of 8 keeps at most 12.5% of the
       nodes out of place (4: 25%, and the benchmark's million-member
       board, built by random arrivals, had 22% against 7% with 8). */
    #define RK_RELAYOUT_MIN_LENGTH 32768
    #define RK_RELAYOUT_SHARE 8
    /* A relayout under way moves this many nodes a write: the whole list
       within 1/256 as many writes as it has members, where the next one
       begins after 1/7 as many new members at the soonest.  About 25 us
       a write, where a relayout all at once stopped the event loop for
       0.1-0.4 s at millions of members.  Each step also pays a search
       and evicts some of the cache: at 32 moves a step a move cost 185
       ns, at 128 105 ns, at 512 91 ns (3M members); all at once, 30 ns.
       The hash slots of the nodes moved are repointed RK_REPOINT_BATCH
       at a time, after being prefetched. */
    #define RK_RELAYOUT_MOVES 256
    #define RK_REPOINT_BATCH 32
    /* And by the clock: a write moves nodes from a credit that grows by
       one move every RK_RELAYOUT_PACE_NS of wall time spent outside the
       steps (the clock restarts after each: counted, a move costing about
       the pace would pay for the next one), up to RK_RELAYOUT_CREDIT, and
       only once it holds RK_RELAYOUT_MIN_STEP (a step's search is paid for
       by many moves).  256 moves a write cost one event-loop callback that
       wrote 1,000 members (a follower's slice of its log, a batch of
       events) 46 ms at a million members; paced, such a callback moves at
       most the credit plus one node per RK_RELAYOUT_PACE_NS of its own
       work, whatever a move costs.  A relayout of a million nodes under steady writes
       then lasts about half a second; writes alone move it on, as before. */
    #define RK_RELAYOUT_PACE_NS 400
    /* And every write adds this many moves to the credit, whatever the
       clock says: a relayout then ends within 1/32 as many writes as the
       board has nodes, before the next can begin (1/7 as many new members
       away), so a board that keeps growing is not always holding two
       layouts.  Paced by the clock alone, a bulk load (about 2.4 us a
       write) moved 6 nodes a write and the board held 1.5x the memory at
       its end (bench_index.py: 160 against 105 B per member). */
    #define RK_RELAYOUT_PER_WRITE 32
    #define RK_RELAYOUT_CREDIT 8192
    #define RK_RELAYOUT_MIN_STEP 64
    #include <time.h>
    static inline uint64_t rk_now_ns(void) {
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
    }
    /* The member table doubles by moving this many slots of the old table
       a write into the new one, once the new one is at least
       RK_TABLE_MIGRATE_MIN slots (2 MiB; below that it is filled at once,
       in well under a millisecond): done within 1/64 as many writes as
       the old table has slots, where the next doubling is 3/4 as many new
       members away.  Meanwhile a slot the old table frees holds
       RK_TOMBSTONE, so that lookups in it go on past it. */
    #define RK_TABLE_MOVES 64
    #define RK_TABLE_MIGRATE_MIN 262144
    #define RK_TOMBSTONE ((rk_node *)1)
    /* A relayout puts the nodes of at least RK_TALL levels in a region of
       their own; a search going down to level RK_TALL - 1 (or RK_TALL)
       prefetches this many bytes after the tall node it leaves from.
       Measured at 1M members against 256/1024, 512/2048, and also
       prefetching 4 KiB for level RK_TALL + 1: within 2% of each other. */
    #define RK_TALL 3
    #define RK_AHEAD_LOW 384
    #define RK_AHEAD_HIGH 1536
    /* A search for a node prefetches this many bytes before it (and 256
       after) when the nodes there are in rank order: its last steps on
       levels 0 and 1.  2 and 4 KiB were no faster (bench/README.md). */
    #define RK_NEIGHBOURHOOD 1024
    /* _shift moves a node past at most this many neighbours on level 0
       (each one likely a cache miss); a longer move is an unlink and a
       link, whose searches skip over them. */
    #define RK_SHIFT_MAX 4
    /* set_states looks members up with prefetches this many entries ahead:
       the slot first, then (once it has arrived) the node it points to. */
    #define RK_SLOT_AHEAD 16
    #define RK_NODE_AHEAD 8

    /* set_states re-threads the list from the untouched nodes (in order)
       and the moved ones, sorted here by their total key. */
    typedef struct rk_moved {
        double key;
        uint64_t seq;
        rk_node *node;
    } rk_moved;

    static int rk_member_cmp(rk_node *a, rk_node *b) {
        int c = memcmp(RK_MEMBER(a), RK_MEMBER(b), a->mlen < b->mlen ? a->mlen : b->mlen);
        return c ? c : (int)a->mlen - (int)b->mlen;
    }

    static int rk_moved_cmp_first(const void *pa, const void *pb) {
        const rk_moved *a = pa, *b = pb;
        if (a->key != b->key) return a->key < b->key ? -1 : 1;
        if (a->seq != b->seq) return a->seq < b->seq ? -1 : 1;
        return rk_member_cmp(a->node, b->node);
    }

    static int rk_moved_cmp_member(const void *pa, const void *pb) {
        const rk_moved *a = pa, *b = pb;
        if (a->key != b->key) return a->key < b->key ? -1 : 1;
        return rk_member_cmp(a->node, b->node);
    }

    static int rk_moved_cmp_member_desc(const void *pa, const void *pb) {
        const rk_moved *a = pa, *b = pb;
        if (a->key != b->key) return a->key < b->key ? -1 : 1;
        return rk_member_cmp(b->node, a->node);
    }

    /* A key as an unsigned integer in the same order; -0.0 as 0.0, since
       the two rank alike (keys are finite: no NaN). */
    static inline uint64_t rk_key_bits(double key) {
        uint64_t bits;
        if (key == 0.0) key = 0.0;
        memcpy(&bits, &key, 8);
        return bits >> 63 ? ~bits : bits | 0x8000000000000000ULL;
    }

    /* A large batch is sorted by key with an LSD radix sort (a million
       moved nodes: qsort's calls of the comparator were a fifth of a
       restart's replay), then each run of equal keys by the tie-break. */
    #define RK_RADIX_BITS 11
    #define RK_RADIX_PASSES 6  /* 6 * 11 >= 64 */
    #define RK_RADIX_MIN 4096  /* below it, qsort alone */

    /* by_member: 0 "first", 1 "member", 2 "member_desc". */
    static void rk_sort_moved(rk_moved *moved, size_t n, int by_member) {
        int (*cmp)(const void *, const void *) = by_member == 2 ? rk_moved_cmp_member_desc
            : by_member ? rk_moved_cmp_member : rk_moved_cmp_first;
        const uint64_t mask = (1u << RK_RADIX_BITS) - 1;
        rk_moved *tmp = n >= RK_RADIX_MIN ? malloc(n * sizeof(rk_moved)) : NULL;
        size_t (*counts)[1u << RK_RADIX_BITS] = NULL;
        rk_moved *from = moved, *to = tmp, *swap;
        size_t i, j, sum, t;
        int pass, shift;
        if (tmp != NULL)
            counts = calloc(RK_RADIX_PASSES, sizeof *counts);
        if (counts == NULL) {  /* small, or no memory for the radix sort */
            free(tmp);
            qsort(moved, n, sizeof(rk_moved), cmp);
            return;
        }
        for (i = 0; i < n; i++) {
            uint64_t bits = rk_key_bits(moved[i].key);
            for (pass = 0; pass < RK_RADIX_PASSES; pass++)
                counts[pass][(bits >> (pass * RK_RADIX_BITS)) & mask]++;
        }
        for (pass = 0; pass < RK_RADIX_PASSES; pass++) {
            size_t *count = counts[pass];
            shift = pass * RK_RADIX_BITS;
            if (count[(rk_key_bits(from[0].key) >> shift) & mask] == n)
                continue;  /* every key has this digit: the pass would change nothing */
            for (sum = 0, j = 0; j <= mask; j++) {
                t = count[j];
                count[j] = sum;
                sum += t;
            }
            for (i = 0; i < n; i++)
                to[count[(rk_key_bits(from[i].key) >> shift) & mask]++] = from[i];
            swap = from;
            from = to;
            to = swap;
        }
        if (from != moved)
            memcpy(moved, from, n * sizeof(rk_moved));
        free(tmp);
        free(counts);
        for (i = 0; i < n; i = j) {
            for (j = i + 1; j < n && moved[j].key == moved[i].key; j++) {}
            if (j - i > 1)
                qsort(moved + i, j - i, sizeof(rk_moved), cmp);
        }
    }

    /* A validated set_states entry. */
    typedef struct rk_state {
        const char *member;
        Py_ssize_t mlen;
        double key;
        uint64_t seq;
        uint32_t hash;
        rk_node *node;
    } rk_state;

    /* set_states re-threads the whole list, instead of searching once per
       entry, when entries * RK_RETHREAD_RATIO >= members (and there are at
       least RK_RETHREAD_MIN entries); on an index of RK_RETHREAD_BIG members
       or more, already when entries * RK_RETHREAD_RATIO_BIG >= members: far
       beyond the CPU's caches each search is a chain of misses (6-8 us an
       entry at 10M members, against 2-4 s for the whole ordered pass). */
    #define RK_RETHREAD_RATIO 8
    #define RK_RETHREAD_MIN 1024
    /* A packed state's head (rankd.index.packed): f64 score, u64 seq, u16 length. */
    #define RK_PACKED_HEAD 18
    #define RK_RETHREAD_BIG (1 << 21)
    #define RK_RETHREAD_RATIO_BIG 16

    static inline void rk_store_u16(char *p, uint16_t v) { memcpy(p, &v, 2); }
    static inline void rk_store_u32(char *p, uint32_t v) { memcpy(p, &v, 4); }
    static inline void rk_store_u64(char *p, uint64_t v) { memcpy(p, &v, 8); }
    static inline void rk_store_f64(char *p, double v) { memcpy(p, &v, 8); }
    static inline uint16_t rk_load_u16(const char *p) { uint16_t v; memcpy(&v, p, 2); return v; }
    static inline uint64_t rk_load_u64(const char *p) { uint64_t v; memcpy(&v, p, 8); return v; }
    static inline double rk_load_f64(const char *p) { double v; memcpy(&v, p, 8); return v; }
    """
    ctypedef struct rk_node

    ctypedef struct rk_level:
        rk_node *forward
        double fkey
        uint32_t span
        uint32_t dspan

    ctypedef struct rk_node:
        double key
        uint64_t seq
        rk_node *backward
        uint32_t hash
        uint16_t mlen
        uint8_t nlevels
        uint8_t queued
        rk_level level[1]

    ctypedef struct rk_moved:
        double key
        uint64_t seq
        rk_node *node
    void rk_sort_moved(rk_moved *moved, size_t n, int by_member) nogil

    ctypedef struct rk_state:
        const char *member
        Py_ssize_t mlen
        double key
        uint64_t seq
        uint32_t hash
        rk_node *node

    char *RK_MEMBER(rk_node *node) nogil
    size_t RK_NODE_SIZE(int nlevels, Py_ssize_t mlen) nogil
    uint64_t rk_siphash13(uint64_t k0, uint64_t k1, const char *src, size_t length) nogil
    int rk_utf8_valid(const uint8_t *s, size_t n) nogil
    void rk_store_u16(char *p, uint16_t v) nogil
    void rk_store_u32(char *p, uint32_t v) nogil
    void rk_store_u64(char *p, uint64_t v) nogil
    void rk_store_f64(char *p, double v) nogil
    uint16_t rk_load_u16(const char *p) nogil
    uint64_t rk_load_u64(const char *p) nogil
    double rk_load_f64(const char *p) nogil

    ctypedef struct rk_arena:
        size_t reserved
    ctypedef struct rk_hash_memo:
        uint8_t next
    uint32_t rk_hash_memo_get(rk_hash_memo *memo, uint64_t k0, uint64_t k1, const char *member,
                              size_t mlen) nogil
    void rk_arena_init(rk_arena *arena) nogil
    void rk_arena_init_from(rk_arena *arena, size_t first_chunk) nogil
    void rk_arena_release(rk_arena *arena) nogil
    void *rk_arena_alloc(rk_arena *arena, size_t size) nogil
    void rk_arena_free(rk_arena *arena, void *p, size_t size) nogil
    ctypedef struct rk_ranges:
        size_t n
    int rk_ranges_of(rk_ranges *ranges, const rk_arena *a, const rk_arena *b) nogil
    bint rk_ranges_hold(rk_ranges *ranges, const void *p) nogil
    void rk_ranges_free(rk_ranges *ranges) nogil
    void rk_unmap(void *p, size_t bytes) nogil
    char *rk_grow_map(char *old, size_t old_bytes, size_t new_bytes, int huge) nogil
    void *rk_zeroed_table(size_t bytes, int huge) nogil
    void rk_free_table(void *p, size_t bytes) nogil
    void rk_advise_huge(void *p, size_t bytes) nogil
    uint64_t rk_now_ns() nogil
    void rk_prefetch(const void *p) nogil
    void rk_prefetch_node(const void *p) nogil
    void rk_prefetch_level(const rk_node *n, int i) nogil
    void rk_prefetch_lines(uintptr_t start, uintptr_t end) nogil

    enum:
        PREFETCH_GROUP "RK_PREFETCH_GROUP"
        SHIFT_MAX "RK_SHIFT_MAX"
        PREFETCH_MIN_LENGTH "RK_PREFETCH_MIN_LENGTH"
        RELAYOUT_MIN_LENGTH "RK_RELAYOUT_MIN_LENGTH"
        RELAYOUT_SHARE "RK_RELAYOUT_SHARE"
        RELAYOUT_MOVES "RK_RELAYOUT_MOVES"
        RELAYOUT_PACE_NS "RK_RELAYOUT_PACE_NS"
        RELAYOUT_PER_WRITE "RK_RELAYOUT_PER_WRITE"
        RELAYOUT_CREDIT "RK_RELAYOUT_CREDIT"
        RELAYOUT_MIN_STEP "RK_RELAYOUT_MIN_STEP"
        REPOINT_BATCH "RK_REPOINT_BATCH"
        TABLE_MOVES "RK_TABLE_MOVES"
        TABLE_MIGRATE_MIN "RK_TABLE_MIGRATE_MIN"
        TALL "RK_TALL"
        AHEAD_LOW "RK_AHEAD_LOW"
        AHEAD_HIGH "RK_AHEAD_HIGH"
        HUGE_CHUNK "RK_HUGE_PAGE"
        RK_FIRST_CHUNK
        NEIGHBOURHOOD "RK_NEIGHBOURHOOD"
        SLOT_AHEAD "RK_SLOT_AHEAD"
        NODE_AHEAD "RK_NODE_AHEAD"
        RETHREAD_RATIO "RK_RETHREAD_RATIO"
        RETHREAD_MIN "RK_RETHREAD_MIN"
        PACKED_HEAD "RK_PACKED_HEAD"
        RETHREAD_BIG "RK_RETHREAD_BIG"
        RETHREAD_RATIO_BIG "RK_RETHREAD_RATIO_BIG"

cdef extern from "Python.h":
    bint PyUnicode_IS_COMPACT_ASCII(object o)
    void *PyUnicode_DATA(object o)
    Py_ssize_t PyUnicode_GET_LENGTH(object o)

    enum:
        MAX_LEVEL "RK_MAX_LEVEL"
        DEFAULT_BRANCHING "RK_DEFAULT_BRANCHING"
        MIN_TABLE_SIZE "RK_MIN_TABLE_SIZE"
        MAX_MEMBER_BYTES "RK_MAX_MEMBER_BYTES"
        DUMP_VERSION "RK_DUMP_VERSION"
        DUMP_HEADER_SIZE "RK_DUMP_HEADER_SIZE"
        DUMP_RECORD_SIZE "RK_DUMP_RECORD_SIZE"
        OP_SET "RK_SET"
        OP_SET_NEW "RK_SET_NEW"
        OP_SET_EXISTS "RK_SET_EXISTS"
        OP_SET_BETTER "RK_SET_BETTER"
        OP_SET_WORSE "RK_SET_WORSE"
        OP_INCR "RK_INCR"
        OP_REMOVE "RK_REMOVE"
    rk_node *TOMBSTONE "RK_TOMBSTONE"
    const long long MAX_LENGTH "RK_MAX_LENGTH"
    const long long MAX_EXACT_INT "RK_MAX_EXACT_INT"
    const long long MAX_SEQ "RK_MAX_SEQ"


@cython.final
cdef class RankIndex:
    cdef rk_node *header
    cdef rk_node *tail
    cdef Py_ssize_t length
    cdef Py_ssize_t ndistinct       # leaders: distinct scores
    cdef Py_ssize_t member_bytes    # sum of member lengths, for dump()
    # High-water marks since the index was made, cleared or reset_peaks():
    # what a Redis-like board's encoding follows (rankd.engine.zeros).
    cdef Py_ssize_t peak_length
    cdef Py_ssize_t peak_member_bytes
    cdef int height                 # levels in use
    cdef int max_level
    cdef uint32_t branching
    cdef uint64_t rng_state
    cdef bint descending
    cdef bint tie_by_member
    cdef bint tie_member_desc       # "member_desc": ties by member, Z to A
    cdef uint64_t _next_seq
    cdef uint64_t hash_k0, hash_k1
    cdef rk_hash_memo hash_memo     # (zeroed with the object: empty)
    cdef rk_node **slots
    cdef size_t mask
    # The table doubling (``old_slots`` not NULL): the members in the old
    # table's slots from ``migrated`` on are in it alone (see _table_begin).
    cdef rk_node **old_slots
    cdef size_t old_mask, migrated
    cdef size_t table_migrate_min, table_moves   # RK_TABLE_*, or set by tests
    cdef Py_ssize_t mutations       # invalidates iterators and the memo
    cdef rk_node *memo_node         # the node last written, its rank, and
    cdef Py_ssize_t memo_rank       # the mutation count that rank is good for
    cdef Py_ssize_t memo_mutations
    cdef Py_ssize_t warmed          # operations apply_batch warmed (tests)
    cdef rk_arena arena             # owns every member node (with tall_arena)
    cdef rk_arena tall_arena        # the nodes of TALL levels or more a relayout moved
    cdef Py_ssize_t unplaced        # nodes allocated since the last layout began
    # A relayout under way (``relaying``): the nodes from ``relayout_next``
    # on, in rank order, are still in the old arenas, but for those added
    # or moved there since (see _relayout_begin).
    cdef bint relaying
    cdef rk_arena old_arena, old_tall_arena
    cdef rk_ranges old_ranges       # their chunks
    cdef rk_node *relayout_next
    cdef Py_ssize_t relayout_min_length, relayout_moves   # RK_RELAYOUT_*, or set by tests
    cdef uint64_t relayout_pace_ns  # RK_RELAYOUT_PACE_NS, or 0 (tests: unpaced)
    cdef uint64_t relayout_clock    # when the credit was last counted (rk_now_ns)
    cdef Py_ssize_t relayout_credit # moves the writes may make now

    cdef rk_node *_new_node(self, int nlevels, const char *member, Py_ssize_t mlen) except NULL
    cdef rk_node *_alloc_node(self, int nlevels, const char *member, Py_ssize_t mlen) noexcept nogil
    cdef void _free_nodes(self) noexcept
    cdef void _free_node(self, rk_node *node) noexcept
    cdef void _reset_header(self) noexcept
    cdef int _random_level(self) noexcept nogil
    cdef inline bint _before(self, rk_node *node, double key, uint64_t seq, const char *member, Py_ssize_t mlen) noexcept nogil
    cdef inline bint _link_before(self, rk_level *link, double key, uint64_t seq, const char *member, Py_ssize_t mlen) noexcept
    cdef inline bint _node_before(self, rk_node *a, rk_node *b) noexcept
    cdef inline double _score(self, rk_node *node) noexcept
    cdef inline double _key(self, double score) noexcept nogil
    cdef inline bint _is_leader(self, rk_node *node) noexcept
    cdef inline void _prefetch_neighbourhood(self, rk_node *x) noexcept
    cdef inline void _prefetch_ahead(self, rk_node *node, int finished) noexcept
    cdef inline Py_ssize_t _remember(self, rk_node *x, Py_ssize_t rank) noexcept
    cdef inline uint32_t _hash(self, const char *member, Py_ssize_t mlen) noexcept nogil
    cdef inline rk_node *_lookup(self, const char *member, Py_ssize_t mlen, uint32_t h) noexcept nogil
    cdef rk_node *_after(self, double key, uint64_t seq, const char *member, Py_ssize_t mlen) noexcept
    cdef inline rk_node *_find(self, object member) except? NULL
    cdef int _table_reserve(self, Py_ssize_t members) except -1
    cdef void _table_insert(self, rk_node *node) noexcept nogil
    cdef int _table_resize(self, size_t size) except -1
    cdef int _table_begin(self, size_t size) except -1
    cdef void _table_migrate(self, size_t count) noexcept
    cdef rk_node *_lookup_old(self, const char *member, Py_ssize_t mlen, uint32_t h) noexcept nogil
    cdef rk_node **_slot_of(self, rk_node *node) noexcept
    cdef rk_node **_old_slot_of(self, rk_node *node) noexcept
    cdef void _drop_old_table(self) noexcept
    cdef int _relayout_begin(self) except -1
    cdef void _relayout_step(self, Py_ssize_t moves) noexcept
    cdef void _relayout_end(self) noexcept
    cdef inline void _after_write(self) noexcept
    cdef inline Py_ssize_t _relayout_share(self) noexcept
    cdef rk_node *_placed(self, rk_node *x) noexcept
    cdef rk_node *_move_node(self, rk_node *x, rk_node **update) noexcept
    cdef void _repoint_slots(self, rk_node **moved_from, rk_node **moved_to,
                             int count) noexcept
    cdef void _table_remove(self, rk_node *node) noexcept
    cdef Py_ssize_t _link(self, rk_node *x, bint newest=*) noexcept
    cdef Py_ssize_t _path_to(self, rk_node *x, rk_node **update, int lowest=*) noexcept
    cdef Py_ssize_t _rekey(self, rk_node *x, double key, uint64_t seq) noexcept
    cdef void _unlink(self, rk_node *x) noexcept
    cdef bint _can_stay(self, rk_node *x, double key, uint64_t seq) noexcept
    cdef Py_ssize_t _shift(self, rk_node *x, double key, uint64_t seq) noexcept
    cdef inline bint _alone(self, rk_node *pred, rk_node *x, rk_node *succ) noexcept
    cdef Py_ssize_t _rank_of(self, rk_node *x, Py_ssize_t *dense) noexcept
    cdef Py_ssize_t _count_before_key(self, double key, bint inclusive) noexcept
    cdef rk_node *_node_at(self, Py_ssize_t rank) noexcept
    cdef Py_ssize_t _write(self, const char *data, Py_ssize_t size, double value, int op, bint has_seq, uint64_t seq, bint want_rank, double *old, bint *had, double *new, bint *has_new, bint *changed) except -2
    cdef inline uint64_t _stamp(self, bint has_seq, uint64_t seq) noexcept
    cdef inline void _set_new(self, double target, double *new, bint *has_new, bint *changed) noexcept
    cdef tuple _write_result(self, bint had, double old, bint has_new, double new, bint changed)
    cdef int _set_batch(self, rk_state *batch, Py_ssize_t k, uint64_t top) except -1
    cdef int _assign(self, rk_state *state) except -1
    cdef int _rethread(self, rk_state *batch, Py_ssize_t k, Py_ssize_t fresh) except -1
    cdef int _prefetch_group(self, list items, Py_ssize_t start)
    cdef inline str _member_str(self, rk_node *x)
    cdef list _collect(self, Py_ssize_t first, Py_ssize_t last, bint reverse)
    cdef list _window(self, Py_ssize_t lo, Py_ssize_t hi, object offset, object limit, bint reverse)
    cdef int _key_range(self, object low, object high, bint low_exclusive, bint high_exclusive, Py_ssize_t *lo, Py_ssize_t *hi) except -1
    cdef int _append_loaded(self, rk_node *x, rk_node **last, Py_ssize_t *last_rank, Py_ssize_t *last_drank) noexcept nogil
    cdef void _place_loaded(self, rk_node *x, double key, uint64_t seq, uint32_t h, rk_node **last, Py_ssize_t *last_rank, Py_ssize_t *last_drank) noexcept nogil
    cdef uint64_t _load_run(self, const char **p, const char *end, uint64_t i, uint64_t stop, uint64_t next_seq, bint has_seq, rk_node **last, Py_ssize_t *last_rank, Py_ssize_t *last_drank, rk_node **prev) noexcept nogil

    # Entry points for other native modules (member = UTF-8 bytes, checked by the caller).
    cdef void c_prefetch_slot(self, const char *member, Py_ssize_t mlen) noexcept
    cdef void c_prefetch_node(self, const char *member, Py_ssize_t mlen) noexcept
    cdef bint c_get(self, const char *member, Py_ssize_t mlen, double *score) noexcept
    cdef Py_ssize_t c_put(self, const char *member, Py_ssize_t mlen, double score,
                          uint64_t seq) except -1
    cdef Py_ssize_t c_rank(self, const char *member, Py_ssize_t mlen) noexcept
