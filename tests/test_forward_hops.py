"""A write forwarded to a node that no longer writes its group (a move cut
over meanwhile) is sent on once more, to the new primary, instead of
coming back ``421`` (docs/cluster.md, "Routing"); a third hop is never
made, and the hop is signed with the forward.

Three in-process HTTP servers stand for nodes: each answers as the REST
front door does when the engine names another primary
(``rest._answer_to`` with ``NotPrimary``), or, for the primary, admits the
forward and applies it."""

from __future__ import annotations

import asyncio
import contextlib
import types
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from rankd.cluster.trust import FORWARD_AUTH, ClusterTrust
from rankd.engine.errors import NotPrimary
from rankd.frontends import rest
from rankd.frontends.forwarding import FORWARDED, HOP, Forwarder, signed_node
from rankd.security import Gate, Principal, RateLimited, Unauthorized
from rankd.security.auth import AuthConfig, Authenticator
from rankd.security.limits import LimitsConfig, RateLimiter

SECRET = b"s" * 32
#: The forward headers of each request a node applied, as they came on the wire.
seen: list[dict[str, str]] = []
CALLER = Principal("key:app", frozenset({"write"}))


class OpenGate:
    """Admits everyone (the nodes' own gates are not under test)."""

    def admit(self, principal: Principal, operation: str, address: str, cost: int) -> None:
        pass

    def charge_refused(self, operation: str, address: str) -> None:
        pass


async def node(name: str, primary: list[str | None], applied: list[dict]
               ) -> tuple[web.AppRunner, str]:
    """A node: it forwards to ``primary[0]`` when set, else applies the write."""
    forwarder = Forwarder(name, 5.0, ClusterTrust(SECRET), "")  # (its address: below)
    door = types.SimpleNamespace(forwarder=forwarder)

    async def submit(request: web.Request) -> web.StreamResponse:
        if FORWARDED in request.headers:
            try:
                principal, address = await forwarder.admitted(request, OpenGate(), "submit", 1)
            except Unauthorized as exc:
                return web.json_response({"error": exc.message}, status=401)
        else:
            principal, address = CALLER, request.remote or ""
        request[rest.PRINCIPAL] = principal
        if primary[0] is not None:  # as the engine says when another node writes it
            return await rest._answer_to(request, NotPrimary(
                f"node {name} does not write it", primary[0]), door)  # type: ignore[arg-type]
        applied.append({"node": name, "hop": request.headers.get(HOP, "1"),
                        "by": request.headers.get(FORWARDED), "caller": principal.name,
                        "address": address, "body": await request.json()})
        seen.append({key: value for key, value in request.headers.items()
                     if key in (FORWARDED, HOP, FORWARD_AUTH)})
        return web.json_response({"applied_by": name})

    app = web.Application()
    app.router.add_post("/v1/boards/{board}/scores", submit)

    async def close(_: web.Application) -> None:
        await forwarder.close()

    app.on_cleanup.append(close)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    forwarder.advertise = f"127.0.0.1:{port}"
    return runner, forwarder.advertise


@contextlib.asynccontextmanager
async def three() -> AsyncIterator[tuple[dict[str, str], dict[str, list[str | None]],
                                         list[dict]]]:
    """Nodes x, s, t; x thinks s writes the group, s handed it to t."""
    applied: list[dict] = []
    views: dict[str, list[str | None]] = {name: [None] for name in "xst"}
    runners, addresses = [], {}
    for name in "xst":
        runner, addresses[name] = await node(name, views[name], applied)
        runners.append(runner)
    views["x"][0], views["s"][0] = addresses["s"], addresses["t"]
    try:
        yield addresses, views, applied
    finally:
        for runner in runners:
            await runner.cleanup()


async def post(address: str, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as session, session.post(
            f"http://{address}/v1/boards/b/scores", headers=headers,
            json={"member": "ann", "score": 1, "event_id": "e1"}) as answer:
        return answer.status, await answer.json()


def test_a_forward_that_meets_a_moved_group_goes_on_to_its_new_primary():
    async def scenario() -> None:
        async with three() as (addresses, _, applied):
            assert await post(addresses["x"]) == (200, {"applied_by": "t"})
            # Sent by s as the second hop, for the caller x admitted, from the
            # client's address.
            assert applied == [{"node": "t", "hop": "2", "by": "s", "caller": "key:app",
                                "address": "127.0.0.1", "body": {
                                    "member": "ann", "score": 1, "event_id": "e1"}}]

    asyncio.run(scenario())


def test_a_second_hop_is_the_last():
    async def scenario() -> None:
        async with three() as (addresses, views, applied):
            views["t"][0] = addresses["x"]  # t does not write it either: no third hop
            status, body = await post(addresses["x"])
            assert status == 421 and body["error"]["code"] == "not_primary"
            assert applied == []

    asyncio.run(scenario())


def test_the_hop_is_signed_with_the_forward():
    """A forward whose hop was changed on the way is refused, nothing applied."""
    path = "/v1/boards/b/scores"
    body = b'{"member": "ann", "score": 1, "event_id": "e1"}'

    async def scenario() -> None:
        async with three() as (addresses, _, applied), aiohttp.ClientSession() as session:
            signed = ClusterTrust(SECRET).forward_header(
                signed_node("s", 1, addresses["t"]), "POST", path, body, CALLER, "10.0.0.1")
            url = f"http://{addresses['t']}{path}"
            async with session.post(url, data=body, headers={
                    FORWARDED: "s", HOP: "2", FORWARD_AUTH: signed}) as answer:
                assert answer.status == 401
            async with session.post(url, data=body, headers={  # as signed: accepted
                    FORWARDED: "s", FORWARD_AUTH: signed}) as answer:
                assert answer.status == 200
            assert [entry["address"] for entry in applied] == ["10.0.0.1"]

    asyncio.run(scenario())


def test_a_forward_seen_on_the_way_is_accepted_by_no_other_node():
    """A forward taken off the wire between two nodes and sent again, to
    the node that sent it or to a third one, is refused there, nothing
    applied again (each node remembers only the nonces it accepted: the
    forwarding node took it as a forward to send on, a second write)."""
    async def scenario() -> None:
        async with three() as (addresses, views, applied), aiohttp.ClientSession() as session:
            views["s"][0] = None  # s writes the group: x forwards to it, one hop
            seen.clear()
            assert await post(addresses["x"]) == (200, {"applied_by": "s"})
            (captured,) = seen
            for name in "sxt":
                async with session.post(
                        f"http://{addresses[name]}/v1/boards/b/scores", headers=captured,
                        json={"member": "ann", "score": 1, "event_id": "e1"}) as answer:
                    assert answer.status == 401, (name, await answer.text())
            assert [entry["node"] for entry in applied] == ["s"]

    asyncio.run(scenario())


def test_a_forged_forward_is_charged_to_the_senders_address():
    """A client sending the forward headers itself (no valid node
    credential) is refused, and each refusal counts against its address's
    rate limit as a failed credential does: forged forwards used to skip
    the limit, every one hashed and checked for free."""
    gate = Gate(Authenticator(AuthConfig()), RateLimiter(LimitsConfig(address_writes=1.0)))
    forwarder = Forwarder("t", 5.0, ClusterTrust(SECRET), "127.0.0.1:1")
    codes = []

    async def scenario() -> None:
        for _ in range(5):
            request = make_mocked_request(
                "POST", "/v1/boards/b/scores", headers={FORWARDED: "s", FORWARD_AUTH: "v1 x"},
                transport=types.SimpleNamespace(get_extra_info=lambda name, default=None: (
                    ("203.0.113.9", 4000) if name == "peername" else default)))
            try:
                await forwarder.admitted(request, gate, "submit", 1)
            except (Unauthorized, RateLimited) as exc:
                codes.append(exc.code)

    asyncio.run(scenario())
    assert codes[0] == "unauthorized" and codes[-1] == "rate_limited", codes
