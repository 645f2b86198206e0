"""Python client for rankd's msgpack TCP protocol (``protocol/PROTOCOL.md``).

:class:`AsyncClient` (asyncio) and :class:`Client` (blocking) have the same
methods.  Concurrent calls on one ``AsyncClient`` are pipelined over one
connection and matched to their answers by request id; the client asks
the server to answer submits as each is committed (``out_of_order``), so
on a cluster one slow board group holds no other caller's answer::

    async with AsyncClient("127.0.0.1", 7701) as client:
        await client.put_board("arena", {"policy": "sum"})
        results = await asyncio.gather(*(client.submit("arena", f"p{i}", delta=1)
                                         for i in range(1000)))
        top = await client.top("arena", limit=10)

    with Client("127.0.0.1", 7701) as client:
        client.submit("arena", "ann", delta=3, event_id="match-17:ann")

Errors the server reports raise the :class:`RankdError` subclass of their
code.  A lost connection is re-established with backoff.  Reads are retried
on it automatically; a write is retried only when it is idempotent (a
submission carrying an ``event_id``, a board put), since otherwise its
first attempt may have been applied already: :class:`ConnectionLost` then
tells the caller.

On a cluster a client reads its own writes (session consistency): each read
of a board carries the log position of the client's last write to it as
``min_seq``, so a follower answers once it applied that write.  Pass
``read_your_writes=False`` to read whatever the node has.
"""

from __future__ import annotations

from rankd.client._async import AsyncClient
from rankd.client._sync import Client
from rankd.client.errors import (
    Conflict,
    ConnectionLost,
    EventConflict,
    Forbidden,
    GuardViolation,
    InvalidInput,
    Moved,
    NotFound,
    NotPrimary,
    ProtocolError,
    RankdError,
    RateLimited,
    ReadOnly,
    RequestTimeout,
    TooLarge,
    Unacknowledged,
    Unauthorized,
    Unavailable,
)
from rankd.security.signing import sign

__all__ = [
    "AsyncClient",
    "Client",
    "Conflict",
    "ConnectionLost",
    "EventConflict",
    "Forbidden",
    "GuardViolation",
    "InvalidInput",
    "Moved",
    "NotFound",
    "NotPrimary",
    "ProtocolError",
    "RankdError",
    "RateLimited",
    "ReadOnly",
    "RequestTimeout",
    "TooLarge",
    "Unacknowledged",
    "Unauthorized",
    "Unavailable",
    "sign",
]
