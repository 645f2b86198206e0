"""Bounded staleness: how far behind the cluster a node's reads may be.

A node answers a read of a board group only while it can vouch that what
it shows is at most ``--max-follow-lag`` seconds old; otherwise the read
is refused (503 ``unavailable``) and the client reads another node.

* A **followed** group is fresh as of ``t0`` once this node applied every
  record Postgres said the group's log held at ``t0``: ``t0`` is the
  monotonic time a read of the registers (``LogTail``'s poll) *started*,
  and the record is its ``last_seq`` for the group.  Under write load a
  follower is never exactly at ``last_seq``, but it keeps reaching the
  positions of polls a moment old, so it stays fresh as of them.  A tail
  cut off from Postgres (a partition, a reset link) or a node that cannot
  apply (a full disk) stops making new ``t0``\\ s, and its groups go stale.
* A **written** group is fresh while this node may still act as its
  primary by its own conservative clock (``LeaseKeeper.may_acknowledge``),
  then stale since the moment its lease stopped being good (its engine
  failing makes it count as followed: what it applied locally went back).
* A group without a register holds nothing: fresh as of the last poll.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from rankd.cluster.leases import LeaseKeeper
from rankd.cluster.tail import LogTail
from rankd.engine.engine import Engine

#: Polls remembered per group whose position this node has not reached yet
#: (about one a second: with the bound a few seconds, only the newest matter).
MAX_PENDING = 64
#: How long :meth:`Freshness.all_fresh` trusts its last look at most.
RECHECK_SECONDS = 0.25


class FollowingNode(Protocol):
    """What freshness reads of its node (``rankd.cluster.node.ClusterNode``,
    which builds it: a protocol, so the two do not import each other)."""

    engine: Engine
    #: The groups this node writes, by group.
    writers: dict[int, Any]
    #: Its leases and its tail of the cluster's log, once started.
    keeper: LeaseKeeper | None
    tail: LogTail | None
    #: Groups placed on other nodes only: not held here, so not served here.
    unheld: set[int]


class Freshness:
    """What one node can vouch for about each group it serves."""

    def __init__(self, node: FollowingNode, max_lag: float, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.node = node
        #: ``--max-follow-lag``: 0 never refuses.
        self.max_lag = max_lag
        self.clock = clock
        #: When the newest completed poll started (None: none yet).
        self.last_poll: float | None = None
        #: Per group: (poll start, last_seq) of polls this node had not
        #: reached when they came, oldest first.
        self._pending: dict[int, deque[tuple[float, int]]] = {}
        #: Per group: the newest poll it reached.
        self._vouched: dict[int, tuple[float, int]] = {}
        #: Per group: the furthest position this node applied as seen here
        #: (every read asks first): a state behind it is vouched for by no poll.
        self._highest: dict[int, int] = {}
        #: Monotonic time before which every group is known fresh (a cache
        #: for the native reads' one check a batch; 0: look again).
        self._all_fresh_until = 0.0

    def polled(self, started: float, last_seqs: dict[int, int]) -> None:
        """A read of every group's register that started at ``started``
        (monotonic, taken before the query) found these last positions."""
        self.last_poll = started
        for group, seq in last_seqs.items():
            points = self._pending.get(group)
            if points is None:
                points = self._pending[group] = deque(maxlen=MAX_PENDING)
            points.append((started, seq))

    def fresh_as_of(self, group: int) -> float | None:
        """The monotonic time as of which this node's state of ``group`` is
        complete, or None if it cannot vouch for any (never polled, or its
        state went back since: a replay, a roll-back after its local log
        failed, a state set aside; until it is back where it was)."""
        writers = self.node.writers
        writer = writers.get(group)
        if writer is not None:
            # What it shows as the group's writer is committed (reads wait for
            # their commits): once it stops writing the group (its local log
            # failed, it was deposed) its state must not go back behind that.
            committed = writer.committed_seq
            if committed > self._highest.get(group, 0):
                self._highest[group] = committed
        if writer is not None and self.node.engine.failure is None:
            held = self.node.keeper.held.get(group) if self.node.keeper else None
            if held is not None:
                now = self.clock()
                return now if now < held.good_until else held.good_until
        applied = self.node.engine.positions.get(group, (0, 0))[0]
        if applied < self._highest.get(group, 0):
            # The state went back (rolled back to what a failed local log
            # held, or set aside): it may be older than what was shown.
            return None
        self._highest[group] = applied
        points = self._pending.get(group)
        if points is None:  # no register: the group holds nothing
            return self.last_poll
        while points and points[0][1] <= applied:
            self._vouched[group] = points.popleft()
        vouched = self._vouched.get(group)
        if vouched is None or vouched[1] > applied:
            return None
        return vouched[0]

    def staleness(self, group: int) -> float:
        """How many seconds old this node's state of ``group`` may be (inf:
        it cannot say)."""
        as_of = self.fresh_as_of(group)
        return math.inf if as_of is None else max(0.0, self.clock() - as_of)

    def refusal(self, group: int) -> str | None:
        """Why a read of ``group`` is refused here now, or None to serve it."""
        if not self.max_lag:
            return None
        stale = self.staleness(group)
        if stale <= self.max_lag:
            return None
        age = ("this node cannot vouch for any state of it yet" if math.isinf(stale) else
               f"this node's copy may be {stale:.1f} s stale")
        return (f"group {group} {age}, more than --max-follow-lag {self.max_lag:g} s "
                f"({self.cause()}); read another node, or again shortly")

    def cause(self) -> str:
        """The likely reason this node falls behind, for messages."""
        node = self.node
        if node.engine.failure is not None:
            return f"its local log failed: {node.engine.failure}"
        if node.tail is not None and not node.tail.connected:
            return "its log tail cannot reach Postgres"
        return "it has not applied the group's log recently"

    def worst(self) -> float:
        """The largest staleness of any group this node serves (inf: one it
        cannot vouch for at all)."""
        now = self.clock()
        worst = math.inf if self.last_poll is None else now - self.last_poll
        for group in self._groups():
            worst = max(worst, self.staleness(group))
        return max(0.0, worst)

    def all_fresh(self) -> bool:
        """Whether every group is within the bound (``/v1/ready``)."""
        if not self.max_lag:
            return True
        now = self.clock()
        if now < self._all_fresh_until:
            return True
        worst = self.worst()
        if worst > self.max_lag:
            return False
        # Every group stays within the bound for as long as the stalest one
        # does, unless a group's state goes back meanwhile (a replay): look
        # again soon whatever the margin (the native reads check every batch).
        self._all_fresh_until = now + min(self.max_lag - worst, RECHECK_SECONDS)
        return True

    def _groups(self) -> set[int]:
        """Every group this node holds and knows of: polled, written or applied."""
        return ((set(self._pending) | set(self.node.engine.positions)) - self.node.unheld
                | set(self.node.writers))

    def figures(self) -> dict[str, Any]:
        """Figures for ``/metrics``."""
        worst = self.worst()
        stale = sum(1 for group in self._groups()
                    if self.max_lag and self.staleness(group) > self.max_lag)
        return {"read_staleness_seconds": worst if math.isfinite(worst) else -1.0,
                "stale_groups": stale}
