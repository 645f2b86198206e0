"""Postgres: shipping the WAL exactly once, surviving Postgres outages,
restoring a data dir from Postgres alone, archives and migrations."""

from __future__ import annotations

import asyncio
import functools
import time

import asyncpg
import pytest

from engine_helpers import SUNDAY, FakeClock, engine_config, run, sub
from rankd.engine import postgres
from rankd.engine.engine import Engine


async def _events(dsn: str) -> tuple[int, int, int, int]:
    """(rows, distinct lsns, min lsn, max lsn) in rankd_events."""
    conn = await asyncpg.connect(dsn)
    try:
        row = await conn.fetchrow(
            "SELECT count(*), count(DISTINCT lsn), coalesce(min(lsn), 0), coalesce(max(lsn), 0)"
            " FROM rankd_events")
        shipped = await conn.fetchval("SELECT shipped_lsn FROM rankd_shipper")
    finally:
        await conn.close()
    assert shipped == row[3]
    return tuple(row)


async def _open(data_dir, dsn, clock=None, **overrides) -> Engine:
    return await Engine.open(engine_config(data_dir, postgres_dsn=dsn, **overrides),
                             clock=clock or FakeClock())


async def _fill(engine: Engine, start: int, stop: int, board: str = "b") -> None:
    if board not in engine.boards:
        await engine.put_board(board, {"policy": "sum", "windows": ["all", "daily"]})
    for chunk in range(start, stop, 500):
        await engine.submit_many([
            sub(board, f"m{i % 97}", delta=1 + i % 5, event_id=f"{board}-{i}",
                label=f"Player {i % 97}")
            for i in range(chunk, min(chunk + 500, stop))
        ])


def test_every_record_is_shipped_once_with_queryable_columns(tmp_path, pg_dsn):
    async def scenario():
        engine = await _open(tmp_path, pg_dsn)
        try:
            await _fill(engine, 0, 3000)
            await engine.remove_member("b", "m3")
            await engine.shipper.wait_shipped(engine.wal.last_lsn)
            last = engine.wal.last_lsn
            status = engine.shipper.status()
        finally:
            await engine.close()
        conn = await asyncpg.connect(pg_dsn)
        try:
            kinds = dict(await conn.fetch("SELECT kind, count(*) FROM rankd_events GROUP BY 1"))
            sample = await conn.fetchrow(
                "SELECT board, member, value FROM rankd_events WHERE kind = 'submit' "
                "ORDER BY lsn LIMIT 1")
        finally:
            await conn.close()
        return last, status, kinds, sample, await _events(pg_dsn)

    last, status, kinds, sample, events = run(scenario())
    assert events == (last, last, 1, last)
    assert status["connected"] and status["lag_records"] == 0
    assert kinds == {"board_put": 1, "submit": 3000, "remove": 1}
    assert tuple(sample) == ("b", "m0", 1.0)


def test_exactly_once_across_shipper_and_engine_restarts(tmp_path, pg_dsn):
    async def scenario():
        engine = await _open(tmp_path, pg_dsn)
        await _fill(engine, 0, 1000)
        await engine.shipper.wait_shipped(engine.wal.last_lsn)
        await engine.shipper.stop()  # the shipper dies; writes go on
        await _fill(engine, 1000, 2500)
        await engine.shipper.start()
        await engine.shipper.wait_shipped(engine.wal.last_lsn)
        await engine.shipper.stop()
        await _fill(engine, 2500, 3000)  # not shipped before the engine stops
        await engine.close(snapshot=True)
        engine = await _open(tmp_path, pg_dsn)  # resumes from Postgres' shipped position
        await _fill(engine, 3000, 3200)
        await engine.shipper.wait_shipped(engine.wal.last_lsn)
        last = engine.wal.last_lsn
        await engine.close()
        return last, await _events(pg_dsn)

    last, events = run(scenario())
    assert last == 1 + 3200
    assert events == (last, last, 1, last)


def test_postgres_outage_never_blocks_writes_and_shipping_catches_up(tmp_path, pg_cluster):
    dsn = pg_cluster.admin_dsn

    async def scenario():
        engine = await _open(tmp_path, dsn, segment_bytes=16 * 1024)
        await _fill(engine, 0, 500)
        await engine.shipper.wait_shipped(engine.wal.last_lsn)
        pg_cluster.stop("immediate")
        await asyncio.sleep(0.2)
        # Writes are acknowledged at full speed while Postgres is down...
        await _fill(engine, 500, 4000)
        for _ in range(200):  # the shipper notices on its next attempt
            if not engine.shipper.status()["connected"]:
                break
            await asyncio.sleep(0.05)
        status = engine.shipper.status()
        # ...and a snapshot meanwhile must keep the unshipped segments.
        segments_before = len(engine.wal.segments())
        await engine.snapshot()
        kept = engine.wal.segments()[0][0] <= engine.shipper.shipped_lsn + 1
        segments_after = len(engine.wal.segments())
        pg_cluster.start()
        await engine.shipper.wait_shipped(engine.wal.last_lsn, timeout=60)
        last = engine.wal.last_lsn
        await engine.snapshot()  # now everything is shipped: segments can go
        segments_final = len(engine.wal.segments())
        await engine.close()
        return status, kept, segments_before, segments_after, segments_final, last

    status, kept, _, after, final, last = run(scenario())
    assert not status["connected"] and status["lag_records"] > 0
    assert status["last_error"]
    assert kept  # only segments already shipped before the outage may go
    assert after > 1
    assert final < after
    assert run(_events(dsn)) == (last, last, 1, last)


def test_restore_from_postgres_rebuilds_the_live_state(tmp_path, pg_dsn):
    clock = FakeClock()

    async def live():
        engine = await _open(tmp_path / "live", pg_dsn, clock)
        await _fill(engine, 0, 2000)
        await engine.put_board("golf", {"policy": "best", "order": "asc",
                                        "windows": ["all", "weekly"], "tie_break": "member"})
        await engine.submit_many([sub("golf", f"g{i}", score=60 + i % 17) for i in range(300)])
        await engine.snapshot()  # compaction must not matter: Postgres has everything
        await engine.remove_member("golf", "g5")
        await engine.put_board("tmp", {})
        await engine.submit(sub("tmp", "x", score=1))
        await engine.delete_board("tmp")
        await engine.shipper.wait_shipped(engine.wal.last_lsn)
        digest = engine.digest()
        await engine.close()
        return digest

    live_digest = run(live())
    restored_dir = tmp_path / "restored"
    # (Rebuilt as of the live engine's clock: its start retires periods as of
    # then.)
    last = run(postgres.restore(pg_dsn, restored_dir,
                                functools.partial(Engine.rebuild, clock=clock)))

    async def restored():
        engine = await Engine.open(engine_config(restored_dir), clock=clock)
        try:
            again = await engine.submit(sub("b", "m1", delta=2, event_id="b-1",
                                            label="Player 1"))
            return engine.digest(), engine.wal.last_lsn, again, sorted(engine.boards)
        finally:
            await engine.close()

    digest, restored_last, again, boards = run(restored())
    assert digest == live_digest
    assert restored_last == last
    assert again["duplicate"] is True
    assert boards == ["b", "golf"]


def test_restore_refuses_a_used_data_dir_and_an_empty_database(tmp_path, pg_dsn):
    async def used():
        engine = await _open(tmp_path / "live", None)
        await engine.put_board("b", {})
        await engine.close()

    run(used())
    with pytest.raises(RuntimeError, match="not empty"):
        run(postgres.restore(pg_dsn, tmp_path / "live", Engine.rebuild))
    with pytest.raises(RuntimeError, match="no rankd events"):
        run(postgres.restore(pg_dsn, tmp_path / "new", Engine.rebuild))


def test_closed_periods_are_archived_in_postgres(tmp_path, pg_dsn):
    clock = FakeClock(SUNDAY + 3600)

    async def scenario():
        engine = await _open(tmp_path, pg_dsn, clock)
        await engine.put_board("d", {"policy": "best", "windows": ["daily"], "retain": 1})
        await engine.submit_many([sub("d", f"p{i}", score=i, label=f"P{i}") for i in range(5)])
        clock.advance(3 * 86400)
        await engine.housekeeping()
        await engine.close()
        return await postgres.fetch_archive(pg_dsn, "d", "daily", "2026-11-22")

    archived = run(scenario())
    assert [(e["rank"], e["member"], e["score"], e["label"]) for e in archived] == [
        (1, "p4", 4.0, "P4"), (2, "p3", 3.0, "P3"), (3, "p2", 2.0, "P2"),
        (4, "p1", 1.0, "P1"), (5, "p0", 0.0, "P0")]


def test_migrations_are_idempotent_and_a_newer_schema_is_refused(pg_dsn):
    async def scenario():
        conn = await asyncpg.connect(pg_dsn)
        try:
            first = await postgres.migrate(conn)
            second = await postgres.migrate(conn)
            await conn.execute("INSERT INTO rankd_schema VALUES ($1)",
                               postgres.SCHEMA_VERSION + 1)
            with pytest.raises(RuntimeError, match="newer"):
                await postgres.migrate(conn)
        finally:
            await conn.close()
        return first, second

    assert run(scenario()) == (0, postgres.SCHEMA_VERSION)


def test_restore_command_line(tmp_path, pg_dsn):
    from rankd.cli import main

    async def live():
        # The real clock, as the command line's restore and the reopened
        # engine below have: they retire closed periods as of now, and a
        # fake clock's periods are long past.
        engine = await _open(tmp_path / "live", pg_dsn, clock=time.time)
        await _fill(engine, 0, 300)
        await engine.shipper.wait_shipped(engine.wal.last_lsn)
        digest = engine.digest()
        await engine.close()
        return digest

    digest = run(live())
    assert main(["restore", "--from-postgres", pg_dsn, "--data-dir",
                 str(tmp_path / "new")]) == 0
    assert main(["restore", "--from-postgres", pg_dsn, "--data-dir",
                 str(tmp_path / "new")]) == 1  # not into a used data dir

    async def reopened():
        engine = await Engine.open(engine_config(tmp_path / "new"))
        try:
            return engine.digest()
        finally:
            await engine.close()

    assert run(reopened()) == digest


def test_records_postgres_holds_beyond_a_damaged_local_log_are_taken_back(tmp_path, pg_dsn):
    """A disk that lost durable records (an operator's restore from an old
    copy, a bad sector cut away with repair): Postgres still has them, and
    the node takes them back before it takes writes, so no position is
    ever reused for another event."""
    from rankd.engine.frames import scan

    async def scenario():
        engine = await _open(tmp_path, pg_dsn, fsync="always")
        await _fill(engine, 0, 1000)
        await engine.shipper.wait_shipped(engine.wal.last_lsn)
        before, last = engine.digest(), engine.wal.last_lsn
        await engine.close(snapshot=False)
        (segment,) = sorted((tmp_path / "wal").glob("*.log"))
        found = scan(segment.read_bytes(), 1, upto_lsn=last - 300)
        segment.write_bytes(segment.read_bytes()[:found.end])  # the last 300 records gone

        engine = await _open(tmp_path, pg_dsn, fsync="always")
        try:
            after, taken_back_to = engine.digest(), engine.wal.last_lsn
            await engine.submit(sub("b", "newcomer", delta=1, event_id="new"))
            await engine.shipper.wait_shipped(engine.wal.last_lsn)
            stalled = engine.shipper.stalled
        finally:
            await engine.close()
        return before, after, last, taken_back_to, stalled, await _events(pg_dsn)

    before, after, last, taken_back_to, stalled, events = run(scenario())
    assert after == before and taken_back_to == last and stalled is None
    assert events == (last + 1, last + 1, 1, last + 1)


def test_a_history_that_differs_from_postgres_stalls_shipping_loudly(tmp_path, pg_dsn):
    async def scenario():
        engine = await _open(tmp_path, pg_dsn)
        await _fill(engine, 0, 200)
        await engine.shipper.wait_shipped(engine.wal.last_lsn)
        shipped = engine.shipper.shipped_lsn
        await engine.close(snapshot=False)
        conn = await asyncpg.connect(pg_dsn)
        try:
            await conn.execute("UPDATE rankd_events SET payload = '\\x00'::bytea WHERE lsn = $1",
                               shipped)
        finally:
            await conn.close()
        engine = await _open(tmp_path, pg_dsn)
        try:
            await _fill(engine, 200, 300)
            for _ in range(200):
                if engine.shipper.stalled:
                    break
                await asyncio.sleep(0.02)
            return shipped, engine.shipper.status(), await _events(pg_dsn)
        finally:
            await engine.close()

    shipped, status, events = run(scenario())
    assert "differs between Postgres and the local log" in status["stalled"]
    assert not status["connected"] and status["lag_records"] > 0
    assert events[3] == shipped  # nothing of the other history was shipped after it


def test_a_record_postgres_refuses_is_set_aside_and_shipping_goes_on(tmp_path, pg_dsn):
    """A NUL in a member (accepted before names refused control characters)
    once stopped shipping for good: Postgres cannot store it in text."""
    from rankd.engine import records

    async def scenario():
        engine = await _open(tmp_path, None)
        await _fill(engine, 0, 300)
        await engine._write([[records.REMOVE, "b", "bad\x00member", engine._now_ms()]])
        poisoned = engine.wal.last_lsn
        await _fill(engine, 300, 600)
        before, last = engine.digest(), engine.wal.last_lsn
        await engine.close(snapshot=False)

        engine = await _open(tmp_path, pg_dsn)
        try:
            await engine.shipper.wait_shipped(last, timeout=30)
            status, dead = engine.shipper.status(), engine.shipper.dead_letters
        finally:
            await engine.close()
        conn = await asyncpg.connect(pg_dsn)
        try:
            letters = await conn.fetch("SELECT lsn, error FROM rankd_dead_letters")
            row = await conn.fetchrow("SELECT kind, board, member, payload FROM rankd_events "
                                      "WHERE lsn = $1", poisoned)
        finally:
            await conn.close()
        restored = tmp_path.parent / (tmp_path.name + "-restored")
        # (Rebuilt as of the fake clock the engine ran on: it retires closed
        # periods as of its clock.)
        await postgres.restore(pg_dsn, restored,
                               lambda data_dir: Engine.rebuild(data_dir, clock=FakeClock()))
        engine = await _open(restored, None)
        try:
            after = engine.digest()
        finally:
            await engine.close()
        return poisoned, last, before, after, status, dead, letters, row, await _events(pg_dsn)

    poisoned, last, before, after, status, dead, letters, row, events = run(scenario())
    assert events == (last, last, 1, last) and status["stalled"] is None and dead == 1
    assert [letter["lsn"] for letter in letters] == [poisoned]
    assert "CharacterNotInRepertoire" in letters[0]["error"] or "0x00" in letters[0]["error"]
    assert (row["kind"], row["board"], row["member"]) == ("refused", "", None)
    assert records.decode(bytes(row["payload"]))[2] == "bad\x00member"  # kept whole
    assert after == before  # and restore still replays it
