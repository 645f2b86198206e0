"""The RESP request reader (``RequestReader.feed``), inline and multibulk,
through the native scanner (``_scanner.pyx``) and the pure-Python path.

An input's first byte picks the mode, its second how the stream is cut
into reads (:func:`fuzz.targets.chunks`):

* raw (even first byte): the rest is fed as is to two readers, one with the
  native scanner and one without.  Each read must return (or raise
  ``ProtocolError``, after which nothing more is fed, as the connection
  closes) within the hang limit; both readers must agree; every command is
  a non-empty list of ``bytes`` no longer than the limits; the reader never
  holds more than it was fed; and the leading run of multibulk commands
  re-encodes to a prefix of the input.
* structured (odd first byte): the rest is split into commands (on 0xFF)
  and words (on 0xFE), sent as multibulk, or inline where the words allow;
  the reader must give back exactly those commands and hold nothing after.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from fuzz.targets import chunks, split

INSTRUMENT = ["rankd.frontends.resp.protocol"]
MAX_LEN = 8192
#: Small limits in raw mode, so inputs reach them.
MAX_BULK = 512
MAX_WORDS = 16
#: A multibulk request Redis ignores (no words).
_EMPTY_MULTIBULK = re.compile(rb"\*(?:0|-[1-9][0-9]{0,17})\r\n")
#: Bytes an inline word may hold and still come back as sent.
_INLINE_SAFE = re.compile(rb"[!#-&(-~]+")

protocol: Any = None


def load() -> Callable[[bytes], None]:
    global protocol
    from rankd.frontends.resp import protocol as module

    protocol = module
    return test_one


def test_one(data: bytes) -> None:
    mode, seed, stream = split(data)
    if mode & 1:
        structured(stream, seed, mode)
    else:
        raw(stream, seed)


def reader(native: bool, **limits: int) -> Any:
    made = protocol.RequestReader(**limits)
    if not native and hasattr(made, "_scan"):
        made._scan = None
    return made


def feed_all(made: Any, pieces: list[bytes], native: bool) -> tuple[list[list[bytes]], str | None]:
    """Every command read from ``pieces``, and the protocol error that ended them."""
    commands: list[list[bytes]] = []
    saved = protocol._scan
    if not native:
        protocol._scan = None  # a reader that reads the module's scanner
    try:
        for piece in pieces:
            try:
                commands += made.feed(piece)
                while made.more:  # at most FEED_MOST a call: the rest on the
                    commands += made.feed(b"")  # next, as the daemon reads on
            except protocol.ProtocolError as exc:
                return commands + exc.commands, exc.message
    finally:
        protocol._scan = saved
    return commands, None


def raw(stream: bytes, seed: int) -> None:
    pieces = chunks(stream, seed)
    limits = {"max_bulk": MAX_BULK, "max_multibulk": MAX_WORDS}
    results = []
    for native in (True, False):
        made = reader(native, **limits)
        commands, error = feed_all(made, pieces, native)
        assert made.pending_bytes <= len(stream), "the reader holds more than it was fed"
        results.append((commands, error))
        for command in commands:
            assert isinstance(command, list) and command, f"not a command: {command!r:.200}"
            assert all(type(word) is bytes for word in command), f"{command!r:.200}"
        assert sum(len(word) for command in commands for word in command) <= len(stream)
        check_multibulk_prefix(stream, commands)
    assert results[0] == results[1], (
        f"the native and Python readers disagree: {results[0]!r:.300} / {results[1]!r:.300}")


def check_multibulk_prefix(stream: bytes, commands: list[list[bytes]]) -> None:
    """The commands read from multibulk requests at the start of ``stream``
    are, encoded again, that start of it (bar requests Redis ignores, and
    the two bytes after each bulk string, which Redis skips unread)."""
    position = 0
    for command in commands:
        while match := _EMPTY_MULTIBULK.match(stream, position):
            position = match.end()
        if not stream.startswith(b"*", position):
            return  # an inline request: not re-encodable
        for part in [b"*%d\r\n" % len(command), *(b"$%d\r\n%s" % (len(word), word)
                                                   for word in command)]:
            assert stream.startswith(part, position), (
                f"command {command!r:.200} has {part!r:.100} where the input has "
                f"{stream[position:position + len(part)]!r:.100}")
            position += len(part) + (2 if part[0] == 0x24 else 0)


def structured(stream: bytes, seed: int, mode: int) -> None:
    sent = [command.split(b"\xfe") for command in stream.split(b"\xff")]
    wire = bytearray()
    for number, command in enumerate(sent):
        inline = ((mode >> 1) & (1 << (number % 7)) and not command[0].startswith(b"*")
                  and all(_INLINE_SAFE.fullmatch(word) for word in command))
        wire += b" ".join(command) + b"\r\n" if inline else protocol.encode_request(command)
    for native in (True, False):
        made = reader(native)
        commands, error = feed_all(made, chunks(bytes(wire), seed), native)
        assert error is None, f"{error}: {bytes(wire)!r:.300}"
        assert commands == sent, f"sent {sent!r:.300}, read {commands!r:.300}"
        assert made.pending_bytes == 0
