"""The daemon on the compact event-id store: a snapshot written before it
(``event_id_log`` sections of ids and packed entries) still loads, and its
remembered ids still deduplicate - a retry answered with its original
result, another payload refused - on both the native and the pure-Python
paths; snapshots then write the new ``event_id_store`` sections.

``data/event-ids-2026-11`` is a data dir (a snapshot at position 52, and
the log it covers) written by the code of 157be2a (before the switch):
boards ``b`` (sum) and ``f`` (best, windows all and daily), 40 and 10
submissions with event ids ``e0..e39`` and ``f0..f9`` (members
``m{i % 7}``, deltas ``i + 0.5 * (i % 3)``, labels ``L{i}`` every 4th;
members ``p{i}`` with scores ``1000 - i``), at ``FakeClock()``'s time;
``answers.json`` holds the answers it gave them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine_helpers import FakeClock, engine_config, run, sub
from rankd.engine import records
from rankd.engine.engine import Engine
from rankd.engine.errors import EventConflict
from rankd.engine.snapshot import SnapshotStore

OLD_DATA_DIR = Path(__file__).parent / "data" / "event-ids-2026-11"
ANSWERS = json.loads((OLD_DATA_DIR / "answers.json").read_text())


def submission(event_id: str, *, other: bool = False):
    """The submission of ``event_id`` as the fixture made it (``other``:
    the same id with another value)."""
    i = int(event_id[1:])
    if event_id[0] == "e":
        return sub("b", f"m{i % 7}", delta=i + 0.5 * (i % 3) + (1 if other else 0),
                   event_id=event_id, label=None if i % 4 else f"L{i}")
    return sub("f", f"p{i}", score=1000 - i + (1 if other else 0), event_id=event_id)


def section_kinds(engine: Engine) -> list[str]:
    return [records.decode(payload)[0] for payload in engine.snapshots.latest()[1]]


def check_old_snapshot(data_dir: Path) -> None:
    """Load the fixture into ``data_dir`` and check that its ids deduplicate,
    before and after a snapshot of the new form and a restart."""
    shutil.copytree(OLD_DATA_DIR, data_dir, ignore=shutil.ignore_patterns("answers.json"))
    kinds = [records.decode(payload)[0]
             for payload in SnapshotStore(data_dir / "snapshots").latest()[1]]
    assert "event_id_log" in kinds and "event_id_store" not in kinds  # (the old form)
    clock = FakeClock(ANSWERS["clock"])
    answers = {answer["event_id"]: answer for answer in ANSWERS["answers"]}

    async def retries(engine: Engine) -> None:
        digest = engine.digest()
        for event_id, first in answers.items():
            again = await engine.submit(submission(event_id))
            assert again == {**first, "duplicate": True}, event_id
            with pytest.raises(EventConflict):
                await engine.submit(submission(event_id, other=True))
        assert engine.digest() == digest  # nothing applied twice, nothing refused changed
        fresh = await engine.submit(sub("b", "m0", delta=1, event_id="new-1"))
        assert not fresh["duplicate"]

    async def scenario() -> None:
        engine = await Engine.open(engine_config(data_dir), clock=clock)
        assert len(engine.boards["b"].dedupe) == 40 and len(engine.boards["f"].dedupe) == 10
        await retries(engine)
        await engine.snapshot()
        await engine.close(snapshot=False)
        kinds = section_kinds(engine)
        assert "event_id_store" in kinds and "event_id_log" not in kinds

        engine = await Engine.open(engine_config(data_dir), clock=clock)
        again = await engine.submit(sub("b", "m0", delta=1, event_id="new-1"))
        assert again["duplicate"]
        for event_id, first in answers.items():
            assert await engine.submit(submission(event_id)) == {**first, "duplicate": True}
        # Past the TTL (and its block's slack) the ids are forgotten.
        clock.advance(engine.config.dedupe_ttl + 3600)
        assert not (await engine.submit(submission("e5")))["duplicate"]
        await engine.close(snapshot=False)

    run(scenario())


def test_a_snapshot_of_the_old_store_loads_and_its_ids_deduplicate(tmp_path):
    check_old_snapshot(tmp_path / "data")


def test_the_same_on_the_pure_python_path(tmp_path):
    """The same check under ``RANKD_PURE_PYTHON=1`` (pure-Python index,
    ingest, replay and ``FingerprintDict``), in a process of its own."""
    code = ("import sys; from pathlib import Path; sys.path.insert(0, 'tests');"
            "from rankd.engine.dedupe import IMPLEMENTATION; assert IMPLEMENTATION == 'python';"
            "from rankd.index import IMPLEMENTATION as I; assert I == 'python', I;"
            "import test_event_id_store_switch as t;"
            f"t.check_old_snapshot(Path({str(tmp_path / 'data')!r}))")
    root = Path(__file__).parent.parent
    env = {**os.environ, "RANKD_PURE_PYTHON": "1",
           "PYTHONPATH": os.pathsep.join([str(root / "src"), str(root / "tests"),
                                          os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_conflicting_retry_changes_nothing_and_names_no_other_member(tmp_path):
    """The compact store keeps no member: a conflict is refused with the
    same code and message shape, and the board is as it was."""
    clock = FakeClock()

    async def scenario() -> None:
        engine = await Engine.open(engine_config(tmp_path), clock=clock)
        await engine.put_board("b", {"policy": "sum"})
        first = await engine.submit(sub("b", "ann", delta=5, event_id="x", label="gold"))
        digest = engine.digest()
        for other in (sub("b", "bob", delta=5, event_id="x", label="gold"),
                      sub("b", "ann", delta=6, event_id="x", label="gold"),
                      sub("b", "ann", delta=5, event_id="x", label="silver"),
                      sub("b", "ann", delta=5, event_id="x")):
            with pytest.raises(EventConflict, match="already used for another submission"):
                await engine.submit(other)
        assert engine.digest() == digest
        again = await engine.submit(sub("b", "ann", delta=5, event_id="x", label="gold"))
        assert again == {**first, "duplicate": True}
        await engine.close(snapshot=False)

    run(scenario())


def test_every_front_end_answers_retries_and_refuses_conflicts_across_a_restart(tmp_path):
    """Through the daemon: ids sent over TCP (the packed native path) and
    REST are answered as duplicates by either front-end, before and after
    a restart from a snapshot of the new form plus the log's tail; an id
    sent again with another payload is refused (``event_conflict``, 409)
    and changes nothing."""
    from daemon import Daemon
    from rankd.client import Client

    data_dir = tmp_path / "data"
    with Daemon(data_dir) as daemon:
        daemon.request("PUT", "/v1/boards/fe", {"policy": "sum"})
        with Client("127.0.0.1", daemon.tcp_port) as client:
            first = client.submit_many([{"member": f"m{i}", "delta": i + 1, "event_id": f"t{i}"}
                                        for i in range(50)], board="fe")["results"]
        status, rest_first = daemon.request("POST", "/v1/boards/fe/scores",
                                            {"member": "r", "delta": 5, "event_id": "r1"})
        assert status == 200 and not rest_first["duplicate"]
        assert daemon.request("POST", "/v1/admin/snapshot")[0] == 200
        with Client("127.0.0.1", daemon.tcp_port) as client:  # (after it: in the log's tail)
            late = client.submit_many([{"member": "late", "delta": 1, "event_id": "late"}],
                                      board="fe")["results"][0]
    for _ in range(2):  # once after the restart, once after a second one
        with Daemon(data_dir) as daemon:
            with Client("127.0.0.1", daemon.tcp_port) as client:
                again = client.submit_many(
                    [{"member": f"m{i}", "delta": i + 1, "event_id": f"t{i}"} for i in range(50)]
                    + [{"member": "late", "delta": 1, "event_id": "late"},
                       {"member": "r", "delta": 5, "event_id": "r1"},
                       {"member": "m1", "delta": 99, "event_id": "t1"},
                       {"member": "other", "delta": 2, "event_id": "t2"}], board="fe")["results"]
            assert again[:50] == [{**answer, "duplicate": True} for answer in first]
            assert again[50] == {**late, "duplicate": True}
            assert again[51]["duplicate"] and again[51]["score"] == rest_first["score"]
            assert [r["error"]["code"] for r in again[52:]] == ["event_conflict"] * 2
            status, body = daemon.request("POST", "/v1/boards/fe/scores",
                                          {"member": "m3", "delta": 4, "event_id": "t3"})
            assert status == 200 and body == {**first[3], "duplicate": True}
            status, body = daemon.request("POST", "/v1/boards/fe/scores",
                                          {"member": "m3", "delta": 5, "event_id": "t3"})
            assert status == 409 and body["error"]["code"] == "event_conflict"
            status, body = daemon.request("GET", "/v1/boards/fe/members/m1")
            assert body["score"] == 2.0  # nothing applied twice, nothing of the conflicts
