"""A group's size against a node's free disk (rankd.cluster.disk_fit): the
planner gives a node a group it must load only if the group's snapshot
and log fit in the node's free space over ``--min-free-disk``, and
``rankd cluster move`` to a node without that room is refused, naming why.
Before, a node just above the threshold could be given any group."""

from __future__ import annotations

import asyncio

from test_planner import layout_of

from cluster_tables import cluster_tables
from rankd.cluster.capacity import Capacity
from rankd.cluster.disk_fit import DiskRoom, GroupSizes, disk_room, group_size, move_refusal
from rankd.cluster.planner import plan

GB = 1 << 30


def test_a_group_larger_than_a_nodes_room_goes_to_a_node_with_room() -> None:
    """b died; c holds the least but has 1 GB of room: the 5 GB group's new
    follower is d, the small group's is c."""
    layout = layout_of({1: ("a", ("b",)), 2: ("a", ("b",)), 3: ("d", ())})
    disk = DiskRoom({"c": GB, "d": 100 * GB}, {1: 5 * GB, 2: 10 << 20})
    made = plan(layout, {"a", "c", "d"}, set(), 1, disk=disk)
    assert made.placements[1].followers == ("d",)
    assert made.placements[2].followers == ("c",)
    # Without sizes, c (holding the least) takes both.
    unsized = plan(layout, {"a", "c", "d"}, set(), 1).placements
    assert unsized[1].followers == unsized[2].followers == ("c",)


def test_groups_given_in_one_plan_are_taken_off_the_room() -> None:
    """Four groups of 400 MB lose their follower; c, the emptiest, has room
    for two of them: the other two go to d."""
    layout = layout_of({g: ("a", ("b",)) for g in range(4)} | {9: ("d", ())})
    disk = DiskRoom({"c": GB}, dict.fromkeys(range(4), 400 << 20))
    made = plan(layout, {"a", "c", "d"}, set(), 1, disk=disk)
    followers = [made.placements[g].followers for g in range(4)]
    assert followers.count(("c",)) == 2 and followers.count(("d",)) == 2
    assert disk.room["c"] == GB - 800 * (1 << 20)


def test_a_rebalance_moves_only_what_fits_and_passes_over_a_full_target() -> None:
    """a leads six 1 GB groups and one small one; c (the first of the
    lightest by name) has room for the small one only, b for everything:
    c gets the small group, b the large ones it takes."""
    layout = layout_of({g: ("a", ()) for g in range(7)})
    sizes = dict.fromkeys(range(6), GB) | {6: 1 << 20}
    made = plan(layout, {"a", "b", "c"}, set(), 0, rebalance=True, max_moves=100,
                disk=DiskRoom({"b": 100 * GB, "c": GB // 2}, sizes))
    assert [g for g, t in made.moves.items() if t == "c"] == [6]
    assert sum(t == "b" for t in made.moves.values()) >= 2
    # With no room for anything on c, b alone is filled.
    only_b = plan(layout, {"a", "b", "c"}, set(), 0, rebalance=True, max_moves=100,
                  disk=DiskRoom({"b": 100 * GB, "c": 0}, sizes))
    assert set(only_b.moves.values()) == {"b"} and len(only_b.moves) == 3


def test_a_node_that_follows_the_group_needs_no_room_for_it() -> None:
    """A move to a follower loads nothing: a drain moves a 5 GB group to its
    follower b, which has 1 GB of room; with no follower, it goes to the
    node with room."""
    disk = DiskRoom({"b": GB, "c": 100 * GB}, {0: 5 * GB, 1: 5 * GB})
    made = plan(layout_of({0: ("a", ("b",)), 1: ("a", ())}), {"a", "b", "c"}, {"a"}, 0,
                disk=disk)
    assert made.moves == {0: "b", 1: "c"}


def test_moves_in_progress_are_charged_to_their_targets() -> None:
    capacity = Capacity(free={"c": 2 * GB, "d": None, "e": 10 << 20})
    disk = disk_room(capacity, 256 << 20, {1: 600 << 20, 2: 600 << 20}, {1: "c"})
    assert disk.room == {"c": 2 * GB - (256 << 20) - (600 << 20), "e": (10 << 20) - (256 << 20)}
    assert disk.fits("c", 2) and disk.fits("d", 2) and not disk.fits("e", 2)
    assert disk.fits("c", 3)  # a group of unknown size: fits as before
    disk.take("c", 2)
    assert not disk.fits("c", 1)
    assert "group 1: its snapshot and log take 629,145,600 bytes" in disk.refusal("c", 1)


def test_group_sizes_and_a_move_refused_for_room(pg_dsn: str) -> None:
    """Postgres knows a group's size (its newest snapshot and the log after
    it), the planner's reading follows appends and snapshots; a move to a
    node without room for the group is refused with both figures, one to a
    node with room (or that holds the group) is not."""

    async def scenario() -> None:
        async with cluster_tables(pg_dsn) as (pool, nodes, log):
            lease, other = await log.take(1, "a"), await log.take(2, "a")
            await log.append(lease, 1, [b"x" * 1000] * 10)
            reader = GroupSizes(pool, every=0.0)
            first = await reader.sizes(0.0)
            assert 10_000 <= first[1] < 10_500 and first[2] == 0, first
            assert await log.store_snapshot(lease, 10, lease.epoch, [b"s" * 60_000] * 2)
            await log.append(lease, 11, [b"y" * 1000] * 5)
            await log.append(other, 1, [b"z" * 3000])
            size = await group_size(pool, 1)
            # 120,000 of snapshot, 5 records of 1,000 and their framing; the
            # log before the snapshot is not loaded by a new node.
            assert 125_000 <= size < 125_500, size
            assert await reader.sizes(1.0) == {1: size, 2: await group_size(pool, 2)}
            await log.append(lease, 16, [b"w" * 2000])  # counted from where it stopped
            assert (await reader.sizes(2.0))[1] == await group_size(pool, 1) > size
            assert await group_size(pool, 3) == 0
            min_free = 1 << 20
            await nodes.heartbeat("small", "s:1", planning={
                "free_bytes": min_free + 100_000, "log_failed": False, "spread": []})
            await nodes.heartbeat("big", "b:1", planning={
                "free_bytes": 10 * GB, "log_failed": False, "spread": []})
            refusal = await move_refusal(pool, "small", 1, min_free, holds=False)
            assert refusal is not None and "100,000 bytes free over --min-free-disk" in refusal
            assert f"take {await group_size(pool, 1):,} bytes" in refusal
            assert await move_refusal(pool, "small", 1, min_free, holds=True) is None
            assert await move_refusal(pool, "big", 1, min_free, holds=False) is None
            assert await move_refusal(pool, "small", 3, min_free, holds=False) is None
            assert "under --min-free-disk" in await move_refusal(pool, "small", 1, 1 << 30,
                                                                 holds=True)

    asyncio.run(scenario())
