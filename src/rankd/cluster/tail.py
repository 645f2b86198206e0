"""Following a board group's log in Postgres, as a follower does.

A :class:`LogTail` hands every committed record of one group, in order and
exactly once, to ``apply``.  It wakes on the log's ``NOTIFY`` (one per
committed batch, never per record) and then reads by primary key from the
position after the last one it applied; it also reads every
``poll_seconds`` without a notification, since a notification can be lost
with the connection.  When Postgres goes away it reconnects with backoff
and goes on from where it was: what it applied is never applied again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from rankd._tasks import stop_task
from rankd.cluster.log import CHANNEL, ClusterLog
from rankd.postgres_link import POSTGRES_ERRORS, reconnecting

log = logging.getLogger(__name__)

RETRY_MIN_SECONDS = 0.1
RETRY_MAX_SECONDS = 3.0


class LogTail:
    """Applies one group's log from ``applied_seq + 1`` on."""

    def __init__(self, store: ClusterLog, dsn: str, group: int,
                 apply: Callable[[list[tuple[int, int, bytes]]], Awaitable[None] | None], *,
                 applied_seq: int = 0, poll_seconds: float = 1.0, batches: int = 100) -> None:
        self.store = store
        self.dsn = dsn
        self.group = group
        self.apply = apply
        #: The last position handed to ``apply``.
        self.applied_seq = applied_seq
        self.poll_seconds = poll_seconds
        self.batches = batches
        self.connected = False
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._advanced = asyncio.Condition()

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"rankd-tail-{self.group}")

    async def stop(self) -> None:
        await stop_task(self._task)
        self._task = None

    async def wait_for(self, seq: int, timeout: float) -> bool:
        """Wait until position ``seq`` was applied (read-your-writes);
        False if ``timeout`` passed first."""
        async with self._advanced:
            try:
                await asyncio.wait_for(
                    self._advanced.wait_for(lambda: self.applied_seq >= seq), timeout)
            except TimeoutError:
                return False
        return True

    def _notified(self, connection: object, pid: int, channel: str, payload: str) -> None:
        group, _, last = payload.partition(":")
        if group == str(self.group) and int(last) > self.applied_seq:
            self._wakeup.set()

    def _down(self, exc: BaseException) -> None:
        log.warning("group %d tail cannot reach Postgres: %s", self.group, exc)

    async def _run(self) -> None:
        async for conn in reconnecting(self.dsn, down=self._down, timeout=5,
                                       min_delay=RETRY_MIN_SECONDS,
                                       max_delay=RETRY_MAX_SECONDS):
            try:
                await conn.add_listener(CHANNEL, self._notified)
                self.connected = True
                while not conn.is_closed():
                    await self._catch_up()
                    self._wakeup.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wakeup.wait(), self.poll_seconds)
            except POSTGRES_ERRORS as exc:
                log.warning("group %d tail lost Postgres: %s", self.group, exc)
            finally:
                self.connected = False

    async def _catch_up(self) -> None:
        while True:
            records = await self.store.read(self.group, self.applied_seq, self.batches)
            if not records:
                return
            outcome = self.apply(records)
            if outcome is not None:
                await outcome
            async with self._advanced:
                self.applied_seq = records[-1][0]
                self._advanced.notify_all()
