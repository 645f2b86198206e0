"""The live proxy's lanes in-process (rankd.frontends.live_proxy): which
connection follows which member, when one is opened and closed, and a
subscriber whose upstream ended.  The nodes themselves:
tests/cluster/test_live_proxy*.py."""

from __future__ import annotations

import asyncio
import collections
import json
from types import SimpleNamespace

from rankd.frontends.live import CLOSE_MOVED, MAX_FOLLOWS
from rankd.frontends.live_proxy import LiveProxy


def proxy_to(holder: str | None) -> LiveProxy:
    """A proxy whose boards are held by ``holder`` (None: by this node)."""
    feed = SimpleNamespace(per_address=collections.Counter(), max_per_address=1000)
    forwarder = SimpleNamespace(node="n9", trust=SimpleNamespace(
        forward_header=lambda *_: "unsigned"))
    return LiveProxy(feed, forwarder, lambda board, window: holder)  # type: ignore[arg-type]


def test_members_past_one_connections_cap_go_on_another_closed_once_unfollowed() -> None:
    async def run() -> None:
        proxy = proxy_to("127.0.0.1:9")  # (nothing listens: the lanes keep trying)
        try:
            one = proxy.subscribe("b", None, 10, [f"m{n}" for n in range(60)], None)
            two = proxy.subscribe("b", None, 10, [f"m{n}" for n in range(30, 120)], None)
            (upstream,) = proxy.upstreams.values()
            assert [len(lane.members) for lane in upstream.lanes] == [MAX_FOLLOWS, 20]
            assert all(upstream.lane_of[f"m{n}"] is upstream.lanes[n // 100]
                       for n in range(120))
            second = upstream.lanes[1]
            proxy.unfollow(two, [f"m{n}" for n in range(100, 120)])
            assert upstream.lanes == [upstream.lanes[0]] and second.retired
            await asyncio.sleep(0)
            assert second.task.cancelled() or second.task.done()
            # A member let go on the first lane frees its place there.
            proxy.unfollow(one, ["m0"])
            proxy.follow(two, ["new"])
            assert upstream.lane_of["new"] is upstream.lanes[0]
            assert len(upstream.lanes) == 1
            proxy.unsubscribe(one)
            proxy.unsubscribe(two)
            assert not proxy.upstreams and not proxy.feed.per_address
        finally:
            await proxy.close()

    asyncio.run(run())


def test_a_follow_after_the_upstream_ended_changes_nothing() -> None:
    """The board's group came to this node: the upstream ends and closes its
    subscribers with 1012; a follow the client sent meanwhile is ignored
    (it raised KeyError in the handler)."""

    async def run() -> None:
        proxy = proxy_to(None)
        try:
            subscriber = proxy.subscribe("b", None, 10, ["a"], None)
            for _ in range(10):
                await asyncio.sleep(0)
            assert subscriber.dropped is not None and subscriber.dropped[0] == CLOSE_MOVED
            assert proxy.follow(subscriber, ["b"]) == []
            proxy.unfollow(subscriber, ["a"])
            proxy.unsubscribe(subscriber)
            assert not proxy.serves(subscriber)
            assert not proxy.upstreams and not proxy.feed.per_address
        finally:
            await proxy.close()

    asyncio.run(run())


class SentUp:
    """A lane's socket that keeps what the proxy sends up on it."""

    closed = False

    def __init__(self) -> None:
        self.sent: list[dict] = []

    async def send_str(self, data: str) -> None:
        self.sent.append(json.loads(data))


def test_lanes_left_with_few_members_are_merged_back() -> None:
    """Three subscribers follow 250 distinct members (three connections:
    100, 100, 50).  Once unfollows leave 190, two connections are enough:
    the third's 50 go to the first's room (followed there), and it is
    closed; once 100 are left, one connection follows them all.  Before,
    a connection was closed only when it followed nobody, and the node kept
    three upstream connections for what one could follow."""

    async def run() -> None:
        proxy = proxy_to("127.0.0.1:9")  # (nothing listens: the lanes keep trying)
        try:
            one, two, three = (proxy.subscribe("b", None, 10, [f"m{n}" for n in range(
                start, start + size)], None) for start, size in ((0, 100), (100, 100),
                                                                 (200, 50)))
            (upstream,) = proxy.upstreams.values()
            first, second, third = upstream.lanes
            assert [len(lane.members) for lane in upstream.lanes] == [100, 100, 50]
            sockets = [SentUp() for _ in upstream.lanes]
            for lane, socket in zip(upstream.lanes, sockets, strict=True):
                lane.socket = socket  # type: ignore[assignment]
            proxy.unfollow(one, [f"m{n}" for n in range(60)])
            await asyncio.sleep(0)
            assert upstream.lanes == [first, second] and third.retired
            assert all(upstream.lane_of[f"m{n}"] is first for n in range(200, 250))
            assert sockets[0].sent[-1] == {"action": "follow",
                                           "members": [f"m{n}" for n in range(200, 250)]}
            assert not sockets[2].sent  # closed, not unfollowed one by one
            assert len(first.members) == 90 and len(upstream.members) == 190
            proxy.unfollow(two, [f"m{n}" for n in range(100, 190)])
            await asyncio.sleep(0)
            assert upstream.lanes == [first] and second.retired
            assert first.members == set(upstream.members) and len(first.members) == 100
            assert sockets[0].sent[-1] == {"action": "follow",
                                           "members": [f"m{n}" for n in range(190, 200)]}
            # Every subscriber still follows what it did, on the one connection.
            assert three.follows == {f"m{n}" for n in range(200, 250)}
            assert set(upstream.lane_of.values()) == {first}
            for subscriber in (one, two, three):
                proxy.unsubscribe(subscriber)
            assert not proxy.upstreams
        finally:
            await proxy.close()

    asyncio.run(run())
