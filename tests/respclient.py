"""A raw RESP client for tests: sends commands, returns each reply's bytes
exactly as the server wrote them (so two servers' replies can be compared
byte for byte)."""

from __future__ import annotations

import socket

from rankd.frontends.resp.protocol import encode_request

#: Aggregate reply types, and how many replies each of their elements is.
_AGGREGATE = {ord("*"): 1, ord("~"): 1, ord(">"): 1, ord("%"): 2, ord("|"): 2}


class RawClient:
    """One connection; :meth:`call` sends a command and reads its reply."""

    def __init__(self, port: int, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buffer = b""

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, payload: bytes) -> None:
        self.sock.sendall(payload)

    def call(self, *words: bytes | str) -> bytes:
        self.send(encode_request(words))
        return self.reply()

    def pipeline(self, commands: list[list[bytes | str]]) -> list[bytes]:
        """Send every command at once, then read every reply."""
        self.send(b"".join(encode_request(words) for words in commands))
        return [self.reply() for _ in commands]

    def reply(self) -> bytes:
        """The bytes of the next whole reply (an attribute counts as part of it)."""
        start = 0
        end = self._skip(start)
        raw, self.buffer = self.buffer[:end], self.buffer[end:]
        return raw

    def _line_end(self, position: int) -> int:
        while True:
            end = self.buffer.find(b"\r\n", position)
            if end >= 0:
                return end
            self._more()

    def _more(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        self.buffer += chunk

    def _skip(self, position: int) -> int:
        """Where the reply starting at ``position`` ends."""
        while len(self.buffer) <= position:
            self._more()
        kind = self.buffer[position]
        end = self._line_end(position)
        header = self.buffer[position + 1:end]
        after = end + 2
        if kind in (ord("$"), ord("="), ord("!")):
            length = int(header)
            if length < 0:
                return after
            while len(self.buffer) < after + length + 2:
                self._more()
            return after + length + 2
        if kind in _AGGREGATE:
            count = int(header)
            for _ in range(max(count, 0) * _AGGREGATE[kind]):
                after = self._skip(after)
            return after
        return after
