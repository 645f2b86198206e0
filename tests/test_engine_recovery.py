"""Recovery: snapshot + WAL tail, torn tails, mid-log corruption, repair,
and a crash test that SIGKILLs a live engine again and again."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine_helpers import FakeClock, engine_config, run, sub
from rankd.engine import idstore, records
from rankd.engine import settings as engine_module
from rankd.engine.engine import Engine
from rankd.engine.errors import EventConflict

HERE = Path(__file__).parent


async def _fill(engine: Engine, events: range) -> None:
    if "b" not in engine.boards:
        await engine.put_board("b", {"policy": "sum", "windows": ["all", "daily"]})
    await engine.submit_many(
        [sub("b", f"m{i % 50}", delta=1 + i % 3, event_id=f"e{i}") for i in events]
    )


async def _open(data_dir: Path, clock: FakeClock, **overrides) -> Engine:
    return await Engine.open(engine_config(data_dir, **overrides), clock=clock)


def _segments(data_dir: Path) -> list[Path]:
    return sorted((data_dir / "wal").glob("*.log"))


def test_recovery_from_snapshot_plus_wal_tail_and_from_wal_alone(tmp_path):
    clock = FakeClock()

    async def scenario():
        engine = await _open(tmp_path, clock)
        await _fill(engine, range(0, 300))
        await engine.snapshot()
        await _fill(engine, range(300, 700))
        live = engine.digest()
        await engine.close(snapshot=False)
        engine = await _open(tmp_path, clock)
        recovered = engine.digest()
        await engine.close(snapshot=False)
        for snapshot in (tmp_path / "snapshots").glob("*.snap"):
            snapshot.unlink()  # the WAL still holds everything: no segment was covered twice
        engine = await _open(tmp_path, clock, segment_bytes=1 << 30)
        from_wal = engine.digest()
        await engine.close(snapshot=False)
        return live, recovered, from_wal

    live, recovered, from_wal = run(scenario())
    assert recovered == live
    assert from_wal == live


@pytest.mark.parametrize("pending_limit", [None, 97])
def test_replay_applies_gathered_states_before_other_records_of_their_board(
        tmp_path, monkeypatch, pending_limit):
    # Replay gathers the states SUBMIT records carry and hands them to the
    # indexes late and at once (large batches re-thread an index in one
    # pass).  Removals, reconfigurations and drops in between must still see
    # exactly the state the live engine saw; with a tiny pending limit the
    # states are also applied in many partial flushes.
    if pending_limit is not None:
        monkeypatch.setattr(engine_module, "REPLAY_PENDING_STATES", pending_limit)
    clock = FakeClock()
    rng = random.Random(7)

    sent = {}

    async def submit_round(engine, board, count, start):
        batch = [sub(board, f"m{rng.randrange(3000)}", delta=rng.randrange(1, 4),
                     event_id=f"{board}-{start + i}") for i in range(count)]
        sent.update((s.event_id, s) for s in batch)
        await engine.submit_many(batch)

    async def scenario():
        engine = await _open(tmp_path, clock)
        await engine.put_board("a", {"policy": "sum", "windows": ["all", "daily"]})
        await engine.put_board("b", {"policy": "best", "order": "asc"})
        await engine.submit_many([sub("b", f"p{i}", score=i % 40) for i in range(2500)])
        await submit_round(engine, "a", 2500, 0)
        await engine.snapshot()
        for step in range(4):
            await submit_round(engine, "a", 1500, 10_000 * (step + 1))
            await engine.submit_many(
                [sub("b", f"p{rng.randrange(2600)}", score=rng.randrange(-50, 40))
                 for _ in range(1200)])
            await engine.remove_member("a", f"m{rng.randrange(3000)}")
            await engine.remove_member("b", f"p{step}")
        await engine.put_board("a", {"policy": "sum", "windows": ["all"]}, discard=True)
        await submit_round(engine, "a", 1200, 90_000)
        await engine.put_board("a", {"policy": "sum", "windows": ["all", "weekly"]})
        await submit_round(engine, "a", 1200, 95_000)
        await engine.put_board("c", {"policy": "latest"})
        await engine.submit_many([sub("c", f"q{i}", score=i) for i in range(1100)])
        await engine.delete_board("c")
        await engine.put_board("c", {"policy": "latest"})
        await engine.submit_many([sub("c", f"q{i}", score=-i) for i in range(300)])
        live = engine.digest()
        retry = sent["a-10005"]
        replayed_answer = await engine.submit(retry)
        with pytest.raises(EventConflict):
            await engine.submit(sub("a", "late", delta=1, event_id="a-10005"))
        await engine.close(snapshot=False)
        engine = await _open(tmp_path, clock)
        recovered = engine.digest()
        answer = await engine.submit(retry)
        with pytest.raises(EventConflict):  # the content is remembered across a restart
            await engine.submit(sub("a", retry.member, delta=retry.delta + 1,
                                    event_id="a-10005"))
        await engine.close(snapshot=False)
        return live, recovered, replayed_answer, answer

    live, recovered, before, after = run(scenario())
    assert recovered == live
    assert after == before and after["duplicate"]


def test_torn_final_record_is_truncated_with_a_warning(tmp_path, caplog):
    clock = FakeClock()

    async def write():
        engine = await _open(tmp_path, clock)
        await _fill(engine, range(0, 100))
        before_last = engine.digest()
        await _fill(engine, range(100, 101))
        await engine.close(snapshot=False)
        return before_last

    before_last = run(write())
    last = _segments(tmp_path)[-1]
    with open(last, "r+b") as handle:
        handle.truncate(last.stat().st_size - 5)

    async def reopen():
        engine = await _open(tmp_path, clock)
        digest = engine.digest()
        await engine.close(snapshot=False)
        return digest

    with caplog.at_level(logging.WARNING):
        assert run(reopen()) == before_last
    assert any("bytes" in r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)


def test_mid_log_corruption_stops_start_and_repair_keeps_the_prefix(tmp_path):
    clock = FakeClock()

    async def write():
        engine = await _open(tmp_path, clock)
        await _fill(engine, range(0, 200))
        await engine.close(snapshot=False)

    run(write())
    segment = _segments(tmp_path)[-1]
    data = bytearray(segment.read_bytes())
    middle = len(data) // 2
    data[middle] ^= 0xFF
    segment.write_bytes(bytes(data))

    with pytest.raises(Exception, match=str(segment.name)) as failure:
        run(_open(tmp_path, clock))
    assert "offset" in str(failure.value) or "byte" in str(failure.value)

    async def repaired():
        engine = await _open(tmp_path, clock, repair=True)
        standing = {m: engine.standing("b", m) for m in ("m0", "m1")}
        total = sum(e["score"] for e in engine.top("b", limit=1000)["entries"])
        await engine.close(snapshot=False)
        return standing, total

    standing, total = run(repaired())
    full_total = sum(1 + i % 3 for i in range(200))
    assert 0 < total < full_total
    assert standing["m0"] is not None
    assert any((tmp_path / "wal").glob("corrupt-*"))


@pytest.mark.slow
@pytest.mark.parametrize("fsync", ["everysec", "always"])
def test_sigkill_never_loses_an_acknowledged_event(tmp_path, fsync):
    data_dir = tmp_path / "data"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE.parent / "src"), os.environ.get("PYTHONPATH", "")]),
    }
    rng = random.Random(7)
    acked: dict[str, int] = {}
    cycles = 20 if fsync == "everysec" else 10
    for cycle in range(cycles):
        child = subprocess.Popen(
            [sys.executable, str(HERE / "crash_child.py"), str(data_dir), str(cycle), fsync],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        assert child.stdout.readline().strip() == "READY", child.stderr.read()
        deadline = time.monotonic() + rng.uniform(0.05, 0.6)
        lines = []
        while time.monotonic() < deadline:
            line = child.stdout.readline()
            if not line:
                break
            lines.append(line)
        child.send_signal(signal.SIGKILL)
        rest, _ = child.communicate(timeout=30)
        lines.extend(rest.splitlines())  # acknowledged before the kill landed
        for line in lines:
            parts = line.split()
            if len(parts) == 3 and parts[0] == "ACK":
                acked[parts[1]] = acked.get(parts[1], 0) + 1
    assert len(acked) > 1000

    async def check():
        engine = await Engine.open(engine_config(data_dir, fsync=fsync))
        try:
            index_scores = {
                e["member"]: e["score"]
                for e in engine.top("crash", limit=1000, offset=0)["entries"]
            }
            missing = [eid for eid in acked if engine.standing("crash", eid) is None]
            doubled = [
                eid for eid in acked if (s := engine.standing("crash", eid)) and s["score"] != 1.0
            ]
            total = engine.board_info("crash")["members"]["all"]
            over = [m for m, score in index_scores.items() if score != 1.0]
            return missing, doubled, total, over
        finally:
            await engine.close()

    missing, doubled, total, over = run(check())
    assert missing == [], f"{len(missing)} acknowledged events lost"
    assert doubled == [], f"{len(doubled)} events applied twice"
    assert over == []
    assert total >= len(acked)


@pytest.mark.parametrize("old_kind", ["dedupe", "event_id_columns", "event_ids"])
def test_event_ids_of_a_snapshot_in_an_older_format_are_still_remembered(tmp_path, old_kind):
    """Snapshots written before event ids were stored as a log load the
    same: 'event_id_columns' (packed entries, as columns), 'event_ids' (a
    map of them) and, older still, 'dedupe' (``[event_id, expires_at,
    result]`` entries).  They are made from the log chunks of a snapshot
    the code before the compact store wrote (test_event_id_store_switch)."""
    fixture = HERE / "data" / "event-ids-2026-11"
    shutil.copytree(fixture, tmp_path, dirs_exist_ok=True)
    clock = FakeClock(json.loads((fixture / "answers.json").read_text())["clock"])

    async def scenario():
        engine = await Engine.open(engine_config(tmp_path), clock=clock)
        first = await engine.submit(sub("b", "m1", delta=1.5, event_id="e1"))
        assert first["duplicate"]
        await engine.close(snapshot=False)

        lsn, sections = engine.snapshots.latest()
        old_format = []
        for payload in sections:
            section = records.decode(payload)
            if section[0] == "event_id_log":
                pairs = idstore.read_old_chunk(section[2])
                if old_kind == "dedupe":
                    section = ["dedupe", section[1], [
                        [event_id, expires_at, list(result)] for event_id, (expires_at, result)
                        in ((e, idstore.unpack_old_entry(p)) for e, p in pairs)]]
                elif old_kind == "event_ids":
                    section = ["event_ids", section[1], dict(pairs)]
                else:
                    section = ["event_id_columns", section[1], [e for e, _ in pairs],
                               [p for _, p in pairs]]
            old_format.append(records.encode(list(section)))
        assert any(records.decode(p)[0] == old_kind for p in old_format)
        for path in (tmp_path / "snapshots").iterdir():
            path.unlink()
        writer = engine.snapshots.begin(lsn)
        for payload in old_format:
            writer.add(payload)
        writer.commit()

        engine = await Engine.open(engine_config(tmp_path), clock=clock)
        again = await engine.submit(sub("b", "m1", delta=1.5, event_id="e1"))
        assert again == first
        digest = engine.digest()
        with pytest.raises(EventConflict):
            await engine.submit(sub("b", "m1", delta=2.5, event_id="e1"))
        assert engine.digest() == digest
        await engine.close(snapshot=False)

    run(scenario())


def test_writes_during_a_snapshot_survive_a_restart(tmp_path, monkeypatch):
    """A board takes writes again while its labels and event ids are being
    written: a restart from that snapshot and the WAL tail must give the
    same state and remember every event id, old and new."""
    # Many steps, so that writes interleave.
    monkeypatch.setattr(engine_module, "SNAPSHOT_CHUNK", 7)
    monkeypatch.setattr(engine_module, "SNAPSHOT_LOG_BYTES", 500)
    clock = FakeClock()

    async def scenario():
        engine = await Engine.open(engine_config(tmp_path), clock=clock)
        await engine.put_board("b", {"policy": "sum"})
        await engine.submit_many([sub("b", f"m{i}", delta=i, event_id=f"old{i}", label=f"L{i}")
                                  for i in range(100)])
        written_during = []
        interleaved = []

        async def writer():
            for i in range(60):
                answer = await engine.submit(sub("b", f"m{i % 30}", delta=1, event_id=f"new{i}",
                                                 label=f"N{i}"))
                written_during.append(answer)
                interleaved.append(not snapshotting.done())
                await asyncio.sleep(0)

        snapshotting = asyncio.create_task(engine.snapshot())
        await asyncio.gather(snapshotting, writer())
        assert len(written_during) == 60 and any(interleaved)
        digest = engine.digest()
        labels = dict(engine.boards["b"].labels)
        await engine.close(snapshot=False)
        # Chunk by chunk: labels as columns, event ids as a log.
        kinds = [records.decode(p)[0] for p in engine.snapshots.latest()[1]]
        assert kinds.count("label_columns") > 1 and kinds.count("event_id_store") > 1
        assert not {"labels", "event_ids", "event_id_columns", "event_id_log"} & set(kinds)

        engine = await Engine.open(engine_config(tmp_path), clock=clock)
        assert engine.digest() == digest
        assert engine.boards["b"].labels == labels
        again = await engine.submit(sub("b", "m3", delta=1, event_id="new3", label="N3"))
        assert again == {**written_during[3], "duplicate": True}
        old = await engine.submit(sub("b", "m5", delta=5, event_id="old5", label="L5"))
        assert old["duplicate"] and old["member"] == "m5"
        await engine.close(snapshot=False)

    run(scenario())


def test_labels_and_event_ids_of_a_snapshot_in_older_map_sections_load_the_same(tmp_path):
    """Snapshots written before a board's labels and event ids went into
    columns held them as maps (in chunks of many sections)."""
    clock = FakeClock()

    async def scenario():
        engine = await Engine.open(engine_config(tmp_path), clock=clock)
        await engine.put_board("b", {"policy": "sum"})
        answers = await engine.submit_many([sub("b", f"m{i}", delta=i, event_id=f"e{i}",
                                                label=f"L{i}") for i in range(10)])
        await engine.snapshot()
        await engine.close(snapshot=False)
        digest, labels = engine.digest(), dict(engine.boards["b"].labels)

        lsn, sections = engine.snapshots.latest()
        writer = engine.snapshots.begin(lsn)
        older = {"label_columns": "labels", "event_id_columns": "event_ids"}
        for payload in sections:
            kind, *rest = records.decode(payload)
            if kind not in older:
                writer.add(payload)
                continue
            items = list(zip(rest[1], rest[2], strict=True))
            for start in range(0, len(items), 3):
                writer.add(records.encode([older[kind], rest[0], dict(items[start:start + 3])]))
        writer.commit()

        engine = await Engine.open(engine_config(tmp_path), clock=clock)
        assert engine.digest() == digest and engine.boards["b"].labels == labels
        again = await engine.submit_many([sub("b", f"m{i}", delta=i, event_id=f"e{i}",
                                              label=f"L{i}") for i in range(10)])
        assert again == [{**answer, "duplicate": True} for answer in answers]
        await engine.close(snapshot=False)

    run(scenario())
