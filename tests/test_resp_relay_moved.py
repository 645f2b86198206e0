"""A plain Redis client's command that a node relays to the slot's primary,
and that meets the slot moved meanwhile (``-MOVED``: sent just before a
move's cut-over), is relayed once more to the node the ``-MOVED`` names,
instead of reaching the client as ``-TRYAGAIN``; a second ``-MOVED`` does
(docs/redis.md, "On a cluster").  Fake nodes on loopback answer as rankd's
do: ``CLUSTER MYID`` first, then the relayed command."""

from __future__ import annotations

import asyncio
import types

from rankd.frontends.resp.cluster_commands import _relaying, moved_address

COMMAND = [b"ZADD", b"lb", b"1", b"ann"]


async def fake_node(answers: dict[str, bytes], name: str, seen: list[list[bytes]]
                    ) -> tuple[asyncio.Server, str]:
    """Node ``name``: ``+id`` to ``CLUSTER MYID``, ``answers[name]`` to the rest."""
    async def talk(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                words = []
                for _ in range(int(line[1:])):
                    size = int((await reader.readline())[1:])
                    words.append((await reader.readexactly(size + 2))[:-2])
                seen.append(words)
                writer.write(b"+id\r\n" if words[0] == b"CLUSTER" else answers[name])
                await writer.drain()
        finally:
            writer.close()

    server = await asyncio.start_server(talk, "127.0.0.1", 0)
    return server, f"127.0.0.1:{server.sockets[0].getsockname()[1]}"


def relayed(s_answer: bytes, t_answer: bytes) -> tuple[bytes, dict[str, list[list[bytes]]]]:
    """The client's answer to :data:`COMMAND` relayed to node s, and what
    each node received (``{t}`` in an answer: node t's address)."""
    async def scenario() -> tuple[bytes, dict[str, list[list[bytes]]]]:
        seen: dict[str, list[list[bytes]]] = {"s": [], "t": []}
        answers: dict[str, bytes] = {}
        servers, addresses = [], {}
        for name in ("s", "t"):
            server, addresses[name] = await fake_node(answers, name, seen[name])
            servers.append(server)
        for name, answer in (("s", s_answer), ("t", t_answer)):
            answers[name] = answer.replace(b"{t}", addresses["t"].encode())
        conn = types.SimpleNamespace(
            cluster_session=None,
            replies=types.SimpleNamespace(version=2, error=lambda m: f"-{m}\r\n".encode()))
        try:
            reply = await _relaying(addresses["s"], "s", False)(conn, COMMAND)
        finally:
            conn.cluster_session.relay.close()
            for server in servers:
                server.close()
        return reply, seen

    return asyncio.run(scenario())


def test_a_relayed_command_that_meets_a_moved_slot_goes_on_to_its_new_node():
    reply, seen = relayed(b"-MOVED 5 {t}\r\n", b":1\r\n")
    assert reply == b":1\r\n"
    assert seen["s"] == [[b"CLUSTER", b"MYID"], COMMAND]
    assert seen["t"] == [[b"CLUSTER", b"MYID"], COMMAND]  # (t answers -MOVED, never relays)


def test_a_second_moved_reaches_the_client_as_tryagain():
    reply, seen = relayed(b"-MOVED 5 {t}\r\n", b"-MOVED 5 127.0.0.1:1\r\n")
    assert reply.startswith(b"-TRYAGAIN the key's slot moved")
    assert seen["t"] == [[b"CLUSTER", b"MYID"], COMMAND]


def test_moved_address():
    assert moved_address(b"-MOVED 3999 10.0.0.2:7000\r\n") == "10.0.0.2:7000"
    assert moved_address(b"-ASK 3999 10.0.0.2:7000\r\n") is None
    assert moved_address(b":1\r\n") is None
