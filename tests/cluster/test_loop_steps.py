"""A node loading a large group keeps its loop's steps short: the local
log's copy of a group snapshot is written in records of at most
``group_load.COMMIT_BYTES`` (a board's index section, tens of MB at a
million members, in pieces), each run committed in a loop step of its own,
and replayed whole (rankd.engine.group_load, rankd.engine.replaying)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from cluster_nodes import nodes, sql
from jepsen import wait_ready
from test_group_load import HEALTH_BOUND_SECONDS, HELD_SECONDS, HealthProbe, stalls_over

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
            seq, epoch, sections = await source.group_snapshot(GROUP)
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


def test_a_move_of_a_large_group_leaves_the_targets_loop_free(tmp_path: Path,
                                                              pg_dsn: str) -> None:
    """A move of a group holding a large board (400,000 members: an index
    section of about 10 MB, logged in pieces) to a node that loads its
    snapshot: the node's health endpoint is answered within
    HEALTH_BOUND_SECONDS throughout and its loop watchdog saw no hold of
    HELD_SECONDS (bounds for this shared 2-core machine, as
    test_group_load's; what one step costs is in bench_loop_steps.py), and
    the board is there after, and after the node restarts from its local
    log."""
    members = 400_000
    with nodes(tmp_path, pg_dsn, 2, "--replicas", "0", "--group-snapshot-records", "5") as (
            source, target):
        assert source.request("PUT", f"/v1/boards/{BOARD}", {"policy": "best"})[0] == 201
        for start in range(0, members, 10_000):
            events = [{"member": f"m{i}", "score": i, "event_id": f"e{i}"}
                      for i in range(start, start + 10_000)]
            status, body = source.request("POST", f"/v1/boards/{BOARD}/scores/batch",
                                          {"events": events}, timeout=60)
            assert status == 200, body
        deadline = time.monotonic() + 90
        while not sql(pg_dsn, "SELECT 1 FROM rankd_group_snapshots WHERE group_id = $1 AND "
                              "seq > 30 AND seq >= (SELECT min(first_seq) - 1 FROM rankd_log "
                              "WHERE group_id = $1)", GROUP):
            assert time.monotonic() < deadline, "the group's log was never compacted"
            time.sleep(0.2)
        held_before = stalls_over(target, HELD_SECONDS)
        probe = HealthProbe(target)
        probe.start()
        try:
            status, body = source.request("POST", "/v1/cluster/moves",
                                          {"group": GROUP, "node": "n1"})
            assert status == 202, body
            deadline = time.monotonic() + 120
            while sql(pg_dsn, "SELECT holder FROM rankd_groups WHERE group_id = $1",
                      GROUP)[0]["holder"] != "n1":
                assert time.monotonic() < deadline, f"the move never finished:\n{target.log()}"
                time.sleep(0.1)
        finally:
            probe.running = False
            probe.join()
        assert "from its snapshot at position" in target.log()
        status, top = target.request("GET", f"/v1/boards/{BOARD}/top?limit=1")
        assert status == 200 and top["entries"][0]["member"] == f"m{members - 1}", top
        assert probe.asked > 10
        assert probe.longest < HEALTH_BOUND_SECONDS, probe.longest
        assert stalls_over(target, HELD_SECONDS) == held_before, target.log()[-3000:]
        # What the node logged of the load (the index in pieces) comes back whole.
        target.stop(timeout=30)
        target.start()
        wait_ready(target)
        status, top = target.request("GET", f"/v1/boards/{BOARD}/top?limit=1")
        assert status == 200 and top["entries"][0]["member"] == f"m{members - 1}", top
        status, last = target.request("GET", f"/v1/boards/{BOARD}/members/m0")
        assert status == 200 and last["rank"] == members, last
