"""Followers in the planner's load (rankd.cluster.node_load): the drift
measure counts what a node follows at a follower's weight, and a
rebalance, once the primaries are even, relocates followers from the node
holding the most to the one holding the least, never undoing a move.
Before, drift and rebalances weighed primaries only: a node following
every group looked as loaded as one following none."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_planner import layout_of

from rankd.cluster.disk_fit import DiskRoom
from rankd.cluster.drift import HIGH, drift_ratio
from rankd.cluster.log import migrate
from rankd.cluster.node_load import FOLLOWER_WEIGHT, node_loads, settled
from rankd.cluster.nodes import Nodes
from rankd.cluster.placement import Layout, Placed, Placement
from rankd.cluster.planner import MIN_GAIN, Planner, plan

F = FOLLOWER_WEIGHT


#: Primaries even (two each), but a follows four groups, b two, c none.
SKEWED = {0: ("a", ("b",)), 1: ("a", ("b",)), 2: ("b", ("a",)), 3: ("b", ("a",)),
          4: ("c", ("a",)), 5: ("c", ("a",))}


def test_followers_count_in_the_drift_ratio() -> None:
    layout = layout_of(SKEWED)
    assert node_loads(layout.groups, "abc") == pytest.approx(
        {"a": 2 + 4 * F, "b": 2 + 2 * F, "c": 2.0})
    ratio = drift_ratio(layout, {"a", "b", "c"})
    assert ratio == pytest.approx((2 + 4 * F) / (2 + 2 * F)) and ratio > HIGH
    # A move in progress counts as handed over: the target leads, the
    # source follows in its place (one follower kept).
    moving = layout_of({0: ("a", ("b", "c"))}, moves={0: "c"})
    assert settled(moving.groups[0], "c", 1) == Placed("c", ("a",), 1)
    assert drift_ratio(moving, {"a", "b", "c"}, replicas=1) == pytest.approx(
        1 / ((1 + F) / 3))


def test_a_rebalance_relocates_followers_once_the_primaries_are_even() -> None:
    """No primary moves (they are even); two of a's followers go to c, and
    every node ends holding two primaries and two followers."""
    layout = layout_of(SKEWED)
    made = plan(layout, {"a", "b", "c"}, set(), 1, rebalance=True)
    assert not made.moves
    after = {g: made.placements.get(g, p) for g, p in layout.groups.items()}
    assert node_loads(after, "abc") == pytest.approx(dict.fromkeys("abc", 2 + 2 * F))
    assert {g: p.followers for g, p in made.placements.items()} == {2: ("c",), 3: ("c",)}
    assert made.relocated == {2, 3}  # (the planner rebalances on while it relocates)
    assert drift_ratio(Layout(8, after), {"a", "b", "c"}) == pytest.approx(1.0)
    # Only on a rebalance; and the balanced result moves nothing more.
    assert not plan(layout, {"a", "b", "c"}, set(), 1)
    assert not plan(Layout(8, after), {"a", "b", "c"}, set(), 1, rebalance=True)


def test_followers_are_not_relocated_while_primaries_move_nor_off_fixed_groups() -> None:
    layout = layout_of(SKEWED, moves={0: "c"})
    assert not plan(layout, {"a", "b", "c"}, set(), 1, rebalance=True).placements
    # c short of disk (or without room for the groups): a's followers go to
    # b only (one of c's groups: b already follows a's).
    for made in (plan(layout_of(SKEWED), {"a", "b", "c"}, set(), 1, rebalance=True,
                      full={"c"}),
                 plan(layout_of(SKEWED), {"a", "b", "c"}, set(), 1, rebalance=True,
                      disk=DiskRoom({"c": 10}, dict.fromkeys(range(6), 100)))):
        assert {g: p.followers for g, p in made.placements.items()} == {4: ("b",)}
    # A group every node follows keeps its followers.
    spread = layout_of(SKEWED | {6: ("b", ("a",))})
    made = plan(spread, {"a", "b", "c"}, set(), 1, rebalance=True, spread={6})
    assert made.placements[6].followers == ("a", "c")  # restored to every node, not moved


def apply(layout: Layout, made_moves: dict[int, str], placements: dict[int, Placed],
          replicas: int) -> Layout:
    """The layout once a plan's placements are made and its moves handed over."""
    groups = dict(layout.groups) | placements
    for group, target in made_moves.items():
        groups[group] = settled(groups[group], target, replicas)
    return Layout(layout.epoch + 1, groups)


@settings(max_examples=120, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcd"), st.sampled_from("abcd"),
                          st.floats(0.1, 10)), min_size=1, max_size=30),
       st.sets(st.sampled_from("abcd"), min_size=2))
def test_a_rebalance_with_followers_ends_and_rests(
        groups: list[tuple[str, str, float]], live: set[str]) -> None:
    """Whatever the weights and placements (one follower a group): a
    rebalance goes round after round, each round's follower relocations
    lower the sum of the squares of the nodes' loads, it ends within a
    bounded number of rounds, and the layout it ends with plans nothing
    more (no move or relocation swinging back)."""
    layout = layout_of({g: (p, (f,) if f != p else ()) for g, (p, f, _) in enumerate(groups)})
    weights = {g: w for g, (_, _, w) in enumerate(groups)}
    for _ in range(200):
        made = plan(layout, live, set(), 1, rebalance=True, max_moves=4, weights=weights)
        if not made:
            break
        before = node_loads(layout.groups, live, weights)
        after_layout = apply(layout, made.moves, made.placements, 1)
        relocated_only = not made.moves and all(
            layout.groups[g].primary == p.primary and len(layout.groups[g].followers)
            == len(p.followers) and set(layout.groups[g].followers) <= live
            for g, p in made.placements.items())
        if relocated_only:
            after = node_loads(after_layout.groups, live, weights)
            assert (sum(v * v for v in after.values())
                    < sum(v * v for v in before.values()) - MIN_GAIN * 0.01), made
        layout = after_layout
    else:
        raise AssertionError("the rebalance never ended")
    for _ in range(3):
        assert not plan(layout, live, set(), 1, rebalance=True, max_moves=4, weights=weights)
    assert all(node in live for p in layout.groups.values() if p.primary in live
               for node in p.followers)


def test_the_planner_rebalances_on_while_it_relocates_followers(pg_dsn: str) -> None:
    """With Postgres, ``--max-moves 1``: a rebalance asked for relocates one
    follower a round, round after round, until the followers are even (it
    stopped after the first round: a round without a move ended it)."""

    async def scenario() -> None:
        pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=4)
        placement = Placement(pool)
        planner = Planner(placement, pg_dsn, 1, max_moves=1, auto_rebalance=0)
        try:
            async with pool.acquire() as conn:
                await migrate(conn)
            await Nodes(pool).migrate()
            await placement.migrate()
            await planner.migrate()
            epoch = (await placement.read()).epoch
            await placement.replace(epoch, layout_of(SKEWED).groups)
            await planner.request_rebalance()
            relocated = []
            for now in range(10):
                made = await planner.round(await placement.read(), {"a", "b", "c"},
                                           now=float(now))
                assert made is not None and not made.moves
                relocated.append(len(made.relocated))
            assert relocated[:3] == [1, 1, 0] and not planner.rebalancing, relocated
            groups = (await placement.read()).groups
            assert node_loads(groups, "abc") == pytest.approx(dict.fromkeys("abc", 2 + 2 * F))
        finally:
            await planner.lock.release()
            await pool.close()

    asyncio.run(scenario())
