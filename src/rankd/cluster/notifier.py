"""Telling followers that a group's log grew, outside the append's commit.

What it owns: the ``NOTIFY`` on :data:`~rankd.cluster.log.CHANNEL` of every
committed append (``group:last_seq``), which followers' log tails listen for
(:mod:`rankd.cluster.tail`).

Why not in the append's own transaction: Postgres serialises the commits of
every transaction that notified, cluster-wide (``PreCommit_Notify`` takes one
exclusive lock that is held until the commit ends, WAL flush included).  With
the notification inside ``rankd_append`` every group's append on every node
waited for the previous one's fsync: no group commit in Postgres, so writes
spread over many groups were capped near one fsync per append for the whole
cluster however many nodes it had (bench/bench_scale.py; bench/README.md).

Design: :meth:`LogNotifier.note` is called once an append committed; it keeps
the newest position per group and, unless a send is in flight, starts one.
A send is one transaction, ``synchronous_commit`` off (it changes no data, so
nothing waits for a WAL flush while the notify lock is held), with one
notification per group noted since the previous send: sends never queue up,
appends never wait for them.  A notification is only a hint: a send that
fails is dropped (logged), since every tail also polls the groups' registers
(``poll_seconds``) and so finds what a lost notification would have told it,
as it does when its own connection drops one.
"""

from __future__ import annotations

import asyncio
import logging

import asyncpg

from rankd.postgres_link import POSTGRES_ERRORS

log = logging.getLogger(__name__)

#: One transaction: every noted group's notification, ``group:last_seq``.
NOTIFY_MANY = "SELECT pg_notify($1, note) FROM unnest($2::text[]) AS note"


class LogNotifier:
    """Sends the log's notifications in batches, after the appends committed."""

    def __init__(self, pool: asyncpg.Pool, channel: str) -> None:
        self.pool = pool
        self.channel = channel
        #: Group -> its newest committed position not yet notified.
        self._pending: dict[int, int] = {}
        self._sending: asyncio.Task | None = None

    def note(self, group: int, last_seq: int) -> None:
        """``group``'s log now ends at ``last_seq`` (committed): tell the followers."""
        if last_seq > self._pending.get(group, -1):
            self._pending[group] = last_seq
        if self._sending is None or self._sending.done():
            self._sending = asyncio.get_running_loop().create_task(self._send())

    async def _send(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, {}
            notes = [f"{group}:{last}" for group, last in batch.items()]
            try:
                async with self.pool.acquire() as conn, conn.transaction():
                    await conn.execute("SET LOCAL synchronous_commit TO off")
                    await conn.execute(NOTIFY_MANY, self.channel, notes)
            except POSTGRES_ERRORS as exc:
                # The followers' polls find it (see the module doc).
                log.debug("log notifications for %d groups not sent: %s", len(notes), exc)
            except Exception as exc:  # (a hint: never an unretrieved task error)
                # Seen once after the process was stopped and resumed: asyncpg
                # found the connection still busy with the previous statement
                # (InternalClientError).  The pool replaces that connection.
                log.warning("log notifications for %d groups not sent: %r", len(notes), exc)

    async def drain(self) -> None:
        """Wait until every notification noted so far was sent (or dropped)."""
        while self._sending is not None and not self._sending.done():
            await asyncio.shield(self._sending)
