"""A board's paged indexes share one name arena (``rankd._pages.Names``).

Each name is stored once a board, not once a window and period.  These
tests drive several indexes of one arena against a model of each (the
indexes must answer as independent ones do), run ``_check()``, whose arena
check spans every index of the arena (one record per member, no free
record listed, records counted), and prove what the sharing is for: a
record freed only when no index lists it, the records of a retired index
reclaimed by the compaction that writes to the others drive, loads into a
shared arena reusing records, and a board of four windows storing each
name once.
"""

from __future__ import annotations

import gc
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import native
from index_model import ModelIndex, assert_index_matches


@pytest.fixture(scope="module")
def pages():
    native("rankd._pages", "RankIndex")
    import rankd._pages

    return rankd._pages


def records(names) -> int:
    return names._state()[0]


def settle(indexes, writes: int = 200_000) -> None:
    """Writes until the arena's compaction (if any) has swept it whole."""
    names = indexes[0]._names_arena()
    member = "settle:writer"
    for i in range(writes):
        if not names._state()[3]:
            break
        indexes[i % len(indexes)].set(member, i)
    for index in indexes:
        index.remove(member)


def test_windows_of_a_board_store_each_name_once(pages):
    gc.collect()
    before = pages.live_names()
    names = pages.Names()
    windows = [pages.RankIndex("desc", "first", names=names) for _ in range(4)]
    members = [f"player:{i:012d}" for i in range(3000)]
    for w, index in enumerate(windows):
        for i, member in enumerate(members[: 1000 * (w + 1) // 2 + 1000]):
            index.set(member, (i * 7 + w) % 500)
    for index in windows:
        index._check()
    assert records(names) == len(set(members[:3000]))
    assert pages.live_names() - before == 3000
    # One arena, as big as one index's own would be for the board's members.
    alone = pages.RankIndex("desc", "first")
    for i, member in enumerate(members):
        alone.set(member, i)
    assert windows[0]._memory()["names"] == alone._memory()["names"]
    assert names.indexes == 4
    del windows, alone, index
    gc.collect()
    assert names.indexes == 0


def test_a_record_is_freed_when_the_last_index_removes_its_member(pages):
    names = pages.Names()
    a, b, c = (pages.RankIndex("desc", "member", names=names) for _ in range(3))
    for index in (a, b, c):
        index.set("alice", 1)
        index.set("bob", 2)
    a.set("carol", 3)
    assert records(names) == 3
    a.remove("alice")
    b.remove("alice")
    assert records(names) == 3  # c lists it still
    assert c.score("alice") == 1 and c.range_by_rank(0, 5)[-1][1] == "alice"
    c.remove("alice")
    assert records(names) == 2
    a.remove("carol")
    assert records(names) == 1
    # A member re-added to one index takes the record another lists.
    a.set("alice", 9)
    b.set("alice", 9)
    assert records(names) == 2
    for index in (a, b, c):
        index._check()


def test_a_retired_index_leaves_its_records_to_the_compaction(pages):
    gc.collect()
    before = pages.live_names()
    names = pages.Names()
    all_time = pages.RankIndex("desc", "first", names=names)
    daily = pages.RankIndex("desc", "first", names=names)
    rng = random.Random(5)
    shared = [f"player:{i:012d}" for i in range(10_000)]
    only_daily = [f"guest:{i:013d}" for i in range(20_000)]
    for member in shared:
        all_time.set(member, rng.randrange(10_000))
        daily.set(member, rng.randrange(100))
    for member in only_daily:
        daily.set(member, rng.randrange(100))
    assert records(names) == 30_000
    used = names._state()[1]
    del daily  # the period retired: its own members' records are dead
    gc.collect()
    assert names.indexes == 1
    assert names._state()[3], "a compaction was started by the estimate"
    settle([all_time])
    assert records(names) == 10_000
    assert pages.live_names() - before == 10_000
    assert names._state()[1] < used * 0.45  # a third of the records, a bit of room
    all_time._check()
    assert all(all_time.score(m) is not None for m in shared)
    reference = pages.RankIndex("desc", "first")  # the same writes, an arena of its own
    rng = random.Random(5)
    for member in shared:
        reference.set(member, rng.randrange(10_000))
        rng.randrange(100)
    assert ([(m, v) for _, m, v in all_time.range_by_rank()]
            == [(m, v) for _, m, v in reference.range_by_rank()])


def test_clearing_an_index_of_a_shared_arena_keeps_the_others_names(pages):
    names = pages.Names()
    a = pages.RankIndex("asc", "first", names=names)
    b = pages.RankIndex("asc", "first", names=names)
    members = [f"m{i:018d}" for i in range(12_000)]
    for i, member in enumerate(members):
        a.set(member, i)
        b.set(member, -i)
    b.clear()
    settle([a, b])
    assert records(names) == 12_000
    a._check()
    b._check()
    assert [m for _, m, _ in a.range_by_rank(0, 3)] == members[:3]
    # Alone again, a clear drops the whole arena.
    del b
    gc.collect()
    a.clear()
    assert records(names) == 0 and len(a) == 0


def test_the_compaction_moves_a_record_in_every_index_that_lists_it(pages):
    names = pages.Names()
    a, b = (pages.RankIndex("desc", "member", names=names, page_size=8) for _ in range(2))
    rng = random.Random(3)
    members = [f"player:{i:012d}" for i in range(30_000)]
    for member in members:
        a.set(member, rng.randrange(1000))
        b.set(member, rng.randrange(1000))
    used = names._state()[1]
    gone = rng.sample(members, 20_000)
    for i, member in enumerate(gone):
        a.remove(member)
        if i % 2000 == 0:
            a._check()
    assert records(names) == 30_000  # b lists them all still
    for i, member in enumerate(gone):
        b.remove(member)  # freed now; the compaction starts and steps meanwhile
        if i % 2000 == 0:
            b._check()
    left = sorted(set(members) - set(gone))
    step = 0
    while names._state()[3]:
        member = left[step % len(left)]
        (a if step % 2 else b).incr(member, 1)
        step += 1
        if step % 997 == 0:
            a._check()
            b._check()
    a._check()
    b._check()
    assert records(names) == len(left)
    assert names._state()[1] < used * 0.4
    for index in (a, b):
        assert sorted(m for _, m, _ in index.range_by_rank()) == left
        assert all(index.rank(m) is not None for m in left)


def test_a_load_into_a_shared_arena_reuses_the_records(pages):
    gc.collect()
    before = pages.live_names()
    source = [pages.RankIndex("desc", "first") for _ in range(3)]
    rng = random.Random(8)
    members = [f"p{i:017d}" for i in range(6000)]
    for w, made in enumerate(source):
        for member in members[w * 1000:]:
            made.set(member, rng.randrange(300))
    dumps = [made.dump() for made in source]
    del made
    names = pages.Names()
    loaded = [pages.RankIndex.load(dumps[0], names=names),
              pages.RankIndex.load_chunks(iter([dumps[1][:777], dumps[1][777:]]), names=names),
              pages.RankIndex.load(dumps[2], names=names)]
    assert records(names) == 6000
    for want, got in zip(source, loaded, strict=True):
        got._check()
        assert got.dump() == want.dump()
    del source, want, got
    gc.collect()
    assert pages.live_names() - before == 6000
    # A corrupt dump's load frees its index; the records it took are dead
    # until a compaction sweeps them, and the others' stay.
    bad = bytearray(dumps[0])
    bad[-6:] = b"\xff" * 6
    with pytest.raises(ValueError):
        pages.RankIndex.load(bytes(bad), names=names)
    for index in loaded:
        index._check()


def test_arenas_are_keyed_apart(pages):
    # Names hash with the arena's key: two boards' maps probe differently.
    a, b = pages.Names(), pages.Names()
    x = pages.RankIndex(names=a)
    y = pages.RankIndex(names=b)
    members = [f"k{i}" for i in range(64)]
    for member in members:
        x.set(member, 1)
        y.set(member, 1)
    assert [x._hash_of(m) for m in members] != [y._hash_of(m) for m in members]
    # and a board's indexes share theirs: a name hashes once for all.
    z = pages.RankIndex(names=a)
    assert [z._hash_of(m) for m in members] == [x._hash_of(m) for m in members]


OPS = st.lists(
    st.tuples(st.integers(0, 2),                      # the index
              st.sampled_from(["set", "incr", "remove", "clear", "drop"]),
              st.integers(0, 40),                     # the member
              st.integers(-5, 5)),
    max_size=120)


@settings(max_examples=150, deadline=None)
@given(ops=OPS, tie_break=st.sampled_from(["first", "member"]))
def test_indexes_of_one_arena_answer_as_independent_ones(pages, ops, tie_break):
    names = pages.Names()
    indexes = [pages.RankIndex("desc", tie_break, names=names, page_size=4) for _ in range(3)]
    models = [ModelIndex("desc", tie_break) for _ in range(3)]
    for which, op, member_no, value in ops:
        member = f"member-{member_no:03d}" * (1 + member_no % 3)
        index, model = indexes[which], models[which]
        if op == "set":
            assert index.set(member, value, seq=None) == model.set(member, value)
        elif op == "incr":
            assert index.incr(member, value) == model.incr(member, value)
        elif op == "remove":
            assert index.remove(member) == model.remove(member)
        elif op == "clear":
            index.clear()
            model.clear()
        else:  # a period retired, a new one opened
            indexes[which] = pages.RankIndex("desc", tie_break, names=names, page_size=4)
            models[which] = ModelIndex("desc", tie_break)
            gc.collect()
        for other in indexes:
            other._check()
    held = set()
    for index, model in zip(indexes, models, strict=True):
        assert_index_matches(index, model)
        held.update(m for _, m, _ in index.range_by_rank())
    assert records(names) >= len(held)


def test_a_board_shares_one_arena_across_windows_and_restarts(pages, tmp_path):
    from rankd.engine.board import Board
    from rankd.engine.config import BoardConfig
    from rankd.index import kinds

    kinds.use("pages")
    config = BoardConfig.from_dict({"windows": ["all", "daily", "weekly", "monthly"]})
    board = Board("b", config)
    assert isinstance(board.names, pages.Names)
    periods = {"all": "all", "daily": "2026-12-01", "weekly": "2026-W49",
               "monthly": "2026-12"}
    for window, period in periods.items():
        index = board.index_for_write(window, period)
        for i in range(500):
            index.set(f"player:{i:012d}", i)
    assert records(board.names) == 500
    again = Board("b", config)
    for window, period in periods.items():
        again.load_index(window, period, kinds.current(), board.index(window, period).dump())
    assert again.names is not board.names and records(again.names) == 500
    dump = board.index("daily", "2026-12-01").dump()
    again.load_index("daily", "2026-11-30", kinds.current(), iter([dump]), len(dump),
                     chunks=True)
    assert records(again.names) == 500


def test_a_retired_index_whose_members_stay_listed_starts_no_sweep(pages):
    # The estimate of what a retired index leaves dead is sampled: a
    # period whose members all stay on `all` does not start a compaction
    # (a sweep of the whole arena that would drop nothing), one whose
    # members were its own does.
    names = pages.Names()
    all_time = pages.RankIndex("desc", "first", names=names)
    members = [f"player:{i:012d}" for i in range(40_000)]
    for day in range(6):
        daily = pages.RankIndex("desc", "first", names=names)
        for i, member in enumerate(members[day * 5000:day * 5000 + 20_000]):
            all_time.set(member, i)
            daily.set(member, i)
        del daily
        gc.collect()
        assert not names._state()[3], f"day {day}: a sweep for nothing"
    assert records(names) == len(all_time) == 40_000
    guests = pages.RankIndex("desc", "first", names=names)
    for i in range(20_000):
        guests.set(f"guest:{i:013d}", i)
    del guests
    gc.collect()
    assert names._state()[3], "the guests' records are dead: a sweep is due"
    settle([all_time])
    assert records(names) == 40_000
