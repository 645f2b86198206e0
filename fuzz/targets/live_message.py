"""The live feed's WebSocket message handler: ``parse_client_message`` and
the ``follow``/``unfollow`` it leads to (``rankd/frontends/live.py``, as
``live_http.live_socket`` runs them for each text message).

The input is a run of messages: split on NUL bytes (raw mode, even first
byte) or built as ``{"action": ..., "members": [...]}`` from pieces split
on 0xFE (structured mode, odd first byte; the second byte picks the
action).  Each message is parsed and applied to one subscriber.  Every
message must give ``ping``, ``follow`` or ``unfollow`` or be refused with
``InvalidInput`` (nothing else escapes), within the hang limit; a refused
message changes nothing; the subscriber follows at most ``MAX_FOLLOWS``
valid member names, and the feed's index of followers agrees with it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from fuzz.targets import split

INSTRUMENT = ["rankd.frontends.live"]
MAX_LEN = 8192
ACTIONS = ("follow", "unfollow", "ping", "Follow", "")

live: Any = None
errors: Any = None
check_member: Any = None


class _Engine:
    """What ``LiveFeed`` needs of an engine to follow and unfollow."""

    def __init__(self) -> None:
        self.listeners: list[Any] = []


def load() -> Callable[[bytes], None]:
    global live, errors, check_member
    from rankd.engine import errors as errors_module
    from rankd.engine.ingest import check_member as check
    from rankd.frontends import live as live_module

    live, errors, check_member = live_module, errors_module, check
    return test_one


def messages(data: bytes) -> list[str]:
    mode, choice, stream = split(data)
    if not mode & 1:
        return [part.decode("utf-8", "replace") for part in stream.split(b"\0")]
    out = []
    for number, part in enumerate(stream.split(b"\xff")):
        members = [word.decode("utf-8", "replace") for word in part.split(b"\xfe")]
        action = ACTIONS[(choice + number) % len(ACTIONS)]
        out.append(json.dumps({"action": action, "members": members}))
    return out


def state(feed: Any, subscriber: Any) -> tuple[set[str], dict[str, int]]:
    """What a subscriber follows, and how many follow each member per the feed."""
    index = feed.follows.get(("board", "all"), {})
    return set(subscriber.follows), {member: len(s) for member, s in index.items()}


def test_one(data: bytes) -> None:
    feed = live.LiveFeed(_Engine())
    subscriber = live.Subscriber("board", "all", 10)
    for text in messages(data):
        before = state(feed, subscriber)
        try:
            action, members = live.parse_client_message(text)
            assert action in ("ping", "follow", "unfollow"), action
            if action == "follow":
                feed.follow(subscriber, members)
            elif action == "unfollow":
                feed.unfollow(subscriber, members)
            else:
                assert members is None
        except errors.InvalidInput:
            assert state(feed, subscriber) == before, "a refused message changed state"
        assert len(subscriber.follows) <= live.MAX_FOLLOWS
        for member in subscriber.follows:
            check_member(member)
        index = feed.follows.get(("board", "all"), {})
        assert set(index) == subscriber.follows, (set(index), subscriber.follows)
        assert all(followers == {subscriber} for followers in index.values())
