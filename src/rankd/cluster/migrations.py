"""The schema migrations a cluster node runs as it starts, tried again when
Postgres ends them midway.

What it owns: running a node's start-up migrations (``CREATE ... IF NOT
EXISTS`` and the like, each a transaction behind the migrations' advisory
lock) so that a session Postgres ends in the middle of one does not stop the
node.  Its design: a node's connections carry half a lease as
``idle_in_transaction_session_timeout`` and ``lock_timeout``
(``node.session_settings``), so that a stalled node never keeps others
waiting on its locks; the migrations keep those limits (one holds an
exclusive lock on ``rankd_nodes``, which every node's heartbeat writes) and a
node stalled midway (a loaded machine, a pause) is what they end.  Such an
ending is transient: the migrations are idempotent, so they run again from
the start on a fresh pooled connection, a few times with a short back-off.
A failure that persists, or any other error (a refused password, a database
that does not exist), is raised as before for the start to report.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import asyncpg

log = logging.getLogger(__name__)

#: Tries of the whole set of migrations, and the pause before the n-th retry.
ATTEMPTS = 5
BACKOFF_SECONDS = 0.5

#: What Postgres or the driver raise when a session ended midway: the
#: idle-in-transaction timeout, a lock wait past ``lock_timeout``, the
#: connection closed under the transaction (asyncpg raises an
#: ``InterfaceError`` for a closed connection, or an ``InternalClientError``
#: when the session's end arrives while it is between two queries).
TRANSIENT = (asyncpg.IdleInTransactionSessionTimeoutError, asyncpg.LockNotAvailableError,
             asyncpg.PostgresConnectionError, asyncpg.InterfaceError,
             asyncpg.exceptions._base.InternalClientError, ConnectionError)


async def migrate_retrying(migrate: Callable[[], Awaitable[None]], node: str) -> None:
    """Run ``migrate`` (every start-up migration, idempotent), again from
    the start after a transient ending (:data:`TRANSIENT`), up to
    :data:`ATTEMPTS` times."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            await migrate()
            return
        except TRANSIENT as exc:
            if attempt == ATTEMPTS:
                raise
            log.warning("node %s: a schema migration was ended midway (%s: %s); trying "
                        "again (%d of %d)", node, type(exc).__name__, exc, attempt + 1,
                        ATTEMPTS)
            await asyncio.sleep(BACKOFF_SECONDS * attempt)
