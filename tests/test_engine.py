"""Engine behaviour: policies, orders, windows, guards, labels, dedupe,
batches, boards, and restart consistency."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import native
from engine_helpers import SUNDAY, FakeClock, engine_config, run, sub, with_engine
from rankd.engine.engine import Engine
from rankd.engine.errors import (
    Conflict,
    EventConflict,
    GuardViolation,
    InvalidInput,
    NotFound,
    ReadOnly,
)
from rankd.engine.submission import Submission
from rankd.frontends.resp.protocol import encode_request


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def scenario(tmp_path, clock, body, **overrides):
    return run(with_engine(tmp_path / "data", clock, body, **overrides))


def test_best_policy_keeps_the_best_score_in_both_orders(tmp_path, clock):
    async def body(engine: Engine):
        await engine.put_board("hi", {"policy": "best"})
        await engine.put_board("golf", {"policy": "best", "order": "asc"})
        first = await engine.submit(sub("hi", "ann", score=50))
        worse = await engine.submit(sub("hi", "ann", score=40))
        better = await engine.submit(sub("hi", "ann", score=70))
        await engine.submit(sub("golf", "ann", score=72))
        golf_worse = await engine.submit(sub("golf", "ann", score=80))
        golf_better = await engine.submit(sub("golf", "ann", score=68))
        return first, worse, better, golf_worse, golf_better, engine.standing("golf", "ann")

    first, worse, better, golf_worse, golf_better, golf = scenario(tmp_path, clock, body)
    assert first == {
        "member": "ann",
        "score": 50.0,
        "rank": 1,
        "previous": None,
        "changed": True,
        "duplicate": False,
        "event_id": None,
    }
    assert (worse["score"], worse["previous"], worse["changed"]) == (50.0, 50.0, False)
    assert (better["score"], better["previous"], better["changed"]) == (70.0, 50.0, True)
    assert (golf_worse["score"], golf_worse["changed"]) == (72.0, False)
    assert (golf_better["score"], golf_better["changed"]) == (68.0, True)
    assert golf["score"] == 68.0


def test_sum_policy_adds_deltas_and_latest_replaces(tmp_path, clock):
    async def body(engine: Engine):
        await engine.put_board("wins", {"policy": "sum"})
        await engine.put_board("elo", {"policy": "latest"})
        for delta in (1, 1, 3, -2):
            await engine.submit(sub("wins", "bo", delta=delta))
        for score in (1500, 1480, 1510):
            await engine.submit(sub("elo", "bo", score=score))
        return engine.standing("wins", "bo")["score"], engine.standing("elo", "bo")["score"]

    assert scenario(tmp_path, clock, body) == (3.0, 1510.0)


def test_policy_decides_score_or_delta(tmp_path, clock):
    async def body(engine: Engine):
        await engine.put_board("wins", {"policy": "sum"})
        await engine.put_board("hi", {"policy": "best"})
        with pytest.raises(InvalidInput, match="delta"):
            await engine.submit(sub("wins", "a", score=3))
        with pytest.raises(InvalidInput, match="score"):
            await engine.submit(sub("hi", "a", delta=3))
        with pytest.raises(InvalidInput):
            await engine.submit(sub("hi", "a", score=1, delta=1))
        return engine.digest()

    scenario(tmp_path, clock, body)


def test_ranks_reflect_order_and_first_arrival_tie_break(tmp_path, clock):
    async def body(engine: Engine):
        await engine.put_board("b", {})
        await engine.submit(sub("b", "early", score=10))
        await engine.submit(sub("b", "late", score=10))
        top = await engine.submit(sub("b", "top", score=11))
        return engine.top("b")["entries"], top["rank"]

    entries, top_rank = scenario(tmp_path, clock, body)
    assert [(e["rank"], e["member"]) for e in entries] == [(1, "top"), (2, "early"), (3, "late")]
    assert top_rank == 1


def test_member_tie_break_orders_ties_by_name(tmp_path, clock):
    async def body(engine: Engine):
        await engine.put_board("b", {"tie_break": "member"})
        for member in ("zed", "amy", "kim"):
            await engine.submit(sub("b", member, score=5))
        return [e["member"] for e in engine.top("b")["entries"]]

    assert scenario(tmp_path, clock, body) == ["amy", "kim", "zed"]


def test_standing_reports_all_rank_modes(tmp_path, clock):
    async def body(engine: Engine):
        await engine.put_board("b", {})
        for member, score in [("a", 9), ("b", 7), ("c", 7), ("d", 5)]:
            await engine.submit(sub("b", member, score=score))
        return engine.standing("b", "c"), engine.standing("b", "nobody")

    standing, absent = scenario(tmp_path, clock, body)
    assert standing["rank"] == 3
    assert standing["competition_rank"] == 2
    assert standing["dense_rank"] == 2
    assert standing["percentile"] == pytest.approx(75.0)
    assert standing["total"] == 4
    assert absent is None


def test_windows_update_atomically_and_roll_over_at_exact_boundaries(tmp_path):
    clock = FakeClock(SUNDAY + 86400 - 0.001)  # Sunday 23:59:59.999

    async def body(engine: Engine):
        await engine.put_board(
            "b", {"policy": "sum", "windows": ["all", "daily", "weekly", "monthly"]}
        )
        await engine.submit(sub("b", "ann", delta=1))
        before = {w: engine.periods("b", w)["current"] for w in ("daily", "weekly")}
        # An event stamped exactly at midnight belongs to the new day and week,
        # even when it is processed a little earlier.
        await engine.submit(sub("b", "ann", delta=10, ts=SUNDAY + 86400))
        clock.advance(0.002)
        after = {w: engine.periods("b", w) for w in ("daily", "weekly")}
        return (
            before,
            after,
            {
                w: engine.standing("b", "ann", window=w)["score"]
                for w in ("all", "daily", "weekly", "monthly")
            },
            engine.standing("b", "ann", window="daily", period="2026-11-22")["score"],
        )

    before, after, scores, yesterday = scenario(tmp_path, clock, body)
    assert before == {"daily": "2026-11-22", "weekly": "2026-W47"}
    assert after["daily"] == {
        "window": "daily",
        "current": "2026-11-23",
        "retained": ["2026-11-22"],
    }
    assert after["weekly"]["current"] == "2026-W48"
    assert scores == {"all": 11.0, "daily": 10.0, "weekly": 10.0, "monthly": 11.0}
    assert yesterday == 1.0


def test_new_period_starts_empty_and_closed_periods_are_retained_then_archived(tmp_path, clock):
    async def body(engine: Engine):
        await engine.put_board("b", {"windows": ["daily"], "retain": 2})
        for day in range(4):
            await engine.submit(sub("b", f"p{day}", score=day))
            clock.advance(86400)
        empty_today = engine.top("b")
        await engine.housekeeping()
        return empty_today, engine.periods("b")

    empty_today, periods = scenario(tmp_path, clock, body)
    assert empty_today["entries"] == [] and empty_today["total"] == 0
    assert periods["current"] == "2026-11-26"
    assert periods["retained"] == ["2026-11-25", "2026-11-24"]
    archive = tmp_path / "data" / "archive" / "b" / "daily"
    assert sorted(p.name for p in archive.iterdir()) == ["2026-11-22.json", "2026-11-23.json"]


def test_closed_period_not_retained_is_not_found(tmp_path, clock):
    async def body(engine: Engine):
        await engine.put_board("b", {"windows": ["daily"]})
        with pytest.raises(NotFound):
            engine.top("b", period="2020-01-01")
        with pytest.raises(InvalidInput):
            engine.top("b", period="2020-13-01")
        with pytest.raises(NotFound):
            engine.top("b", window="weekly")

    scenario(tmp_path, clock, body)


def test_guards_reject_and_change_nothing(tmp_path, clock):
    async def body(engine: Engine):
        await engine.put_board(
            "b", {"policy": "sum", "min_score": 0, "max_score": 100, "max_delta": 10}
        )
        await engine.submit(sub("b", "a", delta=5))
        before = engine.digest("b")
        with pytest.raises(GuardViolation):
            await engine.submit(sub("b", "a", delta=11))
        with pytest.raises(GuardViolation):
            await engine.submit(sub("b", "a", delta=-6))
        await engine.put_board("l", {"policy": "latest", "max_delta": 50, "max_score": 1000})
        await engine.submit(sub("l", "a", score=900))
        with pytest.raises(GuardViolation):
            await engine.submit(sub("l", "a", score=1001))
        with pytest.raises(GuardViolation):
            await engine.submit(sub("l", "a", score=800))
        return before, engine.digest("b"), engine.standing("l", "a")["score"]

    before, after, latest = scenario(tmp_path, clock, body)
    assert before == after
    assert latest == 900.0


def test_invalid_submissions_are_rejected_with_clear_errors(tmp_path, clock):
    async def body(engine: Engine):
        await engine.put_board("b", {})
        digest = engine.digest()
        bad = [
            sub("nope", "a", score=1),
            sub("b", "", score=1),
            sub("b", "x" * 257, score=1),
            sub("b", "a", score=float("nan")),
            sub("b", "a", score=True),
            sub("b", "a", score="1"),
            sub("b", "a", score=2**60),
            sub("b", "a", score=1, label="x" * 65),
            sub("b", "a", score=1, event_id="e" * 129),
            sub("b", "a", score=1, ts=clock() - 3600),
        ]
        answers = await engine.submit_many(bad)
        return answers, digest, engine.digest()

    answers, before, after = scenario(tmp_path, clock, body)
    assert [type(a).__name__ for a in answers] == ["NotFound"] + ["InvalidInput"] * 9
    assert all(a.message for a in answers)
    assert before == after


def test_labels_are_carried_and_returned(tmp_path, clock):
    async def body(engine: Engine):
        await engine.put_board("b", {})
        await engine.submit(sub("b", "p1", score=3, label="Ann the Great"))
        await engine.submit(sub("b", "p1", score=4))  # no label: keeps the old one
        return engine.top("b")["entries"][0]["label"], engine.standing("b", "p1")["label"]

    assert scenario(tmp_path, clock, body) == ("Ann the Great", "Ann the Great")


def test_duplicate_event_returns_original_result_within_ttl_only(tmp_path, clock):
    async def body(engine: Engine):
        await engine.put_board("b", {"policy": "sum"})
        first = await engine.submit(sub("b", "a", delta=5, event_id="e1"))
        await engine.submit(sub("b", "z", delta=50))  # changes a's rank
        again = await engine.submit(sub("b", "a", delta=5, event_id="e1"))
        clock.advance(86400 + 1)
        await engine.housekeeping()
        later = await engine.submit(sub("b", "a", delta=5, event_id="e1", ts=clock()))
        return first, again, later

    first, again, later = scenario(tmp_path, clock, body)
    assert again == {**first, "duplicate": True}
    assert first["rank"] == 1 and again["rank"] == 1
    assert later["duplicate"] is False and later["score"] == 10.0


def test_duplicates_inside_one_batch_apply_once(tmp_path, clock):
    async def body(engine: Engine):
        await engine.put_board("b", {"policy": "sum"})
        answers = await engine.submit_many(
            [
                sub("b", "a", delta=1, event_id="x"),
                sub("b", "a", delta=1, event_id="x"),
                sub("b", "a", delta=1),
            ]
        )
        return answers, engine.standing("b", "a")["score"]

    answers, score = scenario(tmp_path, clock, body)
    assert answers[0]["duplicate"] is False and answers[1]["duplicate"] is True
    assert answers[1]["score"] == answers[0]["score"] == 1.0
    assert answers[2]["score"] == score == 2.0


def test_batch_results_report_rank_after_each_event(tmp_path, clock):
    async def body(engine: Engine):
        await engine.put_board("b", {"policy": "latest"})
        return await engine.submit_many(
            [
                sub("b", "a", score=10),
                sub("b", "b", score=20),
                sub("b", "a", score=30),
                Submission(board="b", member="c", score=float("inf")),
                sub("b", "c", score=5),
            ]
        )

    answers = scenario(tmp_path, clock, body)
    assert [a["rank"] if isinstance(a, dict) else "error" for a in answers] == [1, 1, 1, "error", 3]


def test_unchanged_submission_after_a_change_in_the_same_batch_keeps_the_change(
        tmp_path, clock):
    # The second submission of "ann" changes nothing (not her best), so its
    # rank is read at that point of the batch: it must see the 90 the first
    # one set, not the 10 she had before the batch, and must not undo it.
    async def body(engine: Engine):
        await engine.put_board("b", {"policy": "best"})
        await engine.submit_many([sub("b", "ann", score=10), sub("b", "bob", score=50)])
        answers = await engine.submit_many([
            sub("b", "ann", score=90), sub("b", "ann", score=20),
            sub("b", "cid", score=70), sub("b", "cid", score=60),
        ])
        return answers, engine.top("b")["entries"], engine.digest()

    answers, entries, live = scenario(tmp_path, clock, body)
    assert [(a["score"], a["rank"], a["changed"]) for a in answers] == [
        (90.0, 1, True), (90.0, 1, False), (70.0, 2, True), (70.0, 2, False)]
    assert [(e["member"], e["score"]) for e in entries] == [
        ("ann", 90.0), ("cid", 70.0), ("bob", 50.0)]
    assert scenario(tmp_path, clock, lambda engine: asyncio.sleep(0, engine.digest())) == live


def test_board_lifecycle(tmp_path, clock):
    async def body(engine: Engine):
        created = await engine.put_board("b", {"order": "asc"})
        same = await engine.put_board("b", {"order": "asc"})
        changed = await engine.put_board("b", {"order": "asc", "windows": ["all", "daily"]})
        await engine.submit(sub("b", "a", score=1))
        with pytest.raises(Conflict):
            await engine.put_board("b", {"order": "desc"})
        with pytest.raises(InvalidInput):
            await engine.put_board("bad\nname", {})
        with pytest.raises(InvalidInput):
            await engine.put_board("b2", {"colour": "red"})
        info = engine.board_info("b")
        await engine.delete_board("b")
        with pytest.raises(NotFound):
            engine.top("b")
        return created[1], same[1], changed[1], info, sorted(engine.boards)

    created, same, changed, info, boards = scenario(tmp_path, clock, body)
    assert (created, same, changed) == (True, False, False)
    assert info["members"] == {"all": 1, "daily": 1}
    assert info["config"]["windows"] == ["all", "daily"]
    assert boards == []


def test_remove_member_from_every_window(tmp_path, clock):
    async def body(engine: Engine):
        await engine.put_board("b", {"windows": ["all", "daily"]})
        await engine.submit(sub("b", "a", score=1, label="A"))
        await engine.submit(sub("b", "b", score=2))
        removed = await engine.remove_member("b", "a")
        again = await engine.remove_member("b", "a")
        return removed, again, engine.board_info("b")["members"], engine.standing("b", "a")

    assert scenario(tmp_path, clock, body) == (True, False, {"all": 1, "daily": 1}, None)


def test_friends_ranks_and_around(tmp_path, clock):
    async def body(engine: Engine):
        await engine.put_board("b", {})
        await engine.submit_many([sub("b", f"p{i}", score=i) for i in range(10)])
        return (
            engine.ranks("b", ["p2", "ghost", "p7", "p2"]),
            engine.around("b", "p5", above=1, below=2),
            engine.around("b", "ghost"),
        )

    ranks, around, ghost = scenario(tmp_path, clock, body)
    assert [(e["member"], e["rank"], e["list_rank"]) for e in ranks["entries"]] == [
        ("p7", 3, 1),
        ("p2", 8, 2),
    ]
    assert ranks["missing"] == ["ghost"]
    assert [e["member"] for e in around] == ["p6", "p5", "p4", "p3"]
    assert ghost is None


def test_state_survives_restart_exactly(tmp_path, clock):
    async def fill(engine: Engine):
        await engine.put_board("b", {"policy": "sum", "windows": ["all", "weekly"]})
        await engine.put_board("c", {"tie_break": "member", "order": "asc"})
        await engine.submit_many(
            [
                sub(
                    "b",
                    f"m{i % 37}",
                    delta=i % 5,
                    event_id=f"e{i}",
                    label=f"L{i}" if i % 3 == 0 else None,
                )
                for i in range(500)
            ]
        )
        await engine.submit_many([sub("c", f"m{i}", score=i % 7) for i in range(100)])
        await engine.remove_member("b", "m3")
        return engine.digest()

    async def reopen(engine: Engine):
        dup = await engine.submit(sub("b", "m1", delta=1, event_id="e1"))
        # The same id with other content is refused, also after a restart.
        for other in (sub("b", "m1", delta=4, event_id="e1"),
                      sub("b", "m2", delta=1, event_id="e1"),
                      sub("b", "m3", delta=3, event_id="e3", label="other")):
            with pytest.raises(EventConflict):
                await engine.submit(other)
        return engine.digest(), dup

    live = run(with_engine(tmp_path / "data", clock, fill))
    # once from the WAL alone (no snapshot), once from the snapshot taken at close
    recovered, dup = run(with_engine(tmp_path / "data", clock, reopen))
    assert recovered == live
    assert dup["duplicate"] is True
    assert list((tmp_path / "data" / "snapshots").glob("*.snap"))


def test_second_engine_on_same_data_dir_is_refused(tmp_path, clock):
    async def body(engine: Engine):
        with pytest.raises(RuntimeError, match="in use"):
            await Engine.open(engine.config, clock=clock)

    scenario(tmp_path, clock, body)


def test_concurrent_submitters_share_one_batch_and_keep_their_own_answers(tmp_path, clock):
    async def body(engine: Engine):
        await engine.put_board("c", {"policy": "sum"})
        flushes, appends = engine.coalescer.flushes, engine.wal.stats.appends
        calls = [[sub("c", f"m{i}", delta=1)] for i in range(30)]
        calls.append([sub("c", "m0", delta=5), sub("c", "", delta=1), sub("nope", "x", delta=1)])
        singles = [engine.submit(sub("c", "solo", delta=2)) for _ in range(3)]
        answers = await asyncio.gather(*(engine.submit_many(c) for c in calls), *singles)
        return (answers, engine.coalescer.flushes - flushes, engine.wal.stats.appends - appends,
                engine.standing("c", "m0"))

    answers, flushes, appends, m0 = scenario(tmp_path, clock, body)
    assert flushes == 1  # thirty-four callers, one engine batch
    assert appends == 34  # every valid submission logged, in that one batch
    assert [a[0]["member"] for a in answers[:30]] == [f"m{i}" for i in range(30)]
    last = answers[30]
    assert last[0]["score"] == 6.0 and last[0]["previous"] == 1.0
    assert isinstance(last[1], InvalidInput) and isinstance(last[2], NotFound)
    assert m0["score"] == 6.0
    assert [a["score"] for a in answers[31:]] == [2.0, 4.0, 6.0]  # in call order


def test_text_that_cannot_be_logged_is_refused_before_anything_changes(tmp_path, clock):
    async def body(engine: Engine):
        await engine.put_board("u", {"policy": "sum"})
        before = engine.digest()
        answers = await engine.submit_many([
            sub("u", "ann", delta=1, event_id="bad\ud800"),
            sub("u", "ann", delta=1, label="bad\udfff"),
            sub("u", "bob", delta=1, event_id="é" * 65),  # 130 bytes of UTF-8
        ])
        return before, engine.digest(), answers

    before, after, answers = scenario(tmp_path, clock, body)
    assert all(isinstance(answer, InvalidInput) for answer in answers)
    assert before == after


def test_collector_settle_freezes_state_and_settled_restores_thresholds():
    import gc

    from rankd.engine import collector

    before = gc.get_threshold()
    survivor = [object() for _ in range(100)]
    with collector.settled():
        assert gc.get_threshold() == collector.THRESHOLDS
        assert gc.get_freeze_count() >= len(survivor)
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_a_large_recovery_is_frozen_and_a_small_one_left_to_the_collector(tmp_path, clock):
    import gc

    from rankd.engine import collector

    async def fill(engine: Engine):
        await engine.put_board("b", {"policy": "sum"})
        await engine.submit_many([sub("b", f"m{i}", delta=1, event_id=f"e{i}")
                                  for i in range(2000)])

    def frozen_by_recovery(threshold: int) -> int:
        original = collector.KEEP_RECOVERED_AFTER
        collector.KEEP_RECOVERED_AFTER = threshold
        gc.collect()
        try:
            return scenario(tmp_path, clock, lambda engine: asyncio.sleep(
                0, gc.get_freeze_count()))
        finally:
            collector.KEEP_RECOVERED_AFTER = original
            gc.unfreeze()

    scenario(tmp_path, clock, fill)
    # Recovering a board allocates some objects the collector tracks (the
    # board, its config and tables; event ids and packed dedupe entries are
    # strings and bytes, which it does not), far fewer than ten million.
    assert frozen_by_recovery(1) > 0
    assert frozen_by_recovery(10_000_000) == 0


def test_an_internal_error_mid_batch_stops_writes_instead_of_diverging_from_the_log(
        tmp_path, clock, monkeypatch):
    # Opening a period that fails stands for a bug: the batch's earlier
    # events are applied but will never be logged, so the engine must refuse
    # every later write (reads keep working) rather than serve a state that
    # a restart would not rebuild.
    from rankd.engine.board import Board

    real = Board.index_for_write

    def failing(board, window, period):
        index = real(board, window, period)
        if window == "daily":
            raise RuntimeError("simulated index failure")
        return index

    async def body(engine: Engine):
        await engine.put_board("b", {"policy": "sum", "windows": ["all", "daily"]})
        await engine.submit(sub("b", "ann", delta=1))
        logged = engine.wal.last_lsn
        clock.advance(86_400)  # a new day: the next write opens a daily period
        monkeypatch.setattr(Board, "index_for_write", failing)
        with pytest.raises(RuntimeError, match="simulated"):
            await engine.submit_many([sub("b", "bob", delta=2), sub("b", "cid", delta=3)])
        monkeypatch.setattr(Board, "index_for_write", real)
        with pytest.raises(ReadOnly):
            await engine.submit(sub("b", "dan", delta=4))
        with pytest.raises(ReadOnly):
            await engine.put_board("c", {})
        assert engine.wal.last_lsn == logged
        assert engine.standing("b", "ann")["score"] == 1.0

    scenario(tmp_path, clock, body)


async def _submit_while_big_is_held(engine: Engine, submissions: list) -> asyncio.Future:
    """Boards "big" and "small"; "big" held as while its index is being dumped;
    ``submissions`` handed to the engine and given time to run."""
    await engine.put_board("big", {"policy": "sum"})
    await engine.put_board("small", {"policy": "sum"})
    engine._hold(engine.boards["big"])
    batch = asyncio.ensure_future(engine.submit_many(submissions))
    for _ in range(20):
        await asyncio.sleep(0)
    return batch


def test_a_board_held_by_its_snapshot_does_not_hold_other_boards_in_the_same_batch(
        tmp_path, clock):
    async def body(engine: Engine):
        batch = await _submit_while_big_is_held(engine, [
            sub("big", "ann", delta=1), sub("small", "bob", delta=2),
            sub("big", "ann", delta=3), sub("nope", "cid", delta=1)])
        assert engine.standing("small", "bob")["score"] == 2.0
        assert engine.standing("big", "ann") is None and not batch.done()
        engine._release(engine.boards["big"])
        answers = await batch
        assert [a["score"] for a in answers[:3]] == [1.0, 2.0, 4.0]
        assert isinstance(answers[3], NotFound)
        assert engine.standing("big", "ann")["score"] == 4.0

    scenario(tmp_path, clock, body)


def test_a_held_board_refused_after_its_wait_does_not_undo_the_other_boards_answers(
        tmp_path, clock):
    async def body(engine: Engine):
        batch = await _submit_while_big_is_held(engine, [
            sub("big", "ann", delta=1), sub("small", "bob", delta=2)])
        engine.failure = OSError("simulated disk failure")  # after bob's commit
        engine._release(engine.boards["big"])
        answers = await batch
        assert isinstance(answers[0], ReadOnly)
        assert answers[1]["score"] == 2.0 and not answers[1]["duplicate"]
        assert engine.standing("big", "ann") is None

    scenario(tmp_path, clock, body)


async def snapshots_after(engine: Engine, *counts: int) -> list[dict]:
    """On a board ``b`` of two windows, submit ``counts`` new members (with
    event ids) in turn, letting the snapshot loop take a snapshot, if one is
    due, after each; the last snapshot after each."""
    await engine.put_board("b", {"policy": "sum", "windows": ["all", "weekly"]})
    seen, start = [], 0
    for count in counts:
        await engine.submit_many([sub("b", f"m{n}", delta=1, event_id=f"e{n}")
                                  for n in range(start, start + count)])
        start += count
        for _ in range(200):
            await asyncio.sleep(0.005)
            if not engine._snapshot_wanted.is_set() and not engine._snapshot_lock.locked():
                break
        seen.append(dict(engine.last_snapshot))
    return seen


def test_snapshots_are_wanted_after_as_many_events_as_the_last_one_wrote_entries(
        tmp_path, clock):
    """With a big state (members and event ids), snapshots wait for as many
    events as the last one wrote, not snapshot_every_events: otherwise a
    busy server rewrites its whole dedupe table every few seconds."""
    # 50: over snapshot_every_events (10), a snapshot; 140 < 150 entries
    # written (50 per window, 50 event ids); then 160 >= 150.
    first, unchanged, second = scenario(tmp_path, clock, lambda e: snapshots_after(e, 50, 140, 20),
                                        snapshot_every_events=10)
    assert first["entries"] == 150 and unchanged == first
    assert second["lsn"] > first["lsn"] and second["entries"] == 210 * 3


def test_the_interval_grown_with_the_state_stops_at_the_bound(tmp_path, clock, monkeypatch):
    """However big the state, the records between snapshots (the WAL tail
    a crash leaves) stay within MAX_SNAPSHOT_EVERY_EVENTS: the interval used
    to grow with the state without limit (a 10M-member node could leave a
    10M-record tail)."""
    from rankd.engine import snapshotting

    monkeypatch.setattr(snapshotting, "MAX_SNAPSHOT_EVERY_EVENTS", 30)
    # 25 < the bound (30), though 150 entries were written; then 35 >= 30.
    first, unchanged, second = scenario(tmp_path, clock, lambda e: snapshots_after(e, 50, 25, 10),
                                        snapshot_every_events=10)
    assert first["entries"] == 150 and unchanged == first
    assert second["lsn"] == first["lsn"] + 35


@given(window=st.sampled_from(["daily", "weekly", "monthly"]),
       now=st.floats(1.5e9, 4e9), retain=st.integers(0, 1000))
def test_oldest_retained_period_is_computed_as_walking_back_would(window, now, retain):
    """Once a walk back period by period for every board and window: 300
    boards with retain 1000 stalled the event loop for 2.5 s."""
    from rankd.engine.periods import oldest_retained, period_bounds, period_of

    start, _ = period_bounds(window, period_of(window, now))
    for _ in range(retain):
        start, _ = period_bounds(window, period_of(window, start - 1))
    assert oldest_retained(window, now, retain) == period_of(window, start)


def test_housekeeping_of_many_boards_keeps_the_event_loop_responsive(tmp_path):
    """300 boards with retain 1000 once stalled the loop 2.5 s every 30 s."""
    import time as time_module

    clock = FakeClock()

    async def scenario():
        engine = await Engine.open(engine_config(tmp_path), clock=clock)
        try:
            for i in range(1000):
                await engine.put_board(f"h{i}", {"windows": ["daily", "weekly", "monthly"],
                                                 "retain": 1000})
            gaps, running = [], True

            async def ticker():
                last = time_module.perf_counter()
                while running:
                    await asyncio.sleep(0)
                    now = time_module.perf_counter()
                    gaps.append(now - last)
                    last = now

            ticking = asyncio.create_task(ticker())
            started = time_module.perf_counter()
            await engine.housekeeping()
            took = time_module.perf_counter() - started
            running = False
            await ticking
            return took, max(gaps)
        finally:
            await engine.close(snapshot=False)

    took, longest = run(scenario())
    assert took < 2.0 and longest < 0.1, (took, longest)


def test_native_plain_reads_follow_the_engines_state(tmp_path, clock):
    """RESP's plain reads are answered natively from what the engine keeps
    current: its boards (replaced whole by a roll-back), a board's config
    (cached by identity), and whether reads are served at all."""
    scan = native("rankd.frontends.resp._scanner", "scan")

    def zscore(member: str) -> tuple[bytes, int]:
        (reads,), _, _ = scan(encode_request([b"ZSCORE", b"lb", member.encode()]), 0,
                              1 << 20, 1 << 20, True)
        return engine.plain_reads.answer(reads, 0, 2, 100, 1 << 20)

    class CatchingUp:  # (a node that cannot answer reads natively: catching up, say)
        reads_natively = False

    async def body(engine_: Engine):
        nonlocal engine
        engine = engine_
        await engine.put_board("lb", {"order": "asc"})
        await engine.submit(sub("lb", "ann", score=7))
        assert zscore("ann") == (b"$1\r\n7\r\n", 1)
        assert zscore("bob") == (b"$-1\r\n", 1)
        # Another default window: the read goes the general way.
        await engine.put_board("lb", {"order": "asc", "windows": ["daily"]}, discard=True)
        assert zscore("ann") == (b"", 0)
        await engine.put_board("lb", {"order": "asc"})
        await engine.submit(sub("lb", "ann", score=8))
        assert zscore("ann") == (b"$1\r\n8\r\n", 1)
        # Not served while rolling back, nor on a node catching up.
        engine.rolling_back = True
        assert zscore("ann") == (b"", 0)
        engine.rolling_back = False
        engine.replication = CatchingUp()
        assert zscore("ann") == (b"", 0)
        engine.replication = None
        # Boards replaced whole (a roll-back's): the reads see the new ones.
        boards = engine.boards
        engine.boards = {}
        assert zscore("ann") == (b"$-1\r\n", 1)
        engine.boards = boards
        assert zscore("ann") == (b"$1\r\n8\r\n", 1)

    engine: Engine | None = None
    scenario(tmp_path, clock, body)
