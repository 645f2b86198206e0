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


@dataclass
class _Writer:
    committed_seq: int


@dataclass
class _Held:
    good_until: float


@dataclass
class _Keeper:
    held: dict[int, _Held] = field(default_factory=dict)


def test_what_a_writer_showed_is_not_gone_back_on_once_it_stops_writing() -> None:
    """Found by the fault suite's ``move_faults --ack log``: a node wrote a
    group (its reads answered from its own state, committed up to 20), then
    its local log failed: it stopped writing it, set its state aside and
    followed every group again from the cluster's log.  Its reads of the
    group were vouched for by a poll older than what it had shown as the
    writer: reads went back."""
    node, now = _Node(keeper=_Keeper()), [10.0]
    freshness = Freshness(node, 5.0, clock=lambda: now[0])
    node.writers[GROUP] = _Writer(committed_seq=20)
    node.keeper.held[GROUP] = _Held(good_until=12.0)
    node.engine.positions[GROUP] = (20, 1)
    assert freshness.fresh_as_of(GROUP) == 10.0  # the writer's own
    freshness.polled(9.0, {GROUP: 5})  # a poll from before, at 5
    del node.writers[GROUP], node.keeper.held[GROUP]  # its local log failed
    node.engine.positions[GROUP] = (6, 2)  # set aside, following again from the log
    assert freshness.fresh_as_of(GROUP) is None
    now[0] = 11.0
    freshness.polled(11.0, {GROUP: 25})
    node.engine.positions[GROUP] = (25, 2)  # back, and further
    assert freshness.fresh_as_of(GROUP) == 11.0
