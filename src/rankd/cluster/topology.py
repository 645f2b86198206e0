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

:class:`ClusterTopology` is a node's answer, from what it last read of
Postgres.  A group's primary is, in order: this node while it writes the
group; the node holding the group's lease in ``rankd_groups``, live (or
silent while its lease runs: its heartbeats may be late, its renewals are
not, see :func:`holder_addresses`); the group's placed primary
(:mod:`rankd.cluster.placement`) if it is live; its first live placed
follower; and for a group nobody placed, the live
node that would take it: the live nodes, sorted by id, share such groups
in contiguous blocks (so a cluster client's slot map stays a few ranges,
not hundreds), and that node takes the group on the first write sent
there.  Followers are the group's other placed nodes that are live (every
other live node for a group nobody placed).  This node holds a group
unless placement put it on other nodes only.  The epoch is the sum of the
groups' register epochs and the placement's topology epoch: each only
grows, taking a group increments the first and every placement change the
second.
"""

from __future__ import annotations

import time
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

    def writes(self, group: int) -> bool:
        """Whether this node writes ``group`` now (holds its lease, unfenced):
        when :meth:`primary` names this node and this is False, that is the
        view's best guess, which a first write here settles."""

    async def learn(self, group: int) -> bool | None:
        """Read again, now, which node writes ``group`` (bounded in time; on
        failure the view stays as it was, and False says Postgres did not
        answer)."""

    def addresses(self, node: str) -> NodeAddresses | None:
        """``node``'s client-facing addresses (None: no node the cluster vouches for)."""


def _block(nodes: tuple[str, ...], group: int) -> str:
    """The node of ``nodes`` (sorted) whose contiguous block holds ``group``."""
    return nodes[group * len(nodes) // GROUPS]


class ClusterTopology:
    """:class:`Topology` from what a cluster node last read: its leases'
    registers, the placement and the live nodes' rows (see the module's
    docstring)."""

    def __init__(self, cluster: Any) -> None:
        #: The ``rankd.cluster.node.ClusterNode`` (which imports this module).
        self.cluster = cluster
        #: The epoch last answered, and what is added to the registers' and
        #: the placement's sum so that it never goes back (below).
        self._shown = 0
        self._bias = 0

    @property
    def this_node(self) -> str:
        return self.cluster.node_id

    @property
    def epoch(self) -> int:
        cluster = self.cluster
        raw = (sum(register.epoch for register in cluster.registers.values())
               + cluster.layout.epoch)
        # The sum can go back on a node (its view of the registers rebuilt
        # after its local state was set aside: the fault suite saw it once):
        # it is then shifted past what was answered, so that the epoch still
        # never goes back and every later change still moves it on.
        if raw + self._bias < self._shown:
            self._bias = self._shown - raw + 1
        self._shown = raw + self._bias
        return self._shown

    def nodes(self) -> tuple[str, ...]:
        live = set(self.cluster.peers)
        live.add(self.cluster.node_id)  # (before its first heartbeat is read back)
        return tuple(sorted(live))

    def primary(self, group: int) -> str | None:
        cluster = self.cluster
        writer = cluster.writers.get(group)
        if writer is not None and writer.fenced is None:
            return cluster.node_id
        if holder_addresses(cluster, group) is not None:  # (another node, reachable)
            return cluster.registers[group].holder
        nodes = self.nodes()
        placed = cluster.layout.groups.get(group)
        if placed is not None:
            for node in (placed.primary, *placed.followers):
                if node in nodes:
                    return node
        return _block(nodes, group) if nodes else None

    def followers(self, group: int) -> tuple[str, ...]:
        primary = self.primary(group)
        nodes = self.nodes()
        placed = self.cluster.layout.groups.get(group)
        holders = placed.nodes if placed is not None else nodes
        return tuple(node for node in holders if node != primary and node in nodes)

    def holds(self, group: int) -> bool:
        return group not in self.cluster.unheld

    def writes(self, group: int) -> bool:
        writer = self.cluster.writers.get(group)
        return writer is not None and writer.fenced is None

    async def learn(self, group: int) -> bool | None:
        return await self.cluster.read_holder(group)

    def addresses(self, node: str) -> NodeAddresses | None:
        cluster = self.cluster
        if node == cluster.node_id:
            config = cluster.config
            return NodeAddresses(node, config.advertise, config.advertise_tcp,
                                 config.advertise_resp)
        peer = cluster.peers.get(node)
        if peer is not None:
            return NodeAddresses(node, peer[0], peer[1], cluster.resp_peers.get(node))
        known = cluster.known.get(node)  # (silent, holding a lease: see primary())
        return NodeAddresses(node, *known) if known is not None else None


def holder_addresses(cluster: Any, group: int) -> tuple[str, str | None, str | None] | None:
    """The HTTP, TCP and RESP addresses of the node holding ``group``'s
    lease as ``cluster`` (a cluster node) last read its register: a live
    peer's, or a silent node's while its lease runs (it renews it, so it is
    up: its heartbeats may be late, as on a loaded machine, or behind a
    long write of its own); None if ``cluster`` holds it itself, or no
    other node does, or its lease ran out."""
    register = cluster.registers.get(group)
    holder = register.holder if register is not None else None
    if holder is None or holder == cluster.node_id:
        return None
    if holder in cluster.peers or register.lease_until > time.monotonic():
        return cluster.known.get(holder)  # (live peers are known too, signed alike)
    return None


def read_elsewhere(topology: Topology, group: int) -> NodeAddresses | None:
    """Where a read of ``group`` goes when this node holds no copy of it
    (its primary's addresses); None when this node holds it, or no node is
    known.  Front-ends forward such a read (REST), answer ``moved`` (TCP)
    or relay it (RESP)."""
    if topology.holds(group):
        return None
    primary = topology.primary(group)
    return topology.addresses(primary) if primary is not None else None
