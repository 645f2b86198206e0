"""The Python client against a server from before hello's ``out_of_order``:
such a server refuses the unknown argument (``invalid``) and closes, and
the client connects again with a plain hello and goes on."""

from __future__ import annotations

import asyncio
from typing import Any

from rankd import wire
from rankd.client import AsyncClient

#: The hello arguments the server below was sent, in order.
HELLOS: list[dict[str, Any]] = []


class OlderServer(asyncio.Protocol):
    """Hello as rankd answered it before the option (only ``version`` and
    ``client``, anything else refused and closed); then ``health``."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.decoder = wire.FrameDecoder()

    def data_received(self, data: bytes) -> None:
        for message in self.decoder.feed(data):
            request_id, op, args = wire.parse_request(message)
            if op == "hello":
                HELLOS.append(args)
                if set(args) - {"version", "client"}:
                    self.transport.write(wire.error(request_id, "invalid",
                                                    "hello arguments: unknown field"))
                    self.transport.close()
                    return
                self.transport.write(wire.ok(request_id, {"version": 1, "server": "rankd old",
                                                          "max_frame": wire.MAX_FRAME}))
            else:
                self.transport.write(wire.ok(request_id, {"status": "ok"}))


def test_the_client_says_a_plain_hello_to_a_server_that_refuses_the_option() -> None:
    async def run() -> None:
        server = await asyncio.get_running_loop().create_server(OlderServer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            async with AsyncClient("127.0.0.1", port, retries=0) as client:
                assert await client.health() == {"status": "ok"}
                assert client.out_of_order is False
                assert client.server_info["server"] == "rankd old"
        finally:
            server.close()
            await server.wait_closed()
        assert [hello.get("out_of_order") for hello in HELLOS] == [True, None]

    asyncio.run(run())
