"""Ingest: the native kernel against the pure-Python reference.

Both take the same random boards and batches of submissions, good and bad
(duplicates, expired event ids, guards, bad types, non-ASCII text, explicit
timestamps, days rolling over so periods open mid-batch), and must give the
same answers and errors, the same WAL records byte for byte, and leave the
same indexes (compared by their dumps: order, scores and arrival
sequences), labels, dedupe tables and versions.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import native
from engine_helpers import SUNDAY, index_kind
from rankd.engine import records
from rankd.engine.board import Board
from rankd.engine.config import BoardConfig
from rankd.engine.errors import EngineError
from rankd.engine.ingest import ingest_python
from rankd.engine.submission import Submission
from rankd.index import kinds

# Native and reference boards are compared side by side: one dedupe key.
pytestmark = pytest.mark.usefixtures("same_event_id_keys")

TTL = 3600.0
TOLERANCE = 300.0
#: (Names of every kind: the kernel writes only compact ASCII ones itself.)
BOARDS = ["arena", "golf café", "скорость 🏁"]


def native_ingest():
    return native("rankd.engine._ingest", "ingest")


def new_index_class():
    """The native index class of the suites' layout (``index_kind``), made the
    process's: the native ingest writes new periods through that kind's C
    entry points, and refuses a period of another class."""
    kind = index_kind()
    kinds.use(kind)
    return native({"skiplist": "rankd._skiplist", "pages": "rankd._pages"}[kind], "RankIndex")


configs = st.builds(
    lambda order, policy, tie_break, windows, guards: {
        "order": order, "policy": policy, "tie_break": tie_break, "windows": windows, **guards},
    st.sampled_from(["desc", "asc"]), st.sampled_from(["sum", "best", "latest"]),
    st.sampled_from(["first", "member", "member_desc"]),
    st.lists(st.sampled_from(["all", "daily", "weekly", "monthly"]), min_size=1, max_size=4,
             unique=True),
    st.fixed_dictionaries({}, optional={"min_score": st.integers(-50, 0),
                                        "max_score": st.integers(0, 100),
                                        "max_delta": st.integers(1, 60)}),
)
def mostly(good: st.SearchStrategy, bad: st.SearchStrategy) -> st.SearchStrategy:
    """``good`` nineteen times in twenty, else ``bad``."""
    return st.integers(0, 19).flatmap(lambda roll: bad if roll == 0 else good)


numbers = mostly(st.one_of(st.integers(-40, 40), st.integers(-40, 40).map(float),
                           st.just(-0.0)),
                 st.sampled_from([2**53, 2**53 + 1, -(2**53) - 1, 1e308, math.inf, math.nan,
                                  True, "5", None]))
members = mostly(st.sampled_from(["ann", "bob", "cy", "dee", "eve", "fay", "x" * 256]),
                 st.sampled_from(["é", "y" * 257, "", 7]))
event_ids = mostly(st.one_of(st.none(), st.integers(0, 60).map(lambda i: f"e{i}"),
                             st.just("z" * 128)),
                   st.sampled_from(["ü", "z" * 129, "", 3]))
labels = mostly(st.one_of(st.none(), st.sampled_from(["Ann", "", "L" * 64])),
                st.sampled_from(["Zoë", "L" * 65, 9]))
timestamps = mostly(st.none(), st.sampled_from([0.0, 100.0, -1000.0, "x"]))


@st.composite
def submissions(draw, policies: dict[str, str]) -> Submission:
    """Mostly submissions a board takes (so most go the native way), with
    every kind of mistake mixed in."""
    board = draw(mostly(st.sampled_from(list(policies)), st.sampled_from(["missing", 5])))
    number = draw(numbers)
    # Latest boards take a score or an increment (Redis's ZADD and ZINCRBY).
    as_delta = policies.get(board) == "sum" or (policies.get(board) == "latest"
                                                and draw(st.booleans()))
    if draw(st.integers(0, 19)) == 0:
        as_delta = not as_delta
    other = draw(mostly(st.none(), st.just(1)))
    condition = draw(mostly(st.just(0), st.sampled_from([1, 2, 4, 8, 6, 10, 16, -1])))
    return Submission(board=board, member=draw(members),
                      score=other if as_delta else number, delta=number if as_delta else other,
                      event_id=draw(event_ids), label=draw(labels), ts=draw(timestamps),
                      condition=condition)


@st.composite
def scenarios(draw) -> tuple[list[dict[str, Any]], list[tuple[list[Submission], float]]]:
    """Board configs, then batches of submissions, each after a clock step."""
    board_configs = draw(st.lists(configs, min_size=1, max_size=3))
    policies = {name: config["policy"] for name, config in zip(BOARDS, board_configs,
                                                                strict=False)}
    batches = draw(st.lists(st.tuples(st.lists(submissions(policies), max_size=12),
                                      st.sampled_from([0.0, 1.0, 1800.0, 5000.0, 86_400.0])),
                            max_size=8))
    return board_configs, batches


def make_boards(board_configs: list[dict[str, Any]]) -> dict[str, Board]:
    boards = {}
    index_class = new_index_class()
    for name, config in zip(BOARDS, board_configs, strict=False):
        board = Board(name, BoardConfig.from_dict(config))
        board.new_index = lambda board=board: index_class(  # type: ignore[method-assign]
            board.config.order, board.config.tie_break)
        boards[name] = board
    return boards


def shown(answer: dict[str, Any] | EngineError) -> Any:
    if isinstance(answer, EngineError):
        return (type(answer).__name__, answer.message)
    return answer


def board_state(board: Board) -> dict[str, Any]:
    return {
        "indexes": {(window, period): index.dump()
                    for window, periods in board.periods.items()
                    for period, index in periods.items()},
        "labels": list(board.labels.items()),
        "event_ids": board.dedupe.packed_items(),
        "version": board.version,
        "updated_at": board.updated_at,
    }


def drive(implementation, board_configs, batches) -> list[Any]:
    boards = make_boards(board_configs)
    now = SUNDAY + 23 * 3600 + 1234.5678
    lsn = 1
    seen = []
    for batch, advance in batches:
        now += advance
        done = implementation(boards, batch, now, lsn, TTL, TOLERANCE)
        lsn += len(done.payloads)
        seen.append(([shown(a) for a in done.answers], done.payloads, sorted(done.boards),
                     done.rejected, done.duplicates))
    seen.append({name: board_state(board) for name, board in boards.items()})
    return seen


@settings(max_examples=300)
@given(scenarios())
def test_native_ingest_matches_the_reference(scenario):
    board_configs, batches = scenario
    assert drive(native_ingest(), board_configs, batches) == drive(
        ingest_python, board_configs, batches)


@given(st.lists(st.builds(
    lambda member, delta, event_id: Submission(board="arena", member=member, delta=delta,
                                               event_id=event_id),
    st.sampled_from(["ann", "bob", "cy"]), st.integers(-5, 5),
    st.one_of(st.none(), st.integers(0, 10).map(str))), max_size=40))
def test_records_the_kernel_writes_decode_to_what_it_answered(batch):
    boards = make_boards([{"policy": "sum", "windows": ["all", "weekly"]}])
    done = native_ingest()(boards, batch, SUNDAY + 3600, 1, TTL, TOLERANCE)
    # An event id sent again with another delta or member is a conflict.
    refused = [a for a in done.answers if isinstance(a, EngineError)]
    assert len(refused) == done.rejected and all(a.code == "event_conflict" for a in refused)
    fresh = [a for a in done.answers if not isinstance(a, EngineError) and not a["duplicate"]]
    assert len(fresh) == len(done.payloads)
    for answer, payload in zip(fresh, done.payloads, strict=True):
        record = records.decode(payload)
        assert record[0] == records.SUBMIT and record[1] == "arena"
        assert record[2] == answer["member"] and record[5] == answer["event_id"]
        assert list(record[10]) == [answer["score"], answer["rank"], answer["previous"],
                                    answer["changed"]]


def test_the_kernel_is_what_the_engine_uses():
    from rankd._native import pure_python_forced
    from rankd.engine import ingest

    expected = "python" if pure_python_forced() else "native"
    if expected == "native":
        native_ingest()  # skips (or fails under RANKD_REQUIRE_NATIVE) when not built
    assert expected == ingest.IMPLEMENTATION


def test_a_board_with_fallback_indexes_goes_through_the_reference():
    from rankd.index._fallback import RankIndex as PythonIndex

    board = Board("arena", BoardConfig(policy="sum"))
    board.periods["all"]["all"] = PythonIndex("desc", "first")
    batch = [Submission(board="arena", member="ann", delta=2),
             Submission(board="arena", member="ann", delta=3)]
    done = native_ingest()({"arena": board}, batch, SUNDAY, 1, TTL, TOLERANCE)
    assert [a["score"] for a in done.answers] == [2.0, 5.0]
    assert type(board.periods["all"]["all"]) is PythonIndex


@pytest.mark.parametrize("delta", [1, 2.5, -0.0])
def test_one_submission_answers_like_the_reference(delta):
    batch = [Submission(board="arena", member="ann", delta=delta, event_id="e1", label="Ann")]
    results = []
    for implementation in (native_ingest(), ingest_python):
        boards = make_boards([{"policy": "sum"}])
        done = implementation(boards, batch, SUNDAY, 7, TTL, TOLERANCE)
        results.append((done.answers, done.payloads, board_state(boards["arena"])))
    assert results[0] == results[1]
    assert results[0][0] == [{"member": "ann", "score": float(delta), "rank": 1,
                              "previous": None, "changed": True, "duplicate": False,
                              "event_id": "e1"}]
