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


class OneConnection:
    """One connection, used by one caller at a time through ``acquire()``
    as a pool's would be (so :class:`rankd.cluster.log.ClusterLog` runs on
    it), and dropped at once when a use fails or times out: the next use
    opens a fresh one.  For a client that must answer within a deadline
    (a node's lease renewals): a pool would first wait, up to the same
    timeout again, for a query cancelled on a dead link to be confirmed."""

    def __init__(self, dsn: str, *, connect_seconds: float,
                 server_settings: dict[str, str] | None = None) -> None:
        self.dsn = dsn
        self.connect_seconds = connect_seconds
        self.server_settings = server_settings
        self._conn: asyncpg.Connection | None = None
        self._lock = asyncio.Lock()

    @contextlib.asynccontextmanager
    async def acquire(self, *, timeout: float | None = None
                      ) -> AsyncIterator[asyncpg.Connection]:
        async with self._lock:
            if self._conn is None or self._conn.is_closed():
                seconds = self.connect_seconds if timeout is None else min(
                    timeout, self.connect_seconds)
                self._conn = await asyncpg.connect(self.dsn, timeout=seconds,
                                                   server_settings=self.server_settings)
            try:
                yield self._conn
            except BaseException:
                self.terminate()
                raise

    def terminate(self) -> None:
        """Drop the connection without a word to Postgres."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.terminate()

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(*POSTGRES_ERRORS):
                await conn.close(timeout=1)
