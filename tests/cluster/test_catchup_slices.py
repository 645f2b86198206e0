"""A node applying a long run of a group's log (a move's target catching up)
holds its loop a few ms at a time whatever a record costs: each slice is
sized by what the one before cost (rankd.cluster.catchup.SliceSize).
Slices of 1,000 records held a move's target 40-50 ms of CPU each on a
1,000,000-member board."""

from __future__ import annotations

import asyncio
import time

from rankd.cluster.catchup import (
    APPLY_SLICE,
    FIRST_SLICE,
    MIN_SLICE,
    SLICE_CPU_SECONDS,
    SliceSize,
    apply_slices,
)
from rankd.cluster.node import ClusterNode

GROUP = 7


class Engine:
    """What ``ClusterNode._apply`` uses of the engine: applying a record
    costs ``per_record`` seconds of this thread's CPU."""

    def __init__(self, per_record: float) -> None:
        self.per_record = per_record
        self.positions: dict[int, tuple[int, int]] = {}
        #: Each slice applied: (records, CPU seconds).
        self.slices: list[tuple[int, float]] = []

    def held_in(self, group: int) -> list:
        return []

    async def released(self, group: int) -> None:
        pass

    def apply_replicated(self, group: int, logged: list) -> asyncio.Future[None]:
        started = time.thread_time()
        while time.thread_time() - started < self.per_record * len(logged):
            pass
        self.slices.append((len(logged), time.thread_time() - started))
        self.positions[group] = logged[-1][:2]
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


def applied(per_record: float, records: int) -> Engine:
    node = object.__new__(ClusterNode)  # (only what _apply touches)
    node.engine = engine = Engine(per_record)  # type: ignore[assignment]
    node._unreadable = set()
    logged = [(seq, 1, b"r" * 40) for seq in range(1, records + 1)]

    async def run() -> None:
        await node._apply(GROUP, logged)

    asyncio.run(run())
    assert sum(count for count, _ in engine.slices) == records
    assert engine.positions[GROUP] == (records, 1)
    return engine


def test_a_costly_run_is_applied_in_slices_of_a_few_ms() -> None:
    engine = applied(40e-6, 2000)  # 80 ms of CPU in all
    longest = max(cpu for _, cpu in engine.slices)
    assert longest <= 3 * SLICE_CPU_SECONDS, engine.slices
    assert engine.slices[0][0] == FIRST_SLICE
    fits = round(SLICE_CPU_SECONDS / 40e-6)
    assert {count for count, _ in engine.slices[1:-1]} < set(range(fits // 2, 3 * fits // 2))


def test_a_cheap_run_goes_in_slices_as_large_as_before() -> None:
    engine = applied(0.0, 5 * APPLY_SLICE)
    assert [count for count, _ in engine.slices][-3:-1] == [APPLY_SLICE, APPLY_SLICE]


def test_slice_sizes_follow_the_cost_per_record() -> None:
    sizes = SliceSize()
    assert sizes.records == FIRST_SLICE
    sizes.timed(100, 100 * SLICE_CPU_SECONDS / 40)  # 40 fit
    assert sizes.records == 40
    sizes.timed(40, 0.0001)  # cheap now: grows at most twofold a slice
    assert sizes.records == 80
    sizes.timed(80, 1.0)
    assert sizes.records == MIN_SLICE
    logged = [(n, 1, b"") for n in range(1, 26)]
    sizes.records = 10
    assert [len(part) for part in apply_slices(logged, sizes)] == [10, 10, 5]
