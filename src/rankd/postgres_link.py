"""A connection to Postgres that comes back: what every long-lived
Postgres client of rankd (the WAL shipper, a follower's log tail) runs on."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import asyncpg

#: What a lost or unreachable Postgres raises.
POSTGRES_ERRORS = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError)


async def reconnecting(dsn: str, *, down: Callable[[BaseException], None],
                       timeout: float = 10.0, min_delay: float = 0.2,
                       max_delay: float = 5.0, reset_on_connect: bool = True
                       ) -> AsyncIterator[asyncpg.Connection]:
    """Connections to ``dsn``, one after another, for ever.

    Each is closed once the consumer's loop body is done with it (the body
    catches its own errors).  A failed attempt is reported to ``down`` and
    retried after a delay that doubles up to ``max_delay``; a connection
    made resets it (unless ``reset_on_connect`` is false: a client whose
    sessions keep failing at once then backs off too); after a connection
    ends, the next attempt waits the current delay.
    """
    delay = min_delay
    while True:
        try:
            conn = await asyncpg.connect(dsn, timeout=timeout)
        except POSTGRES_ERRORS as exc:
            down(exc)
        else:
            if reset_on_connect:
                delay = min_delay
            try:
                yield conn
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(conn.close(), 2)
        await asyncio.sleep(delay)
        delay = min(delay * 2, max_delay)


async def release_cheaply(conn: asyncpg.Connection) -> None:
    """A pool's ``reset``: only roll back a transaction left open.

    asyncpg's default sends a reset query (unlock advisory locks, close
    cursors, unlisten, reset settings) every time a connection goes back to
    its pool: one more round trip per use.  Pools whose users leave no
    session state behind (rankd's cluster pools: transaction-scoped locks
    only, ``LISTEN`` on a connection of its own) pass this instead.
    """
    if conn.is_in_transaction():
        await conn.execute("ROLLBACK")
