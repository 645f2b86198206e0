"""Writes made while a snapshot walks a board, each at the worst moment for
the walk: the state a restart recovers from the walked snapshot and the log
must equal the live one (``Engine.digest``), and the restart must work.

Each case pauses the snapshot's file writer (a worker thread) right after a
chosen section, makes its writes on the event loop meanwhile, then lets
the snapshot go on; the live engine is closed without a new snapshot, so the
restart reads the walked one and the log after its position."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from engine_helpers import FakeClock, engine_config, run, sub, with_engine
from rankd.engine import records, snapshotting
from rankd.engine.engine import Engine
from rankd.engine.groups import group_of
from rankd.engine.snapshot import SnapshotWriter
from rankd.engine.state import BoardState

INDEX_KINDS = ["skiplist", "pages"]


class _PauseAfter:
    """Pauses the snapshot's writer thread after the first section of
    ``kind`` for ``board`` until :meth:`go` (the loop writes meanwhile)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, kind: str, board: str,
                 writer: type = SnapshotWriter) -> None:
        self.reached = asyncio.Event()
        self._go = threading.Event()
        self._loop = asyncio.get_running_loop()
        self._done = False
        original = writer.add

        def add(sections: object, payload: bytes) -> None:
            original(sections, payload)
            if self._done:
                return
            section = records.decode(payload)
            if section[:2] == (kind, board):
                self._done = True
                self._loop.call_soon_threadsafe(self.reached.set)
                assert self._go.wait(10), "the test never let the snapshot go on"

        monkeypatch.setattr(writer, "add", add)

    def go(self) -> None:
        self._go.set()


async def _walked_restart(data_dir: Path, index: str, monkeypatch: pytest.MonkeyPatch,
                          before: Callable[[Engine], Awaitable[None]],
                          meanwhile: Callable[[Engine], Awaitable[None]],
                          board: str = "b",
                          observe: Callable[[Engine], object] = lambda engine: None
                          ) -> tuple[object, object]:
    """``before`` writes, then a snapshot starts and ``meanwhile`` writes
    once the snapshot wrote board ``board``'s header; the restart from it
    must show the live state.  Returns what ``observe`` saw of the live
    engine and of the restarted one."""
    clock = FakeClock()
    config = engine_config(data_dir, index=index)
    engine = await Engine.open(config, clock=clock)
    await before(engine)
    pause = _PauseAfter(monkeypatch, "board", board)
    snapshot = asyncio.create_task(engine.snapshot())
    await asyncio.wait_for(pause.reached.wait(), 10)
    try:
        await meanwhile(engine)
    finally:
        pause.go()
    await snapshot
    live, seen = engine.digest(), observe(engine)
    await engine.close(snapshot=False)
    monkeypatch.undo()
    restarted = await Engine.open(config, clock=clock)
    try:
        assert restarted.digest() == live
        return seen, observe(restarted)
    finally:
        await restarted.close(snapshot=False)


@pytest.mark.parametrize("index", INDEX_KINDS)
def test_window_added_while_the_board_is_walked_restarts(tmp_path: Path, index: str,
                                                        monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    """A window added (``put_board``) and written after the snapshot wrote
    the board's config, before it walked its windows: the snapshot held an
    index of a window its config lacked, and the restart failed loading it
    (``KeyError: 'daily'``)."""
    async def before(engine: Engine) -> None:
        await engine.put_board("b", {"windows": ["all"]})
        await engine.submit_many([sub("b", f"m{i}", score=float(i)) for i in range(20)])

    async def meanwhile(engine: Engine) -> None:
        await engine.put_board("b", {"windows": ["all", "daily"]})
        await engine.submit(sub("b", "late", score=99.0))

    run(_walked_restart(tmp_path, index, monkeypatch, before, meanwhile))


@pytest.mark.parametrize("index", INDEX_KINDS)
def test_window_added_while_a_group_snapshot_walks_the_board_loads(
        tmp_path: Path, index: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same for a cluster group's snapshot (``Engine.group_snapshot``,
    what a follower whose position the log dropped loads): its sections
    must load (they raised ``KeyError: 'daily'``, and the follower could
    never load its group)."""
    async def body() -> None:
        clock = FakeClock()
        engine = await Engine.open(engine_config(tmp_path, index=index), clock=clock)
        try:
            await engine.put_board("b", {"windows": ["all"]})
            await engine.submit_many([sub("b", f"m{i}", score=float(i)) for i in range(20)])
            pause = _PauseAfter(monkeypatch, "board", "b", snapshotting._Sections)
            copy = asyncio.create_task(engine.group_snapshot(group_of("b")))
            await asyncio.wait_for(pause.reached.wait(), 10)
            try:
                await engine.put_board("b", {"windows": ["all", "daily"]})
                await engine.submit(sub("b", "late", score=99.0))
            finally:
                pause.go()
            _, _, sections, _ = await copy
            loaded = BoardState(clock)
            loaded.load(sections)
            assert set(loaded.boards["b"].periods) <= set(loaded.boards["b"].config.windows)
        finally:
            await engine.close(snapshot=False)

    run(body())


@pytest.mark.parametrize("index", INDEX_KINDS)
def test_board_version_not_counted_twice_after_a_walked_snapshot(
        tmp_path: Path, index: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Writes to a board after the snapshot's position but before the
    snapshot reached it: its section held the version they made, and the
    restart's replay of the same writes counted them again (versions a
    board's readers compare, the live feed's proxies across nodes too:
    one showing a higher version for the same state hides the next tops)."""
    async def before(engine: Engine) -> None:
        await engine.put_board("a", {"windows": ["all"]})  # (snapshotted first)
        await engine.put_board("b", {"windows": ["all"]})
        await engine.submit_many([sub(name, f"m{i}", score=float(i))
                                  for name in ("a", "b") for i in range(10)])

    async def meanwhile(engine: Engine) -> None:
        await engine.submit(sub("b", "late", score=99.0))
        await engine.remove_member("b", "m3")

    live, restarted = run(_walked_restart(tmp_path, index, monkeypatch, before, meanwhile,
                                          board="a",
                                          observe=lambda engine: engine.read_version("b")))
    assert restarted == live


def test_a_period_retired_before_a_restart_stays_retired(tmp_path: Path) -> None:
    """Retiring a closed period is not logged (housekeeping: its standings
    are archived, then it is dropped), so the log made it again at a
    restart until the next housekeeping; the restart retires it again before
    the first read."""
    clock = FakeClock()

    async def before(engine) -> str:
        await engine.put_board("d", {"windows": ["all", "daily"], "retain": 1})
        await engine.submit(sub("d", "a", score=1.0))
        clock.advance(3 * 86_400)
        await engine.submit(sub("d", "b", score=2.0))
        await engine.housekeeping()
        return engine.digest()

    async def session() -> str:
        engine = await Engine.open(engine_config(tmp_path), clock=clock)
        try:
            return await before(engine)
        finally:
            await engine.close(snapshot=False)

    live = run(session())

    async def reopened(engine) -> str:
        return engine.digest()

    assert run(with_engine(tmp_path, clock, reopened)) == live
