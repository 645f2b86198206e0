"""REST front-end: JSON over HTTP, all under ``/v1``.

Handlers only turn requests into engine calls and engine answers into
responses.  Errors are always ``{"error": {"code", "message"}}`` with the
fitting status; unknown body fields and query parameters are refused.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from aiohttp import hdrs, web
from aiohttp.web_urldispatcher import _default_expect_handler

from rankd.engine.engine import SETTLE_TRIES
from rankd.engine.errors import EngineError, NotFound, NotPrimary, Unsettled
from rankd.frontends.forwarding import Forwarder, forwarded, may_forward
from rankd.frontends.openapi import openapi_document
from rankd.frontends.origins import COMMON_HEADERS, OriginPolicy
from rankd.frontends.rest_hot import JSON_HEADERS, HotWays
from rankd.frontends.rest_hot import install as install_hot_route
from rankd.frontends.service import Service
from rankd.frontends.upgrades import decline_unanswered_upgrade
from rankd.metrics import CONTENT_TYPE, Metrics
from rankd.security import Gate, RateLimited, TrustedProxies, Unauthorized
from rankd.security.admissions import Admissions
from rankd.security.auth import JOIN_TOKEN_SECONDS

SERVICE = web.AppKey("service", Service)

MAX_BODY_BYTES = 1 << 20
#: How long a request body may take to arrive once its headers have, by
#: default (``--http-idle-timeout``): the keep-alive timeout bounds headers
#: that trickle in, this a body that does (one byte every few seconds held a
#: connection open for ever).
BODY_SECONDS = 30.0

STATUS = {"invalid": 422, "guard": 422, "not_found": 404, "conflict": 409,
          "event_conflict": 409, "read_only": 503,
          "storage": 503, "misdirected": 421, "not_primary": 421, "unacknowledged": 503,
          "unavailable": 503,
          "bad_request": 400, "too_large": 413, "method_not_allowed": 405,
          "unsupported_media_type": 415, "unauthorized": 401, "forbidden": 403,
          "rate_limited": 429, "too_many_connections": 429, "timeout": 408}
GATE = web.AppKey("gate", Gate)
FORWARDER = web.AppKey("forwarder", Forwarder)
ORIGINS = web.AppKey("origins", OriginPolicy)
BODY_TIMEOUT = web.AppKey("body_timeout", float)
METRICS = web.AppKey("metrics", Metrics)
#: Operations that take their credential from the query string too (browsers
#: cannot set headers on a WebSocket or an EventSource): a join token only.
QUERY_TOKEN_OPERATIONS = frozenset({"live_socket", "live_events"})
#: Operations whose answers any page may read, whatever its origin: the
#: page's public files (see rankd.frontends.origins).
PUBLIC_OPERATIONS = frozenset({"static_file"})

routes = web.RouteTableDef()


class RequestError(Exception):
    """A malformed request (HTTP 400 unless told otherwise)."""

    def __init__(self, message: str, code: str = "bad_request") -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


def error_response(code: str, message: str, status: int | None = None) -> web.Response:
    return json_response({"error": {"code": code, "message": message}},
                         status or STATUS.get(code, 400))


@dataclass(slots=True)
class Door:
    """What every request's way in uses, bound once per application (a
    lookup through ``request.app`` costs a few calls a request)."""

    gate: Gate
    metrics: Metrics
    origins: OriginPolicy
    forwarder: Forwarder | None
    service: Service
    #: Callers admitted to submit before (:func:`_submitted`); None: every
    #: submission goes the general way (the tests' reference).
    submitters: Admissions | None
    #: Callers admitted to read top pages and members before
    #: (:func:`_admit_reader`); None: every read goes the general way.
    readers: Admissions | None = None


DOOR = web.AppKey("door", Door)


async def _answered(request: web.Request,
                    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
                    door: Door, operation: str | None) -> web.StreamResponse:
    """The gated handler's answer, or the JSON error answer of what it raised
    (``operation``: the route handler's name, None for no route)."""
    try:
        try:
            return await _gated(request, handler, door, operation)
        except Unsettled as exc:
            if request.method not in READ_METHODS:
                raise
            return await _settled(request, functools.partial(
                _gated, handler=handler, door=door, operation=operation), exc)
    except Exception as exc:
        return await _failed(request, exc, door)


async def _failed(request: web.Request, exc: Exception, door: Door) -> web.StreamResponse:
    """The JSON error answer to what answering ``request`` raised (``exc``),
    or ``exc`` raised again for aiohttp to answer."""
    response = await _answer_to(request, exc, door)
    # Answered: the traceback (the request's frames down to the raise, and
    # this one) held cycles with ``exc``, about 44 objects a refused or
    # forwarded write that only the collector freed, a thousand requests'
    # worth at once: loop holds of 30-170 ms on a node forwarding a moving
    # group's writes.  (Raised again, it keeps its traceback for the log.)
    exc.__traceback__ = None
    return response


async def _answer_to(request: web.Request, exc: Exception, door: Door) -> web.StreamResponse:
    try:
        raise exc
    except NotPrimary as exc:
        forwarder = door.forwarder
        if forwarder is None or exc.primary is None or not may_forward(request):
            return error_response(exc.code, exc.message)
        try:
            return await forwarder.forward(request, exc.primary, request[PRINCIPAL])
        except aiohttp.ClientConnectorError as err:
            return error_response("unavailable", f"the node that writes this board "
                                  f"({exc.primary}) cannot be reached ({err}); nothing was "
                                  "applied: try again shortly")
        except (aiohttp.ClientError, TimeoutError) as err:
            return error_response("unacknowledged", f"the node that writes this board "
                                  f"({exc.primary}) did not answer ({err!r}); it may have "
                                  "applied the request: resubmit it with the same event id")
    except EngineError as exc:
        response = error_response(exc.code, exc.message)
        if isinstance(exc, Unauthorized):
            response.headers["WWW-Authenticate"] = 'Bearer realm="rankd"'
        elif isinstance(exc, RateLimited):
            response.headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after)))
        return response
    except RequestError as exc:
        return error_response(exc.code, exc.message)
    except web.HTTPRequestEntityTooLarge:
        return error_response("too_large", f"request body exceeds {MAX_BODY_BYTES} bytes")
    except web.HTTPMethodNotAllowed as exc:
        response = error_response("method_not_allowed",
                                  f"{request.method} is not allowed on {request.path}")
        response.headers["Allow"] = ", ".join(sorted(exc.allowed_methods))
        return response
    except web.HTTPNotFound:
        return error_response("not_found", f"no route {request.path}")
    except web.HTTPException:
        raise
    except Exception:  # a bug: a JSON answer, and the log says where
        log.exception("%s %s failed", request.method, request.path)
        return error_response("internal", "rankd failed to answer this request (logged)", 500)


#: Requests that only read: made again once what they met settled.
READ_METHODS = frozenset({"GET", "HEAD"})


async def _settled(request: web.Request,
                   handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
                   unsettled: Unsettled) -> web.StreamResponse:
    """A read that met writes of its board's group that the cluster's log
    has not committed yet (this node is their primary): answered again once
    they are (``Engine.settle``), a few times at most."""
    engine = service_of(request).engine
    for _ in range(SETTLE_TRIES - 1):
        await engine.settle(unsettled.group)
        try:
            return await handler(request)
        except Unsettled as again:
            unsettled = again
    raise unsettled


PRINCIPAL = "rankd.principal"
log = logging.getLogger(__name__)


def credential_of(request: web.Request, operation: str) -> tuple[str | None, bool]:
    """The request's credential, and whether it came from the URL (where
    only a join token is accepted)."""
    header = request.headers.get("Authorization", "")
    if header[:7].lower() == "bearer ":
        return header[7:].strip(), False
    if header:
        raise Unauthorized("the Authorization header must be 'Bearer <token or API key>'")
    if operation in QUERY_TOKEN_OPERATIONS and "token" in request.query:
        return request.query["token"], True
    return None, False


async def _gated(request: web.Request,
                 handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
                 door: Door, operation: str | None) -> web.StreamResponse:
    """Authenticate, check the scope of the route's ``operation``,
    rate-limit, then answer."""
    if operation is None:
        return await handler(request)
    gate = door.gate
    address = request.remote or ""
    # A batch is charged per event once its body is read.
    cost = 0 if operation == "submit_batch" else 1
    forwarder = door.forwarder
    if forwarder is not None and forwarded(request):  # from a node: its credential
        principal, address = await forwarder.admitted(request, gate, operation, cost)
    else:
        credential, from_url = credential_of(request, operation)
        principal = gate.admitted(credential, operation, address, cost, join_only=from_url)
    request[PRINCIPAL] = principal
    response = await handler(request)
    gate.done(principal, operation, address, board=request.match_info.get("board"))
    return response


#: The headers of a submission's answer (and a top page's) but those aiohttp
#: adds (Date, Content-Length), with those :func:`_add_headers` would add.
SUBMITTED_HEADERS = JSON_HEADERS


async def _submitted(request: web.Request,
                     handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
                     door: Door, operation: str) -> web.StreamResponse:
    """:func:`_gated` then :func:`submit`, in one step, for the common
    submission: no query string, ``Content-Type: application/json``, its
    whole body arrived, not forwarded by another node.  The same checks in
    the same order (gate, body, event), so the same answers; what it saves
    is their generality: the caller's admission is remembered
    (:class:`Admissions`), the answer's headers are made once.  Any other
    submission goes :func:`_gated`'s way."""
    headers = request.headers
    submitters = door.submitters
    if (submitters is None or request.query_string
            or headers.get("Content-Type") != "application/json"
            or not request.content.is_eof()
            or (door.forwarder is not None and forwarded(request))):
        return await _gated(request, handler, door, operation)
    return await _submit_now(request, door, request.match_info["board"])


async def _submit_now(request: web.Request, door: Door, board: str) -> web.Response:
    """A common submission (see :func:`_submitted`) to ``board``: admitted,
    its body read and decoded, submitted, answered (raises what the general
    path would: ``_failed`` answers it)."""
    if door.forwarder is None:  # nothing reads the body again (a forward would)
        principal, body = _admit_now(request, door)
    else:
        principal = _admitted_submitter(request, door)
        body = await _body(request)
    return await _submit_body(request, door, board, principal, body)


def _admitted_submitter(request: web.Request, door: Door) -> Any:
    """The caller of a common submission, admitted as :func:`_gated` admits
    it (the admission remembered: ``door.submitters``)."""
    submitters = door.submitters
    assert submitters is not None
    operation = "submit"
    address = request.remote or ""
    authorization = request.headers.get("Authorization")
    principal = submitters.get(authorization, address)
    if principal is None:
        credential, from_url = credential_of(request, operation)
        principal = door.gate.admitted(credential, operation, address, join_only=from_url)
        submitters.put(authorization, address, principal)
    return principal


def _admit_now(request: web.Request, door: Door) -> tuple[Any, bytes]:
    """A common submission's caller admitted and its body read, with no
    coroutine: ``(principal, body)``, for a request whose whole body arrived
    and that no node forwards (as the hot route's,
    :mod:`rankd.frontends.rest_hot`)."""
    principal = _admitted_submitter(request, door)
    body = request.content.read_nowait()  # all here (is_eof)
    if len(body) > MAX_BODY_BYTES:
        raise RequestError(f"request body exceeds {MAX_BODY_BYTES} bytes", "too_large")
    return principal, body


async def _submit_body(request: web.Request, door: Door, board: str, principal: Any,
                       body: bytes) -> web.Response:
    """:func:`_submit_now` once admitted and its ``body`` read: decoded,
    submitted, answered (the hot route's way for a body its native reader
    does not take)."""
    service = door.service
    plain = service.submit_json(board, body)  # None: decoded here, the general way
    try:
        answer = await (service.submit(board, decoded(body)) if plain is None else plain)
    except NotPrimary:
        request[PRINCIPAL] = principal  # forwarded with the caller's credential (_failed)
        raise
    return web.Response(body=orjson.dumps(answer), headers=SUBMITTED_HEADERS)


def _admit_reader(request: web.Request, door: Door, operation: str) -> None:
    """Admit a read the hot route takes (:mod:`rankd.frontends.rest_hot`) as
    :func:`_gated` admits it, the admission remembered as a submission's
    (``door.readers``: one table for ``top`` and ``member``, whose scope and
    rate limit are the same)."""
    readers = door.readers
    assert readers is not None
    address = request.remote or ""
    authorization = request.headers.get("Authorization")
    if readers.get(authorization, address) is None:
        credential, from_url = credential_of(request, operation)
        principal = door.gate.admitted(credential, operation, address, join_only=from_url)
        readers.put(authorization, address, principal)


def _top_now(request: web.Request, door: Door, board: str, params: dict[str, int]) -> bytes:
    """The body of a top page read the hot route takes, as :func:`top`
    answers it (its headers: ``SUBMITTED_HEADERS``)."""
    _admit_reader(request, door, "top")
    return door.service.top_json(board, **params)


def _member_now(request: web.Request, door: Door, board: str, name: str) -> bytes:
    """The body of a member read the hot route takes, as :func:`member`
    answers it (its headers: ``SUBMITTED_HEADERS``)."""
    _admit_reader(request, door, "member")
    return door.service.member_json(board, name)


def front_door(door: Door) -> Callable[..., Awaitable[web.StreamResponse]]:
    """The middleware every request goes through, outermost first: metrics
    (and the close of a declined upgrade), the origin policy
    (:func:`_refused`), errors as JSON (:func:`_answered`), the gate
    (:func:`_gated`).  One middleware, not four: each layer cost aiohttp a
    call and a coroutine a request."""
    observe = door.metrics.observe_request
    perf_counter = time.perf_counter

    @web.middleware
    async def middleware(request: web.Request,
                         handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                         ) -> web.StreamResponse:
        started = perf_counter()
        match_info = request.match_info
        operation = (None if match_info.http_exception is not None
                     else getattr(match_info.handler, "__name__", "unknown"))
        try:
            response = _refused(request, door.origins, operation)
            if response is None:
                if operation == "submit":  # the most common request: a frame less
                    try:
                        response = await _submitted(request, handler, door, operation)
                    except Exception as exc:
                        response = await _failed(request, exc, door)
                else:
                    response = await _answered(request, handler, door, operation)
        except web.HTTPException as exc:
            decline_unanswered_upgrade(request, exc)
            raise
        if hdrs.UPGRADE in request.headers or request.method == hdrs.METH_CONNECT:
            decline_unanswered_upgrade(request, response)
        observe(operation or "unmatched", response.status, perf_counter() - started)
        return response

    return middleware


# --- request parsing ---------------------------------------------------------------

#: An integer literal of 20 digits or more may be beyond 2**64, which orjson
#: reads as a float (rounded): such a body is read again exactly.
_HUGE_INTEGER = re.compile(rb"[0-9]{20}")


async def read_json(request: web.Request) -> Any:
    """The body, as JSON.  Only JSON content types are read: a browser sends
    form and ``text/plain`` bodies to any site without asking it first
    (cross-site request forgery), but not ``application/json``."""
    content_type = request.content_type
    if not (content_type == "application/json" or content_type.endswith("+json")):
        raise RequestError(f"request body must be JSON, sent as Content-Type: "
                           f"application/json (not {content_type})", "unsupported_media_type")
    return decoded(await _body(request))


async def _body(request: web.Request) -> bytes:
    """The body's bytes, within the body timeout (:data:`BODY_TIMEOUT`)."""
    seconds = 0.0
    try:
        if request.content.is_eof():  # all here already (the common case): no timer
            return await request.read()
        seconds = request.app.get(BODY_TIMEOUT, BODY_SECONDS)
        async with asyncio.timeout(seconds):
            return await request.read()
    except TimeoutError:
        raise RequestError(f"the request body did not arrive within {seconds:g} s",
                           "timeout") from None
    except ConnectionError:  # the client went away mid-body: nobody to answer, no bug
        raise RequestError("the client closed the connection before its body arrived"
                           ) from None


def decoded(body: bytes) -> Any:
    """``body`` read as JSON (``RequestError`` if it is not)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise RequestError(f"request body is not valid JSON: {exc}") from None
    if _HUGE_INTEGER.search(body):
        # Exact integers, so that the engine refuses the ones beyond 2**53.
        data = json.loads(body, parse_constant=_not_json)
    return data


def _not_json(name: str) -> None:
    raise RequestError(f"request body is not valid JSON: {name} is not a JSON value")


def query(request: web.Request, allowed: dict[str, Callable[[str], Any]]) -> dict[str, Any]:
    """Parse the query string: only ``allowed`` names, each once, converted."""
    if not request.query_string:
        return {}  # the common case for writes, without building the query mapping
    unknown = sorted(set(request.query) - set(allowed))
    if unknown:
        raise RequestError(f"unknown query parameter(s): {', '.join(unknown)}")
    values = {}
    for name, convert in allowed.items():
        given = request.query.getall(name, [])
        if len(given) > 1:
            raise RequestError(f"query parameter {name!r} given more than once")
        if given:
            try:
                values[name] = convert(given[0])
            except ValueError as exc:
                raise RequestError(f"query parameter {name!r}: {exc}") from None
    return values


def integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"expected an integer, got {text!r}") from None


def text(value: str) -> str:
    if not value:
        raise ValueError("must not be empty")
    return value


VIEW = {"window": text, "period": text, "min_seq": integer}


async def view_query(request: web.Request, extra: dict[str, Callable[[str], Any]] | None = None,
                     only: set[str] | None = None) -> dict[str, Any]:
    """A board read's query parameters (of ``VIEW``, or ``only`` those of
    it), once ``min_seq`` (if given) is applied here."""
    if not request.query_string:
        return {}  # the common case, without building the allowed names
    allowed = {name: kind for name, kind in VIEW.items() if only is None or name in only}
    params = query(request, {**allowed, **(extra or {})})
    min_seq = params.pop("min_seq", None)
    if min_seq is not None:
        await service_of(request).caught_up(request.match_info["board"], min_seq)
    return params


def service_of(request: web.Request) -> Service:
    return request.app[SERVICE]


def body_field(data: Any, field: str, kind: type, example: str) -> Any:
    """The one field of a ``{field: ...}`` body."""
    if not isinstance(data, dict) or set(data) != {field} or not isinstance(data[field], kind):
        raise RequestError(f"the body is {example} and nothing else", "invalid")
    return data[field]


# --- endpoints --------------------------------------------------------------------------

@routes.get("/v1/health")
async def health(request: web.Request) -> web.Response:
    query(request, {})
    state = service_of(request).health()
    return json_response(state, 200 if state["status"] == "ok" else 503)


@routes.get("/v1/openapi.json")
async def openapi(request: web.Request) -> web.Response:
    query(request, {})
    return json_response(openapi_document())


@routes.get("/v1/boards")
async def list_boards(request: web.Request) -> web.Response:
    params = query(request, {"limit": integer, "after": text})
    return json_response(service_of(request).list_boards(**params))


def flag(value: str) -> bool:
    if value not in ("true", "false"):
        raise ValueError(value)
    return value == "true"


@routes.put("/v1/boards/{board:[^/]+}")
async def put_board(request: web.Request) -> web.Response:
    params = query(request, {"discard": flag})
    info, created = await service_of(request).put_board(
        request.match_info["board"], await read_json(request), **params)
    return json_response(info, 201 if created else 200)


@routes.patch("/v1/boards/{board:[^/]+}")
async def patch_board(request: web.Request) -> web.Response:
    params = query(request, {"discard": flag})
    info, created = await service_of(request).put_board(
        request.match_info["board"], await read_json(request), patch=True, **params)
    return json_response(info, 201 if created else 200)


@routes.get("/v1/boards/{board:[^/]+}")
async def get_board(request: web.Request) -> web.Response:
    await view_query(request, only={"min_seq"})
    return json_response(service_of(request).get_board(request.match_info["board"]))


@routes.delete("/v1/boards/{board:[^/]+}")
async def delete_board(request: web.Request) -> web.Response:
    query(request, {})
    await service_of(request).delete_board(request.match_info["board"])
    return web.Response(status=204)


@routes.post("/v1/boards/{board:[^/]+}/scores")
async def submit(request: web.Request) -> web.Response:
    query(request, {})
    return json_response(await service_of(request).submit(request.match_info["board"],
                                                          await read_json(request)))


@routes.post("/v1/boards/{board:[^/]+}/scores/batch")
async def submit_batch(request: web.Request) -> web.Response:
    query(request, {})
    events = body_field(await read_json(request), "events", list, '{"events": [...]}')
    request.app[GATE].admit(request[PRINCIPAL], "submit_batch", request.remote or "",
                            max(1, len(events)))
    board = request.match_info["board"]
    await service_of(request).route_write(board)
    results = await service_of(request).submit_many([(board, event) for event in events])
    return json_response({"results": results})


@routes.get("/v1/boards/{board:[^/]+}/top")
async def top(request: web.Request) -> web.Response:
    params = await view_query(request, {"limit": integer, "offset": integer})
    body = service_of(request).top_json(request.match_info["board"], **params)
    return web.Response(body=body, content_type="application/json")


@routes.get("/v1/boards/{board:[^/]+}/members/{member:[^/]+}")
async def member(request: web.Request) -> web.Response:
    params = await view_query(request)
    return json_response(service_of(request).member(
        request.match_info["board"], request.match_info["member"], **params))


@routes.get("/v1/boards/{board:[^/]+}/members/{member:[^/]+}/around")
async def around(request: web.Request) -> web.Response:
    params = await view_query(request, {"above": integer, "below": integer})
    return json_response(service_of(request).around(
        request.match_info["board"], request.match_info["member"], **params))


@routes.delete("/v1/boards/{board:[^/]+}/members/{member:[^/]+}")
async def remove_member(request: web.Request) -> web.Response:
    query(request, {})
    await service_of(request).remove_member(request.match_info["board"],
                                            request.match_info["member"])
    return web.Response(status=204)


@routes.post("/v1/boards/{board:[^/]+}/ranks")
async def ranks(request: web.Request) -> web.Response:
    params = await view_query(request)
    members = body_field(await read_json(request), "members", list, '{"members": [...]}')
    service = service_of(request)
    return json_response(await service.engine.settled_read(functools.partial(
        service.ranks, request.match_info["board"], members, **params)))


@routes.get("/v1/boards/{board:[^/]+}/periods")
async def periods(request: web.Request) -> web.Response:
    params = query(request, {"window": text})
    return json_response(service_of(request).periods(request.match_info["board"], **params))


@routes.get("/v1/me/{board:[^/]+}")
async def me(request: web.Request) -> web.Response:
    """The caller's own standing: a player's token reads its member."""
    params = query(request, VIEW)
    subject = request[PRINCIPAL].subject
    if subject is None:
        raise RequestError("no member: this server runs without authentication, or the "
                           "token has no subject", "invalid")
    return json_response(service_of(request).member(request.match_info["board"], subject,
                                                    **params))


@routes.get("/v1/realtime/token")
async def realtime_token(request: web.Request) -> web.Response:
    """A short-lived token for the live feed's query string."""
    query(request, {})
    gate = request.app[GATE]
    return json_response({"token": gate.authenticator.join_token(request[PRINCIPAL]),
                          "expires_in": JOIN_TOKEN_SECONDS})


@routes.get("/v1/ready")
async def ready(request: web.Request) -> web.Response:
    """Ready for traffic: see the OpenAPI document for what each check means."""
    query(request, {})
    engine = service_of(request).engine
    checks = {"recovered": engine.ready,
              "listening": service_of(request).listening,
              "wal_writable": engine.failure is None and engine.wal is not None
              and not engine.wal.failed}
    degraded = {}
    if engine.config.postgres_dsn:
        # Postgres is off the write path: its being away is lag, not unreadiness;
        # a shipper that cannot go on at all (a gap, a different history) is.
        shipper = engine.shipper
        checks["postgres_shipping"] = shipper is not None and shipper.stalled is None
        degraded["postgres_connected"] = shipper is not None and shipper.connected
    node = service_of(request).cluster
    if node is not None:
        checks["cluster_joined"] = node.joined
        checks["cluster_fresh"] = node.fresh
        degraded["cluster_log_connected"] = node.log_connected
    ready_now = all(checks.values())
    return json_response({"ready": ready_now, "checks": checks, "degraded": degraded},
                         200 if ready_now else 503)


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    """Prometheus metrics."""
    query(request, {})
    return web.Response(body=request.app[METRICS].render(),
                        headers={"Content-Type": CONTENT_TYPE})


async def _cluster_status(request: web.Request) -> dict[str, Any]:
    query(request, {})
    node = service_of(request).cluster
    if node is None:
        raise NotFound("this rankd is a single node (started without --cluster-dsn)")
    return await node.status()


@routes.get("/v1/cluster")
async def cluster(request: web.Request) -> web.Response:
    """The cluster: nodes and their addresses, groups, primaries, epochs,
    each follower's lag (admin: it names internal addresses)."""
    return json_response(await _cluster_status(request))


@routes.post("/v1/cluster/moves")
async def cluster_move(request: web.Request) -> web.Response:
    """Move a board group to a node: ``{"group": G, "node": N}`` (admin)."""
    query(request, {})
    data = await read_json(request)
    if (not isinstance(data, dict) or set(data) != {"group", "node"}
            or type(data["group"]) is not int or not isinstance(data["node"], str)):
        raise RequestError('the body is {"group": <int>, "node": "<node id>"} and nothing '
                           "else", "invalid")
    node = service_of(request).cluster
    if node is None:
        raise NotFound("this rankd is a single node (started without --cluster-dsn)")
    return json_response(await node.request_move(data["group"], data["node"]), 202)


@routes.post("/v1/cluster/rebalance")
async def cluster_rebalance(request: web.Request) -> web.Response:
    """Have the planner spread the groups' primaries evenly again (admin)."""
    query(request, {})
    node = service_of(request).cluster
    if node is None:
        raise NotFound("this rankd is a single node (started without --cluster-dsn)")
    return json_response(await node.request_rebalance(), 202)


@routes.post("/v1/cluster/drain")
async def cluster_drain(request: web.Request) -> web.Response:
    """Move every group off a node, ``{"node": N}``, or stop, ``{"node": N,
    "cancel": true}`` (admin)."""
    query(request, {})
    data = await read_json(request)
    if (not isinstance(data, dict) or not isinstance(data.get("node"), str)
            or not set(data) <= {"node", "cancel"}
            or not isinstance(data.get("cancel", False), bool)):
        raise RequestError('the body is {"node": "<node id>"}, with "cancel": true to stop '
                           "draining it, and nothing else", "invalid")
    node = service_of(request).cluster
    if node is None:
        raise NotFound("this rankd is a single node (started without --cluster-dsn)")
    return json_response(await node.request_drain(data["node"],
                                                  cancel=data.get("cancel", False)), 202)


@routes.get("/v1/cluster/summary")
async def cluster_summary(request: web.Request) -> web.Response:
    """:func:`cluster` without any node's address, for read credentials."""
    return json_response(without_addresses(await _cluster_status(request)))


def without_addresses(status: dict[str, Any]) -> dict[str, Any]:
    """A cluster status without the nodes' addresses (nodes are named by id)."""
    hidden = {"advertise", "advertise_tcp"}
    return {**status,
            "nodes": [{k: v for k, v in node.items() if k not in hidden}
                      for node in status.get("nodes", [])],
            "this_node": {k: v for k, v in status.get("this_node", {}).items()
                          if k not in hidden}}


@routes.post("/v1/admin/snapshot")
async def snapshot(request: web.Request) -> web.Response:
    """Write a snapshot now (and drop the WAL segments it covers)."""
    query(request, {})
    engine = service_of(request).engine
    await engine.snapshot()
    info = engine.last_snapshot
    return json_response({"position": info["lsn"], "path": info["path"], "bytes": info["bytes"],
                          "seconds": round(info["seconds"], 4)})


@routes.get("/v1/admin/digest")
async def digest(request: web.Request) -> web.Response:
    """An order-sensitive hash of every board's state, to compare states cheaply."""
    query(request, {})
    return json_response({"digest": service_of(request).engine.digest()})


def _refused(request: web.Request, policy: OriginPolicy, operation: str | None
             ) -> web.StreamResponse | None:
    """The answer to pages of other sites, misaddressed requests and CORS
    preflights (see :mod:`rankd.frontends.origins`), or None: go on."""
    headers = request.headers
    refused = policy.host_refused(headers.get("Host"))
    if refused is not None:
        return error_response("misdirected", refused)
    origin = headers.get("Origin")
    if origin is None:  # not a browser's cross-site request
        return None
    refused = policy.origin_refused(origin, request.scheme, headers.get("Host"))
    if refused is not None and operation not in PUBLIC_OPERATIONS:
        return error_response("forbidden", refused)
    if request.method == "OPTIONS" and "Access-Control-Request-Method" in headers:
        return web.Response(status=204, headers=policy.preflight_headers(origin))
    return None


async def _add_headers(request: web.Request, response: web.StreamResponse) -> None:
    """Every answer: a ``Server`` header that names no versions (they tell an
    attacker which flaws to try), ``nosniff`` and no ``Referer``, and CORS
    headers to an allowed origin, streams and errors included (a public
    file's own ``*`` stays)."""
    headers = response.headers
    headers["Server"] = "rankd"
    headers.update(COMMON_HEADERS)
    origin = request.headers.get("Origin")
    # (not a browser's request otherwise: no CORS headers)
    if origin is not None and "Access-Control-Allow-Origin" not in headers:
        headers.update(request.app[ORIGINS].cors_headers(origin))


def proxy_middleware(proxies: TrustedProxies) -> Callable[..., Awaitable[web.StreamResponse]]:
    """A middleware that takes a request from one of ``proxies`` to come
    from the client its ``X-Forwarded-For`` names (``request.remote``), so
    the per-address limits and logs see clients, not the proxy."""

    @web.middleware
    async def middleware(request: web.Request,
                         handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                         ) -> web.StreamResponse:
        peer = request.remote or ""
        hops = request.headers.getall("X-Forwarded-For", ())
        if hops and proxies.trusts(peer):
            request = request.clone(remote=proxies.client_address(peer, hops))
        return await handler(request)

    return middleware


async def _expect(request: web.Request) -> web.StreamResponse | None:
    """``Expect: 100-continue``: a body announced over the limit is refused
    (413) before the client sends it; aiohttp's own handler, which runs
    before any middleware, invited it with ``100 Continue`` first."""
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        response = error_response("too_large", f"request body exceeds {MAX_BODY_BYTES} bytes")
        response.force_close()  # (the body is never read)
        return response
    return await _default_expect_handler(request)


def _expecting(route: Any) -> Any:
    """``route`` with :func:`_expect` as its expect handler."""
    if not isinstance(route, web.RouteDef):
        return route
    return web.RouteDef(route.method, route.path, route.handler,
                        {**route.kwargs, "expect_handler": _expect})


def create_app(service: Service, gate: Gate | None = None,
               metrics_registry: Metrics | None = None,
               origins: OriginPolicy | None = None,
               forwarder: Forwarder | None = None,
               body_seconds: float = BODY_SECONDS) -> web.Application:
    """The REST application over the engine behind ``service`` (on a
    cluster node, ``forwarder`` sends writes on to their primary); a body
    must arrive within ``body_seconds``."""
    gate = gate or Gate.open()
    # Only behind trusted proxies: no cost on each request otherwise.
    first = [proxy_middleware(gate.trusted_proxies)] if gate.trusted_proxies else []
    door = Door(gate, metrics_registry or Metrics(), origins or OriginPolicy(), forwarder,
                service, Admissions(gate, "submit"), Admissions(gate, "top"))
    app = web.Application(middlewares=[*first, front_door(door)],
                          client_max_size=MAX_BODY_BYTES)
    app[METRICS] = door.metrics
    app[DOOR] = door
    app[SERVICE] = service
    app[GATE] = gate
    app[ORIGINS] = door.origins
    app[BODY_TIMEOUT] = body_seconds
    if forwarder is not None:
        app[FORWARDER] = forwarder

        async def close_forwarder(app: web.Application) -> None:
            await forwarder.close()

        app.on_cleanup.append(close_forwarder)
    app.on_response_prepare.append(_add_headers)
    # The common submissions and reads, before the router and the middlewares.
    install_hot_route(app, door, HotWays(_admit_now, _submit_body, _top_now, _member_now, _failed))
    # The router tries a path's candidates in order: submissions' first.
    app.add_routes(sorted(map(_expecting, routes),
                          key=lambda route: getattr(route, "handler", None) is not submit))
    return app
