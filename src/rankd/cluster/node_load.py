"""A node's load counting the groups it follows, and the followers a rebalance moves.

What it owns: how much a follower weighs against a primary
(:data:`FOLLOWER_WEIGHT`), each node's load as the drift measure and the
rebalance read it (:func:`node_loads`: what it leads plus that share of
what it follows), and the rebalance's follower relocations
(:func:`relocate_followers`).

Design:

* **The weight of a follower.**  A follower keeps the group's boards in
  memory as its primary does, and applies every record of its log.  A
  group's weight (:mod:`rankd.cluster.load`) is half memory, half writes;
  the memory half costs a follower what it costs the primary, the writes
  half what applying a record costs against taking the write:
  ``bench/bench_follower_cost.py`` measured a follower's engine at 0.23
  (one submit at a time) to 0.34 (batches) of the primary's CPU per write.
  So a follower weighs ``0.5 + 0.5 * 0.34``, about two thirds of a primary
  (the larger ratio: a follower's own reading of the log is not in it).
* **Moves in progress count as done**, as the planner counts them: the
  target leads the group, and the followers are what the hand-over leaves
  (the source first, then the others but the target, ``--replicas`` of
  them: :data:`rankd.cluster.placement.HAND_OVER`).
* **Relocating followers.**  A rebalance moves primaries by the primaries'
  load alone (:func:`rankd.cluster.planner.plan`), then moves followers:
  from the node with the heaviest load to the lightest one that may take a
  group (not draining, not short of disk, with room for the group) and
  does not hold the group, the follower whose move narrows their gap most,
  while a move narrows it by more than the planner's least gain.  A
  follower relocation changes no primary, so it never undoes a primary
  move; each one lowers the sum of the squares of the nodes' loads, so the
  relocations end, and a primary move (which the next round may plan
  only for the primaries' load) is never undone by them: no oscillation.
  Groups being moved, and groups every node follows (``replicas: all``),
  keep their followers.  A relocated follower is placed at once (the new
  node loads the group, the old one drops it); relocations share the
  round's budget of ``--max-moves`` with the moves.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from rankd.cluster.disk_fit import DiskRoom
from rankd.cluster.placement import Layout, Placed

#: A follower's load against its primary's (module docstring).
FOLLOWER_WEIGHT = 0.67


def settled(placed: Placed, target: str, replicas: int | None = None) -> Placed:
    """``placed`` once its move to ``target`` is handed over: ``target``
    leads, the source and the other followers follow (``replicas`` of them;
    None: as many as it had besides the target)."""
    others = tuple(n for n in placed.followers if n not in (placed.primary, target))
    keep = len(others) if replicas is None else replicas
    if placed.primary == target:
        return placed
    return Placed(target, ((placed.primary, *others))[:max(keep, 0)], placed.version)


def expected(layout: Layout, replicas: int | None = None,
             changes: Mapping[int, Placed] | None = None,
             moves: Mapping[int, str] | None = None) -> dict[int, Placed]:
    """Each group's placement once the moves in progress (and ``moves``)
    are done, with ``changes`` placed first."""
    groups = dict(layout.groups)
    groups.update(changes or {})
    for group, target in {**layout.moves, **(moves or {})}.items():
        if group in groups:
            groups[group] = settled(groups[group], target, replicas)
    return groups


def node_loads(groups: Mapping[int, Placed], nodes: Iterable[str],
               weights: Mapping[int, float] | None = None,
               follower_weight: float = FOLLOWER_WEIGHT) -> dict[str, float]:
    """Each of ``nodes``' load: the weights of the groups it leads, plus
    ``follower_weight`` times those of the groups it follows."""
    weights = weights or {}
    loads = dict.fromkeys(nodes, 0.0)
    for group, placed in groups.items():
        weight = weights.get(group, 1.0)
        if placed.primary in loads:
            loads[placed.primary] += weight
        for node in placed.followers:
            if node in loads and node != placed.primary:
                loads[node] += follower_weight * weight
    return loads


def relocate_followers(groups: Mapping[int, Placed], usable: Iterable[str],
                       targets: Iterable[str], budget: int, *,
                       weights: Mapping[int, float] | None = None,
                       fixed: Iterable[int] = (), disk: DiskRoom | None = None,
                       min_gain: float = 0.1,
                       follower_weight: float = FOLLOWER_WEIGHT) -> dict[int, Placed]:
    """At most ``budget`` follower relocations (module docstring): group ->
    its new placement.  ``groups``: the placements expected once the
    plan's moves are done; ``usable``: the nodes whose load counts;
    ``targets``: those that may be given a follower; ``fixed``: groups
    whose followers stay; ``disk``: the nodes' room (each relocation takes
    its group's size off its new node's)."""
    weights = weights or {}
    disk = disk or DiskRoom()
    usable = sorted(set(usable))
    targets = [n for n in sorted(set(targets)) if n in usable]
    loads = node_loads(groups, usable, weights, follower_weight)
    fixed = set(fixed)
    current = dict(groups)
    # Per node, the groups it follows that may be relocated.
    followed: dict[str, set[int]] = {n: set() for n in usable}
    for group, placed in current.items():
        if group not in fixed:
            for node in placed.followers:
                if node in followed and node != placed.primary:
                    followed[node].add(group)
    out: dict[int, Placed] = {}
    while budget > 0 and targets:
        chosen = _relocation(current, loads, followed, targets, weights, disk, min_gain,
                             follower_weight)
        if chosen is None:
            break
        group, heavy, light = chosen
        placed = current[group]
        current[group] = out[group] = Placed(
            placed.primary, tuple(light if n == heavy else n for n in placed.followers),
            placed.version)
        followed[heavy].discard(group)
        followed[light].add(group)
        shift = follower_weight * weights.get(group, 1.0)
        loads[heavy] -= shift
        loads[light] += shift
        disk.take(light, group)
        budget -= 1
    return out


def _relocation(current: Mapping[int, Placed], loads: Mapping[str, float],
                followed: Mapping[str, set[int]], targets: list[str],
                weights: Mapping[int, float], disk: DiskRoom, min_gain: float,
                follower_weight: float) -> tuple[int, str, str] | None:
    """The next follower relocation: from the heaviest node that has one to
    give, to the lightest target that narrows their gap by more than
    ``min_gain``, the follower that narrows it most (None: none does)."""
    for heavy in sorted(followed, key=lambda n: (-loads[n], n)):
        for light in sorted(targets, key=lambda n: (loads[n], n)):
            gap = loads[heavy] - loads[light]
            if gap <= min_gain:
                break  # (the next lights are heavier)
            best: tuple[float, int] | None = None
            for group in followed[heavy]:
                if light in current[group].nodes or not disk.fits(light, group):
                    continue
                after = abs(gap - 2 * follower_weight * weights.get(group, 1.0))
                if gap - after > min_gain and (best is None or (after, group) < best):
                    best = (after, group)
            if best is not None:
                return best[1], heavy, light
    return None
