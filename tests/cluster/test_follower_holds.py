"""A follower's local snapshot while its log tail applies (rankd.cluster.node
``_apply``): snapshots once dumped a held board's index in a worker thread
without the GIL, and a record applied meanwhile changed the index under the
dump (a segmentation fault), so the follower waited for the hold.  They now
walk the index on the event loop and hold nothing: records are applied
between the walk's pieces, and the state is right afterwards."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path
from types import SimpleNamespace

from rankd.cluster.node import ClusterNode
from rankd.engine import records
from rankd.engine.engine import Engine, EngineConfig
from rankd.engine.groups import group_of
from rankd.engine.submission import Submission

BOARD = "followed"
GROUP = group_of(BOARD)


def follower_of(engine: Engine) -> SimpleNamespace:
    """What ClusterNode's log application needs of its node, around ``engine``."""
    node = SimpleNamespace(engine=engine, _unreadable=set())
    for name in ("_apply", "_apply_now", "_apply_sliced", "_apply_released"):
        setattr(node, name, functools.partial(getattr(ClusterNode, name), node))
    return node


def test_the_log_applies_between_the_pieces_of_a_snapshot(tmp_path: Path) -> None:
    async def run() -> None:
        engine = await Engine.open(EngineConfig(data_dir=tmp_path / "node"))
        try:
            await engine.put_board(BOARD, {"policy": "best"})
            for start in range(0, 300_000, 10_000):
                await engine.submit_many([Submission(BOARD, f"m{i}", float(i))
                                          for i in range(start, start + 10_000)])
            wal = engine._core.wal
            before = wal.last_lsn
            await engine.submit_many([Submission(BOARD, "template", 1.0)])
            ((_, payload),) = [r for batch in wal.iter_batches(before + 1, 10) for r in batch]
            template = records.decode(payload)
            engine._state.positions[GROUP] = (0, 1)
            node = follower_of(engine)
            applied_while_walked = 0
            apply = engine.apply_replicated
            snapshot: asyncio.Future | None = None

            def watched(group: int, logged: list) -> asyncio.Future:
                nonlocal applied_while_walked
                assert not engine.held_in(group)
                applied_while_walked += snapshot is not None and not snapshot.done()
                return apply(group, logged)

            engine.apply_replicated = watched  # type: ignore[method-assign]
            snapshot = asyncio.ensure_future(engine.snapshot())
            seq = 0
            while not snapshot.done():
                run_ = []
                for _ in range(1 + 1500 * (seq % 2)):  # one record, or a sliced run
                    seq += 1
                    record = list(template)
                    record[2] = f"new{seq}"
                    run_.append((seq, 1, records.encode(record)))
                await node._apply(GROUP, run_)
            await snapshot
            assert applied_while_walked > 10
            assert engine.positions[GROUP][0] == seq
            assert len(engine._state.boards[BOARD].periods["all"]["all"]) == 300_001 + seq
        finally:
            await engine.close(snapshot=False)

    asyncio.run(run())
