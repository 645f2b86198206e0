"""Freshness after a node's state went back (``rankd.cluster.freshness``).

Found by the long-form fault suite (``full_disk_follower --ack log``): a
follower whose local log failed rolled its state back to what the log held,
and its live feed then showed a board older than it had shown before.  The
newest poll it had reached was older still, so it went on vouching for the
rolled-back state; it must vouch for none until it is back where it was.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rankd.cluster.freshness import Freshness

GROUP = 7


@dataclass
class _Engine:
    positions: dict[int, tuple[int, int]] = field(default_factory=dict)
    failure: Any = None


@dataclass
class _Node:
    engine: _Engine = field(default_factory=_Engine)
    writers: dict[int, Any] = field(default_factory=dict)
    keeper: Any = None
    tail: Any = None
    unheld: set[int] = field(default_factory=set)


def test_a_state_that_went_back_is_vouched_for_only_once_back_where_it_was() -> None:
    node, now = _Node(), [100.0]
    freshness = Freshness(node, 5.0, clock=lambda: now[0])
    freshness.polled(100.0, {GROUP: 6})
    node.engine.positions[GROUP] = (10, 0)  # applied past the poll: shown at 10
    assert freshness.fresh_as_of(GROUP) == 100.0
    assert freshness.refusal(GROUP) is None
    node.engine.positions[GROUP] = (8, 0)  # rolled back (its local log failed)
    assert freshness.fresh_as_of(GROUP) is None
    assert freshness.refusal(GROUP) is not None
    node.engine.positions[GROUP] = (9, 0)
    assert freshness.refusal(GROUP) is not None
    now[0] = 101.0
    freshness.polled(101.0, {GROUP: 12})
    node.engine.positions[GROUP] = (12, 0)  # back, and further
    assert freshness.fresh_as_of(GROUP) == 101.0


def test_a_state_set_aside_is_refused_until_caught_up() -> None:
    node = _Node()
    freshness = Freshness(node, 5.0, clock=lambda: 50.0)
    freshness.polled(50.0, {GROUP: 3})
    node.engine.positions[GROUP] = (3, 0)
    assert freshness.refusal(GROUP) is None
    node.engine.positions.clear()  # set aside: starts empty, follows again
    assert freshness.refusal(GROUP) is not None
    node.engine.positions[GROUP] = (3, 0)
    assert freshness.refusal(GROUP) is None
