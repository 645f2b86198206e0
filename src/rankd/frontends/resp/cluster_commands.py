"""Redis Cluster's protocol on a rankd cluster node: the commands, and routing by slot.

A key's slot is Redis Cluster's (``rankd.engine.groups.slot_of``); each
board group is a range of 16 slots, and which node serves it comes from the
cluster's :class:`~rankd.cluster.topology.Topology` (``Service.topology``;
None on a single node, where these commands answer as a Redis without
cluster support does).

**Commands.** ``CLUSTER SLOTS``, ``SHARDS``, ``NODES`` describe the topology
in Redis's formats (every slot always assigned: a group no node holds is
shown at the node that would take it).  Every node is shown as a master of
the ranges it writes and of no replica: every node follows every group it
does not write, so each would be a replica of every other, which Redis's
formats cannot say (clients that meet a node both as master and replica
take it for one of them).  A client reads a node's copy of any slot by
sending it ``READONLY``.  Node ids are the
SHA-1 of rankd's node ids (Redis's 40 hex digits).  ``CLUSTER INFO``,
``MYID``, ``KEYSLOT``, ``COUNTKEYSINSLOT``, ``GETKEYSINSLOT``, ``READONLY``,
``READWRITE``, ``ASKING`` and ``COMMAND GETKEYS`` answer as Redis's do.

**Routing** (:func:`route`, called for every command with keys on a cluster
node, before it runs):

* keys of more than one slot: ``-CROSSSLOT`` (so also an ``EXEC`` whose
  queued commands span slots: the transaction is discarded, as Redis does);
* a client that asked for the topology (``CLUSTER SLOTS/SHARDS/NODES``,
  ``READONLY`` or ``ASKING``: a cluster client) gets ``-MOVED slot
  host:port`` for a write of a slot another node writes, and for a read of
  one unless it sent ``READONLY`` (then this node's copy serves it, within
  the freshness rules of docs/cluster.md);
* any other client is served as if the node held everything: its write of a
  slot another node writes is relayed there one hop (:mod:`.relay`) and the
  answer passed back (a ``-MOVED`` back, the slot moved meanwhile: one
  hop more, to the node it names), and so is its read of a slot another node writes
  (it reads its own writes, as from one Redis).  Inside ``MULTI`` nothing is
  relayed (the transaction runs here, its writes answered ``TRYAGAIN`` if
  another node writes them).

Runs of plain commands the scanner packed for the native paths stay there
only when this node serves all of them: writes of groups it writes
(``Service.takes_packed``), reads it may answer (:func:`serves_reads`);
the others go the general way, command by command, through :func:`route`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from rankd.engine.errors import Unavailable
from rankd.engine.groups import GROUPS, SLOTS, SLOTS_PER_GROUP, slot_of
from rankd.frontends.resp import transactions
from rankd.frontends.resp.arguments import CommandError, integer
from rankd.frontends.resp.protocol import RequestReader
from rankd.frontends.resp.relay import RELAY_SECONDS, Relay, RelayFailed

if TYPE_CHECKING:
    from rankd.cluster.topology import NodeAddresses, Topology
    from rankd.frontends.resp.context import Command, Context

DISABLED = "ERR This instance has cluster support disabled"
CROSSSLOT = transactions.CROSSSLOT


@dataclasses.dataclass(slots=True)
class ClusterSession:
    """What a connection told the cluster node about itself."""

    #: It asked for the topology: a cluster client, answered ``-MOVED``.
    aware: bool = False
    #: ``READONLY``: reads of slots this node follows are served here.
    readonly: bool = False
    #: The client's credential (AUTH), to relay its commands with.
    credential: str | None = None
    relay: Relay | None = None


def session(conn: Context) -> ClusterSession:
    """The connection's :class:`ClusterSession` (made on first use)."""
    found = conn.cluster_session
    if found is None:
        found = conn.cluster_session = ClusterSession()
    return found


def node_name(node: str) -> str:
    """A rankd node id as a Redis Cluster node id (40 hex digits)."""
    return hashlib.sha1(node.encode()).hexdigest()


def _topology(conn: Context) -> Topology:
    topology = conn.service.topology
    if topology is None:
        raise CommandError(DISABLED)
    return topology


def _aware(conn: Context) -> None:
    """The client asked for the topology: answer it ``-MOVED`` from now on."""
    session(conn).aware = True


# --- the topology in Redis's shapes ---------------------------------------------------


def slot_ranges(topology: Topology) -> list[tuple[int, int, str]]:
    """``(first slot, last slot, primary)`` of every run of groups with one
    primary, covering all 16384 slots while any node is known."""
    ranges: list[tuple[int, int, str]] = []
    for group in range(GROUPS):
        primary = topology.primary(group)
        if primary is None:
            continue
        first = group * SLOTS_PER_GROUP
        if ranges and ranges[-1][2] == primary and ranges[-1][1] == first - 1:
            ranges[-1] = (ranges[-1][0], first + SLOTS_PER_GROUP - 1, primary)
        else:
            ranges.append((first, first + SLOTS_PER_GROUP - 1, primary))
    return ranges


def _endpoint(addresses: NodeAddresses | None) -> tuple[str, int] | None:
    if addresses is None or not addresses.resp:
        return None
    host, _, port = addresses.resp.rpartition(":")
    return host.strip("[]"), int(port)


def _nodes(topology: Topology) -> dict[str, tuple[str, int]]:
    """The live nodes clients can reach over RESP: id -> (host, port)."""
    found = {}
    for node in topology.nodes():
        endpoint = _endpoint(topology.addresses(node))
        if endpoint is not None:
            found[node] = endpoint
    return found


def cluster_slots(conn: Context, args: list[bytes]) -> bytes:
    topology = _topology(conn)
    _aware(conn)
    replies = conn.replies
    reachable = _nodes(topology)
    meta = replies.map_header(0)

    def entry(node: str) -> bytes:
        host, port = reachable[node]
        return (replies.array_header(4) + replies.bulk(host) + replies.integer(port)
                + replies.bulk(node_name(node)) + meta)

    out = [replies.array_header(3) + replies.integer(first) + replies.integer(last)
           + entry(primary) for first, last, primary in slot_ranges(topology)
           if primary in reachable]
    return replies.array_header(len(out)) + b"".join(out)


def cluster_shards(conn: Context, args: list[bytes]) -> bytes:
    topology = _topology(conn)
    _aware(conn)
    replies = conn.replies
    reachable = _nodes(topology)
    led: dict[str, list[int]] = {node: [] for node in reachable}
    for first, last, primary in slot_ranges(topology):
        if primary in led:
            led[primary] += [first, last]

    def node_map(node: str, role: str) -> bytes:
        host, port = reachable[node]
        fields = [("id", replies.bulk(node_name(node))), ("port", replies.integer(port)),
                  ("ip", replies.bulk(host)), ("endpoint", replies.bulk(host)),
                  ("role", replies.bulk(role)), ("replication-offset", replies.integer(0)),
                  ("health", replies.bulk("online"))]
        return replies.map_header(len(fields)) + b"".join(
            replies.bulk(key) + value for key, value in fields)

    out = []
    for primary, slots in led.items():
        out.append(
            replies.map_header(2) + replies.bulk("slots") + replies.array_header(len(slots))
            + b"".join(replies.integer(slot) for slot in slots) + replies.bulk("nodes")
            + replies.array_header(1) + node_map(primary, "master"))
    return replies.array_header(len(out)) + b"".join(out)


def cluster_nodes(conn: Context, args: list[bytes]) -> bytes:
    topology = _topology(conn)
    _aware(conn)
    reachable = _nodes(topology)
    led: dict[str, list[str]] = {node: [] for node in reachable}
    for first, last, primary in slot_ranges(topology):
        if primary in led:
            led[primary].append(f"{first}-{last}" if last > first else str(first))
    now = int(time.time() * 1000)
    epoch = topology.epoch
    lines = []
    for node, (host, port) in reachable.items():
        flags = "myself,master" if node == topology.this_node else "master"
        lines.append(" ".join([node_name(node), f"{host}:{port}@0", flags, "-", "0",
                               str(now), str(epoch), "connected", *led[node]]))
    return conn.replies.bulk("".join(line + "\n" for line in lines))


def cluster_info(conn: Context, args: list[bytes]) -> bytes:
    topology = _topology(conn)
    ranges = slot_ranges(topology)
    assigned = sum(last - first + 1 for first, last, _ in ranges)
    state = "ok" if assigned == SLOTS else "fail"
    epoch = topology.epoch
    fields = [("cluster_state", state), ("cluster_slots_assigned", assigned),
              ("cluster_slots_ok", assigned), ("cluster_slots_pfail", 0),
              ("cluster_slots_fail", 0), ("cluster_known_nodes", len(topology.nodes())),
              ("cluster_size", len({primary for _, _, primary in ranges})),
              ("cluster_current_epoch", epoch), ("cluster_my_epoch", epoch),
              ("cluster_stats_messages_sent", 0), ("cluster_stats_messages_received", 0),
              ("total_cluster_links_buffer_limit_exceeded", 0)]
    return conn.replies.bulk("".join(f"{key}:{value}\r\n" for key, value in fields))


def cluster_myid(conn: Context, args: list[bytes]) -> bytes:
    return conn.replies.bulk(node_name(_topology(conn).this_node))


def cluster_keyslot(conn: Context, args: list[bytes]) -> bytes:
    _topology(conn)
    return conn.replies.integer(slot_of(args[2]))


def _slot(word: bytes, error: str) -> int:
    slot = integer(word)
    if not 0 <= slot < SLOTS:
        raise CommandError(error)
    return slot


def _boards_in(conn: Context, slot: int) -> list[str]:
    return [name for name in conn.service.engine.boards if slot_of(name) == slot]


def cluster_countkeysinslot(conn: Context, args: list[bytes]) -> bytes:
    _topology(conn)
    return conn.replies.integer(len(_boards_in(conn, _slot(args[2], "ERR Invalid slot"))))


def cluster_getkeysinslot(conn: Context, args: list[bytes]) -> bytes:
    _topology(conn)
    slot = _slot(args[2], "ERR Invalid slot or number of keys")
    count = integer(args[3])
    if count < 0:
        raise CommandError("ERR Invalid slot or number of keys")
    names = _boards_in(conn, slot)[:count]
    return conn.replies.array_header(len(names)) + b"".join(
        conn.replies.bulk(name) for name in names)


def readonly(conn: Context, args: list[bytes]) -> bytes:
    _topology(conn)
    _aware(conn)
    session(conn).readonly = True
    return conn.replies.simple("OK")


def readwrite(conn: Context, args: list[bytes]) -> bytes:
    _topology(conn)
    session(conn).readonly = False
    return conn.replies.simple("OK")


def asking(conn: Context, args: list[bytes]) -> bytes:
    _topology(conn)
    _aware(conn)
    return conn.replies.simple("OK")


# --- keys ---------------------------------------------------------------------------


def command_keys(command: Command, words: list[bytes]) -> list[bytes]:
    """The keys ``words`` name (where ``COMMAND`` says they are, and those a
    ``numkeys`` argument counts)."""
    keys: list[bytes] = []
    if command.first_key:
        last = command.last_key if command.last_key >= 0 else len(words) + command.last_key
        keys = words[command.first_key:last + 1]
    at = transactions.NUMKEYS.get(command.name)
    return keys + transactions._counted(words, at) if at is not None else keys


# --- routing ------------------------------------------------------------------------


def route(conn: Context, command: Command, words: list[bytes], learn: bool = True
          ) -> Command:
    """``command`` if this node runs it; a command relaying it one hop for a
    plain client; ``CommandError`` (``MOVED``, ``CROSSSLOT``) otherwise;
    with ``learn``, a write this node's view only guesses it writes reads
    the view again first (:func:`_learning`).  Called on a cluster node
    only (``Service.topology`` set)."""
    if command.name == "exec" and conn.multi is not None:
        return _exec_routed(conn, command)
    keys = command_keys(command, words)
    if not keys:
        return command
    slot = slot_of(keys[0])
    for key in keys[1:]:
        if slot_of(key) != slot:
            raise CommandError(CROSSSLOT)
    topology: Topology = conn.service.topology
    group = slot // SLOTS_PER_GROUP
    primary = topology.primary(group)
    here = topology.this_node
    write = "write" in command.flags
    if (learn and primary == here and write and conn.multi is None
            and not topology.writes(group)):
        # This node's view guesses it: another node may have taken the
        # group since the view was read.  Read again before the write runs,
        # so a write another node takes is redirected (or relayed), not
        # refused.
        # (Shown to monitors once routed; a blocking pop as it starts to
        # wait, as Redis shows it: at once.)
        return dataclasses.replace(command, handler=_learning(command, group),
                                   immediate=False,
                                   shown_once_routed="blocking" not in command.flags)
    if primary is None or primary == here:
        return command
    state = conn.cluster_session
    aware = state is not None and state.aware
    if not write and aware and state.readonly and topology.holds(group):
        return command  # a follower's copy serves it (freshness checked as it runs)
    addresses = topology.addresses(primary)
    if aware:
        if addresses is None or not addresses.resp:
            raise CommandError(f"TRYAGAIN slot {slot} is written by node {primary}, which "
                               "serves no RESP port this node knows of; try again shortly")
        raise CommandError(f"MOVED {slot} {addresses.resp}")
    if conn.multi is not None or addresses is None or not addresses.resp:
        return command  # run here: its writes are answered TRYAGAIN
    return dataclasses.replace(command, handler=_relaying(addresses.resp, primary,
                                                         "blocking" in command.flags),
                               immediate=False, batchable=False, applied_now=False)


class Rerouted(CommandError):
    """A command :func:`_learning` found to be another node's after all
    (``-MOVED``, ``-TRYAGAIN``): refused before it ran, as :func:`route`
    refuses, so monitors are not shown it."""


def _learning(command: Command, group: int) -> Any:
    """A handler that reads again which node writes ``group``, then runs
    ``command`` as :func:`route` routes it on that view: here (what its
    handler returns: writes are submitted by the connection), relayed, or
    ``-MOVED`` (:class:`Rerouted`).  Monitors see it once routed
    (``Command.shown_once_routed``), a blocking pop at once."""
    async def learned(conn: Context, words: list[bytes]) -> Any:
        topology: Topology = conn.service.topology
        if await topology.learn(group) is False:
            # Its take would wait on that Postgres again: refused now.
            raise Unavailable(f"node {topology.this_node} cannot reach the cluster's "
                              f"Postgres to learn which node writes group {group}; "
                              "nothing was applied; try again shortly")
        try:
            routed = route(conn, command, words, learn=False)
        except CommandError as exc:
            raise Rerouted(exc.text) from None
        result = routed.handler(conn, words)
        return await result if isinstance(result, Awaitable) else result
    return learned


def _exec_routed(conn: Context, command: Command) -> Command:
    """EXEC whose queued commands span slots: discarded, ``-CROSSSLOT``."""
    slots = {slot_of(key) for queued, words in conn.multi.queued
             for key in command_keys(queued, words)}
    if len(slots) <= 1:
        return command

    def refused(conn: Context, args: list[bytes]) -> bytes:
        # Discarded when it runs, not when routed: a connection may look a
        # command up twice (once to answer it at once, again in its worker).
        transactions.forget(conn)
        raise CommandError(CROSSSLOT)
    return dataclasses.replace(command, handler=refused)


def serves_reads(conn: Context, reads: Any) -> bool:
    """Whether this node answers every read of a packed run here (each
    one's key is of a group it writes, or it follows and the client sent
    ``READONLY``); if not, the run goes the general way, through :func:`route`."""
    topology: Topology = conn.service.topology
    here = topology.this_node
    state = conn.cluster_session
    followers_serve = state is not None and state.aware and state.readonly
    reader = RequestReader()
    for index in range(len(reads)):
        for words in reader.feed(reads.source(index)):
            group = slot_of(words[1]) // SLOTS_PER_GROUP
            if topology.primary(group) != here and not (
                    followers_serve and topology.holds(group)):
                return False
    return True


def moved_address(reply: bytes) -> str | None:
    """The ``host:port`` a ``-MOVED slot host:port`` reply names (None for
    any other reply)."""
    if not reply.startswith(b"-MOVED "):
        return None
    parts = reply[1:].split(b"\r\n", 1)[0].split()
    return parts[2].decode(errors="replace") if len(parts) == 3 else None


def _relaying(address: str, node: str, blocking: bool) -> Any:
    """A handler relaying its command to ``node`` at ``address`` (a blocking
    pop waits as long as its own timeout says, the rest :data:`RELAY_SECONDS`)."""
    async def relayed(conn: Context, words: list[bytes]) -> bytes:
        state = session(conn)
        if state.relay is None:
            state.relay = Relay()
        relay = state.relay

        def send(to: str) -> Awaitable[bytes]:
            return relay.send(to, words, version=conn.replies.version,
                              credential=state.credential,
                              seconds=None if blocking else RELAY_SECONDS)

        try:
            reply = await send(address)
        except RelayFailed as exc:
            return conn.replies.error(
                f"TRYAGAIN node {node}, which writes this key, did not answer ({exc}); "
                "its outcome is unknown if it was sent: retry it with the same values")
        moved_to = moved_address(reply)
        if moved_to is not None and moved_to != address:
            # The slot moved meanwhile (sent just before a move's cut-over, the
            # command waited there): one more hop, to the node now serving it.
            try:
                reply = await send(moved_to)
            except RelayFailed as exc:
                return conn.replies.error(
                    f"TRYAGAIN the key's slot moved to {moved_to}, which did not answer "
                    f"({exc}); its outcome is unknown if it was sent: retry it with the "
                    "same values")
        if reply.startswith((b"-MOVED", b"-ASK")):
            return conn.replies.error("TRYAGAIN the key's slot moved to another node; "
                                      "nothing was applied")
        return reply

    def handler(conn: Context, words: list[bytes]) -> Any:
        return relayed(conn, words)
    return handler

