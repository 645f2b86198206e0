"""The topology seam (rankd.cluster.topology) from what a node knows: the
group's lease holder is its primary, then its placed primary or first live
placed follower, a group nobody holds or placed goes to the node whose
contiguous block holds it, every slot is always assigned, and a read of a
group this node holds no copy of is sent to its primary."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

from rankd.cluster.placement import Layout, Placed
from rankd.cluster.topology import (
    ClusterTopology,
    NodeAddresses,
    holder_addresses,
    read_elsewhere,
)
from rankd.frontends.resp.cluster_commands import slot_ranges


@dataclass
class Register:
    epoch: int
    holder: str | None
    lease_until: float = 0.0  # (monotonic; 0: run out)


@dataclass
class FakeCluster:
    node_id: str = "b"
    registers: dict[int, Register] = field(default_factory=dict)
    writers: dict[int, object] = field(default_factory=dict)
    peers: dict[str, tuple[str, str | None, dict]] = field(default_factory=lambda: {
        name: (f"{name}:80", f"{name}:81", {}) for name in ("a", "b", "c")})
    resp_peers: dict[str, str | None] = field(default_factory=lambda: {
        name: f"{name}:82" for name in ("a", "b", "c")})
    config: SimpleNamespace = field(default_factory=lambda: SimpleNamespace(
        advertise="b:80", advertise_tcp="b:81", advertise_resp="b:82"))
    layout: Layout = field(default_factory=Layout)
    unheld: set[int] = field(default_factory=set)
    known: dict[str, tuple[str, str | None, str | None]] = field(default_factory=lambda: {
        name: (f"{name}:80", f"{name}:81", f"{name}:82") for name in ("a", "b", "c", "quiet")})


def test_primaries_come_from_the_leases_and_blocks_cover_the_rest() -> None:
    cluster = FakeCluster(registers={5: Register(3, "c"), 700: Register(2, "dead"),
                                     900: Register(4, None)},
                          writers={10: SimpleNamespace(fenced=None),
                                   11: SimpleNamespace(fenced=RuntimeError())})
    topology = ClusterTopology(cluster)
    assert topology.nodes() == ("a", "b", "c") and topology.this_node == "b"
    assert topology.primary(5) == "c"          # its lease holder
    assert topology.primary(10) == "b"         # written here
    assert topology.primary(11) == "a"         # fenced here: block of a (0..341)
    assert topology.primary(700) == "c"        # holder not live: c's block (683..)
    assert topology.primary(900) == "c" and topology.primary(400) == "b"
    assert topology.followers(5) == ("a", "b")
    assert topology.epoch == 9
    assert topology.addresses("c") == NodeAddresses("c", "c:80", "c:81", "c:82")
    assert topology.addresses("b") == NodeAddresses("b", "b:80", "b:81", "b:82")
    assert topology.addresses("gone") is None
    ranges = slot_ranges(topology)
    assert ranges[0][0] == 0 and ranges[-1][1] == 16383
    assert all(later[0] == earlier[1] + 1 for earlier, later in itertools.pairwise(ranges))
    assert all((last + 1 - first) % 16 == 0 for first, last, _ in ranges)
    # Part 1: every node holds every group, so no read is sent elsewhere.
    assert read_elsewhere(topology, 5) is None


def test_a_silent_node_still_renewing_its_lease_is_where_its_groups_go() -> None:
    """A holder whose heartbeats are late (not among the live nodes) but
    whose lease runs is the group's primary, reached at its signed
    addresses; once its lease ran out, it is not."""
    running = time.monotonic() + 60
    cluster = FakeCluster(registers={5: Register(3, "quiet", running),
                                     6: Register(3, "quiet", time.monotonic() - 1),
                                     7: Register(3, "stranger", running)})
    topology = ClusterTopology(cluster)
    assert "quiet" not in topology.nodes()
    assert topology.primary(5) == "quiet"
    assert topology.addresses("quiet") == NodeAddresses("quiet", "quiet:80", "quiet:81",
                                                        "quiet:82")
    assert holder_addresses(cluster, 5) == ("quiet:80", "quiet:81", "quiet:82")
    assert topology.primary(6) == "a" and holder_addresses(cluster, 6) is None  # its block
    assert topology.primary(7) == "a" and topology.addresses("stranger") is None  # unsigned


def test_placement_names_primaries_and_followers_the_leases_do_not() -> None:
    layout = Layout(7, {1: Placed("a", ("c",), 1), 2: Placed("dead", ("c", "b"), 1),
                        3: Placed("c", ("a",), 1)})
    cluster = FakeCluster(registers={3: Register(4, "a")}, layout=layout, unheld={1})
    topology = ClusterTopology(cluster)
    assert topology.primary(1) == "a" and topology.followers(1) == ("c",)
    # Its placed primary is not live: its first live placed follower.
    assert topology.primary(2) == "c" and topology.followers(2) == ("b",)
    # A live lease holder comes first (a failover the placement has not caught up with).
    assert topology.primary(3) == "a" and topology.followers(3) == ("c",)
    assert topology.epoch == 4 + 7
    assert not topology.holds(1) and topology.holds(2)
    assert read_elsewhere(topology, 1) == NodeAddresses("a", "a:80", "a:81", "a:82")
    assert read_elsewhere(topology, 2) is None


def test_a_read_of_a_group_not_held_here_goes_to_its_primary() -> None:
    class Partial(ClusterTopology):
        def holds(self, group: int) -> bool:
            return group != 5

    topology = Partial(FakeCluster(registers={5: Register(3, "c")}))
    assert read_elsewhere(topology, 5) == NodeAddresses("c", "c:80", "c:81", "c:82")
    assert read_elsewhere(topology, 6) is None


def test_the_epoch_never_goes_back_even_when_the_view_it_sums_does() -> None:
    """The fault suite (``move_faults``) saw a node's topology epoch go back
    once: what it sums (its registers' epochs and the placement's) went
    back.  The epoch stays ahead and still moves with every later change."""
    cluster = FakeCluster(registers={1: Register(3, "a"), 2: Register(5, "c")},
                          layout=Layout(4))
    topology = ClusterTopology(cluster)
    assert topology.epoch == 12
    del cluster.registers[2]  # (a view rebuilt without that row yet)
    assert topology.epoch == 13
    cluster.registers[1] = Register(4, "b")  # a takeover: it moves on
    assert topology.epoch == 14
    cluster.registers[2] = Register(5, "c")  # the row back
    assert topology.epoch == 19
