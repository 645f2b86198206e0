"""``RegisterReads``: the reads of a group's register that writes ask for
are shared while under way, reused a moment, bounded in time whatever
Postgres does, and a caller that leaves ends no one else's wait."""

from __future__ import annotations

import asyncio
import time

from rankd.cluster import register_reads
from rankd.cluster.register_reads import RegisterReads


def test_concurrent_learns_share_one_read_and_a_fresh_one_answers() -> None:
    async def run() -> list[int]:
        reads: list[int] = []

        async def read(group: int) -> None:
            reads.append(group)
            await asyncio.sleep(0.05)
        learner = RegisterReads(read, 2.0, fresh=0.2)
        await asyncio.gather(*(learner.learn(g) for g in [1] * 50 + [2] * 50))
        await learner.learn(1)  # just read: answered by that read
        await asyncio.sleep(0.25)
        await learner.learn(1)  # no longer fresh: read again
        return reads
    assert sorted(asyncio.run(run())) == [1, 1, 2]


def test_a_hanging_postgres_bounds_every_caller() -> None:
    async def run() -> float:
        async def read(group: int) -> None:
            await asyncio.sleep(60)  # Postgres paused
        learner = RegisterReads(read, 0.3, at_once=1)
        started = time.monotonic()
        await asyncio.gather(*(learner.learn(g) for g in range(10)))
        return time.monotonic() - started
    assert asyncio.run(run()) < 1.5


def test_a_caller_leaving_does_not_cancel_the_shared_read() -> None:
    async def run() -> list[str]:
        done: list[str] = []

        async def read(group: int) -> None:
            await asyncio.sleep(0.1)
            done.append("read")
        learner = RegisterReads(read, 2.0)
        first = asyncio.ensure_future(learner.learn(7))
        await asyncio.sleep(0.01)
        second = asyncio.ensure_future(learner.learn(7))
        await asyncio.sleep(0.01)
        first.cancel()  # its client disconnected mid-learn
        await second
        return done
    assert asyncio.run(run()) == ["read"]


def test_a_caller_whose_wait_ran_out_makes_the_next_group_fail_at_once() -> None:
    async def run() -> tuple[bool, float]:
        async def read(group: int) -> None:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:  # (a link to a stuck Postgres closes slowly)
                await asyncio.sleep(0.3)
                raise
        learner = RegisterReads(read, 0.2)
        await learner.learn(1)  # its wait ran out; the read is still closing
        started = time.monotonic()
        return await learner.learn(2), time.monotonic() - started
    answer, waited = asyncio.run(run())
    assert answer is False and waited < 0.05


def test_after_postgres_did_not_answer_reads_fail_at_once_for_a_moment() -> None:
    async def run() -> tuple[bool, bool, float, bool, list[int]]:
        reads: list[int] = []
        away = [True]

        async def read(group: int) -> None:
            reads.append(group)
            if away[0]:
                await asyncio.sleep(60)
        learner = RegisterReads(read, 0.2)
        first = await learner.learn(1)
        started = time.monotonic()
        second = await learner.learn(2)  # another group: no second wait
        waited = time.monotonic() - started
        away[0] = False
        await asyncio.sleep(register_reads.AWAY_SECONDS)
        return first, second, waited, await learner.learn(3), reads
    first, second, waited, third, reads = asyncio.run(run())
    assert (first, second, third) == (False, False, True)
    assert waited < 0.05 and reads == [1, 3]


def test_a_read_waiting_for_a_slot_when_postgres_was_found_away_does_not_go() -> None:
    async def run() -> tuple[list[int], list[bool]]:
        reads: list[int] = []

        async def read(group: int) -> None:
            reads.append(group)
            await asyncio.sleep(60)  # Postgres paused
        learner = RegisterReads(read, 0.5, at_once=1)
        first = asyncio.ensure_future(learner.learn(1))
        await asyncio.sleep(0.2)  # group 2's read queues for the slot, its own bound later
        second = asyncio.ensure_future(learner.learn(2))
        return reads, list(await asyncio.gather(first, second))
    reads, answers = asyncio.run(run())
    assert answers == [False, False]
    assert reads == [1]  # group 2's read, given the slot after the first failed, sent nothing
