"""``Engine.transaction``: many writes applied in one step and logged as one
record (``records.TRANSACTION`` after ``n - 1`` ``TX_SLOT`` placeholders),
so recovery finds a transaction whole or not at all."""

from __future__ import annotations

from pathlib import Path

from engine_helpers import FakeClock, engine_config, run, sub, with_engine
from rankd.engine import records
from rankd.engine.engine import Engine
from rankd.engine.wal import WriteAheadLog
from rankd.frontends.resp.sorted_sets import REDIS_BOARD_DICT

BOARDS = ["daily", "weekly", "all"]
TIES = {"order": "desc", "tie_break": "first"}  # arrival order matters: positions must match


async def _transact(engine: Engine, member: str, delta: float) -> list:
    transaction = engine.transaction()
    await transaction.ready(BOARDS)
    answers = transaction.submit([sub(board, member, delta=delta) for board in BOARDS])
    removed = transaction.remove_members("daily", lambda view: ["gone"])
    transaction.put_board("fresh", {"policy": "sum"})
    transaction.drop_board("doomed")
    await transaction.commit()
    return [answers, removed]


def _payloads(data_dir: Path) -> list[tuple[int, tuple]]:
    wal = WriteAheadLog(data_dir / "wal", fsync="no")
    try:
        return [(lsn, records.decode(payload)) for lsn, payload in wal.iter_records()]
    finally:
        run(wal.close())


def _setup(engine: Engine):
    async def body() -> None:
        for board in BOARDS:
            await engine.put_board(board, {"policy": "sum", **TIES})
        await engine.put_board("doomed", {"policy": "sum"})
        await engine.submit(sub("daily", "gone", delta=1))
        for board in BOARDS:
            await engine.submit(sub(board, "rival", delta=5))
    return body()


def test_transaction_is_one_record_and_replays_to_the_same_state(tmp_path):
    clock = FakeClock()

    async def live() -> tuple[str, list, int]:
        engine = await Engine.open(engine_config(tmp_path), clock=clock)
        try:
            await _setup(engine)
            before = engine.wal.last_lsn
            answers, removed = await _transact(engine, "alice", 5)
            assert [a["score"] for a in answers] == [5, 5, 5]
            assert removed == [("gone", 1.0)]
            assert "fresh" in engine.boards and "doomed" not in engine.boards
            return engine.digest(), [engine.boards[b].version for b in BOARDS], before
        finally:
            await engine.close(snapshot=False)

    digest, versions, before = run(live())
    logged = [(lsn, record) for lsn, record in _payloads(tmp_path) if lsn > before]
    kinds = [record[0] for _, record in logged]
    # Six records (3 submissions, a removal, a board made, one dropped): five
    # placeholders, then the one record that holds them, at their positions.
    assert kinds == [records.TX_SLOT] * 5 + [records.TRANSACTION]
    assert logged[-1][1][2] == before + 1 and len(logged[-1][1][3]) == 6

    async def recovered() -> tuple[str, list]:
        engine = await Engine.open(engine_config(tmp_path), clock=clock)
        try:
            return engine.digest(), [engine.boards[b].version for b in BOARDS]
        finally:
            await engine.close(snapshot=False)

    # Same members, scores and tie order (arrival positions), same versions.
    assert run(recovered()) == (digest, versions)


def test_a_torn_transaction_is_wholly_absent(tmp_path):
    """The transaction's record cut short (a crash mid-write): after
    recovery none of its writes is there, though its placeholders are."""
    clock = FakeClock()

    async def live() -> None:
        engine = await Engine.open(engine_config(tmp_path), clock=clock)
        try:
            await _setup(engine)
            await _transact(engine, "alice", 5)
        finally:
            await engine.close(snapshot=False)

    run(live())
    segment = max((tmp_path / "wal").glob("*.log"))
    segment.write_bytes(segment.read_bytes()[:-7])  # the last frame, torn

    async def recovered() -> dict:
        engine = await Engine.open(engine_config(tmp_path), clock=clock)
        try:
            return {board: engine.standing(board, "alice") for board in BOARDS} | {
                "gone": engine.standing("daily", "gone"),
                "boards": sorted(engine.boards)}
        finally:
            await engine.close(snapshot=False)

    state = run(recovered())
    assert [state[board] for board in BOARDS] == [None, None, None]
    assert state["gone"]["score"] == 1.0
    assert state["boards"] == sorted([*BOARDS, "doomed"])


def test_deadlines_and_replacements_in_a_transaction_replay_alike(tmp_path):
    """``Transaction.expire`` and ``Transaction.replace_board`` are records
    of the transaction (one unit, replayed to the same state); a board
    past its deadline that the expiry task has not deleted yet is deleted
    (its EXPIRED record, in the transaction) before the transaction writes
    it, so the write makes a new board instead of joining the expired one."""
    clock = FakeClock()

    async def live(engine: Engine) -> str:
        await engine.put_board("old", {"policy": "sum"})
        await engine.submit(sub("old", "a", delta=3))
        await engine.put_board("source", {"policy": "sum"})
        await engine.submit(sub("source", "b", delta=7))
        now_ms = round(clock() * 1000)
        assert await engine.expire("old", now_ms + 10_000)
        clock.advance(20)  # past its deadline, before the expiry task ran
        transaction = engine.transaction()
        await transaction.ready(["old", "copy", "source", "gone"])
        assert transaction.put_board("old", {"policy": "sum"})[1]  # made anew
        (answer,) = transaction.submit([sub("old", "a", delta=1)])
        assert answer["score"] == 1 and engine.boards["old"].expires_at is None
        assert transaction.replace_board("copy", REDIS_BOARD_DICT, lambda: [("b", 7.0)]) == 1
        later = round(clock() * 1000) + 60_000
        assert transaction.expire("copy", later)
        assert not transaction.expire("copy", later + 1, condition=1)  # NX: it has one
        transaction.put_board("gone", {"policy": "sum"})
        assert transaction.expire("gone", round(clock() * 1000) - 1)  # past: deleted now
        assert "gone" not in engine.boards
        await transaction.commit()
        return engine.digest()

    digest = run(with_engine(tmp_path, clock, live))
    kinds = [record[0] for _, record in _payloads(tmp_path)]
    assert kinds.count(records.TRANSACTION) == 1

    async def reopened(engine: Engine) -> str:
        assert engine.boards["copy"].expires_at == round(clock() * 1000) + 60_000
        assert "gone" not in engine.boards and engine.boards["old"].expires_at is None
        return engine.digest()

    assert run(with_engine(tmp_path, clock, reopened)) == digest
