"""A window whose paged index has no room left refuses a submission whole.

A paged index numbers its pages in 22 bits (over 134M members): a write
that needs a page past that is refused by the index with OverflowError.
The engine asks every window a submission changes first (``full``), so
that the refusal is a clear ``conflict`` that changes no window and logs
nothing, and the engine goes on taking other writes (an error from the
middle of a submission would have left the windows before it changed and
stopped every write: an internal error makes the engine read-only).
The page limit is lowered with the index's test hook rather than reached.
"""

from __future__ import annotations

import pytest

from conftest import native
from engine_helpers import FakeClock, run, sub, with_engine
from rankd.engine.engine import Engine
from rankd.engine.errors import BoardFull, Conflict

WINDOWS = ["all", "daily", "weekly"]


def fill(index) -> None:
    """Let ``index`` number no page beyond those in use."""
    pages = index._pages()
    for limit in range(len(pages), len(pages) + 10_000):
        try:
            index._limit_pages(limit)
        except ValueError:
            continue
        if index.full:
            return
    raise AssertionError("no page limit made the index full")


@pytest.mark.parametrize("full_window", WINDOWS)
@pytest.mark.parametrize("batch", [False, True], ids=["submit", "submit_many"])
def test_a_window_with_no_room_refuses_the_submission_in_every_window(tmp_path, full_window,
                                                                       batch):
    pages = native("rankd._pages", "RankIndex")
    clock = FakeClock()

    async def body(engine: Engine):
        await engine.put_board("b", {"policy": "sum", "windows": WINDOWS})
        await engine.put_board("other", {})
        await engine.submit_many([sub("b", f"m{i:04d}", delta=i + 1) for i in range(400)])
        board = engine._state.boards["b"]
        indexes = {w: next(iter(board.periods[w].values())) for w in WINDOWS}
        if not all(type(index) is pages for index in indexes.values()):
            pytest.skip("the engine runs on another index kind (RANKD_INDEX)")
        fill(indexes[full_window])
        before = engine.digest("b")
        refusals = []
        for attempt in [sub("b", "newcomer", delta=5), sub("b", "m0007", delta=3),
                        sub("b", "m0100", delta=2, event_id="e-1")]:
            if batch:
                [answer] = await engine.submit_many([attempt])
                refusals.append(answer)
            else:
                with pytest.raises(BoardFull) as refused:
                    await engine.submit(attempt)
                refusals.append(refused.value)
        after = engine.digest("b")
        # A write that changes nothing needs no room; other boards go on.
        unchanged = await engine.submit(sub("b", "m0007", delta=0))
        elsewhere = await engine.submit(sub("other", "newcomer", score=1))
        return before, after, refusals, unchanged, elsewhere

    before, after, refusals, unchanged, elsewhere = run(
        with_engine(tmp_path / "data", clock, body))
    for refusal in refusals:
        assert isinstance(refusal, BoardFull) and isinstance(refusal, Conflict)
        assert refusal.code == "conflict"
        assert f"window {full_window!r}" in refusal.message
    assert before == after
    assert unchanged["changed"] is False and unchanged["score"] == 8.0
    assert elsewhere["changed"] is True

    # Nothing of the refused submissions was logged: a restart reads the
    # same board, and the retried event id is new to it.
    async def reopened(engine: Engine):
        digest = engine.digest("b")
        retried = await engine.submit(sub("b", "m0100", delta=2, event_id="e-1"))
        return digest, retried

    digest, retried = run(with_engine(tmp_path / "data", clock, reopened))
    assert digest == before
    assert retried["duplicate"] is False and retried["score"] == 103.0


def test_indexes_say_whether_they_have_room():
    pages = native("rankd._pages", "RankIndex")
    index = pages("desc", "first", page_size=4)
    for i in range(40):
        index.set(f"m{i}", float(i))
    assert index.full is False
    fill(index)
    assert index.full is True
    with pytest.raises(OverflowError):
        for i in range(40, 200):  # some new member needs a page
            index.set(f"m{i}", float(i))
    skiplist = native("rankd._skiplist", "RankIndex")("desc", "first")
    skiplist.set("a", 1.0)
    assert skiplist.full is False
    from rankd.index._fallback import RankIndex as Fallback
    assert Fallback("desc", "first").full is False
