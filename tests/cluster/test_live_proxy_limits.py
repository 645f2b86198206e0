"""The live-feed proxy's limits and metrics (rankd.frontends.live_proxy,
rankd.frontends.live_proxy_metrics), with real nodes: more followed
members between a node's subscribers than one connection may follow, a
plain client held to the per-connection cap, and the upstream figures in
``/metrics``."""

from __future__ import annotations

import asyncio
import re
import time
import urllib.request
from pathlib import Path

import aiohttp
from cluster_nodes import nodes
from test_live_proxy import ARGS, BOARD, GROUP, Watcher, start_board, subscribers

from daemon import Daemon
from rankd.frontends.live import MAX_FOLLOWS


def metric(daemon: Daemon, name: str) -> float:
    """One unlabelled sample of ``daemon``'s ``/metrics``."""
    with urllib.request.urlopen(daemon.url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    assert found, f"{name} not in /metrics"
    return float(found[1])


async def write_all(session: aiohttp.ClientSession, daemon: Daemon, scores: dict[str, float]
                    ) -> None:
    """``scores`` written on ``daemon`` in one batch (retried through a cut-over)."""
    events = [{"member": member, "score": score, "event_id": f"{member}-{score}"}
              for member, score in scores.items()]
    for _ in range(100):
        async with session.post(f"{daemon.url}/v1/boards/{BOARD}/scores/batch",
                                json={"events": events}) as answer:
            body = await answer.json()
        if answer.status == 200:
            assert not [r for r in body["results"] if "error" in r], body
            return
        await asyncio.sleep(0.1)
    raise AssertionError(body)


async def move_and_reconnect(via: Daemon, node: str, proxying: Daemon) -> None:
    """The board's group moved to ``node`` (asked of ``via``), until
    ``proxying`` re-established its upstream."""
    status, body = via.request("POST", "/v1/cluster/moves", {"group": GROUP, "node": node})
    assert status == 202, body
    deadline = time.monotonic() + 30
    while metric(proxying, "rankd_live_proxy_reconnections_total") < 1:
        assert time.monotonic() < deadline, "the upstream was not re-established"
        await asyncio.sleep(0.1)


class Follower(Watcher):
    """A :class:`Watcher` that keeps its socket, to send on it."""

    async def start(self) -> Follower:
        self.socket = await self.session.ws_connect(self.url)
        self.task = asyncio.ensure_future(self._read(self.socket))
        return self


def seen(watcher: Watcher) -> dict[str, float | None]:
    """The last score ``watcher`` was sent of each member."""
    return {m["member"]: m["score"] for m in watcher.messages
            if m["type"] == "user.rank.updated"}


def test_subscribers_following_more_members_than_one_connection_may(tmp_path: Path,
                                                                    pg_dsn: str) -> None:
    """Three subscribers on n1 (which does not hold the board) follow 150
    distinct members between them (60, 60 and 50, overlapping): n1 follows
    them upstream on two connections of at most 100 each, and every
    subscriber gets every write of each member it follows, twice over,
    and nothing of the others; once the members past 100 are followed by
    nobody, the second connection is closed and the rest still updated.
    Before, the single upstream was refused the follows past 100 and those
    members were never updated."""
    with nodes(tmp_path, pg_dsn, 2, *ARGS) as (primary, other):
        start_board(primary, pg_dsn, other)
        follows = [[f"m{n}" for n in range(0, 60)], [f"m{n}" for n in range(50, 110)],
                   [f"m{n}" for n in range(100, 150)]]

        async def run() -> None:
            async with aiohttp.ClientSession() as session:
                # (the third on a session of its own, closed to make it leave)
                alone = aiohttp.ClientSession()
                watchers = [await Follower(own, other,
                                          f"limit=5&members={','.join(members)}").start()
                            for own, members in zip((session, session, alone), follows,
                                                    strict=True)]
                for watcher in watchers:
                    await watcher.until(lambda w=watcher: w.tops())
                for round_ in (1, 2):
                    scores = {f"m{n}": 1000.0 * round_ + n for n in range(150)}
                    await write_all(session, primary, scores)
                    for watcher, members in zip(watchers, follows, strict=True):
                        await watcher.until(lambda w=watcher, ms=members, s=scores: all(
                            seen(w).get(m) == s[m] for m in ms), timeout=20)
                for watcher, members in zip(watchers, follows, strict=True):
                    assert set(seen(watcher)) == set(members)
                    assert watcher.closed is None
                    assert watcher.tops()[-1]["top"][0]["member"] == "m149"
                # Two upstream connections: n0 serves two, n1 counts its three.
                assert subscribers(primary) == 2 and subscribers(other) == 3
                assert metric(other, "rankd_live_proxy_upstreams") == 2
                assert metric(other, "rankd_live_proxy_subscribers") == 3
                assert metric(other, "rankd_live_proxy_followed_members") == 150
                # One leaves: the members only it followed (m110..m149) are let
                # go, and the second connection, following nobody, is closed.
                # The third leaves, the second unfollows m100..m109: the second
                # connection, following nobody, is closed.
                await alone.close()
                await watchers[1].socket.send_json(
                    {"action": "unfollow", "members": [f"m{n}" for n in range(100, 110)]})
                deadline = time.monotonic() + 10
                while (metric(other, "rankd_live_proxy_followed_members") != 100
                       or metric(other, "rankd_live_proxy_upstreams") != 1):
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.05)
                deadline = time.monotonic() + 10
                while subscribers(primary) != 1:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.05)
                await write_all(session, primary, {f"m{n}": 5000.0 + n for n in range(150)})
                follows[1] = follows[1][:50]
                for watcher, members in zip(watchers[:2], follows, strict=False):
                    await watcher.until(lambda w=watcher, ms=members: all(
                        seen(w).get(m) == 5000.0 + int(m[1:]) for m in ms), timeout=20)

        asyncio.run(run())


def test_a_plain_client_still_follows_at_most_the_cap(tmp_path: Path, pg_dsn: str) -> None:
    """A client, on the board's node or on another, is refused more than
    MAX_FOLLOWS follows on one connection: in the query (422, before the
    upgrade) and by messages (an error, the follows it had kept)."""
    with nodes(tmp_path, pg_dsn, 2, *ARGS) as (primary, other):
        start_board(primary, pg_dsn, other)
        too_many = ",".join(f"m{n}" for n in range(MAX_FOLLOWS + 1))

        async def run() -> None:
            async with aiohttp.ClientSession() as session:
                for daemon in (primary, other):
                    url = f"{daemon.url.replace('http', 'ws')}/v1/boards/{BOARD}/live"
                    with_query = f"{url}?limit=1&members={too_many}"
                    try:
                        await session.ws_connect(with_query)
                        raise AssertionError("the subscription was accepted")
                    except aiohttp.WSServerHandshakeError as exc:
                        assert exc.status == 422
                    async with session.ws_connect(f"{url}?limit=1") as socket:
                        first = [f"a{n}" for n in range(MAX_FOLLOWS)]
                        await socket.send_json({"action": "follow", "members": first})
                        await socket.send_json({"action": "follow", "members": ["one-more"]})
                        deadline = time.monotonic() + 10
                        while True:
                            message = await socket.receive_json(timeout=10)
                            if message["type"] == "error":
                                break
                            assert time.monotonic() < deadline
                        assert f"at most {MAX_FOLLOWS}" in message["message"], message

        asyncio.run(run())


def test_upstream_metrics_of_a_real_node(tmp_path: Path, pg_dsn: str) -> None:
    """n1 proxies two subscribers of a board n0 holds: its ``/metrics``
    count the open upstream, the proxied subscribers, the messages
    received and relayed, the bytes buffered; once the group moved to n2
    the upstream is re-established there and counted so."""
    with nodes(tmp_path, pg_dsn, 3, *ARGS) as (primary, other, third):
        start_board(primary, pg_dsn, other, third)

        async def run() -> None:
            async with aiohttp.ClientSession() as session:
                assert metric(other, "rankd_live_proxy_upstreams") == 0
                watchers = [await Watcher(session, other, f"limit={n}&members=w").start()
                            for n in (1, 3)]
                for watcher in watchers:
                    await watcher.until(lambda w=watcher: w.tops())
                await write_all(session, primary, {"w": 5.0, "x": 6.0})
                for watcher in watchers:
                    await watcher.until(lambda w=watcher: seen(w).get("w") == 5.0)
                assert metric(other, "rankd_live_proxy_upstreams") == 1
                assert metric(other, "rankd_live_proxy_subscribers") == 2
                assert metric(other, "rankd_live_proxy_connections_total") == 1
                assert metric(other, "rankd_live_proxy_reconnections_total") == 0
                received = metric(other, "rankd_live_proxy_received_total")
                relayed = metric(other, "rankd_live_proxy_relayed_total")
                assert received >= 3  # a first top, w's first state, a top and w's new one
                assert relayed >= 2 * received - 2  # each fanned out to both (tops cut)
                assert metric(other, "rankd_live_proxy_buffered_bytes") >= 0
                await move_and_reconnect(primary, "n2", other)
                assert metric(other, "rankd_live_proxy_connections_total") >= 2

        asyncio.run(run())


def test_a_subscriber_following_the_most_members_keeps_up_through_a_move(
        tmp_path: Path, pg_dsn: str) -> None:
    """A subscriber on n2 following MAX_FOLLOWS members of a board n0 holds;
    the group moves to n1: the upstream re-established there sends every
    member's state at once, and the subscriber takes them all (its queue
    has room for one per followed member) instead of being closed as too
    slow (4008), then gets every member's next write made on n1."""
    with nodes(tmp_path, pg_dsn, 3, *ARGS) as (first, second, third):
        start_board(first, pg_dsn, second, third)
        members = [f"f{n}" for n in range(MAX_FOLLOWS)]

        async def run() -> None:
            async with aiohttp.ClientSession() as session:
                await write_all(session, first, {m: float(n) for n, m in enumerate(members)})
                watcher = await Watcher(session, third,
                                        f"limit=1&members={','.join(members)}").start()
                await watcher.until(lambda: len(seen(watcher)) == MAX_FOLLOWS)
                await move_and_reconnect(first, "n1", third)
                scores = {m: 1000.0 + n for n, m in enumerate(members)}
                await write_all(session, second, scores)
                await watcher.until(lambda: all(seen(watcher).get(m) == s
                                                for m, s in scores.items()), timeout=20)
                assert watcher.closed is None

        asyncio.run(run())
