"""The planner: spreads board groups' primaries and followers over live nodes.

One node at a time plans: whichever holds a Postgres advisory lock
(a :class:`~rankd.cluster.nodelock.NodeLock` of its own key, on a session
of its own: it dies with the node).
The lock only avoids duplicate work: a plan changes the placement with
the topology epoch's compare-and-set (:meth:`Placement.replace`), and a
move is carried out by the group's holder under its register's epoch
(:mod:`rankd.cluster.moves`), so two planners, or a planner acting on a
stale view, can waste a move but never break a group.

:func:`plan` is pure (what to change, from the placement, the live nodes
and the draining ones); :class:`Planner` reads, plans and writes once per
round of the planning node's watch loop.  Each round it:

* **restores R**: drops followers that are dead or draining (a dead
  node's copy is no copy) and adds the least loaded live nodes until each
  group has ``replicas`` followers (or every other live node);
* **drains**: moves the primary of each group a draining node writes to
  one of its followers (the least loaded);
* **rebalances** when the live nodes changed since the last plan (a node
  joined or left) and then stayed the same for :data:`STABLE_SECONDS`, or
  when asked (``rankd cluster rebalance``): moves primaries from the
  most loaded node to the least loaded while a move narrows the gap
  between them by more than :data:`MIN_GAIN` of an average group,
  preferring a target that already follows the group (nothing to load),
  then, once no primary moves, relocates followers from the node holding
  the most load to the one holding the least (:mod:`rankd.cluster.node_load`);
  it also starts one by itself once the load, followers counted, stayed
  drifted for ``--auto-rebalance`` seconds (:mod:`rankd.cluster.drift`);
* gives no group to a node short of disk, and empties one whose local log
  fails, as the nodes report in their heartbeats, and keeps a group with a
  ``replicas: all`` board on every node (:mod:`rankd.cluster.capacity`);
  gives a node a group it must load only if the group's snapshot and log
  fit in its free space over ``--min-free-disk`` (:mod:`rankd.cluster.disk_fit`).

Nodes are loaded by group *weights* (:mod:`rankd.cluster.load`: memory and
write rate, the average group weighing 1): a node's primaries weigh what
their groups weigh, its followers two thirds of it, and followers go to
the nodes holding the least weight.
With groups alike (or no weights) that is spreading by count: primaries
end differing by at most one group.

At most ``--max-moves`` (default :data:`MAX_MOVES`) moves are in progress
at once: a node joining a large cluster is filled a few groups at a time,
never by a storm of bootstraps; a rebalance goes on round after round
until a round finds nothing to move.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from rankd.cluster.capacity import MIN_FREE_BYTES, Capacity, read_reports
from rankd.cluster.disk_fit import DiskRoom, GroupSizes, disk_room
from rankd.cluster.drift import SETTLE_SECONDS, DriftWatch, drift_ratio
from rankd.cluster.load import GroupLoad
from rankd.cluster.log import lock_schema
from rankd.cluster.node_load import FOLLOWER_WEIGHT, expected, node_loads, relocate_followers
from rankd.cluster.nodelock import NodeLock
from rankd.cluster.placement import Layout, Placed, Placement, Stale, choose_followers

log = logging.getLogger(__name__)

#: The advisory lock's key (another number than the node ids' and migrations').
PLANNER_LOCK = 7231004
#: Moves in progress at most (requested, not yet handed over).
MAX_MOVES = 8
#: How long the set of live nodes must stay the same before the planner
#: moves primaries for its change: a node restarting, or every node
#: looking silent while Postgres itself was away, moves nothing.
STABLE_SECONDS = 30.0
#: The least a rebalancing move must narrow the gap between the most and the
#: least loaded node by, in average groups: no move for a crumb of balance.
MIN_GAIN = 0.1
#: What a target that must load the group (it does not follow it) costs a
#: rebalancing move's choice, in average groups.
LOAD_COST = 0.25

DRAIN_SCHEMA = """
CREATE TABLE IF NOT EXISTS rankd_draining (
    node_id    text PRIMARY KEY,
    since      timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE rankd_topology ADD COLUMN IF NOT EXISTS rebalance_at timestamptz;
"""


@dataclass
class Plan:
    """What one round of planning changes."""

    #: New placements (followers only: primaries change by moves).
    placements: dict[int, Placed] = field(default_factory=dict)
    #: Moves to request: group -> target.
    moves: dict[int, str] = field(default_factory=dict)
    #: The groups of ``placements`` whose follower a rebalance relocated.
    relocated: set[int] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.placements or self.moves)


def plan(layout: Layout, live: Iterable[str], draining: Iterable[str], replicas: int, *,
         rebalance: bool = False, max_moves: int = MAX_MOVES,
         weights: Mapping[int, float] | None = None, failing: Iterable[str] = (),
         full: Iterable[str] = (), spread: Iterable[int] = (),
         disk: DiskRoom | None = None) -> Plan:
    """The changes that bring ``layout`` towards an even spread over the
    ``live`` nodes that are not ``draining`` (see the module docstring);
    ``weights``: each group's (1 for a group without one).

    ``failing``: nodes whose local log fails, emptied as if draining (a
    copy they cannot log is no copy); ``full``: nodes short of disk, which
    keep what they hold but are given no group, as primary or follower
    (:mod:`rankd.cluster.capacity`); ``spread``: groups holding a board
    with ``replicas: all``, followed by every usable node; ``disk``: each
    node's room and each group's size (:mod:`rankd.cluster.disk_fit`): a
    node is given a group it does not hold only if it has room for it."""
    weights = weights or {}
    disk = disk or DiskRoom()

    def weight(group: int) -> float:
        return weights.get(group, 1.0)

    failing = set(failing)
    draining = set(draining) | failing
    live = set(live)
    usable = sorted(live - draining)
    # The nodes a group may be given to (as primary or new follower).
    full = set(full)
    targets = [node for node in usable if node not in full]
    spread = set(spread)
    out = Plan()
    if not usable:
        return out
    primaries = dict.fromkeys(usable, 0.0)  # the weight of the groups each leads
    # What each holds: the groups it leads, and a follower's share
    # (rankd.cluster.node_load) of those it follows.
    load = node_loads(layout.groups, usable, weights)
    for group, placed in layout.groups.items():
        if placed.primary in primaries:
            primaries[placed.primary] += weight(group)
    # A move in progress counts as done: the primaries it hands over are the
    # target's already (else the next round, a move or two later, plans more
    # moves off the same node and the rebalance swings back and forth).
    for group, target in layout.moves.items():
        placed = layout.groups.get(group)
        if placed is not None and target in primaries and placed.primary != target:
            primaries[target] += weight(group)
            if placed.primary in primaries:
                primaries[placed.primary] -= weight(group)
    budget = max_moves - len(layout.moves)

    def move(group: int, placed: Placed, target: str) -> None:
        nonlocal budget
        if target not in placed.nodes:
            disk.take(target, group)
        out.moves[group] = target
        budget -= 1
        primaries[target] = primaries.get(target, 0.0) + weight(group)
        if placed.primary in primaries:
            primaries[placed.primary] -= weight(group)

    for group, placed in sorted(layout.groups.items()):
        if group in layout.moves:
            continue
        # Drain: the primary goes to a usable follower (or the least loaded node).
        if placed.primary in draining and placed.primary in live and budget > 0:
            options = [n for n in placed.followers if n in primaries] or [
                n for n in targets if disk.fits(n, group)]
            if options:
                move(group, placed, min(options, key=lambda n: (primaries[n], load[n], n)))
        # Restore R: keep live usable followers, add the least loaded targets
        # (every one for a spread group).
        keep = [n for n in placed.followers if n in usable and n != placed.primary]
        room = ({n for n in targets if n in placed.nodes or disk.fits(n, group)}
                | set(keep)) - {placed.primary}
        wanted = len(room) if group in spread else min(replicas, len(room))
        if len(keep) < wanted or len(keep) > wanted or len(keep) != len(placed.followers):
            followers = choose_followers(placed.primary, room, wanted, load, keep)
            if followers != placed.followers:
                for node in set(followers) - set(placed.followers):
                    load[node] += FOLLOWER_WEIGHT * weight(group)
                    disk.take(node, group)
                out.placements[group] = Placed(placed.primary, followers, placed.version)
    if rebalance:
        by_node: dict[str, list[int]] = {node: [] for node in usable}
        for group, placed in sorted(layout.groups.items()):
            if placed.primary in by_node and group not in layout.moves \
                    and group not in out.moves:
                by_node[placed.primary].append(group)
        # The targets still worth trying (one without room for any group
        # the heaviest could give is passed over for the next).
        open_targets = list(targets)
        while budget > 0 and open_targets:
            least = min(open_targets, key=lambda n: (primaries[n], load[n], n))
            chosen = None
            no_room = False
            # From the most loaded node that has a group to give (a group
            # moved in this plan stays where it goes), the move to the least
            # loaded one that narrows their gap most, if by enough; a group
            # the target already follows has nothing to load.
            for donor in sorted(usable, key=lambda n: (-primaries[n], n)):
                gap = primaries[donor] - primaries[least]
                left = {g: abs(gap - 2 * weight(g)) for g in by_node[donor]}
                useful = [g for g, after in left.items() if gap - after > MIN_GAIN]
                fitting = [g for g in useful if least in layout.groups[g].nodes
                           or disk.fits(least, g)]
                no_room = no_room or len(fitting) < len(useful)
                useful = fitting
                if useful:
                    chosen = donor, min(useful, key=lambda g: (
                        left[g] + (0.0 if least in layout.groups[g].followers
                                   else LOAD_COST), g))
                    break
            if chosen is None:
                if no_room:  # the next lightest may have room
                    open_targets.remove(least)
                    continue
                break
            donor, group = chosen
            by_node[donor].remove(group)
            move(group, layout.groups[group], least)
        if not layout.moves and not out.moves and budget > 0:
            # The primaries are even: the followers are spread next
            # (rankd.cluster.node_load), the groups every node follows kept.
            relocated = relocate_followers(
                expected(layout, replicas, out.placements), usable, targets, budget,
                weights=weights, fixed=spread, disk=disk, min_gain=MIN_GAIN)
            out.placements.update(relocated)
            out.relocated = set(relocated)
    return out


class Planner:
    """Plans once a round while this node holds the planner's lock."""

    def __init__(self, placement: Placement, dsn: str, replicas: int, *,
                 max_moves: int = MAX_MOVES, auto_rebalance: float = SETTLE_SECONDS,
                 min_free: int = MIN_FREE_BYTES) -> None:
        self.placement = placement
        #: Starts a rebalance once the load stayed drifted ``auto_rebalance``
        #: seconds (0: never; rankd.cluster.drift).
        self.drift = DriftWatch(auto_rebalance)
        #: Free bytes below which a node is given no group (rankd.cluster.capacity).
        self.min_free = min_free
        #: What the live nodes last reported they can take.
        self.capacity = Capacity()
        self.replicas = replicas
        self.max_moves = max_moves
        #: The planner's lock, on a session of its own (with keepalives).
        self.lock = NodeLock(dsn, "planner", space=PLANNER_LOCK)
        #: The groups' weights, read from Postgres now and then.
        self.load = GroupLoad(placement.pool)
        #: The groups' sizes on disk, likewise (rankd.cluster.disk_fit).
        self.sizes = GroupSizes(placement.pool)
        #: The live nodes the primaries were last spread over, and the live
        #: nodes now with the monotonic time since when they are so.
        self._planned_live: frozenset[str] | None = None
        self._live: frozenset[str] = frozenset()
        self._live_since = 0.0
        #: The last ``rankd cluster rebalance`` acted on.
        self._rebalanced_at: object = None
        #: A rebalance goes on round after round (at most ``max_moves``
        #: moves in progress) until a round finds nothing to move.
        self.rebalancing = False
        #: Plans that changed something, for metrics and status.
        self.plans = 0

    async def migrate(self) -> None:
        async with self.placement.pool.acquire() as conn, conn.transaction():
            await lock_schema(conn)
            await conn.execute(DRAIN_SCHEMA)

    async def request_rebalance(self) -> None:
        """Have the planner, whichever node it runs on, rebalance the
        primaries at its next round (``rankd cluster rebalance``)."""
        async with self.placement.pool.acquire() as conn:
            await conn.execute("UPDATE rankd_topology SET rebalance_at = clock_timestamp() "
                               "WHERE id = 1")

    async def _asked(self) -> tuple[set[str], object]:
        """The draining nodes, and when a rebalance was last asked for."""
        async with self.placement.pool.acquire() as conn:
            draining = {row[0] for row in await conn.fetch("SELECT node_id FROM rankd_draining")}
            asked = await conn.fetchval("SELECT rebalance_at FROM rankd_topology WHERE id = 1")
        return draining, asked

    async def drain(self, node: str, *, cancel: bool = False) -> None:
        """Empty ``node`` of its groups (or stop doing so)."""
        async with self.placement.pool.acquire() as conn:
            if cancel:
                await conn.execute("DELETE FROM rankd_draining WHERE node_id = $1", node)
            else:
                await conn.execute("INSERT INTO rankd_draining (node_id) VALUES ($1) "
                                   "ON CONFLICT DO NOTHING", node)

    async def round(self, layout: Layout, live: set[str], *, now: float) -> Plan | None:
        """Plan once if this node holds the lock (call it only while the node
        is in touch with Postgres: its view of who is live is sound); the
        plan made (None: not the planner)."""
        if not await self.lock.try_acquire():
            return None
        draining, asked = await self._asked()
        live_now = frozenset(live)
        if live_now != self._live:
            self._live, self._live_since = live_now, now
        if self._planned_live is None:
            self._planned_live = live_now
        changed = (live_now != self._planned_live
                   and now - self._live_since >= STABLE_SECONDS)
        if changed or (asked is not None and asked != self._rebalanced_at):
            self.rebalancing = True
            self._planned_live = live_now
        self._rebalanced_at = asked
        weights = await self.load.weights(now)
        capacity = self.capacity = await read_reports(self.placement.pool, live, self.min_free)
        disk = disk_room(capacity, self.min_free, await self.sizes.sizes(now), layout.moves)
        self._watch_drift(layout, live - draining - capacity.failing, weights, now)
        # Off the loop: a plan over a thousand groups takes tens of ms of
        # Python.  Layouts are never changed in place; the sets are copied.
        made = await asyncio.to_thread(
            plan, layout, live_now, frozenset(draining), self.replicas,
            rebalance=self.rebalancing,
            max_moves=self.max_moves, weights=weights, failing=capacity.failing,
            full=capacity.full, spread=capacity.spread, disk=disk)
        if self.rebalancing and not made.moves and not made.relocated and not layout.moves:
            self.rebalancing = False  # nothing left to move, nothing moving
        if not made:
            return made
        try:
            if made.placements:
                await self.placement.replace(layout.epoch, made.placements)
        except Stale:
            return None  # the next round plans from the newer placement
        for group, target in made.moves.items():
            await self.placement.request_move(group, target, self.replicas)
        self.plans += 1
        log.info("planner: %d placements changed (%d followers relocated), %d moves "
                 "requested (%s)", len(made.placements), len(made.relocated), len(made.moves),
                 ", ".join(f"group {g} to {t}" for g, t in sorted(made.moves.items())[:8]))
        return made

    def figures(self) -> dict[str, float]:
        """Figures for ``/metrics`` (the drift ratio is 0 on a node that is
        not the planner: it measures nothing)."""
        return {"drift_ratio": self.drift.ratio if self.lock.held else 0.0,
                "drift_rebalances": self.drift.started,
                "nodes_given_no_group": len(self.capacity.full) if self.lock.held else 0}

    def _watch_drift(self, layout: Layout, usable: set[str], weights: Mapping[int, float],
                     now: float) -> None:
        """Start a rebalance once the nodes' load stayed drifted for the
        settle time (rankd.cluster.drift); not while one is going on."""
        ratio = drift_ratio(layout, usable, weights, self.replicas)
        if self.drift.observe(ratio, now, busy=self.rebalancing):
            self.rebalancing = True
            log.info("planner: the heaviest node holds %.2f times the mean load for %g s or "
                     "more: rebalancing (--auto-rebalance)", ratio, self.drift.settle)
