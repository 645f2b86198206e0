"""The submit coalescer (rankd.engine.coalescer): many concurrent callers.

Callers that submit during one pass of the event loop share one call of the
batch function; a flush takes at most ``MAX_COALESCED`` submissions (one
caller's larger batch alone) and the rest wait a pass.  What is proven here:
every caller gets its own answers, in the order callers called, across
several flushes, and no flush goes past its bound.
"""

from __future__ import annotations

import asyncio

from engine_helpers import run
from rankd.engine import coalescer as coalescer_module
from rankd.engine.coalescer import SubmitCoalescer


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
    # In call order, each flush within the bound but for the one caller of 2,500.
    assert [s for batch in applied for s in batch] == [s for c in callers for s in c]
    assert [len(batch) for batch in applied] == [1000] * 4 + [500, 2500, 2]
    assert coalescer.flushes == 7 and coalescer.coalesced == 4500 + 2500 + 2
