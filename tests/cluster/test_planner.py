"""The planner's decisions (rankd.cluster.planner.plan), without Postgres:
R restored after a node dies, a draining node emptied, primaries spread
evenly over live nodes when they change, moves bounded, groups being
moved left alone."""

from __future__ import annotations

from collections import Counter

from rankd.cluster.placement import Layout, Placed
from rankd.cluster.planner import plan


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


def test_nothing_to_do_on_a_balanced_cluster() -> None:
    layout = layout_of({0: ("a", ("b",)), 1: ("b", ("a",))})
    assert not plan(layout, {"a", "b"}, set(), 1, rebalance=True)
    assert not plan(layout, set(), set(), 1, rebalance=True)
