"""Recovery's packed replay (rankd.index.packed, RankIndex.set_states_packed)
against applying the same events one by one.

The engine's live path applies each event to the index as it comes; a
restart after a crash replays the log tail into packed state runs that the
index applies in bulk (re-threading the whole list for a large batch).  A
hypothesis model drives a live engine through submissions (many to the
same members), labels, event ids, removals, board resets, period rollovers
and snapshots, then reopens the data dir as after kill -9: scores, ranks,
tie-break order, labels and remembered event ids must be what the live
engine held.  Index-level tests compare a packed run with the same states
as tuples and check that a bad run changes nothing.
"""

from __future__ import annotations

import contextlib
import math
import random
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine_helpers import FakeClock, engine_config, run, sub
from index_model import ModelIndex
from rankd.engine import settings as engine_settings
from rankd.engine.engine import Engine
from rankd.index import RankIndex
from rankd.index._fallback import RankIndex as PurePythonIndex
from rankd.index.packed import HEAD, pack_state, unpack_states

MEMBERS = ["a", "b", "c", "d", "é", "日本", "zz"]
DAY = 86_400.0

submission = st.tuples(
    st.just("submit"), st.sampled_from(MEMBERS), st.integers(-3, 3),
    st.booleans(),                      # with an event id
    st.sampled_from([None, "gold", "ß"]))  # a label
operation = st.one_of(
    submission, submission, submission,
    st.tuples(st.just("remove"), st.sampled_from(MEMBERS)),
    st.tuples(st.just("reset")),        # the board replaced, its scores discarded
    st.tuples(st.just("rollover")),     # a day passes: a new daily period
    st.tuples(st.just("snapshot")),
    st.tuples(st.just("bulk"), st.integers(0, 2**16)))  # >= 1024 states: a re-thread


def _state(engine: Engine) -> tuple:
    """What a restart must keep: every index's members in rank order with
    their scores (the digest hashes the dumps: seqs, tie order), the
    labels and the remembered event ids."""
    board = engine.boards["lb"]
    ranked = {(window, period): list(index)
              for window, periods in board.periods.items()
              for period, index in periods.items()}
    return (engine.digest(), ranked, dict(board.labels), board.dedupe.packed_items())


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow])
@given(policy=st.sampled_from(["sum", "best", "latest"]),
       order=st.sampled_from(["desc", "asc"]),
       tie_break=st.sampled_from(["first", "member", "member_desc"]),
       pending=st.sampled_from([None, 3]),
       operations=st.lists(operation, min_size=1, max_size=30))
def test_a_crash_replays_to_the_state_the_events_left_one_by_one(
        tmp_path_factory, policy, order, tie_break, pending, operations):
    data_dir = tmp_path_factory.mktemp("replay")
    clock = FakeClock()
    config = {"policy": policy, "order": order, "tie_break": tie_break,
              "windows": ["all", "daily"]}
    saved = engine_settings.REPLAY_PENDING_STATES
    if pending is not None:  # flushes in many partial runs
        engine_settings.REPLAY_PENDING_STATES = pending

    def event(member: str, value: int, number: int, with_id: bool, label: str | None):
        fields = {"delta": value} if policy == "sum" else {"score": value}
        return sub("lb", member, event_id=f"e{number}" if with_id else None, label=label,
                   **fields)

    async def scenario():
        engine = await Engine.open(engine_config(data_dir), clock=clock)
        await engine.put_board("lb", config)
        for number, op in enumerate(operations, 1):
            if op[0] == "submit":
                await engine.submit(event(op[1], op[2], number, op[3], op[4]))
            elif op[0] == "remove":
                await engine.remove_member("lb", op[1])
            elif op[0] == "reset":
                await engine.put_board("lb", config, discard=True)
            elif op[0] == "rollover":
                clock.advance(DAY)
            elif op[0] == "snapshot":
                await engine.snapshot()
            else:  # 1,200 events over 1,500 members: many touched again and again
                seed = op[1]
                await engine.submit_many([
                    event(f"m{(seed + i * 7919) % 1500}", (seed + i) % 9 - 4,
                          number * 10_000 + i, i % 3 == 0, None)
                    for i in range(1200)])
        # A start retires the periods past their retention (retiring is not
        # logged): the live engine's next pass would, as of the same clock.
        await engine.housekeeping(expire_ids=False)
        live = _state(engine)
        await engine.close(snapshot=False)  # as kill -9 leaves it: the tail in the log
        engine = await Engine.open(engine_config(data_dir), clock=clock)
        recovered = _state(engine)
        await engine.close(snapshot=False)
        return live, recovered

    # One fingerprint key for every dedupe table (a table recovered from the
    # log alone draws a new one): the two tables then compare entry for entry.
    stores = _id_stores()
    for store in stores:
        store._set_test_key(bytes(range(16)))
    try:
        live, recovered = run(scenario())
    finally:
        engine_settings.REPLAY_PENDING_STATES = saved
        for store in stores:
            store._set_test_key(None)
    assert recovered == live


def _id_stores() -> list:
    """The event-id store modules built here (the pure one, and the native one)."""
    import importlib

    from rankd.engine import idstore

    stores = [idstore]
    with contextlib.suppress(ImportError):
        stores.append(importlib.import_module("rankd.engine._idstore"))
    return stores


# --- the index -----------------------------------------------------------------------

states = st.lists(st.tuples(
    st.sampled_from(MEMBERS + [f"m{i}" for i in range(40)]),
    st.sampled_from([0.0, -0.0, 1.0, -1.5, 2.0, 1e300, -1e-300]),
    st.integers(0, 2**63 - 1)), max_size=60)


def _packed(items: list[tuple[str, float, int]]) -> bytearray:
    run = bytearray()
    for member, score, seq in items:
        pack_state(run, member, score, seq)
    return run


INDEXES = [RankIndex, PurePythonIndex]


@pytest.mark.parametrize("index_cls", INDEXES)
@settings(max_examples=60, deadline=None)
@given(base=states, items=states, order=st.sampled_from(["desc", "asc"]),
       tie_break=st.sampled_from(["first", "member", "member_desc"]),
       copies=st.sampled_from([1, 40]))
def test_a_packed_run_sets_what_the_same_tuples_set(index_cls, base, items, order,
                                                    tie_break, copies):
    # copies=40: a batch large enough to re-thread the list (1024 states and up).
    items = items * copies
    packed, tuples = (index_cls(order=order, tie_break=tie_break) for _ in range(2))
    for index in (packed, tuples):
        index.set_states(base)
    assert packed.set_states_packed(_packed(items)) == len(items)
    tuples.set_states(items)
    assert list(packed) == list(tuples)
    assert [packed.rank(m) for m in MEMBERS] == [tuples.rank(m) for m in MEMBERS]
    assert packed.next_seq == tuples.next_seq
    assert packed.dump() == tuples.dump()
    assert unpack_states(_packed(items)) == items


def _bad_runs() -> list[bytes]:
    good = bytes(_packed([("ok", 1.0, 5)]))
    return [
        good[:-1],                                        # cut inside the member
        good + good[:5],                                  # cut inside a head
        HEAD.pack(1.0, 1, 0),                             # an empty member
        HEAD.pack(1.0, 1, 257) + b"x" * 257,              # a member too long
        HEAD.pack(1.0, 1, 2) + b"\xff\xfe",               # not UTF-8
        HEAD.pack(math.inf, 1, 1) + b"x",                 # a score not finite
        HEAD.pack(math.nan, 1, 1) + b"x",
        HEAD.pack(1.0, 2**63, 1) + b"x",                  # a seq past MAX_SEQ
    ]


@pytest.mark.parametrize("index_cls", INDEXES)
@pytest.mark.parametrize("bad", _bad_runs())
def test_a_bad_packed_run_is_refused_and_changes_nothing(index_cls, bad):
    index = index_cls()
    index.set_states([(f"m{i}", float(i % 5), i) for i in range(2000)])
    before = index.dump()
    with pytest.raises(ValueError):
        index.set_states_packed(_packed([("m1", 9.0, 9000)]) + bad)  # a good entry first
    assert index.dump() == before
    assert index.set_states_packed(b"") == 0
    assert index.dump() == before


def test_the_packed_layout_is_the_documented_one():
    run = _packed([("é", -2.5, 7)])
    assert bytes(run) == struct.pack("=dQH", -2.5, 7, 2) + "é".encode()


@pytest.mark.parametrize("order", ["desc", "asc"])
@pytest.mark.parametrize("tie_break", ["first", "member", "member_desc"])
def test_a_batch_large_enough_for_the_radix_sort_orders_as_the_model(order, tie_break):
    # Over 4,096 moved nodes set_states sorts them by radix on their keys,
    # then each run of equal keys by the tie-break: keys of both signs, both
    # zeros (which rank alike), far apart and equal, against the model.
    rng = random.Random(f"{order}{tie_break}")
    scores = [0.0, -0.0, 1.0, -1.0, 2.5, -2.5, 1e300, -1e300, 5e-324, -5e-324, 7.0]
    index, model = RankIndex(order, tie_break), ModelIndex(order, tie_break)
    base = [(f"m{i}", rng.choice(scores), rng.randrange(100)) for i in range(3000)]
    index.set_states(base)
    model.set_states(base)
    states = [(f"m{rng.randrange(9000)}", rng.choice(scores) + rng.randrange(3) * 0.5,
               rng.randrange(10**6)) for _ in range(12_000)]
    assert index.set_states_packed(_packed(states)) == len(states)
    model.set_states(states)
    index._check()
    assert index.dump() == model.dump()
