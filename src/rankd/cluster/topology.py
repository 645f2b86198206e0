"""The topology seam: which node serves each board group, and where nodes are reached.

Every front-end that routes (RESP's ``CLUSTER SLOTS`` and ``-MOVED``, the
TCP protocol's ``moved``, REST's forwarding) asks a :class:`Topology`, never
the cluster's tables: so the placement of groups can change behind it (a
placement table with primaries and followers per group) without touching a
front-end.  The Protocol is small on purpose:

* :meth:`Topology.primary` — the node that writes a group, always *some*
  live node while any is known (a cluster client needs every slot covered,
  Jedis refuses holes);
* :meth:`Topology.followers` — the nodes that apply the group's log and may
  serve its reads (``READONLY``); :meth:`Topology.holds` — whether this node
  is one of them or the primary (a read of a group it does not hold is sent
  where it is held: :func:`read_elsewhere`);
* :meth:`Topology.addresses` — a node's client-facing addresses;
* :attr:`Topology.epoch` — a number that never goes back and grows whenever
  a group's primary changes (clients compare it to know which map is newer).

:class:`LeaseTopology` is the topology of part 1 of the cluster: every live
node follows every group; a group's primary is the live node holding its
lease in ``rankd_groups``; a group no live node holds is assigned to the
live node that would take it: the live nodes, sorted by id, share the
groups in contiguous blocks (so a cluster client's slot map stays a few
ranges, not hundreds), and that node takes the group on the first write
sent there.  Its epoch is the sum of the groups' register epochs: each only
grows, and taking a group increments it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from rankd.cluster.groups import GROUPS


@dataclass(frozen=True, slots=True)
class NodeAddresses:
    """Where clients reach a node (``host:port``; None: it serves no such port)."""

    node: str
    http: str
    tcp: str | None
    resp: str | None


class Topology(Protocol):
    """Which node serves each board group (see the module's docstring)."""

    @property
    def this_node(self) -> str:
        """This node's id."""

    @property
    def epoch(self) -> int:
        """The topology's version: never goes back."""

    def nodes(self) -> tuple[str, ...]:
        """The live nodes, by id, sorted."""

    def primary(self, group: int) -> str | None:
        """The node that writes ``group`` (None only while no node is known)."""

    def followers(self, group: int) -> tuple[str, ...]:
        """The nodes other than the primary that apply ``group``'s log."""

    def holds(self, group: int) -> bool:
        """Whether this node applies ``group``'s log (its primary or a follower)."""

    def addresses(self, node: str) -> NodeAddresses | None:
        """``node``'s client-facing addresses (None: not a live node vouched for)."""


def _block(nodes: tuple[str, ...], group: int) -> str:
    """The node of ``nodes`` (sorted) whose contiguous block holds ``group``."""
    return nodes[group * len(nodes) // GROUPS]


class LeaseTopology:
    """:class:`Topology` from what a part-1 cluster node knows: its leases'
    registers (read every second) and the live nodes' rows."""

    def __init__(self, cluster: Any) -> None:
        #: The ``rankd.cluster.node.ClusterNode`` (which imports this module).
        self.cluster = cluster

    @property
    def this_node(self) -> str:
        return self.cluster.node_id

    @property
    def epoch(self) -> int:
        return sum(register.epoch for register in self.cluster.registers.values())

    def nodes(self) -> tuple[str, ...]:
        live = set(self.cluster.peers)
        live.add(self.cluster.node_id)  # (before its first heartbeat is read back)
        return tuple(sorted(live))

    def primary(self, group: int) -> str | None:
        cluster = self.cluster
        writer = cluster.writers.get(group)
        if writer is not None and writer.fenced is None:
            return cluster.node_id
        register = cluster.registers.get(group)
        if register is not None and register.holder is not None and (
                register.holder in cluster.peers and register.holder != cluster.node_id):
            return register.holder
        nodes = self.nodes()
        return _block(nodes, group) if nodes else None

    def followers(self, group: int) -> tuple[str, ...]:
        primary = self.primary(group)
        return tuple(node for node in self.nodes() if node != primary)

    def holds(self, group: int) -> bool:
        return True  # (part 1: every node follows every group it does not write)

    def addresses(self, node: str) -> NodeAddresses | None:
        cluster = self.cluster
        if node == cluster.node_id:
            config = cluster.config
            return NodeAddresses(node, config.advertise, config.advertise_tcp,
                                 config.advertise_resp)
        peer = cluster.peers.get(node)
        if peer is None:
            return None
        return NodeAddresses(node, peer[0], peer[1], cluster.resp_peers.get(node))


def read_elsewhere(topology: Topology, group: int) -> NodeAddresses | None:
    """Where a read of ``group`` goes when this node holds no copy of it
    (its primary's addresses); None when this node holds it, or no node is
    known.  Front-ends forward such a read (REST), answer ``moved`` (TCP)
    or relay it (RESP)."""
    if topology.holds(group):
        return None
    primary = topology.primary(group)
    return topology.addresses(primary) if primary is not None else None
