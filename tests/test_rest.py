"""The REST API end to end, against the real daemon, and against its OpenAPI document.

One daemon serves the whole module (each test uses its own boards).  Every
request goes through :class:`Api`, which records the exchange and checks it
at once against ``/v1/openapi.json``: the status must be documented for that
path and method, the body must match the documented schema (JSON Schema
2020-12, ``$ref`` resolved within the document), a 405 must carry an
``Allow`` header listing exactly the route's methods, and a 2xx answer to a
request with a body means the body was valid by the document.  The last test
checks that every operation, and every status the document lists except 503
(which needs a failing disk), was seen.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate as validate_spec

from daemon import Daemon
from rankd.frontends import openapi, rest
from rankd.frontends.openapi import openapi_document

MiB = 1 << 20
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
#: Documented statuses this module cannot provoke: 503 needs a failing disk;
#: 401, 403 and 429 need credentials and limits (tests/test_security.py).
UNREACHABLE = {"503", "401", "403", "429"}
#: A caller's own standing needs a token with a subject (tests/test_security.py).
NEEDS_CREDENTIALS = {("/v1/me/{board}", "get", "200"), ("/v1/me/{board}", "get", "404")}
#: Answered only by a cluster node (tests/cluster/, which checks the answer's shape).
NEEDS_CLUSTER = {("/v1/cluster", "get", "200"), ("/v1/cluster/summary", "get", "200"),
                 ("/v1/cluster/moves", "post", "202"), ("/v1/cluster/rebalance", "post", "202"),
                 ("/v1/cluster/drain", "post", "202")}


# --- the OpenAPI conformance checker ------------------------------------------------------

@dataclass
class Exchange:
    test: str
    method: str
    path: str
    request: Any
    status: int
    headers: dict[str, str]
    payload: bytes
    checked: bool = False

    @property
    def route(self) -> str:
        return urllib.parse.urlsplit(self.path).path

    def __str__(self) -> str:
        body = self.payload[:300].decode(errors="replace")
        return f"{self.method} {self.path} -> {self.status} {body} (in {self.test})"


@dataclass
class Conformance:
    """Checks exchanges against an OpenAPI document and tracks what was covered."""

    doc: dict[str, Any]
    routes: list[tuple[re.Pattern, str]] = field(init=False)
    seen: set[tuple[str, str, str]] = field(default_factory=set)
    _validators: dict[str, Draft202012Validator] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.routes = [(re.compile("^" + re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(path))
                                   + "$"), path) for path in self.doc["paths"]]

    def operations(self) -> set[tuple[str, str]]:
        return {(path, method) for path, item in self.doc["paths"].items()
                for method in item if method in METHODS}

    def statuses(self) -> set[tuple[str, str, str]]:
        return {(path, method, status) for path, method in self.operations()
                for status in self.doc["paths"][path][method]["responses"]}

    def validator(self, pointer: str) -> Draft202012Validator:
        """A Draft 2020-12 validator of the schema at ``pointer`` in the document."""
        if pointer not in self._validators:
            schema = self.inline(self.resolve(pointer), ())
            Draft202012Validator.check_schema(schema)
            self._validators[pointer] = Draft202012Validator(schema)
        return self._validators[pointer]

    def inline(self, node: Any, trail: tuple[str, ...]) -> Any:
        """``node`` with every ``$ref`` (into this document) replaced by its target.

        A ``$ref`` beside other keywords means both apply (2020-12): ``allOf``.
        Inlined rather than resolved through a registry at each use, which is
        twice as fast on the big batches.
        """
        if isinstance(node, list):
            return [self.inline(item, trail) for item in node]
        if not isinstance(node, dict):
            return node
        if isinstance(node.get("$ref"), str):
            target = node["$ref"]
            assert target.startswith("#/") and target not in trail, f"unsupported $ref {target}"
            resolved = self.inline(self.resolve(target[1:]), (*trail, target))
            others = {key: self.inline(value, trail) for key, value in node.items()
                      if key != "$ref"}
            return {"allOf": [resolved], **others} if others else resolved
        return {key: self.inline(value, trail) for key, value in node.items()}

    def validate(self, pointer: str, instance: Any, what: str) -> None:
        errors = sorted(self.validator(pointer).iter_errors(instance), key=str)
        assert not errors, f"{what} does not match {pointer}:\n" + "\n".join(
            f"- {'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors[:5])

    def response_pointer(self, pointer: str) -> tuple[str, dict[str, Any]]:
        """A response object's pointer and contents, through a ``$ref``."""
        response = self.resolve(pointer)
        if "$ref" in response:
            pointer = response["$ref"].removeprefix("#")
            response = self.resolve(pointer)
        return pointer, response

    def resolve(self, pointer: str) -> Any:
        node: Any = self.doc
        for part in pointer.split("/")[1:]:
            node = node[part.replace("~1", "/").replace("~0", "~")]
        return node

    def check(self, exchange: Exchange) -> None:
        self._check(exchange)
        exchange.checked = True

    def _check(self, exchange: Exchange) -> None:
        method = exchange.method.lower()
        template = next((path for pattern, path in self.routes
                         if pattern.match(exchange.route)), None)
        if template is None:
            assert exchange.status == 404, f"unknown route answered otherwise: {exchange}"
            self.check_body(exchange, "/components/responses/NotFound")
            return
        item = self.doc["paths"][template]
        documented = {m for m in item if m in METHODS}
        if method == "head" and "get" in documented:
            method = "get"  # every GET route answers HEAD too, without a body
        if method not in documented:
            assert exchange.status == 405, f"undocumented method answered otherwise: {exchange}"
            allowed = {m.upper() for m in documented} | ({"HEAD"} if "get" in documented
                                                         else set())
            assert exchange.headers.get("Allow") == ", ".join(sorted(allowed)), str(exchange)
            self.check_body(exchange, "/components/responses/MethodNotAllowed")
            return
        status = str(exchange.status)
        responses = item[method]["responses"]
        assert status in responses, (f"status {status} is not documented for "
                                     f"{method.upper()} {template}: {exchange}")
        self.seen.add((template, method, status))
        escaped = template.replace("~", "~0").replace("/", "~1")
        self.check_body(exchange, f"/paths/{escaped}/{method}/responses/{status}")
        body = item[method].get("requestBody")
        if exchange.status < 300 and body is not None:
            self.check_request(exchange, body, f"/paths/{escaped}/{method}")

    def check_body(self, exchange: Exchange, response_pointer: str) -> None:
        pointer, response = self.response_pointer(response_pointer)
        if exchange.method == "HEAD" or "content" not in response:
            assert exchange.payload == b"", f"expected no body: {exchange}"
            return
        if "text/plain" in response["content"]:  # /metrics
            assert exchange.headers.get("Content-Type", "").startswith("text/plain"), (
                str(exchange))
            return
        assert exchange.headers.get("Content-Type", "").startswith("application/json"), (
            str(exchange))
        self.validate(pointer + "/content/application~1json/schema",
                      json.loads(exchange.payload), str(exchange))

    def check_request(self, exchange: Exchange, body: dict[str, Any], op_pointer: str
                      ) -> None:
        """A request the server accepted must be valid by the document.

        Except that a batch answers each invalid event in its slot: only the
        events it applied must be valid submissions.
        """
        schema_pointer = op_pointer + "/requestBody/content/application~1json/schema"
        if body["content"]["application/json"]["schema"] == {
                "$ref": "#/components/schemas/BatchRequest"}:
            results = json.loads(exchange.payload)["results"]
            events = exchange.request["events"]
            assert len(events) == len(results), str(exchange)
            applied = [event for event, result in zip(events, results, strict=True)
                       if "error" not in result]
            self.validate(schema_pointer, {**exchange.request, "events": applied},
                          f"accepted events of {exchange}")
            return
        self.validate(schema_pointer, exchange.request,
                      f"accepted request body of {exchange}")


EXCHANGES: list[Exchange] = []


def decoded(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw


class Api:
    """HTTP calls to the daemon, each recorded and checked against the document."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.test = "?"
        self.headers: dict[str, str] = {}
        self.conformance: Conformance | None = None

    def __call__(self, method: str, path: str, body: Any = None, *, raw: bytes | None = None,
                 headers: dict[str, str] | None = None, record: bool = True
                 ) -> tuple[int, Any]:
        """One request; ``(status, decoded JSON body or None)``."""
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        request = urllib.request.Request(
            self.daemon.url + path, data=data, method=method,
            headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                status, payload, reply_headers = response.status, response.read(), \
                    response.headers
        except urllib.error.HTTPError as error:
            status, payload, reply_headers = error.code, error.read(), error.headers
        self.headers = dict(reply_headers.items())
        self.last_payload = payload
        sent = None if data is None else decoded(data)  # a copy: callers reuse their lists
        exchange = Exchange(self.test, method, path, sent, status, self.headers, payload)
        if record:
            EXCHANGES.append(exchange)
            if self.conformance is not None:
                self.conformance.check(exchange)
        if not payload or self.headers.get("Content-Type", "").startswith("text/plain"):
            return status, None
        try:
            return status, json.loads(payload)
        except ValueError:
            pytest.fail(f"the answer is not JSON: {exchange}")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    with Daemon(tmp_path_factory.mktemp("rest") / "data") as daemon:
        api = Api(daemon)
        status, doc = api("GET", "/v1/openapi.json")
        assert status == 200
        api.conformance = Conformance(doc)
        api.conformance.check(EXCHANGES[-1])
        yield api


@pytest.fixture
def api(server: Api, request: pytest.FixtureRequest) -> Api:
    server.test = request.node.name
    return server


def name_path(name: str) -> str:
    """A board name as a path segment."""
    return urllib.parse.quote(name, safe="")


def make_board(api: Api, name: str, **config: Any) -> dict[str, Any]:
    status, info = api("PUT", f"/v1/boards/{name}", config)
    assert status == 201, info
    return info


def submit(api: Api, board: str, member: str, **fields: Any) -> dict[str, Any]:
    status, result = api("POST", f"/v1/boards/{board}/scores", {"member": member, **fields})
    assert status == 200, result
    return result


def assert_error(reply: tuple[int, Any], status: int, code: str, match: str = "") -> None:
    got_status, body = reply
    assert (got_status, body["error"]["code"]) == (status, code), body
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}
    assert re.search(match, body["error"]["message"]), body["error"]["message"]


def top(api: Api, board: str, query: str = "") -> dict[str, Any]:
    status, page = api("GET", f"/v1/boards/{board}/top{query}")
    assert status == 200, page
    return page


def members_of(page: dict[str, Any]) -> list[tuple[int, str, float]]:
    return [(e["rank"], e["member"], e["score"]) for e in page["entries"]]


# --- the document and the service ----------------------------------------------------------

def test_openapi_document_is_valid_and_served(api: Api) -> None:
    status, doc = api("GET", "/v1/openapi.json")
    assert status == 200
    validate_spec(doc)
    assert doc["openapi"].startswith("3.1")
    assert doc == json.loads(json.dumps(openapi_document()))
    schemas = doc["components"]["schemas"]
    for name in ("BoardConfig", "BoardInfo", "SubmitRequest", "SubmitResult", "BatchRequest",
                 "BatchResult", "TopPage", "Standing", "AroundPage", "RanksRequest",
                 "RanksResult", "PeriodsResult", "Health", "Error"):
        assert name in schemas
    assert schemas["BoardConfig"]["additionalProperties"] is False
    assert schemas["SubmitRequest"]["additionalProperties"] is False
    # The document's limits are the server's.
    assert openapi.MAX_BODY_BYTES == rest.MAX_BODY_BYTES == MiB
    limit = next(p for p in doc["paths"]["/v1/boards/{board}/top"]["get"]["parameters"]
                 if p["name"] == "limit")["schema"]
    assert (limit["minimum"], limit["maximum"]) == (1, 1000)


def test_health(api: Api) -> None:
    assert api("GET", "/v1/health") == (200, {"status": "ok"})


def test_head_answers_every_get_route_without_a_body(api: Api) -> None:
    make_board(api, "head")
    submit(api, "head", "ann", score=1)
    for path in ("/v1/health", "/v1/openapi.json", "/v1/boards", "/v1/boards/head",
                 "/v1/boards/head/top", "/v1/boards/head/members/ann",
                 "/v1/boards/head/members/ann/around", "/v1/boards/head/periods"):
        assert api("HEAD", path) == (200, None)
    assert api("HEAD", "/v1/boards/nope") == (404, None)


# --- boards ----------------------------------------------------------------------------------

DEFAULTS = {"order": "desc", "policy": "best", "tie_break": "first", "windows": ["all"],
            "retain": 8, "min_score": None, "max_score": None, "max_delta": None, "signed": False,
            "expires_at_ms": None}


def test_board_create_change_get_list_delete(api: Api) -> None:
    status, info = api("PUT", "/v1/boards/life", {})
    assert status == 201
    assert info["name"] == "life" and info["config"] == DEFAULTS
    assert info["members"] == {"all": 0} and info["version"] >= 1
    created = info["version"]  # versions continue from the log position
    assert info["updated_at"] == pytest.approx(time.time(), abs=60)

    # The same config again changes nothing.
    status, again = api("PUT", "/v1/boards/life", {})
    assert status == 200 and again["version"] == created

    config = {"policy": "sum", "windows": ["all", "daily"], "retain": 3, "min_score": 0,
              "max_score": 100.5, "max_delta": 10}
    status, changed = api("PUT", "/v1/boards/life", config)
    assert status == 200 and changed["version"] == created + 1
    assert changed["config"] == {**DEFAULTS, **config, "min_score": 0.0, "max_delta": 10.0}
    assert changed["members"] == {"all": 0, "daily": 0}

    status, got = api("GET", "/v1/boards/life")
    assert status == 200 and got == changed
    status, listing = api("GET", "/v1/boards")
    assert status == 200 and got in listing["boards"]
    names = [b["name"] for b in listing["boards"]]
    assert names == sorted(names)

    assert api("DELETE", "/v1/boards/life") == (204, None)
    assert_error(api("GET", "/v1/boards/life"), 404, "not_found", "life")
    assert_error(api("DELETE", "/v1/boards/life"), 404, "not_found")
    assert_error(api("GET", "/v1/boards/life/top"), 404, "not_found")
    assert "life" not in [b["name"] for b in api("GET", "/v1/boards")[1]["boards"]]
    # A deleted name can be created again, empty.
    status, info = api("PUT", "/v1/boards/life", {})
    assert status == 201 and info["members"] == {"all": 0}


@pytest.mark.parametrize(("config", "match"), [
    ({"colour": "red"}, "unknown board config field.*colour"),
    ({"order": "up"}, "order"),
    ({"policy": "max"}, "policy"),
    ({"tie_break": "random"}, "tie_break"),
    ({"windows": []}, "windows"),
    ({"windows": "all"}, "windows"),
    ({"windows": ["yearly"]}, "yearly"),
    ({"windows": ["all", "all"]}, "repeat"),
    ({"retain": -1}, "retain"),
    ({"retain": 1001}, "retain"),
    ({"retain": True}, "retain"),
    ({"retain": 2.5}, "retain"),
    ({"min_score": "0"}, "min_score"),
    ({"max_delta": 0}, "max_delta"),
    ({"min_score": 5, "max_score": 1}, "min_score"),
    ([], "object"),
    (None, "object"),
])
def test_board_config_is_validated(api: Api, config: Any, match: str) -> None:
    raw = json.dumps(config).encode()
    assert_error(api("PUT", "/v1/boards/badconfig", raw=raw), 422, "invalid", match)
    assert_error(api("GET", "/v1/boards/badconfig"), 404, "not_found")


@pytest.mark.parametrize("name", ["%2E", "%2E%2E", "x" * 513, "%C3%A9" * 257, "a%0Ab",
                                  "a%7Fb", "a%E2%80%8Bb", "a%C2%85b"])
def test_bad_board_name(api: Api, name: str) -> None:
    assert_error(api("PUT", f"/v1/boards/{name}", {}), 422, "invalid", "board name")
    assert_error(api("GET", f"/v1/boards/{name}"), 404, "not_found")


def test_an_integral_retain_may_be_written_as_a_json_number(api: Api) -> None:
    """JSON Schema (the OpenAPI document's) counts ``110.0`` an integer."""
    assert api("PUT", "/v1/boards/retained", raw=b'{"retain": 110.0}')[0] == 201
    assert api("GET", "/v1/boards/retained")[1]["config"]["retain"] == 110


def test_valid_board_names(api: Api) -> None:
    """Any key Redis users write (hash tags, slashes, spaces, accents, up to
    512 bytes), percent-encoded in the path, names the board it spells."""
    for name in ("A-z_0.9:x", "x" * 512, "é" * 256, "{user:1}:daily", "a/b", "../x", "a b",
                 "100%", "q?x=1#f", "...", "名前", "'\"<>&*!~+,;=@$"):
        quoted = urllib.parse.quote(name, safe="")
        status, info = api("PUT", f"/v1/boards/{quoted}", {"policy": "latest"})
        assert status == 201 and info["name"] == name, (name, info)
        assert submit(api, name_path(name), "ann", score=1)["rank"] == 1
        status, top = api("GET", f"/v1/boards/{quoted}/top")
        assert status == 200 and top["entries"][0]["member"] == "ann", top
        assert name in [b["name"] for b in api("GET", "/v1/boards")[1]["boards"]]
        assert api("DELETE", f"/v1/boards/{quoted}")[0] == 204, name


def test_order_cannot_change_once_a_board_has_members(api: Api) -> None:
    make_board(api, "ordered")
    # Without members any change is fine.
    assert api("PUT", "/v1/boards/ordered", {"order": "asc"})[0] == 200
    submit(api, "ordered", "ann", score=1)
    assert_error(api("PUT", "/v1/boards/ordered", {"order": "desc"}), 409, "conflict")
    assert_error(api("PUT", "/v1/boards/ordered", {"order": "asc", "tie_break": "member"}),
                 409, "conflict")
    # Other fields still change (a new policy only when told it may).
    status, info = api("PUT", "/v1/boards/ordered?discard=true",
                       {"order": "asc", "policy": "latest"})
    assert status == 200 and info["config"]["policy"] == "latest"


def test_a_change_that_would_lose_data_is_refused_unless_asked_for(api: Api) -> None:
    """A shorter PUT body once dropped windows with their scores, and could
    turn a sum board into a best one under live data, without a word."""
    make_board(api, "keep", policy="sum", windows=["all", "daily", "weekly"])
    submit(api, "keep", "ann", delta=5)
    before = api("GET", "/v1/boards/keep")[1]
    for body, lost in (({"policy": "sum"}, "window 'daily'"),
                       ({"policy": "best", "windows": ["all", "daily", "weekly"]}, "policy"),
                       ({"policy": "sum", "windows": ["all", "weekly"]}, "window 'daily'")):
        assert_error(api("PUT", "/v1/boards/keep", body), 409, "conflict", lost)
    assert api("GET", "/v1/boards/keep")[1] == before
    assert top(api, "keep", "?window=daily")["entries"][0]["score"] == 5
    # PATCH changes only what it names.
    status, info = api("PATCH", "/v1/boards/keep", {"max_score": 100})
    assert status == 200 and info["config"]["windows"] == ["all", "daily", "weekly"]
    assert info["config"]["policy"] == "sum" and info["config"]["max_score"] == 100
    assert_error(api("PATCH", "/v1/boards/keep", {"windows": ["all"]}), 409, "conflict",
                 "weekly")
    assert_error(api("PATCH", "/v1/boards/keep?discard=maybe", {"windows": ["all"]}), 400,
                 "bad_request", "discard")
    # PATCH of a board that does not exist yet creates it.
    status, info = api("PATCH", "/v1/boards/patched-new", {"policy": "latest"})
    assert status == 201 and info["config"]["policy"] == "latest"
    assert_error(api("PATCH", "/v1/boards/patched-new", {"policy": 3}), 422, "invalid")
    # Asked for explicitly, it goes ahead.
    status, info = api("PATCH", "/v1/boards/keep?discard=true", {"windows": ["all"]})
    assert status == 200 and info["config"]["windows"] == ["all"]
    assert_error(api("GET", "/v1/boards/keep/top?window=daily"), 404, "not_found")
    assert top(api, "keep")["entries"][0]["score"] == 5


# --- submissions -----------------------------------------------------------------------------

def test_submit_best(api: Api) -> None:
    make_board(api, "best")
    assert submit(api, "best", "ann", score=10) == {
        "member": "ann", "score": 10.0, "rank": 1, "previous": None, "changed": True,
        "duplicate": False, "event_id": None}
    result = submit(api, "best", "ann", score=5)
    assert (result["score"], result["previous"], result["changed"]) == (10.0, 10.0, False)
    result = submit(api, "best", "ann", score=12.5)
    assert (result["score"], result["previous"], result["changed"]) == (12.5, 10.0, True)
    assert submit(api, "best", "bob", score=20)["rank"] == 1
    assert members_of(top(api, "best")) == [(1, "bob", 20.0), (2, "ann", 12.5)]
    assert_error(api("POST", "/v1/boards/best/scores", {"member": "ann", "delta": 1}),
                 422, "invalid", "score")


def test_submit_best_ascending(api: Api) -> None:
    make_board(api, "race", order="asc")
    submit(api, "race", "ann", score=61.2)
    assert submit(api, "race", "ann", score=70)["score"] == 61.2
    assert submit(api, "race", "ann", score=59.9)["score"] == 59.9
    submit(api, "race", "bob", score=65)
    assert members_of(top(api, "race")) == [(1, "ann", 59.9), (2, "bob", 65.0)]


def test_submit_latest(api: Api) -> None:
    make_board(api, "latest", policy="latest")
    submit(api, "latest", "ann", score=10)
    result = submit(api, "latest", "ann", score=3)
    assert (result["score"], result["previous"], result["changed"]) == (3.0, 10.0, True)
    assert submit(api, "latest", "ann", score=3)["changed"] is False


def test_submit_sum(api: Api) -> None:
    make_board(api, "sum", policy="sum", max_delta=10)
    assert submit(api, "sum", "ann", delta=3)["score"] == 3.0
    result = submit(api, "sum", "ann", delta=-1.5)
    assert (result["score"], result["previous"]) == (1.5, 3.0)
    assert submit(api, "sum", "bob", delta=0)["score"] == 0.0
    assert_error(api("POST", "/v1/boards/sum/scores", {"member": "ann", "delta": 11}),
                 422, "guard", "max_delta")
    assert_error(api("POST", "/v1/boards/sum/scores", {"member": "ann", "score": 1}),
                 422, "invalid", "delta")
    assert_error(api("POST", "/v1/boards/sum/scores",
                     {"member": "ann", "score": 1, "delta": 1}), 422, "invalid")
    assert members_of(top(api, "sum")) == [(1, "ann", 1.5), (2, "bob", 0.0)]


def test_score_guards(api: Api) -> None:
    make_board(api, "guarded", policy="latest", min_score=0, max_score=100, max_delta=50)
    submit(api, "guarded", "ann", score=40)
    assert_error(api("POST", "/v1/boards/guarded/scores", {"member": "ann", "score": -1}),
                 422, "guard", "min_score")
    assert_error(api("POST", "/v1/boards/guarded/scores", {"member": "bob", "score": 101}),
                 422, "guard", "max_score")
    assert_error(api("POST", "/v1/boards/guarded/scores", {"member": "ann", "score": 95}),
                 422, "guard", "max_delta")
    assert submit(api, "guarded", "ann", score=90)["score"] == 90.0


def test_labels_show_in_reads(api: Api) -> None:
    make_board(api, "labels")
    submit(api, "labels", "ann", score=1, label="Ann the Great")
    submit(api, "labels", "bob", score=2)
    assert [e["label"] for e in top(api, "labels")["entries"]] == [None, "Ann the Great"]
    assert api("GET", "/v1/boards/labels/members/ann")[1]["label"] == "Ann the Great"
    assert_error(api("POST", "/v1/boards/labels/scores",
                     {"member": "ann", "score": 1, "label": "x" * 65}), 422, "invalid", "label")


@pytest.mark.parametrize(("event", "match"), [
    ({"member": "ann", "score": 1, "colour": "red"}, "unknown submission field.*colour"),
    ({"score": 1}, "member"),
    ({"member": "", "score": 1}, "member"),
    ({"member": 5, "score": 1}, "member"),
    ({"member": "x" * 257, "score": 1}, "member"),
    ({"member": "ann", "score": "1"}, "score"),
    ({"member": "ann", "score": True}, "score"),
    ({"member": "ann", "score": 2**60}, "2\\*\\*53"),
    ({"member": "ann"}, "score"),
    ({"member": "ann", "score": 1, "ts": time.time() + 3600}, "ts"),
    ({"member": "ann", "score": 1, "ts": "now"}, "ts"),
    ({"member": "ann", "score": 1, "event_id": ""}, "event_id"),
    ({"member": "ann", "score": 1, "event_id": "e" * 129}, "event_id"),
    ({"member": "ann", "score": 1, "label": 7}, "label"),
    ([{"member": "ann", "score": 1}], "object"),
])
def test_bad_submissions(api: Api, event: Any, match: str) -> None:
    api("PUT", "/v1/boards/strict", {})
    assert_error(api("POST", "/v1/boards/strict/scores", event), 422, "invalid", match)
    assert top(api, "strict")["total"] == 0


def test_submit_to_a_missing_board(api: Api) -> None:
    assert_error(api("POST", "/v1/boards/nowhere/scores", {"member": "ann", "score": 1}),
                 404, "not_found", "nowhere")


def test_submit_with_timestamp(api: Api) -> None:
    make_board(api, "stamped", windows=["all", "daily"])
    now = time.time()
    assert submit(api, "stamped", "ann", score=1, ts=now - 10)["changed"] is True
    assert submit(api, "stamped", "bob", score=2, ts=int(now))["changed"] is True


def test_duplicate_event_id(api: Api) -> None:
    make_board(api, "dedupe", policy="sum")
    first = submit(api, "dedupe", "ann", delta=5, event_id="match-1")
    assert first["duplicate"] is False and first["event_id"] == "match-1"
    version = api("GET", "/v1/boards/dedupe")[1]["version"]
    again = submit(api, "dedupe", "ann", delta=5, event_id="match-1")
    assert again == {**first, "duplicate": True}
    assert api("GET", "/v1/boards/dedupe")[1]["version"] == version
    assert api("GET", "/v1/boards/dedupe/members/ann")[1]["score"] == 5.0
    # Inside one batch too, and against earlier events.
    status, body = api("POST", "/v1/boards/dedupe/scores/batch", {"events": [
        {"member": "ann", "delta": 1, "event_id": "match-2"},
        {"member": "ann", "delta": 1, "event_id": "match-2"},
        {"member": "ann", "delta": 5, "event_id": "match-1"},
        {"member": "ann", "delta": 1, "event_id": "match-1"},  # not a retry of match-1
    ]})
    assert status == 200
    results = body["results"]
    assert [r["duplicate"] for r in results[:3]] == [False, True, True]
    assert [r["score"] for r in results[:3]] == [6.0, 6.0, 5.0]
    assert results[3]["error"]["code"] == "event_conflict"
    assert api("GET", "/v1/boards/dedupe/members/ann")[1]["score"] == 6.0


# --- batches ---------------------------------------------------------------------------------

def test_batch_with_bad_events_inline(api: Api) -> None:
    make_board(api, "batch", max_score=100)
    events = [
        {"member": "ann", "score": 10},
        {"member": "bob", "score": 20, "colour": "red"},
        {"member": "cat", "score": 30},
        "not an event",
        {"member": "dan", "score": 1000},
        {"member": "eve", "delta": 1},
        {"member": "ann", "score": 40, "label": "Ann"},
    ]
    status, body = api("POST", "/v1/boards/batch/scores/batch", {"events": events})
    assert status == 200
    results = body["results"]
    assert len(results) == len(events)
    assert [r.get("error", {}).get("code") for r in results] == [
        None, "invalid", None, "invalid", "guard", "invalid", None]
    assert "colour" in results[1]["error"]["message"]
    assert (results[0]["rank"], results[2]["rank"]) == (1, 1)
    assert results[6] == {"member": "ann", "score": 40.0, "rank": 1, "previous": 10.0,
                          "changed": True, "duplicate": False, "event_id": None}
    assert members_of(top(api, "batch")) == [(1, "ann", 40.0), (2, "cat", 30.0)]


def test_batch_to_a_missing_board_errs_per_event(api: Api) -> None:
    status, body = api("POST", "/v1/boards/nobatch/scores/batch",
                       {"events": [{"member": "ann", "score": 1}]})
    assert status == 200
    assert body["results"][0]["error"]["code"] == "not_found"


def test_empty_batch(api: Api) -> None:
    make_board(api, "emptybatch")
    assert api("POST", "/v1/boards/emptybatch/scores/batch", {"events": []}) == (
        200, {"results": []})


@pytest.mark.parametrize("body", [
    [], {"events": "x"}, {"events": {}}, {}, {"events": [], "more": 1}, {"event": []}])
def test_batch_envelope_is_checked(api: Api, body: Any) -> None:
    api("PUT", "/v1/boards/envelope", {})
    assert_error(api("POST", "/v1/boards/envelope/scores/batch", body), 422, "invalid",
                 "events")
    assert top(api, "envelope")["total"] == 0


def test_batch_size_limit(api: Api) -> None:
    make_board(api, "bigbatch", policy="sum")
    events = [{"member": f"m{i}", "delta": 1} for i in range(10_000)]
    status, body = api("POST", "/v1/boards/bigbatch/scores/batch", {"events": events})
    assert status == 200 and len(body["results"]) == 10_000
    assert top(api, "bigbatch")["total"] == 10_000
    events.append({"member": "one-too-many", "delta": 1})
    assert_error(api("POST", "/v1/boards/bigbatch/scores/batch", {"events": events}),
                 413, "too_large", "10000")
    status, page = api("GET", "/v1/boards/bigbatch/top?limit=1")
    assert page["total"] == 10_000 and page["entries"][0]["score"] == 1.0


# --- malformed requests (every route that reads a body) -------------------------------------

BODY_ROUTES = [
    ("PUT", "/v1/boards/bodies", {}),
    ("PATCH", "/v1/boards/bodies", {"retain": 8}),
    ("POST", "/v1/boards/bodies/scores", {"member": "ann", "score": 1}),
    ("POST", "/v1/boards/bodies/scores/batch", {"events": [{"member": "ann", "score": 1}]}),
    ("POST", "/v1/boards/bodies/ranks", {"members": ["ann"]}),
]


@pytest.fixture
def bodies(api: Api) -> Api:
    api("PUT", "/v1/boards/bodies", {})
    return api


@pytest.mark.parametrize(("method", "path", "body"), BODY_ROUTES)
def test_body_routes_accept_json(bodies: Api, method: str, path: str, body: Any) -> None:
    assert bodies(method, path, body)[0] == 200
    for content_type in ("application/vnd.x+json", "application/json; charset=utf-8"):
        assert bodies(method, path, body, headers={"Content-Type": content_type})[0] == 200


@pytest.mark.parametrize(("method", "path", "body"), BODY_ROUTES)
def test_body_over_one_mib(bodies: Api, method: str, path: str, body: Any) -> None:
    raw = json.dumps({"padding": "x" * MiB}).encode()
    assert_error(bodies(method, path, raw=raw), 413, "too_large", str(MiB))


@pytest.mark.parametrize(("method", "path", "body"), BODY_ROUTES)
@pytest.mark.parametrize("raw", [b"{not json", b"", b'{"member": "ann"', b"\xff\xfe"])
def test_body_not_json(bodies: Api, method: str, path: str, body: Any, raw: bytes) -> None:
    assert_error(bodies(method, path, raw=raw), 400, "bad_request", "not valid JSON")


@pytest.mark.parametrize(("method", "path", "body"), BODY_ROUTES)
@pytest.mark.parametrize("content_type", [
    # What a page on any site can make a browser send without asking rankd
    # first (the first three), and no type at all (what fetch() sends for a
    # bare byte buffer): a cross-site write once they were read as JSON.
    "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
    "application/octet-stream", "application/xml"])
def test_body_wrong_content_type(bodies: Api, method: str, path: str, body: Any,
                                 content_type: str) -> None:
    reply = bodies(method, path, body, headers={"Content-Type": content_type})
    assert_error(reply, 415, "unsupported_media_type", content_type.split(";")[0])


# --- query parameters -------------------------------------------------------------------------

QUERY_ROUTES = [
    ("GET", "/v1/openapi.json"),
    ("GET", "/v1/boards"),
    ("PUT", "/v1/boards/queries"),
    ("GET", "/v1/boards/queries"),
    ("DELETE", "/v1/boards/queries"),
    ("POST", "/v1/boards/queries/scores"),
    ("POST", "/v1/boards/queries/scores/batch"),
    ("GET", "/v1/boards/queries/top"),
    ("GET", "/v1/boards/queries/members/ann"),
    ("DELETE", "/v1/boards/queries/members/ann"),
    ("GET", "/v1/boards/queries/members/ann/around"),
    ("POST", "/v1/boards/queries/ranks"),
    ("GET", "/v1/boards/queries/periods"),
]


@pytest.mark.parametrize(("method", "path"), QUERY_ROUTES)
def test_unknown_query_parameter(api: Api, method: str, path: str) -> None:
    api("PUT", "/v1/boards/queries", {})
    body = {"member": "ann", "score": 1} if path.endswith("scores") else {}
    assert_error(api(method, f"{path}?colour=red", body), 400, "bad_request", "colour")
    assert api("GET", "/v1/boards/queries")[0] == 200  # nothing happened


@pytest.mark.parametrize("query", [
    "limit=5&limit=6", "limit=ten", "offset=1.5", "limit=", "window=", "period=",
    "window=all&Window=all"])
def test_malformed_query(api: Api, query: str) -> None:
    api("PUT", "/v1/boards/queries", {})
    assert_error(api("GET", f"/v1/boards/queries/top?{query}"), 400, "bad_request")


@pytest.mark.parametrize("query", [
    "limit=0", "limit=1001", "limit=-1", "offset=-1", f"offset={2**31 + 1}"])
def test_top_limits(api: Api, query: str) -> None:
    api("PUT", "/v1/boards/queries", {})
    name = query.split("=")[0]
    assert_error(api("GET", f"/v1/boards/queries/top?{query}"), 422, "invalid", name)


@pytest.mark.parametrize("query", ["above=101", "below=101", "above=-1", "below=-1"])
def test_around_limits(api: Api, query: str) -> None:
    api("PUT", "/v1/boards/aroundlimits", {})
    submit(api, "aroundlimits", "ann", score=1)
    path = f"/v1/boards/aroundlimits/members/ann/around?{query}"
    assert_error(api("GET", path), 422, "invalid", query.split("=")[0])


# --- reads --------------------------------------------------------------------------------------

def test_top_pagination(api: Api) -> None:
    make_board(api, "pages")
    events = [{"member": f"p{i:02d}", "score": i} for i in range(25)]
    assert api("POST", "/v1/boards/pages/scores/batch", {"events": events})[0] == 200
    default = top(api, "pages")
    assert len(default["entries"]) == 10 and default["total"] == 25
    assert (default["window"], default["period"]) == ("all", "all")
    seen = []
    for offset in (0, 10, 20):
        page = top(api, "pages", f"?limit=10&offset={offset}")
        seen += members_of(page)
    assert seen == [(rank, f"p{25 - rank:02d}", 25.0 - rank) for rank in range(1, 26)]
    assert top(api, "pages", "?offset=25")["entries"] == []
    assert top(api, "pages", f"?offset={2**31}&limit=1000")["entries"] == []
    assert len(top(api, "pages", "?limit=1000")["entries"]) == 25
    assert members_of(top(api, "pages", "?limit=2&offset=23")) == [(24, "p01", 1.0),
                                                                   (25, "p00", 0.0)]
    # A write shows in the next read (no stale page from the cache).
    version = default["version"]
    submit(api, "pages", "p00", score=100)
    page = top(api, "pages", "?limit=1")
    assert members_of(page) == [(1, "p00", 100.0)] and page["version"] == version + 1


def test_member_standing_with_ties(api: Api) -> None:
    make_board(api, "ties")
    for member, score in (("ann", 10), ("bob", 10), ("cat", 5), ("dan", 1)):
        submit(api, "ties", member, score=score)
    status, standing = api("GET", "/v1/boards/ties/members/bob")
    assert status == 200
    assert standing == {"member": "bob", "score": 10.0, "rank": 2, "competition_rank": 1,
                        "dense_rank": 1, "percentile": 100.0, "total": 4, "label": None,
                        "window": "all", "period": "all", "version": standing["version"]}
    status, standing = api("GET", "/v1/boards/ties/members/cat")
    assert (standing["rank"], standing["competition_rank"], standing["dense_rank"]) == (3, 3, 2)
    assert standing["percentile"] == 50.0
    assert_error(api("GET", "/v1/boards/ties/members/zed"), 404, "not_found", "zed")
    assert_error(api("GET", "/v1/boards/noties/members/ann"), 404, "not_found", "noties")
    assert_error(api("GET", "/v1/boards/ties/members/" + "x" * 257), 422, "invalid", "member")
    # tie_break=member orders ties by name.
    make_board(api, "byname", tie_break="member")
    submit(api, "byname", "zed", score=1)
    submit(api, "byname", "amy", score=1)
    assert members_of(top(api, "byname")) == [(1, "amy", 1.0), (2, "zed", 1.0)]


def test_member_names_are_percent_decoded(api: Api) -> None:
    make_board(api, "unicode")
    submit(api, "unicode", "zoë / ann", score=3)
    path = "/v1/boards/unicode/members/" + urllib.parse.quote("zoë / ann", safe="")
    status, standing = api("GET", path)
    assert status == 200 and standing["member"] == "zoë / ann"


def test_around(api: Api) -> None:
    make_board(api, "around")
    events = [{"member": f"a{i}", "score": 10 - i} for i in range(10)]  # a0 first ... a9 last
    api("POST", "/v1/boards/around/scores/batch", {"events": events})
    status, page = api("GET", "/v1/boards/around/members/a5/around")
    assert status == 200
    assert [e["rank"] for e in page["entries"]] == [2, 3, 4, 5, 6, 7, 8, 9, 10]
    status, page = api("GET", "/v1/boards/around/members/a5/around?above=1&below=2")
    assert members_of(page) == [(5, "a4", 6.0), (6, "a5", 5.0), (7, "a6", 4.0), (8, "a7", 3.0)]
    status, page = api("GET", "/v1/boards/around/members/a0/around?above=100&below=0")
    assert members_of(page) == [(1, "a0", 10.0)]
    status, page = api("GET", "/v1/boards/around/members/a9/around?above=0&below=100")
    assert members_of(page) == [(10, "a9", 1.0)]
    assert_error(api("GET", "/v1/boards/around/members/zed/around"), 404, "not_found")
    assert_error(api("GET", "/v1/boards/noaround/members/a1/around"), 404, "not_found")
    assert_error(api("GET", "/v1/boards/around/members/a1/around?window=hourly"),
                 422, "invalid", "hourly")


def test_ranks_friends_list(api: Api) -> None:
    make_board(api, "friends")
    for i in range(10):
        submit(api, "friends", f"f{i}", score=i, label=f"F{i}" if i == 7 else None)
    members = ["f2", "ghost", "f7", "f2", "f5", "nobody"]
    status, body = api("POST", "/v1/boards/friends/ranks", {"members": members})
    assert status == 200
    assert body == {
        "entries": [
            {"rank": 3, "list_rank": 1, "member": "f7", "score": 7.0, "label": "F7"},
            {"rank": 5, "list_rank": 2, "member": "f5", "score": 5.0, "label": None},
            {"rank": 8, "list_rank": 3, "member": "f2", "score": 2.0, "label": None},
        ],
        "missing": ["ghost", "nobody"], "window": "all", "period": "all"}
    assert api("POST", "/v1/boards/friends/ranks", {"members": []})[1]["entries"] == []


def test_ranks_limits_and_errors(api: Api) -> None:
    make_board(api, "manyfriends")
    members = [f"m{i}" for i in range(1000)]
    status, body = api("POST", "/v1/boards/manyfriends/ranks", {"members": members})
    assert status == 200 and len(body["missing"]) == 1000
    assert_error(api("POST", "/v1/boards/manyfriends/ranks", {"members": [*members, "x"]}),
                 413, "too_large", "1000")
    for bad in ({"members": "f1"}, {"members": [1]}, {"members": [""]}, {}, [],
                {"members": [], "window": "all"}):
        assert_error(api("POST", "/v1/boards/manyfriends/ranks", bad), 422, "invalid")
    assert_error(api("POST", "/v1/boards/nofriends/ranks", {"members": ["a"]}),
                 404, "not_found")
    assert_error(api("POST", "/v1/boards/manyfriends/ranks?window=daily", {"members": []}),
                 404, "not_found", "daily")


def test_remove_member(api: Api) -> None:
    make_board(api, "removal", windows=["all", "weekly"])
    submit(api, "removal", "ann", score=2, label="Ann")
    submit(api, "removal", "bob", score=1)
    assert api("DELETE", "/v1/boards/removal/members/ann") == (204, None)
    assert members_of(top(api, "removal")) == [(1, "bob", 1.0)]
    assert members_of(top(api, "removal", "?window=weekly")) == [(1, "bob", 1.0)]
    assert_error(api("GET", "/v1/boards/removal/members/ann"), 404, "not_found")
    assert_error(api("DELETE", "/v1/boards/removal/members/ann"), 404, "not_found", "ann")
    assert_error(api("DELETE", "/v1/boards/noremoval/members/ann"), 404, "not_found")
    assert_error(api("DELETE", "/v1/boards/removal/members/" + "x" * 257), 422, "invalid")
    # Back again, without the old label.
    submit(api, "removal", "ann", score=0)
    assert api("GET", "/v1/boards/removal/members/ann")[1]["label"] is None


def current_periods() -> dict[str, str]:
    day = datetime.now(UTC).date()
    year, week, _ = day.isocalendar()
    return {"all": "all", "daily": day.isoformat(), "weekly": f"{year:04d}-W{week:02d}",
            "monthly": f"{day.year:04d}-{day.month:02d}"}


def test_windows_and_periods(api: Api) -> None:
    make_board(api, "windows", windows=["daily", "weekly", "monthly", "all"], retain=2)
    submit(api, "windows", "ann", score=5)
    expected = current_periods()
    if api("GET", "/v1/boards/windows/periods?window=daily")[1]["current"] != \
            expected["daily"]:
        pytest.skip("crossed midnight UTC during the test")
    for window, period in expected.items():
        status, body = api("GET", f"/v1/boards/windows/periods?window={window}")
        assert status == 200 and body == {"window": window, "current": period, "retained": []}
        page = top(api, "windows", f"?window={window}")
        assert (page["window"], page["period"], page["total"]) == (window, period, 1)
        page = top(api, "windows", f"?window={window}&period={period}")
        assert members_of(page) == [(1, "ann", 5.0)]
        status, standing = api("GET", f"/v1/boards/windows/members/ann?window={window}")
        assert (standing["window"], standing["period"]) == (window, period)
    # The primary window is "all" whenever the board keeps it.
    assert api("GET", "/v1/boards/windows/periods")[1]["window"] == "all"
    info = api("GET", "/v1/boards/windows")[1]
    assert info["members"] == {"daily": 1, "weekly": 1, "monthly": 1, "all": 1}
    # Past periods that were never recorded are not retained; malformed ones are invalid.
    for query in ("window=daily&period=2020-01-01", "window=weekly&period=2020-W01",
                  "window=monthly&period=2020-01"):
        assert_error(api("GET", f"/v1/boards/windows/top?{query}"), 404, "not_found",
                     "not retained")
    for query in ("window=daily&period=2020-13-01", "window=weekly&period=2020-01",
                  "window=monthly&period=yesterday", "window=all&period=2020"):
        assert_error(api("GET", f"/v1/boards/windows/top?{query}"), 422, "invalid")
    assert_error(api("GET", "/v1/boards/windows/periods?window=yearly"), 422, "invalid")
    assert_error(api("GET", "/v1/boards/nowindows/periods"), 404, "not_found")


def test_primary_window_without_all(api: Api) -> None:
    make_board(api, "weekly", windows=["weekly", "daily"])
    result = submit(api, "weekly", "ann", score=1)
    assert result["rank"] == 1
    page = top(api, "weekly")
    assert (page["window"], page["period"]) == ("weekly", current_periods()["weekly"])
    assert_error(api("GET", "/v1/boards/weekly/top?window=all"), 404, "not_found", "all")
    assert_error(api("GET", "/v1/boards/weekly/periods?window=monthly"), 404, "not_found")


def test_empty_board_reads(api: Api) -> None:
    make_board(api, "empty", windows=["all", "monthly"])
    created = api("GET", "/v1/boards/empty")[1]["version"]
    page = top(api, "empty")
    assert (page["entries"], page["total"], page["version"]) == ([], 0, created)
    assert top(api, "empty", "?window=monthly")["total"] == 0
    assert_error(api("GET", "/v1/boards/empty/members/ann"), 404, "not_found")
    assert_error(api("GET", "/v1/boards/empty/members/ann/around"), 404, "not_found")
    assert api("POST", "/v1/boards/empty/ranks", {"members": ["ann"]})[1]["missing"] == ["ann"]


# --- routing ------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", [
    "/v1", "/v1/", "/v1/nope", "/v2/boards", "/v1/boards/", "/v1/boards/x/unknown",
    "/v1/boards/x/members/", "/v1/boards/x/members/a/b", "/v1/health/"])
def test_unknown_route(api: Api, path: str) -> None:
    assert_error(api("GET", path), 404, "not_found", "no route")
    assert_error(api("POST", path, {}), 404, "not_found")


@pytest.mark.parametrize(("method", "path", "allow"), [
    ("POST", "/v1/health", "GET, HEAD"),
    ("DELETE", "/v1/openapi.json", "GET, HEAD"),
    ("POST", "/v1/boards", "GET, HEAD"),
    ("POST", "/v1/boards/x", "DELETE, GET, HEAD, PATCH, PUT"),
    ("GET", "/v1/boards/x/scores", "POST"),
    ("PUT", "/v1/boards/x/scores/batch", "POST"),
    ("POST", "/v1/boards/x/top", "GET, HEAD"),
    ("PUT", "/v1/boards/x/members/a", "DELETE, GET, HEAD"),
    ("DELETE", "/v1/boards/x/members/a/around", "GET, HEAD"),
    ("GET", "/v1/boards/x/ranks", "POST"),
    ("POST", "/v1/boards/x/periods", "GET, HEAD"),
])
def test_wrong_method(api: Api, method: str, path: str, allow: str) -> None:
    assert_error(api(method, path, {}), 405, "method_not_allowed", method)
    assert api.headers["Allow"] == allow


# --- regressions ------------------------------------------------------------------------------

def test_top_after_board_recreated(api: Api) -> None:
    make_board(api, "reborn")
    submit(api, "reborn", "old", score=5)
    assert members_of(top(api, "reborn")) == [(1, "old", 5.0)]
    assert api("DELETE", "/v1/boards/reborn")[0] == 204
    make_board(api, "reborn")
    submit(api, "reborn", "new", score=7)
    assert members_of(top(api, "reborn")) == [(1, "new", 7.0)]


def test_an_event_id_reused_for_another_submission_is_a_conflict(api: Api) -> None:
    """It was answered with the first one's result, marked duplicate, and
    never applied: a client that reused ids lost scores without a word."""
    from rankd.client import Client, EventConflict

    make_board(api, "dupmember")
    first = submit(api, "dupmember", "ann", score=5, event_id="e1", label="Ann")
    for other in ({"member": "bob", "score": 5}, {"member": "ann", "score": 9},
                  {"member": "ann", "score": 5, "label": "Someone"},
                  {"member": "ann", "score": 5}):
        assert_error(api("POST", "/v1/boards/dupmember/scores", {**other, "event_id": "e1"}),
                     409, "event_conflict", "e1")
    with Client("127.0.0.1", api.daemon.tcp_port) as client, \
            pytest.raises(EventConflict, match="already used"):
        client.submit("dupmember", "bob", score=9, event_id="e1")
    assert top(api, "dupmember")["total"] == 1
    # An exact retry (a later ts is still the same event) gets the first answer.
    again = submit(api, "dupmember", "ann", score=5, event_id="e1", label="Ann")
    assert again == {**first, "duplicate": True}


def test_health_refuses_unknown_query_parameter(api: Api) -> None:
    reply = api("GET", "/v1/health?colour=red")
    assert_error(reply, 400, "bad_request", "colour")


# --- endpoints for credentials and operators ---------------------------------------------------

def test_me_needs_a_token_subject(api: Api) -> None:
    make_board(api, "mine")
    assert_error(api("GET", "/v1/me/mine"), 422, "invalid", "authentication")
    assert_error(api("GET", "/v1/me/mine?colour=red"), 400, "bad_request")


def test_ready_metrics_and_snapshot(api: Api) -> None:
    status, ready = api("GET", "/v1/ready")
    assert status == 200 and ready == {"ready": True, "degraded": {},
                                       "checks": {"recovered": True, "listening": True,
                                                  "wal_writable": True}}
    make_board(api, "metered")
    submit(api, "metered", "ann", score=3)
    status, info = api("POST", "/v1/admin/snapshot")
    assert status == 200 and info["bytes"] > 0 and info["path"].endswith(".snap")
    status, _ = api("GET", "/metrics")
    assert status == 200
    text = api.last_payload.decode()
    for name in ("rankd_submissions_total{outcome=\"applied\"}", "rankd_wal_appends_total",
                 "rankd_wal_fsyncs_total", "rankd_snapshot_bytes", "rankd_live_subscribers",
                 "rankd_tcp_connections", "rankd_process_rss_bytes",
                 'rankd_board_members{board="metered",window="all"} 1.0',
                 'rankd_http_requests_total{operation="submit",status="200"}',
                 "rankd_http_request_seconds_bucket"):
        assert name in text, name
    for bad in ("/v1/ready?x=1", "/metrics?x=1"):
        assert_error(api("GET", bad), 400, "bad_request")
    assert_error(api("POST", "/v1/admin/snapshot?x=1"), 400, "bad_request")


def test_request_metrics_count_every_observation() -> None:
    from rankd.metrics import Metrics

    metrics = Metrics()
    for status in (200, 200, 404):
        metrics.observe_request("submit", status, 0.002)
    metrics.observe_request("top", 200, 0.0004)
    text = metrics.render().decode()
    assert 'rankd_http_requests_total{operation="submit",status="200"} 2.0' in text
    assert 'rankd_http_requests_total{operation="submit",status="404"} 1.0' in text
    assert 'rankd_http_requests_total{operation="top",status="200"} 1.0' in text
    assert 'rankd_http_request_seconds_count{operation="submit"} 3.0' in text
    assert 'rankd_http_request_seconds_bucket{le="0.0005",operation="top"} 1.0' in text


def test_realtime_token_and_digest(api: Api) -> None:
    status, body = api("GET", "/v1/realtime/token")
    assert status == 200 and body["expires_in"] == 60 and body["token"].count(".") == 2
    assert_error(api("GET", "/v1/realtime/token?x=1"), 400, "bad_request")
    assert_error(api("GET", "/v1/admin/digest?x=1"), 400, "bad_request")
    before = api("GET", "/v1/admin/digest")[1]["digest"]
    make_board(api, "digested")
    submit(api, "digested", "ann", score=1)
    after = api("GET", "/v1/admin/digest")[1]["digest"]
    assert before != after and api("GET", "/v1/admin/digest")[1]["digest"] == after


def test_a_single_node_says_it_is_no_cluster(api: Api) -> None:
    for path in ("/v1/cluster", "/v1/cluster/summary"):
        assert_error(api("GET", path), 404, "not_found", "single node")
        assert_error(api("GET", f"{path}?x=1"), 400, "bad_request")


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/cluster/moves", {"group": 3, "node": "n1"}), ("/v1/cluster/drain", {"node": "n1"})])
def test_a_single_node_moves_nothing(api: Api, path: str, body: Any) -> None:
    """Placement's operations: refused on a single node, a bad body first."""
    assert_error(api("POST", path, body), 404, "not_found", "single node")
    assert_error(api("POST", path, {**body, "extra": 1}), 422, "invalid", "nothing else")
    assert_error(api("POST", path, raw=b"{not json"), 400, "bad_request", "not valid JSON")
    assert_error(api("POST", path, body, headers={"Content-Type": "text/plain"}), 415,
                 "unsupported_media_type", "text/plain")
    assert_error(api("POST", path, raw=b"{" + b" " * MiB + b"}"), 413, "too_large", str(MiB))
    assert_error(api("POST", "/v1/cluster/rebalance"), 404, "not_found", "single node")
    assert_error(api("POST", "/v1/cluster/rebalance?x=1"), 400, "bad_request")


# --- conformance: keep last --------------------------------------------------------------------

def test_board_list_comes_in_pages(api: Api) -> None:
    """20,000 boards once came back as 6.8 MB in one answer, stalling the loop."""
    for i in range(25):
        api("PUT", f"/v1/boards/paging-{i:02d}", {})
    seen, after = [], None
    while True:
        path = "/v1/boards?limit=10" + ("" if after is None else f"&after={after}")
        status, page = api("GET", path)
        assert status == 200 and len(page["boards"]) <= 10
        seen += [b["name"] for b in page["boards"]]
        after = page["next"]
        if after is None:
            break
    assert seen == sorted(seen) and len(seen) == len(set(seen))
    assert {f"paging-{i:02d}" for i in range(25)} <= set(seen)
    assert_error(api("GET", "/v1/boards?limit=0"), 422, "invalid", "limit")
    assert_error(api("GET", "/v1/boards?limit=5000"), 422, "invalid", "limit")


def test_every_response_matches_the_openapi_document(server: Api,
                                                     request: pytest.FixtureRequest) -> None:
    """Every exchange of this module was checked, and all of the document exercised."""
    conformance = server.conformance
    assert conformance is not None
    for exchange in EXCHANGES:
        if not exchange.checked:  # each is checked as it happens; none should be left
            conformance.check(exchange)
    module_tests = {item.name for item in request.session.items
                    if item.module is request.module}
    defined = {name for name in dir(request.module) if name.startswith("test_")}
    if {name.split("[")[0] for name in module_tests} != defined:
        pytest.skip("coverage needs every test of the module to run")
    operations = conformance.operations()
    covered = {(path, method) for path, method, _ in conformance.seen}
    assert operations - covered == set(), "operations never exercised"
    missing = {s for s in conformance.statuses() - conformance.seen
               if s[2] not in UNREACHABLE and s not in NEEDS_CREDENTIALS | NEEDS_CLUSTER}
    assert missing == set(), "documented statuses never seen"


@pytest.mark.parametrize("literal", [
    b"18446744073709551616",      # 2**64: orjson once read it as a float, rounded
    b"-18446744073709551617",
    b"123456789012345678901234567890",
    b"9007199254740993",          # 2**53 + 1: exact, and still too large
])
def test_integers_beyond_two_to_the_53_are_refused_however_large(api: Api, literal) -> None:
    latest, summed = f"huge-{len(literal)}", f"huge-sum-{len(literal)}"
    make_board(api, latest, policy="latest")
    make_board(api, summed, policy="sum")
    for board, name in ((latest, b"score"), (summed, b"delta")):
        body = b'{"member": "h", "' + name + b'": ' + literal + b'}'
        assert_error(api("POST", f"/v1/boards/{board}/scores", raw=body), 422, "invalid",
                     "beyond 2\\*\\*53")
        assert top(api, board)["total"] == 0
    # A long run of digits inside a string is only text.
    status, _ = api("POST", f"/v1/boards/{latest}/scores",
                    raw=b'{"member": "m-18446744073709551616", "score": 1}')
    assert status == 200


def test_negative_zero_is_zero_in_answers_and_reads(api: Api) -> None:
    make_board(api, "zeros", policy="latest")
    assert repr(submit(api, "zeros", "z", score=-0.0)["score"]) == "0.0"
    entry = top(api, "zeros")["entries"][0]
    assert repr(entry["score"]) == "0.0"
    status, raw = api("GET", "/v1/boards/zeros/members/z")
    assert status == 200 and repr(raw["score"]) == "0.0"


def test_the_top_page_cache_is_bounded_by_bytes() -> None:
    """Bounded by entries, 2,000 distinct 1,000-entry pages once took 600 MB."""
    from rankd.frontends.service import ByteBoundedCache

    cache = ByteBoundedCache(max_bytes=10_000)
    for offset in range(200):
        cache.put(("b", "all", "all", offset, 1000), 1, bytes(300))
        assert cache.bytes <= 10_000
    assert len(cache) == 10_000 // 300 and cache.bytes == len(cache) * 300
    # Least recently used goes first: a page read again stays.
    keep = ("b", "all", "all", 170, 1000)
    assert cache.get(keep) is not None
    for offset in range(1000, 1030):
        cache.put(("b", "all", "all", offset, 1000), 1, bytes(300))
    assert cache.get(keep) is not None and cache.get(("b", "all", "all", 171, 1000)) is None
    cache.put(("huge",), 1, bytes(5000))  # more than an eighth: not kept
    assert cache.get(("huge",)) is None and cache.bytes <= 10_000


def test_many_distinct_top_pages_keep_memory_bounded(api: Api) -> None:
    make_board(api, "paged", policy="latest")
    events = [{"member": f"p{i:05d}", "score": i} for i in range(10_000)]
    assert api("POST", "/v1/boards/paged/scores/batch", {"events": events})[0] == 200
    for offset in range(0, 9000, 9):  # 1,000 distinct pages of 1,000 entries (~90 MB)
        status, page = api("GET", f"/v1/boards/paged/top?limit=1000&offset={offset}",
                           record=False)
        assert status == 200 and page["entries"][0]["rank"] == offset + 1
    with urllib.request.urlopen(api.daemon.url + "/metrics", timeout=10) as response:
        metrics = response.read().decode()
    rss = float(next(line.split()[1] for line in metrics.splitlines()
                     if line.startswith("rankd_process_rss_bytes ")))
    assert rss < 300 << 20, rss

