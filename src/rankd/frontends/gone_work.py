"""What a *gone* connection still spends (see :mod:`.peer_end`).

A connection whose client closed with requests received and not run yet
runs them unanswered, so that the writes among them are applied as
Redis applies what it read.  What it owns: which of those requests are
skipped, and how long the rest may take.  Its design:

* A read-only request has no effect to keep once nobody can read its
  answer: it is skipped (a Redis command flagged ``readonly``, outside
  ``MULTI``, where an erroneous one would abort the ``EXEC``; a TCP
  operation of scope ``read`` or none).  Its order relative to the writes
  does not matter: it changes nothing.  A client that pipelined thousands
  of large reads and closed once cost seconds of CPU for replies nobody
  read, its connection slot held meanwhile.
* The rest (writes, ``AUTH``, ``MULTI``/``EXEC``...) runs in order, within
  the bound an open client that stops reading its replies is held to (the
  idle timeout, at most ``OUTPUT_STALL_SECONDS``) of the close: the
  listener's sweeper then drops what is left (``abandoned``), and the log
  says so.  A slot is never held longer by a gone client than by a
  stalled one.
"""

from __future__ import annotations

from typing import Any

from rankd.security import OPERATION_SCOPES


def resp_read_only(words: Any, commands: dict[bytes, Any]) -> bool:
    """Whether ``words`` (a parsed Redis command) is one of ``commands``
    flagged read-only (a container of subcommands is not)."""
    if type(words) is not list or not words:
        return False
    command = commands.get(bytes(words[0]).lower())
    return command is not None and not command.subcommands and "readonly" in command.flags


def tcp_read_only(message: Any, operations: Any) -> bool:
    """Whether ``message`` (a decoded TCP request) is an operation of
    ``operations`` that only reads (scope ``read`` or none)."""
    if type(message) is not list or len(message) != 3:
        return False
    op = message[1]
    return type(op) is str and op in operations and OPERATION_SCOPES.get(op, "admin") in (
        None, "read")

