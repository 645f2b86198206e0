"""Connection limits shared by the HTTP and TCP listeners.

Every open connection holds a file descriptor and buffers.  Without limits,
clients that connect and send nothing (or a request a byte at a time) hold
them forever, and once the process runs out of descriptors nobody else can
connect and the log cannot open a new segment.  So:

- a global cap (``--max-connections``; by default what the descriptor
  limit leaves after a reserve for the data dir) and a cap per client
  address (``--max-connections-per-address``; loopback clients, the same
  machine, are exempt as from rate limits);
- a connection over a cap is answered (HTTP 503, or a TCP error frame) and
  closed before anything else reads from it;
- the listeners close connections that stay silent: HTTP through aiohttp's
  keep-alive timeout, which also runs from the moment a connection opens
  and while a request's headers trickle in; TCP and RESP through their own
  sweeper, which also closes a session whose credential has expired and
  drops a client whose replies have waited for it to read for
  :data:`OUTPUT_STALL_SECONDS` (Redis's ``client-output-buffer-limit``).

:class:`GuardedHttpProtocol` puts the caps in front of aiohttp's request
handler without touching it: it forwards every protocol call.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import re
import resource
import time
from collections.abc import Callable
from typing import Any, TypeVar

from aiohttp import web, web_response

from rankd.engine.errors import EngineError
from rankd.frontends.peer_end import GoneTransport
from rankd.security.auth import JWT_LEEWAY_SECONDS
from rankd.security.limits import is_loopback

log = logging.getLogger(__name__)

#: Descriptors kept for the WAL, snapshots, Postgres and the like.
RESERVED_DESCRIPTORS = 256
DEFAULT_PER_ADDRESS = 256
#: A handed-over run's error before the engine is done with it.
_PENDING = object()
#: A connection's worker gives the loop way after this much work (seconds),
#: whatever it has left: a pipeline of general-path requests to a reader
#: that keeps up (or to a gone one) would otherwise hold it for seconds.
BATCH_SECONDS = 0.004


def raise_descriptor_limit() -> int:
    """Raise the soft descriptor limit to the hard one; returns the limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = max(soft, 1 << 20)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft


def default_max_connections() -> int:
    """What the descriptor limit leaves after :data:`RESERVED_DESCRIPTORS`."""
    return max(64, raise_descriptor_limit() - RESERVED_DESCRIPTORS)



K = TypeVar("K")


class Tally(dict[K, int]):
    """Counts by key, 0 for a key never counted.

    ``collections.Counter`` would do, but it defines ``__delitem__``, which
    sends every ``counts[key] += n`` through a Python-level method lookup:
    about 1,000 instructions on each unpipelined RESP write.
    """

    __slots__ = ()

    def __missing__(self, key: K) -> int:
        return 0

class ConnectionLimits:
    """Counts open connections, in all and per client address."""

    def __init__(self, max_total: int, max_per_address: int = DEFAULT_PER_ADDRESS,
                 exempt: Callable[[str], bool] = is_loopback) -> None:
        self.max_total = max_total
        self.max_per_address = max_per_address
        #: Addresses without a per-address cap (loopback; trusted proxies).
        self.exempt = exempt
        self.total = 0
        self.by_address: collections.Counter[str] = collections.Counter()
        #: Connections refused, for metrics.
        self.refused = 0

    def admit(self, address: str) -> str | None:
        """Count a new connection from ``address``; or the reason it is refused."""
        if self.total >= self.max_total:
            self.refused += 1
            return f"rankd holds its maximum of {self.max_total} connections"
        if (self.max_per_address and self.by_address[address] >= self.max_per_address
                and not self.exempt(address)):
            self.refused += 1
            return (f"this address holds its maximum of {self.max_per_address} "
                    "connections")
        self.total += 1
        self.by_address[address] += 1
        return None

    def release(self, address: str) -> None:
        self.total -= 1
        self.by_address[address] -= 1
        if self.by_address[address] <= 0:
            del self.by_address[address]


def peer_address(transport: asyncio.BaseTransport) -> str:
    peer = transport.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, tuple) else ""


#: The ``Server`` header of every HTTP answer: no versions (they tell an
#: attacker which flaws to try).
SERVER_NAME = "rankd"
#: How an HTTP connection's first bytes begin: a method, then a blank (or
#: the first bytes are a part of that).
_REQUEST_START = re.compile(rb"[A-Z]{1,16}(?: |$)")
_NOT_HTTP = (b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n"
             b"Connection: close\r\nContent-Length: 61\r\n\r\n"
             b'{"error": {"code": "bad_request", "message": "not HTTP/1.1"}}')


class GuardedHttpProtocol(asyncio.Protocol):
    """aiohttp's request handler behind :class:`ConnectionLimits`.

    A connection whose first bytes are not the start of a request line is
    answered 400 and closed here, unparsed: aiohttp's parser quotes all it
    read in its error, in an exception that a reference cycle keeps until
    Python's next full collection (240 KB of garbage held ~0.9 MB a
    connection, 200 connections 190 MB)."""

    __slots__ = ("_address", "_handler", "_limits", "_started")

    def __init__(self, handler: asyncio.Protocol, limits: ConnectionLimits) -> None:
        self._handler = handler
        self._limits = limits
        self._address: str | None = None
        self._started = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        address = peer_address(transport)
        refused = self._limits.admit(address)
        if refused is not None:
            body = b'{"error": {"code": "too_many_connections", "message": "' + \
                refused.encode() + b'"}}'
            transport.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: "  # type: ignore[attr-defined]
                            b"application/json\r\nConnection: close\r\nRetry-After: 1\r\n"
                            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            transport.close()
            return
        self._address = address
        self._handler.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._address is None:
            return
        self._limits.release(self._address)
        self._address = None
        self._handler.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._address is None:
            return
        if not self._started:
            self._started = True
            if _REQUEST_START.match(data) is None:
                transport = self._handler.transport  # type: ignore[attr-defined]
                if transport is not None:
                    transport.write(_NOT_HTTP)
                    transport.close()
                return
        self._handler.data_received(data)

    def eof_received(self) -> bool | None:
        return self._handler.eof_received() if self._address is not None else None

    def pause_writing(self) -> None:
        self._handler.pause_writing()

    def resume_writing(self) -> None:
        self._handler.resume_writing()


def guarded_http_factory(factory: Any, limits: ConnectionLimits) -> Any:
    """A protocol factory for ``loop.create_server``: aiohttp's ``factory``
    (``AppRunner.server``) behind ``limits``."""
    # aiohttp answers what it cannot parse (a duplicate Content-Length or
    # Host, a folded header) itself, before any handler or signal: its
    # default Server header, which names versions, is rankd's instead.
    web_response.SERVER_SOFTWARE = SERVER_NAME
    return lambda: GuardedHttpProtocol(factory(), limits)


class GuardedSite(web.BaseSite):
    """aiohttp's ``TCPSite``, with every connection through ``limits``."""

    __slots__ = ("_host", "_limits", "_port")

    def __init__(self, runner: web.BaseRunner, host: str, port: int,
                 limits: ConnectionLimits, *, ssl_context: Any = None) -> None:
        super().__init__(runner, ssl_context=ssl_context, backlog=1024)
        self._host = host
        self._port = port
        self._limits = limits

    @property
    def name(self) -> str:
        scheme = "https" if self._ssl_context else "http"
        return f"{scheme}://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            guarded_http_factory(self._runner.server, self._limits), self._host, self._port,
            ssl=self._ssl_context, backlog=self._backlog, reuse_address=True)


class PipelinedConnection(asyncio.Protocol):
    """What the TCP and RESP connections share: admission under the
    server's :class:`ConnectionLimits`, back-pressure from the transport,
    and runs of packed writes handed to the engine from ``data_received``
    (``answering``, in order) whose replies are written once committed.

    A subclass encodes a run's replies (:meth:`_encoded`), says how a
    connection over a cap is refused (:meth:`_refuse`) and drops what it
    queued (:meth:`_forget`).
    """

    def __init__(self, server: Any) -> None:
        self.server = server
        self.transport: Any = None
        self.address = ""
        self.admitted = False
        self.closing = False
        #: The client is done sending (EOF, or gone): what it sent runs,
        #: then the connection closes (:mod:`.peer_end`).
        self.ended = False
        #: The transport is lost: what was received runs unanswered
        #: (reads skipped: :mod:`.gone_work`), since ``gone_at`` (loop time).
        self.gone = False
        self.gone_at = 0.0
        self.reading_paused = False
        self.can_write = asyncio.Event()
        self.can_write.set()
        #: ``can_write.is_set()``, read on every ``data_received``.
        self.writable = True
        #: Packed runs handed to the engine from ``data_received``, not
        #: answered yet, in order: ``[run, error]``, the error ``_PENDING``
        #: until the engine is done with the run.
        self.answering: collections.deque[list[Any]] = collections.deque()
        #: Done once ``answering`` is empty, while someone waits for that.
        self._all_answered: asyncio.Future[None] | None = None
        #: The task answering queued requests, while there are some.
        self.worker: asyncio.Task | None = None
        #: ``Gate.charger`` by operation, for the caller they were worked out for.
        self._chargers: dict[str, Callable[[int], None] | None] = {}
        self._charged_for: Any = None
        #: When the caller's credential expires, in loop time (0: never).
        self.deadline = 0.0
        #: Since when (loop time) replies wait for a client that does not
        #: read (None: it reads).
        self.blocked_since: float | None = None

    @property
    def authenticated(self) -> bool:
        """Whether the handshake is done (the sweeper's deadline stops)."""
        raise NotImplementedError

    @property
    def busy(self) -> bool:
        """Whether requests of this connection are still being worked on."""
        raise NotImplementedError

    def handshake_expired(self) -> None:
        """Close: the handshake took longer than ``HANDSHAKE_SECONDS``."""
        raise NotImplementedError

    def idle_expired(self) -> None:
        """Close: silent for the idle timeout."""
        raise NotImplementedError

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.loop = asyncio.get_running_loop()
        self.address = peer_address(transport)
        self.opened_at = self.last_active = self.loop.time()
        refused = self.server.limits.admit(self.address)
        if refused is not None:
            self._refuse(refused)
            return
        self.admitted = True
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.writable = True
        self.can_write.set()
        self.blocked_since = None
        if not self.closing and self.admitted and self._has_work():
            # The client is gone with requests received and not run yet:
            # they run, unanswered, and the slot is held until they are done.
            self.ended = self.gone = True
            self.gone_at = self.loop.time()
            self.transport = GoneTransport(self.transport, self._released)
            self._ended()
            return
        self._released()

    def _released(self) -> None:
        """The connection is done: its slot is free and what it holds dropped."""
        self.closing = True
        if self.admitted:
            self.admitted = False
            self.server.limits.release(self.address)
        self.server.connections.discard(self)
        self._forget()
        self.answering.clear()
        self._tell_answered()

    def eof_received(self) -> bool | None:
        """The client is done sending: run what it sent, in order, and
        write the replies (a half-close keeps the transport writable),
        then close (:meth:`_finish`).  Over TLS the transport closes
        regardless: the requests still run, unanswered (``connection_lost``)."""
        if self.closing or not self.admitted:
            return None
        first = not self.ended
        self.ended = True
        if first:
            self._ended()
        if not (self._has_work() or self.answering) or self.closing:
            return None  # nothing left to answer: asyncio closes the transport
        if self.transport.get_extra_info("sslcontext") is not None:
            return None  # (asyncio's TLS transport cannot stay open half-closed)
        return True

    def _has_work(self) -> bool:
        """Whether requests received are still to run (a subclass adds what
        its reader holds)."""
        return bool(self.queue) or self.worker is not None

    def _ended(self) -> None:
        """The client is done sending (a subclass drops what Redis would)."""

    def _finish(self) -> None:
        """Close an ended connection once what it received has run and its
        replies are written."""
        if not self.ended or self.closing or self._has_work():
            return
        if self.answering:  # runs with the engine: once they are answered
            if self._all_answered is None:
                self._all_answered = self.loop.create_future()
            self._all_answered.add_done_callback(lambda _: self._finish())
            return
        self.closing = True
        if self.blocked_since is None and self.transport.get_write_buffer_size():
            # The close waits for the client to read the rest: no longer than
            # replies wait for an open connection (the sweeper's stall check).
            self.blocked_since = self.loop.time()
        self.transport.close()  # (a GoneTransport releases the connection)

    def pause_writing(self) -> None:
        self.writable = False
        self.can_write.clear()
        self.blocked_since = self.loop.time()

    def resume_writing(self) -> None:
        self.writable = True
        self.can_write.set()
        self.blocked_since = None

    def expires_with(self, principal: Any) -> None:
        """Set :attr:`deadline` from the credential ``principal`` came with."""
        expires = getattr(principal, "expires", None)
        self.deadline = 0.0 if expires is None else (
            self.loop.time() + expires + JWT_LEEWAY_SECONDS - time.time())

    @property
    def expired(self) -> bool:
        """Whether the caller's credential has expired (checked on use)."""
        return self.deadline != 0 and self.loop.time() > self.deadline

    def session_expired(self) -> None:
        """Close: the credential the session was opened with has expired
        (a subclass says so to the client first)."""
        self.closing = True
        self._forget()
        if self.transport is not None:
            self.transport.close()

    def abandoned(self) -> None:
        """Drop what a gone connection has not run yet: it took longer
        than a stalled client may hold its slot (:mod:`.gone_work`)."""
        log.warning("%s: the client closed; requests it sent not run within %.0f s of the"
                    " close were dropped", self.address, self.loop.time() - self.gone_at)
        self.transport.close()  # (a GoneTransport: released, its queue dropped)

    def stalled(self) -> None:
        """Close at once: replies have waited for the client to read for
        longer than the idle timeout (it may never read)."""
        self.closing = True
        self._forget()
        if self.transport is not None:
            self.transport.abort()  # what is unsent is dropped: the memory is freed

    def _charger(self, operation: str) -> Callable[[int], None] | None:
        """``Gate.charger`` of ``operation`` for the connection's caller
        (``principal``, which a subclass keeps), worked out once per caller."""
        principal = self.principal
        if principal is not self._charged_for:
            self._charged_for, self._chargers = principal, {}
        try:
            return self._chargers[operation]
        except KeyError:
            charge = self._chargers[operation] = self.server.gate.charger(
                principal, operation, self.address)
            return charge

    def _hand_over(self, packed: Any) -> None:
        """Hand a run to the engine: its replies follow once it is committed."""
        entry = [packed, _PENDING]
        self.answering.append(entry)
        self.server.service.submit_packed_then(packed, self._applied, entry)

    def _applied(self, entry: list[Any], error: BaseException | None) -> None:
        """A run handed over is committed (or failed with ``error``): write
        the replies of the runs at the head of ``answering`` that are done."""
        entry[1] = error
        answering = self.answering
        while answering and answering[0][1] is not _PENDING:
            packed, error = answering.popleft()
            if error is not None:
                if not isinstance(error, EngineError):
                    log.error("a packed run failed; closing the connection", exc_info=error)
                    self.transport.abort()
                    return
                packed.answers = [error] * len(packed)
            if not self.closing:
                self.transport.write(self._encoded(packed))
        if not answering and self._all_answered is not None:
            self._tell_answered()

    async def answered(self) -> None:
        """Return once every run handed over is answered (at once if none is)."""
        while self.answering:
            if self._all_answered is None:
                self._all_answered = asyncio.get_running_loop().create_future()
            await asyncio.wait((self._all_answered,))  # shared: a waiter's cancel leaves it

    def _tell_answered(self) -> None:
        waited, self._all_answered = self._all_answered, None
        if waited is not None and not waited.done():
            waited.set_result(None)

    def _encoded(self, packed: Any) -> bytes:
        """The replies of an applied packed run."""
        raise NotImplementedError

    def _refuse(self, reason: str) -> None:
        """Answer a connection over a cap, and close it."""
        raise NotImplementedError

    def _forget(self) -> None:
        """Drop what the connection queued (it is gone)."""


#: Until a connection has authenticated (TCP: said hello too), how long it may take.
HANDSHAKE_SECONDS = 10.0
#: How long replies may wait for a client that does not read (or the idle
#: timeout, if shorter): the connection and what it holds are then dropped.
OUTPUT_STALL_SECONDS = 60.0
#: How often connections are checked for that deadline and the idle timeout.
SWEEP_SECONDS = 1.0


class PipelinedServer:
    """The listener the TCP and RESP protocols share: it makes a
    :class:`PipelinedConnection` per client, closes those past the
    handshake deadline or the idle timeout, and on :meth:`close` lets
    queued requests and handed-over runs finish before closing them all."""

    #: The sweeper task's name.
    name = "rankd-listener"

    def __init__(self, *, limits: ConnectionLimits | None, idle_timeout: float) -> None:
        self.limits = limits or ConnectionLimits(default_max_connections())
        #: Seconds a connection may stay silent (0: forever).
        self.idle_timeout = idle_timeout
        self.connections: set[Any] = set()
        #: (command or op, "ok" or error code) -> requests the Python paths
        #: answered; all of them: :meth:`counts`.
        self.stats: Tally[tuple[str, str]] = Tally()
        #: The native lanes' ``LaneCounts`` (made by the first lane).
        self.lane_counts: Any = None
        #: The loop's ``pacing.LoopPacer`` (None: the loop is not paced).
        self.pacer: Any = None
        self._server: asyncio.AbstractServer | None = None
        self._sweeper: asyncio.Task | None = None

    def _connection(self) -> PipelinedConnection:
        raise NotImplementedError

    def counts(self) -> Tally[tuple[str, str]]:
        """Requests answered, by (command or op, "ok" or error code)."""
        counts = Tally(self.stats)
        if self.lane_counts is not None:
            for key, count in self.lane_counts.items():
                if count:
                    counts[key] += count
        return counts

    def reset_counts(self) -> None:
        self.stats.clear()
        if self.lane_counts is not None:
            self.lane_counts.clear()

    async def start(self, host: str, port: int, ssl: Any = None) -> int:
        """Listen; returns the port (useful with port 0)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._connection, host, port,
                                                reuse_address=True, ssl=ssl)
        self._sweeper = asyncio.create_task(self._sweep(), name=f"{self.name}-sweeper")
        return self._server.sockets[0].getsockname()[1]

    @property
    def addresses(self) -> list[str]:
        """The host addresses the listener is bound to."""
        if self._server is None:
            return []
        return [sock.getsockname()[0] for sock in self._server.sockets]

    async def _sweep(self) -> None:
        """Close connections past the handshake deadline or the idle timeout."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(SWEEP_SECONDS)
            now = loop.time()
            if self.pacer is not None:
                self.pacer.set_active(self, sum(
                    1 for c in self.connections if now - c.last_active < SWEEP_SECONDS))
            stall = min(self.idle_timeout or OUTPUT_STALL_SECONDS, OUTPUT_STALL_SECONDS)
            for connection in list(self.connections):
                blocked = connection.blocked_since
                if blocked is not None and now - blocked > stall:
                    # (Redis: client-output-buffer-limit.)  Closing ones too: a
                    # client that half-closed, or sent QUIT, and never reads.
                    connection.stalled()
                elif connection.closing:
                    continue
                elif connection.gone and now - connection.gone_at > stall:
                    connection.abandoned()  # nobody reads: held no longer than a stalled one
                elif not connection.authenticated:
                    if now - connection.opened_at > HANDSHAKE_SECONDS:
                        connection.handshake_expired()
                elif connection.deadline and now > connection.deadline:
                    connection.session_expired()
                elif (self.idle_timeout and now - connection.last_active > self.idle_timeout
                        and not connection.busy):
                    connection.idle_expired()

    async def close(self, grace: float = 10.0) -> None:
        """Stop accepting, let queued requests finish, close every connection."""
        if self._server is None:
            return
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        self._server.close()
        answering = [asyncio.ensure_future(c.answered()) for c in self.connections
                     if c.answering]
        busy = [c.worker for c in self.connections if c.worker is not None] + answering
        if busy:
            await asyncio.wait(busy, timeout=grace)
        for waiting in answering:
            waiting.cancel()
        for connection in list(self.connections):
            if connection.transport is not None:
                connection.transport.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 2)
        self._server = None
