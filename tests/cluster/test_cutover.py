"""The cut-over's pieces without nodes (rankd.cluster.cutover, rankd.cluster.moves):
writes wait at a closed group and go on when it opens (or after the
bound), and every node routes a group to the target named by a hand-over's
notification unless it knows better."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from rankd.cluster import cutover
from rankd.cluster.cutover import Gates, Phases
from rankd.cluster.moves import Mover
from rankd.cluster.node import Register


def test_a_write_waits_at_a_closed_group_until_it_opens() -> None:
    async def scenario() -> None:
        gates = Gates()
        assert not gates
        await gates.wait(7)  # open: no wait
        gates.close(7)
        assert gates and gates.closed(7)
        waiting = asyncio.ensure_future(gates.wait_all({7, 8}))
        await asyncio.sleep(0.02)
        assert not waiting.done()
        gates.open(7)
        await asyncio.wait_for(waiting, 1.0)
        assert not gates and gates.held == 1

    asyncio.run(scenario())


def test_a_write_waits_no_longer_than_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cutover, "HOLD_SECONDS", 0.05)

    async def scenario() -> float:
        gates = Gates()
        gates.close(3)
        started = time.monotonic()
        await gates.wait(3)
        return time.monotonic() - started

    assert 0.04 < asyncio.run(scenario()) < 1.0


def test_phases_time_each_step_in_order() -> None:
    phases = Phases()
    time.sleep(0.01)
    phases.step("flush")
    phases.step("hand-over")
    assert list(phases.steps) == ["flush", "hand-over"]
    assert phases.steps["flush"] >= 9.0 and phases.total_ms >= phases.steps["flush"]
    assert phases.text().startswith("flush ")


def node(writes: set[int]) -> SimpleNamespace:
    return SimpleNamespace(node_id="n2", writers=dict.fromkeys(writes),
                           config=SimpleNamespace(lease_seconds=2.0),
                           registers={1: Register(5, "n0", 10, 0.0),
                                      2: Register(9, "n0", 10, 0.0),
                                      3: Register(5, "n2", 10, 0.0)})


def test_every_node_routes_to_the_target_as_soon_as_it_is_told() -> None:
    async def scenario() -> SimpleNamespace:
        host = node({3})
        mover = Mover(host, placement=None)
        mover._notified(None, 0, "rankd_topology", "1:n1:6")
        mover._notified(None, 0, "rankd_topology", "2:n1:6")  # knows a newer epoch
        mover._notified(None, 0, "rankd_topology", "3:n1:6")  # writes it (fenced later)
        return host

    host = asyncio.run(scenario())
    assert (host.registers[1].holder, host.registers[1].epoch) == ("n1", 6)
    assert host.registers[1].lease_until > time.monotonic()
    assert (host.registers[2].holder, host.registers[2].epoch) == ("n0", 9)
    assert host.registers[3].holder == "n2"


def test_the_source_lets_held_writes_go_when_the_target_holds_them() -> None:
    async def scenario() -> bool:
        mover = Mover(node(set()), placement=None)
        loop = asyncio.get_running_loop()
        mover._opening[1] = waiting = loop.create_future()
        mover._notified(None, 0, "rankd_topology", "1:n1:7:holding")
        return waiting.done()

    assert asyncio.run(scenario())


def test_a_move_waits_for_a_heartbeat_written_since_it_was_asked() -> None:
    """The source's copy of the heartbeats may predate the move (the target
    then still held an old copy of the group it dropped since): it cuts over
    only once a heartbeat written after the move was asked shows the target
    caught up."""

    class Placement:
        applied: int | None = None

        async def applied_since_asked(self, group: int, target: str) -> int | None:
            return self.applied

    async def scenario(fresh: int | None) -> list[tuple[int, str]]:
        writer = SimpleNamespace(fenced=None, committed_seq=10_000)
        host = SimpleNamespace(node_id="n0", writers={5: writer}, registers={},
                               peers={"n1": ("127.0.0.1:1", None, {5: 9_999})})
        placement = Placement()
        placement.applied = fresh
        mover = Mover(host, placement)
        cut: list[tuple[int, str]] = []

        async def cut_over(group: int, target: str) -> bool:
            cut.append((group, target))
            return True

        mover.cut_over = cut_over
        await mover.round(SimpleNamespace(moves={5: "n1"}))
        return cut

    assert asyncio.run(scenario(None)) == []  # no heartbeat since the move was asked
    assert asyncio.run(scenario(100)) == []  # one since: far behind (loading)
    assert asyncio.run(scenario(9_500)) == [(5, "n1")]
