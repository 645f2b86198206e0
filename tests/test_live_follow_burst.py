"""A subscriber that begins following MAX_FOLLOWS members at once gets the
state of every one of them (rankd.frontends.live): they are queued in one
step, before its sender runs, and the queue's bound dropped those past it."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from daemon import Daemon
from rankd.frontends.live import MAX_FOLLOWS


def test_following_the_most_members_at_once_sends_each_ones_state(tmp_path) -> None:
    members = [f"burst-{n}" for n in range(MAX_FOLLOWS)]
    others = [f"later-{n}" for n in range(MAX_FOLLOWS)]
    with Daemon(tmp_path / "data", "--fsync", "no") as daemon:
        assert daemon.request("PUT", "/v1/boards/burst", {"policy": "best"})[0] == 201
        events = [{"member": m, "score": n} for n, m in enumerate(members + others)]
        assert daemon.request("POST", "/v1/boards/burst/scores/batch",
                              {"events": events})[0] == 200

        async def states(socket: aiohttp.ClientWebSocketResponse, count: int) -> dict:
            got: dict[str, float] = {}
            while len(got) < count:
                message = json.loads((await socket.receive(timeout=5)).data)
                if message["type"] == "user.rank.updated":
                    got[message["member"]] = message["score"]
            return got

        async def run() -> None:
            url = f"ws://127.0.0.1:{daemon.port}/v1/boards/burst/live?limit=1"
            async with aiohttp.ClientSession() as session:
                # In the query: the states come with the first top.
                async with session.ws_connect(f"{url}&members={','.join(members)}") as socket:
                    got = await states(socket, MAX_FOLLOWS)
                    assert got == {m: float(n) for n, m in enumerate(members)}
                # By a message on an open socket.
                async with session.ws_connect(url) as socket:
                    await socket.send_json({"action": "follow", "members": others})
                    got = await states(socket, MAX_FOLLOWS)
                    assert got == {m: float(n) for n, m in enumerate(others, MAX_FOLLOWS)}

        asyncio.run(run())
