"""What a RESP command is, and what its handler may use of its connection.

The contract between the connection (:mod:`.connection`: reading,
queueing, admitting, batching, answering) and the command modules
(:mod:`.sorted_sets`, :mod:`.transactions`, :mod:`.monitor`...), owned
here, below both, so that they depend one way: the command table
(:mod:`.commands`) imports the command modules, the connection imports
the table, and no command module imports the connection.

* :class:`Command`: one entry of the command table (its handler and what
  ``COMMAND`` says of it), and :data:`Handler`, the handlers' signature;
* :class:`Context`: the narrow view of a connection a handler is given
  (the service, the gate, the reply writer, the client's state), which
  :class:`~.connection.RespConnection` provides; :class:`Server`, what a
  handler may use of the listener;
* what a handler returns besides a reply (:class:`Writes`,
  :class:`Applied`: :data:`Reply`), and the per-client state of a
  transaction being queued (:class:`Multi`);
* the helpers both sides use: :func:`error_text` (an engine error as a
  reply's text), :func:`endpoint` (an address as ``CLIENT LIST`` writes
  it) and :data:`FAST_WRITES`.

This module may import only the layers below the front-end (the engine,
security) and the RESP modules that know nothing of commands
(:mod:`.protocol`); nothing here runs a command.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from rankd.engine.errors import EngineError, NotPrimary, ReadOnly, Unavailable
from rankd.engine.ingest import IMPLEMENTATION as ingest_implementation
from rankd.engine.submission import Submission
from rankd.frontends.resp.protocol import SCANNER
from rankd.security import Forbidden, Unauthorized

if TYPE_CHECKING:
    from rankd.frontends.connections import ConnectionLimits, Tally
    from rankd.frontends.resp.protocol import Replies
    from rankd.frontends.service import Service
    from rankd.security import Gate, Principal

#: Whether plain writes take the native fast path (see ``_scanner``), and
#: so whether connections pack plain requests for the native paths: these
#: serve every index kind (``rankd.index.kinds``) through its C entry points
#: (``_skiplist.pxd``, ``_pages.pxd``).
FAST_WRITES = SCANNER == "native" and ingest_implementation == "native"

NOAUTH = "NOAUTH Authentication required."


def error_text(exc: EngineError) -> str:
    """An engine or security error as a RESP error reply's text."""
    if isinstance(exc, Forbidden):
        return f"NOPERM {exc.message}"
    if isinstance(exc, Unauthorized):
        return NOAUTH
    if isinstance(exc, ReadOnly):
        return f"READONLY {exc.message}"
    if isinstance(exc, NotPrimary):
        return f"TRYAGAIN {exc.resp_message()}"
    if isinstance(exc, Unavailable):
        return f"TRYAGAIN {exc.message}"
    return f"ERR {exc.message}"


def endpoint(transport: Any, which: str) -> str:
    """``host:port`` of a connection's peer or own end (``[v6]:port`` as
    Redis writes it: ``addr`` and ``laddr`` of CLIENT LIST); empty if gone."""
    found = transport.get_extra_info(which) if transport is not None else None
    if not isinstance(found, tuple) or len(found) < 2:
        return ""
    host = str(found[0])
    return f"{host}:{found[1]}" if ":" not in host else f"[{host}]:{found[1]}"


# --- what a handler returns ------------------------------------------------------------


@dataclass(slots=True)
class Writes:
    """Submissions of one command, and how to answer once applied."""

    submissions: list[Submission]
    answer: Callable[[list[dict[str, Any] | EngineError]], bytes]


@dataclass(slots=True)
class Applied:
    """A command's write, applied already: its reply, sent once ``committed``
    is done (a pipeline's pops: see :mod:`.pop_runs`); ``replies``: how many
    commands' replies ``reply`` holds."""

    reply: bytes
    committed: asyncio.Future[None]
    replies: int = 1


#: What a command handler returns: a reply, a reply to come, writes, or
#: a write applied whose reply waits for its commit.
Reply = bytes | Awaitable[bytes] | Writes | Applied

Handler = Callable[["Context", list[bytes]], Any]


# --- the command table's entries --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Command:
    """One command: its handler and what Redis's ``COMMAND`` says of it."""

    name: str
    arity: int
    handler: Handler
    #: The Gate operation (scope, rate limit); None: open before AUTH too.
    operation: str | None
    flags: tuple[str, ...] = ()
    first_key: int = 0
    last_key: int = 0
    group: str = "sorted-set"
    summary: str = ""
    #: Events the command counts as against rate limits (default 1).
    cost: Callable[[list[bytes]], int] | None = None
    #: Its writes may join the batch of the commands before it.
    batchable: bool = False
    #: Answered at once, without waiting (its handler returns the reply).
    immediate: bool = True
    #: Applied when it runs, its reply waiting for the commit (``.pop_runs``):
    #: the batched writes before it are applied first, the rest stay batched.
    applied_now: bool = False
    #: Shown to monitors once its handler's awaitable has run, not before
    #: (a write that first reads which node writes its key: ``-MOVED`` or
    #: relayed, it never ran here).
    shown_once_routed: bool = False
    subcommands: dict[str, Command] = field(default_factory=dict)


@dataclass(slots=True)
class Multi:
    """A connection's transaction being queued (between MULTI and EXEC)."""

    #: Whether the connection packed plain commands before MULTI (see ``multi``).
    packs: bool
    queued: list[tuple[Command, list[bytes]]] = field(default_factory=list)
    size: int = 0
    #: A command failed its checks (or the bounds were passed): EXECABORT.
    failed: bool = False


# --- what a handler may use ---------------------------------------------------------------


class Server(Protocol):
    """What a command may use of the RESP listener (``RespServer``)."""

    service: Service
    #: What INFO and CONFIG GET report (ports, fsync policy...).
    settings: dict[str, Any]
    limits: ConnectionLimits
    idle_timeout: float
    max_bulk: int
    started_at: float
    total_connections: int
    #: Commands answered, by ``(command, outcome)``.
    stats: Tally[tuple[str, str]]
    connections: set[Context]
    #: The connections that ran MONITOR, in order (:mod:`.monitor`).
    monitors: dict[Context, None]

    def counts(self) -> Tally[tuple[str, str]]: ...

    def reset_counts(self) -> None: ...


class Context(Protocol):
    """What a command handler may use of the connection that runs it
    (:class:`~.connection.RespConnection` is one): what it reaches (the
    service, the gate, the reply writer) and the client's own state, which
    the connection commands (``HELLO``, ``CLIENT``, ``MULTI``...) change."""

    server: Server
    #: The service commands read and write through: inside ``EXEC``, one
    #: whose writes go to the transaction (:mod:`.exec_step`).
    service: Service
    gate: Gate
    #: Replies in the protocol version the client chose (``HELLO``).
    replies: Replies
    id: int
    address: str
    #: The asyncio transport and loop (monitors write to the transport).
    transport: Any
    loop: asyncio.AbstractEventLoop
    #: Who is calling (None before AUTH), and when their credential expires (0: never).
    principal: Principal | None
    deadline: float
    name: str | None
    library: dict[str, str]
    #: The window and period reads use (``RANKD.WINDOW``); None: the board's own.
    window: str | None
    period: str | None
    #: Whether the reader packs runs of plain requests for the native paths.
    packs: bool
    closing: bool
    #: The client is done sending (EOF, or gone: :mod:`rankd.frontends.peer_end`).
    ended: bool
    #: Set by QUIT: close once its reply is written.
    quitting: bool
    multi: Multi | None
    watched: dict[str, Any] | None
    #: Ends the blocking pop this connection waits in, if any (:mod:`.blocking`).
    unblock: Callable[[], None] | None
    #: The requests queued behind the one running (a run of pops reads ahead).
    queue: collections.deque[Any]
    #: On a cluster node: what the client said of itself (``.cluster_commands``).
    cluster_session: Any

    @property
    def authenticated(self) -> bool: ...

    @property
    def expired(self) -> bool: ...

    def authenticate(self, credential: str) -> None:
        """AUTH and HELLO AUTH: a WRONGPASS ``CommandError`` if refused."""

    def reset(self) -> None:
        """RESET: the connection as it was when opened."""

    def describe(self) -> str:
        """The CLIENT INFO / CLIENT LIST line."""

    def freed(self) -> None:
        """A blocking pop met the client's EOF: it and all after it are dropped."""

    def stalled(self) -> None:
        """Drop the connection: it does not read what it is sent."""

    def create_and_write(self, name: str, writes: Writes) -> Awaitable[bytes]:
        """Create key ``name`` as a Redis-like board, then apply ``writes``."""

    def _admit(self, command: Command, words: list[bytes]) -> None:
        """The connection's checks of ``command`` (MULTI queues a command
        admitted as it would run)."""

    def _charger(self, operation: str) -> Callable[[int], None] | None:
        """Charges ``operation``'s rate limit by a count (None: no limit applies)."""
