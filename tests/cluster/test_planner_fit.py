"""The planner's decisions about what a node can take, without Postgres:
nodes short of disk or whose log fails are given no group (and a failing
one is emptied), ``replicas: all`` groups are followed by every usable
node, and a rebalance starts by itself when the load drifts (with
hysteresis), never on a balanced cluster."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rankd.cluster.capacity import capacity_of, spread_groups
from rankd.cluster.drift import HIGH, LOW, DriftWatch, drift_ratio
from rankd.cluster.placement import Layout, Placed
from rankd.cluster.planner import plan
from rankd.engine.config import BoardConfig
from rankd.engine.groups import group_of


def layout_of(groups: dict[int, tuple[str, tuple[str, ...]]],
              moves: dict[int, str] | None = None) -> Layout:
    return Layout(7, {g: Placed(p, f, 1) for g, (p, f) in groups.items()}, moves or {})


def test_a_full_node_gets_no_new_follower_but_keeps_its_copies() -> None:
    """c is short of disk: the dead b's followers go to d, not to the
    emptier c, and c keeps the group it already follows."""
    layout = layout_of({1: ("a", ("b",)), 2: ("a", ("b",)), 3: ("a", ("c",))})
    made = plan(layout, {"a", "c", "d"}, set(), 1, full={"c"})
    assert made.placements[1].followers == ("d",)
    assert made.placements[2].followers == ("d",)
    assert 3 not in made.placements
    # Without the report, c (holding the least) would have been chosen.
    assert "c" in {p.followers[0] for p in plan(layout, {"a", "c", "d"}, set(), 1)
                   .placements.values()}


def test_a_full_node_is_never_a_rebalance_or_drain_target() -> None:
    layout = layout_of({g: ("a", ("b",)) for g in range(6)})
    made = plan(layout, {"a", "b", "c"}, set(), 1, rebalance=True, max_moves=100,
                full={"c"})
    assert made.moves and set(made.moves.values()) == {"b"}
    drained = plan(layout_of({0: ("a", ())}), {"a", "b", "c"}, {"a"}, 0, full={"b"})
    assert drained.moves == {0: "c"}
    assert not plan(layout_of({0: ("a", ())}), {"a", "b"}, {"a"}, 0, full={"b"}).moves


def test_a_node_whose_log_fails_is_emptied() -> None:
    """Its primaries move to their followers, its copies are replaced."""
    layout = layout_of({0: ("a", ("b",)), 1: ("a", ("c",)), 2: ("b", ("a",))})
    made = plan(layout, {"a", "b", "c"}, set(), 1, failing={"a"}, full={"a"})
    assert made.moves == {0: "b", 1: "c"}
    assert made.placements[2].followers == ("c",)


def test_a_spread_group_is_followed_by_every_usable_node() -> None:
    layout = layout_of({0: ("a", ("b",)), 1: ("a", ("b",))})
    made = plan(layout, {"a", "b", "c", "d", "e"}, {"e"}, 1, spread={0}, full={"d"})
    # Every usable node that may be given a group: not the drained e, not the full d.
    assert made.placements[0].followers == ("b", "c")
    assert 1 not in made.placements
    # A new node is given a follower of it; a spread group no longer spread is trimmed.
    joined = layout_of({0: ("a", ("b", "c"))})
    assert plan(joined, {"a", "b", "c", "f"}, set(), 1,
                spread={0}).placements[0].followers == ("b", "c", "f")
    assert plan(joined, {"a", "b", "c"}, set(), 1).placements[0].followers == ("b",)


def test_reports_make_failing_full_and_spread() -> None:
    capacity = capacity_of({
        "a": {"free_bytes": 10 << 30, "log_failed": False, "spread": [3]},
        "b": {"free_bytes": 1 << 20, "log_failed": False, "spread": []},
        "c": {"free_bytes": 10 << 30, "log_failed": True, "spread": [5]},
        "d": None,  # an older node: fit
        "e": {"free_bytes": None, "log_failed": False},
    }, min_free=256 << 20)
    assert capacity.failing == {"c"}
    assert capacity.full == {"b", "c"}
    assert capacity.spread == {3, 5}
    assert "log fails" in capacity.refusal("c")
    assert "1,048,576 bytes free" in capacity.refusal("b")
    assert capacity.refusal("a") is None and capacity.refusal("d") is None


def test_a_board_with_replicas_all_makes_its_group_spread() -> None:
    class Board:
        def __init__(self, config: BoardConfig) -> None:
            self.config = config

    hot = BoardConfig.from_dict({"replicas": "all"})
    boards = {"hot": Board(hot), "cold": Board(BoardConfig())}
    assert spread_groups(boards.items()) == [group_of("hot")]
    assert hot.to_dict()["replicas"] == "all"
    assert "replicas" not in BoardConfig().to_dict()  # digests of other boards unchanged
    assert BoardConfig.from_dict(hot.to_dict()) == hot
    for bad in (2, "most", True, ["all"]):
        with pytest.raises(Exception, match="replicas must be"):
            BoardConfig.from_dict({"replicas": bad})


# --- drift ---------------------------------------------------------------------------


def test_drift_ratio() -> None:
    layout = layout_of({g: ("a", ()) for g in range(6)}, moves={5: "c"})
    assert drift_ratio(layout, {"a", "b", "c"}) == pytest.approx(5 / 2)
    assert drift_ratio(layout, set()) == 1.0
    assert drift_ratio(layout_of({}), {"a", "b"}) == 1.0
    even = layout_of({0: ("a", ()), 1: ("b", ())})
    assert drift_ratio(even, {"a", "b"}, {0: 3.0, 1: 1.0}) == pytest.approx(1.5)


def test_a_drift_must_last_the_settle_time_and_ends_below_low() -> None:
    watch = DriftWatch(10.0)
    assert not watch.observe(2.0, 0.0)
    assert not watch.observe(1.2, 5.0)  # between LOW and HIGH: still drifted
    assert watch.observe(2.0, 10.0)  # 10 s of drift
    assert not watch.observe(2.0, 15.0)  # the next one needs another settle time
    assert not watch.observe(2.0, 19.0, busy=True)  # ...counted after a rebalance ends
    assert not watch.observe(2.0, 28.0)
    assert watch.observe(2.0, 29.0)
    assert not watch.observe(1.1, 30.0)  # below LOW: balanced
    assert not watch.observe(1.3, 31.0)
    assert not watch.observe(1.3, 40.0)
    assert watch.observe(1.3, 41.0)
    assert not DriftWatch(0.0).observe(5.0, 1e9)  # --auto-rebalance 0: never
    with pytest.raises(ValueError):
        DriftWatch(1.0, high=1.1, low=1.2)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(1.0, 3.0), min_size=1, max_size=50), st.floats(1.0, HIGH))
def test_a_ratio_never_above_high_starts_nothing(ratios: list[float], start: float) -> None:
    watch = DriftWatch(5.0)
    assert not any(watch.observe(min(r, HIGH), 100.0 * i) for i, r in enumerate(
        [start, *ratios]))


def converge(layout: Layout, live: set[str], weights: dict[int, float],
             full: set[str] = frozenset()) -> list[tuple[Layout, dict[int, str]]]:
    """Rebalance ``layout`` round after round (each round's moves carried
    out) until a round moves nothing; each round's layout and moves (the
    last: the layout it ended with, no move)."""
    rounds = []
    for _ in range(100):
        made = plan(layout, live, set(), 0, rebalance=True, max_moves=8, weights=weights,
                    full=full)
        rounds.append((layout, made.moves))
        if not made.moves:
            return rounds
        layout = Layout(layout.epoch + 1, {
            g: Placed(made.moves.get(g, p.primary), (), 1) for g, p in layout.groups.items()})
    raise AssertionError("a rebalance never ended")


def unevenness(layout: Layout, live: set[str], weights: dict[int, float]) -> float:
    """The sum of the squares of the live nodes' primary loads: a move from
    a heavier node to a lighter one that narrows their gap lowers it."""
    led = dict.fromkeys(live, 0.0)
    for group, placed in layout.groups.items():
        if placed.primary in led:
            led[placed.primary] += weights.get(group, 1.0)
    return sum(load * load for load in led.values())


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcd"), st.floats(0.1, 10)), min_size=1,
                max_size=40),
       st.sets(st.sampled_from("abcd"), min_size=2), st.sets(st.sampled_from("abcd")))
def test_a_drift_triggered_rebalance_only_narrows_and_then_rests(
        groups: list[tuple[str, float]], live: set[str], full: set[str]) -> None:
    """Whatever the weights: every round of a rebalance narrows the gap
    between the heaviest and the lightest node and never gives a full node
    a group; once it ends, the cluster starts no move however long it stays
    as it is (no flapping), and a cluster within the drift bound never
    starts one at all."""
    layout = layout_of({g: (p, ()) for g, (p, _) in enumerate(groups)})
    weights = {g: w for g, (_, w) in enumerate(groups)}
    rounds = converge(layout, live, weights, full)
    for (before, moves), (after, _) in itertools.pairwise(rounds):
        assert not set(moves.values()) & full, moves
        assert all(before.groups[g].primary in live for g in moves), moves
        assert unevenness(after, live, weights) < unevenness(before, live, weights), moves
    ended = rounds[-1][0]
    assert not plan(ended, live, set(), 0, rebalance=True, max_moves=8, weights=weights,
                    full=full).moves
    watch = DriftWatch(1.0)
    ratio = drift_ratio(ended, live, weights)
    triggered = [watch.observe(ratio, float(t)) for t in range(5)]
    if ratio <= HIGH:
        assert not any(triggered)
    led = Counter(p.primary for p in ended.groups.values())
    assert sum(led.values()) == len(groups)


def test_a_balanced_cluster_starts_no_move() -> None:
    layout = layout_of({g: ("abc"[g % 3], ()) for g in range(9)})
    ratio = drift_ratio(layout, {"a", "b", "c"})
    assert ratio == 1.0 < LOW
    watch = DriftWatch(1.0)
    assert not any(watch.observe(ratio, float(t)) for t in range(10))
    assert not plan(layout, {"a", "b", "c"}, set(), 0, rebalance=True).moves
