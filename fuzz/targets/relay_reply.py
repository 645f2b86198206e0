"""The RESP reply reader of the cluster relay (``relay.read_reply``): what a
node reads back from the node it relayed a plain client's command to.

An input's first byte picks the mode, its second how the stream is cut
into reads (:func:`fuzz.targets.chunks`):

* raw (even first byte): the rest is fed to a stream reader, then its end.
  The reader must return or raise one of the errors the relay turns into
  ``TRYAGAIN`` (and then drops the link: ``Relay.send``) within the hang
  limit, never anything else; what it returns is a start of the input; a
  reply is never read past the end of the one it began.
* structured (odd first byte): the rest describes a reply tree (arrays,
  maps, sets, pushes, attributes, bulk and simple strings, integers,
  nulls, doubles), encoded as RESP2/RESP3; followed by a second reply, the
  reader must return exactly the first and leave the second unread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fuzz.targets import chunks, split

INSTRUMENT = ["rankd.frontends.resp.relay"]
MAX_LEN = 4096
#: What ``Relay.send`` turns into a ``TRYAGAIN`` answer.
relay: Any = None
FAILURES: tuple[type[BaseException], ...] = ()
#: The second reply of a structured input.
NEXT = b"+next\r\n"


def load() -> Callable[[bytes], None]:
    global relay, FAILURES
    from rankd.frontends.resp import relay as module

    relay = module
    FAILURES = module.RELAY_ERRORS
    return test_one


def read(pieces: list[bytes]) -> tuple[bytes | None, bytes]:
    """The reply read from ``pieces`` (None: a relay failure), and what is
    left unread after it."""
    async def go() -> tuple[bytes | None, bytes]:
        reader = asyncio.StreamReader(limit=1 << 10)
        for piece in pieces:
            reader.feed_data(piece)
        reader.feed_eof()
        try:
            reply = await relay.read_reply(reader)
        except FAILURES:
            return None, b""
        return reply, await reader.read()
    return asyncio.run(go())


def test_one(data: bytes) -> None:
    mode, seed, stream = split(data)
    if mode & 1:
        structured(stream, seed)
    else:
        reply, _ = read(chunks(stream, seed))
        if reply is not None:
            assert stream.startswith(reply), f"{reply!r:.200} is not a start of the input"


def encode(stream: bytes, position: int, depth: int) -> tuple[bytes, int]:
    """A reply described by ``stream`` from ``position``, and where it ends."""
    if position >= len(stream):
        return b"+OK\r\n", position
    kind = stream[position] % 11
    position += 1
    size = stream[position] % 5 if position < len(stream) else 0
    position += 1
    word = bytes(stream[position:position + size * 3])
    if kind == 0:
        return b"$%d\r\n%s\r\n" % (len(word), word), position + len(word)
    if kind == 1:
        return b"+%s\r\n" % word.replace(b"\r", b"").replace(b"\n", b""), position + len(word)
    if kind == 2:
        return b":%d\r\n" % (size * 1000 - 7), position
    if kind == 3:
        return b"_\r\n" if size % 2 else b"$-1\r\n", position
    if kind == 4:
        return b",%d.5\r\n" % size, position
    if kind == 5:
        return b"-ERR %d\r\n" % size, position
    if depth > 4:
        return b"*0\r\n", position
    count = size * (2 if kind in (8, 9) else 1)
    parts = []
    for _ in range(count):
        part, position = encode(stream, position, depth + 1)
        parts.append(part)
    header = {6: b"*", 7: b"~", 8: b"%", 9: b"|", 10: b">"}[kind]
    if kind == 9:  # attributes precede the reply they describe
        described, position = encode(stream, position, depth + 1)
        parts.append(described)
    return header + b"%d\r\n" % (size if kind in (8, 9) else count) + b"".join(parts), position


def structured(stream: bytes, seed: int) -> None:
    first, _ = encode(stream, 0, 0)
    reply, rest = read(chunks(first + NEXT, seed))
    assert reply == first, f"wrote {first!r:.300}, read {reply!r:.300}"
    assert rest == NEXT, f"left {rest!r:.300} unread"
