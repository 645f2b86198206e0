"""The OpenAPI 3.1 document of the REST front-end, served at ``/v1/openapi.json``.

It describes :mod:`rankd.frontends.rest` as it behaves: every route and
method, their query parameters with the limits :mod:`rankd.frontends.service`
enforces, request bodies, and every status a route can answer with its
body.  Response schemas refuse unknown fields, so the integration tests
(``tests/test_rest.py``) catch any drift between this document and the
server by validating every response they receive against it.
"""

from __future__ import annotations

from typing import Any

from rankd import __version__
from rankd.engine.config import (
    BOARD_NAME_RULE,
    MAX_BOARD_NAME_BYTES,
    MAX_EVENT_ID_BYTES,
    MAX_LABEL_CHARS,
    MAX_RETAIN,
    REFUSED_CHARACTERS,
)
from rankd.engine.expiry import MAX_DEADLINE_MS
from rankd.engine.periods import WINDOWS
from rankd.frontends.service import (
    MAX_AROUND,
    MAX_BATCH,
    MAX_LIMIT,
    MAX_OFFSET,
    MAX_RANKS_MEMBERS,
)
from rankd.index import MAX_MEMBER_BYTES

MAX_BODY_BYTES = 1 << 20  # rest.MAX_BODY_BYTES (not imported: rest imports this module)

JSON = "application/json"

#: Error codes and the status each is answered with.
ERROR_STATUS = {
    "bad_request": 400,
    "not_found": 404,
    "method_not_allowed": 405,
    "conflict": 409,
    "event_conflict": 409,
    "too_large": 413,
    "unsupported_media_type": 415,
    "invalid": 422,
    "guard": 422,
    "read_only": 503,
    "storage": 503,
    "misdirected": 421,
    "not_primary": 421,
    "unacknowledged": 503,
    "unavailable": 503,
    "unauthorized": 401,
    "forbidden": 403,
    "rate_limited": 429,
    "too_many_connections": 429,
}

#: Reusable error responses (``components/responses``) by status.
ERROR_RESPONSES = {
    400: ("BadRequest",
          "Malformed request: an unknown or repeated query parameter, a query parameter "
          "that is not of its type (e.g. a non-integer `limit`), or a body that is not JSON."),
    404: ("NotFound", "No such board, member, window kept by the board, retained period, "
                      "or route."),
    405: ("MethodNotAllowed", "The route exists but not with this method; `Allow` lists the "
                              "methods it has."),
    409: ("Conflict", "The request contradicts the board's state."),
    413: ("TooLarge", f"The body exceeds {MAX_BODY_BYTES} bytes, or a list in it exceeds its "
                      "limit."),
    415: ("UnsupportedMediaType",
          "The body's `Content-Type` is not JSON: only `application/json` and `*/*+json` "
          "are read (with curl: `--json` or `-H 'Content-Type: application/json'`; its "
          "`-d` alone sends a form).  Forms, `text/plain` and bodies without a type are "
          "refused, since any web page can make a browser send those to rankd."),
    422: ("Unprocessable", "Well-formed JSON that the server refuses: unknown fields, wrong "
                           "types, values out of range (`invalid`) or outside the board's "
                           "score guards (`guard`)."),
    401: ("Unauthorized", "No valid credential: send `Authorization: Bearer <JWT or API "
                          "key>` (only when the server is configured with credentials)."),
    403: ("Forbidden", "The credential lacks the scope this operation needs (`read`, "
                       "`write` or `admin`), or the request came from a page of an origin "
                       "not allowed (`--cors-origins`)."),
    429: ("RateLimited", "Over a rate limit for this credential or client address; "
                         "`Retry-After` says when to retry."),
    503: ("ReadOnly", "rankd accepts no writes: it is still recovering, or it stopped "
                      "accepting writes after a storage failure (reads go on; restart it).  "
                      "On a cluster node also: `unavailable` (nothing applied: no node can "
                      "write this board's group just now; retry shortly) and "
                      "`unacknowledged` (the cluster's log did not confirm the write in "
                      "time: it may still commit; resubmit it with the same event id)."),
}


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` or ``null`` (JSON Schema 2020-12 style, as OpenAPI 3.1 has it)."""
    return {"anyOf": [schema, {"type": "null"}]}


def obj(properties: dict[str, Any], *, required: list[str] | None = None,
        description: str | None = None) -> dict[str, Any]:
    """A closed object; every property is required unless ``required`` says otherwise."""
    schema: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "required": list(properties) if required is None else required,
        "additionalProperties": False,
    }
    if description:
        schema["description"] = description
    return schema


# --- schemas -------------------------------------------------------------------------------

RANK = {"type": "integer", "minimum": 1}
COUNT = {"type": "integer", "minimum": 0}
#: A board name (rankd.engine.config.is_board_name): 1 to 512 bytes of
#: UTF-8 (``maxLength`` counts characters: the byte bound is the server's),
#: without control or invisible formatting characters, not ``.`` nor ``..``.
BOARD_NAME: dict[str, Any] = {
    "type": "string", "minLength": 1, "maxLength": MAX_BOARD_NAME_BYTES,
    # The server's own character class, as ECMA-262 escapes ("-": a range).
    "pattern": "^(?!\\.\\.?$)[^" + "".join(
        c if c == "-" else f"\\u{ord(c):04x}" for c in REFUSED_CHARACTERS.pattern[1:-1]
    ) + "]+$",
    "description": f"A board name ({BOARD_NAME_RULE}).",
}
MEMBER = {"type": "string", "minLength": 1,
          "description": f"A member name: 1 to {MAX_MEMBER_BYTES} bytes of UTF-8."}
WINDOW = {"type": "string", "enum": list(WINDOWS)}
PERIOD = {"type": "string",
          "description": "A period id of the window: `all`, a day `2026-11-22`, an ISO week "
                         "`2026-W47` or a month `2026-11` (UTC)."}
LABEL = nullable({"type": "string", "maxLength": MAX_LABEL_CHARS})
VERSION = {"type": "integer", "minimum": 0,
           "description": "The board's version, bumped by every change to it."}
UPDATED_AT = {"type": "number", "description": "When the board last changed, Unix seconds."}


def schemas() -> dict[str, Any]:
    config_number = nullable({"type": "number"})
    error_codes = list(ERROR_STATUS)
    entry = obj({"rank": RANK, "member": MEMBER, "score": {"type": "number"}, "label": LABEL},
                description="One row of a leaderboard: unique rank (1 is the top).")
    return {
        "BoardConfig": {
            "type": "object",
            "description": "A board's configuration.  In a request every field is optional "
                           "(defaults shown); a response has them all.  `min_score` must not "
                           "exceed `max_score`.  `order` and `tie_break` cannot change once "
                           "the board has members (409).",
            "properties": {
                "order": {"type": "string", "enum": ["desc", "asc"], "default": "desc"},
                "policy": {"type": "string", "enum": ["sum", "best", "latest"],
                           "default": "best",
                           "description": "`best` keeps the best score submitted, `sum` adds "
                                          "deltas, `latest` keeps the last score."},
                "tie_break": {"type": "string", "enum": ["first", "member", "member_desc"],
                              "default": "first",
                              "description": "How equal scores rank: `first` who got there "
                                             "first, `member` by member from A to Z, "
                                             "`member_desc` from Z to A (Redis's ZREVRANGE "
                                             "order on a `desc` board)."},
                "windows": {"type": "array", "items": WINDOW, "minItems": 1,
                            "uniqueItems": True, "default": ["all"]},
                "retain": {"type": "integer", "minimum": 0, "maximum": MAX_RETAIN,
                           "default": 8,
                           "description": "Closed periods kept per window."},
                "min_score": {**config_number, "default": None},
                "max_score": {**config_number, "default": None},
                "max_delta": {"anyOf": [{"type": "number", "exclusiveMinimum": 0},
                                        {"type": "null"}], "default": None,
                              "description": "The most one submission may change a score."},
                "signed": {"type": "boolean", "default": False,
                           "description": "Every submission must carry an HMAC-SHA256 "
                                          "`signature`, an `event_id` and a `ts`."},
                "replicas": {"anyOf": [{"const": "all"}, {"type": "null"}], "default": None,
                             "description": "On a cluster, `all` keeps the board's group on "
                                            "every live node (docs/cluster.md); null: the "
                                            "cluster's `--replicas`.  In a response only "
                                            "when set."},
                "expires_at_ms": {
                    "anyOf": [{"type": "integer", "minimum": 0,
                               "maximum": MAX_DEADLINE_MS}, {"type": "null"}],
                    "default": None,
                    "description": "When the board is deleted, milliseconds since 1970 "
                                   "(UTC); null: never (Redis's `PEXPIREAT`, `TTL`: "
                                   "docs/redis.md).  In a request it must be in the future "
                                   "(422).  Once it passes the board answers 404 everywhere "
                                   "and a write to it needs a new board."},
            },
            "additionalProperties": False,
        },
        "BoardInfo": obj({
            "name": BOARD_NAME,
            "config": {"allOf": [ref("BoardConfig")],
                       "required": ["order", "policy", "tie_break", "windows", "retain",
                                    "min_score", "max_score", "max_delta", "signed",
                                    "expires_at_ms"]},
            "members": {"type": "object", "propertyNames": WINDOW,
                        "additionalProperties": COUNT,
                        "description": "Members in the current period of each window."},
            "version": VERSION,
            "updated_at": UPDATED_AT,
        }),
        "BoardList": obj({"boards": {"type": "array", "items": ref("BoardInfo")},
                          "next": {"type": ["string", "null"],
                                   "description": "Pass as `after` for the next page; "
                                                  "null on the last."}},
                         description="A page of boards, by name."),
        "SubmitRequest": obj({
            "member": MEMBER,
            "score": nullable({"type": "number"}),
            "delta": nullable({"type": "number"}),
            "event_id": nullable({"type": "string", "minLength": 1,
                                  "description": f"At most {MAX_EVENT_ID_BYTES} bytes of "
                                                 "UTF-8.  A repeated event id of the board "
                                                 "answers the first result again with "
                                                 "`duplicate: true` and changes nothing."}),
            "ts": nullable({"type": "number",
                            "description": "When the event happened, Unix seconds (default: "
                                           "now); it decides the period.  It may differ "
                                           "from the server clock by the configured "
                                           "tolerance (300 s by default)."}),
            "label": LABEL,
            "signature": {"type": "string", "pattern": "^v2=[0-9a-f]{64}$",
                          "description": "On `signed` boards: `v2=` and the hex HMAC-SHA256 "
                                         "of the submission's fields, each length-prefixed "
                                         "(board, member, kind, value, event_id, ts, label; "
                                         "the exact bytes and test vectors are in "
                                         "docs/security.md)."},
        }, required=["member"],
            description="One score submission: `score` on `best` and `latest` boards, "
                        "`delta` on `sum` boards (the other one absent or null).  Numbers "
                        "must be finite; integers at most 2**53 in magnitude."),
        "SubmitResult": obj({
            "member": MEMBER,
            "score": {"type": "number", "description": "The member's score now, in the "
                                                       "board's primary window."},
            "rank": nullable(RANK),
            "previous": nullable({"type": "number"}),
            "changed": {"type": "boolean"},
            "duplicate": {"type": "boolean"},
            "event_id": nullable({"type": "string"}),
            "seq": {"type": "integer", "minimum": 1,
                    "description": "On a cluster node: the position of the board group's "
                                   "log this write is at or before.  Pass it as `min_seq` "
                                   "to a read on any node to see this write."},
            "epoch": {"type": "integer", "minimum": 1,
                      "description": "On a cluster node: the epoch of the primary that "
                                     "wrote it."},
        }, required=["member", "score", "rank", "previous", "changed", "duplicate",
                     "event_id"],
            description="The outcome of one submission in the board's primary window "
                        "(`all` if kept, else the first window)."),
        "BatchRequest": obj({
            "events": {"type": "array", "maxItems": MAX_BATCH, "items": ref("SubmitRequest"),
                       "description": f"At most {MAX_BATCH} events (413 beyond).  An event "
                                      "that is not a valid submission gets an error in its "
                                      "slot of the result; the others are applied."},
        }),
        "BatchResult": obj({
            "results": {"type": "array",
                        "items": {"oneOf": [ref("SubmitResult"), ref("BatchItemError")]},
                        "description": "One result or error per event, in order."},
        }),
        "BatchItemError": obj({
            "error": obj({"code": {"type": "string", "enum": ["invalid", "guard", "not_found",
                                                               "event_conflict"]},
                          "message": {"type": "string"}}),
        }, description="Why one event of a batch was refused."),
        "Entry": entry,
        "TopPage": obj({
            "entries": {"type": "array", "items": ref("Entry")},
            "total": {**COUNT, "description": "Members in the window's period."},
            "window": WINDOW,
            "period": PERIOD,
            "version": VERSION,
            "updated_at": UPDATED_AT,
        }),
        "Standing": obj({
            "member": MEMBER,
            "score": {"type": "number"},
            "rank": {**RANK, "description": "Unique rank (ties broken by the board's "
                                            "tie_break)."},
            "competition_rank": {**RANK, "description": "Ties share a rank: 1, 1, 3."},
            "dense_rank": {**RANK, "description": "Ties share a rank: 1, 1, 2."},
            "percentile": {"type": "number", "minimum": 0, "maximum": 100},
            "total": COUNT,
            "label": LABEL,
            "window": WINDOW,
            "period": PERIOD,
            "version": VERSION,
        }),
        "AroundPage": obj({"entries": {"type": "array", "items": ref("Entry"),
                                       "description": "The member and its neighbours, in "
                                                      "rank order."}}),
        "RanksRequest": obj({"members": {"type": "array", "items": MEMBER,
                                         "maxItems": MAX_RANKS_MEMBERS,
                                         "description": f"At most {MAX_RANKS_MEMBERS} "
                                                        "members (413 beyond)."}}),
        "RankEntry": obj({"rank": RANK, "list_rank": RANK, "member": MEMBER,
                          "score": {"type": "number"}, "label": LABEL},
                         description="`rank` on the whole board, `list_rank` in the list."),
        "RanksResult": obj({
            "entries": {"type": "array", "items": ref("RankEntry")},
            "missing": {"type": "array", "items": MEMBER,
                        "description": "Requested members without a score in the period."},
            "window": WINDOW,
            "period": PERIOD,
        }),
        "PeriodsResult": obj({
            "window": WINDOW,
            "current": PERIOD,
            "retained": {"type": "array", "items": PERIOD,
                         "description": "Closed periods still queryable, newest first."},
        }),
        "Health": obj({"status": {"type": "string", "enum": ["ok", "recovering"]}}),
        "Error": obj({
            "error": obj({"code": {"type": "string", "enum": error_codes},
                          "message": {"type": "string"}}),
        }, description="Every error: a stable machine-readable code and a message for "
                       "people.  " + ", ".join(f"`{code}` {status}"
                                               for code, status in ERROR_STATUS.items()) + "."),
        "JoinToken": obj({"token": {"type": "string"},
                          "expires_in": {"type": "integer", "minimum": 1}},
                         description="A short-lived `read` token for the live feed's query "
                                     "string (`?token=`)."),
        "Ready": obj({"ready": {"type": "boolean"},
                      "checks": {"type": "object",
                                 "additionalProperties": {"type": "boolean"}},
                      "degraded": {"type": "object",
                                   "additionalProperties": {"type": "boolean"}}}),
        "SnapshotInfo": obj({"position": {"type": "integer", "minimum": 0},
                             "path": {"type": "string"},
                             "bytes": {"type": "integer", "minimum": 0},
                             "seconds": {"type": "number", "minimum": 0}}),
        "Digest": obj({"digest": {"type": "string", "pattern": "^[0-9a-f]{32}$"}}),
        "ClusterStatus": obj({
            "nodes": {"type": "array", "items": {"type": "object"}},
            "groups": {"type": "array", "items": {"type": "object"}},
            "this_node": {"type": "object"}},
            description="`nodes`: each node's id, advertised address, whether it is alive "
                        "and how long it has been silent.  `groups`: each board group with "
                        "a log, its `epoch`, `primary`, `lease_seconds_left`, `last_seq` "
                        "and every live follower's `applied` position and `lag`.  "
                        "`this_node`: the groups this node writes and follows."),
        "ClusterMoveRequest": obj({"group": {"type": "integer", "minimum": 0},
                                   "node": {"type": "string"}}),
        "ClusterMove": obj({"group": {"type": "integer"}, "node": {"type": "string"},
                            "topology_epoch": {"type": "integer"}}),
        "ClusterRebalance": obj({"rebalance": {"type": "string"}}),
        "ClusterDrainRequest": obj({"node": {"type": "string"}, "cancel": {"type": "boolean"}},
                                   required=["node"]),
        "ClusterDrain": obj({"node": {"type": "string"}, "draining": {"type": "boolean"}}),
        "OpenAPIDocument": {"type": "object", "required": ["openapi", "info", "paths"],
                            "description": "This document."},
    }


def error_response(status: int) -> dict[str, Any]:
    description = ERROR_RESPONSES[status][1]
    codes = [code for code, code_status in ERROR_STATUS.items() if code_status == status]
    response: dict[str, Any] = {
        "description": description,
        "content": {JSON: {"schema": {
            "allOf": [ref("Error")],
            "properties": {"error": {"properties": {"code": {"enum": codes}}}},
        }}},
    }
    if status == 405:
        response["headers"] = {"Allow": {"description": "The methods of this route.",
                                         "schema": {"type": "string"}}}
    return response


# --- operations ----------------------------------------------------------------------------

def param(name: str, where: str, schema: dict[str, Any], description: str,
          required: bool = False) -> dict[str, Any]:
    return {"name": name, "in": where, "required": required or where == "path",
            "description": description, "schema": schema}


BOARD = param("board", "path", BOARD_NAME,
              "The board's name, percent-encoded (`{daily}:cup` is `%7Bdaily%7D%3Acup`, "
              "`a/b` is `a%2Fb`).  Creating a board with another name is refused (422); "
              "reading one answers 404.")
MEMBER_PARAM = param("member", "path", MEMBER, "The member's name (percent-encoded).")
VIEW_PARAMS = [
    param("window", "query", WINDOW, "The window to read (default: the board's primary "
                                     "window, `all` if kept, else its first).  Unknown: 422; "
                                     "not kept by the board: 404."),
    param("period", "query", {**PERIOD, "minLength": 1},
          "The period of the window (default: the current one).  Malformed: 422; not "
          "retained: 404."),
    MIN_SEQ := param(
        "min_seq", "query", {"type": "integer", "minimum": 0},
        "Read-your-writes on a cluster: answer once this node has applied the board "
        "group's log up to this position (a write's `seq`), waiting up to 5 s (then 503 "
        "`unavailable`).  A single node has every write it acknowledged."),
]


def integer_param(name: str, low: int, high: int, default: int, description: str
                  ) -> dict[str, Any]:
    return param(name, "query",
                 {"type": "integer", "minimum": low, "maximum": high, "default": default},
                 f"{description} Not an integer: 400; outside {low}..{high}: 422.")


def json_body(schema: str, description: str) -> dict[str, Any]:
    return {"required": True, "description": description,
            "content": {JSON: {"schema": ref(schema)}}}


def ok(schema: str, description: str) -> dict[str, Any]:
    return {"description": description, "content": {JSON: {"schema": ref(schema)}}}


NO_CONTENT = {"description": "Done; no body."}


#: Operations anyone may call, with or without credentials.
OPEN_OPERATIONS = frozenset({"health", "openapi", "ready"})


def operation(operation_id: str, summary: str, tag: str, responses: dict[int, Any], *,
              errors: tuple[int, ...] = (), parameters: list[dict[str, Any]] | None = None,
              body: dict[str, Any] | None = None, description: str | None = None
              ) -> dict[str, Any]:
    op: dict[str, Any] = {"operationId": operation_id, "summary": summary, "tags": [tag]}
    if operation_id in OPEN_OPERATIONS:
        op["security"] = [{}]
    else:
        errors = (*errors, 401, 403, 429)
    if description:
        op["description"] = description
    if parameters:
        op["parameters"] = parameters
    if body:
        op["requestBody"] = body
    all_responses = {str(status): response for status, response in responses.items()}
    for status in errors:
        all_responses[str(status)] = {
            "$ref": f"#/components/responses/{ERROR_RESPONSES[status][0]}"}
    op["responses"] = dict(sorted(all_responses.items()))
    return op


#: The errors of reading a JSON body: malformed, too large, not JSON, refused.
BODY_ERRORS = (400, 413, 415, 422)


DISCARD = {"name": "discard", "in": "query", "required": False,
           "schema": {"type": "string", "enum": ["true", "false"], "default": "false"},
           "description": "`true` to go ahead with a change that loses data."}


def paths() -> dict[str, Any]:
    board_path = "/v1/boards/{board}"
    member_path = board_path + "/members/{member}"
    return {
        "/v1/health": {"get": operation(
            "health", "Whether rankd serves", "service",
            {200: ok("Health", "Serving."),
             503: ok("Health", "Still recovering from the log; writes answer 503 meanwhile.")},
            errors=(400,),
            description="Answers 503 with `status: recovering` while rankd replays its "
                        "snapshot and write-ahead log at start-up.")},
        "/v1/openapi.json": {"get": operation(
            "openapi", "This document", "service",
            {200: ok("OpenAPIDocument", "The OpenAPI 3.1 document of the REST API.")},
            errors=(400,))},
        "/v1/boards": {"get": operation(
            "listBoards", "List boards", "boards",
            {200: ok("BoardList", "A page of boards, by name.")}, errors=(400, 422),
            parameters=[integer_param("limit", 1, MAX_LIMIT, MAX_LIMIT, "Boards per page."),
                        param("after", "query", {"type": "string", "minLength": 1},
                              "The `next` of the page before (default: from the first).")])},
        board_path: {
            "parameters": [BOARD],
            "put": operation(
                "putBoard", "Create or change a board", "boards",
                {200: ok("BoardInfo", "The board existed; it now has this config (or had it "
                                      "already)."),
                 201: ok("BoardInfo", "The board was created.")},
                errors=(*BODY_ERRORS, 409, 503), parameters=[DISCARD],
                body=json_body("BoardConfig", "The whole config; fields left out take their "
                                              "defaults (`{}`: all defaults)."),
                description="Changing windows keeps the windows still listed; windows added "
                            "start empty.  A change that would lose data is refused (409, "
                            "naming what) unless `discard=true`: a window dropped while it "
                            "has members, closed periods beyond a lower `retain`, a new "
                            "`policy` on a board with members.  Changing `order` or "
                            "`tie_break` of a board with members is always refused.  Every "
                            "change is logged with the config before and after.  "
                            "`expires_at_ms` (ms since 1970, UTC; null: never) is when the "
                            "board is deleted, as Redis's `PEXPIREAT` sets it (RESP's "
                            "`EXPIRE`, `TTL`, `PERSIST` read and set the same deadline): a "
                            "PUT without it clears it, a PATCH without it keeps it; it must "
                            "be in the future.  Once it passes the board answers 404 "
                            "everywhere (on every cluster node at the same log position); "
                            "its deletion is logged (kind `expired` in the Postgres history), "
                            "and a write to it needs a new board."),
            "patch": operation(
                "patchBoard", "Change some fields of a board's config", "boards",
                {200: ok("BoardInfo", "The board now has the fields given, the others as "
                                      "they were."),
                 201: ok("BoardInfo", "The board was created (as `PUT` with that body).")},
                errors=(*BODY_ERRORS, 409, 503), parameters=[DISCARD],
                body=json_body("BoardConfig", "Only the fields to change."),
                description="As `PUT`, with the fields left out kept rather than reset."),
            "get": operation("getBoard", "A board's config and member counts", "boards",
                             {200: ok("BoardInfo", "The board.")}, errors=(400, 404, 503),
                             parameters=[MIN_SEQ]),
            "delete": operation("deleteBoard", "Delete a board and all its windows", "boards",
                                {204: NO_CONTENT}, errors=(400, 404, 503)),
        },
        board_path + "/scores": {
            "parameters": [BOARD],
            "post": operation(
                "submit", "Submit a score", "scores",
                {200: ok("SubmitResult", "Applied and durable (or a duplicate event id).")},
                errors=(400, 404, 409, 413, 415, 422, 503),
                description="An `event_id` seen on the board within the dedupe TTL is "
                            "answered with its original result, marked `duplicate`, when "
                            "the submission repeats it (same member, kind, value and "
                            "label; `ts` may differ); with any of those different it is "
                            "refused with 409 `event_conflict` and changes nothing.  "
                            "An id is remembered for at least the TTL (a little longer "
                            "at times: ids expire in blocks, see durability.md).",
                body=json_body("SubmitRequest", "The submission.")),
        },
        board_path + "/scores/batch": {
            "parameters": [BOARD],
            "post": operation(
                "submitBatch", "Submit many scores at once", "scores",
                {200: ok("BatchResult", "Each event's result or error, in order; the valid "
                                        "ones are applied and durable.")},
                errors=(*BODY_ERRORS, 503),
                body=json_body("BatchRequest", f"Up to {MAX_BATCH} events."),
                description="Every event goes to the board of the path.  Events are applied "
                            "in order in one log append; an invalid event, or an unknown "
                            "board, gets an error in its slot (`not_found` for every event "
                            f"if the board does not exist).  More than {MAX_BATCH} events: "
                            "413; a body that is not `{\"events\": [...]}`: 422."),
        },
        board_path + "/top": {
            "parameters": [BOARD],
            "get": operation(
                "top", "A page of the leaderboard", "reads",
                {200: ok("TopPage", "The page (empty past the end).")},
                errors=(400, 404, 422),
                parameters=[*VIEW_PARAMS,
                            integer_param("limit", 1, MAX_LIMIT, 10, "Entries per page."),
                            integer_param("offset", 0, MAX_OFFSET, 0,
                                          "Entries to skip (0-based).")]),
        },
        member_path: {
            "parameters": [BOARD, MEMBER_PARAM],
            "get": operation(
                "member", "A member's score and ranks", "reads",
                {200: ok("Standing", "The member's standing.")},
                errors=(400, 404, 422), parameters=VIEW_PARAMS,
                description="404 when the member has no score in the period."),
            "delete": operation(
                "removeMember", "Remove a member from every window and period", "scores",
                {204: NO_CONTENT}, errors=(400, 404, 422, 503),
                description="404 when the board has no such member."),
        },
        member_path + "/around": {
            "parameters": [BOARD, MEMBER_PARAM],
            "get": operation(
                "around", "A member and its neighbours", "reads",
                {200: ok("AroundPage", "The member with up to `above` entries before it and "
                                       "`below` after it.")},
                errors=(400, 404, 422),
                parameters=[*VIEW_PARAMS,
                            integer_param("above", 0, MAX_AROUND, 4,
                                          "Entries ranked above the member."),
                            integer_param("below", 0, MAX_AROUND, 4,
                                          "Entries ranked below the member.")],
                description="404 when the member has no score in the period."),
        },
        board_path + "/ranks": {
            "parameters": [BOARD],
            "post": operation(
                "ranks", "Rank a list of members (a friends board)", "reads",
                {200: ok("RanksResult", "The members found, ordered, and those missing.")},
                errors=(*BODY_ERRORS, 404), parameters=VIEW_PARAMS,
                body=json_body("RanksRequest", "The members; repeats count once."),
                description=f"More than {MAX_RANKS_MEMBERS} members: 413; a body that is not "
                            "`{\"members\": [...]}` or a member that is not a name: 422."),
        },
        "/v1/me/{board}": {
            "parameters": [BOARD],
            "get": operation(
                "me", "The caller's own standing", "reads",
                {200: ok("Standing", "The standing of the member the token names (`sub`).")},
                errors=(400, 404, 422), parameters=VIEW_PARAMS,
                description="Any valid token whose subject is a member, no scope needed. "
                            "422 when the server runs without authentication or the token "
                            "has no subject."),
        },
        "/v1/realtime/token": {"get": operation(
            "realtimeToken", "A join token for the live feed", "service",
            {200: ok("JoinToken", "A 60-second read token.")}, errors=(400,),
            description="Browsers cannot set headers on a WebSocket or EventSource: pass "
                        "this token as `?token=` on `/live` and `/events`.")},
        "/v1/ready": {"get": operation(
            "ready", "Whether rankd is ready for traffic", "service",
            {200: ok("Ready", "Recovered, the WAL takes writes, and (with Postgres "
                              "configured) shipping can make progress."),
             503: ok("Ready", "Not ready: `checks` says what is missing.")},
            errors=(400,),
            description="The probe for a load balancer.  `checks` must all hold: "
                        "`recovered`, `listening` (every listener, HTTP and TCP, accepts), "
                        "`wal_writable`, on a cluster node `cluster_joined` and "
                        "`cluster_fresh` (every board group within `--max-follow-lag`), "
                        "and with Postgres configured "
                        "`postgres_shipping` (false when shipping stalled for good: a "
                        "missing or corrupt local record, or a history that differs from "
                        "Postgres's).  Postgres being down is not a reason to stop "
                        "traffic (it is off the write path): `degraded.postgres_connected` "
                        "reports it, and the shipper catches up when it returns.")},
        "/metrics": {"get": {
            **operation("metrics", "Prometheus metrics", "service",
                        {200: {"description": "Prometheus text exposition format.",
                               "content": {"text/plain": {"schema": {"type": "string"}}}}},
                        errors=(400,)),
        }},
        "/v1/cluster": {"get": operation(
            "cluster", "The cluster's nodes, groups, primaries and lag", "service",
            {200: ok("ClusterStatus", "As Postgres and this node see it.")},
            errors=(400, 404),
            description="Only on a cluster node (`--cluster-dsn`); a single node answers "
                        "404.  Needs the `admin` scope: it names the nodes' internal "
                        "addresses (`GET /v1/cluster/summary` leaves them out).")},
        "/v1/cluster/moves": {"post": operation(
            "clusterMove", "Move a board group to a node", "service",
            {202: ok("ClusterMove", "The move is requested: the group's primary hands it "
                                    "over once the node caught up.")},
            errors=(*BODY_ERRORS, 404),
            body=json_body("ClusterMoveRequest", "The group and the node to move it to."),
            description="Only on a cluster node; N must be a live node.  Needs the `admin` "
                        "scope.")},
        "/v1/cluster/rebalance": {"post": operation(
            "clusterRebalance", "Spread the groups' primaries evenly again", "service",
            {202: ok("ClusterRebalance", "The planner rebalances at its next round.")},
            errors=(400, 404),
            description="Only on a cluster node.  Needs the `admin` scope.")},
        "/v1/cluster/drain": {"post": operation(
            "clusterDrain", "Move every board group off a node", "service",
            {202: ok("ClusterDrain", "The planner moves the node's groups away.")},
            errors=(*BODY_ERRORS, 404),
            body=json_body("ClusterDrainRequest", "The node (and `cancel: true` to stop)."),
            description="Only on a cluster node.  Needs the `admin` scope.")},
        "/v1/cluster/summary": {"get": operation(
            "clusterSummary", "The cluster's state without the nodes' addresses", "service",
            {200: ok("ClusterStatus", "As `GET /v1/cluster`, nodes named by id only.")},
            errors=(400, 404),
            description="Only on a cluster node (`--cluster-dsn`); a single node answers "
                        "404.  Needs the `read` scope.")},
        "/v1/admin/snapshot": {"post": operation(
            "snapshot", "Write a snapshot now", "service",
            {200: ok("SnapshotInfo", "The snapshot written.")}, errors=(400, 503),
            description="Needs the `admin` scope.  Also drops the WAL segments it covers "
                        "(and that Postgres has, when configured).")},
        "/v1/admin/digest": {"get": operation(
            "digest", "A hash of every board's state", "service",
            {200: ok("Digest", "Equal digests mean equal states.")}, errors=(400,),
            description="Needs the `admin` scope.")},
        board_path + "/periods": {
            "parameters": [BOARD],
            "get": operation(
                "periods", "A window's current and retained periods", "reads",
                {200: ok("PeriodsResult", "The periods.")},
                errors=(400, 404, 422), parameters=VIEW_PARAMS[:1]),
        },
    }


def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of the REST API, as a fresh dict."""
    return {
        "openapi": "3.1.0",
        "jsonSchemaDialect": "https://json-schema.org/draft/2020-12/schema",
        "info": {
            "title": "rankd REST API",
            "version": __version__,
            "summary": "Durable, real-time leaderboards.",
            "description": (
                "JSON over HTTP, all under `/v1`.  Errors are always "
                "`{\"error\": {\"code\", \"message\"}}` with the status of their code; unknown "
                "body fields and query parameters are refused.  Request bodies are at most "
                f"{MAX_BODY_BYTES} bytes (413; one announced larger with `Expect: "
                "100-continue` is refused before it is sent, without `100 Continue`).  A "
                "path that matches no route answers 404 and "
                "a method a route lacks answers 405 with an `Allow` header (see "
                "`components/responses`).  Every GET route also answers HEAD.  On every "
                "route: a request whose `Origin` is neither rankd's own nor listed in "
                "`--cors-origins` answers 403 `forbidden`; without credentials configured, "
                "a request addressed (`Host`) to anything but a loopback name answers 421 "
                "`misdirected` (DNS rebinding); `OPTIONS` preflights of listed origins "
                "answer 204 with CORS headers, and their answers carry them."
            ),
            "license": {"name": "MIT", "identifier": "MIT"},
        },
        "tags": [
            {"name": "service", "description": "The server itself."},
            {"name": "boards", "description": "Creating, configuring and deleting boards."},
            {"name": "scores", "description": "Changing members' scores."},
            {"name": "reads", "description": "Leaderboards, standings and periods."},
        ],
        "paths": paths(),
        "security": [{"bearer": []}],
        "components": {
            "securitySchemes": {"bearer": {
                "type": "http", "scheme": "bearer",
                "description": "A JWT (HS256, RS256 or ES256; scopes in `scope`), or an API "
                               "key `rk_<id>_<secret>`.  Not needed when the server runs "
                               "without credentials (loopback only)."}},
            "schemas": schemas(),
            "responses": {name: error_response(status)
                          for status, (name, _) in ERROR_RESPONSES.items()},
        },
    }
