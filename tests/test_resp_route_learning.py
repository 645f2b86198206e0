"""A cluster node whose view only guesses that it writes a slot (nobody's
lease seen there yet: the group falls to it by placement or block) reads
the group's register again before a write runs: a write another node took
meanwhile is answered ``-MOVED`` to a cluster client and relayed for a
plain one, not refused ``TRYAGAIN`` by the engine; a write still its own
runs here.  Routing is driven through :func:`route` with a topology whose
register read (``learn``) is scripted."""

from __future__ import annotations

import asyncio
import dataclasses
import types

import pytest

from rankd.cluster.topology import NodeAddresses
from rankd.engine.groups import SLOTS_PER_GROUP, slot_of
from rankd.frontends.resp import cluster_commands
from rankd.frontends.resp.arguments import CommandError
from rankd.frontends.resp.commands import lookup

KEY = b"weekly"
GROUP = slot_of(KEY) // SLOTS_PER_GROUP


class ScriptedTopology:
    """This node is ``n1``; it writes nothing; ``learn`` reveals ``holder``."""

    this_node = "n1"
    epoch = 1

    def __init__(self, holder: str) -> None:
        self.view = "n1"  # the guess: the group's block
        self.holder = holder
        self.learned: list[int] = []

    def primary(self, group: int) -> str:
        return self.view

    def holds(self, group: int) -> bool:
        return True

    def writes(self, group: int) -> bool:
        return False

    async def learn(self, group: int) -> None:
        self.learned.append(group)
        self.view = self.holder

    def addresses(self, node: str) -> NodeAddresses:
        return NodeAddresses(node, "127.0.0.1:1", None, f"127.0.0.1:{node[1:]}")


def conn_for(topology: ScriptedTopology, aware: bool) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        service=types.SimpleNamespace(topology=topology), multi=None,
        cluster_session=cluster_commands.ClusterSession(aware=aware))


def routed(topology: ScriptedTopology, aware: bool, words: list[bytes]) -> object:
    """What the command's routed handler gives (or the error it raises)."""
    conn = conn_for(topology, aware)
    command = cluster_commands.route(conn, lookup(words), words)

    async def run() -> object:
        result = command.handler(conn, words)
        return await result if asyncio.iscoroutine(result) else result

    try:
        return asyncio.run(run())
    except CommandError as exc:
        return exc.text


def test_a_write_another_node_took_is_moved_for_a_cluster_client() -> None:
    topology = ScriptedTopology(holder="n0")
    answer = routed(topology, True, [b"ZADD", KEY, b"1", b"a"])
    assert answer == f"MOVED {slot_of(KEY)} 127.0.0.1:0"
    assert topology.learned == [GROUP]


def test_a_write_another_node_took_is_relayed_for_a_plain_client(monkeypatch) -> None:
    relayed_to: list[tuple[str, str]] = []

    def relaying(address: str, node: str, blocking: bool):
        relayed_to.append((address, node))
        return lambda conn, words: b":1\r\n"
    monkeypatch.setattr(cluster_commands, "_relaying", relaying)
    topology = ScriptedTopology(holder="n2")
    assert routed(topology, False, [b"ZADD", KEY, b"1", b"a"]) == b":1\r\n"
    assert relayed_to == [("127.0.0.1:2", "n2")]


@pytest.mark.parametrize("aware", [True, False])
def test_a_write_still_this_nodes_runs_here(aware: bool) -> None:
    ran: list[list[bytes]] = []
    words = [b"ZADD", KEY, b"1", b"a"]
    command = lookup(words)
    here = dataclasses.replace(command, handler=lambda conn, w: ran.append(w) or b"+here\r\n")
    topology = ScriptedTopology(holder="n1")
    conn = conn_for(topology, aware)
    routed_command = cluster_commands.route(conn, here, words)
    assert routed_command.handler is not here.handler  # (it reads the register first)
    assert asyncio.run(routed_command.handler(conn, words)) == b"+here\r\n"
    assert ran == [words] and topology.learned == [GROUP]


def test_reads_and_writes_inside_multi_do_not_wait_to_learn() -> None:
    topology = ScriptedTopology(holder="n0")
    words = [b"ZSCORE", KEY, b"a"]
    command = lookup(words)
    assert cluster_commands.route(conn_for(topology, True), command, words) is command
    conn = conn_for(topology, True)
    conn.multi = object()
    write = lookup([b"ZADD", KEY, b"1", b"a"])
    assert cluster_commands.route(conn, write, [b"ZADD", KEY, b"1", b"a"]) is write
    assert topology.learned == []
