"""Bounds on the log lines a client can make the daemon write.

A client that repeats what makes a line (a wrong password, a malformed
request) would otherwise fill the disk.  So past :data:`BURST` lines of one
kind from one address in :data:`WINDOW_SECONDS`, lines are counted instead,
and the next line let through says how many were left out.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable

from aiohttp.http_exceptions import HttpProcessingError

#: Lines of one kind from one address let through per window.
BURST = 20
WINDOW_SECONDS = 60.0
#: Kinds and addresses remembered at most (all forgotten past it).
MAX_KEYS = 10_000
#: The longest account of a client's malformed request kept in a line.
EXCERPT_CHARS = 200


class LineBudget:
    """At most ``burst`` lines per key and ``window`` seconds; the rest counted."""

    def __init__(self, burst: int = BURST, window: float = WINDOW_SECONDS) -> None:
        self.burst = burst
        self.window = window
        #: key -> [window start (monotonic), lines in it, lines left out of it]
        self._seen: dict[Hashable, list] = {}

    def admit(self, key: Hashable) -> int | None:
        """None when a line of ``key`` is to be left out (it is counted);
        otherwise how many of its lines were left out before it (0: none)."""
        now = time.monotonic()
        seen = self._seen.get(key)
        left_out = 0
        if seen is None or now - seen[0] > self.window:
            if len(self._seen) > MAX_KEYS:
                self._seen.clear()
            left_out = seen[2] if seen is not None else 0
            seen = self._seen[key] = [now, 0, 0]
        seen[1] += 1
        if seen[1] > self.burst:
            seen[2] += 1
            return None
        return left_out


class ClientErrorFilter(logging.Filter):
    """For aiohttp's ``aiohttp.server`` logger, whose "Error handling
    request" lines a client sending garbage in a loop makes at will.

    Lines are budgeted per message and client address (:class:`LineBudget`).
    A line about a malformed request (an ``HttpProcessingError``) loses its
    traceback, which tells nothing about rankd, and keeps the start of the
    error, which quotes what the client sent (all of one read: up to 1 MB).
    """

    def __init__(self, budget: LineBudget | None = None) -> None:
        super().__init__()
        self.budget = budget or LineBudget()

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        left_out = self.budget.admit((record.msg, args[0] if args else None))
        if left_out is None:
            return False
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, HttpProcessingError) or left_out:
            message = record.getMessage()
            if isinstance(error, HttpProcessingError):
                account = " ".join(f"{type(error).__name__}: {error}".split())
                message += ": " + account[:EXCERPT_CHARS]
                record.exc_info = record.exc_text = None
            if left_out:
                message += f" ({left_out} more such lines left out)"
                record.fields = {**getattr(record, "fields", {}), "suppressed": left_out}
            record.msg, record.args = message, ()
        return True
