"""Property tests: random operation sequences against the brute-force model.

A hypothesis state machine drives each implementation (both board orders,
both tie-breaks, and, for the native skip list, tiny tuning knobs that force
very flat or very tall lists) with random writes: ``set`` under every
condition, ``incr``, ``remove``, ``clear``, ``apply_batch``, explicit arrival
sequences, invalid input and dump/load.  After every write it compares every
read with the model in ``index_model.py`` and runs ``_check()``.

Members come from a small alphabet and scores from a few small numbers, so
ties, re-adds and no-op writes are frequent.
"""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from index_model import ModelIndex, assert_index_matches, assert_same_dump
from rankd.index import MAX_SEQ, ORDERS, TIE_BREAKS, Op, When

STATEFUL_SETTINGS = settings(max_examples=75, stateful_step_count=50, deadline=None)
PROPERTY_SETTINGS = settings(max_examples=200, deadline=None)

MEMBERS = ["a", "b", "c", "d", "ab", "é", "😀"]
members = st.sampled_from(MEMBERS)
bad_members = st.sampled_from(["", "\ud800", "x" * 257, 7, None, b"a"])
scores = st.one_of(
    st.integers(-3, 3),
    st.sampled_from([0.5, -1.5, 2.0, -0.0, 3.25]),
)
huge_scores = st.sampled_from([1.7e308, -1.7e308, 1e308])
bad_scores = st.sampled_from([math.nan, math.inf, -math.inf, True, "1", None, 2**53 + 1])
seqs = st.one_of(st.none(), st.none(), st.integers(0, 12))
bad_seqs = st.sampled_from([-1, MAX_SEQ + 1, "3", 1.0])
whens = st.sampled_from(list(When))

KNOBS = st.one_of(
    st.just({}),
    st.fixed_dictionaries(
        {
            "max_level": st.sampled_from([1, 2, 3, 32]),
            "branching": st.sampled_from([2, 3, 64]),
            "seed": st.integers(0, 2**32),
        }
    ),
)


def outcome(call):
    try:
        return call()
    except (TypeError, ValueError) as exc:
        return exc


def assert_same_outcome(got, want, context=None):
    if isinstance(want, Exception):
        assert isinstance(got, Exception), (context, got, want)
        assert type(got) is type(want), (context, got, want)
    else:
        assert got == want, context


def operations(valid_only=False):
    """One apply_batch operation, sometimes with an explicit seq."""
    value = scores if valid_only else st.one_of(scores, scores, scores, huge_scores, bad_scores)
    member = members if valid_only else st.one_of(members, members, members, bad_members)
    three = st.tuples(st.sampled_from(list(Op)), member, value)
    four = st.tuples(st.sampled_from(list(Op)), member, value, seqs)
    return st.one_of(three, four)


def assert_reads_match(index, model, data):
    """Compare every read, with parameters drawn at random, with the model.

    The parameters come from one drawn seed: drawing each through hypothesis
    costs more than the reads themselves, and a failure still reproduces.
    """
    rng = random.Random(data.draw(st.integers(0, 2**32 - 1), label="read seed"))
    n = len(model)

    def maybe_none(stop):
        return None if rng.random() < 0.3 else rng.randint(0, stop)

    offset, limit, reverse = rng.randint(0, n + 2), maybe_none(n + 2), rng.random() < 0.5
    assert index.range_by_rank(offset, limit, reverse=reverse) == model.range_by_rank(
        offset, limit, reverse=reverse
    ), (offset, limit, reverse)

    candidates = [*model.scores.values(), -math.inf, math.inf, 0.25, -2.5, *range(-4, 5)]
    for _ in range(2):
        low, high = rng.choice(candidates), rng.choice(candidates)
        exclusive = {
            "low_exclusive": rng.random() < 0.5,
            "high_exclusive": rng.random() < 0.5,
        }
        window = {
            "offset": rng.randint(0, n + 1) if rng.random() < 0.5 else 0,
            "limit": maybe_none(n + 1),
            "reverse": rng.random() < 0.5,
        }
        context = (low, high, exclusive, window)
        assert index.range_by_score(low, high, **exclusive, **window) == model.range_by_score(
            low, high, **exclusive, **window
        ), context
        assert index.count(low, high, **exclusive) == model.count(low, high, **exclusive), context

    member, above, below = rng.choice(MEMBERS), rng.randint(0, 3), rng.randint(0, 3)
    assert index.around(member, above, below) == model.around(member, above, below)
    rank = rng.randint(1, n + 2)
    assert index.member_at(rank) == model.member_at(rank)
    batch = rng.choices(MEMBERS, k=rng.randint(0, 4))
    assert index.ranks(batch) == model.ranks(batch)


class IndexMachine(RuleBasedStateMachine):
    """Drives one implementation and the model side by side."""

    index_cls: type = None
    order = "desc"
    tie_break = "first"

    @initialize(knobs=KNOBS)
    def create(self, knobs):
        self.index = self.index_cls(self.order, self.tie_break, **knobs)
        self.model = ModelIndex(self.order, self.tie_break)
        self.model.next_seq = self.index.next_seq

    def write(self, name, *args):
        want = outcome(lambda: getattr(self.model, name)(*args))
        before = self.index.dump()
        got = outcome(lambda: getattr(self.index, name)(*args))
        assert_same_outcome(got, want, (name, args))
        if isinstance(want, Exception):
            assert self.index.dump() == before, "a rejected write changed the index"

    @rule(member=members, score=scores, when=whens, seq=seqs, data=st.data())
    def set_score(self, member, score, when, seq, data):
        self.write("set", member, score, when, seq)
        assert_reads_match(self.index, self.model, data)

    @rule(member=members, delta=st.one_of(scores, huge_scores), seq=seqs, data=st.data())
    def incr_score(self, member, delta, seq, data):
        self.write("incr", member, delta, seq)
        assert_reads_match(self.index, self.model, data)

    @rule(member=members, data=st.data())
    def remove_member(self, member, data):
        self.write("remove", member)
        assert_reads_match(self.index, self.model, data)

    @precondition(lambda self: len(self.model) >= 4)
    @rule(data=st.data())
    def clear_all(self, data):
        self.index.clear()
        self.model.clear()
        assert_reads_match(self.index, self.model, data)

    @rule(ops=st.lists(operations(), max_size=8), data=st.data())
    def batch(self, ops, data):
        before = self.index.dump()
        results = self.index.apply_batch(ops)
        expected = self.model.apply_batch(ops)
        assert len(results) == len(ops)
        for op, got, want in zip(ops, results, expected, strict=True):
            assert_same_outcome(got, want, op)
        if all(isinstance(r, Exception) for r in expected):
            assert self.index.dump() == before
        assert_reads_match(self.index, self.model, data)

    @rule(
        states=st.lists(st.tuples(members, scores, st.integers(0, 12)), max_size=8),
        data=st.data(),
    )
    def set_states(self, states, data):
        self.write("set_states", states)
        assert_reads_match(self.index, self.model, data)

    @rule(
        call=st.one_of(
            st.tuples(st.just("set"), bad_members, scores, whens, seqs),
            st.tuples(st.just("set"), members, bad_scores, whens, seqs),
            st.tuples(st.just("set"), members, scores, whens, bad_seqs),
            st.tuples(st.just("incr"), bad_members, scores),
            st.tuples(st.just("incr"), members, bad_scores),
            st.tuples(st.just("incr"), members, scores, bad_seqs),
            st.tuples(st.just("remove"), bad_members),
            st.tuples(st.just("set_states"), st.lists(
                st.one_of(st.tuples(bad_members, scores, st.integers(0, 12)),
                          st.tuples(members, bad_scores, st.integers(0, 12)),
                          st.tuples(members, scores, bad_seqs),
                          st.just(("a", 1)), st.just(["a", 1, 2])),
                min_size=1, max_size=2).map(lambda bad: [("a", 1, 3), *bad])),
        )
    )
    def invalid_write(self, call):
        name, *args = call
        self.write(name, *args)

    @rule()
    def reload(self):
        data = self.index.dump()
        self.index = self.index_cls.load(data)
        assert self.index.dump() == data
        self.model.reset_peaks()  # a loaded index counts from what it holds

    @rule(length=st.integers(0, 12))
    def peaks_and_zeros(self, length):
        """reach, reset_peaks and positive_zeros (what a Redis board's
        encoding and restart use) agree with the model."""
        self.index.reach(length)
        self.model.reach(length)
        assert self.index.peaks == self.model.peaks
        if length % 3 == 0:
            self.index.reset_peaks()
            self.model.reset_peaks()
        if length % 2 == 0:
            assert self.index.positive_zeros() == self.model.positive_zeros()

    @invariant()
    def matches_model(self):
        assert_index_matches(self.index, self.model, MEMBERS)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("tie_break", TIE_BREAKS)
def test_random_operations_match_the_model(index_cls, order, tie_break):
    machine = type(
        f"IndexMachine_{order}_{tie_break}",
        (IndexMachine,),
        {"index_cls": index_cls, "order": order, "tie_break": tie_break},
    )
    run_state_machine_as_test(machine, settings=STATEFUL_SETTINGS)


def relaying(native_cls: type, moves: int) -> type:
    """The native index with a relayout and a doubling of the member table
    under way nearly always: a relayout begins from two members on, every
    doubling moves a few slots a write, and both move ``moves`` nodes or
    slots a write, so writes of every kind meet them half done
    (``RankIndex._relayout_begin``, ``RankIndex._table_begin``)."""

    class Relaying:
        def __new__(cls, *args, **kwargs):
            return cls.knobs(native_cls(*args, **kwargs))

        @classmethod
        def load(cls, data):
            return cls.knobs(native_cls.load(data))

        @staticmethod
        def knobs(index):
            index._growth_knobs(2, moves, 0, moves)
            return index

    return Relaying


@pytest.mark.parametrize("moves", [1, 2])
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("tie_break", TIE_BREAKS)
def test_random_operations_match_the_model_while_relayouts_run(
    native_cls, order, tie_break, moves
):
    machine = type(
        f"RelayingMachine_{order}_{tie_break}_{moves}",
        (IndexMachine,),
        {"index_cls": relaying(native_cls, moves), "order": order, "tie_break": tie_break},
    )
    run_state_machine_as_test(machine, settings=STATEFUL_SETTINGS)


# --- snapshots --------------------------------------------------------------------------


@PROPERTY_SETTINGS
@given(
    order=st.sampled_from(ORDERS),
    tie_break=st.sampled_from(TIE_BREAKS),
    ops=st.lists(operations(valid_only=True), max_size=40),
    more=st.lists(operations(valid_only=True), max_size=10),
)
def test_dump_load_round_trip(index_cls, order, tie_break, ops, more):
    index = index_cls(order, tie_break)
    index.apply_batch(ops)
    data = index.dump()
    loaded = index_cls.load(data)
    loaded._check()
    assert loaded.dump() == data
    assert (loaded.order, loaded.tie_break, loaded.next_seq) == (order, tie_break, index.next_seq)
    assert list(loaded) == list(index)
    # The copy behaves exactly like the original from here on.
    assert loaded.apply_batch(more) == index.apply_batch(more)
    loaded._check()
    assert loaded.dump() == index.dump()


@PROPERTY_SETTINGS
@given(
    order=st.sampled_from(ORDERS),
    tie_break=st.sampled_from(TIE_BREAKS),
    ops=st.lists(
        st.tuples(
            st.sampled_from(list(Op)), members, st.one_of(scores, huge_scores), st.integers(0, 30)
        ),
        max_size=40,
    ),
    unsequenced=st.lists(operations(), max_size=10),
)
def test_dumps_are_identical_across_implementations(
    python_cls, native_cls, order, tie_break, ops, unsequenced
):
    py = python_cls(order, tie_break)
    nat = native_cls(order, tie_break, max_level=3, branching=2, seed=1)
    model = ModelIndex(order, tie_break)
    model.next_seq = py.next_seq
    for op_list in (ops, unsequenced):
        want = model.apply_batch(op_list)
        for got in (py.apply_batch(op_list), nat.apply_batch(op_list)):
            for op, g, w in zip(op_list, got, want, strict=True):
                assert_same_outcome(g, w, op)
        assert py.dump() == nat.dump() == model.dump()
    py._check()
    nat._check()
    # Each loads the other's snapshot into an identical index.
    assert native_cls.load(py.dump()).dump() == python_cls.load(nat.dump()).dump() == py.dump()


# --- set_states: large batches re-thread the whole list ------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    order=st.sampled_from(ORDERS),
    tie_break=st.sampled_from(TIE_BREAKS),
    knobs=KNOBS,
    seed=st.integers(0, 2**32),
    members=st.integers(0, 2500),
    batch=st.sampled_from([1, 500, 1024, 1500, 4000]),
    distinct_scores=st.sampled_from([3, 50, 10_000]),
)
def test_set_states_matches_the_model_at_any_batch_size(
    index_cls, order, tie_break, knobs, seed, members, batch, distinct_scores
):
    # A batch of at least 1024 states and an eighth of the index is applied
    # by re-threading every link (native); smaller ones search per state.
    # Both must give exactly the model's state: members added, moved up and
    # down, repeated within a batch (the last wins), unchanged scores with a
    # new seq, and ties.
    rng = random.Random(seed)
    index = index_cls(order, tie_break, **knobs)
    model = ModelIndex(order, tie_break)
    universe = [f"m{i}" for i in range(members * 2 + 10)]
    seq = 0
    for name in rng.sample(universe, members):
        seq += 1
        score = rng.randrange(distinct_scores)
        index.set(name, score, seq=seq)
        model.set(name, score, seq=seq)
    states = []
    for _ in range(batch):
        seq += rng.choice([1, 1, 1, 0, -3])  # mostly rising, some repeated or older
        seq = max(seq, 0)
        states.append((rng.choice(universe), rng.randrange(distinct_scores), seq))
    index.set_states(states)
    model.set_states(states)
    # The dump pins order, scores and every seq; _check the spans and links
    # (the model sorts on every read, so per-member reads are sampled).
    index._check()
    assert_same_dump(index.dump(), model.dump())
    ranked = model.ranked()
    for name in rng.sample(universe, 10):
        assert index.rank(name) == (ranked.index(name) + 1 if name in model else None)
        assert index.dense_rank(name) == model.dense_rank(name)
    # Still a working index afterwards.
    ops = [(Op.INCR, name, 1) for name in universe[:50]]
    assert index.apply_batch(ops) == model.apply_batch(ops)
    index._check()
    assert_same_dump(index.dump(), model.dump())


def test_invalid_set_states_change_nothing(index_cls):
    index = index_cls()
    index.set_states([(f"m{i}", i % 5, i) for i in range(2000)])
    before = index.dump()
    good = [(f"n{i}", i, 5000 + i) for i in range(1500)]
    for bad, error in [
        (("", 1, 1), ValueError), (("x", math.nan, 1), ValueError), (("x", 1, -1), ValueError),
        (("x", 1), TypeError), (["x", 1, 1], TypeError), (("x", "1", 1), TypeError),
        ((7, 1, 1), TypeError), (("x" * 257, 1, 1), ValueError),
        (("x", 1, MAX_SEQ + 1), ValueError),
    ]:
        with pytest.raises(error):
            index.set_states([*good, bad])
        assert index.dump() == before, bad
    index.set_states([])
    assert index.dump() == before
