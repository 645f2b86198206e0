"""Moving a board group from the node that writes it to another, under load.

A move is a row of ``rankd_moves`` (:meth:`Placement.request_move`, from
``rankd cluster move GROUP NODE`` or the planner), which also names the
target a follower of the group, so the target holds it (bootstrapped from
the group's snapshot and its log tail, as any follower).  Every round of
its watch loop, the node that writes the group (whoever that is by then:
a failover may have moved it meanwhile) looks at the moves of its groups
(:meth:`Mover.round`); once the target is live and has applied the group to
within :data:`CATCH_UP_RECORDS` of its last committed position, the
source cuts over (:meth:`Mover.cut_over`):

1. it refuses the group's new writes (``writer()`` raises
   :class:`~rankd.engine.errors.Unavailable`: 503 on REST, ``TRYAGAIN`` on
   RESP; nothing of them is applied);
2. it waits for every record of the group it applied to commit to the log
   (its shipping flushed: under ``--ack local`` too, nothing acknowledged
   stays only here);
3. one transaction (:meth:`Placement.hand_over`) gives the group's register
   to the target at the next epoch, so the source's appends are fenced from
   then on whatever it does, and notifies the target;
4. the source follows the group from its last committed position; the
   target, told at once, takes the group (a new epoch again, the log
   drained to its end through the follower's path, as any takeover) and
   opens it for writes.

Writes pause for steps 1-4 only: a flush of what is in flight and three
short transactions, never anything proportional to the group's boards (the
target loaded them before, as a follower).  A crash at any step loses
nothing acknowledged: before step 3 commits the source still holds the
group (or, dead, loses it to an ordinary failover, and the move is carried
out by the new holder); after it, the target holds a lease on the group
(dead, it loses it to a failover likewise); the log is the truth and the
register's epoch fences every earlier writer.  A step that fails (Postgres
away, the flush too slow) reopens the group's writes on the source; the
move is tried again the next round.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from typing import Any, Protocol

from rankd._tasks import STOP_SECONDS, stop_task
from rankd.cluster.committer import GroupCommitter
from rankd.cluster.cutover import Gates, Phases
from rankd.cluster.placement import CHANNEL, Layout, Placement
from rankd.engine.errors import Unavailable
from rankd.postgres_link import POSTGRES_ERRORS, reconnecting

log = logging.getLogger(__name__)

#: A target this close to the group's last committed position is caught
#: up enough: what it still lacks it drains from the log while writes wait.
CATCH_UP_RECORDS = 2000
#: How long the source waits for its in-flight records to commit before it
#: gives the cut-over up (and reopens writes) for this round.
FLUSH_SECONDS = 2.0
#: How long the source holds the writes that came during a cut-over for the
#: target to say it holds the group's writes in turn (until it opens the
#: group), before it lets them go on anyway.
OPEN_WAIT_SECONDS = 1.0
#: Cut-overs whose phases ``/metrics`` and the log keep, per node.
KEPT = 100


class Host(Protocol):
    """What a mover needs of its node (``ClusterNode``, which imports this module)."""

    node_id: str
    config: Any
    replicas: int
    writers: dict[int, GroupCommitter]
    registers: dict[int, Any]
    #: Live nodes: id -> (HTTP address, TCP address, {group: applied seq}).
    peers: dict[str, tuple[str, str | None, dict[int, int]]]

    def group_lock(self, group: int) -> asyncio.Lock: ...

    async def take_handed(self, group: int, epoch: int | None = None,
                          phases: Phases | None = None) -> None: ...

    async def handed_over(self, group: int, writer: GroupCommitter, epoch: int,
                          target: str) -> None: ...


class Mover:
    """One node's side of group moves: as source, and as target."""

    def __init__(self, node: Host, placement: Placement) -> None:
        self.node = node
        self.placement = placement
        #: Groups whose writes this node refuses while it hands them over.
        self.handing: set[int] = set()
        #: Groups whose writes wait here (rankd.cluster.cutover): a cut-over's.
        self.gates = Gates()
        #: Moves carried out here as source, and their write pauses (seconds).
        self.moved = 0
        self.pauses: list[float] = []
        #: The last cut-overs' phases here, as source and as target.
        self.phases: list[tuple[str, Phases]] = []
        self._listener: asyncio.Task | None = None
        self._taking: set[asyncio.Task] = set()
        #: Cut-overs handed from here that wait for their target to hold the writes.
        self._opening: dict[int, asyncio.Future[None]] = {}

    def refusal(self, group: int) -> Unavailable:
        return Unavailable(f"group {group} is moving from node {self.node.node_id} to "
                           "another node; nothing was applied; try again in a moment")

    async def start(self) -> None:
        self._listener = asyncio.create_task(self._listen(), name="rankd-moves-listen")

    async def stop(self) -> None:
        await stop_task(self._listener, STOP_SECONDS)
        for task in list(self._taking):
            await stop_task(task, STOP_SECONDS)

    async def _listen(self) -> None:
        """Take a group the moment its source hands it here."""
        async for conn in reconnecting(self.node.config.dsn, down=lambda exc: None,
                                       timeout=5, min_delay=0.1, max_delay=3.0):
            try:
                await conn.add_listener(CHANNEL, self._notified)
                while not conn.is_closed():
                    await asyncio.sleep(1.0)
            except POSTGRES_ERRORS as exc:
                log.debug("node %s lost its topology listener: %s", self.node.node_id, exc)

    def _notified(self, connection: object, pid: int, channel: str, payload: str) -> None:
        """A hand-over (``group:target:epoch``) or its target holding the
        group's writes (``group:target:epoch:holding``), as every node hears it."""
        group_text, target, epoch_text, *rest = payload.split(":")
        group, epoch = int(group_text), int(epoch_text)
        holding = rest[:1] == ["holding"]
        if target != self.node.node_id:
            self._learn(group, target, epoch)
            waiting = self._opening.get(group)
            if holding and waiting is not None and not waiting.done():
                waiting.set_result(None)
            return
        if holding:
            return
        # Writes that reach this node for the group wait until it writes it;
        # the source, told so, sends those it held here meanwhile.
        self.gates.close(group)
        for step in (self._take_handed(group, epoch, Phases()), self._say_holding(group, epoch)):
            task = asyncio.ensure_future(step)
            self._taking.add(task)
            task.add_done_callback(self._taking.discard)

    async def _say_holding(self, group: int, epoch: int) -> None:
        try:
            await self.placement.notify_holding(group, self.node.node_id, epoch)
        except POSTGRES_ERRORS as exc:  # (the source lets them go after a while anyway)
            log.debug("node %s could not say it holds group %d's writes: %s",
                      self.node.node_id, group, exc)

    def _learn(self, group: int, target: str, epoch: int) -> None:
        """Route ``group``'s requests to ``target`` from now on (rather than
        from the next read of the registers), unless this node knows a newer
        epoch of it or writes it."""
        node = self.node
        register = node.registers.get(group)
        if group in node.writers or register is None or register.epoch > epoch:
            return
        node.registers[group] = dataclasses.replace(
            register, epoch=epoch, holder=target,
            lease_until=time.monotonic() + node.config.lease_seconds)

    async def _take_handed(self, group: int, epoch: int, phases: Phases) -> None:
        node = self.node
        try:
            await node.take_handed(group, epoch, phases)
        except Exception as exc:  # the watch loop takes it next round
            log.warning("node %s could not take group %d handed to it: %s",
                        node.node_id, group, exc)
        finally:
            self.gates.open(group)
        writer = node.writers.get(group)
        if writer is None:
            return
        self._keep("target", phases)
        log.info("node %s opened group %d handed to it at epoch %d, %.1f ms after it was told "
                 "(at %.6f): %s", node.node_id, group, writer.epoch, phases.total_ms,
                 phases.began_at, phases.text())

    def _keep(self, side: str, phases: Phases) -> None:
        self.phases.append((side, phases))
        del self.phases[:-KEPT]

    async def round(self, layout: Layout) -> None:
        """Carry out the requested moves this node can: of groups it writes
        to a caught-up live target, and of unwritten groups to itself."""
        node = self.node
        for group, target in sorted(layout.moves.items()):
            try:
                writer = node.writers.get(group)
                register = node.registers.get(group)
                if target == node.node_id:
                    if writer is not None and writer.fenced is None:
                        await self.placement.forget_move(group, target)  # already here
                    elif register is None or register.holder is None:
                        await node.take_handed(group)  # nobody writes it: take it here
                        if group in node.writers:
                            await self.placement.forget_move(group, target)
                    continue
                if writer is None or writer.fenced is not None or group in self.handing:
                    continue
                peer = node.peers.get(target)
                if peer is None:
                    continue  # target not live: the move waits for it
                if peer[2].get(group, -1) < writer.committed_seq - CATCH_UP_RECORDS:
                    continue  # still loading the group
                # Confirmed by a heartbeat the target wrote since the move was
                # asked for: the copy read here can be older (this node's watch
                # loop busy storing a snapshot), from before the target dropped
                # the group, and the target would then load it while writes wait.
                applied = await self.placement.applied_since_asked(group, target)
                if applied is None or applied < writer.committed_seq - CATCH_UP_RECORDS:
                    continue
                await self.cut_over(group, target)
            except Exception as exc:
                log.warning("node %s could not move group %d to %s yet: %s", node.node_id,
                            group, target, exc)

    async def cut_over(self, group: int, target: str) -> bool:
        """Hand ``group``, written here, to ``target`` (steps 1-4 of the
        module docstring); True once the register names the target.  The
        writes that come meanwhile wait (:class:`~rankd.cluster.cutover.Gates`)
        until the target writes the group, and are then sent there."""
        node = self.node
        self._opening[group] = opened = asyncio.get_running_loop().create_future()
        try:
            async with node.group_lock(group):
                writer = node.writers.get(group)
                if writer is None or writer.fenced is not None:
                    return False
                phases = Phases()
                self.handing.add(group)
                self.gates.close(group)
                try:
                    last = writer.next_seq - 1
                    unshipped = last - writer.committed_seq
                    if unshipped > 0:  # (bounded by what is in flight, not a timer)
                        await asyncio.wait_for(writer.committed(last), FLUSH_SECONDS)
                    phases.step("flush")
                    epoch = await self.placement.hand_over(
                        group, writer.lease.epoch, node.node_id, target, node.replicas,
                        node.config.lease_seconds)
                    phases.step("hand-over")
                    if epoch is None:  # the group moved on: the deposition path handles it
                        return False
                    handed_at = time.time()
                    await node.handed_over(group, writer, epoch, target)
                    phases.step("follow")
                except (TimeoutError, *POSTGRES_ERRORS) as exc:
                    log.warning("node %s did not hand group %d to %s: %s; its writes go on "
                                "here", node.node_id, group, target, exc or type(exc).__name__)
                    return False
                finally:
                    self.handing.discard(group)
            # The writes held here go on once the target holds them in turn
            # (it opens the group meanwhile: they travel while it does).
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(opened, OPEN_WAIT_SECONDS)
            phases.step("target holding")
        finally:
            self._opening.pop(group, None)
            self.gates.open(group)
        self.moved += 1
        self.pauses.append(phases.total_ms / 1000)
        del self.pauses[:-KEPT]
        self._keep("source", phases)
        log.info("node %s handed group %d to node %s at position %d (epoch %d; closed at "
                 "%.6f, committed at %.6f; %d records flushed), writes held here for %.1f ms: "
                 "%s", node.node_id, group, target, writer.committed_seq, epoch,
                 phases.began_at, handed_at, unshipped, phases.total_ms, phases.text())
        return True

    def figures(self) -> dict[str, float]:
        """Figures for ``/metrics``."""
        return {"moves_out": self.moved,
                "move_last_pause_seconds": self.pauses[-1] if self.pauses else 0.0,
                "move_writes_held": self.gates.held,
                "move_longest_hold_seconds": self.gates.longest}

    def last_steps(self) -> dict[tuple[str, str], float]:
        """The steps of the last cut-over here as source and as target:
        ``(side, step)`` -> seconds, for ``/metrics``."""
        steps: dict[tuple[str, str], float] = {}
        for side in ("source", "target"):
            last = next((phases for kept, phases in reversed(self.phases) if kept == side),
                        None)
            if last is not None:
                steps.update({(side, step): ms / 1000 for step, ms in last.steps.items()})
        return steps
