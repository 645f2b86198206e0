"""What a TCP or RESP connection does once its client is done sending.

Redis runs every command it has read before it sees a client's EOF: a
client that pipelines a batch and then half-closes (``shutdown(SHUT_WR)``,
``nc -q0``, ``redis-cli --pipe``) gets every command applied and every
reply written; one that closes at once gets them applied, unanswered.
``PipelinedConnection`` does the same, under the bounds it keeps anyway
(what it queued and buffered; nothing more is read):

- on EOF (``eof_received``) the connection is *ended*: the requests
  received run in order, their replies are written, and the transport
  is closed once the last is (``eof_received`` returns True to keep it
  writable; over TLS, where a half-close cannot keep it, as below);
- when the transport is lost while requests received are still to run
  (the client closed and a reply met its reset), the connection is *gone*:
  its transport becomes a :class:`GoneTransport`, which drops every write,
  and the requests run unanswered (the reads skipped, within a time
  bound: :mod:`.gone_work`); its connection slot is released once they
  are done.

A close the daemon decides (``QUIT``, a protocol error, an expired
session, a stalled reader, shutdown past its grace) still stops at once:
that is ``closing``, which this module never sets.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any


class GoneTransport:
    """Stands for a lost transport while a gone connection finishes what
    it received: writes and flow control are no-ops; ``close``/``abort``
    call ``closed`` (the connection's clean-up), once."""

    __slots__ = ("_closed", "_lost")

    def __init__(self, lost: Any, closed: Callable[[], None]) -> None:
        self._lost = lost
        self._closed: Callable[[], None] | None = closed

    def write(self, data: bytes) -> None:
        """Dropped: nobody is left to read it."""

    def writelines(self, parts: Iterable[bytes]) -> None:
        """Dropped: nobody is left to read it."""

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def is_closing(self) -> bool:
        return True

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        """What the lost transport knew (the peer's address...)."""
        return self._lost.get_extra_info(name, default)

    def close(self) -> None:
        closed, self._closed = self._closed, None
        if closed is not None:
            closed()

    abort = close
