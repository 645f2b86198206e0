"""Attacks on the submit coalescer's bounded flushes (split lists) together
with the per-board snapshot hold, through a real engine."""

from __future__ import annotations

import asyncio

import pytest

from engine_helpers import FakeClock, run, sub, with_engine
from rankd.engine.coalescer import MAX_COALESCED
from rankd.engine.engine import Engine


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def _release_after(engine: Engine, board: str, hops: int) -> None:
    """Release ``board``'s hold ``hops`` callbacks of the loop from now."""
    loop = asyncio.get_running_loop()

    def step(left: int) -> None:
        if left:
            loop.call_soon(step, left - 1)
        else:
            engine._release(engine.boards[board])
    loop.call_soon(step, hops)


async def _ann_set_to_1_while_x_is_held(engine: Engine) -> asyncio.Future:
    """Board x (ann at 0), held; ann set to 1 through the general path,
    waiting for the hold (given time to get there)."""
    await engine.put_board("x", {"policy": "latest"})
    await engine.submit(sub("x", "ann", score=0))
    engine._hold(engine.boards["x"])
    waiting = asyncio.ensure_future(engine.submit_many([sub("x", "ann", score=1)]))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not waiting.done()
    return waiting


@pytest.mark.parametrize("hops", range(8))
def test_a_split_list_writes_a_held_member_in_its_own_order(tmp_path, clock, hops):
    """One caller's list, longer than a flush: its first part sets x/ann
    to 1 on a board held by a snapshot, its second part (a pass later) sets
    her to 2.  Whenever the hold is released, the list's order must stand:
    ann ends at 2, as a replay of the log would have her."""
    async def body(engine: Engine):
        await engine.put_board("x", {"policy": "latest"})
        await engine.put_board("y", {"policy": "latest"})
        await engine.submit(sub("x", "ann", score=0))
        engine._hold(engine.boards["x"])
        filler = [sub("y", f"m{i}", score=i) for i in range(MAX_COALESCED + 10)]
        submissions = [sub("x", "ann", score=1), *filler, sub("x", "ann", score=2)]
        batch = asyncio.ensure_future(engine.submit_many(submissions))
        _release_after(engine, "x", hops)
        answers = await asyncio.wait_for(batch, 10)
        assert answers[0]["score"] == 1.0 and answers[-1]["score"] == 2.0
        assert engine.standing("x", "ann")["score"] == 2.0

    run(with_engine(tmp_path / "data", clock, body))


@pytest.mark.parametrize("hops", range(4))
def test_a_later_caller_does_not_overtake_an_earlier_one_on_a_released_board(
        tmp_path, clock, hops):
    """Caller A sets x/ann to 1 while x is held; caller B sets her to 2
    after A was answered nothing yet; the hold is released around B's
    flush.  B called later, so ann must end at 2."""
    async def body(engine: Engine):
        first = await _ann_set_to_1_while_x_is_held(engine)
        second = asyncio.ensure_future(engine.submit_many([sub("x", "ann", score=2)]))
        _release_after(engine, "x", hops)
        await asyncio.wait_for(asyncio.gather(first, second), 10)
        assert engine.standing("x", "ann")["score"] == 2.0

    run(with_engine(tmp_path / "data", clock, body))


def test_a_list_that_fits_one_flush_gets_read_only_raised_even_when_split(tmp_path, clock):
    """Two concurrent callers of 600 submissions each on a read-only engine:
    each list fits one flush, so each gets ``ReadOnly`` raised (as one
    caller alone does), not a list of answers that all say read-only (the
    second list is split 400 + 200 only because it shared a flush)."""
    async def body(engine: Engine):
        await engine.put_board("y", {"policy": "latest"})
        engine.failure = OSError("simulated disk failure")
        calls = [[sub("y", f"{who}{i}", score=i) for i in range(600)] for who in "ab"]
        answers = await asyncio.gather(*(engine.submit_many(c) for c in calls),
                                       return_exceptions=True)
        assert [type(a).__name__ for a in answers] == ["ReadOnly", "ReadOnly"]

    run(with_engine(tmp_path / "data", clock, body))


def test_a_bug_in_a_later_part_does_not_fail_a_call_whose_first_part_is_applied(
        tmp_path, clock, monkeypatch):
    """A list of 1,500 deltas goes in two parts; the second part's batch hits
    a bug (an exception that is not an ``EngineError``).  The first 1,000
    are applied and logged by then, so the caller must not be told that
    its call failed (a retry would count them twice): it gets their answers,
    and an error for each submission of the failed part."""
    import rankd.engine.submits as submits

    real = submits.ingest
    calls = []

    def buggy(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # (1: the first part)
            raise RuntimeError("a bug in ingest")
        return real(*args, **kwargs)

    async def body(engine: Engine):
        await engine.put_board("y", {"policy": "sum"})
        monkeypatch.setattr(submits, "ingest", buggy)
        submissions = [sub("y", f"m{i}", delta=1) for i in range(MAX_COALESCED + 500)]
        try:
            answers = await engine.submit_many(submissions)
        except RuntimeError:
            applied = sum(engine.standing("y", f"m{i}") is not None
                          for i in range(len(submissions)))
            pytest.fail(f"the call raised, with {applied} of its submissions applied")
        assert all(a["score"] == 1.0 for a in answers[:MAX_COALESCED])
        assert all(isinstance(a, Exception) for a in answers[MAX_COALESCED:])

    run(with_engine(tmp_path / "data", clock, body))


def test_a_packed_run_does_not_overtake_general_submissions_waiting_for_a_released_board(
        tmp_path, clock):
    """A general-path submission sets x/ann to 1 while x is held; the hold
    is released, and in the same callback a native packed run sets her to
    2 (it joins a pass already scheduled by another run).  The packed run
    came later, so ann must end at 2."""
    from conftest import native
    from test_fast_submits import packed_run

    native("rankd.engine._ingest", "ingest_packed")

    async def body(engine: Engine):
        waiting = await _ann_set_to_1_while_x_is_held(engine)
        await engine.put_board("y", {"policy": "latest"})
        passed = engine.submit_packed_nowait(packed_run(("y", "bob", 1.0)))  # the pass
        engine._release(engine.boards["x"])
        later = engine.submit_packed_nowait(packed_run(("x", "ann", 2.0)))
        await asyncio.wait_for(asyncio.gather(waiting, passed, later), 10)
        assert engine.standing("x", "ann")["score"] == 2.0

    run(with_engine(tmp_path / "data", clock, body))
