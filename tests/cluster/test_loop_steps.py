"""A node loading a large group keeps its loop's steps short: the local
log's copy of a group snapshot is written in records of at most
``group_load.COMMIT_BYTES`` (a board's index section, tens of MB at a
million members, in pieces), each run committed in a loop step of its own,
and replayed whole (rankd.engine.group_load, rankd.engine.replaying).  A
real node doing it, its health endpoint answered throughout and its
restart from those records: test_group_load.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

from rankd.cluster.groups import group_of
from rankd.engine import group_load, records
from rankd.engine.engine import Engine, EngineConfig
from rankd.engine.submission import Submission

BOARD = "stepped"
GROUP = group_of(BOARD)


def test_a_large_section_is_logged_in_pieces_and_replayed_whole(tmp_path: Path) -> None:
    """A group snapshot whose index section is several COMMIT_BYTES long:
    no local-log record holds more than COMMIT_BYTES of it, and replaying
    the records gives the group the snapshot gives; pieces of a part cut
    short (a crash while writing them) are never loaded, and a load of the
    group logged after them is replayed whole."""

    async def run() -> None:
        source = await Engine.open(EngineConfig(data_dir=tmp_path / "source"))
        try:
            await source.put_board(BOARD, {"policy": "best"})
            for start in range(0, 150_000, 10_000):
                await source.submit_many([
                    Submission(BOARD, f"member-{i:08d}", float(i), event_id=f"e{i}")
                    for i in range(start, start + 10_000)])
            seq, epoch, sections, _ = await source.group_snapshot(GROUP)
        finally:
            await source.close(snapshot=False)
        assert max(map(len, sections)) > 2 * group_load.COMMIT_BYTES  # (the index)
        logged = group_load.encoded(GROUP, seq, epoch, sections)
        assert len(logged) > len(sections)
        assert all(len(payload) <= group_load.COMMIT_BYTES + 64 for payload in logged)
        assert all(sum(map(len, run)) <= group_load.COMMIT_BYTES + 64 or len(run) == 1
                   for run in group_load.commit_runs(logged))
        expected = await Engine.open(EngineConfig(data_dir=tmp_path / "expected"))
        replayed = await Engine.open(EngineConfig(data_dir=tmp_path / "replayed"))
        try:
            expected._state.load(sections)
            expected._state.positions[GROUP] = (seq, epoch)
            replayer = replayed._replayer
            # A load cut short after two pieces of its index section, then
            # the whole load again (the node started over after a crash).
            cut = next(n for n, payload in enumerate(logged)
                       if len(records.decode(payload)) == 9)
            for payload in [*logged[:cut + 2], *logged]:
                replayer.load_group_part(records.decode(payload))
            assert replayed._state.positions[GROUP] == (seq, epoch)
            assert replayed.digest() == expected.digest()
            assert len(replayed._state.boards[BOARD].periods["all"]["all"]) == 150_000
            assert replayer.pieces is None
        finally:
            await expected.close(snapshot=False)
            await replayed.close(snapshot=False)

    asyncio.run(run())
