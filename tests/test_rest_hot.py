"""The REST hot route (``rankd.frontends.rest_hot``) against the general way.

Two REST applications, each over its own engine, take the same random raw
HTTP requests in the same order: submissions with good, bad, read-only and
expired credentials, a write rate limit that runs out, bodies that are not
JSON, too large, of unknown fields, to a missing or a signed board, event
ids sent again with another payload, and requests the hot route must leave
to the general way (other methods, paths that the router reads otherwise,
queries, content types, an ``Origin`` allowed or not, a ``Host`` the
policy refuses, a proxy's ``X-Forwarded-For``, ``Expect``).  One is the
daemon's application; the other has the door's fast submission off
(``Door.submitters`` None), which also turns the hot route off, so every
request goes through the router and the middlewares.  Their answers must
have the same status, body and headers, the engines the same state and
the metrics the same counts.  Requests are written on a socket byte for
byte, so no client rewrites a path or adds a header.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rest_twins
from rankd.engine.engine import Engine
from rankd.engine.submission import Submission
from rankd.frontends import rest, rest_hot
from rankd.frontends.origins import OriginPolicy
from rankd.frontends.service import Service
from rankd.frontends.service import pack_json as rest_native
from rankd.security.auth import new_api_key
from rankd.security.limits import LimitsConfig
from rankd.security.proxies import TrustedProxies
from rest_twins import running_twins, twin_gate

SECRET = "hot-route-secret-" + "x" * 32
WRITE_KEY, WRITE_ENTRY = new_api_key("writer", "write")
READ_KEY, READ_ENTRY = new_api_key("reader", "read")
GOOD_ORIGIN = "http://good.example"
#: Headers whose difference a client would see (Date aside; Content-Length
#: follows the body, compared itself but for the twins' clocks).
HEADERS = ("content-type", "server", "x-content-type-options",
           "www-authenticate", "retry-after", "allow", "access-control-allow-origin", "vary",
           "access-control-expose-headers")


def bearer(scopes: str, expires_in: float) -> str:
    return rest_twins.bearer(SECRET, scopes, expires_in)


AUTHORIZATIONS = [None, f"Bearer {WRITE_KEY}", f"Bearer {READ_KEY}", "Bearer rk_nobody_x",
                  "Basic dXNlcjpwYXNz", bearer("write", 3600), bearer("write", -3600)]
#: Characters a raw path may hold that a URL parser may read specially.
SPECIALS = ["#", "#/", "?", ";", "\\", "+", "&", "=", "%", "%23", "%2F", "%00", "@", ":", "!",
            "$", "'", "(", "*", ",", "~", "\xe9", "|", "^", "`", "{", "[", "]", "\"", "<"]
#: (method, path template): {b} is the request's board.
TARGETS = [("POST", "/v1/boards/{b}/scores")] * 6 + [
    ("POST", "/v1/boards/{b}/scores?x=1"), ("POST", "/v1/boards/{b}/scores?"),
    ("PUT", "/v1/boards/{b}/scores"), ("post", "/v1/boards/{b}/scores"),
    ("POST", "/v1/boards/./scores"), ("POST", "/v1/boards/../scores"),
    ("POST", "/v1/boards//scores"), ("POST", "/v1/boards/scores"),
    ("POST", "/v1/boards/{b}/scores/"), ("POST", "/v1/boards/{b}%2Fx/scores"),
    ("POST", "/v1/boards/%7Bb%7D/scores"), ("POST", "/v1/boards/{b}/scores/batch")] + [
    ("GET", "/v1/boards/{b}/top"), ("GET", "/v1/boards/{b}/top?limit=10"),
    ("GET", "/v1/boards/{b}/top?limit=2&offset=1"), ("GET", "/v1/boards/{b}/top?limit=0"),
    ("GET", "/v1/boards/{b}/top?limit=99999"), ("GET", "/v1/boards/{b}/top?limit=1&limit=2"),
    ("GET", "/v1/boards/{b}/top?limit=%31"), ("GET", "/v1/boards/{b}/top?limit=+1"),
    ("GET", "/v1/boards/{b}/top?limit="), ("GET", "/v1/boards/{b}/top?x=1"),
    ("GET", "/v1/boards/{b}/top?min_seq=1"), ("GET", "/v1/boards/{b}/top?limit=10&"),
    ("GET", "/v1/boards/{b}/top?window=all"), ("HEAD", "/v1/boards/{b}/top"),
    ("POST", "/v1/boards/{b}/top"), ("GET", "/v1/boards/{b}/top/")] + [
    ("GET", "/v1/boards/{b}/members/a"), ("GET", "/v1/boards/{b}/members/b"),
    ("GET", "/v1/boards/{b}/members/zz"), ("GET", "/v1/boards/{b}/members/%61"),
    ("GET", "/v1/boards/{b}/members/a?window=all"), ("GET", "/v1/boards/{b}/members/a/around"),
    ("GET", "/v1/boards/{b}/members/"), ("GET", "/v1/boards/{b}/members/.."),
    ("DELETE", "/v1/boards/{b}/members/a"), ("HEAD", "/v1/boards/{b}/members/a")] + [
    # Digits past what int() reads (4,300) or an index holds; characters
    # the router reads otherwise than as a name's (``#`` ends the path).
    ("GET", "/v1/boards/{b}/top?limit=" + "9" * 5000),
    ("GET", "/v1/boards/{b}/top?offset=" + "9" * 5000 + "&limit=1"),
    ("GET", "/v1/boards/{b}/top?limit=" + "9" * 40),
    ("GET", "/v1/boards/{b}/top?offset=" + "0" * 5000 + "1")] + [
    target for special in SPECIALS for target in (
        ("POST", "/v1/boards/{b}" + special + "x/scores"),
        ("POST", "/v1/boards/{b}/scores" + special),
        ("GET", "/v1/boards/{b}" + special + "/top"), ("GET", "/v1/boards/{b}/top" + special),
        ("GET", "/v1/boards/{b}/top?limit=1" + special),
        ("GET", "/v1/boards/{b}/members/a" + special + "b"),
        ("GET", "/v1/boards/{b}" + special + "/members/a"))]
#: Extra headers: most requests none.
EXTRAS = [{}] * 6 + [{"Origin": GOOD_ORIGIN}, {"Origin": "http://evil.example"},
                     {"Host": "evil.example"}, {"X-Forwarded-For": "10.9.9.9"},
                     {"Expect": "100-continue"}, {"Content-Type": "text/plain"},
                     {"Content-Type": "application/json; charset=utf-8"}, {"Content-Type": None}]
SUBMISSIONS = rest_twins.submissions(["a", "b", "c"], ["e1", "e2"])


#: Bodies at the edge of what the native ingest reads itself (``_rest.pack``).
PLAIN_EDGES = [
    b' \t\r\n{ "member" : "a" , "delta" : 3 } \n', b'{"delta": 2, "member": "b"}',
    b'{"member": "a", "score": 5, "event_id": "e3"}', b'{"member": "a", "delta": -0}',
    b'{"member": "a", "delta": 999999999999999}', b'{"member": "a", "delta": 9999999999999999}',
    b'{"member": "a", "delta": -999999999999999}', b'{"member": "a", "delta": 01}',
    b'{"member": "a", "delta": 1.5}', b'{"member": "a", "delta": 1e2}',
    b'{"member": "a", "delta": 1E2}', b'{"member": "\\u0061", "delta": 1}',
    b'{"member": "\xc3\xa9", "delta": 1}', b'{"member": "a", "member": "b", "delta": 1}',
    b'{"member": "a", "delta": 1, "event_id": null}', b'{"member": "a", "delta": 1} x',
    b'{"member": "a", "delta": 1,}', b'{"member": "a" "delta": 1}', b'{}', b'{"member": ""}',
    b'{"member": "a", "delta": 1, "event_id": ""}', b'{"member": "a", "delta": -}',
    b'{"member": "a", "delta": 1', b'{"member": "a\x01", "delta": 1}',
    b'{"member": "' + b"m" * 300 + b'", "delta": 1}',
    b'{"member": "a", "delta": 1, "event_id": "' + b"e" * 300 + b'"}',
    b'{"member": "a", "delta": 1, "label": "x"}', b'{"member": "a", "delta": true}',
    b'{"member": "a", "delta": 1, "score": 2}', b'{"member": "a", "score": -7}']

BODIES = st.one_of(
    SUBMISSIONS.map(orjson.dumps), SUBMISSIONS.map(orjson.dumps),
    st.sampled_from([b"", b"{", b"[]", b'{"delta": 1}', b'{"member": "a", "nope": 2}',
                     b'{"member": "a", "delta": 123456789012345678901234}',
                     b'{"member": "a", "delta": 1, "score": 2}',
                     b'{"member": "' + b"a" * rest.MAX_BODY_BYTES + b'", "delta": 1}']),
    st.sampled_from(PLAIN_EDGES))
REQUESTS = st.tuples(st.sampled_from(range(len(AUTHORIZATIONS))), st.sampled_from(TARGETS),
                     st.sampled_from(EXTRAS), st.sampled_from(["plain", "signed", "missing"]),
                     BODIES)


class Twin:
    """One engine and its REST application, served on loopback."""

    def __init__(self, engine: Engine, hot: bool, clock: list[float]) -> None:
        self.engine = engine
        gate = twin_gate(SECRET, [WRITE_ENTRY, READ_ENTRY],
                         LimitsConfig(address_writes=0, credential_writes=1, credential_reads=1,
                                      exempt_loopback=False), clock,
                         trusted_proxies=TrustedProxies.parse("127.0.0.1"))
        origins = OriginPolicy.parse([GOOD_ORIGIN], loopback_only=True)
        self.app = rest.create_app(Service(engine, signing_secret=SECRET), gate, origins=origins)
        if not hot:
            self.app[rest.DOOR].submitters = self.app[rest.DOOR].readers = None
        self.server = TestServer(self.app, host="127.0.0.1")

    async def start(self) -> None:
        await self.server.start_server()

    async def close(self) -> None:
        await self.server.close()

    def counts(self) -> dict[tuple[str, int], int]:
        return {key: value[0] for key, value in self.app[rest.METRICS]._requests.items()}


async def exchange(port: int, request: bytes, head_only: bool = False
                   ) -> tuple[int, dict[str, str], bytes]:
    """One request on a connection of its own: status, headers, body (an
    interim ``100 Continue`` skipped)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        status = 100
        while status == 100:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            status = int(lines[0].split()[1])
        headers = {name.strip().lower(): value.strip()
                   for name, _, value in (line.partition(":") for line in lines[1:] if line)}
        if head_only:  # (the answer to HEAD has the GET's Content-Length, no body)
            return status, headers, b""
        return status, headers, await reader.readexactly(int(headers.get("content-length", "0")))
    finally:
        writer.close()


def raw_request(method: str, path: str, extra: dict[str, str | None], authorization: str | None,
                body: bytes) -> bytes:
    headers: dict[str, str | None] = {"Host": "127.0.0.1", "Content-Type": "application/json",
                                      "Authorization": authorization}
    headers.update(extra)
    headers["Content-Length"] = str(len(body))
    headers["Connection"] = "close"
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(
        f"{name}: {value}\r\n" for name, value in headers.items() if value is not None)
    return head.encode("latin-1") + b"\r\n" + body


@pytest.fixture(scope="module")
def twins(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, ...]]:
    with running_twins(Path(tmp_path_factory.mktemp("hot-route")), Twin) as pair:
        yield pair


_boards = itertools.count()


async def answer(twin: Twin, request: tuple[Any, ...], boards: dict[str, str]
                 ) -> tuple[int, Any, dict[str, str | None]]:
    authorization, (method, path), extra, board, body = request
    assert twin.server.port is not None
    status, headers, payload = await exchange(twin.server.port, raw_request(
        method, path.replace("{b}", boards[board]), extra, AUTHORIZATIONS[authorization], body),
        method == "HEAD")
    try:
        data: Any = json.loads(payload) if payload else None
    except ValueError:
        data = payload  # aiohttp's own answer to what it cannot parse
    if isinstance(data, dict):
        data.pop("updated_at", None)  # (each twin's clock)
    return status, data, {name: headers.get(name) for name in HEADERS}


def fresh_boards() -> dict[str, str]:
    n = next(_boards)
    return {"plain": f"plain{n}", "signed": f"signed{n}", "missing": f"missing{n}"}


async def make_boards(twins: tuple[Twin, Twin], boards: dict[str, str]) -> None:
    for twin in twins:
        await twin.engine.put_board(boards["plain"], {"policy": "sum"})
        await twin.engine.put_board(boards["signed"], {"policy": "sum", "signed": True})


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(requests=st.lists(REQUESTS, min_size=1, max_size=12))
def test_the_hot_route_answers_as_the_general_way(twins, requests):
    loop, clock, hot, general = twins
    clock[0] += 3600.0  # every rate-limit bucket full again
    boards = fresh_boards()

    async def run() -> None:
        await make_boards((hot, general), boards)
        before = [twin.counts() for twin in (hot, general)]
        for request in requests:
            seen = await answer(hot, request, boards)
            assert seen == await answer(general, request, boards), request
        for name in (boards["plain"], boards["signed"]):
            assert hot.engine.digest(name) == general.engine.digest(name)
        counted = [{key: n - was.get(key, 0) for key, n in twin.counts().items()
                    if n != was.get(key, 0)}
                   for twin, was in zip((hot, general), before, strict=True)]
        assert counted[0] == counted[1]

    loop.run_until_complete(run())


async def replay(twins: tuple[Any, ...], cases: list[tuple[Any, ...]], boards: dict[str, str],
                 unfilled: int) -> list[int]:
    """The statuses of ``cases``, each answered alike by both twins; the
    rate-limit buckets (burst 2) filled again before each but the last
    ``unfilled``."""
    _, clock, hot, general = twins
    statuses = []
    for i, case in enumerate(cases):
        if i < len(cases) - unfilled:
            clock[0] += 3600.0
        seen = await answer(hot, case, boards)
        assert seen == await answer(general, case, boards), case
        statuses.append(seen[0])
    return statuses


def test_bodies_at_the_edge_answer_alike(twins):
    """Every body at the edge of what the native reader takes, admitted, to
    an existing board: answered alike (the random test seldom sends one so)."""
    loop, _, hot, general = twins
    boards = fresh_boards()
    cases = [(1, ("POST", "/v1/boards/{b}/scores"), {}, board, body)
             for body in PLAIN_EDGES for board in ("plain", "signed")]

    async def run() -> None:
        await make_boards((hot, general), boards)
        await replay(twins, cases, boards, unfilled=0)
        for name in (boards["plain"], boards["signed"]):
            assert hot.engine.digest(name) == general.engine.digest(name)

    loop.run_until_complete(run())


def test_each_check_answers_alike(twins):
    """Every check of the general way, one request each (the random test may
    miss one): bad JSON, over-size, wrong scope, the rate limit, a missing
    board, an event id sent again with another payload."""
    loop, clock, hot, general = twins
    clock[0] += 3600.0
    boards = fresh_boards()
    write, read = 1, 2
    scores = ("POST", "/v1/boards/{b}/scores")
    cases = [
        (write, scores, {}, "plain", b"{not json"),
        (write, scores, {}, "plain", b'{"member": "' + b"a" * rest.MAX_BODY_BYTES + b'"}'),
        (read, scores, {}, "plain", b'{"member": "a", "delta": 1}'),
        (write, scores, {}, "missing", b'{"member": "a", "delta": 1}'),
        (write, scores, {}, "plain", b'{"member": "a", "delta": 1, "event_id": "x"}'),
        (write, scores, {}, "plain", b'{"member": "a", "delta": 2, "event_id": "x"}'),
        (write, scores, {}, "plain", b'{"member": "a", "delta": 3}'),
        (write, scores, {}, "plain", b'{"member": "a", "delta": 4}'),  # over the limit
    ]

    async def run() -> list[int]:
        await make_boards((hot, general), boards)
        return await replay(twins, cases, boards, unfilled=2)

    assert loop.run_until_complete(run()) == [400, 413, 403, 404, 200, 409, 200, 429]


def test_the_hot_route_skips_the_router(twins, monkeypatch):
    """(So the differential test compares two ways, not one with itself.)"""
    loop, clock, hot, general = twins
    clock[0] += 3600.0
    resolved = []
    router = type(hot.app.router)
    real = router.resolve

    async def spy(self: Any, request: Any) -> Any:
        resolved.append(self is hot.app.router)
        return await real(self, request)

    monkeypatch.setattr(router, "resolve", spy)
    boards = fresh_boards()
    request = (1, ("POST", "/v1/boards/{b}/scores"), {}, "plain", b'{"member": "a", "delta": 1}')

    async def run() -> None:
        await make_boards((hot, general), boards)
        for twin in (hot, general):
            assert (await answer(twin, request, boards))[0] == 200
        for twin in (hot, general):  # (both: their logs stay alike for the tests after)
            await answer(twin, (*request[:2], {"Origin": GOOD_ORIGIN}, *request[3:]), boards)

    loop.run_until_complete(run())
    # The general twin, then the hot one's request with an Origin, and the general's.
    assert resolved == [False, True, False]


def test_odd_paths_answer_alike(twins):
    """Each target with a long number or a character the router reads
    specially, from each caller: answered alike (and written alike)."""
    loop, _, hot, general = twins
    boards = fresh_boards()
    odd = TARGETS[TARGETS.index(("GET", "/v1/boards/{b}/top?limit=" + "9" * 5000)):]
    cases = [(caller, target, {}, "plain", b'{"member": "a", "delta": 1}')
             for target in odd for caller in (0, 1, 2)]

    async def run() -> None:
        await make_boards((hot, general), boards)
        await replay(twins, cases, boards, unfilled=0)
        for name in (boards["plain"], boards["signed"]):
            assert hot.engine.digest(name) == general.engine.digest(name)
        assert hot.engine.digest() == general.engine.digest()  # (no board made on one only)

    loop.run_until_complete(run())


def test_member_reads_answer_alike(twins):
    """The member read: scope, a missing board, a missing member, the read
    rate limit."""
    loop, clock, hot, general = twins
    boards = fresh_boards()
    read = ("GET", "/v1/boards/{b}/members/a")
    submit = (1, ("POST", "/v1/boards/{b}/scores"), {}, "plain", b'{"member": "a", "delta": 1}')
    cases = [(2, read, {}, "plain", b""), (2, read, {}, "missing", b""),
             (2, ("GET", "/v1/boards/{b}/members/zz"), {}, "plain", b""),
             (3, read, {}, "plain", b""), (2, read, {}, "plain", b""), (2, read, {}, "plain", b""),
             (2, read, {}, "plain", b"")]

    async def run() -> list[int]:
        await make_boards((hot, general), boards)
        clock[0] += 3600.0
        assert await answer(hot, submit, boards) == await answer(general, submit, boards)
        return await replay(twins, cases, boards, unfilled=3)

    assert loop.run_until_complete(run()) == [200, 404, 404, 401, 200, 200, 429]


def test_top_reads_answer_alike(twins):
    """The top page read: each check of the general way, one request each
    (scope, a missing board, a bad limit, the read rate limit)."""
    loop, clock, hot, general = twins
    boards = fresh_boards()
    top = ("GET", "/v1/boards/{b}/top?limit=10")
    submit = (1, ("POST", "/v1/boards/{b}/scores"), {}, "plain", b'{"member": "a", "delta": 1}')
    cases = [(2, top, {}, "plain", b""), (2, top, {}, "missing", b""),
             (2, ("GET", "/v1/boards/{b}/top?limit=0"), {}, "plain", b""),
             (3, top, {}, "plain", b""), (1, top, {}, "plain", b""),
             (2, top, {}, "plain", b""), (2, top, {}, "plain", b""), (2, top, {}, "plain", b"")]

    async def run() -> list[int]:
        await make_boards((hot, general), boards)
        clock[0] += 3600.0
        assert await answer(hot, submit, boards) == await answer(general, submit, boards)
        return await replay(twins, cases, boards, unfilled=3)

    statuses = loop.run_until_complete(run())
    assert statuses[:3] == [200, 404, 422] and statuses[-3:] == [200, 200, 429]


def test_the_route_it_takes(twins):
    _, _, hot, _ = twins
    door = hot.app[rest.DOOR]

    class Request:
        method = "POST"

        def __init__(self, path: str) -> None:
            self.headers = {"Content-Type": "application/json", "Host": "localhost"}
            self.raw_path = path
            self.content = type("Content", (), {"is_eof": lambda self: True})()

    assert rest_hot.hot_board(Request("/v1/boards/b1/scores"), door, False) == "b1"
    for path in ("/v1/boards/./scores", "/v1/boards/../scores", "/v1/boards//scores",
                 "/v1/boards/a%2Fb/scores", "/v1/boards/b/scores?x", "/v1/boards/a/b/scores",
                 "/v1/boards/scores", "/x/v1/boards/b/scores", "/v1/boards/q#x/scores"):
        assert rest_hot.hot_board(Request(path), door, False) is None, path


def test_plain_bodies_take_the_native_ingest(twins):
    """A plain body goes the engine's packed path (``Service.submit_json``),
    with the answer the general way gives; others do not."""
    loop, _, hot, general = twins
    boards = fresh_boards()
    service = hot.app[rest.SERVICE]

    async def run() -> None:
        await make_boards((hot, general), boards)
        plain = service.submit_json(boards["plain"], b'{"member": "z", "delta": 4}')
        assert plain is not None
        assert await plain == await general.engine.submit(
            Submission.from_dict(boards["plain"], {"member": "z", "delta": 4}))
        for board, body in ((boards["plain"], b'{"member": "z", "delta": 0.5}'),
                            (boards["signed"], b'{"member": "z", "delta": 4}'),
                            (boards["missing"], b'{"member": "z", "delta": 4}')):
            assert service.submit_json(board, body) is None

    if rest_native is None:
        pytest.skip("the native REST ingest is not built")
    loop.run_until_complete(run())


async def exchange_raw(port: int, request: bytes) -> tuple[str, list[tuple[str, str]], bytes]:
    """One request on a connection of its own, its answer as sent: the
    status line, the headers (``Date`` aside) sorted, the body's bytes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        headers = sorted((name.strip().lower(), value.strip())
                         for name, _, value in (line.partition(":") for line in head[1:] if line)
                         if name.strip().lower() != "date")
        length = int(dict(headers).get("content-length", "0"))
        return head[0], headers, await reader.readexactly(length)
    finally:
        writer.close()


#: (HTTP version, Connection header): each way a client may ask to keep the
#: connection or not, which the answer's ``Connection`` header follows.
CONNECTIONS = [("1.1", None), ("1.1", "close"), ("1.1", "keep-alive"), ("1.0", None),
               ("1.0", "keep-alive"), ("1.0", "close")]


def test_answers_are_written_alike_byte_for_byte(twins):
    """The hot route writes its answers itself (``rest_hot.Answer``, the JSON
    natively): the status line, every header but ``Date`` and the body's
    bytes are the general way's, for each HTTP version and ``Connection``
    header, for submissions (with and without an event id, a duplicate),
    member reads (a label that needs escapes, a member absent) and errors."""
    loop, clock, hot, general = twins
    boards = fresh_boards()
    board = boards["plain"]
    requests = [
        ("POST", f"/v1/boards/{board}/scores", b'{"member": "a", "delta": 3}'),
        ("POST", f"/v1/boards/{board}/scores", b'{"member": "b", "score": -7, "event_id": "e"}'),
        ("POST", f"/v1/boards/{board}/scores", b'{"member": "b", "score": -7, "event_id": "e"}'),
        ("POST", f"/v1/boards/{board}/scores", b'{"member": "b", "score": 5, "event_id": "e"}'),
        ("POST", f"/v1/boards/{board}/scores", b'{"member": "a", "delta": 0.25}'),
        ("GET", f"/v1/boards/{board}/members/a", b""),
        ("GET", f"/v1/boards/{board}/members/b", b""),
        ("GET", f"/v1/boards/{board}/members/q%22", b""),
        ("GET", f"/v1/boards/{board}/members/zz", b""),
        ("GET", f"/v1/boards/{boards['missing']}/members/a", b""),
    ]

    async def run() -> None:
        await make_boards((hot, general), boards)
        for twin in (hot, general):
            await twin.engine.submit(Submission.from_dict(
                board, {"member": 'q"', "delta": 1, "label": 'say "hi" \\ \u00e9'}))
        for (version, connection), (method, path, body) in itertools.product(CONNECTIONS,
                                                                              requests):
            clock[0] += 3600.0  # (the rate limits are not what this test is about)
            head = (f"{method} {path} HTTP/{version}\r\nHost: 127.0.0.1\r\n"
                    f"Authorization: Bearer {WRITE_KEY if method == 'POST' else READ_KEY}\r\n"
                    + (f"Connection: {connection}\r\n" if connection else "")
                    + (f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                       if method == "POST" else ""))
            request = head.encode() + b"\r\n" + body
            seen = [await exchange_raw(twin.server.port, request) for twin in (hot, general)]
            assert seen[0] == seen[1], (version, connection, method, path, body)
        assert hot.engine.digest(board) == general.engine.digest(board)

    loop.run_until_complete(run())


def test_member_answers_are_orjsons(twins):
    """``Service.member_json`` (natively written) is byte for byte
    ``orjson.dumps`` of ``Service.member``, on boards of either order, for
    ties, negative, fractional, zero and large scores, labels with escapes
    and members of non-ASCII text; a member absent is the same ``NotFound``."""
    loop, _, hot, general = twins
    service = hot.app[rest.SERVICE]
    boards = fresh_boards()
    scores = [0.0, -0.0, 1.0, 1.0, -2.5, 1e-7, 3.0000000000000004, 2.5e15, -1e300, 7.0, 7.0]
    members = ["a", "b", "\u00e9t\u00e9", 'q"uote', "back\\slash", "\u2603", "x" * 200,
               "m1", "m2", "m3", "m4"]

    async def run() -> None:
        for order in ("desc", "asc"):
            name = f"{boards['plain']}-{order}"
            for twin in (hot, general):  # (both: their states stay alike for the tests after)
                await twin.engine.put_board(name, {"policy": "latest", "order": order})
                for i, (member, score) in enumerate(zip(members, scores, strict=True)):
                    event = {"member": member, "score": score}
                    if i % 3 == 0:
                        event["label"] = f"label {i} \"\\ \u2603"
                    await twin.engine.submit(Submission.from_dict(name, event))
            for member in members:
                assert service.member_json(name, member) == orjson.dumps(
                    service.member(name, member)), (order, member)
            for absent in ("nobody", "A"):
                with pytest.raises(Exception) as native:
                    service.member_json(name, absent)
                with pytest.raises(Exception) as python_way:
                    service.member(name, absent)
                assert type(native.value) is type(python_way.value)
                assert str(native.value) == str(python_way.value)

    loop.run_until_complete(run())


def test_doubles_are_written_as_orjson_writes_them():
    """Every notation orjson switches between (fixed, ``e-5`` in fixed,
    ``e-6`` and below, ``e+16`` and above), non-finite values, and random
    doubles of every magnitude and bit pattern."""
    import math
    import random
    import struct

    native = pytest.importorskip("rankd.frontends._rest_reads")
    rng = random.Random(48)
    values = [0.0, -0.0, 1.0, 1e-4, 1e-5, -1e-5, 9.999999999999999e-6, 1e-6, 1.5e-7, 1e-100,
              5e-324, 1e15, 1e16, 1.5e16, 1e22, 1.7976931348623157e308, 100.0, 33.333333333333336,
              math.inf, -math.inf, math.nan]
    values += [struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0]
               for _ in range(20_000)]
    values += [rng.random() * 10.0 ** rng.randint(-12, 20) * rng.choice((1, -1))
               for _ in range(20_000)]
    for value in values:
        assert native.double_json(value) == orjson.dumps(value), value


def test_the_hot_route_builds_no_response_nor_standing(twins, monkeypatch):
    """What it saves, seen: its answers to a plain submission and to member
    and top reads make no ``web.Response`` (it writes them itself), and a
    member read runs neither ``Queries.standing`` nor ``orjson.dumps``."""
    from aiohttp import web

    from rankd.engine.queries import Queries

    loop, clock, hot, general = twins
    boards = fresh_boards()
    made: list[str] = []
    real_init = web.Response.__init__

    def counted(self: Any, *args: Any, **kwargs: Any) -> None:
        made.append("response")
        real_init(self, *args, **kwargs)

    def standing(*args: Any, **kwargs: Any) -> Any:
        made.append("standing")
        raise AssertionError("the engine's Python standing path ran")

    cases = [(1, ("POST", "/v1/boards/{b}/scores"), {}, "plain", b'{"member": "a", "delta": 1}'),
             (2, ("GET", "/v1/boards/{b}/members/a"), {}, "plain", b""),
             (2, ("GET", "/v1/boards/{b}/top?limit=5"), {}, "plain", b"")]

    async def run() -> list[int]:
        await make_boards((hot, general), boards)
        monkeypatch.setattr(web.Response, "__init__", counted)
        monkeypatch.setattr(Queries, "standing", standing)
        statuses = []
        for case in cases:
            clock[0] += 3600.0
            statuses.append((await answer(hot, case, boards))[0])
        monkeypatch.undo()
        for case in cases:  # (the general twin too: their states stay alike)
            clock[0] += 3600.0
            await answer(general, case, boards)
        return statuses

    if rest_native is None:
        pytest.skip("the native REST ingest is not built")
    assert loop.run_until_complete(run()) == [200, 200, 200]
    assert made == []


def test_a_pass_that_fails_answers_as_the_general_way(tmp_path):
    """A plain submission whose pass cannot be logged (the log failed): the
    hot route's completion answers the general way's error, and counts it."""
    from rankd.engine.wal import WalFailedError

    with running_twins(tmp_path, Twin) as (loop, clock, hot, general):
        boards = fresh_boards()
        request = (1, ("POST", "/v1/boards/{b}/scores"), {}, "plain",
                   b'{"member": "a", "delta": 1}')

        def failing(payloads: Any) -> int:
            raise WalFailedError("disk on fire (test)")

        async def run() -> tuple[Any, ...]:
            await make_boards((hot, general), boards)
            for twin in (hot, general):
                twin.engine.wal.append_many = failing
            clock[0] += 3600.0
            before = hot.counts()
            seen = await answer(hot, request, boards)
            assert seen == await answer(general, request, boards)
            return seen, {k: n - before.get(k, 0) for k, n in hot.counts().items()
                          if n != before.get(k, 0)}

        (status, data, _), counted = loop.run_until_complete(run())
    assert status >= 500 and data["error"]["code"], data
    assert counted == {("submit", status): 1}


def test_pipelined_answers_keep_their_order(twins):
    """Requests sent at once on one kept-alive connection (plain and other
    submissions, reads of what they wrote, refusals): answered in order,
    each as the general way answers it, though a plain submission's answer
    is written by its pass's completion."""
    loop, clock, hot, general = twins
    boards = fresh_boards()
    board = boards["plain"]

    def request(method: str, path: str, body: bytes = b"", close: bool = False) -> bytes:
        key = WRITE_KEY if method == "POST" else READ_KEY
        return (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n"
                + ("Connection: close\r\n" if close else "")
                + (f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                   if method == "POST" else "") + "\r\n").encode() + body

    pipeline = b"".join([
        request("POST", f"/v1/boards/{board}/scores", b'{"member": "a", "delta": 3}'),
        request("GET", f"/v1/boards/{board}/members/a"),
        request("POST", f"/v1/boards/{board}/scores", b'{"member": "a", "delta": 0.5}'),
        request("POST", f"/v1/boards/{board}/scores", b'{"member": "b", "delta": 2}'),
        request("POST", f"/v1/boards/{boards['missing']}/scores", b'{"member": "b", "delta": 2}'),
        request("GET", f"/v1/boards/{board}/top?limit=5"),
        request("POST", f"/v1/boards/{board}/scores", b'{"member": "a", "delta": 1}', close=True)])

    async def answers(port: int) -> list[tuple[str, Any]]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(pipeline)
            await writer.drain()
            seen = []
            for _ in range(7):
                head = (await reader.readuntil(b"\r\n\r\n")).decode().split("\r\n")
                length = next(int(line.split(":")[1]) for line in head
                              if line.lower().startswith("content-length:"))
                data = json.loads(await reader.readexactly(length))
                data.pop("updated_at", None)
                seen.append((head[0], data))
            assert await reader.read() == b""  # (closed after the last, as asked)
            return seen
        finally:
            writer.close()

    async def run() -> None:
        await make_boards((hot, general), boards)
        clock[0] += 3600.0
        seen = [await answers(twin.server.port) for twin in (hot, general)]
        assert seen[0] == seen[1]
        assert [status.split()[1] for status, _ in seen[0]] == [
            "200", "200", "200", "429", "429", "200", "429"], seen[0]  # (a burst of 2 writes)
        assert seen[0][1][1]["score"] == 3.0 and seen[0][5][1]["entries"][0]["score"] == 3.5

    loop.run_until_complete(run())
