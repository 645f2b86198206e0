"""The REST hot route: the common submission and reads answered before
aiohttp's router and middlewares.

What it owns: deciding, from the raw request line and headers alone,
whether a request is a plain ``POST /v1/boards/{board}/scores`` that the
front door's fast submission (``rest._submit_now``) answers exactly as the
general way would, or a plain ``GET /v1/boards/{board}/top`` (at most
``limit`` and ``offset``, in at most ``MAX_DIGITS`` digits) or ``GET
/v1/boards/{board}/members/{member}`` (no query) that ``rest._top_now`` and
``rest._member_now`` answer so, and answering it there.  Its design:

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
  the same order, by ``rest._submit_now``: the gate (authentication, scope,
  the rate limits charged), the body's size bound, its JSON, the event
  (a plain body natively: ``Service.submit_json``).  A read is admitted
  the same way (``rest._admit_reader``), and on a single node only (a cluster
  node's reads may wait for their group's log).  Errors are answered by
  ``rest._failed`` with the headers the signal would have added, and the
  request is counted in the metrics under its operation as the front door
  counts it.  ``tests/test_rest_hot.py``
  replays random requests both ways and compares the answers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from aiohttp import web

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


def install(app: web.Application, door: HotDoor,
            submit_now: Callable[[web.Request, Any, str], Awaitable[web.Response]],
            top_now: Callable[[web.Request, Any, str, dict[str, int]], web.Response],
            member_now: Callable[[web.Request, Any, str, str], web.Response],
            failed: Callable[[web.Request, Exception, Any], Awaitable[web.StreamResponse]]
            ) -> bool:
    """Put the hot route in front of ``app``'s router: ``submit_now``
    answers the submissions it takes, ``top_now`` the top page reads,
    ``member_now`` the member reads, ``failed`` what they raise.  False
    (and nothing changed) on an aiohttp without the handler it replaces."""
    general: Handler | None = getattr(app, "_handle", None)
    if general is None:
        return False
    observe = door.metrics.observe_request
    proxied = bool(door.gate.trusted_proxies)
    perf_counter = time.perf_counter

    # Not a coroutine: what aiohttp awaits is the general handler's own
    # coroutine, or the hot route's (no frame more for either).
    def handle(request: web.Request) -> Awaitable[web.StreamResponse]:
        board = hot_board(request, door, proxied)
        if board is not None:
            return submitted(request, board)
        read = hot_read(request)
        if read is None:
            return general(request)
        operation, answer, args = read
        started = perf_counter()
        try:
            response = answer(request, door, *args)
        except Exception as exc:
            return refused(request, exc, operation, started)
        observe(operation, response.status, perf_counter() - started)
        done: asyncio.Future[web.StreamResponse] = asyncio.get_running_loop().create_future()
        done.set_result(response)
        return done

    async def submitted(request: web.Request, board: str) -> web.StreamResponse:
        started = perf_counter()
        try:
            response = await submit_now(request, door, board)
        except Exception as exc:
            return await refused(request, exc, "submit", started)
        observe("submit", response.status, perf_counter() - started)
        return response

    async def refused(request: web.Request, exc: Exception, operation: str, started: float
                      ) -> web.StreamResponse:
        response = await failed(request, exc, door)
        response.headers.update(ANSWER_HEADERS)
        observe(operation, response.status, perf_counter() - started)
        return response

    def hot_read(request: web.Request
                 ) -> tuple[str, Callable[..., web.Response], tuple[Any, ...]] | None:
        """(operation, its answer, the answer's arguments) of a read it takes."""
        top = hot_top(request, door, proxied)
        if top is not None:
            return "top", top_now, top
        member = hot_member(request, door, proxied)
        if member is not None:
            return "member", member_now, member
        return None

    # Not an attribute aiohttp expects to be set (it warns in development
    # mode): set as the instance's own, which ``_make_handler`` then serves.
    object.__setattr__(app, "_handle", handle)
    return True
