"""The live feed of a board this node does not hold, proxied from one that does.

On a cluster a node holds only the groups placed on it, so a subscription
to another group's board (a browser's page behind a plain load balancer)
cannot be rendered here.  The node then proxies it: it opens **one
upstream** per ``(board, window)`` to the node that holds the board's
group, and fans what comes down out to every local subscriber of that
board and window, whatever their ``limit`` and followed members.

* The upstream follows the union of the members the local subscribers
  follow (``follow``/``unfollow`` sent up as they change).  The holder
  caps every connection, a node's included, at
  :data:`~rankd.frontends.live.MAX_FOLLOWS` followed members, so an
  upstream is a small pool of WebSocket connections, its *lanes*
  (:class:`Lane`): each follows at most ``MAX_FOLLOWS`` members, a member
  is followed on one lane only, a lane is opened only when every open one
  is full and closed once it follows nobody, or once the others have room
  for its members (unfollows left them few: they move over, one lane per
  unfollow, so the work of a step stays bounded).  The first lane asks for the
  largest top (:data:`~rankd.frontends.live.MAX_LIMIT`) and is the only
  one whose tops are used; the others ask for a top of one (cheap for the
  holder) and carry members only.  No claim of being a node is needed, so
  no client can get past the cap either.  Each local
  subscriber gets the top cut to its ``limit``, only when that cut changed
  (as the local feed pushes only a changed top-N), and the state of the
  members it follows; one it starts following that is followed already gets
  the last state seen at once.
* ``version`` never decreases for a subscriber: a top older than the last
  one sent (an upstream re-established to a node a little behind) is not
  sent.
* Each local subscriber is a :class:`~rankd.frontends.live.Subscriber`,
  with the local feed's bounded queue: a newer top supersedes a queued
  one, a subscriber whose queue stays full is dropped (close code 4008).
* The upstream is the node's own request, signed with its cluster
  credential (:mod:`rankd.frontends.forwarding`) for the caller the node
  admitted; the holder checks that caller's scope and limits.
* When the upstream ends (the group moved, its node failed) the proxy finds
  the group's holder again and reconnects; the new upstream sends the whole
  current state first, so every subscriber is current again without doing
  anything (the states in between are coalesced, as a tick coalesces
  writes).  If this node now holds the group itself, the proxied
  subscribers are closed with code 1012 ("service restart"), as the local
  feed closes those of a group that moved away: they reconnect and are
  served here.  An upstream without local subscribers is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp
import orjson
from yarl import URL

from rankd.cluster.trust import FORWARD_AUTH
from rankd.engine.errors import EngineError, InvalidInput, NotPrimary
from rankd.frontends.forwarding import FORWARDED, Forwarder, signed_node
from rankd.frontends.live import (
    BURST_QUEUE,
    CLOSE_MOVED,
    CLOSE_TOO_SLOW,
    MAX_FOLLOWS,
    MAX_LIMIT,
    MAX_QUEUE,
    LiveFeed,
    Subscriber,
    TooManyConnections,
    _member_names,
    added_follows,
)
from rankd.security import Principal

log = logging.getLogger(__name__)

#: Seconds between two tries to reach the board's holder again.
RETRY_SECONDS = 0.2
#: Upgrade answers of the holder that end the subscription (bad query, not
#: allowed, not found): others are tried again (421 and 503 while a group
#: moves, 401 while the holder does not know this node yet, 429).
REFUSED = frozenset({400, 403, 404})
#: How long the proxy keeps trying before it closes its subscribers (1012).
GIVE_UP_SECONDS = 30.0
#: The upstream pings the holder this often and gives it half as long to
#: answer: a holder frozen (SIGSTOP, a partition without resets) is left in
#: seconds, as the cluster fails its groups over, not when TCP gives up.
UPSTREAM_HEARTBEAT = 2.0


@dataclass(eq=False)
class Lane:
    """One connection of an upstream and the members it follows (at most
    :data:`~rankd.frontends.live.MAX_FOLLOWS`)."""

    members: set[str] = field(default_factory=set)
    socket: aiohttp.ClientWebSocketResponse | None = None
    task: asyncio.Task | None = None
    #: Closed because it follows nobody: its end is not its upstream's.
    retired: bool = False
    #: Times it connected (from the second on, it was re-established).
    connected: int = 0


@dataclass(eq=False)
class Upstream:
    """One proxied ``(board, window)``: its lanes and local subscribers."""

    board: str
    window: str | None
    principal: Principal
    address: str
    secure: bool
    subscribers: set[Subscriber] = field(default_factory=set)
    #: Followed members: how many local subscribers follow each.
    members: dict[str, int] = field(default_factory=dict)
    #: Its connections; the first's tops are the ones used, and it lives
    #: as long as the upstream.
    lanes: list[Lane] = field(default_factory=list)
    #: The lane each followed member is followed on.
    lane_of: dict[str, Lane] = field(default_factory=dict)
    #: The last top seen (the whole message) and, per limit, the cut last sent.
    top: dict[str, Any] | None = None
    sent: dict[int, tuple[Any, list]] = field(default_factory=dict)
    #: The last message of each followed member.
    member_messages: dict[str, bytes] = field(default_factory=dict)
    version: int = -1


class LiveProxy:
    """Every upstream of this node (module docstring)."""

    def __init__(self, feed: LiveFeed, forwarder: Forwarder,
                 resolve: Callable[[str, str | None], str | None]) -> None:
        #: The local feed: its per-address count of connections is shared.
        self.feed = feed
        self.forwarder = forwarder
        #: The address of the node that holds a board's group; None when
        #: this node does (raises EngineError when nobody is known).
        self.resolve = resolve
        self.upstreams: dict[tuple[str, str | None], Upstream] = {}
        self._client: aiohttp.ClientSession | None = None
        self._sending: set[asyncio.Future] = set()
        # Counters read by /metrics (rankd.frontends.live_proxy_metrics).
        #: Upstream connections opened so far, and of them re-established
        #: (a lane that had been connected before: the holder moved or failed).
        self.connections = 0
        self.reconnections = 0
        #: Messages received from holders, and queued for local subscribers.
        self.received = 0
        self.relayed = 0

    # --- subscribers (what live_http calls, as it calls LiveFeed) ------------------------

    def subscribe(self, board: str, window: str | None, limit: int, members: list[str],
                  principal: Principal, address: str = "", *, secure: bool = False
                  ) -> Subscriber:
        """A local subscriber of ``board`` fed through an upstream (over TLS
        when ``secure``: the nodes serve what their clients are served)."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
            raise InvalidInput(f"limit must be between 1 and {MAX_LIMIT}")
        subscriber = Subscriber(board, window or "", limit, address=address)
        added_follows(subscriber, members)  # (checked before anything is registered)
        feed = self.feed  # one count of connections per address, local and proxied
        if feed.per_address[address] >= feed.max_per_address:
            raise TooManyConnections(f"at most {feed.max_per_address} live connections "
                                     "per client address")
        feed.per_address[address] += 1
        upstream = self.upstreams.get((board, window))
        if upstream is None:
            upstream = self.upstreams[board, window] = Upstream(board, window, principal,
                                                                address, secure)
            self._open_lane(upstream)
        upstream.subscribers.add(subscriber)
        self.follow(subscriber, members)
        if upstream.top is not None:
            self._send_top(upstream, subscriber)
        return subscriber

    def follow(self, subscriber: Subscriber, members: object) -> list[str]:
        """Follow more members (validated); returns those added."""
        added = added_follows(subscriber, members)
        upstream = self._upstream_of(subscriber)
        if upstream is None:
            return []
        new: dict[Lane, list[str]] = {}
        for member in added:
            subscriber.follows.add(member)
            if upstream.members.get(member, 0) == 0:
                lane = self._lane_with_room(upstream)
                lane.members.add(member)
                upstream.lane_of[member] = lane
                new.setdefault(lane, []).append(member)
            upstream.members[member] = upstream.members.get(member, 0) + 1
            message = upstream.member_messages.get(member)
            if message is not None:
                self._offer(subscriber, None, message, BURST_QUEUE)
        for lane, members_of_lane in new.items():
            self._send_up(lane, {"action": "follow", "members": members_of_lane})
        return added

    def unfollow(self, subscriber: Subscriber, members: object) -> None:
        members = _member_names(members)
        upstream = self._upstream_of(subscriber)
        if upstream is None:
            return
        gone: dict[Lane, list[str]] = {}
        for member in members:
            if member in subscriber.follows:
                subscriber.follows.discard(member)
                left = upstream.members.get(member, 0) - 1
                if left <= 0:
                    upstream.members.pop(member, None)
                    upstream.member_messages.pop(member, None)
                    lane = upstream.lane_of.pop(member)
                    lane.members.discard(member)
                    gone.setdefault(lane, []).append(member)
                else:
                    upstream.members[member] = left
        for lane, members_of_lane in gone.items():
            if lane.members or lane is upstream.lanes[0]:
                self._send_up(lane, {"action": "unfollow", "members": members_of_lane})
            else:  # a lane following nobody is closed (the first stays: the tops)
                self._retire(upstream, lane)
        if gone:
            self._merge(upstream)

    def unsubscribe(self, subscriber: Subscriber) -> None:
        upstream = self._upstream_of(subscriber)
        if upstream is None:
            return
        self.unfollow(subscriber, list(subscriber.follows))
        upstream.subscribers.discard(subscriber)
        self._uncount(subscriber)
        subscriber.dropped = subscriber.dropped or (1000, "unsubscribed")
        subscriber.wakeup.set()
        if not upstream.subscribers:
            del self.upstreams[upstream.board, upstream.window]
            for lane in list(upstream.lanes):
                self._retire(upstream, lane)

    def _uncount(self, subscriber: Subscriber) -> None:
        per_address = self.feed.per_address
        per_address[subscriber.address] -= 1
        if per_address[subscriber.address] <= 0:
            del per_address[subscriber.address]

    def serves(self, subscriber: Subscriber) -> bool:
        """Whether ``subscriber`` is one of the proxy's."""
        return self._upstream_of(subscriber) is not None

    async def close(self) -> None:
        for upstream in list(self.upstreams.values()):
            for lane in list(upstream.lanes):
                if lane.task is not None:
                    lane.task.cancel()
                    with contextlib.suppress(BaseException):
                        await lane.task
        self.upstreams.clear()
        if self._client is not None:
            await self._client.close()
            self._client = None

    # --- the lanes -----------------------------------------------------------------------

    def _upstream_of(self, subscriber: Subscriber) -> Upstream | None:
        """``subscriber``'s upstream; None once it ended (the subscriber was
        closed with 1012 and may still send a follow before it sees that)."""
        upstream = self.upstreams.get((subscriber.board, subscriber.window or None))
        return upstream if upstream is not None and subscriber in upstream.subscribers else None

    def _open_lane(self, upstream: Upstream) -> Lane:
        lane = Lane()
        upstream.lanes.append(lane)
        lane.task = asyncio.ensure_future(self._run(upstream, lane))
        return lane

    def _lane_with_room(self, upstream: Upstream) -> Lane:
        """The first lane that follows fewer than MAX_FOLLOWS members, or a new one."""
        for lane in upstream.lanes:
            if len(lane.members) < MAX_FOLLOWS:
                return lane
        return self._open_lane(upstream)

    def _merge(self, upstream: Upstream) -> None:
        """Close one lane more than the followed members need, if any: its
        members go to the others' room (a follow sent up on each), then it
        is retired.  One lane a call (at most MAX_FOLLOWS members moved), so
        an unfollow's step stays short; each later unfollow merges another."""
        needed = max(1, -(-len(upstream.members) // MAX_FOLLOWS))
        if len(upstream.lanes) <= needed:
            return
        # The smallest lane but the first (its tops are the ones used).
        source = min(upstream.lanes[1:], key=lambda lane: len(lane.members))
        moved: dict[Lane, list[str]] = {}
        members = sorted(source.members)
        for lane in upstream.lanes:
            if lane is source:
                continue
            room = MAX_FOLLOWS - len(lane.members)
            taken, members = members[:room], members[room:]
            for member in taken:
                lane.members.add(member)
                # (its messages from the source are ignored from now on; the
                # new lane's follow brings its current state)
                upstream.lane_of[member] = lane
            if taken:
                moved[lane] = taken
        # They fit: the lanes are more than the members need, so the others
        # have at least the source's count of room between them.
        source.members.clear()
        for lane, taken in moved.items():
            self._send_up(lane, {"action": "follow", "members": taken})
        self._retire(upstream, source)

    def _retire(self, upstream: Upstream, lane: Lane) -> None:
        lane.retired = True
        with contextlib.suppress(ValueError):
            upstream.lanes.remove(lane)
        if lane.task is not None and lane.task is not asyncio.current_task():
            lane.task.cancel()  # (not the lane ending its upstream: it is ending)

    def _send_up(self, lane: Lane, message: dict[str, Any]) -> None:
        socket = lane.socket
        if socket is not None and not socket.closed:
            task = asyncio.ensure_future(socket.send_str(orjson.dumps(message).decode()))
            self._sending.add(task)  # (the loop keeps only weak references)
            task.add_done_callback(self._sent)

    def _sent(self, task: asyncio.Future) -> None:
        self._sending.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.debug("a message to a live upstream was not sent: %s", task.exception())

    async def _run(self, upstream: Upstream, lane: Lane) -> None:
        """Keep ``lane`` connected to the board's holder while its upstream
        has subscribers and it is not retired; end the upstream (its
        subscribers closed with 1012) if this node holds the board now, the
        holder refused, or no holder is reachable for :data:`GIVE_UP_SECONDS`."""
        loop = asyncio.get_running_loop()
        trying_since = loop.time()
        why = "the board's group is not reachable from this node"
        try:
            while upstream.subscribers and not lane.retired:
                try:
                    holder = self.resolve(upstream.board, upstream.window)
                except EngineError as exc:
                    holder, why = "", exc.message
                if holder is None:
                    why = "the board's group moved to this node: reconnect"
                    break
                if holder:
                    try:
                        await self._stream(upstream, lane, holder)
                        trying_since = loop.time()
                    except aiohttp.WSServerHandshakeError as exc:
                        log.info("live upstream of %s to %s refused: %s %s", upstream.board,
                                 holder, exc.status, exc.message)
                        if exc.status in REFUSED:  # the holder says no: so does this node
                            why = f"refused by the node that holds the board: {exc.status}"
                            break
                        why = f"the node that holds the board ({holder}) answered {exc.status}"
                    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                        why = f"the node that holds the board ({holder}) cannot be reached"
                        log.info("live upstream of %s to %s ended: %s", upstream.board,
                                 holder, exc)
                if loop.time() - trying_since > GIVE_UP_SECONDS:
                    break
                await asyncio.sleep(RETRY_SECONDS)
        finally:
            lane.socket = None
            if not lane.retired:
                self._end(upstream, why)

    def _end(self, upstream: Upstream, why: str) -> None:
        """The upstream is over: its other lanes closed, its subscribers too (1012)."""
        # Only this upstream's entry: once its last subscriber left, a new
        # subscriber may have made another under the same key before this
        # task, cancelled, got here (dropping that one leaked it).
        key = (upstream.board, upstream.window)
        if self.upstreams.get(key) is upstream:
            del self.upstreams[key]
        for lane in list(upstream.lanes):
            self._retire(upstream, lane)
        for subscriber in list(upstream.subscribers):
            upstream.subscribers.discard(subscriber)
            self._uncount(subscriber)
            _drop(subscriber, CLOSE_MOVED, why[:120])

    async def _stream(self, upstream: Upstream, lane: Lane, holder: str) -> None:
        """One connection of ``lane``: subscribe, follow its members, then
        fan out what comes down until it ends."""
        if self._client is None:
            self._client = aiohttp.ClientSession()
        first = bool(upstream.lanes) and lane is upstream.lanes[0]
        # Only the first lane's tops are used: the others ask for the smallest.
        query = {"limit": str(MAX_LIMIT if first else 1)}
        if upstream.window:
            query["window"] = upstream.window
        # The members go in a message once connected, not in the query: a
        # hundred names of up to 256 bytes would not fit a request line.
        path_qs = f"/v1/boards/{quote(upstream.board, safe='')}/live?{urlencode(query)}"
        forwarder = self.forwarder
        headers = {FORWARDED: forwarder.node,
                   FORWARD_AUTH: forwarder.trust.forward_header(
                       signed_node(forwarder.node, 1, holder), "GET", path_qs, b"",
                       upstream.principal,
                       upstream.address)}
        scheme = "https" if upstream.secure else "http"
        async with self._client.ws_connect(URL(f"{scheme}://{holder}{path_qs}", encoded=True),
                                           headers=headers, heartbeat=UPSTREAM_HEARTBEAT,
                                           max_msg_size=1 << 20) as socket:
            self.connections += 1
            lane.connected += 1
            if lane.connected > 1:
                self.reconnections += 1
            lane.socket = socket
            if first:
                upstream.sent.clear()  # the new upstream's first top goes to everyone
            if lane.members:  # (followed meanwhile included; never more than MAX_FOLLOWS)
                self._send_up(lane, {"action": "follow", "members": list(lane.members)})
            async for message in socket:
                if message.type != aiohttp.WSMsgType.TEXT:
                    break
                self._came_down(upstream, lane, message.data.encode())
            lane.socket = None
            if socket.close_code not in (None, 1000, CLOSE_MOVED, 1006):
                log.info("live upstream of %s closed by %s: %s %s", upstream.board, holder,
                         socket.close_code, message.extra if message else "")

    def _came_down(self, upstream: Upstream, lane: Lane, data: bytes) -> None:
        self.received += 1
        message = orjson.loads(data)
        kind = message.get("type")
        if kind == "leaderboard.updated":
            if not upstream.lanes or lane is not upstream.lanes[0]:
                return  # the other lanes' tops (of one) are not used
            version = message.get("version", 0)
            if version < upstream.version:
                return  # older than what subscribers have: never back
            upstream.version = version
            upstream.top = message
            self._send_top(upstream)
        elif kind == "user.rank.updated":
            member = message.get("member")
            if upstream.lane_of.get(member) is not lane:
                return  # no longer followed (or followed again on another lane)
            upstream.member_messages[member] = data
            # (a lane re-established sends each of its members' states at once)
            for subscriber in list(upstream.subscribers):
                if member in subscriber.follows:
                    self._offer(subscriber, None, data, BURST_QUEUE)

    def _send_top(self, upstream: Upstream, subscriber: Subscriber | None = None) -> None:
        """The last top, cut to each limit, to the subscribers of that limit
        whose cut changed; with ``subscriber``: to it alone (it just came)."""
        top = upstream.top
        assert top is not None
        if subscriber is not None:
            cut = top.get("top", [])[:subscriber.limit]
            self._offer(subscriber, "top", orjson.dumps({**top, "top": cut}))
            return
        for limit in {other.limit for other in upstream.subscribers}:
            cut = top.get("top", [])[:limit]
            if upstream.sent.get(limit) == (top.get("period"), cut):
                continue  # as the local feed: only a changed top-N is pushed
            upstream.sent[limit] = (top.get("period"), cut)
            message = orjson.dumps({**top, "top": cut})  # the same bytes to each
            for other in list(upstream.subscribers):
                if other.limit == limit:
                    self._offer(other, "top", message)

    def _offer(self, subscriber: Subscriber, key: str | None, message: bytes,
               bound: int = MAX_QUEUE) -> None:
        if subscriber.offer(key, message, bound):
            self.relayed += 1
        else:
            _drop(subscriber, CLOSE_TOO_SLOW, "subscriber too slow")

    def buffered(self) -> int:
        """Bytes waiting for the proxied subscribers: queued, and in their
        sockets' write buffers."""
        total = 0
        for upstream in self.upstreams.values():
            for subscriber in upstream.subscribers:
                total += sum(len(message) for _, message in subscriber.queue)
                transport = subscriber.transport
                if transport is not None and not transport.is_closing():
                    total += transport.get_write_buffer_size()
        return total


def _drop(subscriber: Subscriber, code: int, reason: str) -> None:
    subscriber.dropped = (code, reason)
    subscriber.queue.clear()
    subscriber.wakeup.set()


def holder_of(engine: Any) -> Callable[[str, str | None], str | None]:
    """A :attr:`LiveProxy.resolve` reading ``engine``: None when this node
    serves the board, the holder's address when another node does."""
    def resolve(board: str, window: str | None) -> str | None:
        try:
            engine.read_version(board, window, None)
        except NotPrimary as exc:
            if exc.primary is None:
                raise
            return exc.primary
        return None
    return resolve
