"""MONITOR: every command any RESP client runs, streamed to admin connections.

As Redis 7.2 streams it: after a command has run (its own errors
included; one refused before it runs, unknown, of the wrong arity or
not admitted, is not shown), each monitor receives
``+<unix seconds>.<microseconds> [0 <ip>:<port>] "word" "word" ...``, the
words as the client sent them, quoted by Redis's ``sdscatrepr``, the
credentials of ``AUTH`` and ``HELLO ... AUTH`` replaced by
``"(redacted)"``.  Commands Redis flags ``admin`` (``MONITOR``, ``CONFIG``,
``CLIENT LIST``...) are not shown; queued inside ``MULTI`` a command is
shown when ``EXEC`` runs it, before ``EXEC`` itself.

While a monitor is attached no connection packs plain commands for the
native fast paths (``RespConnection.packs``): every command goes the
general path, where it is shown.  With none attached that path is left
as it was, and the general path pays one test of an empty dict.

A monitor is bounded: when what it has not read passes
:data:`OUTPUT_LIMIT` bytes it is disconnected (its unsent output dropped).
A monitor connection may then run only what Redis lets a monitor run:
commands that touch no key (``PING``, ``ECHO``, ``INFO``, ``QUIT``,
``RESET``...); the others answer ``ERR Replica can't interact with the
keyspace``.  ``RESET`` ends monitoring; ``MONITOR`` again is ignored, as
in Redis (no reply).
"""

from __future__ import annotations

import codecs
import logging
import time
from typing import TYPE_CHECKING

from rankd._native import native_or
from rankd.frontends.resp.arguments import CommandError
from rankd.frontends.resp.context import FAST_WRITES, endpoint
from rankd.security import audit

if TYPE_CHECKING:
    from rankd.frontends.resp.context import Command, Context

log = logging.getLogger(__name__)

#: Bytes a monitor may leave unread (the transport's buffer) before it is
#: disconnected: Redis has no such bound for a monitor (a normal client's
#: ``client-output-buffer-limit`` is unlimited), rankd never holds unbounded
#: memory for one client.
OUTPUT_LIMIT = 16 << 20
#: Monitors attached at once: every command's line is written to each.
MAX_MONITORS = 64
#: Commands Redis flags ``admin`` (or ``skip_monitor``): never shown.
NOT_SHOWN = frozenset({"monitor", "config|get", "config|set", "config|resetstat",
                       "client|list", "client|no-evict"})
KEYSPACE_REFUSED = "ERR Replica can't interact with the keyspace"
REDACTED = b"(redacted)"


def monitor(conn: Context, args: list[bytes]) -> bytes:
    """MONITOR: stream every command run from now on to this connection."""
    server = conn.server
    if conn.service is not server.service:  # run by EXEC, as Redis refuses it there
        raise CommandError("ERR MONITOR isn't allowed for DENY BLOCKING client")
    if conn in server.monitors:
        return b""  # ignored, as Redis ignores it: no reply
    if len(server.monitors) >= MAX_MONITORS:
        raise CommandError(f"ERR rankd streams to at most {MAX_MONITORS} monitors at once")
    attach(conn)
    audit("admin_action", operation="monitor", address=conn.address,
          principal=getattr(conn.principal, "name", None))
    return conn.replies.simple("OK")


def attach(conn: Context) -> None:
    """Make ``conn`` a monitor; the first one sends every connection the general way."""
    monitors = conn.server.monitors
    if not monitors:
        _packing(conn, False)
    monitors[conn] = None


def detach(conn: Context) -> None:
    """``conn`` is no monitor any more (RESET, closed); the last one gone,
    connections pack plain commands again."""
    monitors = conn.server.monitors
    if conn in monitors:
        del monitors[conn]
        if not monitors:
            _packing(conn, True)


def _packing(conn: Context, on: bool) -> None:
    """Let every connection of ``conn``'s server pack plain commands for
    the native paths (``on``), or none."""
    packs = FAST_WRITES and on
    for each in conn.server.connections:
        if each.multi is not None:  # MULTI turned packing off: what EXEC turns back on
            each.multi.packs = packs
        else:
            each.packs = packs


def feed(conn: Context, command: Command, words: list[bytes],
         out: list[bytes] | None) -> None:
    """Show the command ``conn`` ran to every monitor (its own line to
    itself into ``out``, after its reply, as Redis writes it)."""
    if command.name in NOT_SHOWN:
        return
    line = line_of(conn, words)
    for each in list(conn.server.monitors):
        if each is conn and out is not None:
            out.append(line)
            continue
        transport = each.transport
        if each.closing or transport is None:
            continue
        # Checked before writing: a monitor never holds more than the limit,
        # even for one line.
        if transport.get_write_buffer_size() + len(line) > OUTPUT_LIMIT:
            log.warning("RESP monitor %s would hold more than %d bytes unread; "
                        "disconnecting it", each.address, OUTPUT_LIMIT)
            each.stalled()  # (what it did not read is dropped)
            continue
        transport.write(line)


def line_of(conn: Context, words: list[bytes]) -> bytes:
    """The monitor line of ``words`` run by ``conn`` now."""
    nanos = time.time_ns()
    head = b"+%d.%06d [0 %s] " % (nanos // 1_000_000_000, nanos // 1000 % 1_000_000,
                                  endpoint(conn.transport, "peername").encode())
    return head + b" ".join(map(quoted, redacted(words))) + b"\r\n"


def redacted(words: list[bytes]) -> list[bytes]:
    """``words`` with the credentials of AUTH and HELLO ... AUTH redacted.
    (Redis leaves them in a malformed AUTH of four words or more, and in a
    HELLO whose version or an option before AUTH is wrong; rankd redacts
    them there too.)"""
    name = words[0].lower()
    if name == b"auth":
        return [words[0], *[REDACTED] * (len(words) - 1)]
    if name != b"hello":
        return words
    words = list(words)
    position = 1  # (an AUTH may come first: HELLO AUTH user pass)
    while position < len(words):
        if words[position].lower() == b"auth":
            # Its two words, or what is left of them: a lone token
            # (``HELLO 3 AUTH <key>``) is a credential too.
            for secret in range(position + 1, min(position + 3, len(words))):
                words[secret] = REDACTED
            position += 3
        else:
            position += 1
    return words


def _quoted(word: bytes) -> bytes:
    """``word`` quoted as Redis's ``sdscatrepr`` quotes it: ``\\\\``, ``\\"``,
    ``\\n``, ``\\r``, ``\\t``, ``\\a``, ``\\b``, other bytes outside
    printable ASCII as ``\\xhh`` (natively: ``_monitor.quoted``).

    Without the native module, in linear time at C speed (tens of
    milliseconds for a megabyte of escapes, where the native one takes
    one): Python's ``escape_encode`` writes the same escapes but for ``"`` (not
    escaped), ``'`` (escaped), BEL and BS (``\\x07``, ``\\x08``); its
    output is printable ASCII, so a NUL stands for each escaped backslash
    while those four are put right, and no ``\\x07`` of the text is taken
    for one."""
    escaped = codecs.escape_encode(word)[0]  # type: ignore[attr-defined]
    if b"\\" in escaped or b'"' in escaped:
        escaped = (escaped.replace(b"\\\\", b"\0").replace(b"\\'", b"'")
                   .replace(b"\\x07", b"\\a").replace(b"\\x08", b"\\b")
                   .replace(b'"', b'\\"').replace(b"\0", b"\\\\"))
    return b'"' + escaped + b'"'


quoted, _ = native_or("rankd.frontends.resp._monitor", "quoted", _quoted)
