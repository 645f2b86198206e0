"""The planner's decisions (rankd.cluster.planner.plan), without Postgres:
R restored after a node dies, a draining node emptied, primaries spread
evenly over live nodes when they change, moves bounded, groups being
moved left alone."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from rankd.cluster.placement import Layout, Placed
from rankd.cluster.planner import MIN_GAIN, plan


def layout_of(groups: dict[int, tuple[str, tuple[str, ...]]],
              moves: dict[int, str] | None = None) -> Layout:
    return Layout(7, {g: Placed(p, f, 1) for g, (p, f) in groups.items()}, moves or {})


def test_a_dead_follower_is_replaced_by_the_least_loaded_live_node() -> None:
    layout = layout_of({1: ("a", ("b",)), 2: ("a", ("c",)), 3: ("b", ("c",))})
    made = plan(layout, {"a", "b", "d"}, set(), 1)
    # c is dead: groups 2 and 3 get a live follower; d holds the least.
    assert made.placements[2].followers == ("d",)
    assert made.placements[3].followers in (("a",), ("d",))
    assert 1 not in made.placements and not made.moves


def test_followers_are_never_more_than_the_other_live_nodes() -> None:
    layout = layout_of({1: ("a", ())})
    assert plan(layout, {"a"}, set(), 2).placements == {}
    assert plan(layout, {"a", "b"}, set(), 2).placements[1].followers == ("b",)


def test_a_draining_node_loses_its_primaries_to_its_followers() -> None:
    layout = layout_of({g: ("a", ("b",)) for g in range(4)} | {9: ("c", ("a",))})
    made = plan(layout, {"a", "b", "c"}, {"a"}, 1)
    assert made.moves == dict.fromkeys(range(4), "b")
    # a is no follower anywhere any more.
    assert made.placements[9].followers == ("b",)


def test_a_rebalance_spreads_primaries_evenly_preferring_followers() -> None:
    layout = layout_of({g: ("a", ("b",) if g % 2 else ("c",)) for g in range(12)})
    made = plan(layout, {"a", "b", "c"}, set(), 1, rebalance=True, max_moves=100)
    primaries = Counter(p.primary for p in layout.groups.values())
    for group, target in made.moves.items():
        primaries["a"] -= 1
        primaries[target] += 1
        assert target in layout.groups[group].followers  # nothing to load
    assert max(primaries.values()) - min(primaries.values()) <= 1, primaries
    assert not plan(layout, {"a", "b", "c"}, set(), 1).moves  # only when asked or on change


def test_moves_are_bounded_and_groups_moving_are_left_alone() -> None:
    layout = layout_of({g: ("a", ("b",)) for g in range(40)}, moves={0: "b", 1: "b"})
    made = plan(layout, {"a", "b", "c", "d"}, set(), 1, rebalance=True, max_moves=8)
    assert len(made.moves) == 6
    assert 0 not in made.moves and 1 not in made.moves
    assert 0 not in made.placements and 1 not in made.placements


def test_moves_in_progress_count_as_done() -> None:
    """One node leads six groups and four of them are being moved off it: the
    next round plans nothing more (it planned two more moves off the same
    node, leaving it none, and the next rebalance moved them back)."""
    groups = {g: ("a", ("b",) if g % 2 else ("c",)) for g in range(6)}
    layout = layout_of(groups, moves={0: "c", 1: "b", 2: "c", 3: "b"})
    assert not plan(layout, {"a", "b", "c"}, set(), 1, rebalance=True).moves


def test_nothing_to_do_on_a_balanced_cluster() -> None:
    layout = layout_of({0: ("a", ("b",)), 1: ("b", ("a",))})
    assert not plan(layout, {"a", "b"}, set(), 1, rebalance=True)
    assert not plan(layout, set(), set(), 1, rebalance=True)


def test_a_rebalance_spreads_weight_not_count() -> None:
    """One group as heavy as six others: it ends alone on a node, and the six
    light ones split over the other two."""
    layout = layout_of({g: ("a", ("b",)) for g in range(7)})
    weights = {0: 6.0} | dict.fromkeys(range(1, 7), 1.0)
    made = plan(layout, {"a", "b", "c"}, set(), 1, rebalance=True, max_moves=100,
                weights=weights)
    led = primaries_after(layout, made.moves, weights)
    assert sorted(led.values()) == [3.0, 3.0, 6.0], led
    heavy_node = made.moves.get(0, "a")
    assert all(made.moves.get(g, "a") != heavy_node for g in range(1, 7)), made.moves
    # By count, the same layout would have moved the heavy group like any other.
    by_count = plan(layout, {"a", "b", "c"}, set(), 1, rebalance=True, max_moves=100)
    assert sorted(Counter(by_count.moves.get(g, "a") for g in range(7)).values()) == [2, 2, 3]


def test_followers_go_to_the_nodes_holding_the_least_weight() -> None:
    """b leads one heavy group, c two light ones: a new follower goes to c."""
    layout = layout_of({0: ("b", ()), 1: ("c", ()), 2: ("c", ()), 3: ("a", ())})
    made = plan(layout, {"a", "b", "c"}, set(), 1,
                weights={0: 5.0, 1: 1.0, 2: 1.0, 3: 1.0})
    assert made.placements[3].followers == ("c",)


def primaries_after(layout: Layout, moves: dict[int, str],
                    weights: dict[int, float]) -> dict[str, float]:
    led: dict[str, float] = {}
    for group, placed in layout.groups.items():
        node = moves.get(group, placed.primary)
        led[node] = led.get(node, 0.0) + weights.get(group, 1.0)
    return led


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcd"), st.floats(0.06, 20)), min_size=1,
                max_size=40),
       st.sets(st.sampled_from("abcde"), min_size=1))
def test_a_rebalance_leaves_no_move_that_narrows_the_gap(
        groups: list[tuple[str, float]], live: set[str]) -> None:
    """Whatever the weights, a rebalance ends with the most and least loaded
    live nodes no further apart than one group's weight (plus the least
    gain a move must bring), and with weights alike it is spreading by count."""
    layout = layout_of({g: (primary, ()) for g, (primary, _) in enumerate(groups)})
    weights = {g: w for g, (_, w) in enumerate(groups)}
    made = plan(layout, live, set(), 0, rebalance=True, max_moves=10_000, weights=weights)
    assert all(target in live for target in made.moves.values())
    led = primaries_after(layout, made.moves, weights)
    loads = [led.get(node, 0.0) for node in live]
    movable = [w for g, w in weights.items() if made.moves.get(g, groups[g][0]) in live]
    if movable:
        assert max(loads) - min(loads) <= max(movable) + MIN_GAIN + 1e-9, (led, made.moves)
    alike = plan(layout, live, set(), 0, rebalance=True, max_moves=10_000,
                 weights=dict.fromkeys(weights, 2.5))
    counts = Counter(alike.moves.get(g, p) for g, (p, _) in enumerate(groups))
    in_live = [counts.get(node, 0) for node in live]
    if sum(in_live):
        assert max(in_live) - min(in_live) <= 1, counts
