"""`rankd cluster status` never shows an older topology than it showed.

``ClusterNode.status`` reads the placement from Postgres when it can and
otherwise answers this node's own copy, which the placement loop refreshes
a round behind.  An answer read from Postgres, then Postgres out of reach,
then an answer from the node's copy used to show the topology epoch going
back (found by the fault suite's ``move_faults`` scenario, ``--ack log``).

The node here is a stand-in carrying only what ``status`` reads, so the
order of the three answers is exact rather than a race with a real
Postgres pause.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from rankd.cluster.node import ClusterNode
from rankd.cluster.placement import Layout, Placed


def _layout(epoch: int, primary: str) -> Layout:
    placed = Placed(primary=primary, followers=("n2",), version=epoch)
    return Layout(epoch=epoch, groups={7: placed})


class _Reach:
    """Postgres as the node sees it: reachable or not, and what it holds."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.up = True

    async def status(self) -> dict:
        if not self.up:
            raise OSError("connection refused")
        return {"nodes": {}}

    async def read(self) -> Layout:
        if not self.up:
            raise OSError("connection refused")
        return self.layout


def _stand_in(postgres: _Reach, own_copy: Layout) -> SimpleNamespace:
    node = SimpleNamespace(
        nodes=postgres, placement=postgres, layout=own_copy, replicas=1,
        _status_layout=Layout(), _check_joined=lambda: None,
        _known_status=lambda: {"nodes": {}}, local_status=lambda: {})
    node._placement_status = lambda layout: ClusterNode._placement_status(node, layout)
    return node


def _answer(node: SimpleNamespace) -> dict:
    return asyncio.run(ClusterNode.status(node))


def test_an_answer_from_the_nodes_copy_never_shows_an_older_epoch() -> None:
    postgres = _Reach(_layout(12, primary="n1"))
    node = _stand_in(postgres, own_copy=_layout(11, primary="n0"))

    fresh = _answer(node)
    assert not fresh["stale"]
    assert fresh["placement"]["topology_epoch"] == 12
    assert fresh["placement"]["groups"]["7"]["primary"] == "n1"

    postgres.up = False
    stale = _answer(node)
    assert stale["stale"]
    # Not the node's copy at epoch 11: what was answered before, whole.
    assert stale["placement"]["topology_epoch"] == 12
    assert stale["placement"]["groups"]["7"]["primary"] == "n1"


def test_a_newer_copy_on_the_node_is_shown_once_it_has_it() -> None:
    postgres = _Reach(_layout(12, primary="n1"))
    node = _stand_in(postgres, own_copy=_layout(11, primary="n0"))
    _answer(node)

    postgres.up = False
    node.layout = _layout(13, primary="n2")
    stale = _answer(node)
    assert stale["placement"]["topology_epoch"] == 13
    assert stale["placement"]["groups"]["7"]["primary"] == "n2"
