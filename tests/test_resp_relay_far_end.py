"""A relayed command's far end that does not speak RESP as a rankd node
does: the relay fails at once with ``RelayFailed`` (the client is answered
``-TRYAGAIN``) and drops the link, never waits on a reply that cannot
complete nor lets another exception out."""

from __future__ import annotations

import asyncio

import pytest

from rankd.frontends.resp.relay import Relay, RelayFailed

#: Replies no rankd node sends, each after a well-formed greeting answer.
MALFORMED = {
    "negative map": b"%-1\r\n+a\r\n",
    "negative attributes": b"|-2\r\n+a\r\n",
    "bulk length below -1": b"$-7\r\n",
    "array length below -1": b"*-3\r\n",
    "error line over the stream limit": b"-ERR " + b"x" * 100_000 + b"\r\n",
    "simple line over the stream limit in an array": b"*1\r\n+" + b"y" * 70_000 + b"\r\n",
}


async def _far_end(reply: bytes) -> asyncio.Server:
    """A node answering ``CLUSTER MYID`` then, to any command, ``reply``
    (and then nothing, its link kept open)."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"MYID\r\n")
        writer.write(b"$2\r\nn9\r\n")
        await reader.read(1000)
        writer.write(reply)
        await writer.drain()
        await asyncio.sleep(30)
    return await asyncio.start_server(handle, "127.0.0.1", 0)


@pytest.mark.parametrize("reply", list(MALFORMED.values()), ids=list(MALFORMED))
def test_a_malformed_reply_fails_the_relay_at_once(reply: bytes) -> None:
    async def run() -> None:
        server = await _far_end(reply)
        port = server.sockets[0].getsockname()[1]
        relay = Relay()
        try:
            # seconds=None: as a blocking pop relays (no time bound of its own).
            with pytest.raises(RelayFailed):
                await asyncio.wait_for(
                    relay.send(f"127.0.0.1:{port}", [b"BZPOPMIN", b"k", b"0"], version=2,
                               credential=None, seconds=None), 5)
            assert not relay._links  # the link is dropped, its leftovers unread
        finally:
            relay.close()
            server.close()
    asyncio.run(run())
