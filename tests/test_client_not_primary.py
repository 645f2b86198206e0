"""A write refused ``not_primary`` (a cluster node that knows no live node
writing the group yet: nothing applied) is sent again by the client with
its backoff, even without an event id, and raised when its retries run out."""

from __future__ import annotations

import asyncio

import pytest

from rankd import wire
from rankd.client import AsyncClient, NotPrimary


class RefusingServer(asyncio.Protocol):
    """Answers ``submit`` ``not_primary`` its first ``refusals`` times, then
    applies it to a sum kept here; counts the submits it was sent."""

    refusals = 0
    submits = 0
    score = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.decoder = wire.FrameDecoder()

    def data_received(self, data: bytes) -> None:
        cls = type(self)
        for message in self.decoder.feed(data):
            request_id, op, args = wire.parse_request(message)
            if op == "hello":
                self.transport.write(wire.ok(request_id, {"version": 1, "server": "test",
                                                          "max_frame": wire.MAX_FRAME}))
                continue
            cls.submits += 1
            if cls.submits <= cls.refusals:
                self.transport.write(wire.error(
                    request_id, "not_primary", "node n0 does not write group 7; no live node "
                    "does yet: try again shortly"))
                continue
            cls.score += args["delta"]
            self.transport.write(wire.ok(request_id, {"member": args["member"],
                                                      "score": cls.score}))


def run_against(refusals: int, retries: int) -> tuple[object, int]:
    """Submit once (no event id) to a server refusing ``refusals`` times:
    the answer (or the error raised) and how many submits it was sent."""
    server_class = type("Refusing", (RefusingServer,), {"refusals": refusals})

    async def run() -> object:
        server = await asyncio.get_running_loop().create_server(server_class, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            async with AsyncClient("127.0.0.1", port, retries=retries, backoff=0.01,
                                   max_backoff=0.02) as client:
                try:
                    return await client.submit("b", "m", delta=5)
                except NotPrimary as exc:
                    return exc
        finally:
            server.close()
            await server.wait_closed()

    answer = asyncio.run(run())
    return answer, server_class.submits


def test_a_write_refused_not_primary_is_sent_again_and_applied_once() -> None:
    answer, submits = run_against(refusals=2, retries=5)
    assert answer == {"member": "m", "score": 5}
    assert submits == 3


@pytest.mark.parametrize("retries", [0, 3])
def test_a_write_refused_every_time_raises_not_primary_after_its_retries(retries: int) -> None:
    answer, submits = run_against(refusals=100, retries=retries)
    assert isinstance(answer, NotPrimary)
    assert "no live node does yet" in str(answer)
    assert submits == retries + 1
