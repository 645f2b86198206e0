"""The REST submission's fast path (``rest._submitted``, with the callers it
remembers in ``rankd.security.admissions``) against the general path.

Two REST applications, each over its own engine, take the same random
requests to ``POST /v1/boards/{board}/scores`` in the same order: valid and
invalid bodies, content types and query strings, credentials good, bad,
read-only and expired, a rate limit that runs out, a signed board and a
missing one, event ids that repeat.  One answers as the daemon does; the
other has its fast path turned off (``Door.submitters`` None), so every
request goes the general way.  Their answers must have the same status,
body and headers that matter, and the engines the same state.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rest_twins
from rankd.engine.engine import Engine
from rankd.frontends import rest
from rankd.frontends.service import Service
from rankd.security import Gate
from rankd.security.admissions import Admissions
from rankd.security.auth import Principal, new_api_key
from rankd.security.limits import LimitsConfig
from rest_twins import running_twins, twin_gate

SECRET = "fast-path-secret-" + "x" * 32
WRITE_KEY, WRITE_ENTRY = new_api_key("writer", "write")
READ_KEY, READ_ENTRY = new_api_key("reader", "read")
#: Headers whose difference a client would see (Date and Content-Length aside).
HEADERS = ("Content-Type", "Server", "X-Content-Type-Options", "WWW-Authenticate",
           "Retry-After", "Allow")


def bearer(scopes: str, expires_in: float) -> str:
    return rest_twins.bearer(SECRET, scopes, expires_in)


AUTHORIZATIONS = [None, f"Bearer {WRITE_KEY}", f"Bearer {READ_KEY}", "Bearer rk_nobody_x",
                  "Basic dXNlcjpwYXNz", bearer("write", 3600), bearer("read write", 3600),
                  bearer("write", -3600), "Bearer not.a.token"]
CONTENT_TYPES = ["application/json", "application/json; charset=utf-8", "text/plain",
                 "application/problem+json", None]
QUERIES = ["", "?x=1", "?"]
SUBMISSIONS = rest_twins.submissions(["a", "b", "c", "d"], ["e1", "e2", "e3"])


BODIES = st.one_of(
    SUBMISSIONS.map(orjson.dumps),
    SUBMISSIONS.map(orjson.dumps),
    st.sampled_from([b"", b"{", b"[]", b"null", b'{"delta": 1}', b'{"member": 1, "delta": 1}',
                     b'{"member": "a", "delta": 1, "nope": 2}', b'{"member": "", "delta": 1}',
                     b'{"member": "a", "delta": 123456789012345678901234}',
                     b'{"member": "a", "delta": NaN}', b'{"member": "a"}',
                     b'{"member": "a", "delta": 1, "score": 2}',
                     b'{"member": "' + b"a" * rest.MAX_BODY_BYTES + b'", "delta": 1}']),
)
REQUESTS = st.tuples(st.sampled_from(range(len(AUTHORIZATIONS))), st.sampled_from(CONTENT_TYPES),
                     st.sampled_from(QUERIES), st.sampled_from(["plain", "signed", "missing"]),
                     BODIES)


class Twin:
    """One engine and its REST application, served on loopback."""

    def __init__(self, engine: Engine, fast: bool, clock: list[float]) -> None:
        self.engine = engine
        gate = twin_gate(SECRET, [WRITE_ENTRY, READ_ENTRY],
                         LimitsConfig(address_writes=0, credential_writes=1,
                                      exempt_loopback=False), clock)
        self.app = rest.create_app(Service(engine, signing_secret=SECRET), gate)
        if not fast:
            self.app[rest.DOOR].submitters = None
        self.client = TestClient(TestServer(self.app))

    async def start(self) -> None:
        await self.client.start_server()

    async def close(self) -> None:
        await self.client.close()


@pytest.fixture(scope="module")
def twins(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, ...]]:
    with running_twins(Path(tmp_path_factory.mktemp("fast-submit")), Twin) as pair:
        yield pair


_boards = itertools.count()


async def answer(twin: Twin, request: tuple[int, str | None, str, str, bytes],
                 boards: dict[str, str]) -> tuple[int, Any, dict[str, str | None]]:
    authorization, content_type, query, board, body = request
    headers = {}
    if AUTHORIZATIONS[authorization] is not None:
        headers["Authorization"] = AUTHORIZATIONS[authorization]
    if content_type is not None:
        headers["Content-Type"] = content_type
    async with twin.client.post(f"/v1/boards/{boards[board]}/scores{query}", data=body,
                                headers=headers) as response:
        payload = await response.read()
        return (response.status, json.loads(payload) if payload else None,
                {name: response.headers.get(name) for name in HEADERS})


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(requests=st.lists(REQUESTS, min_size=1, max_size=12))
def test_the_fast_path_answers_as_the_general_path(twins, requests):
    loop, clock, fast, general = twins
    clock[0] += 3600.0  # every rate-limit bucket full again
    n = next(_boards)
    boards = {"plain": f"plain{n}", "signed": f"signed{n}", "missing": f"missing{n}"}

    async def run() -> None:
        for twin in (fast, general):
            await twin.engine.put_board(boards["plain"], {"policy": "sum"})
            await twin.engine.put_board(boards["signed"], {"policy": "sum", "signed": True})
        for request in requests:
            seen = await answer(fast, request, boards)
            assert seen == await answer(general, request, boards), request
        for name in (boards["plain"], boards["signed"]):
            assert fast.engine.digest(name) == general.engine.digest(name)

    loop.run_until_complete(run())


def test_the_fast_path_remembers_an_admitted_caller(twins):
    """A caller admitted once is found again (and only with its own header
    and address), and a later request is charged to its rate limits."""
    loop, clock, fast, _ = twins
    clock[0] += 3600.0
    board = f"remembered{next(_boards)}"
    submitters: Admissions = fast.app[rest.DOOR].submitters
    submitters._entries.clear()

    async def run() -> list[int]:
        await fast.engine.put_board(board, {"policy": "sum"})
        statuses = []
        for i in range(5):  # credential_writes=1: a burst of 2, then 429
            async with fast.client.post(
                    f"/v1/boards/{board}/scores", data=orjson.dumps({"member": "a", "delta": i}),
                    headers={"Authorization": f"Bearer {WRITE_KEY}",
                             "Content-Type": "application/json"}) as response:
                statuses.append(response.status)
        return statuses

    assert loop.run_until_complete(run()) == [200] * 2 + [429] * 3
    assert len(submitters) == 1
    assert submitters.get(f"Bearer {WRITE_KEY}", "10.0.0.1") is None


def test_an_admission_ends_when_its_credential_expires():
    gate = Gate.open()
    admissions = Admissions(gate, "submit")
    expired = Principal("jwt:p", frozenset({"write"}), expires=time.time() - 1)
    lasting = Principal("jwt:q", frozenset({"write"}), expires=time.time() + 600)
    reader = Principal("jwt:r", frozenset({"read"}))
    for header, principal in (("x", expired), ("y", lasting), ("z", reader)):
        admissions.put(header, "10.0.0.1", principal)
    assert admissions.get("x", "10.0.0.1") is None  # the gate decides (and refuses)
    assert admissions.get("y", "10.0.0.1") is lasting
    assert admissions.get("z", "10.0.0.1") is None  # no write scope: never kept
    assert len(admissions) == 1


def test_admissions_are_bounded():
    admissions = Admissions(Gate.open(), "submit", max_entries=3)
    principal = Principal("key:k", frozenset({"write"}))
    for i in range(7):
        admissions.put(f"h{i}", "a", principal)
        assert len(admissions) <= 3
    assert admissions.get("h6", "a") is principal
    admissions.put("x" * 5000, "a", principal)  # too long to keep
    assert admissions.get("x" * 5000, "a") is None


def test_the_general_twin_really_goes_the_general_way(twins, monkeypatch):
    """(So the differential test compares two paths, not one with itself.)"""
    loop, clock, fast, general = twins
    clock[0] += 3600.0
    taken = []
    real = rest._gated

    async def spy(request: web.Request, *args: Any) -> web.StreamResponse:
        taken.append(request.app is fast.app)
        return await real(request, *args)

    monkeypatch.setattr(rest, "_gated", spy)
    boards = {"plain": f"spy{next(_boards)}"}

    async def run() -> None:
        for twin in (fast, general):
            await twin.engine.put_board(boards["plain"], {"policy": "sum"})
            await answer(twin, (1, "application/json", "", "plain", b'{"member": "a", "delta": 1}'),
                         boards)

    loop.run_until_complete(run())
    assert taken == [False]
