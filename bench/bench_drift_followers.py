"""The nodes' load after a rebalance, followers counted: a planner simulation.

No nodes and no Postgres: the planner's own :func:`rankd.cluster.planner.plan`
is run round after round on a layout, each round's placements made and
its moves handed over at once as ``rankd_placement``'s hand-over leaves
them (the target leads; the source, then the other followers but the
target, follow, ``--replicas`` of them), until a round plans nothing.
The load of a node is measured the same way whichever checkout's planner
runs (``--follower-weight``, default 0.67 as ``rankd.cluster.node_load``:
what it leads plus that share of what it follows), so two checkouts
compare side by side::

    PYTHONPATH=/base/src python bench/bench_drift_followers.py
    PYTHONPATH=src python bench/bench_drift_followers.py

Scenarios: **join**, ``--groups`` groups alike on two nodes (each leads
half and follows the other half, ``--replicas 1``), a third node joins
and the cluster is rebalanced; **join-weighted**, the same onto four nodes
from three with ``--replicas 2`` and log-normal group weights (seeded).
Printed per scenario: the drift ratio (heaviest node's load over the
mean), primaries, followers and copies held per node, the moves and
follower relocations made and the rounds taken.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Mapping

from rankd.cluster.placement import Layout, Placed
from rankd.cluster.planner import plan


def settle(placed: Placed, target: str, replicas: int) -> Placed:
    """``placed`` once its move to ``target`` is handed over."""
    others = [n for n in placed.followers if n not in (placed.primary, target)]
    return Placed(target, tuple([placed.primary, *others][:replicas]), placed.version)


def loads(layout: Layout, nodes: list[str], weights: Mapping[int, float],
          follower_weight: float) -> dict[str, float]:
    out = dict.fromkeys(nodes, 0.0)
    for group, placed in layout.groups.items():
        out[placed.primary] += weights.get(group, 1.0)
        for node in placed.followers:
            out[node] += follower_weight * weights.get(group, 1.0)
    return out


def rebalance(layout: Layout, nodes: list[str], replicas: int, weights: Mapping[int, float],
              max_moves: int) -> tuple[Layout, int, int, int]:
    """Rounds of plans until one plans nothing: the layout, moves,
    follower relocations (a follower replaced with no primary change) and rounds."""
    moves = relocations = 0
    for rounds in range(1, 10_000):
        made = plan(layout, set(nodes), set(), replicas, rebalance=True, max_moves=max_moves,
                    weights=dict(weights))
        if not made:
            return layout, moves, relocations, rounds
        groups = dict(layout.groups)
        for group, placed in made.placements.items():
            old = groups[group]
            if (placed.primary == old.primary and len(placed.followers) == len(old.followers)
                    and set(old.followers) <= set(nodes)):
                relocations += len(set(placed.followers) - set(old.followers))
            groups[group] = placed
        for group, target in made.moves.items():
            groups[group] = settle(groups[group], target, replicas)
        moves += len(made.moves)
        layout = Layout(layout.epoch + 1, groups)
    raise RuntimeError("the rebalance never ended")


def report(name: str, layout: Layout, nodes: list[str], weights: Mapping[int, float],
           follower_weight: float, moves: int, relocations: int, rounds: int) -> None:
    load = loads(layout, nodes, weights, follower_weight)
    mean = sum(load.values()) / len(load)
    led = {n: sum(p.primary == n for p in layout.groups.values()) for n in nodes}
    follows = {n: sum(n in p.followers for p in layout.groups.values()) for n in nodes}
    print(f"{name}: drift ratio {max(load.values()) / mean:.3f} (loads "
          f"{', '.join(f'{n} {load[n]:.0f}' for n in nodes)}); primaries "
          f"{'/'.join(str(led[n]) for n in nodes)}, followers "
          f"{'/'.join(str(follows[n]) for n in nodes)}, copies "
          f"{'/'.join(str(led[n] + follows[n]) for n in nodes)}; {moves} moves, "
          f"{relocations} follower relocations, {rounds} rounds")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=1024)
    parser.add_argument("--max-moves", type=int, default=8)
    parser.add_argument("--follower-weight", type=float, default=0.67)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    groups = range(args.groups)
    # join: two nodes, one follower a group, a third joins.
    two = Layout(1, {g: Placed("n0" if g % 2 else "n1", ("n1" if g % 2 else "n0",), 1)
                     for g in groups})
    nodes = ["n0", "n1", "n2"]
    report("join, before", two, nodes, {}, args.follower_weight, 0, 0, 0)
    report("join, rebalanced", *rebalanced(two, nodes, 1, {}, args))
    # join-weighted: three nodes, two followers a group, a fourth joins.
    rng = random.Random(args.seed)
    weights = {g: rng.lognormvariate(0.0, 1.0) for g in groups}
    mean = sum(weights.values()) / len(weights)
    weights = {g: w / mean for g, w in weights.items()}
    three = Layout(1, {g: Placed(f"n{g % 3}", (f"n{(g + 1) % 3}", f"n{(g + 2) % 3}"), 1)
                       for g in groups})
    nodes = ["n0", "n1", "n2", "n3"]
    report("join-weighted, before", three, nodes, weights, args.follower_weight, 0, 0, 0)
    report("join-weighted, rebalanced", *rebalanced(three, nodes, 2, weights, args))


def rebalanced(layout: Layout, nodes: list[str], replicas: int,
               weights: Mapping[int, float], args: argparse.Namespace) -> tuple:
    """``report``'s arguments after a rebalance."""
    after, moves, relocations, rounds = rebalance(layout, nodes, replicas, weights,
                                                  args.max_moves)
    return after, nodes, weights, args.follower_weight, moves, relocations, rounds


if __name__ == "__main__":
    main()
