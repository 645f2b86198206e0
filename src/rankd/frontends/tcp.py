"""The msgpack TCP front-end (``protocol/PROTOCOL.md``).

One :class:`TcpConnection` (an ``asyncio.Protocol``) per client.  Bytes are
split into frames by :class:`RequestDecoder`; the decoded requests queue up
and one worker task per connection (not per request) drains the queue in
order.  Consecutive ``submit`` requests in the queue go to the engine as
one batch (one WAL append and one commit), which is what makes pipelining
pay off.  Reads are answered synchronously.

The fast path: when the native modules are built, each run of *plain*
submit requests in a read (``rankd.frontends._submits`` says exactly which)
is not decoded into Python objects at all.  It is applied packed by the
engine's native ingest and answered by a native encoder.  A run that finds
its connection idle (nothing queued, no worker busy) is handed to the
engine right in ``data_received`` (``Engine.submit_packed_then``), and
its answers are written by the pass that commits it: no task and no
queue, and the runs of every connection read in one pass of the event loop
are applied as one batch with one commit.  A run behind other requests
waits its turn in the queue.  Anything the fast path does not take (a
signed board, a rate limit reached, on a cluster node a run whose boards
are not all of one group this node writes) is handed back to the general
path, request by request, so both answer alike (``moved`` included).

A connection that sends too much without reading its answers is paused
(``pause_reading``) until its queue drains, by count and by bytes
(:data:`QUEUE_HIGH_FRAMES`), and writing waits while the transport's
buffer is full, so a slow or hostile client cannot make the server buffer
without bound.  What one frame may decode into is bounded too
(:data:`HANDSHAKE_LIMITS`, :data:`REQUEST_LIMITS`: a 16 KiB frame of empty
maps once decoded into a megabyte of objects).  Until a connection has
said hello and authenticated it may send frames of at most
:data:`HANDSHAKE_MAX_FRAME` bytes (a half-sent 1 MiB frame once held a
megabyte per connection), decoded one at a time, and at most
:data:`HANDSHAKE_MAX_REQUESTS` requests of which
:data:`MAX_AUTH_FAILURES` refused, within :data:`HANDSHAKE_SECONDS`.  A
session ends when its credential expires (checked on use, and by the
sweeper).  Connections over the caps of
:class:`rankd.frontends.connections.ConnectionLimits`, or silent for the
idle timeout, are closed.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from rankd import __version__, wire
from rankd._native import native_or
from rankd.engine.errors import EngineError, InvalidInput, Unsettled
from rankd.engine.ingest import IMPLEMENTATION as ingest_implementation
from rankd.frontends import gone_work
from rankd.frontends.connections import (
    BATCH_SECONDS,
    HANDSHAKE_SECONDS,
    ConnectionLimits,
    PipelinedConnection,
    PipelinedServer,
)
from rankd.frontends.service import MAX_BATCH, Service, check_fields, integer
from rankd.frontends.tcp_any_order import AnyOrder
from rankd.security import ANONYMOUS_ALL, OPERATION_SCOPES, Gate, Principal, Unauthorized
from rankd.security.auth import MAX_CREDENTIAL_CHARS
from rankd.watchdog import ACTIVITY

log = logging.getLogger(__name__)

# --- what a connection may hold (docs/protocol.md, "Limits") ----------------------
#: Requests queued (decoded, not answered yet) at which reading pauses, and
#: at which it resumes.
QUEUE_HIGH_WATER = 4096
QUEUE_LOW_WATER = 512
#: The same in bytes, as frames of the connection's largest (``max_frame``:
#: 16 KiB before authentication, 1 MiB after), counting the queued
#: requests' frames and what the decoder holds undecoded: reading pauses
#: above two (one frame waiting, one being read) and resumes at one (what a
#: half-read frame holds, so that alone never keeps reading paused).  A
#: frame decodes into at most about 70 times its size under
#: :data:`REQUEST_LIMITS` (a frame of empty maps; names and numbers about 3
#: times), under :data:`HANDSHAKE_LIMITS` into a few KiB.
QUEUE_HIGH_FRAMES = 2
#: Runs handed to the engine and not answered yet at which a connection
#: stops handing over more until they all are (a client that pipelines
#: faster than its groups commit): a read that finds this many queues its
#: run, and the queue's own bounds pause reading.
MAX_RUNS_IN_FLIGHT = 1024
#: Refused requests before authentication (a malformed request, a repeated
#: hello, one that needs a credential, a failed auth, a health with bad
#: arguments) at which the connection is closed, as on RESP.
MAX_AUTH_FAILURES = 3
#: Requests before authentication, refused or not (hello, health, auth): the
#: one that reaches this count and leaves the connection unauthenticated
#: closes it, so a client cannot stay sending health; each is charged to the
#: address's read rate limit too.
HANDSHAKE_MAX_REQUESTS = 8
#: Until hello and auth succeeded: the largest frame (a JWT of 8 KiB fits).
HANDSHAKE_MAX_FRAME = 16 * 1024
# What a frame may decode into (msgpack's own limits; docs/protocol.md).  A
# frame beyond them closes the connection (``too_large``, id 0), so each is
# set where no legitimate request goes, with room for one a little beyond
# what its operation allows: that one gets the operation's own answer
# (``invalid``, ``too_large``, ``unauthorized``) and the connection stays.
#: Until hello and auth succeeded.  Strings: one object of their own size,
#: bounded by the frame alone (an over-long credential is refused by auth,
#: saying so); binary and extension types: never used by the protocol;
#: arrays, maps and both in all: 16, enough for any one operation's request
#: with a few items (``put_board``: request, arguments, config, windows), so
#: that one sent before auth is answered ``unauthorized`` and counted.  A
#: 16 KiB frame of empty maps, a megabyte of objects decoded whole, stops
#: at the 17th map: no handshake frame decodes into more than about 20 times
#: its size (short strings held by arrays nested 1,024 deep, msgpack's limit).
HANDSHAKE_LIMITS = wire.DecodeLimits(
    max_str_len=HANDSHAKE_MAX_FRAME, max_bin_len=0, max_ext_len=0,
    max_array_len=16, max_map_len=16, max_containers=16)
#: Once authenticated.  Strings and binary: 8 times a credential, the
#: longest string a request holds (members are at most 256 bytes, names 64;
#: binary is never used, but decodes like a string); extension types: never
#: used (a small one decodes into 30 times its size); arrays: twice the
#: longest list an operation takes (``submit_many``'s events); maps: a board
#: config (9 fields) or a submit's arguments (at most 10), with room.  Arrays
#: and maps are not counted (a call for each on every request): the queue's
#: bytes (:data:`QUEUE_HIGH_FRAMES`) bound what they hold.
REQUEST_LIMITS = wire.DecodeLimits(
    max_str_len=8 * MAX_CREDENTIAL_CHARS, max_bin_len=8 * MAX_CREDENTIAL_CHARS,
    max_ext_len=0, max_array_len=2 * MAX_BATCH, max_map_len=32)
SUBMIT_FIELDS = {"member", "score", "delta", "event_id", "ts", "label"}
VIEW_FIELDS = {"window", "period"}
#: The largest log position (a signed 64-bit integer in Postgres).
MAX_SEQ = 2**63 - 1
#: Reads that take ``min_seq`` (read-your-writes on a cluster).
CONSISTENT_READS = frozenset({"get_board", "top", "member", "around", "ranks"})

Handler = Callable[[Service, dict[str, Any]], Any]

_split, _FAST = native_or("rankd.frontends._submits", "split", None)
_encode_answers, _ = native_or("rankd.frontends._submits", "encode_answers", None)
_Packed, _ = native_or("rankd.engine._packed", "Packed", None)
#: Whether plain submit requests take the native fast path (see the module docstring).
FAST_SUBMITS = _FAST == "native" and ingest_implementation == "native"


class RequestDecoder(wire.FrameDecoder):
    """The server's frame decoder: while ``pack`` is set (and the fast path
    is built), each run of plain submit requests comes out as one packed
    batch instead of decoded requests.  It starts as the handshake's (small
    frames, :data:`HANDSHAKE_LIMITS`, one request at a time, so that the
    requests after auth are decoded as an authenticated client's) until
    :meth:`open`."""

    def __init__(self) -> None:
        super().__init__(HANDSHAKE_MAX_FRAME, HANDSHAKE_LIMITS)
        self.max_messages = 1
        self.pack = False
        #: The frame size of each request the last ``feed`` decoded, in
        #: order (packed runs and errors not included).
        self.sizes: list[int] = []

    def open(self, max_frame: int) -> None:
        """The connection is authenticated: frames of ``max_frame`` bytes,
        :data:`REQUEST_LIMITS`, all that are complete at once, packed."""
        self.pack = True
        self.max_frame = max_frame
        self.limits = REQUEST_LIMITS
        self.max_messages = 0

    def requests_of(self, packed: Any) -> tuple[list[Any], list[int]]:
        """A packed run's requests decoded, with their frame sizes, for the
        general path (when the fast path does not take the run)."""
        sources = packed.sources()
        return [self._decode(source, []) for source in sources], [len(s) for s in sources]

    def feed(self, data: bytes) -> list[Any]:
        self.sizes.clear()
        if self.pack and FAST_SUBMITS and not self._buffer:
            # The common case, whole plain submits in one read: one native
            # split, nothing else.  Anything else is split again below (the
            # split changes nothing).
            items, position, bad_length = _split(data, self.max_frame, True)
            if (position == len(data) and bad_length < 0
                    and not any(type(item) is tuple for item in items)):
                return items
        return super().feed(data)

    def _frames(self, view: memoryview, messages: list[Any]) -> int:
        if not (self.pack and FAST_SUBMITS):
            return super()._frames(view, messages)
        items, position, bad_length = _split(view, self.max_frame, True)
        sizes = self.sizes
        for item in items:
            if type(item) is tuple:
                start, end = item
                messages.append(self._decode(view[start:end], messages))
                sizes.append(end - start + 4)
            else:
                messages.append(item)
        if bad_length >= 0:
            raise self._bad_length(bad_length, messages)
        return position


def _view(args: dict[str, Any]) -> dict[str, Any]:
    return {name: args[name] for name in VIEW_FIELDS if name in args}


def _event(args: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """``(board, submission fields)`` of a submit request or batch event."""
    if not isinstance(args, dict):
        raise InvalidInput("an event must be a map")
    board = args.get("board")
    if not isinstance(board, str):
        raise InvalidInput("an event needs a board (a string)")
    return board, {key: value for key, value in args.items() if key != "board"}


async def _put_board(service: Service, args: dict[str, Any], patch: bool = False
                     ) -> dict[str, Any]:
    info, created = await service.put_board(args["board"], args["config"],
                                            discard=args.get("discard", False), patch=patch)
    return {"created": created, "board": info}


async def _delete_board(service: Service, args: dict[str, Any]) -> dict[str, Any]:
    await service.delete_board(args["board"])
    return {}


async def _remove_member(service: Service, args: dict[str, Any]) -> dict[str, Any]:
    await service.remove_member(args["board"], args["member"])
    return {}


def error_body(exc: EngineError) -> dict[str, Any]:
    """An error as this protocol answers it: a write for a group another
    cluster node writes is ``moved``, with that node's TCP ``address``, the
    ``group``, the ``node`` and the topology ``epoch``."""
    address = getattr(exc, "primary_tcp", None)
    if address:
        return {"code": "moved", "message": exc.message, "address": address,
                "group": exc.group, "node": exc.node, "epoch": exc.epoch}
    return exc.to_dict()


def _error_frame(request_id: int, exc: EngineError) -> bytes:
    body = error_body(exc)
    if len(body) == 2:
        return wire.error(request_id, body["code"], body["message"])
    return wire.error_with(request_id, body)


async def _submit_many(service: Service, args: dict[str, Any]) -> dict[str, Any]:
    events = args["events"]
    if not isinstance(events, list):
        raise InvalidInput("events must be a list")
    items: list[tuple[str, Any]] = []
    errors: dict[int, dict[str, Any]] = {}
    for position, event in enumerate(events):
        try:
            items.append(_event(event))
        except EngineError as exc:
            errors[position] = {"error": exc.to_dict()}
    answers = iter(await service.submit_many(items, describe=error_body))
    return {"results": [errors[i] if i in errors else next(answers)
                        for i in range(len(events))]}


#: op -> (required args, optional args, handler)
OPERATIONS: dict[str, tuple[set[str], set[str], Handler]] = {
    "health": (set(), set(), lambda s, a: s.health()),
    "list_boards": (set(), {"limit", "after"}, lambda s, a: s.list_boards(**a)),
    "get_board": ({"board"}, set(), lambda s, a: s.get_board(a["board"])),
    "put_board": ({"board", "config"}, {"discard"}, _put_board),
    "patch_board": ({"board", "config"}, {"discard"},
                    lambda s, a: _put_board(s, a, patch=True)),
    "delete_board": ({"board"}, set(), _delete_board),
    "submit_many": ({"events"}, set(), _submit_many),
    "top": ({"board"}, {"limit", "offset", *VIEW_FIELDS},
            lambda s, a: s.top(a["board"], limit=a.get("limit", 10),
                               offset=a.get("offset", 0), **_view(a))),
    "member": ({"board", "member"}, VIEW_FIELDS,
               lambda s, a: s.member(a["board"], a["member"], **_view(a))),
    "around": ({"board", "member"}, {"above", "below", *VIEW_FIELDS},
               lambda s, a: s.around(a["board"], a["member"], above=a.get("above", 4),
                                     below=a.get("below", 4), **_view(a))),
    "ranks": ({"board", "members"}, VIEW_FIELDS,
              lambda s, a: s.ranks(a["board"], a["members"], **_view(a))),
    "remove_member": ({"board", "member"}, set(), _remove_member),
    "periods": ({"board"}, {"window"}, lambda s, a: s.periods(a["board"], **_view(a))),
}


class _GeneralLane:
    """``_lanes.TcpLane`` where it is not built: every read goes the
    general way."""

    def data_received(self, data: bytes) -> None:
        self._data_received(data)  # type: ignore[attr-defined]

    def _encoded(self, packed: Any) -> bytes:
        """The response frames of an applied packed run (and its statistics)."""
        frames, answered = _encode_answers(packed, wire.ok, wire.error)
        self._count(packed, answered)  # type: ignore[attr-defined]
        return frames


#: The first base of TcpConnection: its hot path, natively when built.
_Lane, _ = native_or("rankd.frontends._lanes", "TcpLane", _GeneralLane)


class TcpConnection(_Lane, AnyOrder, PipelinedConnection):  # type: ignore[valid-type, misc]
    """One client connection."""

    def __init__(self, server: TcpServer) -> None:
        super().__init__(server)
        self.service = server.service
        self.gate = server.gate
        #: Who is calling: set by ``auth`` (or everyone, without credentials configured).
        self.principal: Principal | None = None if self.gate.auth_enabled else ANONYMOUS_ALL
        self.auth_failures = 0
        #: Requests before authentication (:data:`HANDSHAKE_MAX_REQUESTS`).
        self.handshake_requests = 0
        self.decoder = RequestDecoder()
        self.queue: collections.deque[Any] = collections.deque()
        #: The frame bytes of each message in ``queue``, in step with it.
        self.sizes: collections.deque[int] = collections.deque()
        #: Requests in ``queue`` (a packed run holds many), and their bytes.
        self.queued = 0
        self.queued_bytes = 0
        self.greeted = False
        #: ``MAX_RUNS_IN_FLIGHT``, read by the native lane.
        self.max_runs = MAX_RUNS_IN_FLIGHT
        #: The client asked for its submits' answers in any order (hello's
        #: ``out_of_order``: :mod:`rankd.frontends.tcp_any_order`).
        self.out_of_order = False

    # --- asyncio.Protocol ---------------------------------------------------------

    def _refuse(self, reason: str) -> None:
        self._close_with([], 0, "too_many_connections", reason)

    def _forget(self) -> None:
        self.queue.clear()
        self.sizes.clear()
        self.queued = self.queued_bytes = 0

    def _data_received(self, data: bytes) -> None:
        """``data_received`` the general way (the lane's, for what it does not take)."""
        if self.closing:
            return
        self.last_active = now = self.loop.time()
        if self.deadline and now > self.deadline:
            self.session_expired()
            return
        self._decode(data)
        self._settle()

    def _decode(self, data: bytes) -> None:
        """Feed ``data`` to the decoder (it may be empty: one more of the
        handshake's requests) and queue what comes out, or hand it over."""
        decoder = self.decoder
        # Packed only once requests will be taken: the handshake goes the
        # general way, one request at a time, and is held to small frames.
        if not decoder.pack and self.authenticated:
            decoder.open(self.server.max_frame)
        try:
            messages = decoder.feed(data)
        except wire.FrameError as exc:
            # What came before the bad frame is answered, then the error, then close.
            messages = [*exc.decoded, exc]
        sizes = iter(decoder.sizes)
        for message in messages:
            if type(message) is _Packed:
                # A packed run that finds the connection idle is applied right
                # away (see the module docstring); anything else waits its turn.
                if (not self.queue and self.worker is None and self.writable
                        and len(self.answering) < MAX_RUNS_IN_FLIGHT
                        and self._takes(message)):
                    self._hand_over(message)
                else:
                    self._enqueue(message)
            else:
                self._enqueue(message, next(sizes, 0))  # (an error: none)

    def _settle(self) -> None:
        """Once requests are queued: close an expired session, pause a client
        that sent too many (or too many bytes), and start the worker that
        answers them."""
        if self.deadline and self.expired:  # (the lane's runs come here)
            self.session_expired()
            return
        if not self.reading_paused and (
                self.queued >= QUEUE_HIGH_WATER
                or self.queued_bytes + self.decoder.pending_bytes
                > QUEUE_HIGH_FRAMES * self.decoder.max_frame):
            self.transport.pause_reading()
            self.reading_paused = True
        if self.worker is None and self.queue:
            self.worker = self.loop.create_task(self._drain())

    def _resume(self) -> None:
        """Resume reading once the queue is down to its low marks."""
        if (self.queued <= QUEUE_LOW_WATER and self.queued_bytes + self.decoder.pending_bytes
                <= self.decoder.max_frame + 4):
            self.reading_paused = False
            self.transport.resume_reading()

    # --- processing ------------------------------------------------------------------

    def _enqueue(self, message: Any, size: int = 0) -> None:
        """Queue ``message`` (a packed run's size is its own)."""
        self.queue.append(message)
        if type(message) is _Packed:
            self.queued += len(message)
            size = len(message.data)
        else:
            self.queued += 1
        self.sizes.append(size)
        self.queued_bytes += size

    def _dequeue(self) -> Any:
        message = self.queue.popleft()
        self.queued -= len(message) if type(message) is _Packed else 1
        self.queued_bytes -= self.sizes.popleft()
        return message

    async def _drain(self) -> None:
        try:
            # A fast reader (or a gone one) never clears ``can_write``: the
            # worker gives way to the loop after ``BATCH_SECONDS`` of work.
            until = time.perf_counter() + BATCH_SECONDS
            while not self.closing:
                if not self.queue:
                    if not self.decoder.max_messages:
                        break
                    self._decode(b"")  # the handshake's next request, if any
                    if not self.queue:
                        break
                if not (self.out_of_order and type(self.queue[0]) is _Packed
                        and len(self.answering) < MAX_RUNS_IN_FLIGHT):
                    await self.answered()  # runs applied earlier are answered first
                out: list[bytes] = []
                head = self.queue[0]
                if self.gone and gone_work.tcp_read_only(head, OPERATIONS):
                    self._dequeue()  # nobody reads its answer: no effect to keep
                    continue
                if type(head) is _Packed:
                    await self._submit_packed(self._dequeue(), out)
                elif isinstance(head, wire.FrameError):
                    self._dequeue()
                    self._close_with(out, 0, head.code, head.message)
                elif self._is_submit(head):
                    await self._submit_group(out)
                else:
                    self._dequeue()
                    await self._one(head, out)
                if out and not self.closing:
                    self.transport.writelines(out)
                if self.reading_paused:
                    self._resume()
                await self.can_write.wait()
                if time.perf_counter() >= until:
                    await asyncio.sleep(0)
                    until = time.perf_counter() + BATCH_SECONDS
        except Exception:  # never let one connection's bug go unnoticed or kill others
            log.exception("TCP connection failed; closing it")
            self.transport.abort()
        finally:
            self.worker = None
            self._finish()  # (after the client's EOF: once all it sent is answered)

    def _is_submit(self, message: Any) -> bool:
        return (self.greeted and self.principal is not None and isinstance(message, list)
                and len(message) == 3 and message[1] == "submit")

    async def _one(self, message: Any, out: list[bytes]) -> None:
        handshake = not self.authenticated
        if handshake:
            self.handshake_requests += 1
        try:
            request_id, op, args = wire.parse_request(message)
        except wire.RequestShapeError as exc:
            self._refused(out, exc.request_id, "bad_request", exc.message)
        else:
            if not self.greeted:
                self._hello(request_id, op, args, out)
            elif op == "hello":
                self._refused(out, request_id, "bad_request", "hello was already done")
            elif op == "auth":
                self._auth(request_id, args, out)
            elif self.principal is None and op != "health":
                self._refused(out, request_id, "unauthorized",
                              "authenticate first: send an auth request with a token")
            elif not await self._operation(request_id, op, args, out) and handshake:
                self._failed(out)
        if (handshake and not self.closing and not self.authenticated
                and self.handshake_requests >= HANDSHAKE_MAX_REQUESTS):
            self._close_with(out, 0, "unauthorized", f"at most {HANDSHAKE_MAX_REQUESTS} "
                             "requests before authentication")

    def _refused(self, out: list[bytes], request_id: int, code: str, message: str) -> None:
        """Answer a refused request (charged all the same): before
        authentication, a failure."""
        try:
            self._charge_read()
        except EngineError as exc:
            code, message = exc.code, exc.message
        out.append(wire.error(request_id, code, message))
        if not self.authenticated:
            self._failed(out)

    def _charge_read(self) -> None:
        """Charge a request ``Gate.admit`` does not (open to all, or
        refused before it) as a read: to the address before
        authentication, to the address and credential after."""
        if self.principal is None:
            self.gate.limiter.check_address("read", self.address)
        else:
            self.gate.limiter.check("read", self.address, self.principal.name)

    def _failed(self, out: list[bytes]) -> None:
        """Count a failure before authentication (or of auth): the
        :data:`MAX_AUTH_FAILURES`-th closes the connection."""
        self.auth_failures += 1
        if self.auth_failures >= MAX_AUTH_FAILURES:
            self._close_with(out, 0, "unauthorized", "too many unauthenticated requests or "
                                                     "failed authentications")

    async def _operation(self, request_id: int, op: str, args: dict[str, Any],
                         out: list[bytes]) -> bool:
        """Answer an operation of :data:`OPERATIONS`; whether it succeeded."""
        operation = OPERATIONS.get(op)
        if operation is None:
            self._refused(out, request_id, "unknown_op", f"unknown operation {op!r}")
            return False
        required, optional, handler = operation
        ACTIVITY.frontend = "tcp"  # who holds the loop, for the loop watchdog
        ACTIVITY.command = op
        try:
            principal = self._admit(op, args)
            if op in CONSISTENT_READS:
                optional = optional | {"min_seq"}
            check_fields(args, required, optional, f"{op} arguments")
            if "min_seq" in args:
                args = dict(args)
                min_seq = integer(args.pop("min_seq"), "min_seq", 0, MAX_SEQ)
                await self.service.caught_up(args["board"], min_seq)
            try:
                result = handler(self.service, args)
            except Unsettled:  # a read of writes not committed yet: once they are
                result = await self.service.engine.settled_read(
                    lambda: handler(self.service, args))
            if isinstance(result, Awaitable):
                result = await result
        except EngineError as exc:
            self.server.stats[(op, exc.code)] += 1
            out.append(_error_frame(request_id, exc))
            return False
        except Exception:  # a bug: answer it, log it, keep the connection
            log.exception("TCP %s request failed", op)
            self.server.stats[(op, "internal")] += 1
            out.append(wire.error(request_id, "internal", "rankd failed to answer this "
                                                          "request (logged)"))
            return False
        self.gate.done(principal, op, self.address, board=args.get("board"))
        self.server.stats[(op, "ok")] += 1
        out.append(wire.ok(request_id, result))
        return True

    def _admit(self, op: str, args: dict[str, Any]) -> Principal:
        """The caller, if it may run ``op`` now (scope and rate limits).  An
        operation open to all (health) is charged as a read all the same
        (``Gate.admit`` charges only the others): every request costs."""
        principal = self.principal
        if OPERATION_SCOPES.get(op, "admin") is None:
            self._charge_read()
            return principal or ANONYMOUS_ALL
        assert principal is not None  # (the handshake lets only open operations by)
        events = args.get("events") if op == "submit_many" else None
        cost = len(events) if isinstance(events, list) and events else 1
        self.gate.admit(principal, op, self.address, cost)
        return principal

    def _auth(self, request_id: int, args: dict[str, Any], out: list[bytes]) -> None:
        token = args.get("token")
        try:
            check_fields(args, {"token"}, set(), "auth arguments")
            if not isinstance(token, str):
                raise Unauthorized("token must be a string")
            self.principal = self.gate.identify(token, "auth", self.address)
        except EngineError as exc:
            out.append(wire.error(request_id, exc.code, exc.message))
            self._failed(out)
            return
        self.expires_with(self.principal)  # the session ends with the credential
        out.append(wire.ok(request_id, {"principal": self.principal.name,
                                        "scopes": sorted(self.principal.scopes)}))

    def _hello(self, request_id: int, op: str, args: dict[str, Any], out: list[bytes]) -> None:
        if op != "hello":
            self._close_with(out, request_id, "hello_required",
                             "the first request on a connection must be hello")
            return
        try:
            self._charge_read()
        except EngineError as exc:
            self._close_with(out, request_id, exc.code, exc.message)
            return
        version = args.get("version")
        if version != wire.VERSION:
            self._close_with(out, request_id, "unsupported_version",
                             f"this server speaks protocol version {wire.VERSION}, "
                             f"not {version!r}")
            return
        try:
            check_fields(args, {"version"}, {"client", "out_of_order"}, "hello arguments")
            out_of_order = args.get("out_of_order", False)
            if type(out_of_order) is not bool:
                raise InvalidInput("out_of_order must be true or false")
        except EngineError as exc:
            self._close_with(out, request_id, exc.code, exc.message)
            return
        self.greeted = True
        answer = {"version": wire.VERSION, "server": f"rankd {__version__}",
                  "max_frame": self.server.max_frame}
        # Granted where it changes something: a single node commits every
        # run of a pass at once, and its in-order lane is native.
        if out_of_order and self.service.engine.replication is not None:
            self._answer_in_any_order()
            answer["out_of_order"] = True
        out.append(wire.ok(request_id, answer))

    async def _submit_group(self, out: list[bytes]) -> None:
        """Consecutive submit requests at the head of the queue, as one batch."""
        group: list[tuple[int, tuple[str, Any] | EngineError]] = []
        while self.queue and len(group) < MAX_BATCH and self._is_submit(self.queue[0]):
            message = self._dequeue()
            request_id = message[0]
            try:
                request_id, _, args = wire.parse_request(message)
                self._admit("submit", args)
                group.append((request_id, _event(args)))
            except wire.RequestShapeError as exc:
                group.append((exc.request_id, InvalidInput(exc.message)))
            except EngineError as exc:
                group.append((request_id, exc))
        items = [item for _, item in group if not isinstance(item, EngineError)]
        try:
            answers = iter(await self.service.submit_many(items, describe=error_body))
        except EngineError as exc:  # e.g. read-only: every submit gets the error
            answers = iter([{"error": error_body(exc)}] * len(items))
        ok = 0
        stats = self.server.stats
        for request_id, item in group:
            if isinstance(item, EngineError):
                stats[("submit", item.code)] += 1
                out.append(wire.error(request_id, item.code, item.message))
                continue
            answer = next(answers)
            if "error" in answer:
                stats[("submit", answer["error"]["code"])] += 1
                out.append(wire.error_with(request_id, answer["error"]))
            else:
                ok += 1
                out.append(wire.ok(request_id, answer))
        stats[("submit", "ok")] += ok

    def _takes(self, packed: Any) -> bool:
        """Whether the fast path takes a packed run: if not (a signed board,
        a rate limit reached), its requests go to the general path."""
        if self.principal is None or not self.service.takes_packed(packed):
            return False
        charge = self._charger("submit")
        if charge is not None:
            try:
                # The run is admitted as a whole, like a submit_many; if it is
                # refused, each of its submits is admitted (or refused) alone.
                charge(len(packed))
            except EngineError:
                return False
        return True

    async def _submit_packed(self, packed: Any, out: list[bytes]) -> None:
        """A queued packed run of plain submits (see the module docstring)."""
        if not self._takes(packed):
            cut = self._hand_over_by_group(
                packed, self.decoder.max_frame, _split, self._charger("submit"),
                MAX_RUNS_IN_FLIGHT - len(self.answering),
            ) if self.out_of_order else None  # (granted on a cluster node only: hello)
            rest, later = ([packed], []) if cut is None else cut
            for run in reversed(rest):
                requests, sizes = self.decoder.requests_of(run)
                self.queue.extendleft(reversed(requests))
                self.sizes.extendleft(reversed(sizes))
                self.queued += len(requests)
                self.queued_bytes += sum(sizes)
            for run in reversed(later):  # handed over once runs in flight leave room
                self.queue.appendleft(run)
                self.sizes.appendleft(len(run.data))
                self.queued += len(run)
                self.queued_bytes += len(run.data)
            return
        if self.out_of_order:  # answered once committed, whatever comes after it
            self._hand_over(packed)
            return
        try:
            await self.service.submit_packed(packed)
        except EngineError as exc:  # e.g. read-only: every submit gets the error
            packed.answers = [exc] * len(packed)
        out.append(self._encoded(packed))

    def _count(self, packed: Any, answered: int) -> None:
        """Count an applied packed run's answers in the statistics:
        ``answered`` of them were encoded natively, the rest are Python
        objects (answers or errors)."""
        stats = self.server.stats
        ok = answered
        if answered < len(packed):
            for answer in packed.answers:
                if answer is None:
                    continue
                if type(answer) is dict:
                    ok += 1
                else:
                    stats[("submit", answer.code)] += 1
        stats[("submit", "ok")] += ok

    @property
    def busy(self) -> bool:
        return bool(self.queue or self.worker is not None or self.answering)

    @property
    def authenticated(self) -> bool:
        return self.greeted and self.principal is not None

    def handshake_expired(self) -> None:
        self._close_with([], 0, "handshake_timeout", f"hello and auth must come within "
                         f"{HANDSHAKE_SECONDS:g} s of connecting")

    def idle_expired(self) -> None:
        self._close_with([], 0, "idle_timeout",
                         f"no request for {self.server.idle_timeout:g} s")

    def session_expired(self) -> None:
        self._close_with([], 0, "unauthorized", "the credential this connection authenticated "
                         "with has expired; reconnect with a fresh one")

    def _close_with(self, out: list[bytes], request_id: int, code: str, message: str) -> None:
        out.append(wire.error(request_id, code, message))
        self.transport.writelines(out)
        out.clear()
        self.closing = True
        self._forget()
        self.transport.close()


class TcpServer(PipelinedServer):
    """Listens for protocol connections; :meth:`close` drains them gracefully."""

    name = "rankd-tcp"

    def __init__(self, service: Service, gate: Gate | None = None, *,
                 max_frame: int = wire.MAX_FRAME, limits: ConnectionLimits | None = None,
                 idle_timeout: float = 300.0) -> None:
        super().__init__(limits=limits, idle_timeout=idle_timeout)
        self.service = service
        self.gate = gate or Gate.open()
        self.max_frame = max_frame

    def _connection(self) -> TcpConnection:
        return TcpConnection(self)
