"""Board deadlines in the engine and over REST (rankd.engine.expiry): a
deadline is logged, kept in snapshots and replayed; the deletion once it
passes is a logged record of its own; an expired board reads as absent,
and a write to it makes a new board.  (RESP's commands are compared with
Redis's in test_resp_expiry.py; a cluster's nodes in
cluster/test_cluster_expiry.py.)"""

from __future__ import annotations

import asyncio

import pytest

from daemon import Daemon
from engine_helpers import FakeClock, engine_config, run, sub, with_engine
from rankd.engine import records
from rankd.engine.engine import Engine
from rankd.engine.errors import InvalidInput, NotFound
from rankd.engine.expiry import IF_LATER, IF_NONE, IF_SET, IF_SOONER, Deadlines, allowed


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def _ms(clock: FakeClock, seconds: float = 0.0) -> int:
    return round((clock.now + seconds) * 1000)


def _logged(engine: Engine) -> list[tuple]:
    """The records of an open engine's local log, decoded, in order."""
    return [records.decode(payload)
            for batch in engine.wal.iter_batches(engine.wal.first_lsn or 1, 1000)
            for _, payload in batch]


def test_conditions_are_redis_s():
    """NX, XX, GT, LT as expireGenericCommand decides them (no deadline is
    infinitely far: GT never takes it, LT always does)."""
    assert allowed(None, 5, 0) and allowed(7, 5, 0)
    assert allowed(None, 5, IF_NONE) and not allowed(7, 5, IF_NONE)
    assert not allowed(None, 5, IF_SET) and allowed(7, 5, IF_SET)
    assert not allowed(None, 5, IF_LATER) and allowed(4, 5, IF_LATER)
    assert not allowed(5, 5, IF_LATER) and not allowed(6, 5, IF_LATER)
    assert allowed(None, 5, IF_SOONER) and allowed(6, 5, IF_SOONER)
    assert not allowed(5, 5, IF_SOONER) and not allowed(4, 5, IF_SOONER | IF_SET)
    assert not allowed(None, None, 0) and allowed(3, None, 0)  # PERSIST


def test_deadlines_come_due_in_order_without_scanning_the_rest():
    deadlines = Deadlines()
    now = 1_000_000
    for n in range(1000):
        deadlines.set(f"b{n}", now + 10_000 + n * 1000, None, now)
    current = {f"b{n}": now + 10_000 + n * 1000 for n in range(1000)}
    deadlines.set("b5", None, current.pop("b5"), now)  # cleared: its entry is stale
    assert deadlines.next_ms() == now + 10_000 - 2_000
    assert deadlines.due(now + 8_000, current.get) == []
    assert deadlines.expiring == {"b0"}  # within the margin: off the native paths
    due = deadlines.due(now + 16_000, current.get)
    assert [name for name, _ in due] == ["b0", "b1", "b2", "b3", "b4", "b6"]
    assert deadlines.expiring >= {"b7", "b8"} and "b5" not in deadlines.expiring


def test_stale_deadlines_are_compacted_from_the_entries_alone():
    """A deadline set again and again leaves stale entries; once they
    outnumber the live ones they are dropped, without looking at boards."""
    deadlines = Deadlines()
    now = 1_000_000
    current = {}
    for n in range(3000):
        before = current.get("b")
        current["b"] = now + 10_000 + n
        deadlines.set("b", current["b"], before, now)
    deadlines.compact(current.get)
    assert len(deadlines._heap) + len(deadlines._soon) == 1 and deadlines.live == 1
    assert deadlines.due(now + 20_000, current.get) == [("b", now + 12_999)]


def test_a_deadline_is_logged_snapshotted_and_replayed(tmp_path, clock):
    """A pending deadline survives a restart from the log alone and from a
    snapshot; one that passed while the engine was down reads as absent
    at once after the restart, and the engine deletes the board with a
    logged EXPIRED record."""
    data = tmp_path / "data"

    async def fill(engine: Engine):
        await engine.put_board("soon", {"policy": "sum"})
        await engine.put_board("later", {"policy": "sum"})
        await engine.put_board("kept", {"policy": "sum"})
        await engine.submit_many([sub(b, "a", delta=1) for b in ("soon", "later", "kept")])
        assert await engine.expire("soon", _ms(clock, 60))
        assert await engine.expire("later", _ms(clock, 3600))
        assert await engine.expire("kept", _ms(clock, 60))
        assert await engine.expire("kept", None)
        return engine.digest()

    async def reopen(engine: Engine):
        assert engine.deadline("soon") == _ms(clock, 60)
        assert engine.deadline("later") == _ms(clock, 3600)
        assert engine.deadline("kept") is None
        return engine.digest()

    async def fill_without_snapshot(engine: Engine):
        digest = await fill(engine)
        await engine.close(snapshot=False)
        return digest

    before = run(with_engine(data, clock, fill_without_snapshot))
    assert not (data / "snapshots").exists() or not any((data / "snapshots").iterdir())
    assert run(with_engine(data, clock, reopen)) == before  # from the log alone
    assert run(with_engine(data, clock, reopen)) == before  # from the snapshot closing took

    clock.advance(120)  # "soon" expires while the engine is down

    async def after(engine: Engine):
        with pytest.raises(NotFound):
            engine.deadline("soon")
        assert engine.live_board("soon") is None
        assert "soon" not in engine.live_names()
        for _ in range(50):  # the expiry task deletes it, with a record
            if "soon" not in engine.boards:
                break
            await asyncio.sleep(0.01)
        assert "soon" not in engine.boards
        assert engine.deadline("later") == _ms(clock, 3600 - 120)
        expired = [r for r in _logged(engine) if r[0] == records.EXPIRED]
        assert [(r[1], r[2]) for r in expired] == [("soon", _ms(clock, 60 - 120))]

    run(with_engine(data, clock, after))

    async def again(engine: Engine):
        assert "soon" not in engine.boards and engine.live_board("later") is not None
    run(with_engine(data, clock, again))


def test_a_write_to_an_expired_board_finds_it_gone(tmp_path, clock):
    """Before the expiry task runs: a submission answers not_found, and a
    PUT makes a new board (empty, no deadline); the deletion is logged
    first, so a restart replays the same."""
    data = tmp_path / "data"

    async def body(engine: Engine):
        for task in engine._tasks:  # no active expiry: only what the writes do
            if task.get_name() == "rankd-expiry":
                task.cancel()
        await engine.put_board("b", {"policy": "sum"})
        await engine.submit(sub("b", "a", delta=5))
        assert await engine.expire("b", _ms(clock, 10))
        clock.advance(11)
        answer = (await engine.submit_many([sub("b", "a", delta=1)]))[0]
        assert isinstance(answer, NotFound), answer
        assert "b" not in engine.boards  # the write deleted it, logged
        await engine.put_board("b", {"policy": "sum"})
        assert engine.top("b")["total"] == 0 and engine.deadline("b") is None
        assert await engine.expire("b", _ms(clock, 10))
        clock.advance(11)
        _, created = await engine.put_board("b", {"policy": "sum"})
        assert created and engine.top("b")["total"] == 0
        kinds = [r[0] for r in _logged(engine) if r[1] == "b"]
        assert kinds == [records.BOARD_PUT, records.SUBMIT, records.EXPIRE, records.EXPIRED,
                         records.BOARD_PUT, records.EXPIRE, records.EXPIRED, records.BOARD_PUT]
        return engine.digest()

    digest = run(with_engine(data, clock, body))

    async def reopen(engine: Engine):
        return engine.digest()
    assert run(with_engine(data, clock, reopen)) == digest


def test_expire_in_the_past_deletes_at_once_and_conditions_hold(tmp_path, clock):
    async def body(engine: Engine):
        await engine.put_board("b", {})
        assert not await engine.expire("b", _ms(clock, 100), IF_SET)
        assert await engine.expire("b", _ms(clock, 100), IF_NONE)
        assert not await engine.expire("b", _ms(clock, 50), IF_LATER)
        assert await engine.expire("b", _ms(clock, 50), IF_SOONER)
        assert engine.deadline("b") == _ms(clock, 50)
        assert await engine.expire("b", _ms(clock, -1))
        assert "b" not in engine.boards
        with pytest.raises(NotFound):
            await engine.expire("b", _ms(clock, 100))
    run(with_engine(tmp_path / "data", clock, body))


def test_the_expiry_task_deletes_due_boards_in_steps(tmp_path):
    """Many boards due at once: deleted by the engine's task (real time),
    a step of boards per log append."""
    async def body(engine: Engine):
        for n in range(300):
            await engine.put_board(f"b{n}", {})
        now_ms = engine._now_ms()
        # (Due 1.5 s on, within the margin: setting 300 deadlines took over
        # 150 ms on a loaded test run, and boards were gone before counted.)
        await asyncio.gather(*(engine.expire(f"b{n}", now_ms + 1_500) for n in range(300)))
        assert len(engine.deadlines.expiring) == 300  # all within the margin
        for _ in range(400):
            if not engine.boards:
                break
            await asyncio.sleep(0.02)
        assert not engine.boards and not engine.deadlines.expiring
    engine = run(_open_and(tmp_path / "data", body))
    assert engine is None


async def _open_and(data_dir, body):
    engine = await Engine.open(engine_config(data_dir))
    try:
        await body(engine)
    finally:
        await engine.close()


def test_rest_config_shows_and_sets_the_deadline(tmp_path):
    """``expires_at_ms`` in a board's config: shown (null without), set by
    PUT and PATCH, cleared by null (or a PUT without it), refused when
    not a future time in ms; RESP's TTL reads the same deadline."""
    from respclient import RawClient

    daemon = Daemon(tmp_path / "data", "--tcp-port", "0", "--fsync", "no")
    daemon.start()
    try:
        status, body = daemon.request("PUT", "/v1/boards/daily", {"policy": "sum"})
        assert status == 201 and body["config"]["expires_at_ms"] is None, body
        status, now = daemon.request("GET", "/v1/boards/daily")
        deadline = int(now["updated_at"] * 1000) + 3_600_000
        status, body = daemon.request("PATCH", "/v1/boards/daily",
                                      {"expires_at_ms": deadline})
        assert status == 200 and body["config"]["expires_at_ms"] == deadline, body
        assert body["config"]["policy"] == "sum"
        status, body = daemon.request("GET", "/v1/boards/daily")
        assert body["config"]["expires_at_ms"] == deadline
        with RawClient(daemon.resp_port) as client:
            assert client.call("PEXPIRETIME", "daily") == b":%d\r\n" % deadline
            ttl = int(client.call("TTL", "daily")[1:])
            assert 3590 <= ttl <= 3600
            assert client.call("EXPIRE", "daily", "7200") == b":1\r\n"
        status, body = daemon.request("GET", "/v1/boards/daily")
        assert body["config"]["expires_at_ms"] > deadline
        # Round trip: the config GET shows is one PUT takes back.
        config = body["config"]
        status, body = daemon.request("PUT", "/v1/boards/daily", config)
        assert status == 200 and body["config"] == config, body
        status, body = daemon.request("PATCH", "/v1/boards/daily", {"expires_at_ms": None})
        assert status == 200 and body["config"]["expires_at_ms"] is None
        daemon.request("PATCH", "/v1/boards/daily", {"expires_at_ms": deadline})
        status, body = daemon.request("PUT", "/v1/boards/daily", {"policy": "sum"})
        assert status == 200 and body["config"]["expires_at_ms"] is None  # the whole config
        for bad in (1, -5, "soon", 1.5, True, 10**17):
            status, body = daemon.request("PATCH", "/v1/boards/daily", {"expires_at_ms": bad})
            assert status == 422 and "expires_at_ms" in body["error"]["message"], (bad, body)
        # One that passes: the board is gone for REST as for RESP.
        status, body = daemon.request("PATCH", "/v1/boards/daily",
                                      {"expires_at_ms": int(now["updated_at"] * 1000) + 1500})
        assert status == 200, body
        import time
        time.sleep(1.8)
        assert daemon.request("GET", "/v1/boards/daily")[0] == 404
        assert daemon.request("POST", "/v1/boards/daily/scores",
                              {"member": "a", "delta": 1})[0] == 404
        assert "daily" not in [b["name"] for b in daemon.request("GET", "/v1/boards")[1]["boards"]]
    finally:
        daemon.stop()


def test_put_refuses_a_past_deadline(tmp_path, clock):
    async def body(engine: Engine):
        with pytest.raises(InvalidInput):
            await engine.put_board("b", {"expires_at_ms": _ms(clock, -1)})
        assert "b" not in engine.boards
    run(with_engine(tmp_path / "data", clock, body))


def test_deadlines_and_deletions_are_shipped_and_restored(tmp_path, pg_dsn, clock):
    """With --postgres-dsn the deadline (kind ``expire``) and the deletion
    (``expired``) are in the event history, and a restore from Postgres
    rebuilds the same state: the pending deadline kept, the board gone."""
    import asyncpg

    from rankd.engine import postgres

    async def live():
        engine = await Engine.open(engine_config(tmp_path / "live", postgres_dsn=pg_dsn),
                                   clock=clock)
        try:
            for name in ("gone", "pending"):
                await engine.put_board(name, {"policy": "sum"})
                await engine.submit(sub(name, "a", delta=1))
            assert await engine.expire("gone", _ms(clock, 10))
            assert await engine.expire("pending", _ms(clock, 3600))
            clock.advance(11)
            await engine.expire_due()
            assert sorted(engine.boards) == ["pending"]
            await engine.shipper.wait_shipped(engine.wal.last_lsn)
            conn = await asyncpg.connect(pg_dsn)
            try:
                kinds = [tuple(row) for row in await conn.fetch(
                    "SELECT kind, board FROM rankd_events WHERE kind LIKE 'expire%' "
                    "ORDER BY lsn")]
            finally:
                await conn.close()
            return engine.digest(), kinds
        finally:
            await engine.close()

    digest, kinds = run(live())
    assert kinds == [("expire", "gone"), ("expire", "pending"), ("expired", "gone")]
    run(postgres.restore(pg_dsn, tmp_path / "restored", Engine.rebuild))

    async def restored(engine: Engine):
        assert engine.deadline("pending") == _ms(clock, 3600 - 11)
        return engine.digest()
    assert run(with_engine(tmp_path / "restored", clock, restored)) == digest
