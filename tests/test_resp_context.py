"""The RESP command modules' view of their connection (``resp/context.py``).

Command handlers are given a :class:`~rankd.frontends.resp.context.Context`
(and reach the listener as its :class:`~rankd.frontends.resp.context.Server`),
never the connection class, so that they do not import ``connection.py``
(issue 46).  Checked both ways: the connection and the listener provide
every member those protocols name, and a command module uses no member
of its ``conn`` (or ``conn.server``) that they do not name.
"""

from __future__ import annotations

import ast
import asyncio
import types
from pathlib import Path

from rankd.frontends.resp.connection import RespServer
from rankd.frontends.resp.context import Context, Server

RESP = Path(__file__).resolve().parent.parent / "src" / "rankd" / "frontends" / "resp"


def members(protocol: type) -> set[str]:
    """The attributes, properties and methods a ``Protocol`` class names."""
    names = set(protocol.__annotations__)
    names |= {name for name, value in vars(protocol).items()
              if not name.startswith("__") and (callable(value) or isinstance(value, property))}
    return names


def used(path: Path) -> tuple[set[str], set[str]]:
    """What ``path`` reads of ``conn.<name>`` and of ``conn.server.<name>``."""
    of_conn: set[str] = set()
    of_server: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Attribute):
            continue
        if isinstance(node.value, ast.Name) and node.value.id == "conn":
            of_conn.add(node.attr)
        elif (isinstance(node.value, ast.Attribute) and node.value.attr == "server"
              and isinstance(node.value.value, ast.Name) and node.value.value.id == "conn"):
            of_server.add(node.attr)
    return of_conn, of_server


def test_command_modules_use_only_what_the_context_names():
    beyond = []
    for path in sorted(RESP.glob("*.py")):
        if path.name == "connection.py":
            continue
        of_conn, of_server = used(path)
        beyond += [f"{path.name}: conn.{name}" for name in sorted(of_conn - members(Context))]
        beyond += [f"{path.name}: conn.server.{name}"
                   for name in sorted(of_server - members(Server))]
    assert beyond == []


def test_the_connection_and_its_server_provide_the_context():
    async def main() -> tuple[list[str], list[str]]:
        # (nothing here reaches the service but whether it routes by a cluster's topology)
        server = RespServer(types.SimpleNamespace(topology=None))
        port = await server.start("127.0.0.1", 0)
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for _ in range(500):
                if server.connections:
                    break
                await asyncio.sleep(0.01)
            (conn,) = server.connections
            return ([name for name in sorted(members(Context)) if not hasattr(conn, name)],
                    [name for name in sorted(members(Server)) if not hasattr(server, name)])
        finally:
            writer.close()
            await server.close(1.0)

    assert asyncio.run(main()) == ([], [])
