"""REST front-end: JSON over HTTP, all under ``/v1``.

Handlers only turn requests into engine calls and engine answers into
responses.  Errors are always ``{"error": {"code", "message"}}`` with the
fitting status; unknown body fields and query parameters are refused.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from rankd.engine.engine import Engine, Submission
from rankd.engine.errors import EngineError

ENGINE = web.AppKey("engine", Engine)
TOP_CACHE = web.AppKey("top_cache", dict)

MAX_BODY_BYTES = 1 << 20
MAX_BATCH = 10_000
MAX_RANKS_MEMBERS = 1000
MAX_LIMIT = 1000

STATUS = {"invalid": 422, "guard": 422, "not_found": 404, "conflict": 409, "read_only": 503,
          "bad_request": 400, "too_large": 413, "method_not_allowed": 405,
          "unsupported_media_type": 415}

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


@web.middleware
async def error_middleware(request: web.Request,
                           handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                           ) -> web.StreamResponse:
    try:
        return await handler(request)
    except EngineError as exc:
        return error_response(exc.code, exc.message)
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


# --- request parsing ---------------------------------------------------------------

async def read_json(request: web.Request) -> Any:
    # curl -d sends form-urlencoded by default; the body is JSON all the same.
    content_type = request.content_type
    if not (content_type in ("application/json", "", "application/x-www-form-urlencoded",
                             "application/octet-stream")
            or content_type.endswith("+json")):
        raise RequestError(f"request body must be JSON, not {content_type}",
                           "unsupported_media_type")
    body = await request.read()
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise RequestError(f"request body is not valid JSON: {exc}") from None


def query(request: web.Request, allowed: dict[str, Callable[[str], Any]]) -> dict[str, Any]:
    """Parse the query string: only ``allowed`` names, each once, converted."""
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


def bounded_int(low: int, high: int) -> Callable[[str], int]:
    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"expected an integer, got {text!r}") from None
        if not low <= value <= high:
            raise ValueError(f"must be between {low} and {high}, got {value}")
        return value
    return convert


def text(value: str) -> str:
    if not value:
        raise ValueError("must not be empty")
    return value


def members_list(value: str) -> list[str]:
    return [m for m in value.split(",") if m]


VIEW = {"window": text, "period": text}


def engine_of(request: web.Request) -> Engine:
    return request.app[ENGINE]


# --- endpoints --------------------------------------------------------------------------

@routes.get("/v1/health")
async def health(request: web.Request) -> web.Response:
    if engine_of(request).ready:
        return json_response({"status": "ok"})
    return json_response({"status": "recovering"}, 503)


@routes.get("/v1/boards")
async def list_boards(request: web.Request) -> web.Response:
    query(request, {})
    return json_response({"boards": engine_of(request).list_boards()})


@routes.put("/v1/boards/{board}")
async def put_board(request: web.Request) -> web.Response:
    query(request, {})
    name = request.match_info["board"]
    engine = engine_of(request)
    _, created = await engine.put_board(name, await read_json(request))
    return json_response(engine.board_info(name), 201 if created else 200)


@routes.get("/v1/boards/{board}")
async def get_board(request: web.Request) -> web.Response:
    query(request, {})
    return json_response(engine_of(request).board_info(request.match_info["board"]))


@routes.delete("/v1/boards/{board}")
async def delete_board(request: web.Request) -> web.Response:
    query(request, {})
    await engine_of(request).delete_board(request.match_info["board"])
    return web.Response(status=204)


@routes.post("/v1/boards/{board}/scores")
async def submit(request: web.Request) -> web.Response:
    query(request, {})
    data = await read_json(request)
    submission = Submission.from_dict(request.match_info["board"], data)
    return json_response(await engine_of(request).submit(submission))


@routes.post("/v1/boards/{board}/scores/batch")
async def submit_batch(request: web.Request) -> web.Response:
    query(request, {})
    data = await read_json(request)
    if not isinstance(data, dict) or set(data) != {"events"} or not isinstance(data["events"],
                                                                               list):
        raise RequestError('a batch body is {"events": [...]} and nothing else', "invalid")
    events = data["events"]
    if len(events) > MAX_BATCH:
        raise RequestError(f"a batch holds at most {MAX_BATCH} events, got {len(events)}",
                           "too_large")
    board = request.match_info["board"]
    slots: list[Any] = []
    submissions = []
    for event in events:
        try:
            submissions.append(Submission.from_dict(board, event))
            slots.append(None)
        except EngineError as exc:
            slots.append({"error": exc.to_dict()})
    answers = iter(await engine_of(request).submit_many(submissions))
    results = []
    for slot in slots:
        if slot is not None:
            results.append(slot)
            continue
        answer = next(answers)
        results.append({"error": answer.to_dict()} if isinstance(answer, EngineError) else answer)
    return json_response({"results": results})


@routes.get("/v1/boards/{board}/top")
async def top(request: web.Request) -> web.Response:
    params = query(request, {**VIEW, "limit": bounded_int(1, MAX_LIMIT),
                             "offset": bounded_int(0, 2**31)})
    engine = engine_of(request)
    name = request.match_info["board"]
    window, period = params.get("window"), params.get("period")
    version, window, period = engine.read_version(name, window, period)
    key = (name, window, period, params.get("offset", 0), params.get("limit", 10))
    cache = request.app[TOP_CACHE]
    cached = cache.get(key)
    if cached is None or cached[0] != version:
        page = engine.top(name, window=window, period=period, offset=key[3], limit=key[4])
        if len(cache) > 10_000:
            cache.clear()  # many distinct pages: start over rather than grow
        cached = cache[key] = (version, orjson.dumps(page))
    return web.Response(body=cached[1], content_type="application/json")


@routes.get("/v1/boards/{board}/members/{member}")
async def member(request: web.Request) -> web.Response:
    params = query(request, VIEW)
    standing = engine_of(request).standing(request.match_info["board"],
                                           request.match_info["member"], **params)
    if standing is None:
        return error_response("not_found", f"no member {request.match_info['member']!r} "
                                           "in that window")
    return json_response(standing)


@routes.get("/v1/boards/{board}/members/{member}/around")
async def around(request: web.Request) -> web.Response:
    params = query(request, {**VIEW, "above": bounded_int(0, 100), "below": bounded_int(0, 100)})
    entries = engine_of(request).around(request.match_info["board"],
                                        request.match_info["member"], **params)
    if entries is None:
        return error_response("not_found", f"no member {request.match_info['member']!r} "
                                           "in that window")
    return json_response({"entries": entries})


@routes.delete("/v1/boards/{board}/members/{member}")
async def remove_member(request: web.Request) -> web.Response:
    query(request, {})
    removed = await engine_of(request).remove_member(request.match_info["board"],
                                                     request.match_info["member"])
    if not removed:
        return error_response("not_found", f"no member {request.match_info['member']!r}")
    return web.Response(status=204)


@routes.post("/v1/boards/{board}/ranks")
async def ranks(request: web.Request) -> web.Response:
    params = query(request, VIEW)
    data = await read_json(request)
    if not isinstance(data, dict) or set(data) != {"members"} or not isinstance(
            data["members"], list):
        raise RequestError('the body is {"members": [...]} and nothing else', "invalid")
    if len(data["members"]) > MAX_RANKS_MEMBERS:
        raise RequestError(f"at most {MAX_RANKS_MEMBERS} members", "too_large")
    return json_response(engine_of(request).ranks(request.match_info["board"],
                                                  data["members"], **params))


@routes.get("/v1/boards/{board}/periods")
async def periods(request: web.Request) -> web.Response:
    params = query(request, {"window": text})
    return json_response(engine_of(request).periods(request.match_info["board"],
                                                    params.get("window")))


def create_app(engine: Engine) -> web.Application:
    """The REST application over ``engine``."""
    app = web.Application(middlewares=[error_middleware], client_max_size=MAX_BODY_BYTES)
    app[ENGINE] = engine
    app[TOP_CACHE] = {}
    app.add_routes(routes)
    return app
