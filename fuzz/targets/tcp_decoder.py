"""The msgpack TCP front-end's frame decoder (``RequestDecoder`` in
``rankd/frontends/tcp.py``, on ``wire.FrameDecoder``), with and without the
native split of plain submits (``_submits.pyx``).

An input's first byte picks the mode, its second how the stream is cut
into reads (:func:`fuzz.targets.chunks`):

* raw (even first byte): the rest is fed as is.  Each read returns or
  raises ``FrameError`` (``bad_frame`` or ``too_large``; nothing more is
  fed after it) within the hang limit; the decoder holds less than one
  frame; what a frame decodes into stays within :data:`AMPLIFICATION`
  times its bytes; and the packing decoder (native fast path) gives the
  same requests as the plain one: each packed submit's fields are those
  the general path decodes from the same bytes.
* structured (odd first byte): the rest is cut into payloads (on 0xFF),
  each framed; they must come back as msgpack decodes them, in order, up
  to the first the decoder refuses (undecodable or over its limits).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from fuzz.targets import chunks, split

INSTRUMENT = ["rankd.wire", "rankd.frontends.tcp"]
MAX_LEN = 8192
#: Bytes of Python objects a frame may decode into, per byte of frame (an
#: empty array is one byte and a 56-byte list), plus a constant.
AMPLIFICATION = 80
SLACK = 4096

tcp: Any = None
wire: Any = None
msgpack: Any = None


def load() -> Callable[[bytes], None]:
    global tcp, wire, msgpack
    import msgpack as msgpack_module

    from rankd import wire as wire_module
    from rankd.frontends import tcp as tcp_module

    tcp, wire, msgpack = tcp_module, wire_module, msgpack_module
    return test_one


def test_one(data: bytes) -> None:
    mode, seed, stream = split(data)
    if mode & 1:
        structured(stream, seed)
    else:
        raw(stream, seed)


def decode_all(decoder: Any, pieces: list[bytes]) -> tuple[list[Any], str | None]:
    messages: list[Any] = []
    for piece in pieces:
        try:
            messages += decoder.feed(piece)
        except wire.FrameError as exc:
            assert exc.code in ("bad_frame", "too_large"), exc.code
            return messages + exc.decoded, exc.code
        assert decoder.pending_bytes < 4 + decoder.max_frame
    return messages, None


def unpacked(messages: list[Any]) -> list[Any]:
    """``messages`` with each packed run of submits decoded the general
    way, its fields checked against the native reading."""
    out = []
    for message in messages:
        if type(message).__name__ != "Packed":
            out.append(message)
            continue
        for index, source in enumerate(message.sources()):
            (request,) = decoder(False).feed(len(source).to_bytes(4, "big") + source)
            submission = message.submission(index)
            args = request[2]
            assert request[1] == "submit", request
            for field in ("board", "member", "event_id", "label", "score", "delta"):
                assert same(getattr(submission, field), args.get(field)), (field, request)
            out.append(request)
    return out


def decoder(pack: bool) -> Any:
    """An authenticated connection's decoder, packing plain submits or not."""
    made = tcp.RequestDecoder()
    if hasattr(made, "open"):  # it starts as the handshake's
        made.open(wire.MAX_FRAME)
    made.pack = pack
    return made


def raw(stream: bytes, seed: int) -> None:
    pieces = chunks(stream, seed)
    messages, error = decode_all(decoder(False), pieces)
    for message in messages:
        size = footprint(message)
        assert size <= AMPLIFICATION * len(stream) + SLACK, (
            f"{len(stream)} bytes decoded into {size} bytes of objects")
    packed, packed_error = decode_all(decoder(True), pieces)
    assert packed_error == error and same(unpacked(packed), messages), (
        "the fast path disagrees")


def same(one: Any, other: Any) -> bool:
    """Equal values, NaN included (compared as msgpack encodes them)."""
    return msgpack.packb(one, use_bin_type=True) == msgpack.packb(other, use_bin_type=True)


def footprint(value: Any, limit: int = 1 << 24) -> int:
    """Bytes of the Python objects in ``value`` (stops counting past ``limit``)."""
    total, stack = 0, [value]
    while stack and total <= limit:
        item = stack.pop()
        total += sys.getsizeof(item)
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
    return total


def structured(stream: bytes, seed: int) -> None:
    """Framed payloads come back as msgpack decodes them, in order, up to
    the first the decoder refuses (undecodable, or over its limits)."""
    payloads = [payload for payload in stream.split(b"\xff") if payload]
    framed = b"".join(len(p).to_bytes(4, "big") + p for p in payloads)
    messages, error = decode_all(decoder(False), chunks(framed, seed))
    assert len(messages) == len(payloads) if error is None else len(messages) < len(payloads)
    for payload, message in zip(payloads, messages, strict=False):
        expected = msgpack.unpackb(payload, raw=False, strict_map_key=True)
        assert same(message, expected), (payload, message, expected)
