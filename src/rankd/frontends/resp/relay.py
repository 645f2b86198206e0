"""Sending a plain client's RESP command one hop on, to the node that serves its key.

A client that never asked for the cluster's topology (no ``CLUSTER
SLOTS/SHARDS/NODES``, ``READONLY`` or ``ASKING``) does not understand
``-MOVED``: a write of a slot another node writes is sent there by the node
the client is connected to, and the answer comes back as that node gave it
(:mod:`.cluster_commands` decides when).  Each client connection keeps at
most one connection per node it relays to (:class:`Relay`), opened on first
use and closed with it, so the client's commands stay in order on it.
A link is greeted as the client was when it opened; once the client
changes its protocol version (``HELLO``, ``RESET``) or its credential
(``AUTH``), the link is closed and the next relayed command opens one
greeted as the client is now (a kept link answered in the old version,
as the old caller).

The relayed connection speaks the client's protocol version (``HELLO 3``
for a RESP3 client), authenticates with the client's own credential when
it gave one (credentials are valid cluster-wide; only nodes the cluster
vouches for are ever named by the topology), and first sends ``CLUSTER
MYID``, which makes the far node answer ``-MOVED`` rather than relay again:
a command never goes round.  Such a ``-MOVED`` (the slot moved meanwhile:
sent just before a move's cut-over) is relayed once more, to the node it
names; a second ``-MOVED`` reaches the plain client as ``-TRYAGAIN``, which
it can retry.
"""

from __future__ import annotations

import asyncio
import contextlib

from rankd.frontends.resp.limits import MAX_REPLY_ENTRIES
from rankd.frontends.resp.protocol import encode_request
from rankd.index._contract import MAX_MEMBER_BYTES

#: How long a relayed command may take (a blocking pop: its own timeout more).
RELAY_SECONDS = 15.0
#: How long connecting to a node may take.
CONNECT_SECONDS = 3.0
#: The largest reply relayed: a node's largest reply (a range of
#: ``MAX_REPLY_ENTRIES`` members of ``MAX_MEMBER_BYTES`` bytes with their
#: scores, about 31 MB in RESP3) with room to spare.  A link that sends more
#: is not a rankd node keeping its bounds: it is dropped, its reply unread.
MAX_REPLY_BYTES = MAX_REPLY_ENTRIES * (2 * MAX_MEMBER_BYTES + 128)


class RelayFailed(Exception):
    """The node relayed to could not be reached, or broke off."""


#: What reading a link's reply may raise when the far end fails or sends
#: what is not a reply: the link is dropped and the client told TRYAGAIN.
RELAY_ERRORS: tuple[type[BaseException], ...] = (
    OSError, EOFError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError,
    ValueError, RelayFailed)


async def read_reply(reader: asyncio.StreamReader) -> bytes:
    """One whole RESP2/RESP3 reply, as its raw bytes."""
    out = bytearray()
    await _one(reader, out)
    return bytes(out)


async def _one(reader: asyncio.StreamReader, out: bytearray) -> None:
    pending = 1
    while pending > 0:
        line = await reader.readuntil(b"\r\n")
        out += line
        if len(out) > MAX_REPLY_BYTES:
            raise RelayFailed(f"the relayed reply is over {MAX_REPLY_BYTES} bytes")
        pending -= 1
        kind, body = line[:1], line[1:-2]
        if kind in b"$=!":  # a bulk string, verbatim string, bulk error
            size = _length(line, body)
            if len(out) + size > MAX_REPLY_BYTES:  # (checked before it is read)
                raise RelayFailed(f"the relayed reply is over {MAX_REPLY_BYTES} bytes")
            if size >= 0:
                out += await reader.readexactly(size + 2)
        elif kind in b"*~>":  # an array, set, push
            pending += max(0, _length(line, body))
        elif kind == b"%":  # a map
            pending += 2 * _length(line, body, null=False)
        elif kind == b"|":  # attributes, then the reply they describe
            pending += 2 * _length(line, body, null=False) + 1
        elif kind not in b"+-:,_#(":
            raise RelayFailed(f"not a RESP reply: {bytes(line[:32])!r}")


def _length(line: bytes | bytearray, body: bytes | bytearray, null: bool = True) -> int:
    """The length a bulk or aggregate header announces: -1 (a null, where
    ``null``) or more; any other count is no RESP reply (a negative map
    would leave the reply never complete)."""
    size = int(body)
    if size < (-1 if null else 0):
        raise RelayFailed(f"not a RESP reply: {bytes(line[:32])!r}")
    return size


class Relay:
    """One client connection's connections to the nodes it relays to."""

    def __init__(self) -> None:
        self._links: dict[str, tuple[asyncio.StreamReader, asyncio.StreamWriter]] = {}
        #: What each link was greeted with: (protocol version, credential).
        self._greeted: dict[str, tuple[int, str | None]] = {}
        self._lock = asyncio.Lock()

    async def send(self, address: str, words: list[bytes], *, version: int,
                   credential: str | None, seconds: float | None = RELAY_SECONDS) -> bytes:
        """``words`` sent to the node at ``address`` (``host:port``); its reply
        (waited for ``seconds``; None: as long as it takes)."""
        async with self._lock:  # one command at a time: replies in order
            try:
                reader, writer = await self._link(address, version, credential)
                writer.write(encode_request(words))
                return await asyncio.wait_for(read_reply(reader), seconds)
            except RELAY_ERRORS as exc:
                self._drop(address)
                raise RelayFailed(f"{type(exc).__name__}: {exc}") from None

    async def _link(self, address: str, version: int, credential: str | None
                    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        link = self._links.get(address)
        if link is not None and self._greeted.get(address) == (version, credential):
            return link
        self._drop(address)  # (greeted as the client no longer is)
        host, _, port = address.rpartition(":")
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host.strip("[]"), int(port)), CONNECT_SECONDS)
        self._links[address] = (reader, writer)
        self._greeted[address] = (version, credential)
        greeting: list[list[bytes]] = []
        if version == 3:
            hello = [b"HELLO", b"3"]
            if credential is not None:
                hello += [b"AUTH", b"default", credential.encode()]
            greeting.append(hello)
        elif credential is not None:
            greeting.append([b"AUTH", credential.encode()])
        greeting.append([b"CLUSTER", b"MYID"])
        writer.write(b"".join(encode_request(words) for words in greeting))
        for _ in greeting:
            reply = await asyncio.wait_for(read_reply(reader), CONNECT_SECONDS)
            if reply.startswith(b"-"):
                raise RelayFailed(reply[:200].decode(errors="replace").strip())
        return reader, writer

    def _drop(self, address: str) -> None:
        link = self._links.pop(address, None)
        self._greeted.pop(address, None)
        if link is not None:
            link[1].close()

    def close(self) -> None:
        """Close every link (the client's connection closed)."""
        for address in list(self._links):
            with contextlib.suppress(Exception):
                self._drop(address)
