"""The packed path's intake (rankd.engine.intake): which runs it takes and
where it sends them, for the native intake and its pure-Python twin alike.

The engine's own tests (test_fast_submits) drive the native intake through
real passes; here both implementations meet the same cases, and a
differential property test holds them to the same answers on random
sequences of boards, holds and runs.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import native
from engine_helpers import engine_config
from rankd.engine.board import Board
from rankd.engine.config import BoardConfig
from rankd.engine.engine import Engine
from rankd.engine.intake import PythonIntake
from test_fast_submits import packed_run


def native_intake() -> type:
    return native("rankd.engine._intake", "Intake")


IMPLEMENTATIONS = [pytest.param(native_intake, id="native"),
                   pytest.param(lambda: PythonIntake, id="python")]


class Owner:
    """The engine's side of the intake: what it answers for a cluster node's
    runs, and what it was handed."""

    def __init__(self, replicated_answer: bool = True) -> None:
        self.replicated_answer = replicated_answer
        self.asked: list[Any] = []
        self.passes = 0
        self.later: list[tuple[Any, Any]] = []

    def takes_replicated(self, packed: Any) -> bool:
        self.asked.append(packed)
        return self.replicated_answer

    def run_pass(self) -> None:
        self.passes += 1

    def take_later(self, packed: Any, then: Any, token: Any) -> None:
        self.later.append((packed, token))


def make(implementation: Any, owner: Owner, held: set[str] | None = None) -> Any:
    intake = implementation()(owner, set() if held is None else held, owner.run_pass,
                              owner.take_later)
    intake.boards = {}
    return intake


def board(name: str, *, signed: bool = False) -> Board:
    return Board(name, BoardConfig.from_dict({"policy": "latest", "signed": signed}))


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_takes_refuses_signed_boards_and_missing_ones_when_asked(implementation):
    intake = make(implementation, Owner())
    one = packed_run(("a", "ann", 1.0))
    assert intake.takes(one)  # a board the run would create
    assert not intake.takes(one, True)  # ... unless it must exist
    intake.boards["a"] = board("a")
    assert intake.takes(one, True)
    assert intake.takes(one, existing=True)  # (the keyword, as the general paths pass it)
    # The board last taken is checked again every time: changed, then gone.
    intake.boards["a"] = board("a", signed=True)
    assert not intake.takes(one) and not intake.takes(one, True)
    del intake.boards["a"]
    assert not intake.takes(one, True) and intake.takes(one)
    # A run over several boards is refused if any one of them is signed.
    intake.boards.update(b=board("b"), s=board("s", signed=True))
    assert intake.takes(packed_run(("a", "x", 1.0), ("b", "y", 2.0)))
    assert not intake.takes(packed_run(("b", "x", 1.0), ("s", "y", 2.0)))
    assert not intake.takes(packed_run(("b", "x", 1.0), ("a", "y", 2.0)), True)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_a_cluster_node_asks_its_engine(implementation):
    owner = Owner(replicated_answer=False)
    intake = make(implementation, owner)
    intake.boards["a"] = board("a")
    one = packed_run(("a", "ann", 1.0))
    assert intake.takes(one) and owner.asked == []  # a single node never asks
    intake.replicated = True
    assert not intake.takes(one) and owner.asked == [one]
    owner.replicated_answer = True
    assert intake.takes(one)
    intake.boards["a"] = board("a", signed=True)  # refused before the engine is asked
    assert not intake.takes(one) and len(owner.asked) == 2


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_runs_join_the_pass_unless_something_is_ahead_of_them(implementation):
    async def body() -> None:
        owner = Owner()
        held: set[str] = set()
        intake = make(implementation, owner, held)
        one, two = packed_run(("a", "ann", 1.0)), packed_run(("b", "bob", 2.0))
        intake.submit_then(one, print, "one")
        intake.submit_then(two, print, "two")
        assert intake.scheduled and owner.passes == 0  # not run from within the call
        await asyncio.sleep(0)
        assert owner.passes == 1  # one pass for both
        runs, thens = intake.take_pass()
        assert runs == [one, two] and thens == [print, "one", print, "two"]
        assert (intake.runs, intake.thens, intake.scheduled) == ([], [], False)

        held.add("a")  # the engine's own set: a snapshot holds board a
        intake.submit_then(one, print, "held")
        intake.submit_then(two, print, "free")
        intake.unpacked = 1  # a run went the general way: the next follow it
        intake.submit_then(two, print, "behind")
        intake.unpacked = 0
        intake.replicated = True
        intake.submit_then(two, print, "cluster")
        assert owner.later == [(one, "held"), (two, "behind"), (two, "cluster")]
        assert intake.runs == [two] and intake.thens == [print, "free"]

    asyncio.run(body())


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_tell_tells_every_caller_even_after_one_fails(implementation, caplog):
    told: list[tuple[str, Any]] = []

    def then(token: str, error: BaseException | None) -> None:
        told.append((token, error))
        if token == "bad":
            raise RuntimeError("a front-end's bug")

    error = OSError("disk")
    with caplog.at_level(logging.ERROR, logger="rankd.engine"):
        implementation().tell([then, "one", then, "bad", then, "two"], error)
    assert told == [("one", error), ("bad", error), ("two", error)]
    assert "a packed run's completion failed" in caplog.text


def test_an_engines_intake_sees_its_boards_and_its_replication(tmp_path):
    """The engine keeps its intake's view current: boards it creates, the
    whole dict when it replaces it (a rollback after a storage failure, a
    cluster node setting its state aside), and whether it is a cluster
    node.  A stale view would send every run the general way, or take runs
    the packed path must not."""
    native_intake()

    async def body() -> None:
        engine = await Engine.open(engine_config(tmp_path))
        try:
            run = packed_run(("a", "ann", 1.0))
            assert not engine.intake.takes(run, True)
            await engine.put_board("a", {"policy": "latest"})
            assert engine.intake.takes(run, True)
            engine.boards = {}
            assert not engine.intake.takes(run, True)
            assert not engine.intake.replicated
            engine.replication = object()
            assert engine.intake.replicated
        finally:
            engine.replication = None
            await engine.close(snapshot=False)

    asyncio.run(body())


# --- both implementations alike ----------------------------------------------------------

NAMES = ["a", "b", "c"]
states = st.sampled_from(["absent", "plain", "signed"])
runs = st.lists(st.sampled_from(NAMES), min_size=1, max_size=4)
steps = st.lists(st.one_of(
    st.tuples(st.just("board"), st.sampled_from(NAMES), states),
    st.tuples(st.just("hold"), st.sampled_from(NAMES), st.booleans()),
    st.tuples(st.just("unpacked"), st.integers(0, 2)),
    st.tuples(st.just("replicated"), st.booleans()),
    st.tuples(st.just("takes"), runs, st.booleans()),
    st.tuples(st.just("submit"), runs),
    st.tuples(st.just("pass"),),
), max_size=40)


def outcomes(implementation: type, sequence: list[tuple[Any, ...]]) -> list[Any]:
    """What an intake answers to ``sequence``, step by step."""
    owner = Owner(replicated_answer=False)
    held: set[str] = set()
    intake = implementation(owner, held, owner.run_pass, owner.take_later)
    intake.boards = {}
    seen: list[Any] = []
    for number, step in enumerate(sequence):
        match step:
            case ("board", name, "absent"):
                intake.boards.pop(name, None)
            case ("board", name, state):
                intake.boards[name] = board(name, signed=state == "signed")
            case ("hold", name, on):
                (held.add if on else held.discard)(name)
            case ("unpacked", count):
                intake.unpacked = count
            case ("replicated", on):
                intake.replicated = on
            case ("takes", names, existing):
                seen.append(intake.takes(packed_run(*((n, "m", 1.0) for n in names)), existing))
            case ("submit", names):
                run = packed_run(*((n, "m", 1.0) for n in names))
                before = len(owner.later)
                intake.submit_then(run, print, number)
                seen.append(("later" if len(owner.later) > before else "pass", number))
            case ("pass",):
                taken, thens = intake.take_pass()
                seen.append((len(taken), thens[1::2]))
    seen.append(len(owner.asked))
    return seen


@settings(max_examples=300, deadline=None)
@given(steps)
def test_the_native_intake_answers_as_the_python_one(sequence):
    native_class = native_intake()

    async def both() -> tuple[list[Any], list[Any]]:
        return outcomes(native_class, sequence), outcomes(PythonIntake, sequence)

    native_seen, python_seen = asyncio.run(both())
    assert native_seen == python_seen


class CountingEngine(Engine):
    """An engine that counts the passes its own ``_run_pass`` commits."""

    general_passes = 0

    def _run_pass(self) -> None:
        self.general_passes += 1
        super()._run_pass()


@pytest.mark.parametrize("fsync", ["everysec", "always"])
def test_the_native_intake_commits_a_single_nodes_common_pass(tmp_path, fsync):
    """With a log that hands records to the OS at once, a pass of packed
    runs is committed by the native intake (the engine's pass is not run)
    and ends as the engine's would: the runs applied, counted, written and
    announced, each caller told in order; with ``--fsync always`` the pass
    must wait for the fsync, so the engine's pass commits it."""
    native_intake()

    async def body() -> tuple[Any, ...]:
        engine = await CountingEngine.open(engine_config(tmp_path, fsync=fsync))
        try:
            await engine.put_board("a", {"policy": "latest"})
            changed: list[str] = []
            engine.listeners.append(changed.append)
            told: list[Any] = []
            before = engine.general_passes, engine.stats["applied"], engine.wal.last_lsn
            for number, member in enumerate(["ann", "bob", "ann"]):
                engine.intake.submit_then(packed_run(("a", member, float(number))),
                                          lambda token, error: told.append((token, error)),
                                          number)
            for _ in range(200):
                if len(told) == 3:
                    break
                await asyncio.sleep(0.01)
            view = engine.boards["a"].index("all", "all")
            return (engine.general_passes - before[0], told,
                    engine.stats["applied"] - before[1], engine.wal.last_lsn - before[2],
                    engine.wal.written_lsn == engine.wal.last_lsn, changed,
                    view.score("ann"), view.score("bob"))
        finally:
            await engine.close(snapshot=False)

    general, told, applied, appended, written, changed, ann, bob = asyncio.run(body())
    assert told == [(0, None), (1, None), (2, None)]
    assert (applied, appended, written, changed, ann, bob) == (3, 3, True, ["a"], 2.0, 1.0)
    assert general == (0 if fsync == "everysec" else 1)
