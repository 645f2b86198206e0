"""One rankd node of a cluster: the groups it writes, follows and takes over.

Every node runs the same code and is started the same way; what it does
with each board group follows from the group's register in Postgres:

* **Writing** (primary): a write of a group no live node holds makes this
  node take it (:meth:`ClusterNode.prepare`): a new epoch, the log drained
  to its last position through the follower's path, then writes open.  Its
  :class:`~rankd.cluster.committer.GroupCommitter` commits every record to
  the group's log; :class:`~rankd.cluster.leases.LeaseKeeper` renews the
  lease.
* **Following**: every other group's log is applied as it commits
  (:class:`~rankd.cluster.tail.LogTail` into ``Engine.apply_replicated``).
* **Taking over**: every ``lease_seconds / 3`` the node reads the registers
  and the live nodes' positions.  A group whose lease ran out (Postgres's
  clock) is taken by the most caught-up live node first: another node
  waits two rounds for it before it tries.  Safety never rests on this
  ordering: an append commits only under the group's current epoch.
* **Deposed**: when an append or a renewal finds a newer epoch, the node
  stops writing the group.  Records it applied that the log never took are
  set aside in ``wal/orphan-*`` files (reported in the log and
  ``/metrics``), the group's boards are dropped and its log applied again
  from the start, and the node follows the group from then on.
* **Idle**: a group written by nobody for ``group_idle_seconds`` whose every
  record is committed is given up (:meth:`ClusterNode._release_idle`): its
  lease stops costing Postgres a renewal every ``lease_seconds / 3``, and
  the next write, on any node, takes it again.

Peers are only the nodes whose row of ``rankd_nodes`` is signed with the
cluster secret (:mod:`rankd.cluster.trust`), and one process at a time runs
with a node id (:mod:`rankd.cluster.nodelock`).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from rankd._tasks import STOP_SECONDS, stop_task
from rankd.cluster import capacity, disk_fit
from rankd.cluster.catchup import SliceSize, apply_slices, too_long
from rankd.cluster.committer import GroupCommitter, LogLost
from rankd.cluster.cutover import Phases
from rankd.cluster.freshness import Freshness
from rankd.cluster.groups import GROUPS, GroupLocks, group_of
from rankd.cluster.leases import LeaseKeeper
from rankd.cluster.log import ClusterLog, Fenced, Lease, migrate
from rankd.cluster.migrations import migrate_retrying
from rankd.cluster.moves import Mover
from rankd.cluster.nodelock import NodeIdInUse, NodeLock
from rankd.cluster.nodes import Nodes
from rankd.cluster.peer_hosts import PeerHosts
from rankd.cluster.placement import (
    Layout,
    Placed,
    Placement,
    Stale,
    choose_followers,
)
from rankd.cluster.planner import Planner
from rankd.cluster.recovery import DiskRecovery
from rankd.cluster.register_reads import RegisterReads
from rankd.cluster.scheme import check_data_dir, check_scheme
from rankd.cluster.tail import LogTail
from rankd.cluster.topology import ClusterTopology, holder_addresses, read_elsewhere
from rankd.cluster.trust import ClusterTrust, shared_secret
from rankd.engine.engine import Engine
from rankd.engine.errors import (
    EngineError,
    InvalidInput,
    NotPrimary,
    Unacknowledged,
    Unavailable,
    Unsettled,
)
from rankd.engine.frames import frame
from rankd.postgres_link import POSTGRES_ERRORS, OneConnection, release_cheaply

log = logging.getLogger(__name__)

ACK_MODES = ("log", "local")
#: How long a write arriving while the node joins waits for it.
JOIN_WAIT_SECONDS = 10.0
#: How long opening a connection to Postgres may take.
CONNECT_SECONDS = 5.0
#: Rounds of the watch loop a less caught-up node leaves an expired group
#: to a more caught-up one before it tries itself.
DEFER_ROUNDS = 2
#: How long a write that cannot apply here waits to learn its group's primary.
REGISTER_READ_SECONDS = 2.0
#: How long ``GET /v1/cluster`` waits for Postgres before it answers what it last knew.
STATUS_SECONDS = 2.0


@dataclass
class ClusterConfig:
    """How a node joins its cluster (``--cluster-dsn`` and friends)."""

    dsn: str
    node_id: str
    #: ``host:port`` other nodes and clients reach this node's HTTP API at.
    advertise: str
    #: ... and its TCP protocol at (None: it serves none).
    advertise_tcp: str | None = None
    #: ... and its RESP port at (None: it serves none).
    advertise_resp: str | None = None
    ack: str = "log"
    #: Seconds a write waits for the log before it answers ``unacknowledged``.
    ack_timeout: float = 10.0
    lease_seconds: float = 4.0
    #: ``--ack local``: a primary whose oldest unshipped record is older
    #: than this refuses writes (503) instead of growing what a failover loses.
    max_unshipped_ms: float = 1000.0
    #: A primary stores its group's state in Postgres every this many of the
    #: group's records; the log before the snapshot before it is dropped.
    group_snapshot_records: int = 100_000
    #: The cluster secret (``--cluster-secret``); None: the one kept in
    #: Postgres (a cluster without credentials, see rankd.cluster.trust).
    secret: bytes | None = field(default=None, repr=False)
    #: A primary gives up a group nothing was written to for this long, once
    #: every record of it is committed (0: never).
    group_idle_seconds: float = 30.0
    #: Reads of a group this node cannot vouch is at most this many seconds
    #: stale are refused (0: never; see rankd.cluster.freshness).
    max_follow_lag: float = 5.0
    #: Followers each group is placed on besides its primary (``--replicas``).
    replicas: int = 1
    #: Moves the planner keeps in progress at most (``--max-moves``).
    max_moves: int = 8
    #: Seconds of drifted load before the planner rebalances (``--auto-rebalance``; 0: never).
    auto_rebalance: float = 300.0
    #: Free bytes of the data dir below which the planner gives a node no group.
    min_free_disk: int = 256 << 20

    def __post_init__(self) -> None:
        if self.replicas < 0:
            raise ValueError(f"replicas must be 0 or more, got {self.replicas!r}")
        if self.max_moves < 1:
            raise ValueError(f"max_moves must be 1 or more, got {self.max_moves!r}")
        if self.ack not in ACK_MODES:
            raise ValueError(f"ack must be one of {', '.join(ACK_MODES)}, got {self.ack!r}")
        if not self.node_id:
            raise ValueError("a cluster node needs a node id (--node-id)")
        if self.lease_seconds <= 0 or self.ack_timeout <= 0 or self.max_unshipped_ms <= 0:
            raise ValueError("lease_seconds, ack_timeout and max_unshipped_ms must be positive")
        if self.group_idle_seconds < 0:
            raise ValueError("group_idle_seconds must be 0 (never) or positive")
        if not 0 <= self.max_follow_lag < float("inf"):  # (NaN too)
            raise ValueError("max_follow_lag must be 0 (never refuse) or a positive number "
                             f"of seconds, got {self.max_follow_lag!r}")


def session_settings(lease_seconds: float) -> dict[str, str]:
    """Postgres settings of a node's connections.  A node cut off in the
    middle of a transaction (a partition, a paused process) would hold its
    group's register row locked for as long as Postgres keeps the session,
    and no other node could take the group: Postgres ends such a
    transaction after half a lease, and a node waits for a lock at most
    that long before it tries again later."""
    half_lease_ms = str(max(100, int(lease_seconds * 500)))
    return {"idle_in_transaction_session_timeout": half_lease_ms,
            "lock_timeout": half_lease_ms}


@dataclass
class SnapshotMark:
    """A written group's last snapshot in Postgres, as its primary knows it."""

    seq: int
    #: Its size in bytes (0: stored by an earlier primary, not known).
    size: int = 0
    #: The committer's ``bytes`` when it was stored.
    logged: int = 0

    def due(self, writer: GroupCommitter, every_records: int) -> bool:
        """Whether the group's primary stores the next snapshot now: after
        ``every_records`` records, and once the log grew by as many bytes as
        the last snapshot holds, so storing snapshots at most doubles what
        the group writes to Postgres however large its state."""
        return (writer.committed_seq - self.seq >= every_records
                and writer.bytes - self.logged >= self.size)


@dataclass
class Register:
    """A group's register as last read, with the monotonic time it was read."""

    epoch: int
    holder: str | None
    last_seq: int
    #: Monotonic time until which its lease holds (0: free or expired).
    lease_until: float
    deferred: int = field(default=0)


class ClusterNode:
    """The cluster as one node's engine sees it (``rankd.engine.replication``)."""

    def __init__(self, engine: Engine, config: ClusterConfig) -> None:
        self.engine = engine
        self.config = config
        self.ack = config.ack
        self.ack_timeout = config.ack_timeout
        self.node_id = config.node_id
        self.writers: dict[int, GroupCommitter] = {}
        self.registers: dict[int, Register] = {}
        #: Live nodes: id -> (HTTP address, TCP address, {group: applied seq}).
        self.peers: dict[str, tuple[str, str | None, dict[int, int]]] = {}
        #: The live peers' IP addresses: exempt from the per-address
        #: connection cap (they carry many clients' forwards and relays).
        self.peer_hosts = PeerHosts()
        #: Live nodes' RESP addresses (None: the node serves no RESP port).
        self.resp_peers: dict[str, str | None] = {}
        #: Every node whose row is signed with the cluster secret, live or
        #: silent: id -> (HTTP, TCP, RESP address).  A silent node still
        #: holding a lease it renews is reached there (``topology.holder_addresses``).
        self.known: dict[str, tuple[str, str | None, str | None]] = {}
        #: Records set aside by this node after it was deposed, for metrics.
        self.orphaned = 0
        self.takeovers = 0
        self.snapshots = 0
        self.bootstraps = 0
        #: Groups given up because nothing was written to them for a while.
        self.released = 0
        #: The cluster secret, and what it signs (node rows, forwards).
        self.trust = ClusterTrust(config.secret)
        self._node_lock = NodeLock(config.dsn, config.node_id, timeout=CONNECT_SECONDS)
        #: Node rows not signed with the cluster secret, already reported.
        self._unvouched: set[str] = set()
        #: Where each written group's last snapshot in Postgres stands.
        self._snapshot_marks: dict[int, SnapshotMark] = {}
        #: The cluster's layout id (rankd.cluster.scheme), once joined.
        self.scheme_layout: str | None = None
        self.pool: asyncpg.Pool | None = None
        self.lease_link: OneConnection | None = None
        self.store: ClusterLog | None = None
        self.keeper: LeaseKeeper | None = None
        self.tail: LogTail | None = None
        self.nodes: Nodes | None = None
        #: Where groups are placed (rankd.cluster.placement), as last read,
        #: and this node's side of moving them (rankd.cluster.moves).
        self.placement: Placement | None = None
        self.layout = Layout()
        #: The newest placement ``status`` answered (read from Postgres, or
        #: this node's copy): it never answers an older one after it.
        self._status_layout = Layout()
        self.mover: Mover | None = None
        self.planner: Planner | None = None
        self.replicas = config.replicas
        #: Groups placed on other nodes only: their boards are dropped here,
        #: their log not followed, their reads and writes sent on.
        self.unheld: set[int] = set()
        #: Held while a group is taken or given up.
        self._lock = GroupLocks()
        self._task: asyncio.Task | None = None
        self._placing: asyncio.Task | None = None
        self._snapshotting: asyncio.Task | None = None
        self._register_reads = RegisterReads(self._read_register, REGISTER_READ_SECONDS)
        self._deposing: set[asyncio.Task] = set()
        self._joined = asyncio.Event()
        #: Takeovers timed for when a lease runs out (see _take_when_free).
        self._timers: dict[int, asyncio.Task] = {}
        #: Groups whose reads are refused here, and why: their state is
        #: being rebuilt from the log (after this node was deposed, or found
        #: records the log does not hold), until it reaches ``_rebuild_to``.
        self._unreadable: dict[int, str] = {}
        self._rebuild_to: dict[int, int] = {}
        #: Monotonic time since which every round of the watch loop reached
        #: Postgres in time (None: the last one did not).  See _in_touch.
        self._in_touch_since: float | None = None
        self._last_round_end = 0.0
        engine.replication = self
        #: Which node serves each group, for the front-ends' routing.
        self.topology = ClusterTopology(self)
        #: What this node can vouch for about each group (--max-follow-lag).
        self.freshness = Freshness(self, config.max_follow_lag)
        #: Gets the node back after its local log failed (a full disk).
        self.recovery = DiskRecovery(self)
        #: Groups held here with a ``replicas: all`` board, as the watch loop
        #: last counted them (rankd.cluster.capacity).
        self._spread: set[int] = set()

    # --- life cycle ------------------------------------------------------------------

    async def start(self) -> None:
        """Join: check the local state against the logs, then follow them."""
        # A connection attempt that Postgres never answers (a link gone
        # silent mid-handshake) would otherwise hold whoever waits for a
        # pooled connection for asyncpg's default minute: the log tail once
        # stalled so after Postgres restarted.
        await self._node_lock.acquire()
        self.pool = await asyncpg.create_pool(
            self.config.dsn, min_size=2, max_size=8, command_timeout=10,
            timeout=CONNECT_SECONDS,
            server_settings=session_settings(self.config.lease_seconds),
            reset=release_cheaply)
        self.store = ClusterLog(self.pool, lease_seconds=self.config.lease_seconds)
        self.nodes = Nodes(self.pool, alive_seconds=self.config.lease_seconds * 2)
        self.placement = Placement(self.pool)
        self.mover = Mover(self, self.placement)
        self.planner = Planner(self.placement, self.config.dsn, self.replicas,
                               max_moves=self.config.max_moves,
                               auto_rebalance=self.config.auto_rebalance,
                               min_free=self.config.min_free_disk)
        await migrate_retrying(self._migrate, self.node_id)
        await self._check_local_positions()
        # The renewals' own connection: one never queues behind appends.
        self.lease_link = OneConnection(
            self.config.dsn, connect_seconds=CONNECT_SECONDS,
            server_settings=session_settings(self.config.lease_seconds))
        self.keeper = LeaseKeeper(self.store, self.node_id, on_lost=self._lost,
                                  renewals=ClusterLog(self.lease_link,
                                                      lease_seconds=self.config.lease_seconds))
        self.tail = LogTail(self.store, self.config.dsn, self._apply,
                            applied={g: seq for g, (seq, _) in self.engine.positions.items()},
                            poll_seconds=min(1.0, self.config.lease_seconds / 3),
                            bootstrap=self._bootstrap, rewound=self._rewound,
                            polled=self.freshness.polled)
        await self.keeper.start()
        self.layout = await self.placement.read()
        for group, placed in self.layout.groups.items():
            if (not self.layout.holds(self.node_id, group)
                    and len(placed.followers) >= self.replicas):
                self.tail.pause(group)  # dropped by _hold_placed below
        await self.tail.start()
        await self.recovery.start()
        await self.mover.start()
        await self._watch_once()
        try:
            self.layout = await self.placement.read()
            await self._hold_placed()
        except Exception as exc:
            log.warning("node %s cannot read the groups' placement: %s", self.node_id, exc)
        self._task = asyncio.create_task(self._watch(), name="rankd-cluster-watch")
        self._placing = asyncio.create_task(self._place(), name="rankd-cluster-placement")
        self._snapshotting = asyncio.create_task(self._snapshot(),
                                                 name="rankd-cluster-snapshots")
        await self._catch_up()
        self._joined.set()
        log.info("node %s joined the cluster (ack=%s, lease %.1fs, advertised at %s)",
                 self.node_id, self.ack, self.config.lease_seconds, self.config.advertise)

    async def _catch_up(self) -> None:
        """Before serving: apply every group's log up to where it was when
        the node started (reads of a node still catching up, after a lost or
        damaged data dir say, would show a past that never was current)."""
        targets = {group: register.last_seq for group, register in self.registers.items()
                   if group not in self.writers and group not in self.unheld}
        started = time.monotonic()
        for group, last_seq in sorted(targets.items()):
            while not await self.tail.wait_for(group, last_seq, 10.0):
                if group in self.writers or group in self.unheld:
                    break
                log.warning("node %s is still catching up with group %d (%d of %d) after "
                            "%.0fs; it serves once it has", self.node_id, group,
                            self.tail.applied.get(group, 0), last_seq,
                            time.monotonic() - started)

    @property
    def serving(self) -> bool:
        """Whether reads are served (once the node caught up at start)."""
        return self._joined.is_set()

    async def stop(self) -> None:
        """Leave: let queued records reach the log (a few seconds at most),
        give the leases up so another node takes over at once, stop."""
        await stop_task(self._task, STOP_SECONDS)
        await stop_task(self._placing, STOP_SECONDS)
        await stop_task(self._snapshotting, STOP_SECONDS)
        if self.mover is not None:
            await self.mover.stop()
        if self.planner is not None:
            await self.planner.lock.release()
        await self.recovery.stop()
        for timer in list(self._timers.values()):
            await stop_task(timer, STOP_SECONDS)
        for deposing in list(self._deposing):
            await stop_task(deposing, STOP_SECONDS)
        log.debug("node %s leaving: its tasks are stopped", self.node_id)
        for group, writer in list(self.writers.items()):
            with contextlib.suppress(TimeoutError, Fenced):
                if writer.next_seq - 1 > writer.committed_seq:
                    await asyncio.wait_for(writer.committed(writer.next_seq - 1), 5)
            await writer.close()
            log.debug("node %s leaving: group %d's committer is closed", self.node_id, group)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.store.release(writer.lease), STOP_SECONDS)
            self.writers.pop(group, None)
        if self.keeper is not None:
            await self.keeper.stop()
        log.debug("node %s leaving: the lease keeper is stopped", self.node_id)
        if self.tail is not None:
            await self.tail.stop()
        log.debug("node %s leaving: the log tail is stopped", self.node_id)
        if self.lease_link is not None:
            await self.lease_link.close()
        if self.pool is not None:
            # close() waits for every connection to be released: one held by a
            # task left behind would hold the node for as long as that task.
            try:
                await asyncio.wait_for(self.pool.close(), STOP_SECONDS)
            except TimeoutError:
                log.warning("node %s leaving: its Postgres connections did not close within "
                            "%.0fs; dropping them", self.node_id, STOP_SECONDS)
                self.pool.terminate()
        await self._node_lock.release()

    # --- what the engine calls (rankd.engine.replication.Replication) ---------------

    async def prepare(self, groups: set[int], *, take: bool = True
                      ) -> dict[int, EngineError]:
        refusals: dict[int, EngineError] = {}
        if not groups:
            return refusals
        if not self._joined.is_set():
            try:
                await asyncio.wait_for(self._joined.wait(), JOIN_WAIT_SECONDS)
            except TimeoutError:
                refused = Unavailable(f"node {self.node_id} is still joining the cluster; "
                                      "try again shortly; nothing was applied")
                return dict.fromkeys(groups, refused)
        if self.mover is not None and self.mover.gates:  # a move's cut-over: wait for it
            await self.mover.gates.wait_all(groups)
        writers = self.writers
        # The common case, groups this node writes: nothing to do, nor to wait for.
        pending = [group for group in groups if group not in writers
                   or writers[group].fenced is not None]
        if not pending:
            return refusals
        if len(pending) == 1:
            outcomes = [await _outcome(self._prepare_group(pending[0], take))]
        else:  # each group alone: one that waits for Postgres holds up no other
            outcomes = await asyncio.gather(*(self._prepare_group(group, take)
                                              for group in pending), return_exceptions=True)
        for group, outcome in zip(pending, outcomes, strict=True):
            if isinstance(outcome, EngineError):
                refusals[group] = outcome
            elif isinstance(outcome, POSTGRES_ERRORS):
                refusals[group] = self._unreachable(group, outcome)
            elif isinstance(outcome, BaseException):
                raise outcome
        return refusals

    async def _prepare_group(self, group: int, take: bool) -> None:
        writer = self.writers.get(group)
        if writer is not None:
            if writer.fenced is not None:
                await self._depose(group, writer.fenced)
            return
        register = self.registers.get(group)
        if (register is not None and register.holder != self.node_id
                and register.lease_until > time.monotonic()):
            return  # another live primary: the write goes there
        if take:
            await self._take(group, seen_now=True)
        elif not await self._register_reads.learn(group):
            # A write that cannot apply here only learns who writes the group,
            # through the shared, bounded reads: a burst of them against a
            # Postgres away opens no read per write, and fails fast meanwhile.
            raise TimeoutError(f"the register of group {group} could not be read within "
                               f"{REGISTER_READ_SECONDS:g} s")

    def _not_taken(self, group: int, holder: str) -> EngineError:
        address, tcp, resp = holder_addresses(self, group) or (None, None, None)
        if address is not None:
            return NotPrimary(f"node {self.node_id} does not write group {group}; node "
                              f"{holder} does, at {address}", address, tcp,
                              primary_resp=resp, **self._moved(group, holder))
        return Unavailable(f"group {group}'s primary {holder!r} has not renewed its lease "
                           "since the cluster's Postgres was last out of reach; its writes "
                           "wait for it a lease longer; nothing was applied")

    def _unreachable(self, group: int, exc: BaseException) -> EngineError:
        """The answer to a write of ``group`` when Postgres cannot be
        reached to learn or take it: its last known primary, if that is
        another live node (the write is forwarded there), else 503."""
        register = self.registers.get(group)
        holder = register.holder if register is not None else None
        reached = holder_addresses(self, group)
        if reached is not None:
            address, tcp, resp = reached
            return NotPrimary(f"node {self.node_id} cannot reach the cluster's Postgres "
                              f"({type(exc).__name__}); group {group} was last written by "
                              f"node {holder}, at {address}", address, tcp,
                              primary_resp=resp, **self._moved(group, holder))
        return Unavailable(f"node {self.node_id} cannot reach the cluster's Postgres to "
                           f"learn who writes group {group} ({type(exc).__name__}: {exc}); "
                           "nothing was applied; try again shortly")

    def _moved(self, group: int, holder: str | None) -> dict[str, Any]:
        """What a ``moved`` answer says besides the address (see ``NotPrimary``)."""
        return {"group": group, "node": holder,
                "epoch": sum(register.epoch for register in self.registers.values())}

    def writer(self, group: int) -> GroupCommitter:
        if self.mover is not None and group in self.mover.handing:
            raise self.mover.refusal(group)
        writer = self.writers.get(group)
        if writer is None or writer.fenced is not None:
            register = self.registers.get(group)
            holder = register.holder if register is not None else None
            if group in self.unheld:  # (its last known holder may look silent: never
                raise self._not_held(group)  # "no node writes it", which reads as missing)
            address, tcp, resp = holder_addresses(self, group) or (None, None, None)
            if address is None and group in self._unreadable:
                # Its boards are being loaded here: a board missing now is no answer.
                raise Unavailable(f"node {self.node_id} is loading group {group} and knows "
                                  "no live node that writes it; nothing was applied; try "
                                  "again shortly")
            raise NotPrimary(f"node {self.node_id} does not write group {group}"
                             + (f"; node {holder} does, at {address}" if address else
                                f"; its lease is held by {holder!r}, not a live node this "
                                "cluster vouches for: try again shortly"
                                if holder in self._unvouched else
                                "; no live node does yet: try again shortly"), address, tcp,
                             primary_resp=resp, **self._moved(group, holder if address else None))
        if self.ack == "local":
            unshipped = writer.unshipped_seconds() * 1000
            if unshipped > self.config.max_unshipped_ms:
                raise Unavailable(f"group {group}'s log in Postgres is {unshipped:.0f} ms "
                                  f"behind (more than --max-unshipped-ms "
                                  f"{self.config.max_unshipped_ms:g}); nothing was applied")
            if not self.keeper.may_acknowledge(group):
                raise Unavailable(f"node {self.node_id}'s lease of group {group} may be "
                                  "running out; nothing was applied")
        return writer

    def awaited(self, group: int) -> None:
        if self.tail is not None:
            self.tail.hurry()

    def check_acknowledge(self, group: int) -> None:
        if not self.keeper.may_acknowledge(group):
            raise Unacknowledged(f"node {self.node_id}'s lease of group {group} may have run "
                                 "out before this write reached the log; it may be lost")

    def check_read(self, group: int, board: str) -> None:
        if (held := read_elsewhere(self.topology, group)) is not None:
            raise NotPrimary(f"node {self.node_id} holds no copy of board {board!r}'s group "
                             f"{group}; node {held.node} does, at {held.http}", held.http,
                             held.tcp, primary_resp=held.resp, **self._moved(group, held.node))
        if group in self.unheld:
            raise self._not_held(group)
        refusal = self._unreadable.get(group)
        if refusal is not None:
            raise Unavailable(f"node {self.node_id} cannot read board {board!r} now: "
                              f"{refusal}; read another node, or again shortly")
        writer = self.writers.get(group)
        if writer is not None:
            if writer.fenced is not None:
                raise Unavailable(f"node {self.node_id} no longer writes board {board!r}'s "
                                  "group; read another node, or again shortly")
            if self.ack == "log" and writer.committed_seq < writer.next_seq - 1:
                raise Unsettled(group, board)
        stale = self.freshness.refusal(group)
        if stale is not None:
            raise Unavailable(f"board {board!r}: {stale}")

    def settling(self, group: int) -> asyncio.Future | None:
        writer = self.writers.get(group)
        if writer is None or self.ack != "log":
            return None
        last = writer.next_seq - 1
        return None if writer.committed_seq >= last else writer.committed(last)

    @property
    def reads_natively(self) -> bool:
        if (not self._joined.is_set() or self._unreadable or self.unheld
                or not self.freshness.all_fresh()):
            return False  # (unheld groups: a missing board is not an answer here)
        if self.ack == "log":
            return all(w.committed_seq >= w.next_seq - 1 and w.fenced is None
                       for w in self.writers.values())
        return all(w.fenced is None for w in self.writers.values())

    # --- groups whose reads wait for a rebuild ------------------------------------------

    def _rebuilding(self, group: int, up_to: int, why: str) -> None:
        """Refuse reads of ``group`` until its log is applied here up to
        ``up_to`` (what this node may have shown of it before): a read
        never shows a state older than one shown before, nor boards missing
        while they come back."""
        self._unreadable[group] = why
        self._rebuild_to[group] = max(up_to, self._rebuild_to.get(group, 0))

    def _rebuilt_up_to(self, group: int, seq: int) -> None:
        if group in self._unreadable and seq >= self._rebuild_to.get(group, 0):
            del self._unreadable[group]
            self._rebuild_to.pop(group, None)
            log.info("node %s serves reads of group %d again (rebuilt up to position %d)",
                     self.node_id, group, seq)

    # --- taking, following, being deposed ----------------------------------------------

    async def _take(self, group: int, handed: tuple[Lease, float, float] | None = None,
                    phases: Phases | None = None, *,
                    expired_by: datetime.datetime | None = None,
                    seen_now: bool = False) -> None:
        """Write ``group`` here: a new epoch, or the lease a move's hand-over
        gave (``handed``: the lease, when its register was read, its time left).
        ``expired_by``: when this node saw the group's register (see
        :meth:`ClusterLog.take`); ``seen_now``: read it first (see
        :meth:`_seen_expired`)."""
        if self.recovery.failed:
            raise Unavailable(f"node {self.node_id}'s local log failed; it writes no group "
                              "until it recovers (nothing was applied)")
        async with self._lock(group):
            if group in self.writers:
                return
            if seen_now:
                seen, expired_by = await self._seen_expired(group)
                if not seen:
                    return
            if handed is not None:
                lease = handed[0]
                self.keeper.adopt(*handed)
            else:
                lease = await self.keeper.take(group, expired_by)
            if lease is None:
                await self._read_register(group)
                return
            if phases is not None:
                phases.step("lease")
            try:
                self.tail.pause(group)
                # No read of the tail in flight while the state is checked: it
                # would apply records after the position _align hands the tail.
                async with self.tail.locked(group):
                    await self._align(group, lease.last_seq)
                await self.tail.drain(group, lease.last_seq)
                if phases is not None:
                    phases.step("drain")
            except BaseException:
                self.keeper.held.pop(group, None)
                with contextlib.suppress(Exception):
                    await self.store.release(lease)
                await self.tail.resume(group, self.engine.positions.get(group, (0, 0))[0])
                raise
            self.writers[group] = GroupCommitter(self.store, lease)
            self.unheld.discard(group)
            self._rebuilt_up_to(group, lease.last_seq)
            self._snapshot_marks.pop(group, None)  # counted from the new committer's bytes
            self.registers[group] = Register(lease.epoch, self.node_id, lease.last_seq,
                                             time.monotonic() + self.config.lease_seconds)
            self.takeovers += 1
            log.info("node %s writes group %d from position %d at epoch %d", self.node_id,
                     group, lease.last_seq + 1, lease.epoch)

    async def _align(self, group: int, last_seq: int) -> None:
        """Make the local state of ``group`` a prefix of its log: a node that
        applied records the log does not hold (written by it as an earlier
        primary, never committed) replays the group from the start."""
        seq, epoch = self.engine.positions.get(group, (0, 0))
        if seq == 0:
            self.tail.applied[group] = 0
            return
        logged_epoch = await self.store.epoch_at(group, seq) if seq <= last_seq else None
        if logged_epoch == epoch:
            self.tail.applied[group] = seq
            return
        log.error("node %s applied group %d up to position %d (epoch %d) but the log %s: "
                  "replaying the group from its log", self.node_id, group, seq, epoch,
                  f"ends at {last_seq}" if seq > last_seq else
                  f"holds epoch {logged_epoch} there")
        self._rebuilding(group, min(seq, last_seq), "its state is being replayed from the "
                         "cluster's log")
        await self.engine.reset_group(group)
        self.tail.applied[group] = 0

    async def _check_local_positions(self) -> None:
        """At start: records the local state holds that the groups' logs do
        not (written here as primary, never committed before a crash) are set
        aside, and their groups are replayed from the log."""
        diverged = []
        for group, (seq, epoch) in list(self.engine.positions.items()):
            register = await self.store.register(group)
            last_seq = register["last_seq"] if register else 0
            if seq > last_seq or await self.store.epoch_at(group, seq) != epoch:
                diverged.append((group, seq, epoch, last_seq))
        for group in list(self.engine.walked):
            self._unwalked(group)
        for group, seq, epoch, last_seq in diverged:
            log.error("node %s: local state of group %d goes to position %d (epoch %d), "
                      "beyond or beside the cluster's log (at %d): those records were never "
                      "committed; replaying the group from the log", self.node_id, group,
                      seq, epoch, last_seq)
            committed = await self.store.last_seq_of_epoch(group, epoch)
            orphans = await asyncio.to_thread(self.engine.written_by, group, epoch, committed)
            if orphans:
                await self._orphan(group, epoch, orphans)
            await self.engine.reset_group(group)
        self.engine.local_positions_checked()  # (its local log was kept whole until now)

    def _apply(self, group: int, logged: list[tuple[int, int, bytes]]) -> Awaitable[None]:
        if too_long(logged):
            return self._apply_sliced(group, logged)
        return self._apply_now(group, logged)

    def _apply_now(self, group: int, logged: list[tuple[int, int, bytes]]) -> Awaitable[None]:
        if self.engine.held_in(group):  # a store is reading its boards: after it
            return self._apply_released(group, logged)
        seq = self.engine.positions.get(group, (0, 0))[0]
        if logged[0][0] != seq + 1:
            raise RuntimeError(f"group {group}: the tail hands position {logged[0][0]} to a "
                               f"node at {seq}")
        applied = self.engine.apply_replicated(group, logged)
        if group in self._unreadable:
            self._rebuilt_up_to(group, logged[-1][0])
        return applied

    async def _apply_sliced(self, group: int, logged: list[tuple[int, int, bytes]]) -> None:
        """Apply a long run of records (a group loaded from far behind: a
        node that gains it, or catches up) a slice at a time, letting the
        event loop serve between slices."""
        applied = []
        sizes = SliceSize()  # (each slice sized by what the one before cost)
        for part in apply_slices(logged, sizes):
            await self.engine.released(group)  # (then _apply_now applies the part at once)
            started = time.thread_time()
            applied.append(self._apply_now(group, part))
            sizes.timed(len(part), time.thread_time() - started)
            await asyncio.sleep(0)
        await asyncio.gather(*applied)

    async def _apply_released(self, group: int, logged: list[tuple[int, int, bytes]]) -> None:
        await self.engine.released(group)
        await self._apply(group, logged)

    async def _bootstrap(self, group: int) -> int:
        """The log no longer holds the positions this node needs next: start
        the group again from its snapshot in Postgres."""
        snapshot = await self.store.snapshot(group)
        if snapshot is None:
            raise RuntimeError(f"group {group}: the log was compacted but Postgres holds no "
                               "snapshot of it")
        seq, epoch, sections = snapshot
        log.info("node %s loads group %d from its snapshot at position %d (%d sections)",
                 self.node_id, group, seq, len(sections))
        await self.engine.load_group_snapshot(group, seq, epoch, sections)
        self.bootstraps += 1
        self._unwalked(group)
        self._rebuilt_up_to(group, seq)
        return seq

    def _unwalked(self, group: int) -> None:
        """A group loaded from a snapshot walked under writes may show
        records up to a later position than its own: reads wait until its
        log is applied that far (a record applied again in between would
        show a member's older state than a read may have shown)."""
        covers = self.engine.walked.get(group, 0)
        if covers > self.engine.positions.get(group, (0, 0))[0]:
            self._rebuilding(group, covers, "it was loaded from a snapshot taken while it was "
                             "written, and its log is being applied up to that snapshot's end")

    async def _rewound(self, group: int, last_seq: int) -> None:
        """A followed group's log ends before what this node applied: Postgres
        lost committed transactions.  The group is replayed from the log."""
        applied = self.engine.positions.get(group, (0, 0))[0]
        log.error("node %s applied group %d up to position %d but its log now ends at %d: "
                  "Postgres lost committed transactions (use synchronous replication for "
                  "its standbys); replaying the group from the log", self.node_id, group,
                  applied, last_seq)
        async with self.tail.locked(group):
            self._rebuilding(group, last_seq, "Postgres lost committed records of its group; "
                             "it is being replayed from the cluster's log")
            await self.engine.reset_group(group)
            self.tail.applied[group] = 0

    async def _snapshot_groups(self) -> None:
        """Store the state of each group this node writes when it is due
        (:meth:`SnapshotMark.due`; see ``ClusterLog.store_snapshot``)."""
        for group, writer in list(self.writers.items()):
            mark = self._snapshot_marks.get(group)
            if mark is None:
                mark = self._snapshot_marks[group] = SnapshotMark(
                    await self.store.snapshot_seq(group))
            if not mark.due(writer, self.config.group_snapshot_records):
                continue
            seq, epoch, sections, covers = await self.engine.group_snapshot(group)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(writer.committed(covers), self.ack_timeout)
            size = sum(map(len, sections))
            if await self.store.store_snapshot(writer.lease, seq, epoch, sections, covers):
                self._snapshot_marks[group] = SnapshotMark(seq, size, writer.bytes)
                self.snapshots += 1
                log.info("node %s stored group %d's snapshot at position %d (%d bytes)",
                         self.node_id, group, seq, size)

    def _lost(self, group: int, exc: Fenced) -> None:
        task = asyncio.ensure_future(self._depose(group, exc))
        self._deposing.add(task)
        task.add_done_callback(self._deposing.discard)

    async def _depose(self, group: int, exc: BaseException) -> None:
        async with self._lock(group):
            writer = self.writers.pop(group, None)
            if writer is None:
                return
            # Its state may hold writes the log never took: no reads until
            # they are dropped and the log applied again as far as before.
            self._rebuilding(group, writer.committed_seq, "its writes that the cluster's log "
                             "never committed are being dropped")
            self.keeper.held.pop(group, None)
            await writer.close()
            if writer.fenced is None:
                writer.fence(exc if isinstance(exc, Exception) else RuntimeError(str(exc)))
            orphans = writer.unshipped()
            lost = isinstance(writer.fenced, LogLost)
            if lost:
                # Postgres lost commits (an asynchronous standby promoted): what
                # this node wrote beyond the log's end is set aside too.
                with contextlib.suppress(Exception):
                    committed = await self.store.last_seq_of_epoch(group, writer.lease.epoch)
                    orphans = await asyncio.to_thread(self.engine.written_by, group,
                                                      writer.lease.epoch, committed)
            log.warning("node %s no longer writes group %d: %s", self.node_id, group, exc)
            if not orphans:
                self._rebuilt_up_to(group, writer.committed_seq)
                await self.tail.resume(group, writer.committed_seq)
                return
            if self.ack == "local" or lost:
                # Acknowledged before the log had them: kept for `rankd cluster resubmit`.
                await self._orphan(group, writer.lease.epoch, orphans)
            else:
                # --ack log acknowledges nothing before its commit: each of these
                # was answered not_primary (never committed) or unacknowledged
                # (to be resubmitted by its writer with the same event id).
                log.warning("node %s drops %d records of group %d that the cluster's log "
                            "never committed (none was acknowledged)", self.node_id,
                            len(orphans), group)
            await self.engine.reset_group(group)
            await self.tail.resume(group, 0)

    async def _orphan(self, group: int, epoch: int, orphans: list[tuple[int, bytes]]) -> None:
        path = await asyncio.to_thread(self._set_aside, group, epoch, orphans)
        self.orphaned += len(orphans)
        log.error("node %s set %d records of group %d aside in %s: applied here, never "
                  "committed to the cluster's log (resubmit them with `rankd cluster "
                  "resubmit`)", self.node_id, len(orphans), group, path)

    def _set_aside(self, group: int, epoch: int, orphans: list[tuple[int, bytes]]) -> Path:
        directory = self.engine.config.data_dir / "wal"
        path = directory / f"orphan-g{group}-e{epoch}-{time.time_ns()}.records"
        path.write_bytes(b"".join(frame(seq, payload) for seq, payload in orphans))
        return path

    # --- watching the registers ---------------------------------------------------------

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self._round_seconds)
            try:
                await self._keep_node_lock()
                await self._watch_once()
                await self._release_idle()
            except Exception as exc:
                self._in_touch_since = None
                log.warning("node %s cannot read the cluster's registers: %s", self.node_id,
                            exc)

    async def _snapshot(self) -> None:
        """The groups' snapshots' own loop: storing a large group's state
        takes seconds, and the watch loop's heartbeats must not wait for it
        (a node silent for two leases drops out of its peers' live nodes
        while it holds its leases: writes sent to it get no address)."""
        while True:
            await asyncio.sleep(self._round_seconds)
            try:
                await self._snapshot_groups()
            except Exception as exc:
                log.warning("node %s cannot store a snapshot of its groups yet: %s",
                            self.node_id, exc)

    async def _place(self) -> None:
        """The placement's own loop: a move's flush, a group being loaded or
        a plan never delay the watch loop's heartbeats and lease checks."""
        while True:
            await asyncio.sleep(self._round_seconds)
            try:
                await self._follow_placement()
            except Exception as exc:
                log.warning("node %s cannot follow the groups' placement: %s", self.node_id,
                            exc)

    async def _watch_once(self) -> None:
        started = time.monotonic()
        applied = {g: seq for g, (seq, _) in self.engine.positions.items()}
        config = self.config
        members, per_group = self._members()
        await self.nodes.heartbeat(self.node_id, config.advertise, applied, config.advertise_tcp,
                                   self.trust.node_proof(self.node_id, config.advertise,
                                                         config.advertise_tcp,
                                                         config.advertise_resp),
                                   config.advertise_resp, members=members,
                                   group_members=per_group, planning=capacity.report(
                                       self.engine.config.data_dir, self.recovery.failed,
                                       self._spread))
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(
                "SELECT group_id, epoch, holder, last_seq, "
                "extract(epoch FROM lease_until - now()) AS left, now() AS at "
                "FROM rankd_groups")
            nodes = await conn.fetch(
                "SELECT node_id, advertise, advertise_tcp, applied, proof, advertise_resp, "
                "seen_at > now() - make_interval(secs => $1) AS alive "
                "FROM rankd_nodes", self.nodes.alive_seconds)
        self._touched(started)
        now = time.monotonic()
        vouched = [row for row in nodes if self._vouched(row)]
        self.known = {row["node_id"]: (row["advertise"], row["advertise_tcp"],
                                       row["advertise_resp"]) for row in vouched}
        peers = [row for row in vouched if row["alive"]]
        self.peers = {row["node_id"]: (row["advertise"], row["advertise_tcp"], {
            int(g): s for g, s in json.loads(row["applied"]).items()}) for row in peers}
        self.resp_peers = {row["node_id"]: row["advertise_resp"] for row in peers}
        self.peer_hosts.update(
            address for row in peers if row["node_id"] != self.node_id
            for address in (row["advertise"], row["advertise_tcp"], row["advertise_resp"]))
        for group, writer in list(self.writers.items()):
            if writer.fenced is not None:
                await self._depose(group, writer.fenced)
        for row in rows:
            group = row["group_id"]
            left = float(row["left"]) if row["left"] is not None else 0.0
            before = self.registers.get(group)
            register = self.registers[group] = Register(
                row["epoch"], row["holder"], row["last_seq"], now + left if left > 0 else 0.0,
                before.deferred if before is not None and before.epoch == row["epoch"] else 0)
            if group in self.writers or row["holder"] is None:
                continue  # (no holder: given up idle; the next write takes it)
            if left > 0 and row["holder"] != self.node_id:
                if left < self._round_seconds:  # it runs out before the next round
                    self._take_when_free(group, left)
                continue
            if row["holder"] != self.node_id and not self._in_touch():
                continue  # its primary may be alive: it gets a lease to renew first
            if group in self.unheld and self._held_elsewhere(group):
                continue  # a live node that holds it takes it (no bootstrap here)
            if left > 0 or self._most_caught_up(group) or register.deferred >= DEFER_ROUNDS:
                try:
                    # Taken only if its lease had run out when this round read it.
                    await self._take(group, expired_by=row["at"])
                except Exception as exc:
                    log.warning("node %s could not take group %d: %s", self.node_id, group, exc)
            else:
                register.deferred += 1

    def _members(self) -> tuple[int, dict[int, int]]:
        """Members the boards held here keep (each board's largest window),
        in all and per group (and, on the way, the groups kept on every
        node: ``replicas: all``, :attr:`_spread`)."""
        now = self.engine.clock()
        total, per_group, spread = 0, {}, set()
        for name, board in list(self.engine.boards.items()):
            members = max(board.member_counts(now).values(), default=0)
            total += members
            group = group_of(name)
            per_group[group] = per_group.get(group, 0) + members
            if board.config.replicas == "all":
                spread.add(group)
        self._spread = spread
        return total, per_group

    def _vouched(self, row: Any) -> bool:
        """Whether a live node's row is signed with the cluster secret; one
        that is not is reported once and never taken as a peer."""
        node = row["node_id"]
        if self.trust.vouches(node, row["advertise"], row["advertise_tcp"], row["proof"],
                              row["advertise_resp"]):
            self._unvouched.discard(node)
            return True
        if node not in self._unvouched:
            self._unvouched.add(node)
            log.error("node %s ignores node %r (at %s): its row in rankd_nodes is not signed "
                      "with this cluster's secret (a node started with another "
                      "--cluster-secret, or a row written by someone else); it gets no "
                      "forwarded writes and no client is sent to it", self.node_id, node,
                      row["advertise"])
        return False

    async def _keep_node_lock(self) -> None:
        """Take the node id's lock again after its session was lost (Postgres
        restarted); another process with this id started meanwhile is reported."""
        if self._node_lock.held:
            return
        try:
            await self._node_lock.acquire()
        except NodeIdInUse as exc:
            log.error("node %s: %s", self.node_id, exc)

    async def _release_idle(self) -> None:
        """Give up each written group nothing was written to for
        ``group_idle_seconds`` and whose every record is committed.  The
        committer leaves ``writers`` before the first await: a write from
        then on takes the group again (after this, under the group's lock),
        so no write reaches a committer that is given up."""
        idle = self.config.group_idle_seconds
        if not idle:
            return
        for group, writer in list(self.writers.items()):
            if not writer.idle(idle):
                continue
            async with self._lock(group):
                if self.writers.get(group) is not writer or not writer.idle(idle):
                    continue
                del self.writers[group]
                self.keeper.held.pop(group, None)
                await writer.close()
                with contextlib.suppress(Exception):
                    await self.store.release(writer.lease, idle=True)
                self.registers[group] = Register(writer.epoch, None, writer.committed_seq, 0.0)
                await self.tail.resume(group, writer.committed_seq)
                self.released += 1
                log.info("node %s gives up group %d at position %d: nothing written to it for "
                         "%g s (--group-idle-seconds)", self.node_id, group,
                         writer.committed_seq, idle)

    @property
    def _round_seconds(self) -> float:
        return min(1.0, self.config.lease_seconds / 3)

    def _touched(self, started: float) -> None:
        """A round that began at ``started`` read the registers.  When its
        answer took long, or the round before answered long before it began
        (Postgres paused, stopped, cut off: every lease ran out meanwhile,
        by the same clock, and every heartbeat went stale), this node is in
        touch again only from now."""
        now = time.monotonic()
        gap = max(2 * self._round_seconds, self.config.lease_seconds / 2)
        if (self._in_touch_since is None or now - started > gap
                or started - self._last_round_end > gap):
            self._in_touch_since = now
        self._last_round_end = now

    def _in_touch(self) -> bool:
        """Whether this node read the registers round after round for a
        whole lease.  Only then does it take a group from another node whose
        lease ran out: after an outage of Postgres itself every lease has
        run out, and each live primary gets that lease to renew its own
        (under ``--ack local`` it holds acknowledged writes that only it has)."""
        since = self._in_touch_since
        return since is not None and time.monotonic() - since >= self.config.lease_seconds

    def _take_when_free(self, group: int, left: float) -> None:
        """Try to take ``group`` the moment its lease runs out (a primary
        that stopped renewing): failover then takes about one lease, not a
        lease and a round of the watch loop."""
        if group in self._timers:
            return

        async def take_then() -> None:
            try:
                await asyncio.sleep(left + 0.01)
                if (group not in self.writers and self._most_caught_up(group)
                        and self._in_touch()):
                    await self._take(group, seen_now=True)
            except Exception as exc:
                log.warning("node %s could not take group %d: %s", self.node_id, group, exc)
            finally:
                self._timers.pop(group, None)

        self._timers[group] = asyncio.ensure_future(take_then())

    def _most_caught_up(self, group: int) -> bool:
        mine = self.engine.positions.get(group, (0, 0))[0]
        return all(applied.get(group, 0) <= mine for node, (_, _, applied)
                   in self.peers.items() if node != self.node_id)

    async def read_holder(self, group: int) -> bool:
        """Read ``group``'s register now (``Topology.learn``), shared with
        the writes asking at the same time (``RegisterReads``): a view that
        Postgres cannot give in time stays as it was (False)."""
        return await self._register_reads.learn(group)

    async def _read_register(self, group: int) -> None:
        self._note_register(group, await self.store.register(group))

    def _note_register(self, group: int, register: dict | None) -> None:
        """Keep what a read of ``group``'s register (``ClusterLog.register``) says."""
        if register is None:
            return
        left = register["lease_left"] or 0.0
        self.registers[group] = Register(register["epoch"], register["holder"],
                                         register["last_seq"],
                                         time.monotonic() + left if left > 0 else 0.0)

    async def _seen_expired(self, group: int) -> tuple[bool, datetime.datetime | None]:
        """Whether to take ``group`` on what a read of its register made now
        shows, not on what this node last knew of it, and the read's time
        (``expired_by`` of the take: another node's lease is taken only if
        this read saw it run out while this node was in touch with
        Postgres).  A view read before Postgres paused tells nothing of a
        lease that the pause ran out: its primary gets a lease in touch to
        renew it (under ``--ack local`` it holds acknowledged writes that
        only it has); meanwhile its writes here are refused."""
        started = time.monotonic()
        register = await self.store.register(group)
        self._touched(started)  # a read that waited on a Postgres away: not in touch
        self._note_register(group, register)
        if register is None:  # no register yet: nobody ever held the group
            return True, None
        holder = register["holder"]
        if holder not in (None, self.node_id):
            if (register["lease_left"] or 0.0) > 0:
                return False, None  # a live primary: the write goes there
            if not self._in_touch():
                raise self._not_taken(group, holder)
        return True, register["at"]

    # --- placement and moves (rankd.cluster.placement, rankd.cluster.moves) -------------

    def group_lock(self, group: int) -> asyncio.Lock:
        """The lock held while ``group`` is taken, given up or handed over."""
        return self._lock(group)

    async def take_handed(self, group: int, epoch: int | None = None,
                          phases: Phases | None = None) -> None:
        """Take ``group``, which a move hands (or gave) to this node: at once,
        whatever its register last read here said.  Told the hand-over's
        ``epoch``, and the register still there and naming this node, the
        lease the hand-over's transaction gave is this node's as it is (no
        new epoch: a transaction less while writes wait)."""
        if group in self.writers:
            return
        self.tail.hurry()  # the hand-over's last records: read now, not after a gather
        read_at = time.monotonic()
        row = await self.store.register(group)
        if phases is not None:
            phases.step("register")
        if row is None:
            return
        left = row["lease_left"] or 0.0
        self.registers[group] = Register(row["epoch"], row["holder"], row["last_seq"],
                                         read_at + left if left > 0 else 0.0)
        if row["holder"] not in (None, self.node_id):
            return  # handed elsewhere meanwhile
        handed = None
        if (epoch is not None and row["epoch"] == epoch and row["holder"] == self.node_id
                and left > 0 and group not in self.keeper.held):
            handed = (Lease(group, epoch, self.node_id, row["last_seq"]), read_at, left)
        await self._take(group, handed, phases)

    async def handed_over(self, group: int, writer: GroupCommitter, epoch: int,
                          target: str) -> None:
        """``group``, written here by ``writer`` (every record committed),
        now belongs to ``target`` at ``epoch``: follow it from here on."""
        del self.writers[group]
        self.keeper.held.pop(group, None)
        await writer.close()
        self.registers[group] = Register(epoch, target, writer.committed_seq,
                                         time.monotonic() + self.config.lease_seconds)
        await self.tail.resume(group, writer.committed_seq)

    async def _follow_placement(self) -> None:
        """Read the placement; place the groups written here that nobody
        placed yet; carry out the moves this node can."""
        self.layout = await self.placement.read()
        live = set(self.peers) | {self.node_id}
        load = {node: counts["primary"] + counts["follower"]
                for node, counts in self.layout.per_node().items()}
        new = [g for g, w in self.writers.items()
               if g not in self.layout.groups and w.fenced is None]
        fit, spread = live, set()
        if new:  # (no follower on a node short of disk; every node for a spread group)
            fit = live - (await capacity.read_reports(self.pool, live,
                                                      self.config.min_free_disk)).full
            spread = set(self._spread_here())
        for group, writer in list(self.writers.items()):
            if group in new and writer.fenced is None:
                followers = choose_followers(self.node_id, fit, len(fit) if group in spread
                                             else self.replicas, load)
                if await self.placement.place_if_new(group, self.node_id, followers):
                    for node in followers:
                        load[node] = load.get(node, 0) + 1
        await self._hold_placed()
        await self.mover.round(self.layout)
        if self._in_touch():
            await self.planner.round(self.layout, live, now=time.monotonic())

    async def request_move(self, group: int, target: str) -> dict[str, Any]:
        """Ask for ``group`` to move to ``target`` (``rankd cluster move``):
        :class:`InvalidInput` for a group out of range or a node that is not
        live, nothing changed."""
        self._check_joined()
        if not 0 <= group < GROUPS:
            raise InvalidInput(f"group must be from 0 to {GROUPS - 1}, got {group}")
        if target != self.node_id and target not in self.peers:
            raise InvalidInput(f"node {target!r} is not a live node of this cluster (live: "
                               f"{', '.join(sorted({*self.peers, self.node_id}))})")
        refusal = await disk_fit.move_refusal(self.pool, target, group,
                                              self.config.min_free_disk,
                                              holds=self.layout.holds(target, group))
        if refusal is not None:
            raise InvalidInput(refusal)
        epoch = await self.placement.request_move(group, target, self.replicas)
        log.info("node %s: group %d is to move to node %s (topology epoch %d)", self.node_id,
                 group, target, epoch)
        return {"group": group, "node": target, "topology_epoch": epoch}

    def _held_elsewhere(self, group: int) -> bool:
        placed = self.layout.groups.get(group)
        return placed is not None and any(node in self.peers for node in placed.nodes
                                          if node != self.node_id)

    def _not_held(self, group: int) -> EngineError:
        """The answer to a request of ``group``, placed on other nodes only:
        sent on to the node that writes it (or should: its placed primary)."""
        register = self.registers.get(group)
        placed = self.layout.groups.get(group)
        candidates = [register.holder] if register is not None and register.holder else []
        candidates += list(placed.nodes) if placed is not None else []
        for node in candidates:
            if node in self.peers and node != self.node_id:
                address, tcp, _ = self.peers[node]
                return NotPrimary(f"node {self.node_id} does not hold group {group}; node "
                                  f"{node} does, at {address}", address, tcp,
                                  primary_resp=self.resp_peers.get(node))
        return Unavailable(f"node {self.node_id} does not hold group {group} and no live "
                           "node that does is known yet; nothing was applied; try again "
                           "shortly")

    async def _drop_group(self, group: int) -> None:
        """Stop holding ``group`` (placed elsewhere): its boards go, its log
        is no longer followed."""
        async with self._lock(group):
            if group in self.writers or group in self.unheld:
                return
            self.unheld.add(group)
            self.tail.pause(group)
            async with self.tail.locked(group):
                self.tail.applied.pop(group, None)
                self._unreadable.pop(group, None)
                self._rebuild_to.pop(group, None)
                if group in self.engine.positions:
                    await self.engine.reset_group(group)
        log.info("node %s no longer holds group %d (placed on other nodes)", self.node_id,
                 group)

    async def _gain_group(self, group: int) -> None:
        """Hold ``group`` (placed here): load its snapshot, then its log;
        its reads wait until it reached the log's end as last read."""
        async with self._lock(group):
            if group not in self.unheld:
                return
            register = self.registers.get(group)
            self._rebuilding(group, register.last_seq if register else 0,
                             "this node is loading the group (snapshot, then log)")
            self.unheld.discard(group)
            await self.tail.resume(group, 0)
        log.info("node %s holds group %d from now on: loading it", self.node_id, group)

    async def _hold_placed(self) -> None:
        """Hold exactly the groups placed here (and those written here), and
        name this node primary of the groups it writes (after a failover)."""
        layout = self.layout
        changes = {}
        spread = await self._spread_kept()
        for group, placed in layout.groups.items():
            writer = self.writers.get(group)
            if writer is not None and placed.primary != self.node_id and writer.fenced is None:
                followers = tuple(n for n in placed.nodes if n != self.node_id)
                if group not in spread:
                    followers = followers[:self.replicas]
                changes[group] = Placed(self.node_id, followers, 0)
            if writer is not None or self.node_id in placed.nodes:
                if group in self.unheld:
                    await self._gain_group(group)
            elif (group not in self.unheld and group not in self.mover.handing
                  and len(placed.followers) >= self.replicas and group not in spread):
                # (a group short of followers keeps its copies: the planner is
                # about to place it back on a node that was away a moment; so
                # does a spread group, which the planner places on every node)
                await self._drop_group(group)
        if changes:
            with contextlib.suppress(Stale):
                self.layout.epoch = await self.placement.replace(layout.epoch, changes)

    def _spread_here(self) -> list[int]:
        """The groups held here with a board kept on every node (``replicas:
        all``), counted now (a pass over every board: only when placing a
        new group; the watch loop's count is :attr:`_spread`)."""
        return capacity.spread_groups(self.engine.boards.items())

    async def _spread_kept(self) -> set[int]:
        """The spread groups this node keeps while the placement names it
        no holder of them (a move or a failover leaves ``--replicas``
        followers; the planner places them on every node again): none on a
        node being drained, short of disk or whose log failed (the planner
        would not place them back)."""
        spread = set(self._spread)
        if not spread:
            return spread
        free = capacity.free_bytes(self.engine.config.data_dir)
        if (self.recovery.failed or (free is not None and free < self.config.min_free_disk)
                or await capacity.draining(self.pool, self.node_id)):
            return set()
        return spread

    async def request_drain(self, target: str, *, cancel: bool = False) -> dict[str, Any]:
        """Move every group off ``target`` (``rankd cluster drain``), or stop."""
        self._check_joined()
        known = {row["node"] for row in (await self.nodes.status())["nodes"]}
        if target not in known:
            raise InvalidInput(f"node {target!r} is not a node of this cluster (known: "
                               f"{', '.join(sorted(known))})")
        await self.planner.drain(target, cancel=cancel)
        log.info("node %s: node %s is %s", self.node_id, target,
                 "no longer drained" if cancel else "to be drained")
        return {"node": target, "draining": not cancel}

    async def request_rebalance(self) -> dict[str, Any]:
        """Have the planner spread the primaries again (``rankd cluster rebalance``)."""
        self._check_joined()
        await self.planner.request_rebalance()
        return {"rebalance": "requested"}

    # --- status -------------------------------------------------------------------------

    @property
    def joined(self) -> bool:
        """Whether this node joined its cluster (it takes writes)."""
        return self._joined.is_set()

    @property
    def fresh(self) -> bool:
        """Whether every group is within ``--max-follow-lag`` (``/v1/ready``)."""
        return self.freshness.all_fresh()

    @property
    def log_connected(self) -> bool:
        """Whether the log tail's connection to Postgres is up."""
        return bool(self.tail and self.tail.connected)

    async def _migrate(self) -> None:
        """Every schema migration of the start (idempotent: see
        ``cluster.migrations``), and the checks made on the way."""
        async with self.pool.acquire() as conn:
            await migrate(conn)
            # Boards grouped by another scheme (an older rankd's) are refused.
            self.scheme_layout = await check_scheme(conn)
            check_data_dir(self.engine.config.data_dir, self.scheme_layout,
                           bool(self.engine.positions))
            if self.trust.secret is None:
                self.trust.secret = await shared_secret(conn)
        await self.nodes.migrate()
        await self.placement.migrate()
        await self.planner.migrate()

    def figures(self) -> dict[str, float]:
        """Figures for ``/metrics``."""
        tail = self.tail
        followed = {g: s for g, s in tail.applied.items() if g not in self.writers} if tail \
            else {}
        return {
            "groups_written": len(self.writers), "groups_followed": len(followed),
            "unshipped_records": sum(w.next_seq - 1 - w.committed_seq
                                     for w in self.writers.values()),
            "unshipped_seconds": max((w.unshipped_seconds() for w in self.writers.values()),
                                     default=0.0),
            "follow_lag_records": max((tail.known.get(g, s) - s for g, s in followed.items()),
                                      default=0),
            "log_connected": int(self.log_connected),
            "takeovers": self.takeovers, "orphaned_records": self.orphaned,
            "group_snapshots": self.snapshots, "bootstraps": self.bootstraps,
            "disk_recoveries": self.recovery.recoveries, **self.freshness.figures(),
            **(self.mover.figures() if self.mover is not None else {}),
            **(self.planner.figures() if self.planner is not None else {}),
            "topology_epoch": self.layout.epoch, "groups_unheld": len(self.unheld),
        }

    def _check_joined(self) -> None:
        """Refuse a cluster request (503) until this node joined: before,
        it has no view of the nodes, the placement or the planner."""
        if not self._joined.is_set():
            raise Unavailable(f"node {self.node_id} is joining the cluster: try again "
                              "shortly, or ask another node")

    async def status(self) -> dict[str, Any]:
        """What ``GET /v1/cluster`` shows: every node and group as Postgres
        has them, and this node's own view."""
        self._check_joined()
        try:
            status = await asyncio.wait_for(self.nodes.status(), STATUS_SECONDS)
        except POSTGRES_ERRORS as exc:
            # What this node last read, said to be so, rather than a 500.
            status = {**self._known_status(), "stale": True,
                      "error": f"cannot reach the cluster's Postgres: "
                               f"{type(exc).__name__}: {exc}"}
        else:
            status["stale"] = False
        layout = self.layout
        if not status["stale"]:
            # Read now, as the groups are: the placement loop's copy may be a
            # round (or a long move) behind, and `status` is what an operator
            # waits on after `rankd cluster drain`.
            with contextlib.suppress(*POSTGRES_ERRORS):
                layout = await asyncio.wait_for(self.placement.read(), STATUS_SECONDS)
        # This node's copy can be older than what an earlier answer read from
        # Postgres (which then went out of reach): the topology epoch shown
        # never goes back.
        if layout.epoch < self._status_layout.epoch:
            layout = self._status_layout
        self._status_layout = layout
        status["placement"] = self._placement_status(layout)
        status["this_node"] = self.local_status()
        return status

    def _placement_status(self, layout: Layout) -> dict[str, Any]:
        """Groups placed per node, and moves in progress, as ``layout`` has them."""
        return {"topology_epoch": layout.epoch, "replicas": self.replicas,
                "per_node": layout.per_node(),
                "groups": {str(g): {"primary": p.primary, "followers": list(p.followers)}
                           for g, p in sorted(layout.groups.items())},
                "moves": [{"group": g, "target": t} for g, t in sorted(layout.moves.items())]}

    def _known_status(self) -> dict[str, Any]:
        """:meth:`status` as of this node's last read of the registers."""
        now = time.monotonic()
        return {
            "nodes": [{"node": node, "advertise": address, "alive": None}
                      for node, (address, _, _) in sorted(self.peers.items())],
            "groups": [{"group": group, "epoch": r.epoch, "primary": r.holder,
                        "lease_seconds_left": round(max(0.0, r.lease_until - now), 3),
                        "last_seq": r.last_seq}
                       for group, r in sorted(self.registers.items())],
            "read_seconds_ago": round(now - self._last_round_end, 3)
            if self._last_round_end else None,
        }

    def local_status(self) -> dict[str, Any]:
        """This node's view: what it writes and how far it applied the rest."""
        return {
            "node": self.node_id, "advertise": self.config.advertise, "ack": self.ack,
            "writes": {str(g): {"epoch": w.lease.epoch, "next_seq": w.next_seq,
                           "committed_seq": w.committed_seq,
                           "unshipped": w.next_seq - 1 - w.committed_seq}
                       for g, w in sorted(self.writers.items())},
            "follows": {str(g): s for g, s in sorted(self.tail.applied.items())
                        if g not in self.writers} if self.tail else {},
            "tail_connected": self.log_connected,
            "tail_stage": self.tail.stage if self.tail else None, "orphaned_records": self.orphaned,
            "planner": bool(self.planner and self.planner.lock.held),
            "rebalancing": bool(self.planner and self.planner.lock.held
                                and self.planner.rebalancing),
            "unheld_groups": sorted(self.unheld),
        }


async def _outcome(step: Any) -> BaseException | None:
    """What awaiting ``step`` raised (None if nothing), as ``gather`` with
    ``return_exceptions`` gives it, without a task."""
    try:
        await step
    except Exception as exc:
        return exc
    return None
