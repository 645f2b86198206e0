"""The live feed of a board another node holds, proxied (rankd.frontends.
live_proxy): real nodes, WebSocket and SSE subscribers on a node that does
not hold the board's group."""

from __future__ import annotations

import asyncio
import re
import time
import urllib.request
from pathlib import Path

import aiohttp
import orjson
from cluster_nodes import nodes, sql

from daemon import Daemon
from rankd.cluster.groups import group_of

BOARD = "proxied"
GROUP = group_of(BOARD)
ARGS = ("--replicas", "0", "--live-interval", "0.05")


def subscribers(daemon: Daemon) -> int:
    """``daemon``'s live-feed connections (``rankd_live_subscribers``: those
    it serves itself and those it proxies)."""
    with urllib.request.urlopen(daemon.url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    return round(float(re.search(r"^rankd_live_subscribers (\S+)$", text, re.M)[1]))


def holder(dsn: str) -> str | None:
    rows = sql(dsn, "SELECT holder FROM rankd_groups WHERE group_id = $1", GROUP)
    return rows[0]["holder"] if rows else None


class Watcher:
    """A WebSocket subscriber: every message it got, in order."""

    def __init__(self, session: aiohttp.ClientSession, daemon: Daemon, query: str) -> None:
        self.session, self.url = session, f"{daemon.url.replace('http', 'ws')}" \
                                          f"/v1/boards/{BOARD}/live?{query}"
        self.messages: list[dict] = []
        self.closed: int | None = None
        self.task: asyncio.Task | None = None

    async def start(self) -> Watcher:
        socket = await self.session.ws_connect(self.url)
        self.task = asyncio.ensure_future(self._read(socket))
        return self

    async def _read(self, socket: aiohttp.ClientWebSocketResponse) -> None:
        async for message in socket:
            self.messages.append(orjson.loads(message.data))
        self.closed = socket.close_code

    def tops(self) -> list[dict]:
        return [m for m in self.messages if m["type"] == "leaderboard.updated"]

    def leaders(self) -> list[str]:
        """The leader of each top received, repeats collapsed."""
        out: list[str] = []
        for message in self.tops():
            if message["top"] and (not out or out[-1] != message["top"][0]["member"]):
                out.append(message["top"][0]["member"])
        return out

    async def until(self, predicate, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, (self.messages[-5:], self.closed)
            await asyncio.sleep(0.02)


async def write(session: aiohttp.ClientSession, daemon: Daemon, member: str, score: float
                ) -> dict:
    for _ in range(100):
        async with session.post(f"{daemon.url}/v1/boards/{BOARD}/scores",
                                json={"member": member, "score": score,
                                      "event_id": f"{member}-{score}"}) as answer:
            body = await answer.json()
        if answer.status == 200:
            return body
        await asyncio.sleep(0.1)  # a move's cut-over: try again
    raise AssertionError(body)


def start_board(primary: Daemon, dsn: str, *others: Daemon) -> None:
    """The board, written on ``primary`` and placed there only: ``others``
    no longer hold its group."""
    assert primary.request("PUT", f"/v1/boards/{BOARD}", {"policy": "best"})[0] == 201
    assert primary.request("POST", f"/v1/boards/{BOARD}/scores",
                           {"member": "seed", "score": 0, "event_id": "seed"})[0] == 200
    deadline = time.monotonic() + 15
    while not sql(dsn, "SELECT 1 FROM rankd_placement WHERE group_id = $1", GROUP):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    for other in others:
        wait_dropped(other)


def wait_dropped(daemon: Daemon) -> None:
    """Until ``daemon`` no longer holds the board's group (not placed there).
    (Not "until it no longer follows it": a node that had not started to
    follow the new group yet passed that at once, then held the group
    without its board a moment, and answered a subscription 404.)"""
    deadline = time.monotonic() + 15
    while GROUP not in daemon.request("GET", "/v1/cluster")[1]["this_node"]["unheld_groups"]:
        assert time.monotonic() < deadline, f"{daemon.data_dir.name} still holds the group"
        time.sleep(0.1)


def test_subscribers_on_a_node_without_the_board_share_one_upstream(tmp_path: Path,
                                                                   pg_dsn: str) -> None:
    """Two WebSocket subscribers (limits 1 and 5) and one SSE subscriber on
    n1, which does not hold the board: one upstream to n0 (n0 counts one
    subscriber), and each sees every write made on n0, in order, with
    versions that never go back."""
    with nodes(tmp_path, pg_dsn, 2, *ARGS) as (primary, other):
        start_board(primary, pg_dsn, other)

        async def run() -> None:
            async with aiohttp.ClientSession() as session:
                one = await Watcher(session, other, "limit=1").start()
                five = await Watcher(session, other, "limit=5&members=seed").start()
                sse = asyncio.ensure_future(read_sse(session, other))
                await one.until(lambda: one.tops())
                await five.until(lambda: five.tops())
                # n0 serves one connection (the upstream); n1 counts its three own.
                assert subscribers(primary) == 1 and subscribers(other) == 3
                for n in range(1, 9):
                    await write(session, primary, f"p{n}", n)
                    await one.until(lambda n=n: one.leaders()[-1:] == [f"p{n}"])
                await five.until(lambda: five.leaders()[-1:] == ["p8"])
                for watcher in (one, five):
                    assert watcher.leaders() == ["seed", *(f"p{n}" for n in range(1, 9))]
                    versions = [m["version"] for m in watcher.tops()]
                    assert versions == sorted(versions), versions
                assert all(len(m["top"]) <= 1 for m in one.tops())
                assert len(five.tops()[-1]["top"]) == 5
                assert any(m["type"] == "user.rank.updated" and m["member"] == "seed"
                           for m in five.messages)
                deadline = time.monotonic() + 10
                while not any(b'"member":"p8"' in line for line in sse_lines):
                    assert time.monotonic() < deadline, sse_lines[-3:]
                    await asyncio.sleep(0.05)
                sse.cancel()
                await asyncio.gather(sse, return_exceptions=True)
                tops = [orjson.loads(line[len(b"data: "):]) for line in sse_lines
                        if line.startswith(b'data: {"type":"leaderboard.updated"')]
                assert all(len(top["top"]) <= 3 for top in tops)
                assert [t["version"] for t in tops] == sorted(t["version"] for t in tops)
                assert subscribers(primary) == 1  # still the one upstream

        sse_lines: list[bytes] = []

        async def read_sse(session: aiohttp.ClientSession, daemon: Daemon) -> None:
            async with session.get(f"{daemon.url}/v1/boards/{BOARD}/events?limit=3") as answer:
                assert answer.status == 200
                async for line in answer.content:
                    sse_lines.append(line.rstrip(b"\n"))

        asyncio.run(run())


def test_a_proxied_subscription_follows_the_board_through_a_move(tmp_path: Path,
                                                                pg_dsn: str) -> None:
    """Three nodes, the board on n0, a subscriber on n2; the group moves to
    n1: the upstream is re-established to n1 and the subscriber sees the
    writes made there, its versions never going back."""
    with nodes(tmp_path, pg_dsn, 3, *ARGS) as (first, second, third):
        start_board(first, pg_dsn, second, third)

        async def run() -> None:
            async with aiohttp.ClientSession() as session:
                watcher = await Watcher(session, third, "limit=3").start()
                await watcher.until(lambda: watcher.tops())
                await write(session, first, "before", 10)
                await watcher.until(lambda: watcher.leaders()[-1:] == ["before"])
                status, body = first.request("POST", "/v1/cluster/moves",
                                             {"group": GROUP, "node": "n1"})
                assert status == 202, body
                deadline = time.monotonic() + 30
                while await asyncio.to_thread(holder, pg_dsn) != "n1":
                    assert time.monotonic() < deadline, "the group never moved"
                    await asyncio.sleep(0.1)
                for n in range(1, 4):
                    await write(session, second, f"after{n}", 10 + n)
                    await watcher.until(lambda n=n: watcher.leaders()[-1:] == [f"after{n}"],
                                        timeout=20)
                # Once n0 (the source, following the group a while) drops it, the
                # upstream is on n1, the node that holds the group.
                await asyncio.to_thread(wait_dropped, first)
                await write(session, second, "after4", 20)
                await watcher.until(lambda: watcher.leaders()[-1:] == ["after4"], timeout=20)
                assert watcher.closed is None
                assert watcher.leaders()[-5:] == ["before", *(f"after{n}" for n in range(1, 5))]
                versions = [m["version"] for m in watcher.tops()]
                assert versions == sorted(versions), versions
                assert await asyncio.to_thread(subscribers, second) == 1
                assert await asyncio.to_thread(subscribers, first) == 0

        asyncio.run(run())


def test_a_proxied_subscription_survives_a_kill_of_the_primary(tmp_path: Path,
                                                               pg_dsn: str) -> None:
    """kill -9 of the node that holds the board: the proxy finds the new
    holder and the subscriber sees the writes made there, versions never
    going back; or, if the group lands on the subscriber's own node, it is
    closed with 1012 and a new subscription there is current at once."""
    with nodes(tmp_path, pg_dsn, 3, *ARGS) as (first, second, third):
        start_board(first, pg_dsn, second, third)

        async def run() -> None:
            async with aiohttp.ClientSession() as session:
                watcher = await Watcher(session, third, "limit=3").start()
                await write(session, first, "before", 10)
                await watcher.until(lambda: watcher.leaders()[-1:] == ["before"])
                first.kill()  # (the subscriber's node logs what its upstream does)
                for n in range(1, 4):
                    await write(session, second, f"after{n}", 10 + n)
                await watcher.until(lambda: watcher.leaders()[-1:] == ["after3"]
                                    or watcher.closed is not None, timeout=30)
                if watcher.closed is not None:  # the group came to n2 itself: 1012
                    assert watcher.closed == 1012, watcher.closed
                    again = await Watcher(session, third, "limit=3").start()
                    await again.until(lambda: again.leaders()[-1:] == ["after3"], timeout=20)
                    watcher = again
                versions = [m["version"] for m in watcher.tops()]
                assert versions == sorted(versions), versions
                # Writes made while the upstream was re-established are coalesced,
                # as a tick coalesces them: the state after them is all there.
                assert [(e["member"], e["score"]) for e in watcher.tops()[-1]["top"]] == [
                    ("after3", 13.0), ("after2", 12.0), ("after1", 11.0)]

        try:
            asyncio.run(run())
        except BaseException:
            print("\n".join(line for line in third.log().splitlines() if "live" in line))
            raise


def test_subscribers_that_drop_their_connection_leave_nothing_behind(tmp_path: Path,
                                                                     pg_dsn: str) -> None:
    """Proxied WebSocket subscribers that reset their TCP connection one
    after another (no close frame): once gone, the proxying node counts no
    subscriber and keeps no upstream, and a new subscriber is admitted.  A
    cancelled upstream's end removed the next upstream made under the same
    key, whose subscribers then never left the per-address count: the
    address was locked out."""
    with nodes(tmp_path, pg_dsn, 2, *ARGS, "--live-max-per-address", "5") as (primary, other):
        start_board(primary, pg_dsn, other)

        async def run() -> None:
            url = f"{other.url.replace('http', 'ws')}/v1/boards/{BOARD}/live?limit=3"
            async with aiohttp.ClientSession() as session:
                for n in range(30):
                    socket = await session.ws_connect(f"{url}&members=m{n % 5}")
                    await socket.receive(timeout=10)  # its first message
                    socket._response.connection.transport.abort()  # (no close frame)
            deadline = time.monotonic() + 15
            while subscribers(other) or subscribers(primary):
                assert time.monotonic() < deadline, (subscribers(other), subscribers(primary))
                await asyncio.sleep(0.1)
            async with aiohttp.ClientSession() as session:
                watcher = await Watcher(session, other, "limit=1").start()
                await watcher.until(lambda: watcher.tops())

        asyncio.run(run())
