"""RESP, Redis's wire protocol: reading requests and writing replies.

Requests come as *multibulk* arrays (``*<n>\\r\\n`` then ``n`` bulk strings
``$<len>\\r\\n<bytes>\\r\\n``), which every client library sends, or as
*inline* lines of space-separated words (``redis-cli`` in a pipe, telnet).
:class:`RequestReader` splits a byte stream into commands, each a list of
``bytes``; like Redis it checks each announced length before it reads
the bytes, so an oversized request is refused without being buffered, and
a malformed one raises :class:`ProtocolError` (the connection is answered
``-ERR Protocol error: ...`` and closed, as Redis does).

Replies are built by :class:`Replies` for the protocol version a client
chose with ``HELLO``: RESP2 (the default) or RESP3, which adds maps,
doubles, nulls and booleans of their own.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from rankd._native import native_or
from rankd.frontends.resp import doubles
from rankd.frontends.resp.info import count_error

#: Redis's limits: words in one multibulk request, and bytes in an inline one.
MAX_MULTIBULK = 1024 * 1024
MAX_INLINE = 64 * 1024
#: The longest bulk string taken (Redis's default is 512 MB; a board name,
#: a member or a score never needs more).
MAX_BULK = 1 << 20
#: Replies a connection makes before it writes them and awaits the client's reading.
OUT_HIGH_WATER = 1 << 20
#: The most bytes of one request buffered (``--max-request-bytes``): a
#: ZADD of the engine's 10,000-pair batch limit with 256-byte members is
#: under 3 MiB.  Past it the request is refused and the connection closed.
MAX_REQUEST = 4 << 20
#: Once this much of one request is buffered, its command (and the caller's
#: right to run it) is checked before any more of it is read; and it is read
#: word by word from then on, not scanned again from its start on every read
#: (which would cost the square of its length when it trickles in).
VET_AFTER = 64 * 1024
#: Commands one ``feed`` reads at most, and bytes it reads in Python (inline
#: lines, and the words of a request read word by word): the rest stays
#: buffered for the next call, so no read holds the event loop long (256 KiB
#: of ``a\n`` are 131,072 inline commands; 2 MB of one-byte words, 280,000
#: words; 16 KiB of quoted text, 3 ms of splitting).
FEED_MOST = 1024
FEED_BYTES = 16 * 1024
_BLANK_LINES = re.compile(rb"(?:\r?\n)+")


class ProtocolError(Exception):
    """The stream is not RESP (or exceeds a limit): answer and close."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        #: The commands read before the error (answered before it, as Redis does).
        self.commands: list[list[bytes]] = []

    def reply(self) -> bytes:
        return b"-ERR Protocol error: " + self.message.encode() + b"\r\n"


class RequestRefused(ProtocolError):
    """A large request refused from its first word (an unknown command, or
    one the caller may not run) before the rest of it is read: answered
    with its own error reply (``NOPERM ...``), then the connection closes,
    since the rest of the request cannot be told from the next one."""

    def reply(self) -> bytes:
        return b"-" + self.message.encode() + b"\r\n"


#: The native scanner (``rankd.frontends.resp._scanner``), or None.
_scan, SCANNER = native_or("rankd.frontends.resp._scanner", "scan", None)
#: A header's integer as Redis's ``string2ll`` reads it.
_HEADER_INTEGER = re.compile(rb"-?[1-9][0-9]{0,17}|0")


class RequestReader:
    """Splits a byte stream into commands (lists of ``bytes``).

    With the native scanner, multibulk requests are read by it; while
    ``pack`` is set, each run of plain writes comes out as one
    ``rankd.engine._packed.Packed`` instead (see ``_scanner``).
    """

    def __init__(self, *, max_bulk: int = MAX_BULK, max_multibulk: int = MAX_MULTIBULK,
                 max_request: int = MAX_REQUEST,
                 vet: Callable[[bytes], None] | None = None) -> None:
        self.max_bulk = max_bulk
        self.max_multibulk = max_multibulk
        #: The most bytes of one request buffered; an inline request may
        #: have no more than this nor :data:`MAX_INLINE`.
        self.max_request = max_request
        self.max_inline = min(MAX_INLINE, max_request)
        #: Called with a large request's command name before more of it is
        #: read; raises ``RequestRefused`` to refuse it.
        self.vet = vet
        #: The native scanner, unless the request limits must hold exactly
        #: (before AUTH, where speed does not matter): it checks each word,
        #: not a whole request.
        self._scan = _scan if max_request >= MAX_INLINE else None
        self.pack = False
        #: Whether the last ``feed`` stopped at :data:`FEED_MOST` commands
        #: with more complete ones buffered: call ``feed(b"")`` again.
        self.more = False
        #: Whether the request being read is read word by word (it grew
        #: past :data:`VET_AFTER` while incomplete).
        self._stepwise = False
        self._buffer = bytearray()
        #: Words of the multibulk request being read, and how many it has.
        self._words: list[bytes] | None = None
        self._expected = 0
        #: Length of the bulk string being read (-1: its header is next).
        self._bulk = -1
        #: Bytes of the request being read, taken so far (the Python path).
        self._taken = 0
        #: Whether the request being read was vetted.
        self._vetted = False

    @property
    def pending_bytes(self) -> int:
        return len(self._buffer)

    def take_state(self, other: RequestReader) -> None:
        """Go on from where ``other`` stopped (a reader with other limits
        taking over a connection's stream)."""
        self._buffer = other._buffer
        self._words, self._expected, self._bulk = other._words, other._expected, other._bulk
        self._taken, self._vetted = other._taken, other._vetted
        self._stepwise, self.more = other._stepwise, other.more

    def feed(self, data: bytes) -> list[list[bytes]]:
        """Every command complete so far; ``ProtocolError`` on bad input
        (carrying the commands read before it)."""
        scan = self._scan
        self.more = False
        if not self._buffer and self._words is None and scan is not None and data \
                and data[0] == 0x2A:
            # The common case, whole multibulk commands in one read: scanned
            # where they are, with no copy into the buffer.  Anything else is
            # scanned again below (the scan changes nothing).
            items, end, error = scan(data, 0, self.max_bulk, self.max_multibulk, self.pack)
            if end == len(data) and error is None:
                return items
        commands: list[list[bytes]] = []
        try:
            return self._feed(data, commands)
        except ProtocolError as exc:
            exc.commands = commands
            raise

    def _feed(self, data: bytes, commands: list[Any]) -> list[Any]:
        buffer = self._buffer
        buffer += data
        position = 0
        size = len(buffer)
        scan = self._scan
        #: Bytes read in Python so far in this call (see FEED_BYTES).
        spent = 0
        # Every turn of this loop moves ``position`` on, or breaks (the
        # rest is incomplete, or this call's share is read), or raises.
        while position < size:
            if len(commands) >= FEED_MOST or spent > FEED_BYTES:
                self.more = True
                break
            if self._words is None:
                if buffer[position] == 0x2A and scan is not None and not self._stepwise:
                    items, end, error = scan(buffer, position, self.max_bulk,
                                             self.max_multibulk, self.pack)
                    commands += items
                    if end > position:
                        self._vetted = False  # a request ended: the next is new
                    position = end
                    if error is not None:
                        raise ProtocolError(error)
                    if position >= size:
                        break
                    if buffer[position] == 0x2A:  # an incomplete command:
                        if size - position <= VET_AFTER:
                            break  # scanned again with more bytes
                        self._stepwise = True  # from now on word by word (and vetted)
                    continue  # an inline request next (or the word-by-word path)
                if buffer[position] == 0x2A:  # '*'
                    end = buffer.find(b"\r\n", position)
                    if end < 0:
                        self._check_header_length(size - position, "multibulk")
                        break
                    count = self._length(buffer[position + 1:end], "multibulk")
                    self._taken = end + 2 - position
                    position = end + 2
                    if count > self.max_multibulk:
                        raise ProtocolError("invalid multibulk length")
                    if count <= 0:
                        continue  # Redis ignores empty requests
                    self._words, self._expected, self._vetted = [], count, False
                    continue
                blank = _BLANK_LINES.match(buffer, position)
                if blank is not None:  # empty lines, which Redis skips: all at once
                    position = blank.end()
                    continue
                end = inline_end(buffer, position, size)
                if end < 0:
                    if size - position > self.max_inline:
                        raise ProtocolError("too big inline request")
                    break
                if end - position > self.max_inline:
                    raise ProtocolError("too big inline request")
                line = bytes(buffer[position:end]).rstrip(b"\r")
                spent += end + 1 - position
                position = end + 1
                words = split_inline(line)
                if len(words) > self.max_multibulk:
                    raise ProtocolError("invalid multibulk length")
                if words:
                    commands.append(words)
                continue
            if self._bulk < 0:
                end = buffer.find(b"\r\n", position)
                if end < 0:
                    self._check_header_length(size - position, "bulk")
                    break
                if buffer[position] != 0x24:  # '$'
                    raise ProtocolError(f"expected '$', got '{chr(buffer[position])}'")
                length = self._length(buffer[position + 1:end], "bulk")
                if length < 0 or length > self.max_bulk:
                    raise ProtocolError("invalid bulk length")
                self._taken += end + 2 - position + length + 2
                if self._taken > self.max_request:
                    raise ProtocolError(self._too_big())
                self._bulk = length
                position = end + 2
            if size - position < self._bulk + 2:
                break
            self._words.append(bytes(buffer[position:position + self._bulk]))
            spent += self._bulk + 16  # (a word's header and its list entry too)
            position += self._bulk + 2
            self._bulk = -1
            if self._taken > VET_AFTER and not self._vetted and self.vet is not None:
                self._vetted = True
                self.vet(self._words[0])
            if len(self._words) == self._expected:
                commands.append(self._words)
                self._words = None
                self._stepwise = False
        del buffer[:position]
        if buffer and scan is not None and self._words is None and not self.more:
            self._check_pending(buffer)
        return commands

    def _check_pending(self, pending: bytearray) -> None:
        """Bound an incomplete request the scanner left in the buffer:
        vetted once it is large, refused past ``max_request``."""
        if len(pending) > VET_AFTER and not self._vetted and self.vet is not None \
                and pending[0] == 0x2A:
            name = _first_word(pending, self.max_bulk)
            if name is not None:
                self._vetted = True
                self.vet(name)
        if len(pending) > self.max_request:
            raise ProtocolError(self._too_big())

    def _too_big(self) -> str:
        return f"too big request (over {self.max_request} bytes)"

    def _check_header_length(self, waiting: int, what: str) -> None:
        if waiting > MAX_INLINE:
            raise ProtocolError(f"too big {what} count string")

    @staticmethod
    def _length(text: bytes | bytearray, what: str) -> int:
        if not _HEADER_INTEGER.fullmatch(text):
            raise ProtocolError(f"invalid {what} length")
        return int(text)


_ESCAPES = {ord("n"): b"\n", ord("r"): b"\r", ord("t"): b"\t", ord("b"): b"\b",
            ord("a"): b"\a"}
#: C's isspace(), which skips blanks between words and must follow a closing quote.
_SPACE = b" \t\n\v\f\r"
#: A line whose words :func:`split_inline` may split with ``bytes.split``:
#: no quotes, and no ``\v`` or ``\f`` (blanks between words in Redis, but
#: part of an unquoted word).
_PLAIN_LINE = re.compile(rb"[^\"'\v\f]*")
#: One word of a line with quotes, after the blanks before it: its unquoted
#: part (which ``\v`` and ``\f`` belong to), then at most one quoted part,
#: which ends it.  The possessive ``*+`` never gives back what it took, as
#: Redis reads a quoted part once from left to right: an escaped quote
#: (``\\'``) never closes it, even when no other quote does.  So a word is
#: read in C, in one pass.
_WORD = re.compile(rb"""[ \t\n\v\f\r]*
    (?P<plain>[^ \t\n\r"']*)
    (?: "(?P<double>(?:\\x[0-9a-fA-F]{2}|\\.|[^"\\])*+)"
      | '(?P<single>(?:\\'|[^'])*+)' )?""", re.VERBOSE | re.DOTALL)
#: An escape of a double-quoted part.
_ESCAPE = re.compile(rb"\\(?:x([0-9a-fA-F]{2})|(.))", re.DOTALL)


def _first_word(request: bytes | bytearray, max_bulk: int) -> bytes | None:
    """The first word of a multibulk request, if it is all there."""
    header = request.find(b"\r\n")
    start = header + 2
    end = request.find(b"\r\n", start)
    if header < 0 or end < 0 or request[start:start + 1] != b"$":
        return None
    text = bytes(request[start + 1:end])
    if not _HEADER_INTEGER.fullmatch(text) or not 0 <= int(text) <= max_bulk:
        return None
    length = int(text)
    if len(request) < end + 2 + length:
        return None
    return bytes(request[end + 2:end + 2 + length])


def inline_end(buffer: bytes | bytearray, position: int, size: int) -> int:
    """Where the inline request at ``position`` ends (its ``\\n``), or -1
    while it is incomplete.  Redis finds the end with ``strchr``, which
    stops at a NUL byte: a request with a NUL before its newline never
    completes, and the connection waits until :data:`MAX_INLINE` bytes
    make it "too big".  So it is here (checked against redis-server)."""
    end = buffer.find(b"\n", position, size)
    if end < 0 or buffer.find(b"\x00", position, end) >= 0:
        return -1
    return end


def split_inline(line: bytes) -> list[bytes]:
    """The words of an inline request, as Redis splits them (``sdssplitargs``):
    blanks separate words; a quote anywhere in a word opens a quoted part:
    ``"..."`` takes ``\\n \\r \\t \\b \\a`` and ``\\xHH`` escapes (any other
    escaped byte stands for itself), ``'...'`` takes ``\\'``; a closing quote
    must be followed by a blank or the end (else ``ProtocolError``,
    unbalanced quotes).  A NUL byte ends the line, as the end of a C
    string does for Redis.  Checked against redis-server by the tests.

    A line is read once, in linear time, whatever its bytes: a line
    without quotes by ``bytes.split``, one with quotes a word at a time by
    one regular expression (:data:`_WORD`) that never backtracks."""
    nul = line.find(b"\x00")
    if nul >= 0:
        line = line[:nul]
    if _PLAIN_LINE.fullmatch(line):  # no quotes: blanks alone separate words
        return line.split()
    words: list[bytes] = []
    position, size = 0, len(line)
    while True:  # each turn takes a word (or returns, or raises)
        found = _WORD.match(line, position)  # (every part of it is optional)
        position = found.end()
        plain, double, single = found.group("plain", "double", "single")
        if double is None and single is None and not plain:
            if position >= size:
                return words
            raise ProtocolError("unbalanced quotes in request")  # a quote left open
        if position < size and line[position] not in _SPACE:
            raise ProtocolError("unbalanced quotes in request")  # no blank after a quote
        if double is not None:
            plain += _ESCAPE.sub(_unescape, double)
        elif single is not None:
            plain += single.replace(b"\\'", b"'")
        words.append(plain)


def _unescape(escape: re.Match[bytes]) -> bytes:
    """One escape of a double-quoted part: ``\\xHH``, a named one, or the
    escaped byte itself."""
    hexadecimal, other = escape.groups()
    if hexadecimal is not None:
        return bytes([int(hexadecimal, 16)])
    return _ESCAPES.get(other[0], other)


def encode_request(words: Iterable[bytes | str]) -> bytes:
    """A command as clients send it (a multibulk array)."""
    parts = [w.encode() if isinstance(w, str) else w for w in words]
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        out.append(b"$%d\r\n%s\r\n" % (len(part), part))
    return b"".join(out)


class Replies:
    """Reply encoding for one protocol version (2 or 3)."""

    def __init__(self, version: int = 2) -> None:
        if version not in (2, 3):
            raise ValueError("RESP version must be 2 or 3")
        self.version = version

    @staticmethod
    def simple(text: str) -> bytes:
        return b"+" + text.encode() + b"\r\n"

    @staticmethod
    def error(text: str) -> bytes:
        """``text`` starts with its code (``ERR``, ``WRONGTYPE``, ...), which
        ``INFO errorstats`` counts."""
        count_error(text)
        return b"-" + text.replace("\r", " ").replace("\n", " ").encode() + b"\r\n"

    @staticmethod
    def integer(value: int) -> bytes:
        return b":%d\r\n" % value

    def bulk(self, value: bytes | str | None) -> bytes:
        if value is None:
            return self.null()
        if isinstance(value, str):
            value = value.encode()
        return b"$%d\r\n%s\r\n" % (len(value), value)

    def null(self) -> bytes:
        return b"_\r\n" if self.version == 3 else b"$-1\r\n"

    def null_array(self) -> bytes:
        return b"_\r\n" if self.version == 3 else b"*-1\r\n"

    @staticmethod
    def array_header(count: int) -> bytes:
        return b"*%d\r\n" % count

    def map_header(self, count: int) -> bytes:
        """A map of ``count`` pairs (RESP2: a flat array of twice as many)."""
        return b"%%%d\r\n" % count if self.version == 3 else b"*%d\r\n" % (2 * count)

    def double(self, value: float) -> bytes:
        """A score: RESP3's double, RESP2's bulk string, written as Redis does."""
        text = format_double(value)
        if self.version == 3:
            return b"," + text + b"\r\n"
        return b"$%d\r\n%s\r\n" % (len(text), text)

    def boolean(self, value: bool) -> bytes:
        if self.version == 3:
            return b"#t\r\n" if value else b"#f\r\n"
        return b":1\r\n" if value else b":0\r\n"


#: A double as Redis 7.2 writes it in replies (``d2string``: ``50 - 0.1`` is
#: ``49.9``, 7.0's ``%.17g`` wrote ``49.899999999999999``; ``1e-07`` is
#: ``1e-7``, ``-0.0`` is ``-0``), with the native encoders' own code.
format_double: Callable[[float], bytes] = native_or(
    "rankd.frontends.resp._scanner", "format_double", doubles.format_double)[0]
