"""The TCP protocol's wire format, shared by the server and the client.

Only framing and message shapes live here, no business logic: see
``protocol/PROTOCOL.md`` for the specification.  A frame is a big-endian
u32 length and one msgpack value; a request is ``[id, op, args]`` and a
response ``[id, status, body]``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import msgpack

VERSION = 1
MAX_FRAME = 1 << 20
MAX_ID = 2**32 - 1
OK = 0
ERROR = 1
_LENGTH_BYTES = 4

#: Errors after which the server closes the connection (with id 0: always).
FATAL_CODES = frozenset({"bad_frame", "hello_required", "unsupported_version"})


@dataclass(frozen=True, slots=True)
class DecodeLimits:
    """What one frame's msgpack payload may decode into, given to msgpack's
    own ``unpackb`` (lengths in bytes or items); a payload beyond any of
    them is a :class:`FrameError` (``too_large``).  msgpack itself bounds
    nesting at 1,024 levels; it has no tighter setting, so
    ``max_containers`` (arrays and maps in all, counted by msgpack's
    ``list_hook``/``object_hook``; 0: not counted) bounds a tree's size."""

    max_str_len: int
    max_bin_len: int
    max_array_len: int
    max_map_len: int
    max_ext_len: int
    max_containers: int = 0


class FrameError(Exception):
    """The byte stream cannot be decoded; the connection must be closed."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        #: Messages decoded from the same data before the bad frame.
        self.decoded: list[Any] = []


class RequestShapeError(Exception):
    """A decoded frame that is not a valid request (the id, if known, is kept)."""

    def __init__(self, request_id: int, message: str) -> None:
        super().__init__(message)
        self.request_id = request_id
        self.message = message


_packer = msgpack.Packer(use_bin_type=True)
_unpackb = msgpack.unpackb
_read_length = struct.Struct(">I").unpack_from


def encode(message: Any) -> bytes:
    """One frame holding ``message``."""
    payload = _packer.pack(message)
    if len(payload) > MAX_FRAME:
        raise ValueError(f"a frame holds at most {MAX_FRAME} bytes, this one {len(payload)}")
    return len(payload).to_bytes(_LENGTH_BYTES, "big") + payload


def request(request_id: int, op: str, args: dict[str, Any]) -> bytes:
    return encode([request_id, op, args])


def ok(request_id: int, body: Any) -> bytes:
    return encode([request_id, OK, body])


def error(request_id: int, code: str, message: str) -> bytes:
    return encode([request_id, ERROR, {"code": code, "message": message}])


def error_with(request_id: int, body: dict[str, Any]) -> bytes:
    """An error frame whose body has fields beyond ``code`` and ``message``."""
    return encode([request_id, ERROR, body])


class FrameDecoder:
    """Splits a byte stream into decoded messages.

    ``feed`` returns every complete message so far (at most
    ``max_messages`` of them, when set: the rest stays buffered, undecoded,
    for the next ``feed``, which may be of no new bytes); an incomplete
    frame waits for more bytes.  A frame longer than ``max_frame``, a
    payload beyond ``limits`` or an undecodable one raises
    :class:`FrameError` (the stream is lost after that); the messages
    decoded before it are in the error's ``decoded``.
    """

    def __init__(self, max_frame: int = MAX_FRAME, limits: DecodeLimits | None = None) -> None:
        self.max_frame = max_frame
        #: None: only msgpack's defaults (a payload's own length bounds them).
        self.limits = limits
        #: Frames decoded per ``feed`` at most (0: every complete one).
        self.max_messages = 0
        #: When a list: each decoded frame's size in bytes is appended to it.
        self.sizes: list[int] | None = None
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Any]:
        buffer = self._buffer
        if buffer:
            buffer += data
            view = memoryview(buffer)
        else:
            view = memoryview(data)  # the usual case: frames start at this read
        messages: list[Any] = []
        try:
            position = self._frames(view, messages)
        finally:
            view.release()  # a bytearray cannot be resized while a view is exported
        if buffer:
            del buffer[:position]
        elif position < len(data):
            buffer += data[position:]  # keep the incomplete frame for the next read
        return messages

    def _frames(self, view: memoryview, messages: list[Any]) -> int:
        """Decode the complete frames at the start of ``view`` into
        ``messages``; return the offset after them."""
        position = 0
        size = len(view)
        most = self.max_messages
        sizes = self.sizes
        while size - position >= _LENGTH_BYTES:
            if most and len(messages) >= most:
                break
            (length,) = _read_length(view, position)
            if length == 0 or length > self.max_frame:
                raise self._bad_length(length, messages)
            end = position + _LENGTH_BYTES + length
            if end > size:
                break
            messages.append(self._decode(view[position + _LENGTH_BYTES:end], messages))
            if sizes is not None:
                sizes.append(_LENGTH_BYTES + length)
            position = end
        return position

    def _bad_length(self, length: int, decoded: list[Any]) -> FrameError:
        error = FrameError("too_large" if length else "bad_frame",
                           f"frame length {length} is outside 1..{self.max_frame}")
        error.decoded = decoded
        return error

    def _decode(self, payload: memoryview, decoded: list[Any]) -> Any:
        limits = self.limits
        try:
            if limits is None:
                return _unpackb(payload, raw=False, strict_map_key=True)
            if limits.max_containers:
                hook = _ContainerBudget(limits.max_containers)
                return _unpackb(payload, raw=False, strict_map_key=True,
                                max_str_len=limits.max_str_len,
                                max_bin_len=limits.max_bin_len,
                                max_array_len=limits.max_array_len,
                                max_map_len=limits.max_map_len,
                                max_ext_len=limits.max_ext_len, list_hook=hook,
                                object_hook=hook)
            return _unpackb(payload, raw=False, strict_map_key=True,
                            max_str_len=limits.max_str_len, max_bin_len=limits.max_bin_len,
                            max_array_len=limits.max_array_len,
                            max_map_len=limits.max_map_len, max_ext_len=limits.max_ext_len)
        except Exception as exc:  # msgpack raises several kinds; all mean a bad frame
            message = str(exc)
            if isinstance(exc, msgpack.StackError):
                message = "nested deeper than msgpack's limit (1024 levels)"
            if _OVER_LIMIT in message or isinstance(exc, msgpack.StackError):
                error = FrameError("too_large", f"a frame beyond this connection's decoding "
                                                f"limits: {message}")
            else:
                error = FrameError("bad_frame", f"undecodable msgpack payload: {message}")
            error.decoded = decoded
            raise error from None

    @property
    def pending_bytes(self) -> int:
        return len(self._buffer)


#: In the message of every error raised for a payload beyond its limits
#: (msgpack's own: "3 exceeds max_array_len(2)"; :class:`_ContainerBudget`'s).
_OVER_LIMIT = "exceeds max_"


class _ContainerBudget:
    """msgpack's ``list_hook`` and ``object_hook`` for one payload: counts its
    arrays and maps, and stops the decoding past ``budget`` of them."""

    __slots__ = ("budget", "left")

    def __init__(self, budget: int) -> None:
        self.budget = self.left = budget

    def __call__(self, container: Any) -> Any:
        self.left -= 1
        if self.left < 0:
            raise ValueError(f"{self.budget + 1} arrays and maps exceeds "
                             f"max_containers({self.budget})")
        return container


def parse_request(message: Any) -> tuple[int, str, dict[str, Any]]:
    """``(id, op, args)`` of a decoded request, or :class:`RequestShapeError`."""
    if not isinstance(message, list) or len(message) != 3:
        request_id = _id_of(message)
        raise RequestShapeError(request_id, "a request is [id, op, args]")
    request_id, op, args = message
    if isinstance(request_id, bool) or not isinstance(request_id, int) \
            or not 1 <= request_id <= MAX_ID:
        raise RequestShapeError(0, f"a request id is an integer in 1..{MAX_ID}")
    if not isinstance(op, str):
        raise RequestShapeError(request_id, "op must be a string")
    if not isinstance(args, dict):
        raise RequestShapeError(request_id, "args must be a map")
    return request_id, op, args


def _id_of(message: Any) -> int:
    if isinstance(message, list) and message and isinstance(message[0], int) \
            and not isinstance(message[0], bool) and 1 <= message[0] <= MAX_ID:
        return message[0]
    return 0


def parse_response(message: Any) -> tuple[int, bool, Any]:
    """``(id, ok, body)`` of a decoded response; ``FrameError`` if malformed."""
    if (not isinstance(message, list) or len(message) != 3
            or not isinstance(message[0], int) or message[1] not in (OK, ERROR)):
        raise FrameError("bad_frame", f"not a response: {message!r:.100}")
    request_id, status, body = message
    if status == ERROR and not (isinstance(body, dict) and "code" in body):
        raise FrameError("bad_frame", f"malformed error body: {body!r:.100}")
    return request_id, status == OK, body
