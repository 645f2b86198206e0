"""Property test: the engine against a brute-force model of boards.

Hypothesis drives an engine with random batches of submissions (every
policy and order, both tie-breaks, several windows, guards, labels, event
ids that repeat inside and across batches, timestamps either side of a
midnight), member removals, window changes, clock steps, snapshots,
restarts (with or without a snapshot) and crashes (the data dir copied as
it is and opened beside the live engine).  After every step each answer
and every page of every window and period must equal what ``BoardModel``
computes by sorting dicts; after a restart or a crash the state (digest)
and the answers to repeated event ids must be the same as before.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine_helpers import SUNDAY, FakeClock, engine_config, run
from rankd.engine.engine import Engine
from rankd.engine.errors import EngineError, EventConflict
from rankd.engine.periods import period_of
from rankd.engine.submission import Submission

BOARDS = {
    "sum": {"policy": "sum", "windows": ["all", "daily"], "max_delta": 50},
    "best": {"policy": "best", "order": "asc", "tie_break": "first"},
    "latest": {"policy": "latest", "tie_break": "member", "windows": ["daily", "weekly"],
               "min_score": -20, "max_score": 20},
}
MEMBERS = ["a", "b", "c", "d", "e"]
#: Window sets the "sum" board is switched between (windows added start
#: empty; windows removed lose their periods).
SUM_WINDOWS = [["all", "daily"], ["all", "daily", "weekly"], ["all"], ["weekly", "all"]]
TTL = 86_400.0


@dataclass
class BoardModel:
    """One board: per (window, period) a dict member -> (score, arrival)."""

    name: str
    config: dict
    windows: dict[tuple[str, str], dict[str, tuple[float, int]]] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    #: event id -> (answer, expires_at)
    seen: dict[str, tuple[dict, float, tuple]] = field(default_factory=dict)

    @property
    def primary(self) -> str:
        windows = self.config.get("windows", ["all"])
        return "all" if "all" in windows else windows[0]

    def sort_key(self, member: str, state: tuple[float, int]) -> tuple:
        score, arrival = state
        key = -score if self.config.get("order", "desc") == "desc" else score
        if self.config.get("tie_break", "first") == "first":
            return (key, arrival, member.encode())
        return (key, member.encode())

    def page(self, window: str, period: str) -> list[tuple[int, str, float]]:
        members = self.windows.get((window, period), {})
        ranked = sorted(members, key=lambda m: self.sort_key(m, members[m]))
        return [(i + 1, m, members[m][0]) for i, m in enumerate(ranked)]

    def new_score(self, old: float | None, value: float) -> float | None:
        """The policy and guards; raises ``ValueError`` for a guard violation."""
        policy = self.config["policy"]
        if policy == "sum":
            if "max_delta" in self.config and abs(value) > self.config["max_delta"]:
                raise ValueError("max_delta")
            new = (old or 0.0) + value
        elif policy == "best" and old is not None:
            better = value > old if self.config.get("order", "desc") == "desc" else value < old
            new = value if better else old
        else:
            new = value
        if new == old:
            return old
        if new < self.config.get("min_score", -float("inf")):
            raise ValueError("min_score")
        if new > self.config.get("max_score", float("inf")):
            raise ValueError("max_score")
        return new


class EngineModel:
    def __init__(self) -> None:
        self.boards = {name: BoardModel(name, config) for name, config in BOARDS.items()}
        self.arrivals = 0

    def submit(self, sub: Submission, now: float) -> dict | str:
        """The answer to one submission, or ``"error"``."""
        board = self.boards[sub.board]
        value = sub.delta if board.config["policy"] == "sum" else sub.score
        # What makes a second submission with an event id a retry (ts aside).
        content = (sub.member, None if value is None else float(value), sub.label)
        if sub.event_id is not None:
            remembered = board.seen.get(sub.event_id)
            if remembered is not None and remembered[1] > now:
                if remembered[2] != content:
                    return "error"  # the id was used for another submission
                return {**remembered[0], "duplicate": True}
        ts = now if sub.ts is None else sub.ts
        changes = []
        primary = (None, None)
        try:
            for window in board.config.get("windows", ["all"]):
                key = (window, period_of(window, ts))
                state = board.windows.get(key, {}).get(sub.member)
                old = None if state is None else state[0]
                new = board.new_score(old, value)
                if new != old:
                    changes.append((key, new))
                if window == board.primary:
                    primary = (new, old)
        except ValueError:
            return "error"
        self.arrivals += 1
        for key, new in changes:
            board.windows.setdefault(key, {})[sub.member] = (new, self.arrivals)
        if sub.label is not None:
            board.labels[sub.member] = sub.label
        primary_key = (board.primary, period_of(board.primary, ts))
        ranked = [m for _, m, _ in board.page(*primary_key)]
        answer = {"member": sub.member, "score": primary[0], "rank": ranked.index(sub.member) + 1,
                  "previous": primary[1], "changed": bool(changes), "duplicate": False,
                  "event_id": sub.event_id}
        if sub.event_id is not None:
            board.seen[sub.event_id] = (answer, now + TTL, content)
        return answer

    def reconfigure(self, board_name: str, config: dict) -> None:
        board = self.boards[board_name]
        board.config = config
        board.windows = {key: members for key, members in board.windows.items()
                         if key[0] in config["windows"]}

    def remove(self, board_name: str, member: str) -> None:
        board = self.boards[board_name]
        for members in board.windows.values():
            members.pop(member, None)
        board.labels.pop(member, None)


submissions = st.builds(
    lambda board, member, number, event, ts_shift, label: Submission(
        board=board, member=member,
        delta=float(number) if board == "sum" else None,
        score=None if board == "sum" else number,
        event_id=None if event is None else f"ev{event}",
        ts=ts_shift, label=label),
    board=st.sampled_from(sorted(BOARDS)),
    member=st.sampled_from(MEMBERS),
    number=st.one_of(st.integers(-3, 3), st.sampled_from([0.5, -30, 60, 25])),
    event=st.one_of(st.none(), st.integers(0, 6)),
    ts_shift=st.one_of(st.none(), st.sampled_from([-200.0, -1.0, 0.0, 1.0, 200.0])),
    label=st.one_of(st.none(), st.sampled_from(["x", "y"])),
)

steps = st.lists(
    st.one_of(
        st.tuples(st.just("batch"), st.lists(submissions, min_size=1, max_size=12)),
        st.tuples(st.just("remove"), st.sampled_from(sorted(BOARDS)), st.sampled_from(MEMBERS)),
        st.tuples(st.just("advance"), st.sampled_from([1.0, 150.0, 3600.0])),
        st.tuples(st.just("windows"), st.sampled_from(SUM_WINDOWS)),
        st.tuples(st.just("restart"), st.booleans()),
        st.tuples(st.just("snapshot")),
        st.tuples(st.just("crash")),
    ),
    min_size=1, max_size=25,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          derandomize=False)
@given(steps=steps)
def test_engine_matches_the_model_through_batches_and_restarts(tmp_path_factory, steps):
    data_dir = tmp_path_factory.mktemp("engine")
    # Two minutes before midnight at the end of an ISO week: events and
    # clock steps land on both sides of a daily and a weekly boundary.
    clock = FakeClock(SUNDAY + 86_400 - 120)
    model = EngineModel()

    def check_reads(engine: Engine) -> None:
        for name, board in model.boards.items():
            for (window, period), _ in board.windows.items():
                got = engine.top(name, window=window, period=period, limit=100)
                want = board.page(window, period)
                assert [(e["rank"], e["member"], e["score"]) for e in got["entries"]] == want, (
                    name, window, period)
                assert [e["label"] for e in got["entries"]] == [
                    board.labels.get(m) for _, m, _ in want]

    async def scenario() -> None:
        engine = await Engine.open(engine_config(data_dir), clock=clock)
        try:
            for name, config in BOARDS.items():
                await engine.put_board(name, config)
            for step in steps:
                if step[0] == "batch":
                    batch = [Submission(board=s.board, member=s.member, score=s.score,
                                        delta=s.delta, event_id=s.event_id, label=s.label,
                                        ts=None if s.ts is None else clock.now + s.ts)
                             for s in step[1]]
                    answers = await engine.submit_many(batch)
                    expected = [model.submit(s, clock.now) for s in batch]
                    got = ["error" if isinstance(a, EngineError) else a for a in answers]
                    assert got == expected
                elif step[0] == "remove":
                    await engine.remove_member(step[1], step[2])
                    model.remove(step[1], step[2])
                elif step[0] == "windows":
                    config = {**BOARDS["sum"], "windows": step[1]}
                    await engine.put_board("sum", config, discard=True)
                    model.reconfigure("sum", config)
                elif step[0] == "snapshot":
                    await engine.snapshot()  # later restarts replay the tail after it
                elif step[0] == "advance":
                    clock.advance(step[1])
                elif step[0] == "crash":
                    # A kill -9 here: the files as they are, opened beside the
                    # live engine, hold every write acknowledged so far.
                    crashed_dir = tmp_path_factory.mktemp("crashed")
                    shutil.copytree(data_dir, crashed_dir, dirs_exist_ok=True)
                    crashed = await Engine.open(engine_config(crashed_dir), clock=clock)
                    try:
                        assert crashed.digest() == engine.digest()
                        check_reads(crashed)
                    finally:
                        await crashed.close(snapshot=False)
                else:
                    before = engine.digest()
                    await engine.close(snapshot=step[1])
                    engine = await Engine.open(engine_config(data_dir), clock=clock)
                    assert engine.digest() == before
                check_reads(engine)
            # Every event id answers as it first did, also after a last restart.
            await engine.close(snapshot=False)
            engine = await Engine.open(engine_config(data_dir), clock=clock)
            check_reads(engine)
            for name, board in model.boards.items():
                kind = "delta" if name == "sum" else "score"
                for event_id, (answer, _, (member, value, label)) in board.seen.items():
                    repeat = await engine.submit(Submission(
                        board=name, member=member, event_id=event_id, label=label,
                        **{kind: value}))
                    assert repeat == {**answer, "duplicate": True}
                    with pytest.raises(EventConflict):  # not a retry: refused
                        await engine.submit(Submission(
                            board=name, member=member + "-other", event_id=event_id,
                            label=label, **{kind: value}))
        finally:
            await engine.close(snapshot=False)

    run(scenario())
