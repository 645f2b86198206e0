"""Rebalancing on drift: when the planner starts a rebalance by itself.

What it owns: the measure of how unevenly the nodes' load is spread
(:func:`drift_ratio`) and the decision, round after round, that it has
drifted for long enough to rebalance (:class:`DriftWatch`).

Design:

* **The measure** is the heaviest usable node's load over the mean of the
  usable nodes': 1 on a perfectly even cluster, ``N`` with every group on
  one node of ``N``.  A node's load is the weights of the groups it leads
  (:mod:`rankd.cluster.load`) plus a follower's share of those it follows
  (:mod:`rankd.cluster.node_load`: followers hold the same memory and
  apply every write); before, only primaries counted, and a node that
  followed every group looked as loaded as one that followed none.
* **Hysteresis.** The cluster counts as drifted from the round the ratio
  goes above :data:`HIGH` until a round finds it below :data:`LOW`; a ratio
  wavering around ``HIGH`` neither restarts nor ends the settle time.
* **Settle time.** A rebalance starts once the cluster stayed drifted for
  ``settle`` seconds (``--auto-rebalance``): a burst of writes to a few
  boards, or a node restarting, moves nothing.  After one starts, the next
  needs ``settle`` seconds of drift again: a skew no move can narrow (one
  group heavier than the others together) costs one empty plan per settle
  time, never a move.
* **No flapping.** The rebalance itself is the planner's ordinary one: it
  only makes moves that narrow the gap between the heaviest and the
  lightest node (by more than :data:`rankd.cluster.planner.MIN_GAIN`), so a
  move is never undone by the next rebalance while the weights stay put;
  its follower relocations change no primary (:mod:`rankd.cluster.node_load`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from rankd.cluster.node_load import expected, node_loads
from rankd.cluster.placement import Layout

#: The ratio above which the cluster counts as drifted, and the one below
#: which it counts as balanced again.
HIGH = 1.25
LOW = 1.15
#: Seconds the cluster must stay drifted before the planner rebalances it
#: by itself (``--auto-rebalance``; 0: never).
SETTLE_SECONDS = 300.0


def drift_ratio(layout: Layout, nodes: Iterable[str],
                weights: Mapping[int, float] | None = None,
                replicas: int | None = None) -> float:
    """The heaviest of ``nodes``' loads (primaries and followers) over their
    mean (1.0 when there is nothing to spread); groups being moved count as
    moved (``replicas``: the followers a hand-over leaves)."""
    loads = node_loads(expected(layout, replicas), nodes, weights)
    if not loads:
        return 1.0
    mean = sum(loads.values()) / len(loads)
    return max(loads.values()) / mean if mean > 0 else 1.0


class DriftWatch:
    """Decides, from one ratio a round, when to start a rebalance."""

    def __init__(self, settle: float = SETTLE_SECONDS, *, high: float = HIGH,
                 low: float = LOW) -> None:
        if not 1.0 <= low <= high:
            raise ValueError(f"need 1 <= low <= high, got low {low!r}, high {high!r}")
        self.settle = settle
        self.high = high
        self.low = low
        #: When the drift began, or the last rebalance it started (None: balanced).
        self.since: float | None = None
        #: The last ratio seen, for status and logs.
        self.ratio = 1.0
        #: Rebalances started on drift.
        self.started = 0

    @property
    def enabled(self) -> bool:
        return self.settle > 0

    def observe(self, ratio: float, now: float, *, busy: bool = False) -> bool:
        """Record this round's ``ratio`` (``now``: a monotonic clock);
        whether to start a rebalance now.  ``busy``: a rebalance is going on
        (asked for, or started before): the settle time starts again after it."""
        self.ratio = ratio
        if ratio > self.high and self.since is None:
            self.since = now
        elif ratio < self.low:
            self.since = None
        if busy and self.since is not None:
            self.since = now
        if not self.enabled or self.since is None or now - self.since < self.settle:
            return False
        self.since = now  # the next one after another settle time of drift
        self.started += 1
        return True
