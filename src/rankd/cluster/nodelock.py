"""One running process per node id.

Two processes started with the same ``--node-id`` would take each other's
groups in a loop (each takes what it believes it already holds).  A node
therefore holds a Postgres advisory lock on its id, on a session of its
own, for as long as it runs: a second process with that id finds it held
and refuses to start.  The lock dies with the session, so a node that
crashed or was killed frees its id at once, and one whose machine was lost
within about :data:`KEEPALIVE_SECONDS` (TCP keepalives on that session).
"""

from __future__ import annotations

import logging

import asyncpg

log = logging.getLogger(__name__)

#: The first key of every node id's lock (the second: a hash of the id).
LOCK_SPACE = 7231003
#: How long Postgres keeps the session of a node whose machine vanished.
KEEPALIVE_SECONDS = 30
_KEEPALIVES = {"tcp_keepalives_idle": "10", "tcp_keepalives_interval": "5",
               "tcp_keepalives_count": "4"}


class NodeIdInUse(RuntimeError):
    """Another live process runs with this node id."""


class NodeLock:
    """The advisory lock of one node id, on a connection of its own."""

    def __init__(self, dsn: str, node_id: str, *, timeout: float = 5.0,
                 space: int = LOCK_SPACE) -> None:
        self.dsn = dsn
        self.node_id = node_id
        self.timeout = timeout
        #: The lock's first key (another one: another kind of lock, e.g. the planner's).
        self.space = space
        self._conn: asyncpg.Connection | None = None

    @property
    def held(self) -> bool:
        """Whether this process holds the lock (its session is open)."""
        return self._conn is not None and not self._conn.is_closed()

    async def try_acquire(self) -> bool:
        """Take the lock if no other session holds it; whether this one does."""
        if self.held:
            return True
        conn = await asyncpg.connect(self.dsn, timeout=self.timeout,
                                     server_settings=_KEEPALIVES)
        try:
            taken = await conn.fetchval("SELECT pg_try_advisory_lock($1, hashtext($2))",
                                        self.space, self.node_id)
        except BaseException:
            await conn.close()
            raise
        if not taken:
            await conn.close()
            return False
        self._conn = conn
        return True

    async def acquire(self) -> None:
        """Take the lock; :class:`NodeIdInUse` if another session holds it."""
        if not await self.try_acquire():
            raise NodeIdInUse(
                f"node id {self.node_id!r} is in use: another rankd process with --node-id "
                f"{self.node_id} is running on this cluster (it holds the id's lock in "
                "Postgres); stop it first, or give this node another --node-id")

    async def release(self) -> None:
        """Give the lock up (the session ends)."""
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            try:
                await conn.close(timeout=self.timeout)
            except Exception:
                conn.terminate()
