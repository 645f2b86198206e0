"""A group snapshot taken while the group's log applies (``Engine.group_snapshot``
walks its boards: no write waits for it) holds the group's state at its
position ``seq`` and some of the records after it, up to ``covers``.  A
follower loaded from it reaches the primary's state by applying the log
from ``seq``, and serves no read of the group before it applied ``covers``
(``ClusterNode._unwalked``): a record applied again in between would show
a member's older state than the snapshot showed."""

from __future__ import annotations

import asyncio
import functools
import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from rankd.cluster.node import ClusterNode
from rankd.engine import records, settings
from rankd.engine.engine import Engine, EngineConfig
from rankd.engine.groups import group_of
from rankd.engine.submission import Submission

BOARD = "walked"
GROUP = group_of(BOARD)
MEMBERS = 20_000


def follower_of(engine: Engine) -> SimpleNamespace:
    """What ClusterNode's log application and read gating need of its node."""
    node = SimpleNamespace(engine=engine, node_id="n1", _unreadable={}, _rebuild_to={})
    for name in ("_apply", "_apply_now", "_apply_sliced", "_apply_released", "_unwalked",
                 "_rebuilding", "_rebuilt_up_to"):
        setattr(node, name, functools.partial(getattr(ClusterNode, name), node))
    return node


async def _template(engine: Engine) -> list:
    """A SUBMIT record of ``BOARD`` as the engine logs it."""
    wal = engine._core.wal
    before = wal.last_lsn
    await engine.submit_many([Submission(BOARD, "template", 1.0)])
    ((_, payload),) = [r for batch in wal.iter_batches(before + 1, 10) for r in batch]
    return records.decode(payload)


def _log(template: list, count: int, seed: int) -> list[tuple[int, int, bytes]]:
    """``count`` records of the group's log: new scores of members (most of
    them present, some new) and removals."""
    rng = random.Random(seed)
    logged = []
    for seq in range(1, count + 1):
        member = f"m{rng.randrange(MEMBERS + 500)}"
        if rng.randrange(6) == 0:
            record = [records.REMOVE, BOARD, member, template[6]]
        else:
            score = float(rng.randrange(-1000, MEMBERS * 2))
            record = list(template)
            record[2], record[3] = member, score
            record[9] = [[window, period, score] for window, period, _ in template[9]]
        logged.append((seq, 1, records.encode(record)))
    return logged


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_follower_loaded_from_a_walked_snapshot_reads_only_once_it_applied_its_end(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    monkeypatch.setattr(settings, "SNAPSHOT_WALK_BYTES", 512)  # hundreds of turns

    async def run() -> None:
        source = await Engine.open(EngineConfig(data_dir=tmp_path / "source"))
        target = await Engine.open(EngineConfig(data_dir=tmp_path / "target"))
        try:
            await source.put_board(BOARD, {"policy": "latest"})
            await source.submit_many([Submission(BOARD, f"m{i}", float(i))
                                      for i in range(MEMBERS)])
            logged = _log(await _template(source), 3_000, seed)
            source._state.positions[GROUP] = (0, 1)
            copy = asyncio.ensure_future(source.group_snapshot(GROUP))
            applied = 0
            while not copy.done():  # the log applies between the walk's pieces
                await source.apply_replicated(GROUP, logged[applied:applied + 3])
                applied += 3
                await asyncio.sleep(0)
            seq, epoch, sections, covers = await copy
            await source.apply_replicated(GROUP, logged[applied:])
            assert covers > seq + 30, (seq, covers)
            assert list(records.decode(sections[0])) == ["walked", GROUP, covers]

            node = follower_of(target)
            await target.load_group_snapshot(GROUP, seq, epoch, sections)
            assert target.walked[GROUP] == covers
            node._unwalked(GROUP)
            for at in range(seq, len(logged)):
                assert (GROUP in node._unreadable) == (at < covers), at
                await node._apply(GROUP, logged[at:at + 1])
            assert GROUP not in node._unreadable
            assert target.digest(BOARD) == source.digest(BOARD)
        finally:
            await source.close(snapshot=False)
            await target.close(snapshot=False)

    asyncio.run(run())


def test_a_local_snapshot_keeps_how_far_a_loaded_group_must_apply(tmp_path: Path) -> None:
    """A node restarted while it still applies up to a walked snapshot's end
    knows that end again (its local snapshot says it); once applied past it,
    the local snapshot no longer does."""
    async def run() -> None:
        engine = await Engine.open(EngineConfig(data_dir=tmp_path / "node"))
        try:
            await engine.put_board(BOARD, {"policy": "latest"})
            engine._state.positions[GROUP] = (5, 1)
            engine._state.walked[GROUP] = 9
        finally:
            await engine.close()  # (a snapshot)
        engine = await Engine.open(EngineConfig(data_dir=tmp_path / "node"))
        try:
            assert engine.walked == {GROUP: 9}
            engine._state.positions[GROUP] = (9, 1)
        finally:
            await engine.close()
        engine = await Engine.open(EngineConfig(data_dir=tmp_path / "node"))
        try:
            assert engine.walked == {}
        finally:
            await engine.close(snapshot=False)

    asyncio.run(run())
