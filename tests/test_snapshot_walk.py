"""Snapshots that never hold a board's writes for its size: a board whose
indexes walk (``dump_walk``) is written a piece at a time while its writes
go on (``Snapshotter.snapshot_board``), and the log replayed from the
snapshot's position sets every member written meanwhile.

Checked with the real engine: writers change the board (scores, deltas,
removals, labels, event ids, new members, a window's periods) between every
piece of the walk; a restart from the snapshot and the log must be the live
state exactly (its digest), and no write may have waited for the walk."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from engine_helpers import FakeClock, engine_config, run, sub, with_engine
from rankd.engine import settings
from rankd.engine.engine import Engine
from rankd.engine.snapshot import SnapshotStore

MEMBERS = 3_000


async def _fill(engine, board: str) -> None:
    for start in range(0, MEMBERS, 1_000):
        await engine.submit_many([
            sub(board, f"p{i}", score=float(i % 97), label=f"L{i}" if i % 3 == 0 else None)
            for i in range(start, start + 1_000)])


async def _write_during(engine, done: asyncio.Event, seed: int) -> int:
    """Random writes to boards ``b`` (latest score) and ``s`` (sums) until
    ``done``; how many were applied."""
    rng = random.Random(seed)
    writes = 0
    while not done.is_set():
        member = f"p{rng.randrange(MEMBERS + 200)}"  # some new ones
        kind = rng.randrange(5)
        if kind == 0:
            await engine.remove_member(rng.choice("bs"), member)
        elif kind == 1:
            await engine.submit(sub("s", member, delta=float(rng.randint(-50, 50))))
        elif kind == 2:
            await engine.submit(sub("b", member, score=float(rng.randint(-10, 200)),
                                    label=f"new{writes}", event_id=f"e{seed}-{writes}"))
        else:
            await engine.submit(sub("b", member, score=float(rng.randint(-10, 200))))
        writes += 1
    return writes


@pytest.mark.parametrize("index", ["skiplist", "pages"])
@pytest.mark.parametrize("seed", [1, 2])
def test_a_snapshot_taken_under_writes_restarts_to_the_live_state(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, index: str, seed: int) -> None:
    # Tiny pieces: the walk takes hundreds of turns of the event loop.
    monkeypatch.setattr(settings, "SNAPSHOT_WALK_BYTES", 256)
    monkeypatch.setattr(settings, "SNAPSHOT_INDEX_BYTES", 4096)
    clock = FakeClock()

    async def body(engine) -> tuple[str, int, list[int]]:
        await engine.put_board("b", {"windows": ["all", "daily"], "policy": "latest"})
        await engine.put_board("s", {"policy": "sum", "tie_break": "member"})
        await _fill(engine, "b")
        await _fill(engine, "s")
        done = asyncio.Event()
        held: list[int] = []

        async def watch() -> None:  # the board is never held for the walk
            while not done.is_set():
                held.append(len(engine._state.held))
                await asyncio.sleep(0)

        writers = [asyncio.ensure_future(_write_during(engine, done, seed * 10 + k))
                   for k in range(3)]
        watcher = asyncio.ensure_future(watch())
        await engine.snapshot()
        done.set()
        writes = sum(await asyncio.gather(*writers))
        await watcher
        return engine.digest(), writes, held

    async def session() -> tuple[str, int, list[int]]:
        engine = await Engine.open(engine_config(tmp_path, index=index), clock=clock)
        try:
            return await body(engine)
        finally:
            await engine.close(snapshot=False)  # (the restart reads the walked one)

    live, writes, held = run(session())
    assert writes > 50, "the writers did not run during the walk"
    assert held and max(held) == 0

    # The snapshot holds walked dumps; the WAL after its position, the writes.
    _, sections = SnapshotStore(tmp_path / "snapshots").latest()
    walked = [section for section in sections if b"RKIX" in bytes(section)[:200]]
    assert len(walked) == 3
    assert all(bytes(section)[bytes(section).index(b"RKIX") + 7] == 1 for section in walked)

    async def reopened(engine) -> str:
        return engine.digest()

    assert run(with_engine(tmp_path, clock, reopened, index=index)) == live
    # Again from the snapshot the first restart's close took.
    assert run(with_engine(tmp_path, clock, reopened, index=index)) == live
