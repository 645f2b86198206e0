"""The REST hot route: the common submission and reads answered before
aiohttp's router and middlewares.

What it owns: deciding, from the raw request line and headers alone,
whether a request is a plain ``POST /v1/boards/{board}/scores`` that it
answers exactly as the general way would (by the front door's ways,
:class:`HotWays`), or a plain ``GET /v1/boards/{board}/top`` (at most
``limit`` and ``offset``, in at most ``MAX_DIGITS`` digits) or ``GET
/v1/boards/{board}/members/{member}`` (no query) that ``rest._top_now`` and
``rest._member_now`` answer so, and answering it there; and writing those
answers (:class:`Answer`).  Its design:

* It replaces the application's request handler (``Application._handle``,
  what aiohttp's ``Server`` calls for every request) with one that looks at
  the request first.  A request it does not take goes on to the original
  handler unchanged: the router, the middlewares, the response-prepare
  signal.  What it saves on the ones it takes is what aiohttp and the
  middlewares cost a request: resolving the route among all of them, the
  match info, the middleware's frame, the origin policy's generality and
  the response-prepare signal (its headers are in the answer already).
* It takes only what needs none of what it skips: method ``POST``, a raw
  path ``/v1/boards/<board>/scores`` with no query, no fragment (``#``), no
  percent-encoding and no dot segment (so the router would find the same
  board), ``Content-Type:
  application/json`` exactly, the whole body arrived, and no ``Origin``,
  ``Expect`` or ``Upgrade`` header (CORS, ``100-continue`` and declined
  upgrades are the middlewares' work), no ``X-Forwarded-For`` when proxies
  are trusted (the proxy middleware reads it), a ``Host`` the origin policy
  accepts (a refusal is the general way's answer), on a single node (a
  cluster node may forward, which needs the route's match info), and while
  the door's fast submission is on (``Door.submitters``).
* Every check the general way makes on such a request is still made, in
  the same order: the gate (authentication, scope, the rate limits
  charged) and the body's size bound (``rest._admit_now``), its JSON, the
  event (a plain body natively: ``Service.pack_plain``; any other the
  general way, ``rest._submit_body``).  A read is admitted
  the same way (``rest._admit_reader``), and on a single node only (a cluster
  node's reads may wait for their group's log).  Errors are answered by
  ``rest._failed`` with the headers the signal would have added, and the
  request is counted in the metrics under its operation as the front door
  counts it.  ``tests/test_rest_hot.py``
  replays random requests both ways and compares the answers.
* What is left of a request is aiohttp's own work (parsing, the request
  object, its task) and the engine's, so the answers cost no more than
  they must: a read's body is made natively (a member's standing by
  ``_rest_reads``, a top page from the cache of its JSON); a plain
  submission joins its pass as a packed run, and the pass's completion
  (``answered``, called for each run of the pass in turn, once the pass is
  logged as the ack mode asks) writes its answer at once, the JSON made
  natively from the applied result (``_rest.answer_json``), then
  completes the future the request's handler awaits, which then only
  finishes (the connection takes no next request before, so pipelined
  answers stay in order).  No handler coroutine of the hot route's is
  resumed: the handler returns the future itself, or for a read its
  :class:`Answer`, which awaits as itself.
* :class:`Answer` writes a ``200`` JSON answer in one write: the status
  line and the headers the general path writes for it (in an order of its
  own: HTTP gives the order no meaning), with ``Connection`` as aiohttp
  sets it for the request's version and keep-alive, from bytes made once
  (``Date`` once a second), with no header map, no ``web.Response`` and no
  response-prepare step.
  Refusals still go through ``web.Response`` (``rest._failed``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Generator
from typing import Any, NamedTuple, Protocol

from aiohttp import web
from aiohttp.helpers import rfc822_formatted_time
from aiohttp.http import HttpVersion11
from multidict import CIMultiDict

from rankd._native import native_or
from rankd.frontends.origins import COMMON_HEADERS

PREFIX = "/v1/boards/"
SUFFIX = "/scores"
TOP_SUFFIX = "/top"
MEMBERS = "/members/"
#: The query parameters of a top page read the hot route takes.
TOP_PARAMS = frozenset({"limit", "offset"})
#: The headers ``rest._add_headers`` gives an answer to a request without
#: ``Origin`` (a success's are in ``rest.SUBMITTED_HEADERS`` already).
ANSWER_HEADERS = {"Server": "rankd", **COMMON_HEADERS}
#: The headers of a ``200`` JSON answer but those aiohttp adds (Date,
#: Content-Length): a submission's, a top page's, a member's.
JSON_HEADERS = {"Content-Type": "application/json", **ANSWER_HEADERS}
#: A plain submission's answer as JSON bytes, natively (``_rest.answer_json``;
#: without it no submission is plain: ``Service.pack_plain``).
answer_json, _ = native_or("rankd.frontends._rest", "answer_json", None)
#: Headers that send a request the general way (see the module docstring).
GENERAL_HEADERS = ("Origin", "Expect", "Upgrade")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class HotDoor(Protocol):
    """What the hot route reads of ``rest.Door``."""

    gate: Any
    metrics: Any
    origins: Any
    forwarder: Any
    service: Any
    submitters: Any
    readers: Any


#: Characters the URL parser reads otherwise than as a name's: a path
#: separator, percent-encoding, the query's and the fragment's starts.
ROUTER_SPECIALS = frozenset("/%?#")
#: The most digits of a ``limit`` or ``offset`` the hot route reads itself
#: (more than any index holds; a longer one, which ``int`` may even refuse
#: past its 4,300 digits, goes the general way and is answered there).
MAX_DIGITS = 18


def _plain_board(board: str) -> bool:
    """Whether the router would read ``board`` from the path as it is."""
    return not (not board or not ROUTER_SPECIALS.isdisjoint(board)
                or board == "." or board == "..")


def _plain_headers(request: web.Request, door: HotDoor, proxied: bool) -> bool:
    """Whether the request's headers need none of the middlewares' work."""
    headers = request.headers
    for name in GENERAL_HEADERS:
        if name in headers:
            return False
    if proxied and "X-Forwarded-For" in headers:
        return False
    return door.origins.host_refused(headers.get("Host")) is None


def hot_board(request: web.Request, door: HotDoor, proxied: bool) -> str | None:
    """The board of a submission the hot route may answer, or None: the
    general way (see the module docstring for what it takes)."""
    if request.method != "POST" or door.submitters is None or door.forwarder is not None:
        return None
    path = request.raw_path
    if not (path.startswith(PREFIX) and path.endswith(SUFFIX)):
        return None
    board = path[len(PREFIX):-len(SUFFIX)]
    if (not _plain_board(board) or request.headers.get("Content-Type") != "application/json"
            or not request.content.is_eof() or not _plain_headers(request, door, proxied)):
        return None
    return board


def _reads(request: web.Request, door: HotDoor) -> bool:
    """Whether the hot route may answer ``request`` if it is a plain read."""
    return (request.method == "GET" and door.readers is not None and door.forwarder is None
            and door.service.cluster is None)  # (a cluster's reads may wait: Unsettled)


def hot_top(request: web.Request, door: HotDoor, proxied: bool
            ) -> tuple[str, dict[str, int]] | None:
    """The board and query of a top page read the hot route may answer
    (``GET /v1/boards/<board>/top``, with at most ``limit`` and ``offset``,
    each once, in decimal digits), or None: the general way."""
    if not _reads(request, door):
        return None
    path, _, query = request.raw_path.partition("?")
    if not (path.startswith(PREFIX) and path.endswith(TOP_SUFFIX)):
        return None
    board = path[len(PREFIX):-len(TOP_SUFFIX)]
    if not _plain_board(board):
        return None
    params: dict[str, int] = {}
    if query:
        for part in query.split("&"):
            name, equals, value = part.partition("=")
            if (not equals or name not in TOP_PARAMS or name in params
                    or not value.isascii() or not value.isdigit() or len(value) > MAX_DIGITS):
                return None
            params[name] = int(value)
    if not _plain_headers(request, door, proxied):
        return None
    return board, params


def hot_member(request: web.Request, door: HotDoor, proxied: bool) -> tuple[str, str] | None:
    """The board and member of a member read the hot route may answer
    (``GET /v1/boards/<board>/members/<member>``, no query), or None."""
    if not _reads(request, door):
        return None
    path = request.raw_path
    if not path.startswith(PREFIX) or "?" in path:
        return None
    board, _, member = path[len(PREFIX):].partition(MEMBERS)
    if not (_plain_board(board) and _plain_board(member) and _plain_headers(request, door,
                                                                            proxied)):
        return None
    return board, member


class HotWays(NamedTuple):
    """What the hot route calls of the front door (``rankd.frontends.rest``)."""

    #: ``(principal, body)`` of a submission it takes, admitted (raises the
    #: gate's refusal, or a body over the size bound's).
    admit: Callable[[web.Request, Any], tuple[Any, bytes]]
    #: The answer to an admitted submission whose body the native reader
    #: does not take: decoded and submitted the general way.
    submit_body: Callable[[web.Request, Any, str, Any, bytes], Awaitable[web.Response]]
    #: The body of a top page read's answer (admitted; raises its refusal).
    top: Callable[[web.Request, Any, str, dict[str, int]], bytes]
    #: The body of a member read's answer (admitted; raises its refusal).
    member: Callable[[web.Request, Any, str, str], bytes]
    #: The JSON error answer to what one of them raised.
    failed: Callable[[web.Request, Exception, Any], Awaitable[web.StreamResponse]]


def install(app: web.Application, door: HotDoor, ways: HotWays) -> bool:
    """Put the hot route in front of ``app``'s router, answering what it
    takes by ``ways``.  False (and nothing changed) on an aiohttp without
    the handler it replaces."""
    general: Handler | None = getattr(app, "_handle", None)
    if general is None:
        return False
    observe = door.metrics.observe_request
    proxied = bool(door.gate.trusted_proxies)
    perf_counter = time.perf_counter
    service = door.service
    pack_plain = service.pack_plain
    submit_packed_then = service.submit_packed_then
    # The loop the application runs on, once known: get_running_loop() makes
    # a getpid() system call each time (Python 3.11).
    loops: list[asyncio.AbstractEventLoop] = []

    # Not a coroutine: what aiohttp awaits is the general handler's own
    # coroutine, an answer (awaited, itself) or a future the hot route
    # completes (no frame more for any).
    def handle(request: web.Request) -> Awaitable[Any]:
        board = hot_board(request, door, proxied)
        if board is not None:
            return submitted(request, board)
        read = hot_read(request)
        if read is None:
            return general(request)
        operation, answer, args = read
        started = perf_counter()
        try:
            body = answer(request, door, *args)
        except Exception as exc:
            return refused(request, exc, operation, started)
        observe(operation, 200, perf_counter() - started)
        return Answer(body)

    def submitted(request: web.Request, board: str) -> Awaitable[Any]:
        """A submission it takes: a plain body's answer comes from its pass's
        completion (:func:`answered`), any other's the general way."""
        started = perf_counter()
        try:
            principal, body = ways.admit(request, door)
            packed = pack_plain(board, body)
        except Exception as exc:
            return refused(request, exc, "submit", started)
        if packed is None:
            return decoded(request, board, principal, body, started)
        if not loops:
            loops.append(asyncio.get_running_loop())
        future: asyncio.Future[Any] = loops[0].create_future()
        submit_packed_then(packed, answered, (future, packed, started, request))
        return future

    def answered(token: tuple[asyncio.Future[Any], Any, float, web.Request],
                 error: BaseException | None) -> None:
        """The ``then`` of a plain submission's packed run, called once its
        pass committed (or could not), one after the other for the pass's
        runs: its answer is written at once, and completes the request's
        future (whose handler then only finishes: the answer is out, and
        the connection takes no next request before it is, so answers stay
        in order).  An error's answer is made by the handler (``failed``
        may await)."""
        future, packed, started, request = token
        if future.done():  # the request was cancelled (its client went away)
            return
        try:
            if error is not None:
                raise error
            body = answer_json(packed)
        except Exception as exc:
            future.set_result(Refusal(ways.failed, door, exc, started, observe))
            return
        observe("submit", 200, perf_counter() - started)
        answer = Answer(body)
        try:  # noqa: SIM105 - (a context manager costs more, for every answer)
            answer.write(request)
        except ConnectionError:
            pass  # (its client went away: writing it again tells the handler so)
        future.set_result(answer)

    async def decoded(request: web.Request, board: str, principal: Any, body: bytes,
                      started: float) -> web.StreamResponse:
        try:
            response = await ways.submit_body(request, door, board, principal, body)
        except Exception as exc:
            return await refused(request, exc, "submit", started)
        observe("submit", response.status, perf_counter() - started)
        return response

    async def refused(request: web.Request, exc: Exception, operation: str, started: float
                      ) -> web.StreamResponse:
        response = await ways.failed(request, exc, door)
        response.headers.update(ANSWER_HEADERS)
        observe(operation, response.status, perf_counter() - started)
        return response

    def hot_read(request: web.Request
                 ) -> tuple[str, Callable[..., bytes], tuple[Any, ...]] | None:
        """(operation, its answer's body, the body's arguments) of a read it takes."""
        top = hot_top(request, door, proxied)
        if top is not None:
            return "top", ways.top, top
        member = hot_member(request, door, proxied)
        if member is not None:
            return "member", ways.member, member
        return None

    # Not an attribute aiohttp expects to be set (it warns in development
    # mode): set as the instance's own, which ``_make_handler`` then serves.
    object.__setattr__(app, "_handle", handle)
    return True


class Answer:
    """A hot route's ``200`` JSON answer, written by itself: the status line,
    the headers aiohttp's ``web.Response`` would write for it
    (:data:`JSON_HEADERS`, ``Content-Length``, ``Date`` and, where the
    connection is not kept alive or is HTTP/1.0's kept alive,
    ``Connection``; the general path puts ``Server`` and
    ``X-Content-Type-Options`` last), and the body, in one write, with no
    header map built.  What aiohttp's request handler calls of a response
    (``prepare``, ``write_eof``, ``keep_alive``; ``status``,
    ``body_length`` and ``headers`` for an access log) it has."""

    __slots__ = ("body", "body_length", "keep_alive", "written")

    status = 200
    reason = "OK"

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.body_length = 0
        self.keep_alive: bool | None = None
        self.written = False

    async def prepare(self, request: web.BaseRequest) -> Any:
        writer = request._payload_writer
        if not self.written:
            self.write(request)
        await writer.drain()  # (returns at once unless the client reads slower)
        return writer

    def write(self, request: web.BaseRequest) -> None:
        """Write it all as the answer to ``request`` (raises a
        ``ConnectionError`` if its client went away)."""
        writer = request._payload_writer
        keep_alive = self.keep_alive = request.keep_alive
        version = request.version
        if version == HttpVersion11:
            first, connection = STATUS_11, b"" if keep_alive else CLOSE
        else:
            first = b"HTTP/%d.%d 200 OK\r\n" % (version.major, version.minor)
            connection = KEEP_ALIVE if keep_alive else b""
        body = self.body
        writer._write(b"".join((first, JSON_HEAD, str(len(body)).encode(), DATE, _date(),
                                connection, b"\r\n\r\n", body)))
        self.written = True
        self.body_length = writer.output_size

    async def write_eof(self, data: bytes = b"") -> None:
        """(All written by :meth:`prepare`.)"""

    def __await__(self) -> Generator[Any, None, Answer]:
        """The answer itself, at once (what the hot route's handler returns
        for a read: no future made)."""
        return self
        yield  # (a generator: what ``await`` takes)

    @property
    def headers(self) -> CIMultiDict[str]:
        """The headers written (but ``Date`` and ``Connection``)."""
        return CIMultiDict({**JSON_HEADERS, "Content-Length": str(len(self.body))})


class Refusal:
    """A plain submission's error answer, made once its request's handler
    resumes (``failed`` may await): the front door's JSON error, with the
    headers the response-prepare signal would add, counted in the metrics."""

    __slots__ = ("door", "exc", "failed", "observe", "response", "started")

    def __init__(self, failed: Callable[[web.Request, Exception, Any],
                                        Awaitable[web.StreamResponse]],
                 door: HotDoor, exc: Exception, started: float,
                 observe: Callable[[str, int, float], None]) -> None:
        self.failed, self.door, self.exc = failed, door, exc
        self.started, self.observe = started, observe
        self.response: web.StreamResponse | None = None

    async def prepare(self, request: web.Request) -> Any:
        response = self.response = await self.failed(request, self.exc, self.door)
        response.headers.update(ANSWER_HEADERS)
        self.observe("submit", response.status, time.perf_counter() - self.started)
        return await response.prepare(request)

    async def write_eof(self, data: bytes = b"") -> None:
        assert self.response is not None
        await self.response.write_eof(data)

    def __getattr__(self, name: str) -> Any:  # keep_alive, status, body_length, headers...
        if self.response is None:
            raise AttributeError(name)
        return getattr(self.response, name)


#: The status line of an HTTP/1.1 ``200``, and what comes between the
#: headers of :data:`JSON_HEADERS` and the ``Content-Length``'s value.
STATUS_11 = b"HTTP/1.1 200 OK\r\n"
JSON_HEAD = b"".join(f"{name}: {value}\r\n".encode() for name, value in JSON_HEADERS.items()
                     ) + b"Content-Length: "
DATE = b"\r\nDate: "
CLOSE = b"\r\nConnection: close"
KEEP_ALIVE = b"\r\nConnection: keep-alive"
_dates: list[Any] = [None, b""]


def _date() -> bytes:
    """aiohttp's ``Date`` (made once a second), encoded once a second."""
    text = rfc822_formatted_time()
    if text is not _dates[0]:
        _dates[0], _dates[1] = text, text.encode()
    return _dates[1]
