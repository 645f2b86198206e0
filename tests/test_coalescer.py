"""The submit coalescer (rankd.engine.coalescer): many concurrent callers.

Callers that submit during one pass of the event loop share one call of the
batch function; a flush takes at most ``MAX_COALESCED`` submissions (a
caller's larger list split across flushes) and the rest wait a pass.  What
is proven here: every caller gets its own answers, in the order callers
called, across several flushes, no flush goes past its bound, and a part
that fails stops the rest of its caller's list.
"""

from __future__ import annotations

import asyncio

import pytest

from engine_helpers import run
from rankd.engine import coalescer as coalescer_module
from rankd.engine.coalescer import SubmitCoalescer
from rankd.engine.errors import StorageError


def test_many_callers_are_served_in_order_across_bounded_flushes(monkeypatch):
    monkeypatch.setattr(coalescer_module, "MAX_COALESCED", 1000)
    applied: list[list[int]] = []

    async def apply(submissions):
        applied.append(list(submissions))
        await asyncio.sleep(0)
        return [s * 2 for s in submissions]

    async def scenario():
        coalescer = SubmitCoalescer(apply)
        callers = [[i] for i in range(4500)] + [list(range(10_000, 12_500))] + [[20_000, 20_001]]
        answers = await asyncio.gather(*(coalescer.submit_many(c) for c in callers))
        return callers, answers, coalescer

    callers, answers, coalescer = run(scenario())
    assert answers == [[s * 2 for s in c] for c in callers]
    # In call order, each flush within the bound (the caller of 2,500 split).
    assert [s for batch in applied for s in batch] == [s for c in callers for s in c]
    assert [len(batch) for batch in applied] == [1000] * 7 + [2]
    assert coalescer.flushes == 8 and coalescer.coalesced == 4500 + 2500 + 2


def test_one_callers_long_list_is_applied_a_bounded_part_a_callback(monkeypatch):
    # One call of 20,000 submissions once made one batch, applied in one
    # callback of the event loop (about 30-45 ms on the engine's general
    # path): now parts of at most MAX_COALESCED, in order, answered at once.
    monkeypatch.setattr(coalescer_module, "MAX_COALESCED", 300)
    applied: list[list[int]] = []

    async def apply(submissions):
        applied.append(list(submissions))
        return [-s for s in submissions]

    async def scenario():
        coalescer = SubmitCoalescer(apply)
        return await asyncio.gather(coalescer.submit_many(list(range(1000))),
                                    coalescer.submit_many([5000, 5001]))

    first, second = run(scenario())
    assert first == [-s for s in range(1000)] and second == [-5000, -5001]
    assert [len(batch) for batch in applied] == [300, 300, 300, 102]
    assert [s for batch in applied for s in batch] == [*range(1000), 5000, 5001]


def test_a_failed_part_of_a_split_list_answers_each_submission_for_itself(monkeypatch):
    # A caller's submissions are not one transaction: the part whose batch
    # failed is answered with the engine's error, submission by submission,
    # and the other parts with what became of them (applied here), in order.
    # Not one exception for the call, which would say "failed" of parts
    # that were applied.
    monkeypatch.setattr(coalescer_module, "MAX_COALESCED", 100)
    applied: list[int] = []

    async def apply(submissions):
        if 250 in submissions:
            raise StorageError("read-only: the log failed")
        applied.extend(submissions)
        return [s + 1 for s in submissions]

    async def scenario():
        coalescer = SubmitCoalescer(apply)
        return await asyncio.gather(coalescer.submit_many([7000]),
                                    coalescer.submit_many(list(range(450))))

    other, answers = run(scenario())
    assert other == [7001]
    assert len(answers) == 450
    assert answers[:199] == [s + 1 for s in range(199)]
    assert all(isinstance(a, StorageError) for a in answers[199:299])
    assert answers[299:] == [s + 1 for s in range(299, 450)]
    assert applied == [7000, *range(199), *range(299, 450)]


def test_a_list_that_fits_one_flush_raises_as_before(monkeypatch):
    monkeypatch.setattr(coalescer_module, "MAX_COALESCED", 100)

    async def apply(submissions):
        raise StorageError("read-only")

    async def scenario():
        coalescer = SubmitCoalescer(apply)
        with pytest.raises(StorageError):
            await coalescer.submit_many(list(range(100)))

    run(scenario())


def test_a_caller_that_went_away_is_still_applied_whole(monkeypatch):
    monkeypatch.setattr(coalescer_module, "MAX_COALESCED", 100)
    applied: list[int] = []

    async def apply(submissions):
        applied.extend(submissions)
        await asyncio.sleep(0)
        return list(submissions)

    async def scenario():
        coalescer = SubmitCoalescer(apply)
        gone = asyncio.ensure_future(coalescer.submit_many(list(range(250))))
        await asyncio.sleep(0)
        await asyncio.sleep(0)  # its first part taken
        gone.cancel()
        assert await coalescer.submit_many([999]) == [999]

    run(scenario())
    assert applied == [*range(250), 999]
