"""The live feed: top-N and followed members pushed to WebSocket and SSE
subscribers.

Writes only mark a board *dirty* (an engine listener, O(1)).  A tick every
``interval`` seconds renders, for each dirty board, each distinct
``(window, limit)`` that someone watches once, compares a checksum of the
rendered top-N with what was last pushed, and when it changed serializes
one message and hands the *same bytes* to every subscriber of that group.
Followed members are looked up once per tick per ``(window, member)``,
however many subscribers follow them, a batch of them per engine call.  So
the cost of a tick grows with the number of distinct views and followed
members, not of subscribers.

A tick never holds the event loop for long: it runs in turns of at most
``TICK_SLICE`` seconds and lets the loop serve others in between (a tick
with little to do finishes in one turn, as before).  Each message is
rendered and handed to its subscribers in the same turn, so what a
subscriber receives is in the order it was rendered and versions never
decrease; a message whose subscribers are too many for one turn is handed
to the rest in later turns, and a subscriber that begins following members
meanwhile is handed it first (see ``_FanOut``).

Each subscriber has a small bounded queue and its own sender.  A newer
top-N replaces an older one still queued (it supersedes it); a subscriber
whose queue stays full is disconnected with close code 4008, so a slow
reader never slows the others or grows memory without bound.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson

from rankd._tasks import stop_task
from rankd.engine.engine import Engine
from rankd.engine.errors import EngineError, InvalidInput, Unavailable
from rankd.engine.groups import group_of
from rankd.engine.ingest import check_member
from rankd.engine.periods import period_of

log = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_INTERVAL = 0.25
MAX_LIMIT = 100
MAX_FOLLOWS = 100
MAX_QUEUE = 64
#: A queue's bound for the states of members a subscriber begins following
#: (one each, all in one step, before its sender runs): past MAX_QUEUE by
#: at most what one connection follows.
BURST_QUEUE = MAX_QUEUE + MAX_FOLLOWS
#: WebSocket close code for a subscriber that cannot keep up.
CLOSE_TOO_SLOW = 4008
CLOSE_TOO_MANY = 4029
#: WebSocket's "service restart": the board's group moved off this node.
CLOSE_MOVED = 1012
#: Above this many unsent bytes a subscriber's pushes queue up (and supersede).
DIRECT_WRITE_LIMIT = 64 * 1024
#: The longest a tick runs before it lets the loop serve others (seconds).
TICK_SLICE = 0.004
#: Followed members looked up in one engine call (and between two looks at
#: the clock).
MEMBER_BATCH = 64
#: Subscribers handed a message between two looks at the clock.
FAN_OUT_BATCH = 64

Send = Callable[[bytes], Any]


@dataclass(eq=False)
class Subscriber:
    """One WebSocket or SSE connection watching one board and window."""

    board: str
    window: str
    limit: int
    follows: set[str] = field(default_factory=set)
    #: The state ``(score, rank)`` last sent of each followed member: a tick
    #: does not send a subscriber what it has (the state sent when it began
    #: following, say).
    members_sent: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    queue: collections.deque = field(default_factory=collections.deque)
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    #: Set when the feed drops the subscriber: (close code, reason).
    dropped: tuple[int, str] | None = None
    address: str = ""
    #: A WebSocket's transport, once open: pushes are written to it directly.
    transport: asyncio.Transport | None = None

    def push(self, key: str | None, message: bytes, frame: Callable[[], bytes]) -> bool:
        """Send now when the socket keeps up and nothing is queued; else queue.

        The direct path writes the same pre-built WebSocket frame that every
        subscriber gets, without waking this subscriber's sender task.
        """
        transport = self.transport
        if (transport is not None and not self.queue and not transport.is_closing()
                and transport.get_write_buffer_size() < DIRECT_WRITE_LIMIT):
            transport.write(frame())
            return True
        return self.offer(key, message)

    def offer(self, key: str | None, message: bytes, bound: int = MAX_QUEUE) -> bool:
        """Queue a message; one with the same ``key`` still queued is dropped
        (superseded).

        Returns False when the queue holds ``bound`` messages (the
        subscriber is too slow).
        """
        if key is not None:
            for position, (queued_key, _) in enumerate(self.queue):
                if queued_key == key:
                    # Queued last, not in its place: what was queued after
                    # the older one was rendered before this one.
                    del self.queue[position]
                    self.queue.append((key, message))
                    return True
        if len(self.queue) >= bound:
            return False
        self.queue.append((key, message))
        self.wakeup.set()
        return True

    async def next_message(self) -> bytes | None:
        """The next message to send, or None once dropped."""
        while not self.queue:
            if self.dropped is not None:
                return None
            self.wakeup.clear()
            await self.wakeup.wait()
        if self.dropped is not None:
            return None
        return self.queue.popleft()[1]


class _Turn:
    """Where a tick is in its turn of the loop: ``pause`` lets others run
    once the turn has lasted ``TICK_SLICE``."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        #: Turns given up so far: what was read of the engine before the
        #: last one may be out of date.
        self.yielded = 0

    def due(self) -> bool:
        return time.perf_counter() - self.started >= TICK_SLICE

    async def pause(self) -> None:
        if self.due():
            await asyncio.sleep(0)  # other callbacks' turn
            self.started = time.perf_counter()
            self.yielded += 1


class _FanOut:
    """One message being handed to its subscribers, possibly over several
    turns of the loop.  A subscriber still waiting for it that is sent
    something else meanwhile (members it begins following) is handed it
    first, so that it receives messages in the order they were rendered."""

    def __init__(self, feed: LiveFeed, subscribers: list[Subscriber], key: str | None,
                 message: bytes, member: str | None) -> None:
        self.feed = feed
        self.subscribers = subscribers
        self.key = key
        self.message = message
        #: A member's state goes only to those still following the member.
        self.member = member
        self.next = 0
        #: Those not handed the message yet, once it spans turns.
        self.waiting: set[Subscriber] | None = None
        self._frame: bytes | None = None

    def frame(self) -> bytes:
        """The WebSocket frame, built once, for the first subscriber that needs it."""
        if self._frame is None:
            self._frame = websocket_frame(self.message)
        return self._frame

    def hand_next(self, count: int) -> bool:
        """Hand the message to the next ``count`` subscribers; whether any
        remain (then the rest wait for the next call)."""
        end = min(self.next + count, len(self.subscribers))
        waiting = self.waiting
        for subscriber in self.subscribers[self.next:end]:
            if waiting is None:
                self._hand(subscriber)
            elif subscriber in waiting:
                waiting.discard(subscriber)
                self._hand(subscriber)
        self.next = end
        return end < len(self.subscribers)

    def wait_rest(self) -> None:
        """The rest are handed the message in later turns: note who they are."""
        if self.waiting is None:
            self.waiting = set(self.subscribers[self.next:])

    def hand_early(self, subscriber: Subscriber) -> None:
        """Hand the message now to ``subscriber`` if it is still waiting for it."""
        if self.waiting is not None and subscriber in self.waiting:
            self.waiting.discard(subscriber)
            self._hand(subscriber)

    def _hand(self, subscriber: Subscriber) -> None:
        if subscriber.dropped is not None or (self.member is not None
                                              and self.member not in subscriber.follows):
            return
        if subscriber.push(self.key, self.message, self.frame):
            self.feed.pushes += 1
        else:
            log.info("live subscriber at %s too slow: disconnecting", subscriber.address)
            self.feed._drop(subscriber, CLOSE_TOO_SLOW, "subscriber too slow")


@dataclass
class _View:
    """What was last pushed for one (board, window, limit)."""

    subscribers: set[Subscriber] = field(default_factory=set)
    checksum: bytes = b""
    period: str = ""


class LiveFeed:
    """Coalesces board changes into pushes for subscribers (see module doc)."""

    def __init__(self, engine: Engine, *, interval: float = DEFAULT_INTERVAL,
                 send_timeout: float = 10.0, max_per_address: int = 1000) -> None:
        self.engine = engine
        self.interval = interval
        #: How long a push may wait for a subscriber's socket before it is dropped.
        self.send_timeout = send_timeout
        self.max_per_address = max_per_address
        self.views: dict[tuple[str, str, int], _View] = {}
        #: (board, window) -> member -> subscribers following it
        self.follows: dict[tuple[str, str], dict[str, set[Subscriber]]] = {}
        #: (board, window, member) -> (score, rank) last pushed
        self.member_state: dict[tuple[str, str, str], tuple[Any, Any]] = {}
        self.per_address: collections.Counter[str] = collections.Counter()
        self.dirty: set[str] = set()
        self.ticks = 0
        self.pushes = 0
        self.drops = 0
        self._task: asyncio.Task | None = None
        #: The message a tick is handing out over several turns, if any.
        self._fan_out_in_progress: _FanOut | None = None
        engine.listeners.append(self._changed)

    def _changed(self, board: str) -> None:
        self.dirty.add(board)

    # --- life cycle ------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="rankd-live")

    async def stop(self) -> None:
        await stop_task(self._task)
        self._task = None
        for view in self.views.values():
            for subscriber in view.subscribers:
                self._drop(subscriber, 1001, "server shutting down")

    async def _run(self) -> None:
        while True:
            started = time.monotonic()
            try:
                await self.tick()
            except Exception:
                log.exception("live feed tick failed")
            await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - started)))

    # --- subscriptions -----------------------------------------------------------------

    def subscribe(self, board: str, window: str | None, limit: int, members: list[str],
                  address: str = "") -> Subscriber:
        """Register a subscriber and queue its initial snapshot.

        Raises ``EngineError`` for a bad board, window, limit or member list.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
            raise InvalidInput(f"limit must be between 1 and {MAX_LIMIT}")
        _, window, _ = self.engine.read_version(board, window, None)
        if self.per_address[address] >= self.max_per_address:
            raise TooManyConnections(f"at most {self.max_per_address} live connections "
                                     "per client address")
        subscriber = Subscriber(board, window, limit, address=address)
        self.follow(subscriber, members)
        self.per_address[address] += 1
        view = self.views.setdefault((board, window, limit), _View())
        view.subscribers.add(subscriber)
        top, checksum, period = self._render_top(board, window, limit)
        if not view.checksum:
            view.checksum, view.period = checksum, period
        subscriber.offer("top", top)
        self.send_members(subscriber, list(subscriber.follows))
        return subscriber

    def follow(self, subscriber: Subscriber, members: object) -> list[str]:
        """Follow more members (validated); returns those added."""
        added = added_follows(subscriber, members)
        followers = self.follows.setdefault((subscriber.board, subscriber.window), {})
        for member in added:
            subscriber.follows.add(member)
            followers.setdefault(member, set()).add(subscriber)
        return added

    def send_members(self, subscriber: Subscriber, members: Sequence[str]) -> None:
        """Queue followed members' states to one subscriber (when it begins
        following them); later changes come with the ticks."""
        in_progress = self._fan_out_in_progress
        if in_progress is not None:  # what was rendered before these comes first
            in_progress.hand_early(subscriber)
        board, window = subscriber.board, subscriber.window
        for start in range(0, len(members), MEMBER_BATCH):
            batch = members[start:start + MEMBER_BATCH]
            states, version = self._member_states(board, window, batch)
            for member in batch:
                state = states[member]
                subscriber.members_sent[member] = state
                subscriber.offer(None, self._member_message(board, window, member, state,
                                                            version), BURST_QUEUE)

    def unfollow(self, subscriber: Subscriber, members: object) -> None:
        members = _member_names(members)
        followers = self.follows.get((subscriber.board, subscriber.window), {})
        for member in members:
            if member in subscriber.follows:
                subscriber.follows.discard(member)
                subscriber.members_sent.pop(member, None)
                watching = followers.get(member)
                if watching is not None:
                    watching.discard(subscriber)
                    if not watching:
                        del followers[member]
                        self.member_state.pop((subscriber.board, subscriber.window, member),
                                              None)

    def unsubscribe(self, subscriber: Subscriber) -> None:
        key = (subscriber.board, subscriber.window, subscriber.limit)
        view = self.views.get(key)
        if view is not None and subscriber in view.subscribers:
            view.subscribers.discard(subscriber)
            self.per_address[subscriber.address] -= 1
            if self.per_address[subscriber.address] <= 0:
                del self.per_address[subscriber.address]
            if not view.subscribers:
                del self.views[key]
        self.unfollow(subscriber, list(subscriber.follows))
        subscriber.dropped = subscriber.dropped or (1000, "unsubscribed")
        subscriber.wakeup.set()

    def _drop(self, subscriber: Subscriber, code: int, reason: str) -> None:
        if code == CLOSE_TOO_SLOW:
            self.drops += 1
        subscriber.dropped = (code, reason)
        subscriber.queue.clear()
        subscriber.wakeup.set()

    # --- rendering ----------------------------------------------------------------------

    def _render_top(self, board: str, window: str, limit: int) -> tuple[bytes, bytes, str]:
        page = self.engine.top(board, window=window, limit=limit)
        top = page["entries"]
        checksum = hashlib.blake2b(orjson.dumps([page["period"], top]), digest_size=16).digest()
        message = orjson.dumps({"type": "leaderboard.updated", "board": board, "window": window,
                                "period": page["period"], "version": page["version"],
                                "top": top, "ts": time.time()})
        return message, checksum, page["period"]

    def _member_states(self, board: str, window: str, members: Sequence[str]
                       ) -> tuple[dict[str, tuple[Any, Any]], int]:
        """``(score, rank)`` of each of ``members`` (``(None, None)`` when
        absent) in one engine call, and the board's version."""
        found = self.engine.ranks(board, members, window=window)
        states = {entry["member"]: (entry["score"], entry["rank"])
                  for entry in found["entries"]}
        for member in found["missing"]:
            states[member] = (None, None)
        return states, self.engine.read_version(board, window, None)[0]

    @staticmethod
    def _member_message(board: str, window: str, member: str, state: tuple[Any, Any],
                        version: int) -> bytes:
        return orjson.dumps({"type": "user.rank.updated", "board": board, "window": window,
                             "member": member, "score": state[0], "rank": state[1],
                             "version": version, "ts": time.time()})

    async def _settled(self, board: str, read: Callable[[], T]) -> T | None:
        """``read()`` once the board's group has settled on a cluster
        primary (see ``Engine.settled_read``); None when this node cannot
        read it truthfully now: the board stays due for the next tick."""
        try:
            return await self.engine.settled_read(read)
        except Unavailable:
            self.dirty.add(board)
            return None

    async def tick(self) -> None:
        """Push what changed since the last tick (called every ``interval``),
        in turns of at most ``TICK_SLICE`` seconds."""
        self.ticks += 1
        dirty, self.dirty = self.dirty, set()
        now = self.engine.clock()
        turn = _Turn()
        for key, view in list(self.views.items()):
            await turn.pause()
            if self.views.get(key) is not view:
                continue  # its subscribers left meanwhile
            board, window, limit = key
            if board not in self.engine.boards:
                # A group this cluster node stopped holding (placed elsewhere) is
                # not a deletion: "service restart" tells the client to reconnect.
                moved = group_of(board) in getattr(self.engine.replication, "unheld", ())
                for subscriber in list(view.subscribers):
                    self._drop(subscriber, *((CLOSE_MOVED, "the board's group moved to "
                                              "another node: reconnect") if moved else
                                             (4004, "the board was deleted")))
                continue
            rolled = window != "all" and period_of(window, now) != view.period
            if board not in dirty and not rolled:
                continue
            rendered = await self._settled(board, functools.partial(
                self._render_top, board, window, limit))
            if rendered is None:
                continue
            message, checksum, period = rendered
            if checksum == view.checksum:
                continue  # something changed, but not what these subscribers see
            view.checksum, view.period = checksum, period
            await self._fan_out(turn, list(view.subscribers), "top", message)
        for (board, window), followers in list(self.follows.items()):
            if board not in dirty:
                continue
            members = list(followers)
            done = 0
            while done < len(members):
                await turn.pause()
                done = await self._tick_members(turn, board, window, followers, members, done)

    async def _tick_members(self, turn: _Turn, board: str, window: str,
                            followers: dict[str, set[Subscriber]], members: list[str],
                            start: int) -> int:
        """Push the followed members from ``members[start]`` on whose state
        changed to the followers not yet sent it, up to a batch or the end of
        the turn; where to go on from."""
        if board not in self.engine.boards:
            return len(members)
        batch = members[start:start + MEMBER_BATCH]
        try:
            read = await self._settled(board, functools.partial(
                self._member_states, board, window, batch))
        except EngineError:
            return len(members)  # the board was made anew meanwhile, without this window
        if read is None:
            return len(members)
        states, version = read
        turns = turn.yielded
        for done, member in enumerate(batch, start + 1):
            subscribers = followers.get(member)
            if not subscribers:
                continue  # no longer followed
            state = states[member]
            key = (board, window, member)
            if self.member_state.get(key) == state:
                continue
            self.member_state[key] = state
            behind = [s for s in subscribers if s.members_sent.get(member) != state]
            if not behind:
                continue
            for subscriber in behind:
                subscriber.members_sent[member] = state
            await self._fan_out(turn, behind, None,
                                self._member_message(board, window, member, state, version),
                                member)
            if turn.yielded != turns or turn.due():
                return done  # the states read are of an earlier turn: read the rest anew
        return start + len(batch)

    async def _fan_out(self, turn: _Turn, subscribers: list[Subscriber], key: str | None,
                       message: bytes, member: str | None = None) -> None:
        fan_out = _FanOut(self, subscribers, key, message, member)
        try:
            while fan_out.hand_next(FAN_OUT_BATCH):
                if turn.due():  # the rest in later turns (the common case: this one)
                    fan_out.wait_rest()
                    self._fan_out_in_progress = fan_out
                    await turn.pause()
        finally:
            self._fan_out_in_progress = None


def websocket_frame(message: bytes) -> bytes:
    """``message`` as one unmasked text frame, as a server sends it (RFC 6455 5.2)."""
    length = len(message)
    if length < 126:
        header = bytes((0x81, length))
    elif length < 65536:
        header = bytes((0x81, 126)) + length.to_bytes(2, "big")
    else:
        header = bytes((0x81, 127)) + length.to_bytes(8, "big")
    return header + message


class TooManyConnections(EngineError):
    code = "too_many_connections"


def added_follows(subscriber: Subscriber, members: object) -> list[str]:
    """The members of ``members`` that ``subscriber`` does not follow yet;
    ``InvalidInput`` unless they are member names it may follow all of."""
    added = [m for m in dict.fromkeys(_member_names(members)) if m not in subscriber.follows]
    if len(subscriber.follows) + len(added) > MAX_FOLLOWS:
        raise InvalidInput(f"a connection follows at most {MAX_FOLLOWS} members")
    return added


def _member_names(members: object) -> list[str]:
    """``members`` if it is a list of valid member names, else ``InvalidInput``."""
    if not isinstance(members, list) or len(members) > MAX_FOLLOWS:
        raise InvalidInput(f"members must be a list of at most {MAX_FOLLOWS} member names")
    for member in members:
        check_member(member)
    return members


def parse_client_message(data: str) -> tuple[str, Any]:
    """``(action, members)`` of a subscriber's message, or ``InvalidInput``:
    ``follow``/``unfollow`` with members, or ``ping`` (answered ``pong``,
    so a client can tell a dead connection from a quiet board)."""
    try:
        message = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise InvalidInput("messages are JSON objects") from None
    if message == {"action": "ping"}:
        return "ping", None
    if not isinstance(message, dict) or set(message) != {"action", "members"}:
        raise InvalidInput('a message is {"action": "follow"|"unfollow", "members": [...]} '
                           'or {"action": "ping"}')
    if message["action"] not in ("follow", "unfollow"):
        raise InvalidInput("action must be follow, unfollow or ping")
    return message["action"], message["members"]
