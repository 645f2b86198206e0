"""A node loading a large group (snapshot, then log) keeps serving: the
boards are built off the event loop (rankd.engine.group_load) and a long
log tail is checked and applied in slices (rankd.cluster.catchup)."""

from __future__ import annotations

import asyncio
import re
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from cluster_nodes import nodes, sql
from jepsen import wait_ready

from daemon import Daemon
from rankd.cluster.catchup import APPLY_SLICE, APPLY_SLICE_BYTES, apply_slices
from rankd.cluster.groups import group_of
from rankd.engine import group_load, records

BOARD = "loaded"
GROUP = group_of(BOARD)
MEMBERS = 200_000
#: The longest the loading node may leave its health endpoint unanswered.
HEALTH_BOUND_SECONDS = 0.5
#: A loop hold this long or longer counts against the node (the watchdog's
#: histogram bucket; the load held it for seconds before).
HELD_SECONDS = 0.25


def stalls_over(daemon: Daemon, seconds: float) -> int:
    """How many heartbeats of ``daemon``'s loop watchdog came later than
    ``seconds`` (a bucket bound of ``rankd_loop_stall_seconds``)."""
    with urllib.request.urlopen(daemon.url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    total = float(re.search(r"^rankd_loop_stall_seconds_count (\S+)$", text, re.M)[1])
    within = float(re.search(rf'^rankd_loop_stall_seconds_bucket{{le="{seconds}"}} (\S+)$',
                             text, re.M)[1])
    return round(total - within)


class HealthProbe(threading.Thread):
    """Asks ``daemon``'s health endpoint again and again; the longest answer."""

    def __init__(self, daemon: Daemon) -> None:
        super().__init__(daemon=True)
        self.target = daemon
        self.running = True
        self.longest = 0.0
        self.asked = 0

    def run(self) -> None:
        while self.running:
            started = time.monotonic()
            status, _ = self.target.request("GET", "/v1/health")
            assert status == 200
            self.longest = max(self.longest, time.monotonic() - started)
            self.asked += 1
            time.sleep(0.01)


def test_a_node_loading_a_large_group_snapshot_answers_its_health_endpoint(
        tmp_path: Path, pg_dsn: str) -> None:
    """A move of a group holding a 200,000-member board to a node that does
    not hold it: the node loads the group's snapshot (the log was compacted)
    and its loop is never held as long as the load takes.  The board's
    index section (several MB) goes to the node's local log in pieces: after
    a restart from that log the board is whole."""
    with nodes(tmp_path, pg_dsn, 2, "--replicas", "0", "--group-snapshot-records", "5") as (
            source, target):
        assert source.request("PUT", f"/v1/boards/{BOARD}", {"policy": "best"})[0] == 201
        for start in range(0, MEMBERS, 10_000):
            events = [{"member": f"m{i}", "score": i, "event_id": f"e{i}"}
                      for i in range(start, start + 10_000)]
            status, body = source.request("POST", f"/v1/boards/{BOARD}/scores/batch",
                                          {"events": events})
            assert status == 200, body
        deadline = time.monotonic() + 60
        while not sql(pg_dsn, "SELECT 1 FROM rankd_group_snapshots WHERE group_id = $1 AND "
                              "seq > 20 AND seq >= (SELECT min(first_seq) - 1 FROM rankd_log "
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
            deadline = time.monotonic() + 90
            while sql(pg_dsn, "SELECT holder FROM rankd_groups WHERE group_id = $1",
                      GROUP)[0]["holder"] != "n1":
                assert time.monotonic() < deadline, f"the move never finished:\n{target.log()}"
                time.sleep(0.1)
        finally:
            probe.running = False
            probe.join()
        assert "from its snapshot at position" in target.log()
        status, top = target.request("GET", f"/v1/boards/{BOARD}/top?limit=1")
        assert status == 200 and top["entries"][0]["member"] == f"m{MEMBERS - 1}", top
        assert probe.asked > 10
        assert probe.longest < HEALTH_BOUND_SECONDS, probe.longest
        assert stalls_over(target, HELD_SECONDS) == held_before, target.log()[-3000:]
        target.stop(timeout=30)
        target.start()
        wait_ready(target)
        status, top = target.request("GET", f"/v1/boards/{BOARD}/top?limit=1")
        assert status == 200 and top["entries"][0]["member"] == f"m{MEMBERS - 1}", top
        status, last = target.request("GET", f"/v1/boards/{BOARD}/members/m0")
        assert status == 200 and last["rank"] == MEMBERS, last


def test_a_group_built_off_the_loop_equals_one_loaded_on_it(tmp_path: Path) -> None:
    """group_load.build + install gives the boards BoardState.load gives:
    members, scores, labels, event ids and deadlines."""
    from rankd.engine.engine import Engine, EngineConfig
    from rankd.engine.submission import Submission

    async def run() -> None:
        engine = await Engine.open(EngineConfig(data_dir=tmp_path / "a"))
        try:
            await engine.put_board(BOARD, {"policy": "best"})
            await engine.submit_many([Submission(BOARD, f"m{i}", float(i), event_id=f"e{i}",
                                                 label=f"L{i}") for i in range(30_000)])
            await engine.expire(BOARD, int(time.time() * 1000) + 3_600_000)
            seq, epoch, sections, _ = await engine.group_snapshot(GROUP)
        finally:
            await engine.close()
        expected = await Engine.open(EngineConfig(data_dir=tmp_path / "b"))
        built = await Engine.open(EngineConfig(data_dir=tmp_path / "c"))
        try:
            expected._state.load(sections)
            names = group_load.install(built._state, GROUP, await asyncio.to_thread(
                group_load.build, sections, built._state.clock))
            assert names == {BOARD}
            for engine in (expected, built):
                engine._state.positions[GROUP] = (seq, epoch)
            assert built.digest() == expected.digest()
            one, other = expected._state.boards[BOARD], built._state.boards[BOARD]
            assert other.expires_at == one.expires_at is not None
            assert other.labels == one.labels
            assert list(other.dedupe.packed_items()) == list(one.dedupe.packed_items())
            # One record per section, a section over COMMIT_BYTES in pieces of it.
            parts: dict[int, bytes] = {}
            for payload in group_load.encoded(GROUP, seq, epoch, sections):
                kind, group, at, of_epoch, part, count, piece, *_ = records.decode(payload)
                assert (kind, group, at, of_epoch, count) == (
                    records.GROUP_LOAD, GROUP, seq, epoch, len(sections))
                assert len(piece) <= group_load.COMMIT_BYTES
                parts[part] = parts.get(part, b"") + piece
            assert list(parts.values()) == sections
        finally:
            await expected.close()
            await built.close()

    asyncio.run(run())


def test_a_group_is_built_off_the_loop_on_name_arenas_of_its_own(tmp_path: Path) -> None:
    """A load stores names without the GIL, so no other thread may use an
    index of the arena it loads into meanwhile (rankd._pages.Names): the
    boards a worker thread builds share an arena among their own windows,
    and none with a board the loop serves."""
    from rankd.engine.engine import Engine, EngineConfig
    from rankd.engine.submission import Submission
    from rankd.index import kinds

    if kinds.new_names() is None:
        pytest.skip("the index kind in use keeps names per index")

    async def run() -> None:
        engine = await Engine.open(EngineConfig(data_dir=tmp_path / "a"))
        try:
            await engine.put_board(BOARD, {"policy": "best",
                                           "windows": ["all", "daily", "weekly"]})
            await engine.submit_many([Submission(BOARD, f"m{i}", float(i))
                                      for i in range(3_000)])
            _, _, sections, _ = await engine.group_snapshot(GROUP)
            live = engine._state.boards[BOARD]
            built = await asyncio.to_thread(group_load.build, sections, engine._state.clock)
            board = built.boards[BOARD]
            indexes = [ix for periods in board.periods.values() for ix in periods.values()]
            assert len(indexes) == 3
            assert board.names is not live.names
            assert all(ix._names_arena() is board.names for ix in indexes)
            assert board.names.indexes == 3
            assert board.names._state()[0] == 3_000  # each name stored once
            assert all(ix._names_arena() is live.names
                       for periods in live.periods.values() for ix in periods.values())
        finally:
            await engine.close()

    asyncio.run(run())


def test_event_ids_are_loaded_in_pieces_cut_between_entries() -> None:
    from rankd.engine.dedupe import DedupeTable

    table = DedupeTable()
    for n in range(5000):
        table.remember(f"event-{n}", time.time() + 60, (float(n), 1, None, True), f"m{n}", n)
    chunks = list(table.log_chunks(1 << 20))
    pieces = [piece for chunk in chunks for piece in group_load.event_id_pieces(chunk, 4096)]
    assert len(pieces) > 10 and all(len(piece) < 4096 + 200 for piece in pieces)
    again = DedupeTable()
    for piece in pieces:
        again.load_store(piece)
    assert list(again.packed_items()) == list(table.packed_items())
    with pytest.raises(ValueError):  # a cut chunk is refused whole, not in pieces
        for piece in group_load.event_id_pieces(chunks[0][:-3], 4096):
            DedupeTable().load_store(piece)


def test_a_long_log_run_is_applied_in_slices_bounded_by_records_and_bytes() -> None:
    logged = [(n, 1, b"x" * 5000) for n in range(1, 100)]
    slices = list(apply_slices(logged))
    assert [record for part in slices for record in part] == logged
    assert all(sum(len(p) for _, _, p in part) <= APPLY_SLICE_BYTES for part in slices)
    big = [(1, 1, b"y" * (APPLY_SLICE_BYTES * 2)), (2, 1, b"z")]
    assert list(apply_slices(big)) == [big[:1], big[1:]]
    small = [(n, 1, b"") for n in range(1, 2 * APPLY_SLICE + 2)]
    assert [len(part) for part in apply_slices(small)] == [APPLY_SLICE, APPLY_SLICE, 1]
