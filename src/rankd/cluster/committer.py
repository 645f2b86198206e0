"""Group commit into a board group's log in Postgres.

A primary gives every record of a group its position (``seq``) when it
applies it, before the record reaches Postgres, so the positions of the
log must be exactly those: :class:`GroupCommitter` keeps the records not
yet committed in a queue, in position order, and appends them from its
head, as many as have arrived (group commit: the records of every
submitter that arrive while one append is in flight go together in the
next one, as the local WAL's group commit does with fsyncs).

An append that fails for a passing reason (Postgres restarting, a broken
connection) is tried again at the same position until it commits or the
group is fenced; when its outcome was unknown and it did commit, the retry
finds the register already past it and drops what committed.  Positions
are therefore never skipped nor reused.  Once fenced, every waiting and
later commit raises :class:`Fenced`, and :meth:`GroupCommitter.unshipped`
gives what never reached the log (the deposed primary sets it aside).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque

from rankd._tasks import stop_task
from rankd.cluster.log import ClusterLog, Fenced, Lease, OutOfSequence

log = logging.getLogger(__name__)

#: Records in one append at most (one Postgres row).
MAX_BATCH_RECORDS = 5000
RETRY_MIN_SECONDS = 0.02
RETRY_MAX_SECONDS = 1.0


class LogLost(Exception):
    """Postgres's log of a group ends before positions it committed: a
    Postgres failover lost committed transactions (asynchronous standby)."""


class GroupCommitter:
    """Commits one group's records to its log, in position order, as ``lease`` allows."""

    def __init__(self, store: ClusterLog, lease: Lease) -> None:
        self.store = store
        self.lease = lease
        #: The position the next enqueued record gets.
        self.next_seq = lease.last_seq + 1
        #: The last position known committed.
        self.committed_seq = lease.last_seq
        #: Set once the group moved on (or its log was lost): every later commit raises it.
        self.fenced: Exception | None = None
        #: Set while appends fail for a passing reason: the error.
        self.failing: str | None = None
        self._queue: deque[tuple[int, bytes]] = deque()
        #: (last position, monotonic time) of each enqueue not committed yet.
        self._enqueued: deque[tuple[int, float]] = deque()
        self._waiters: list[tuple[int, asyncio.Future[int]]] = []
        self._flusher: asyncio.Task | None = None
        #: Appends made and records in them, for metrics and benchmarks.
        self.appends = 0
        self.records = 0

    @property
    def group(self) -> int:
        return self.lease.group

    @property
    def epoch(self) -> int:
        return self.lease.epoch

    def enqueue(self, payloads: list[bytes]) -> int:
        """Queue records at the next positions; return the first one."""
        if self.fenced is not None:
            raise self.fenced
        first = self.next_seq
        self._queue.extend(enumerate(payloads, first))
        self.next_seq += len(payloads)
        self._enqueued.append((self.next_seq - 1, time.monotonic()))
        if self._flusher is None and self._queue:
            self._flusher = asyncio.get_running_loop().create_task(self._flush())
        return first

    def committed(self, seq: int) -> asyncio.Future[int]:
        """A future done (with ``seq``) once position ``seq`` committed;
        :class:`Fenced` if it never will."""
        done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        if seq <= self.committed_seq:
            done.set_result(seq)
        elif self.fenced is not None:
            done.set_exception(self.fenced)
        else:
            self._waiters.append((seq, done))
        return done

    async def commit(self, payloads: list[bytes]) -> int:
        """Return the log position of the last of ``payloads`` once the
        transaction holding them committed; :class:`Fenced` if the group
        has a newer primary (nothing of them was committed)."""
        last = self.enqueue(payloads) + len(payloads) - 1
        return await asyncio.shield(self.committed(last))

    def unshipped_seconds(self) -> float:
        """How long the oldest record not committed yet has waited (0 if none)."""
        return time.monotonic() - self._enqueued[0][1] if self._enqueued else 0.0

    def unshipped(self) -> list[tuple[int, bytes]]:
        """The records queued and not committed, in position order."""
        return list(self._queue)

    async def _flush(self) -> None:
        delay = RETRY_MIN_SECONDS
        try:
            while self._queue and self.fenced is None:
                batch = [self._queue[i] for i in range(min(len(self._queue),
                                                            MAX_BATCH_RECORDS))]
                try:
                    await self._append(batch)
                except (Fenced, LogLost) as exc:
                    self._fence(exc)
                    return
                except Exception as exc:  # not committed, or not known to be: again
                    if self.failing is None:
                        log.warning("group %d: cannot append to the log yet (%s); retrying",
                                    self.lease.group, exc)
                    self.failing = str(exc)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, RETRY_MAX_SECONDS)
                    continue
                delay = RETRY_MIN_SECONDS
                if self.failing is not None:
                    log.warning("group %d: appending again", self.lease.group)
                    self.failing = None
        finally:
            self._flusher = None

    async def _append(self, batch: list[tuple[int, bytes]]) -> None:
        first = batch[0][0]
        try:
            await self.store.append(self.lease, first, [payload for _, payload in batch])
        except OutOfSequence:
            # An earlier append whose outcome was unknown did commit.
            register = await self.store.register(self.lease.group)
            if register is None or register["epoch"] != self.lease.epoch:
                raise Fenced(self.lease.group, self.lease.epoch,
                             register["epoch"] if register else -1,
                             register["holder"] if register else None) from None
            if register["last_seq"] < first - 1:
                raise LogLost(f"group {self.lease.group}: Postgres's log ends at "
                              f"{register['last_seq']}, before position {first - 1} that it "
                              "committed") from None
            self._committed_up_to(min(register["last_seq"], batch[-1][0]))
            return
        self._committed_up_to(batch[-1][0])

    def _committed_up_to(self, seq: int) -> None:
        taken = 0
        while self._queue and self._queue[0][0] <= seq:
            self._queue.popleft()
            taken += 1
        self.appends += 1
        self.records += taken
        self.committed_seq = max(self.committed_seq, seq)
        while self._enqueued and self._enqueued[0][0] <= seq:
            self._enqueued.popleft()
        if self._waiters:
            waiting = []
            for position, done in self._waiters:
                if position > seq:
                    waiting.append((position, done))
                elif not done.done():
                    done.set_result(position)
            self._waiters = waiting

    def fence(self, exc: Exception) -> None:
        """Stop for good: every waiting and later commit raises ``exc``."""
        self._fence(exc)

    def _fence(self, exc: Exception) -> None:
        self.fenced = exc
        waiters, self._waiters = self._waiters, []
        for _, done in waiters:
            if not done.done():
                done.set_exception(exc)

    async def close(self) -> None:
        """Stop appending (what is queued stays in :meth:`unshipped`)."""
        await stop_task(self._flusher)
        self._flusher = None
