"""Tests of what is particular to the compact paged index (``rankd._pages``).

The contract tests run against it as the ``pages`` implementation (see
conftest.py); these force its page splits and merges with tiny page sizes,
run ``_check()`` after every operation, prove that memory returns under
churn and that every page and name is freed, and load snapshots written by
the previous index (``rankd._skiplist`` at the revision before the paged
layout; the files in tests/data were written by it).
"""

from __future__ import annotations

import gc
import itertools
import random
import re
import struct
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import native
from index_model import (
    DumpRecord,
    ModelIndex,
    assert_index_matches,
    assert_same_dump,
    decode_dump,
    encode_dump,
)
from rankd.index import ORDERS, TIE_BREAKS, Op, When

DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="module")
def pages_cls():
    return native("rankd._pages", "RankIndex")


@pytest.fixture(scope="module")
def pages_module(pages_cls):
    import rankd._pages

    return rankd._pages


def fills_ok(index) -> None:
    """Every page holds 1..page_size entries, and all but the last at least half."""
    fills = index._pages()
    size = index._page_size
    assert all(1 <= n <= size for n in fills), fills
    assert all(n >= size // 2 for n in fills[:-1]), fills


# --- splits and merges forced by tiny pages -----------------------------------------------


@pytest.mark.parametrize("page_size", [4, 5, 8])
@pytest.mark.parametrize("pattern", ["ascending", "descending", "random", "ties"])
def test_split_and_merge_boundaries(pages_cls, page_size, pattern):
    index = pages_cls("desc", "first", page_size=page_size, seed=3)
    model = ModelIndex("desc", "first")
    model.next_seq = index.next_seq
    rng = random.Random(page_size)
    n = 200
    scores = {
        "ascending": list(range(n)),
        "descending": list(range(n, 0, -1)),
        "random": [rng.randrange(10_000) for _ in range(n)],
        "ties": [i % 3 for i in range(n)],
    }[pattern]
    for i, score in enumerate(scores):
        member = f"m{i:04d}"
        assert index.set(member, score) == model.set(member, score)
        index._check()
        fills_ok(index)
    # Pages split: many of them, none above the size.
    assert len(index._pages()) >= n // page_size
    assert_index_matches(index, model)
    # Remove every other member, then all the rest: merges and borrowing.
    order = [f"m{i:04d}" for i in range(0, n, 2)] + [f"m{i:04d}" for i in range(1, n, 2)]
    for k, member in enumerate(order):
        assert index.remove(member) == model.remove(member)
        index._check()
        fills_ok(index)
        if k == n // 2:
            assert_index_matches(index, model)
            # Half the members, about half the pages: never sparse.
            assert len(index._pages()) <= len(index) // (page_size // 2) + 1
    assert index._pages() == []
    assert len(index) == 0


@pytest.mark.parametrize("page_size", [4, 6])
def test_moves_across_pages_keep_every_invariant(pages_cls, page_size):
    # Members jump from page to page (incr) and within their page.
    index = pages_cls("asc", "member", page_size=page_size, seed=1)
    model = ModelIndex("asc", "member")
    model.next_seq = index.next_seq
    rng = random.Random(7)
    for i in range(120):
        index.set(f"p{i}", i % 17)
        model.set(f"p{i}", i % 17)
    for _ in range(1500):
        member = f"p{rng.randrange(140)}"
        delta = rng.choice([-20, -1, 0, 1, 3, 40])
        assert index.incr(member, delta) == model.incr(member, delta)
        index._check()
        fills_ok(index)
    assert_index_matches(index, model)


OPS = st.lists(
    st.tuples(
        st.sampled_from(list(Op)),
        st.integers(0, 40).map(lambda i: f"k{i}" if i % 13 else f"é{i}"),
        st.one_of(st.integers(-4, 4), st.sampled_from([0.5, -0.0, 2.25])),
        st.one_of(st.none(), st.integers(0, 50)),
    ),
    max_size=120,
)


@settings(max_examples=120, deadline=None)
@given(
    order=st.sampled_from(ORDERS),
    tie_break=st.sampled_from(TIE_BREAKS),
    page_size=st.sampled_from([4, 5, 7, 64]),
    max_level=st.sampled_from([1, 2, 32]),
    ops=OPS,
)
def test_random_operations_check_after_each(pages_cls, order, tie_break, page_size, max_level,
                                            ops):
    index = pages_cls(order, tie_break, page_size=page_size, max_level=max_level, branching=2,
                      seed=5)
    model = ModelIndex(order, tie_break)
    model.next_seq = index.next_seq
    for op in ops:
        code, member, value, seq = op
        if code == Op.REMOVE:
            got, want = index.remove(member), model.remove(member)
        elif code == Op.INCR:
            got, want = index.incr(member, value, seq), model.incr(member, value, seq)
        else:
            got = index.set(member, value, When(code), seq)
            want = model.set(member, value, When(code), seq)
        assert got == want, op
        index._check()
        fills_ok(index)
    assert_index_matches(index, model)
    copy = pages_cls.load(index.dump())
    copy._check()
    assert copy.dump() == index.dump()


def test_set_states_on_tiny_pages(pages_cls):
    index = pages_cls("desc", "first", page_size=4, seed=2)
    model = ModelIndex("desc", "first")
    rng = random.Random(11)
    for _ in range(5):
        states = [(f"s{rng.randrange(60)}", rng.randrange(8), rng.randrange(1000))
                  for _ in range(rng.randrange(1, 80))]
        index.set_states(states)
        model.set_states(states)
        index._check()
        fills_ok(index)
    assert_index_matches(index, model)


# --- snapshots ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["index-v1-desc-first.dump", "index-v1-asc-member.dump"])
def test_snapshot_of_the_previous_index_loads(pages_cls, name):
    # Written by rankd._skiplist at the revision before the paged layout.
    data = (DATA / name).read_bytes()
    skiplist = native("rankd._skiplist", "RankIndex").load(data)
    index = pages_cls.load(data)
    index._check()
    fills_ok(index)
    assert len(index) == 344
    assert list(index) == list(skiplist)
    assert index.range_by_rank() == skiplist.range_by_rank()
    for member, _ in skiplist:
        assert index.dense_rank(member) == skiplist.dense_rank(member)
    # A board tied by arrival writes the same bytes back; one tied by member
    # writes version 2, the same records without their seqs.
    assert_same_dump(index.dump(), data)
    assert index.dump()[4] == (1 if index.tie_break == "first" else 2)
    # And it keeps working after the load: writes split the packed pages.
    for i in range(300):
        index.incr(f"player:{i:012d}", i % 7)
    index._check()
    fills_ok(index)


def test_dumps_match_the_skip_list_byte_for_byte(pages_cls):
    skiplist = native("rankd._skiplist", "RankIndex")("desc", "first")
    index = pages_cls("desc", "first", page_size=8)
    rng = random.Random(3)
    ops = [(rng.choice([Op.SET, Op.INCR, Op.REMOVE, Op.SET_BETTER]), f"u{rng.randrange(500)}",
            rng.randrange(30)) for _ in range(5000)]
    assert index.apply_batch(ops) == skiplist.apply_batch(ops)
    assert index.dump() == skiplist.dump()
    assert skiplist.load(index.dump()).dump() == index.load(skiplist.dump()).dump()


@pytest.mark.parametrize("tie_break", ["member", "member_desc"])
def test_boards_tied_by_member_dump_version_2_without_seqs(pages_cls, tie_break):
    index = pages_cls("desc", tie_break, page_size=4)
    rng = random.Random(7)
    for _ in range(300):
        index.set(f"m{rng.randrange(120)}", rng.randrange(20), seq=rng.randrange(10**12))
    data = index.dump()
    dump = decode_dump(data)
    assert dump.version == 2
    # 10-byte records (score, length) before each name: no seq.
    assert len(data) == 24 + sum(10 + len(r.member) for r in dump.records) + 4
    assert dump.next_seq == index.next_seq
    loaded = pages_cls.load(data)
    loaded._check()
    assert loaded.dump() == data
    assert list(loaded) == list(index)
    # The version 1 dump of the same board (as the skip list writes it)
    # loads to the same board.
    v1 = encode_dump("desc", tie_break, dump.next_seq,
                     [DumpRecord(r.score, 0, r.member) for r in dump.records])
    assert pages_cls.load(v1).dump() == data


def test_a_version_2_dump_is_checked(pages_cls):
    records = [DumpRecord(float(9 - i), 0, f"m{i}".encode()) for i in range(5)]
    good = encode_dump("desc", "member", 3, records, version=2)
    assert len(pages_cls.load(good)) == 5
    # Seqs are what order a board tied by arrival: a dump without them is no such board.
    with pytest.raises(ValueError, match="version 2"):
        pages_cls.load(encode_dump("desc", "first", 3, records, version=2))
    with pytest.raises(ValueError, match="version 3"):
        pages_cls.load(encode_dump("desc", "member", 3, records, version=3))
    with pytest.raises(ValueError, match="out of order"):
        pages_cls.load(encode_dump("desc", "member", 3, records[::-1], version=2))
    with pytest.raises(ValueError, match=r"truncated|claims|bytes after"):
        pages_cls.load(encode_dump("desc", "member", 3, records, version=2, count=6))
    # The skip list reads it too (a data dir moves between index layouts).
    skip_list = native("rankd._skiplist", "RankIndex").load(good)
    assert pages_cls.load(skip_list.dump()).dump() == pages_cls.load(good).dump()


def test_pages_of_boards_tied_by_member_hold_no_seqs(pages_cls):
    boards = {tb: pages_cls("desc", tb) for tb in ("first", "member")}
    for index in boards.values():
        index.apply_batch([(Op.SET, f"p{i:06d}", i % 1000) for i in range(20_000)])
    first, member = (boards[tb]._memory()["pages"] for tb in ("first", "member"))
    # 12 bytes an entry (key, id) against 16 (key, 32-bit seq, id), and the
    # same pages.
    assert boards["first"]._pages() == boards["member"]._pages()
    assert member < first * 0.8


# --- memory: churn, fill after deletes, allocation balance ----------------------------------


def test_churn_returns_memory(pages_cls):
    # Delete a random half and re-add it, many times: the name arena and the
    # pages stay at the size of one full board.
    index = pages_cls("desc", "first")
    rng = random.Random(5)
    n = 100_000
    names = [f"player:{i:012d}" for i in range(n)]
    index.apply_batch([(Op.SET, m, rng.randrange(1_000_000)) for m in names])
    full = index._memory()
    for _ in range(4):
        gone = rng.sample(names, n // 2)
        index.apply_batch([(Op.REMOVE, m, None) for m in gone])
        half = index._memory()
        # Pages are at least half full: fewer than 2/page_size pages a member.
        assert half["pages"] <= full["pages"] * 0.5 * 1.6
        index.apply_batch([(Op.SET, m, rng.randrange(1_000_000)) for m in gone])
    index._check()
    after = index._memory()
    assert after["names"] == full["names"]  # freed records are reused
    assert after["map"] <= full["map"]  # (full may hold a resize's old table)
    assert after["pages"] <= full["pages"] * 1.1


def test_pages_are_allocated_at_their_entries_size(pages_cls):
    # A page's allocation follows its entries (a few spare, in steps), not
    # the page size: random arrivals leave pages about 5/6 full and
    # removals of a random half about 2/3, and neither costs memory beyond
    # the entries (16 bytes each on a board tied by arrival), the page
    # headers and their towers (one link each with max_level=1).
    index = pages_cls("desc", "first", max_level=1)
    rng = random.Random(4)
    names = [f"p{i}" for i in range(6000)]
    index.apply_batch([(Op.SET, m, rng.randrange(1_000_000)) for m in names])
    assert index._memory()["pages"] <= len(index) * 16 * 1.2
    index.apply_batch([(Op.REMOVE, m, None) for m in rng.sample(names, 3000)])
    index._check()
    assert sum(index._pages()) / (len(index._pages()) * 64) < 0.75  # sparser pages
    # (Full-size pages would cost 1.6x the entries here.)
    assert index._memory()["pages"] <= len(index) * 16 * 1.3


@pytest.mark.parametrize("tie_break", ["first", "member"])
def test_pages_that_grow_shrink_and_move_keep_every_invariant(pages_cls, tie_break):
    # Pages of 32 entries grow and shrink in steps, and a reallocated page
    # may move: the links to it at every level are found again, through
    # ties of equal scores too (few distinct scores).
    index = pages_cls("desc", tie_break, page_size=32, seed=5)
    model: dict[str, float] = {}
    rng = random.Random(tie_break)
    for step in range(6000):
        member = f"m{rng.randrange(1500)}"
        roll = rng.random()
        if roll < 0.5:
            score = float(rng.randrange(30))
            index.set(member, score)
            model[member] = score
        elif roll < 0.75:
            index.incr(member, 1)
            model[member] = model.get(member, 0.0) + 1
        else:
            index.remove(member)
            model.pop(member, None)
        if step % 200 == 0:
            index._check()
    index._check()
    assert {m: s for m, s in index} == model
    fills_ok(index)


def test_deletes_compact_the_name_arena_a_step_per_write(pages_cls):
    # A random half removed leaves a quarter of the arena free at some
    # point: the arena is compacted while later writes go on (a few records
    # per write), and ends packed, with every member still found.
    index = pages_cls("desc", "member", page_size=8)
    rng = random.Random(11)
    n = 20_000
    names = [f"player:{i:012d}" for i in range(n)]
    index.apply_batch([(Op.SET, m, rng.randrange(1000)) for m in names])
    full = index._memory()["names"]
    gone = set(rng.sample(names, n // 2))
    order = [m for m in names if m in gone]
    for i, member in enumerate(order):
        index.remove(member)
        if i % 1000 == 0:
            index._check()
    left = [m for m in names if m not in gone]
    for i, member in enumerate(left):
        index.incr(member, 1)  # each write moves the sweep on
        if i % 1000 == 0:
            index._check()
    index._check()
    # 24 bytes a record: the half that is left, and at most the records
    # removed after the sweep passed them.
    assert index._memory()["names"] <= full * 0.5 * 1.3
    assert all(index.score(m) is not None for m in left)
    assert not any(m in index for m in gone)
    # Re-adding them after the compaction fills the arena again, no more.
    index.apply_batch([(Op.SET, m, 1) for m in gone])
    index._check()
    assert index._memory()["names"] <= full * 1.3


def random_board(pages_cls, rng: random.Random, members) -> object:
    """A board tied by arrival holding ``members`` at random scores."""
    index = pages_cls("desc", "first")
    index.apply_batch([(Op.SET, m, rng.randrange(1_000_000)) for m in members])
    return index


def lose_members(index, rng: random.Random, names: list[str], count: int,
                 touched: int) -> list[str]:
    """Remove ``count`` random members of ``names`` from ``index``, then
    increment the first ``touched`` of the rest (writes are when the index
    compacts); return the rest."""
    gone = set(rng.sample(names, count))
    index.apply_batch([(Op.REMOVE, m, None) for m in names if m in gone])
    left = [m for m in names if m not in gone]
    index.apply_batch([(Op.INCR, m, 1) for m in left[:touched]])
    index._check()
    return left


def test_memory_after_deleting_half_is_near_a_fresh_board(pages_cls):
    # The churn target, in the index's own count: after a random
    # half is removed (and some writes), memory per remaining member is
    # within 20% of a board loaded fresh with the same members.
    rng = random.Random(12)
    n = 100_000
    names = [f"player:{i:012d}" for i in range(n)]
    index = random_board(pages_cls, rng, names)
    left = lose_members(index, rng, names, n // 2, 10_000)
    fresh = random_board(pages_cls, rng, left)
    after, new = sum(index._memory().values()), sum(fresh._memory().values())
    assert after <= new * 1.2, (index._memory(), fresh._memory())


# --- the page heap ------------------------------------------------------------------------


@pytest.mark.parametrize("tie_break", ["first", "member"])
@pytest.mark.parametrize("page_size", [4, 7, 64])
def test_evacuations_keep_every_invariant(pages_cls, tie_break, page_size):
    # Evacuated from any size of holes on, a small board meets them under
    # every kind of write (splits, shares, merges, widenings, removals), and
    # stays the model's, with the page heap's own invariants (_check).
    rng = random.Random(page_size)
    index = pages_cls("desc", tie_break, page_size=page_size, seed=3)
    index._evacuate_from(0)
    model = ModelIndex("desc", tie_break)
    model.next_seq = index.next_seq
    names = [f"m{i}" for i in range(600)]
    for step in range(6000):
        member = rng.choice(names)
        kind = rng.random()
        if kind < 0.3 + 0.3 * (step // 1500 % 2):  # waves of removals
            assert index.remove(member) == model.remove(member)
        elif kind < 0.8:
            score = rng.randrange(1000) + (0.5 if rng.random() < 0.05 else 0)
            assert index.set(member, score) == model.set(member, score)
        else:
            assert index.incr(member, 3) == model.incr(member, 3)
        if step % 97 == 0:
            index._check()
    index._check()
    assert index._page_heap()["evacuated"] > 0
    assert_index_matches(index, model)


def test_a_board_that_lost_most_members_gives_its_page_heap_back(pages_cls):
    # Removals leave holes across the page heap's blocks; past a sixteenth
    # of it, writes move the live pages out of the sparsest blocks, which
    # go back, until holes are under a 32nd (or no block is a sixteenth
    # empty).  The heap then holds about what a fresh board would.
    rng = random.Random(8)
    n = 200_000
    names = [f"player:{i:012d}" for i in range(n)]
    index = random_board(pages_cls, rng, names)
    full = index._page_heap()
    assert full["dead"] <= full["bytes"] / 8  # random arrivals reuse their holes
    left = lose_members(index, rng, names, n * 3 // 4, 5_000)
    heap = index._page_heap()
    assert heap["evacuated"] > 0
    assert heap["blocks"] < full["blocks"] / 2
    assert heap["dead"] <= heap["bytes"] / 8 + 256 * 1024, heap
    fresh = random_board(pages_cls, rng, left)
    assert heap["bytes"] <= fresh._page_heap()["bytes"] * 1.3, (heap, fresh._page_heap())


def test_name_records_take_their_length_in_4_byte_units(pages_cls):
    # A record is a length byte and the name's UTF-8 bytes, padded to 4
    # bytes, at least 8 (a free record keeps its length and a link) (issue
    # 47: 8-byte units cost 4 more bytes for half the lengths,
    # player:123456's 13 bytes among them; the member's page is found
    # through its map slot, not a page number in the record).
    names = [("x" * k) for k in range(1, 41)] + ["é" * 7, "名" * 5, "player:123456", "p" * 256,
                                                 "abcdefg\x7f", "abcdefghi\xff"]
    index = pages_cls("desc", "member")
    index.apply_batch([(Op.SET, m, i) for i, m in enumerate(names)])
    index._check()
    records = sum(max(2, (1 + len(m.encode()) + 3) // 4) * 4 for m in names)
    assert index._memory()["names"] == 4 + records  # (unit 0 is never an id)
    assert all(index.score(m) == i for i, m in enumerate(names))
    # Names read back as str, ASCII (copied at once) or not (decoded).
    assert [m for m, _ in index] == names[::-1]
    # Freed records of each size are taken back by names of that size.
    index.apply_batch([(Op.REMOVE, m, None) for m in names[::2]])
    index.apply_batch([(Op.SET, m, 0) for m in names[::2]])
    index._check()
    assert index._memory()["names"] == 4 + records


def test_names_of_every_length_are_copied_whole(pages_cls):
    # Names are copied in words, the last one overlapping (pg_copy_short):
    # every length from 1 to the longest, at each of a record's alignments,
    # must come back byte for byte from a range read, a member read, a
    # dump and a load (a copy one byte short or long changes a name).
    names = [(chr(ord("a") + k % 26) * k)[:-1] + "Z" for k in range(1, 257)]
    names += ["é" + "y" * k for k in range(0, 20)]
    index = pages_cls("desc", "first")
    index.apply_batch([(Op.SET, m, i) for i, m in enumerate(names)])
    index._check()
    expected = names[::-1]
    assert [m for _, m, _ in index.range_by_rank(0, None)] == expected
    assert [index.member_at(r)[0] for r in range(1, len(names) + 1)] == expected
    loaded = pages_cls.load(index.dump())
    loaded._check()
    assert [m for _, m, _ in loaded.range_by_rank(0, None)] == expected
    assert all(loaded.score(m) == i for i, m in enumerate(names))
    skip = native("rankd._skiplist", "RankIndex").load(index.dump())
    assert skip.dump() == index.dump()


def test_the_page_table_grows_by_half(pages_cls):
    # The page table (32 bytes a page number) grows by 3/2, not 2, so it
    # is never more than a third empty beyond its first 16 page numbers.
    index = pages_cls("desc", "first", page_size=4, seed=3)
    rng = random.Random(13)
    for start in range(0, 4000, 50):
        batch = range(start, start + 50)
        index.apply_batch([(Op.SET, f"m{i}", rng.randrange(10**6)) for i in batch])
        pages = len(index._pages())  # inserts only: no page number is free
        assert index._memory()["page_table"] <= 32 * max(16, pages * 3 // 2 + 1), pages
    index._check()


def test_the_member_map_grows_and_shrinks_a_step_per_write(pages_cls):
    # A resize moves at most MAP_STEP (16) old slots per insert or removal:
    # no write pays for the whole map, which at millions of members was a
    # stall of tens of milliseconds.  Counted exactly, not timed.
    index = pages_cls("desc", "first")
    names = [f"m{i}" for i in range(60_000)]
    resizes, worst = 0, 0
    state = index._map_state()
    for i, member in enumerate(names):
        index.set(member, i % 977)
        new = index._map_state()
        if new[1] and not state[1]:
            resizes += 1
        if new[1]:  # a resize under way: this write moved one step of it
            assert new[2] - (state[2] if state[1] == new[1] else 0) <= 16
        worst = max(worst, new[3] - state[3])
        state = new
        if i % 5000 == 0:
            index._check()
    # 8 slots -> 98304 through 2^k and 3 * 2^(k-1) (the smallest finish
    # within a write)
    assert resizes >= 20
    assert worst <= 16
    assert state[0] == 98304
    # Removals shrink it the same way, twice the step while shrinking.
    worst = 0
    for i, member in enumerate(names[:55_000]):
        index.remove(member)
        new = index._map_state()
        worst = max(worst, new[3] - state[3])
        state = new
        if i % 5000 == 0:
            index._check()
    index._check()
    assert worst <= 32
    extra, old = 0, index._map_state()[1]
    while index._map_state()[1]:  # inserts move the rest of the last resize
        index.set(f"x{extra}", 1)
        extra += 1
    assert extra <= old // 32 + 1
    index._check()
    # 5,000 members and the few inserts: the size a board of them grows
    # to (at most 2/3 full), not a size left half empty.
    assert index._map_state()[0] == 8192
    assert all(index.score(m) is not None for m in names[55_000:])


def test_a_shrunk_map_finishes_moving_before_it_must_grow(pages_cls):
    # Right after a shrink, members come back: the growth at 3/4 full is
    # at least 1/8 more members away, and the shrink's step (twice a
    # growth's) has moved the whole old table by then, so no write ever
    # moves the rest of a resize at once.
    index = pages_cls("desc", "first")
    index.apply_batch([(Op.SET, f"m{i}", i) for i in range(48_000)])
    slots = index._map_state()[0]
    i = 0
    while index._map_state()[0] == slots:  # remove until the map shrinks
        index.remove(f"m{i}")
        i += 1
    shrunk = index._map_state()
    assert shrunk[1] == slots and shrunk[0] < slots
    left = len(index)
    state, worst, grew = shrunk, 0, False
    for k in range(left // 4):
        index.set(f"back{k}", k)
        new = index._map_state()
        worst = max(worst, new[3] - state[3])
        if new[0] > state[0]:
            grew = True
            assert state[1] == 0, "a growth came while the shrink was still moving"
        state = new
    assert grew
    assert worst <= 32
    index._check()


def test_a_map_sized_for_a_walked_dump_shrinks_as_it_loads(pages_cls):
    # A walked dump repeats the members written ahead of the walk, and its
    # load sizes the map for every record: here ten records a member.  The
    # load then shrinks the map to its members and moves the old table
    # itself: the writes after it move no old table (a first removal had
    # shrunk it many sizes at once, and the growth that came before the
    # old table was moved moved all of it in one write).
    index = pages_cls("desc", "first")
    members = 4000
    index.apply_batch([(Op.SET, f"m{i}", i) for i in range(members)])
    walk, pieces, low, rounds = index.dump_walk(2000), [], -1, {}
    for piece in walk:
        pieces.append(piece)
        for name in re.findall(rb"m[0-9]+", piece):
            if rounds.get(name, 0) < 9:  # written again, ahead of the walk
                rounds[name] = rounds.get(name, 0) + 1
                index.set(name.decode(), low)
                low -= 1
    body = walk.header() + b"".join(pieces)
    loaded = pages_cls.load(body + struct.pack("<I", zlib.crc32(body)))
    assert len(loaded) == members and sum(rounds.values()) > 8 * members
    loaded._check()
    slots, old, _, _ = loaded._map_state()
    assert old == 0 and members * 4 <= slots * 3 and members * 3 > slots  # fits its members
    state, worst, grew = loaded._map_state(), 0, False
    loaded.remove("m0")
    for k in range(members):
        loaded.set(f"new{k}", k)
        new = loaded._map_state()
        worst = max(worst, new[3] - state[3])
        grew = grew or new[0] > state[0]
        state = new
    assert grew and worst <= 16
    loaded._check()


def test_the_page_table_grows_past_its_mapping_and_reuses_numbers(pages_cls):
    # Past 64 KiB an array of the page table is a mapping of its own, grown
    # by mremap: pages, first keys and free numbers survive every growth.
    index = pages_cls("desc", "first", page_size=4, seed=5)
    rng = random.Random(3)
    index.apply_batch([(Op.SET, f"m{i}", rng.randrange(10**6)) for i in range(40_000)])
    assert len(index._pages()) > 8192  # 8 bytes a number: past 64 KiB
    index._check()
    gone = rng.sample(range(40_000), 30_000)
    index.apply_batch([(Op.REMOVE, f"m{i}", None) for i in gone])
    index._check()
    index.apply_batch([(Op.SET, f"b{i}", rng.randrange(10**6)) for i in range(60_000)])
    index._check()
    assert len(index) == 70_000
    pages = len(index._pages())
    assert index._memory()["page_table"] <= 32 * (pages * 3 // 2 + 1)  # (32 bytes a number)


def test_every_page_and_name_is_freed(pages_cls, pages_module):
    gc.collect()
    pages0, names0 = pages_module.live_pages(), pages_module.live_names()
    index = pages_cls("desc", "member", page_size=4)
    for i in range(1000):
        index.set(f"n{i}", i % 50)
    assert pages_module.live_names() - names0 == 1000
    assert pages_module.live_pages() - pages0 >= 250
    copy = pages_cls.load(index.dump())
    for i in range(0, 1000, 2):
        index.remove(f"n{i}")
    assert pages_module.live_names() - names0 == 500 + 1000
    index.clear()
    assert pages_module.live_names() - names0 == 1000
    del copy
    assert (pages_module.live_pages(), pages_module.live_names()) == (pages0, names0)
    # A dump that turns out corrupt half-way frees what its load allocated.
    records = [DumpRecord(float(100 - i), i, f"d{i}".encode()) for i in range(50)]
    records.append(DumpRecord(0.0, 60, b"d7"))  # a member repeated
    with pytest.raises(ValueError, match="repeats a member"):
        pages_cls.load(encode_dump("desc", "first", 61, records))
    del index
    gc.collect()
    assert (pages_module.live_pages(), pages_module.live_names()) == (pages0, names0)


def test_page_size_is_checked(pages_cls):
    for bad in (0, 3, 4097):
        with pytest.raises(ValueError):
            pages_cls(page_size=bad)
    assert pages_cls(page_size=4)._page_size == 4


# --- 32-bit seqs, widened on a board's first seq past 2**32 - 1 --------------------------------


@pytest.mark.parametrize("page_size", [4, 64])
def test_the_first_seq_past_32_bits_widens_every_page(pages_cls, page_size):
    # Seqs below 2**32 are kept in 4 bytes an entry; the first larger one
    # (here given explicitly, as a replay may) widens every page to 8
    # bytes, keeping every entry, link and order, and later writes, dumps
    # and loads see the full seqs.
    rng = random.Random(21)
    index = pages_cls("desc", "first", page_size=page_size)
    model = ModelIndex("desc", "first")
    for i in range(400):
        member, score = f"m{i}", rng.randrange(20)  # many ties: seqs decide
        index.set(member, score)
        model.set(member, score)
    narrow = index._memory()["pages"]
    big = 2**32 + 5
    # The widening write moves a present member (its page moves under it).
    index.set("m10", 7, seq=big)
    model.set("m10", 7, seq=big)
    index.set("late", 7, seq=big + 1)
    model.set("late", 7, seq=big + 1)
    index._check()
    assert index._memory()["pages"] > narrow  # 8 bytes a seq now
    assert index.next_seq == big + 2
    for i in range(0, 400, 3):  # ties with the wide seq: it arrived last
        index.set(f"m{i}", 7)
        model.set(f"m{i}", 7)
    index.set("big2", 7, seq=2**40)
    model.set("big2", 7, seq=2**40)
    index._check()
    assert_index_matches(index, model)
    records = decode_dump(index.dump()).records
    assert max(r.seq for r in records) == 2**40
    copy = pages_cls.load(index.dump())
    copy._check()
    assert copy.dump() == index.dump()
    assert_index_matches(copy, model)


def test_a_seq_that_fits_keeps_the_pages_narrow(pages_cls):
    index = pages_cls("desc", "first", page_size=8, seed=5)
    index.apply_batch([(Op.SET, f"m{i}", i % 5, 2**32 - 1 - i) for i in range(100)])
    narrow = index._memory()["pages"]
    wide = pages_cls("desc", "first", page_size=8, seed=5)
    wide.apply_batch([(Op.SET, f"m{i}", i % 5, 2**32 - 1 - i) for i in range(100)])
    wide.set("x", 1, seq=2**32)
    wide.remove("x")
    assert wide._memory()["pages"] > narrow
    index._check()
    wide._check()
    assert [index.rank(f"m{i}") for i in range(100)] == [wide.rank(f"m{i}") for i in range(100)]


# --- narrow keys: int32 scores in 4 bytes, a page widened by the first that is not ---------

INT32_EDGES = [0, 1, -1, 2**31 - 1, -(2**31), 2**31 - 2, -(2**31) + 1]
NOT_INT32 = [2**31, -(2**31) - 1, 0.5, -0.0, 1e300, 2**53, -2.5]


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("tie_break", TIE_BREAKS)
@pytest.mark.parametrize("widening", NOT_INT32)
def test_a_score_that_is_not_an_int32_widens_only_the_page_it_enters(pages_cls, order,
                                                                    tie_break, widening):
    # Scores that are int32s (the edges of its range included) keep keys
    # in 4 bytes; one that is not (out of range, a fraction, -0.0) widens
    # the page it enters to f64 keys, and no other, keeping every entry,
    # link, order and zero's sign; later writes move wide keys between
    # pages (splits, shares, merges) and dumps and loads see exact scores.
    rng = random.Random(hash((order, tie_break, str(widening))) & 0xFFFF)
    index = pages_cls(order, tie_break, page_size=5, seed=3)
    model = ModelIndex(order, tie_break)
    model.next_seq = index.next_seq
    for _i in range(300):
        member = f"m{rng.randrange(200)}"
        score = rng.choice([*INT32_EDGES, rng.randrange(-50, 50)])
        assert index.set(member, score) == model.set(member, score)
    index._check()
    assert index._wide_pages() == 0
    # The widening write moves a present member (its page moves under it).
    present = next(iter(index))[0]
    assert index.set(present, widening) == model.set(present, widening)
    index._check()
    assert index._wide_pages() == 1
    for _i in range(400):  # and on: members come and go around the wide keys
        member = f"m{rng.randrange(220)}"
        if rng.random() < 0.3:
            assert index.remove(member) == model.remove(member)
        else:
            score = rng.choice([widening, rng.randrange(-50, 50), 0.0, -0.0])
            assert index.incr(member, score) == model.incr(member, score)
        index._check()
    assert_index_matches(index, model)
    assert_same_dump(index.dump(), model.dump())
    copy = pages_cls.load(index.dump())  # (its peaks start again: compared by dump)
    copy._check()
    assert copy.dump() == index.dump()


def test_a_widening_write_moves_one_page_not_the_board(pages_cls):
    index = pages_cls("desc", "first", seed=4)
    index.apply_batch([(Op.SET, f"m{i}", i % 1000, None) for i in range(200_000)])
    before = index._memory()["pages"]
    index.set("m77", 0.5)
    index.set("fresh", 2.5)
    index._check()
    assert 1 <= index._wide_pages() <= 2
    assert index._memory()["pages"] - before < 2 * 64 * 4 + 64 * 13  # two pages' keys, a split
    assert index.score("m77") == 0.5 and index.score("fresh") == 2.5


@pytest.mark.parametrize("tie_break", TIE_BREAKS)
def test_int32_scores_take_four_bytes_an_entry_fewer(pages_cls, tie_break):
    # The same board with every score + 0.5: every page holds f64 keys,
    # 4 bytes an entry more, and the same order.
    def board(fraction: float):
        index = pages_cls("desc", tie_break, page_size=64, seed=9)
        index.apply_batch([(Op.SET, f"m{i}", (i * 7919) % 100_000 + fraction, None)
                           for i in range(20_000)])
        index._check()
        return index
    narrow, wide = board(0.0), board(0.5)
    assert narrow._wide_pages() == 0
    assert wide._wide_pages() == len(wide._pages())
    extra = wide._memory()["pages"] - narrow._memory()["pages"]
    assert 4 * 20_000 <= extra <= 4 * 20_000 * 1.3, extra  # (spare room in pages too)
    assert [m for m, _ in narrow] == [m for m, _ in wide]


@pytest.mark.parametrize("where", [0, 1, 55, 56, 57, 250, 499])
def test_a_load_widens_the_page_of_a_record_that_needs_it(pages_cls, where):
    # A dump of int32 scores but one loads narrow but for the page that
    # holds that record (widened as it is filled, or made wide if the
    # record starts it: pages are loaded 56 entries to a page).
    model = ModelIndex("asc", "first")
    for i in range(500):
        model.set(f"m{i:03d}", i * 2 + (0.5 if i == where else 0))
    index = pages_cls.load(model.dump())
    index._check()
    assert index._wide_pages() == 1
    assert_index_matches(index, model)
    assert index.dump() == model.dump()
    for i in range(0, 500, 7):  # the loaded links and pointers hold through writes
        model.incr(f"m{i:03d}", 1001)
        index.incr(f"m{i:03d}", 1001)
    index._check()
    assert_index_matches(index, model)


@settings(max_examples=60, deadline=None)
@given(
    order=st.sampled_from(ORDERS),
    tie_break=st.sampled_from(TIE_BREAKS),
    states=st.lists(st.tuples(st.integers(0, 30).map(lambda i: f"s{i}"),
                              st.sampled_from([*INT32_EDGES, *NOT_INT32, 3, -7]),
                              st.integers(0, 40)), min_size=1, max_size=40),
)
def test_set_states_give_wide_keys_the_pages_they_need(pages_cls, order, tie_break, states):
    index = pages_cls(order, tie_break, page_size=4, seed=1)
    model = ModelIndex(order, tie_break)
    index.set_states(states)
    model.set_states(states)
    index._check()
    if all(not isinstance(score, float) and -(2**31) <= score < 2**31
           for _, score, _ in states):
        assert index._wide_pages() == 0
    assert_index_matches(index, model)


def test_the_member_map_grows_by_three_halves_and_four_thirds(pages_cls):
    # Sizes 2^k and 3 * 2^(k-1), at most 3/4 full: a map is never below
    # half full after growing (doubling left it 3/8 full); 1M members take
    # 1.5 * 2^20 slots (6.3 bytes a member), not 2^21 (8.4).
    index = pages_cls("desc", "member")
    sizes = set()
    for i in range(30_000):
        index.set(f"m{i}", i % 100)
        sizes.add(index._map_state()[0])
        if i % 3000 == 0:
            index._check()
    index._check()
    grown = sorted(sizes)
    assert grown[:6] == [8, 12, 16, 24, 32, 48]
    assert all(b in (a * 3 // 2, a * 4 // 3) for a, b in itertools.pairwise(grown))
    slots = index._map_state()[0]
    assert slots * 3 >= 30_000 * 4
    assert slots < 30_000 * 2
    assert all(index.rank(f"m{i}") is not None for i in range(0, 30_000, 7))


def test_removals_give_freed_memory_back_at_a_bounded_cadence(pages_cls):
    # glibc keeps freed chunks resident: after removing a large share of a
    # board the index trims the heap, once per sixteenth of the board freed
    # (and 1 MiB), not on every removal; a small board never does.
    small = pages_cls("desc", "first")
    small.apply_batch([(Op.SET, f"s{i}", i) for i in range(2000)])
    small.apply_batch([(Op.REMOVE, f"s{i}", None) for i in range(2000)])
    assert small._trims == 0
    index = pages_cls("desc", "first")
    n = 200_000
    names = [f"player:{i:012d}" for i in range(n)]
    rng = random.Random(3)
    index.apply_batch([(Op.SET, m, rng.randrange(1_000_000)) for m in names])
    assert index._trims == 0
    gone = rng.sample(names, n * 3 // 4)
    index.apply_batch([(Op.REMOVE, m, None) for m in gone])
    index._check()
    assert 1 <= index._trims <= 16
    trims = index._trims
    index.clear()  # everything freed at once: one more trim
    assert index._trims == trims + 1


def test_a_big_batch_matches_single_calls(pages_cls):
    # Past 32768 members a batch asks for its operations' slots, names and
    # pages ahead and keeps each member's hash for its write: repeated
    # members, invalid operations between valid ones and members that are
    # equal strs but other objects must give what single calls give.
    rng = random.Random(31)
    names = [f"player:{i:012d}" for i in range(40_000)]
    batched, single = pages_cls("desc", "first"), pages_cls("desc", "first")
    load = [(Op.SET, m, rng.randrange(1_000_000)) for m in names]
    batched.apply_batch(load)
    single.apply_batch(load)
    ops = []
    for i in range(6000):
        roll = rng.random()
        member = rng.choice(names[:500]) if roll < 0.5 else rng.choice(names)
        if roll < 0.05:
            ops.append((Op.INCR, "".join(member), 1))  # an equal str, another object
        elif roll < 0.08:
            ops.append((Op.INCR, 7, 1))  # invalid: not a str
        elif roll < 0.10:
            ops.append((Op.INCR, member, float("nan")))  # invalid value
        elif roll < 0.15:
            ops.append((Op.REMOVE, member, None))
        elif roll < 0.20:
            ops.append((Op.SET, f"new{i}", rng.randrange(1000)))
        else:
            ops.append((Op.INCR, member, rng.randrange(-5, 6)))
    got = batched.apply_batch(ops)
    for op, result in zip(ops, got, strict=True):
        if isinstance(result, Exception):
            with pytest.raises(type(result)):
                single.incr(op[1], op[2])
            continue
        code, member, value = op
        if code == Op.REMOVE:
            expected = single.remove(member)
        elif code == Op.SET:
            expected = single.set(member, value)
        else:
            expected = single.incr(member, value)
        rank = single.rank(member)
        assert result == (*expected, rank if expected[1] is not None else None), op
    batched._check()
    assert batched.dump() == single.dump()


def test_a_batch_warms_the_walks_of_what_it_can_read(pages_cls):
    # Past 32768 members a batch walks each group's searches in lock step
    # before the writes.  Op members are an IntEnum and plain ints alike;
    # what it cannot read (a bool op, a member that is not a str, a value
    # that is not a number, a tuple too short) is skipped.  (A removal of
    # an absent member usually has nothing to walk to, but a tag that
    # collides in the map's keyed hash walks it: not counted here.)
    # Skipped or not, every operation's result is its single call's.
    batched, single = pages_cls("desc", "first"), pages_cls("desc", "first")
    load = [(Op.SET, f"w{i}", i % 5000) for i in range(40_000)]
    batched.apply_batch(load)
    single.apply_batch(load)
    # A write that stays in its page (most +1s) warms its rank's walk
    # forward from there; one that moves far or removes, its search.
    for ops, ahead in (([(Op.INCR, f"w{i}", 1.0) for i in range(64)], range(40, 65)),
                       ([(int(Op.SET), f"w{i}", 7) for i in range(64)], range(0, 17)),
                       ([(Op.REMOVE, f"w{i}", None) for i in range(100, 164)], range(1)),
                       ([(Op.SET, f"wü{i}", i) for i in range(64)], range(1))):
        before, before_ahead = batched._warmed, batched._warmed_ahead
        batched.apply_batch(ops)
        assert batched._warmed - before == 64, ops[0]
        assert batched._warmed_ahead - before_ahead in ahead, ops[0]
        single.apply_batch([(op, member, value) for op, member, value in ops])

    class Score(float):
        """A float the batch takes but its warming does not read."""

    skipped = [(True, "w1", 1), (Op.SET, 5, 1), (Op.SET, "w2", "3"),
               (Op.SET, "w3"), "garbage", (Op.INCR, "w4", float("nan")),
               (Op.SET, "w5", 2**70), (Op.SET, "w6", Score(9999.5))]
    before = batched._warmed
    results = batched.apply_batch(skipped * 8)
    assert batched._warmed - before == 0
    assert sum(isinstance(r, Exception) for r in results) == 7 * 8
    assert results[7] == (7.0, 9999.5, True, 1)  # (set to 7 above)
    assert results[15] == (9999.5, 9999.5, False, 1)
    absent = batched.apply_batch([(Op.REMOVE, "absent", None)] * 20)
    assert absent == [(None, None, False, None)] * 20
    single.set("w6", 9999.5)
    batched._check()
    assert batched.dump() == single.dump()


# --- map slots that name entries (issue 47, memory step 5) ----------------------------------


def test_a_name_record_holds_no_page_number(pages_cls):
    # A 19-byte name (player:%012d) takes a 20-byte record: its length byte
    # and the name, 4 bytes less than with the page number it held.
    index = pages_cls("desc", "first")
    names = [f"player:{i:012d}" for i in range(1000)]
    index.apply_batch([(Op.SET, m, i) for i, m in enumerate(names)])
    index._check()
    assert index._memory()["names"] == 4 + 20 * len(names)


@pytest.mark.parametrize("page_size", [4, 5, 8])
@pytest.mark.parametrize("tie_break", ["first", "member"])
def test_map_slots_follow_entries_through_splits_shares_and_merges(pages_cls, page_size,
                                                                   tie_break):
    # Every split, share and merge moves entries to another page, where
    # they take new entry numbers: _check() finds each member's slot by its
    # name and asserts that it holds the code of the member's own entry.
    # The map resizes meanwhile (it grows and shrinks a step per write), so
    # moved entries' slots are found in either table.
    index = pages_cls("desc", tie_break, page_size=page_size, seed=page_size)
    model = ModelIndex("desc", tie_break)
    model.next_seq = index.next_seq
    rng = random.Random(page_size * 31 + len(tie_break))
    for step in range(2500):
        member = f"m{rng.randrange(300)}"
        kind = rng.random()
        if kind < 0.2:
            got, want = index.remove(member), model.remove(member)
        elif kind < 0.6:
            delta = rng.choice([-50, -3, 1, 2, 70])
            got, want = index.incr(member, delta), model.incr(member, delta)
        else:
            score = rng.randrange(40)
            got, want = index.set(member, score), model.set(member, score)
        assert got == want, (step, member)
        if step % 5 == 0:
            index._check()
            fills_ok(index)
    index._check()
    assert_index_matches(index, model)
    assert all(index.rank(m) == model.rank(m) for m in (f"m{i}" for i in range(300)))


def test_a_member_moved_by_its_own_write_across_full_pages(pages_cls):
    # A member's own write takes its entry out and puts it in elsewhere;
    # the pages on the way are full, so the insert shares or splits them
    # and moves other entries, which may take the member's old entry
    # number in its old page: its slot must not be mistaken for theirs.
    index = pages_cls("desc", "first", page_size=4, seed=9)
    names = [f"f{i}" for i in range(64)]
    for i, m in enumerate(names):
        index.set(m, i)
    for rnd in range(6):
        for i, m in enumerate(names):
            index.set(m, (i * 37 + rnd * 11) % 64 + rnd * 100)
            index._check()
    assert sorted(index.score(m) for m in names) == sorted(
        (i * 37 + 5 * 11) % 64 + 500 for i in range(64))


def test_arena_compaction_finds_entries_through_the_map(pages_cls):
    # The compaction finds a record's entry by the record's name through
    # the map (a record holds no page number); a freed record's name is
    # overwritten by its free list link, or may be a re-added member's,
    # whose entry lists another record: neither is taken for live.
    index = pages_cls("desc", "member", page_size=4, seed=4)
    rng = random.Random(5)
    names = [f"player:{i:012d}" for i in range(4000)]
    index.apply_batch([(Op.SET, m, rng.randrange(500)) for m in names])
    gone = rng.sample(names, 2500)
    stay = [m for m in names if m not in set(gone)]
    for member in gone[:2000]:
        index.remove(member)
    # Some come back (new records, the old ones free) while the sweep runs.
    for i, member in enumerate(gone[:300]):
        index.set(member, i)
        if i % 25 == 0:
            index._check()
    for i, member in enumerate(gone[2000:]):
        index.remove(member)
        index.incr(stay[i], 1)
        if i % 25 == 0:
            index._check()
    for i in range(1500):  # the sweep moves on a step a write
        index.incr(stay[i], 1)
        if i % 100 == 0:
            index._check()
    index._check()
    left = set(names) - set(gone) | set(gone[:300])
    assert len(index) == len(left)
    assert all(m in index for m in left)
    assert not any(m in index for m in set(gone[300:]))
    # Packed again: the live records, plus the records freed behind the sweep.
    assert index._memory()["names"] <= 4 + 20 * len(left) * 1.3


def test_a_loaded_index_keeps_its_codes_through_churn(pages_cls):
    # A load numbers a page's entries by position; later writes move them
    # and take numbers back from pages that lost entries.
    index = pages_cls("asc", "first", page_size=5, seed=2)
    rng = random.Random(3)
    for i in range(500):
        index.set(f"l{i}", rng.randrange(100))
    copy = pages_cls.load(index.dump())
    copy._check()
    for step in range(1500):
        member = f"l{rng.randrange(600)}"
        if rng.random() < 0.3:
            assert copy.remove(member) == index.remove(member)
        else:
            score = rng.randrange(100)
            assert copy.set(member, score, seq=step + 10_000) == index.set(
                member, score, seq=step + 10_000)
        if step % 10 == 0:
            copy._check()
    copy._check()
    assert copy.dump() == index.dump()


def test_pages_hold_at_most_64_entries(pages_cls):
    # Entry numbers are 6 bits (a page's numbers in use are one 64-bit word).
    with pytest.raises(ValueError, match="between 4 and 64"):
        pages_cls(page_size=65)
    assert pages_cls(page_size=64)._page_size == 64


def test_a_compacted_arena_keeps_an_eighth_of_room(pages_cls):
    # The compaction's end cuts the arena to its live records and an
    # eighth more (whole 4 KiB pages), not to a power of two: the arena's
    # end was touched before the removals, so room kept beyond that would
    # stay resident unused (up to as much again as the live records).
    index = pages_cls("desc", "first", page_size=8, seed=1)
    rng = random.Random(2)
    names = [f"player:{i:012d}" for i in range(40_000)]
    index.apply_batch([(Op.SET, m, rng.randrange(1000)) for m in names])
    for member in rng.sample(names, 24_000):
        index.remove(member)
    left = [m for m in names if m in index]
    i = 0
    while index._arena_state()[0] > 4 + 5 * len(left) * 1.05:  # the sweep, a step a write
        index.incr(left[i % len(left)], 1)
        i += 1
    index.incr(left[0], 1)
    used, cap = index._arena_state()
    assert cap <= used + used // 8 + 1024
    index._check()
    assert all(m in index for m in left)


# --- a hash tag in each map slot (issue 47, speed step) -------------------------------------


def test_slot_tags_follow_members_through_moves_resizes_and_compaction(pages_cls):
    # A slot holds 4 bits of its member's hash beside the page and entry
    # numbers, so that a probe passes other members' slots without reading
    # their pages.  Entries moved to other pages (splits, shares, merges of
    # tiny pages), slots moved by the map's resizes (it grows from 8 slots
    # and shrinks, a step a write) and records moved by the arena's
    # compaction all keep the member's own tag; _check() verifies every
    # slot's tag against its member's hash, in both tables of a resize.
    index = pages_cls("desc", "first", page_size=4, seed=7)
    rng = random.Random(11)
    names = [f"player:{i:012d}" for i in range(3000)]
    live: set[str] = set()
    for step in range(9000):
        member = rng.choice(names)
        kind = rng.random()
        if kind < 0.3 and step > 4000:
            index.remove(member)
            live.discard(member)
        elif kind < 0.6:
            index.incr(member, rng.choice([-40, -1, 3, 55]))
            live.add(member)
        else:
            index.set(member, rng.randrange(200))
            live.add(member)
        if step % 250 == 0:
            index._check()
            assert all(index._tags(m)[0] == index._tags(m)[1] for m in live)
    index._check()
    tags = [index._tags(m) for m in live]
    assert all(slot == hashed for slot, hashed in tags)
    # From the keyed hash: spread over all 16 values.
    assert len({slot for slot, _ in tags}) == 16
    assert index._map_state()[3] > 0  # the map did resize meanwhile
    assert all(index._tags(m) is None for m in set(names) - live)


def test_a_load_tags_its_slots(pages_cls):
    index = pages_cls("asc", "member", page_size=5, seed=3)
    index.apply_batch([(Op.SET, f"player:{i:012d}", i % 97) for i in range(2000)])
    copy = pages_cls.load(index.dump())
    copy._check()
    assert all(copy._tags(f"player:{i:012d}") is not None
               and copy._tags(f"player:{i:012d}")[0] == copy._tags(f"player:{i:012d}")[1]
               for i in range(2000))


def test_check_finds_a_slot_with_another_tag(pages_cls):
    index = pages_cls("desc", "first", page_size=8, seed=1)
    index.apply_batch([(Op.SET, f"m{i}", i) for i in range(100)])
    index._check()
    index._corrupt_tag("m42")
    assert "m42" not in index  # a lookup skips a slot of another tag
    with pytest.raises(AssertionError, match=r"tag|misses a member"):
        index._check()


# --- the count tree (entries by page, for unique ranks) ---------------------------------


def _tree_depth(tree) -> int:
    depth = 0
    while tree and isinstance(tree[0][0], list):
        tree = tree[0][0]
        depth += 1
    return depth + (1 if tree else 0)


def _tree_fills(tree, out: list, rightmost: bool = True) -> list:
    """(children, on the rightmost path) for every node of the tree."""
    out.append((len(tree), rightmost))
    for k, (child, _) in enumerate(tree):
        if isinstance(child, list):
            _tree_fills(child, out, rightmost and k == len(tree) - 1)
    return out


def test_the_count_tree_grows_deep_and_empties_under_random_writes(pages_cls):
    # Pages of 4 entries make nodes of 4 children: a 3,000-member board's
    # tree is many levels deep, so that every split and merge of a node
    # (a root's too) happens; _check() compares the tree with the pages
    # (order, entries, parents, slots, sums, free nodes) after each step.
    index = pages_cls("desc", "first", page_size=4, seed=11)
    model = ModelIndex("desc", "first")
    model.next_seq = index.next_seq
    rng = random.Random(11)
    members = [f"m{i}" for i in range(3000)]
    deepest = 0
    for k, member in enumerate(members):
        score = rng.randrange(500)
        assert index.set(member, score) == model.set(member, score)
        if k % 97 == 0:
            index._check()
            deepest = max(deepest, _tree_depth(index._count_tree()))
    index._check()
    assert _tree_depth(index._count_tree()) >= 5, _tree_depth(index._count_tree())
    assert_index_matches(index, model)
    for member in rng.sample(members, 600):  # moves: pages split, share and merge
        delta = rng.randrange(-300, 300)
        assert index.incr(member, delta) == model.incr(member, delta)
    index._check()
    assert_index_matches(index, model)
    rng.shuffle(members)
    for k, member in enumerate(members):
        assert index.remove(member) == model.remove(member)
        if k % 89 == 0:
            index._check()
            assert [index.rank(m) for m in members[k + 1:k + 40]] == \
                [model.rank(m) for m in members[k + 1:k + 40]]
    index._check()
    assert index._count_tree() == []
    assert index._memory()["counts"] > 0  # (its nodes are kept for reuse until clear)
    index.clear()
    assert index._memory()["counts"] == 0


def test_a_load_fills_the_count_tree_whole(pages_cls):
    # A load appends pages: a full node's split starts the new node with
    # the appended child alone, so every node off the rightmost path is
    # full (halving would leave a loaded board's nodes half empty).  A
    # load makes pages of the default size: nodes of 64 children.
    index = pages_cls("desc", "first", page_size=8, seed=2)
    index.apply_batch([(Op.SET, f"m{i}", i * 7 % 1009) for i in range(300_000)])
    loaded = pages_cls.load(index.dump())
    loaded._check()
    fills = _tree_fills(loaded._count_tree(), [])
    assert len(fills) > 50
    assert all(n == 64 for n, rightmost in fills if not rightmost), fills
    assert [loaded.rank(f"m{i}") for i in range(0, 300_000, 37)] == \
        [index.rank(f"m{i}") for i in range(0, 300_000, 37)]


@pytest.mark.parametrize("kind", ["entries", "leaders"])
def test_ranks_read_the_count_tree(pages_cls, kind):
    # An entry count off by one shows in the unique rank of every member
    # of a later page and in no dense rank; a leader count off by one, the
    # other way round.  _check() finds either.
    index = pages_cls("desc", "first", page_size=8, seed=4)
    index.apply_batch([(Op.SET, f"m{i}", 1000 - i // 2) for i in range(200)])
    index._check()
    members = [f"m{i}" for i in range(199)]  # (m199, written last: its rank is remembered)
    ranks = {m: index.rank(m) for m in members}
    dense = {m: index.dense_rank(m) for m in members}
    shown, other = (ranks, dense) if kind == "entries" else (dense, ranks)
    read = index.rank if kind == "entries" else index.dense_rank
    index._corrupt_count("m50", *((1, 0) if kind == "entries" else (0, 1)))
    shifted = [m for m in members if read(m) == shown[m] + 1]
    same = [m for m in members if read(m) == shown[m]]
    assert len(shifted) + len(same) == len(members)
    assert "m198" in shifted and "m0" in same and "m50" in same
    assert all(ranks[m] > ranks["m50"] for m in shifted)
    unread = index.dense_rank if kind == "entries" else index.rank
    assert {m: unread(m) for m in members} == other
    with pytest.raises(AssertionError, match="count tree"):
        index._check()


@pytest.mark.parametrize("order", ["desc", "asc"])
def test_competition_rank_counts_runs_of_ties_across_pages(pages_cls, order):
    # A competition rank counts the members before the member's run of
    # equal scores: from the count tree when the run starts in the
    # member's page (or at its first entry), by a search when it comes
    # from an earlier page.  Runs of 1 to 13 ties on pages of 4 give all
    # three, with -0.0 beside 0.0 (equal scores), checked against a count
    # of the scores, then again after removals and increments.
    rng = random.Random(11)
    index = pages_cls(order, "first", page_size=4, seed=3)
    scores = {}
    value = 0
    for run in range(60):
        value += rng.choice([1, 2, 5])
        for k in range(rng.choice([1, 1, 2, 3, 5, 8, 13])):
            scores[f"r{run}:{k}"] = float(value)
    scores.update({"z+": 0.0, "z-": -0.0, "z2": 0.0})
    index.apply_batch([(Op.SET, m, s) for m, s in scores.items()])

    def better(s: float) -> int:
        return sum(1 for t in scores.values() if (t > s if order == "desc" else t < s))

    for step in range(3):
        index._check()
        for m, s in scores.items():
            assert index.competition_rank(m) == better(s) + 1, (step, m)
            assert index.percentile(m) == pytest.approx(
                100.0 * (len(scores) - better(s)) / len(scores))
        for m in rng.sample(sorted(scores), 30):
            if rng.random() < 0.5:
                index.remove(m)
                del scores[m]
            else:
                index.incr(m, 1)
                scores[m] += 1


def _names_of_one_tag(index, count: int, prefix: str) -> list[str]:
    """``count`` names whose hashes under ``index``'s key share a tag."""
    names: list[str] = []
    i = 0
    while len(names) < count:
        name = f"{prefix}{i}"
        if index._hash_of(name) & 15 == 0:
            names.append(name)
        i += 1
    return names


def test_a_probe_tells_apart_members_of_one_tag(pages_cls):
    # A probe passes another member's slot on its tag, but reads the page
    # and name of a slot with the member's tag.  32 members of one tag in
    # a map of 48 slots: every probe meets several slots of its tag, and
    # must still find exactly its member, before and after removals
    # (which shift slots back), and no member for absent names of the tag.
    index = pages_cls("desc", "first", page_size=4, seed=9)
    members = _names_of_one_tag(index, 32, "m")
    absent = _names_of_one_tag(index, 40, "x")
    for score, member in enumerate(members):
        index.set(member, score)
    assert index._map_state()[0] == 48
    for score, member in enumerate(members):
        assert index.score(member) == score
        assert index.rank(member) == len(members) - score
    assert all(index.score(name) is None for name in absent)
    index._check()
    kept = list(members)
    for gone in members[::3]:
        index.remove(gone)
        kept.remove(gone)
        index._check()
        for score, member in enumerate(members):
            assert (member in index) == (index.score(member) == score)
    assert [m for m in members if m in index] == kept


def test_lookups_in_a_three_quarters_full_map(pages_cls):
    # The member map at its fullest (3/4 of 131072 slots), where a probe
    # most often passes slots of another member with the member's tag:
    # every member's score and rank, and no absent name, as a sorted model
    # says.
    index = pages_cls("desc", "first", seed=4)
    count = 98_000
    rng = random.Random(5)
    scores = {f"p:{i:014d}": rng.randrange(10**6) for i in range(count)}
    index.apply_batch([(Op.SET, m, s) for m, s in scores.items()])
    assert index._map_state()[0] == 131072
    ranked = sorted(scores, key=lambda m: -scores[m])  # ties: arrival order (stable)
    assert all(index.score(m) == scores[m] for m in scores)
    assert all(index.rank(m) == r for r, m in enumerate(ranked, 1))
    assert all(index.score(f"q:{i:014d}") is None for i in range(count))


def test_the_page_number_limit_is_refused_clearly(pages_cls, pages_module):
    # Page numbers are 22-bit (the slot's code holds a tag, a page number
    # and an entry number): 2^22 - 1 pages, over 134M members at the
    # default page size's minimum fill.  Reaching it takes that many
    # members, so the test lowers it: a write that needs another page is
    # refused, changing nothing, and the index stays whole.
    assert pages_module.MAX_PAGES == 2**22 - 1
    index = pages_cls("asc", "first", page_size=4, seed=5)
    with pytest.raises(ValueError, match="page limit"):
        index._limit_pages(2**22)
    index._limit_pages(6)
    with pytest.raises(ValueError, match="page limit"):
        index._limit_pages(-1)
    i = 0
    while True:
        try:
            index.set(f"a{i:03d}", i)  # ascending: a new page each 4 entries
        except OverflowError as exc:
            assert "at most 6 pages" in str(exc) and "22-bit" in str(exc)
            break
        i += 1
    # (a write that may make a page is refused once none is left)
    assert len(index) == i and 21 <= i <= 24 and len(index._pages()) == 6
    before = index.dump()
    with pytest.raises(OverflowError, match="at most 6 pages"):
        index.set("b", 1000)
    with pytest.raises(OverflowError, match="at most 6 pages"):
        index.set_states([("b", 3.5, 10**6)])
    assert index.dump() == before and "b" not in index
    index._check()
    # Writes that need no page still go; a removal that frees a page makes
    # room again.
    assert index.set("a005", 5.5) is not None
    for m in ("a000", "a001", "a002", "a003"):
        index.remove(m)
    index._check()
    index.set("b", 1000)
    index._check()
    assert index.rank("b") == len(index)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("tie_break", TIE_BREAKS)
@pytest.mark.parametrize("leaving", ["remove", "whole", "moved"])
def test_a_wide_page_narrows_again_when_its_wide_keys_leave(pages_cls, order, tie_break,
                                                           leaving):
    # A fraction widens the page it enters; once no key of that page needs
    # 8 bytes (the member removed, its score a whole number again in the
    # same page, or moved to a page far away), the page holds 4-byte keys
    # again and the memory it took comes back.
    index = pages_cls(order, tie_break, seed=6)
    model = ModelIndex(order, tie_break)
    model.next_seq = index.next_seq
    for i in range(6_000):
        index.set(f"m{i}", i * 10)
        model.set(f"m{i}", i * 10)
    before = index._memory()["pages"]
    for member, score in [("m500", 5001.5), ("m4000", 40_000.25), ("new", 23_455.5)]:
        assert index.set(member, score) == model.set(member, score)
    index._check()
    assert index._wide_pages() == 3
    for member, whole in [("m500", 5001), ("m4000", 40_001), ("new", 23_455)]:
        if leaving == "remove":
            assert index.remove(member) == model.remove(member)
        elif leaving == "whole":  # its neighbours' scores: it stays in its page
            assert index.set(member, whole) == model.set(member, whole)
        else:
            assert index.set(member, -7 if order == "desc" else 10**9) == model.set(
                member, -7 if order == "desc" else 10**9)
        index._check()
    assert index._wide_pages() == 0
    assert index._memory()["pages"] <= before + 2 * 64 * 13  # (a split's spare room at most)
    assert_same_dump(index.dump(), model.dump())
    copy = pages_cls.load(index.dump())
    assert copy.dump() == index.dump()


@pytest.mark.parametrize("tie_break", TIE_BREAKS)
def test_pages_stay_wide_exactly_while_they_hold_a_wide_key(pages_cls, tie_break):
    # Random writes of fractions and whole numbers on tiny pages (every
    # split, share and merge): after each, _check() holds; once every
    # fraction is made whole, no page is wide.
    rng = random.Random(11)
    index = pages_cls("desc", tie_break, page_size=4, seed=2)
    model = ModelIndex("desc", tie_break)
    model.next_seq = index.next_seq
    for _ in range(3000):
        member = f"m{rng.randrange(300)}"
        roll = rng.random()
        if roll < 0.2:
            assert index.remove(member) == model.remove(member)
        else:
            score = rng.randrange(1000) + (0.5 if roll < 0.5 else 0)
            assert index.set(member, score) == model.set(member, score)
        index._check()
    for member, score in list(index):
        if score != int(score):
            assert index.set(member, int(score)) == model.set(member, int(score))
            index._check()
    assert_index_matches(index, model)
    assert index._wide_pages() == 0


def test_positive_zeros_narrows_the_pages_whose_only_wide_key_was_minus_zero(pages_cls):
    index = pages_cls("desc", "first", page_size=4, seed=1)
    model = ModelIndex("desc", "first")
    model.next_seq = index.next_seq
    writes = [(f"m{i}", 100 + i) for i in range(12)] + [("d", 110.5), ("a", -0.0)]
    for member, score in writes:
        index.set(member, score)
        model.set(member, score)
    assert index._wide_pages() == 2  # the top pages' 110.5, the last page's -0.0
    assert index.positive_zeros() == model.positive_zeros() == 1
    index._check()
    assert_index_matches(index, model)
    assert index._wide_pages() == 1


def test_a_refused_write_past_32_bit_seqs_widens_nothing(pages_cls, pages_module):
    # The seqs widen to 8 bytes only for a write that goes ahead: one the
    # page table refuses leaves the pages, their memory and a live
    # iterator as they were.
    index = pages_cls("desc", "first", page_size=4, seed=1)
    for i in range(8):
        index.set(f"m{i}", i)
    fill_page_table(index)
    before = (index.dump(), index._memory()["pages"], index._seq_bytes, index.next_seq)
    walking = iter(index)
    next(walking)
    with pytest.raises(OverflowError):
        index.set("new", 3, seq=2**32)
    assert (index.dump(), index._memory()["pages"], index._seq_bytes, index.next_seq) == before
    assert len(list(walking)) == 7
    index._check()
    # With room again, the same write goes ahead and widens the seqs.
    index._limit_pages(pages_module.MAX_PAGES)
    index.set("new", 3, seq=2**32)
    index._check()
    assert index._seq_bytes == 8 and index.next_seq == 2**32 + 1


def test_apply_batch_reports_a_refusal_for_want_of_room_per_operation(pages_cls):
    index = pages_cls("desc", "first", page_size=4, seed=1)
    for i in range(8):
        index.set(f"m{i}", i)
    fill_page_table(index)
    before = index.dump()
    # (m0 stays last, in its page: that write needs no page.)
    results = index.apply_batch([(Op.SET, "m0", -1, None), (Op.SET, "new", 5, None),
                                 (Op.REMOVE, "m7", None, None)])
    assert results[0][:3] == (0.0, -1.0, True)
    assert isinstance(results[1], OverflowError)
    assert results[2][:3] == (7.0, None, True)
    assert "new" not in index and index.score("m0") == -1.0 and "m7" not in index
    assert index.dump() != before
    index._check()


def fill_page_table(index) -> None:
    """Let ``index`` number no page beyond those in use (``full``)."""
    for limit in range(len(index._pages()), len(index._pages()) + 1000):
        try:
            index._limit_pages(limit)
        except ValueError:
            continue
        if index.full:
            return
    raise AssertionError("no page limit made the index full")


@pytest.mark.parametrize("tie_break", ["first", "member"])
def test_a_load_of_known_size_takes_its_names_room_at_once(pages_cls, tie_break):
    # A load that knows the dump's size reserves the arena for its names in
    # one block (so that a big one is advised huge pages before it is
    # touched); the room is bounded by the names' bytes, and a load of
    # unknown size grows as it goes.  Either way the index is the same.
    rng = random.Random(11)
    index = pages_cls("desc", tie_break, page_size=8, seed=2)
    names = {"".join(rng.choice("ab\u00e9\u4e2d\U0001f600") for _ in range(rng.randint(1, 40)))
             for _ in range(3000)}
    index.apply_batch([(Op.SET, name, rng.randrange(1000)) for name in sorted(names)])
    data = index.dump()
    name_bytes = sum(len(name.encode()) for name in names)
    loaded = pages_cls.load(data)
    loaded._check()
    used, cap = loaded._arena_state()
    assert used <= cap <= 1 + name_bytes // 4 + 2 * len(names)
    streamed = pages_cls.load_chunks(iter([data[:1000], data[1000:]]))
    streamed._check()
    streamed_cap = streamed._arena_state()[1]
    assert streamed._arena_state()[0] == used
    assert streamed_cap & (streamed_cap - 1) == 0 and streamed_cap > cap  # doubled as it went
    assert streamed.dump() == loaded.dump() == data
    # The reserved room is used, then grows as the arena's does.
    loaded.apply_batch([(Op.SET, f"new:{i}", i) for i in range(500)])
    loaded._check()
    assert loaded._arena_state()[0] > used and len(loaded) == len(names) + 500


def test_a_big_board_takes_its_towers_in_huge_chunks(pages_cls):
    # From the 32nd chunk of towers on, a chunk is 2 MiB on 2 MiB pages.  Tiny
    # pages reach that at a few hundred thousand members; ranks, the dump and
    # a removal of most of the board stay right across the chunks.
    rng = random.Random(5)
    index = pages_cls("desc", "first", page_size=4, seed=9)
    count = 240_000
    scores = [rng.randrange(50_000) for _ in range(count)]
    for start in range(0, count, 20_000):
        index.apply_batch([(Op.SET, f"m{i}", scores[i]) for i in range(start, start + 20_000)])
    chunks, room = index._tower_chunks
    assert chunks > 32 and room == (2 << 20) // 24  # links of 24 B: forward, tower, page number
    order = sorted(range(count), key=lambda i: (-scores[i], i))  # tie-break first: set order
    for i in rng.sample(range(count), 2000):
        assert index.rank(f"m{order[i]}") == i + 1
    assert pages_cls.load(index.dump()).dump() == index.dump()
    index.apply_batch([(Op.REMOVE, f"m{i}", None) for i in range(count) if i % 10])
    index._check()
    kept = [i for i in order if i % 10 == 0]
    assert len(index) == len(kept)
    for rank, i in enumerate(kept[:: 97]):
        assert index.rank(f"m{i}") == rank * 97 + 1
