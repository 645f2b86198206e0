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
import contextlib
import logging
import time
from collections import deque

from rankd._tasks import STOP_SECONDS, stop_task
from rankd.cluster.log import ClusterLog, Fenced, Lease, OutOfSequence

log = logging.getLogger(__name__)

#: Records in one append at most (one Postgres row).
MAX_BATCH_RECORDS = 5000
#: Appends in flight at most.  Two measured no faster on this 2-core machine
#: (bench_cluster.py: the CPU, shared by every node and Postgres, is the limit).
PIPELINE = 1
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
        #: Set when records are enqueued (the flusher may send another append).
        self._more = asyncio.Event()
        #: Monotonic time of the last enqueue (or of the lease's taking).
        self.last_write = time.monotonic()
        #: Appends made, and the records and payload bytes in them.
        self.appends = 0
        self.records = 0
        self.bytes = 0

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
        self.last_write = time.monotonic()
        self._enqueued.append((self.next_seq - 1, self.last_write))
        self._more.set()
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

    def idle(self, seconds: float) -> bool:
        """Whether nothing was enqueued for ``seconds`` and every record
        enqueued is committed (the group may be given up losing nothing)."""
        return (self.fenced is None and self.committed_seq == self.next_seq - 1
                and time.monotonic() - self.last_write >= seconds)

    def unshipped_seconds(self) -> float:
        """How long the oldest record not committed yet has waited (0 if none)."""
        return time.monotonic() - self._enqueued[0][1] if self._enqueued else 0.0

    def unshipped(self) -> list[tuple[int, bytes]]:
        """The records queued and not committed, in position order."""
        return list(self._queue)

    async def _flush(self) -> None:
        """Append from the head of the queue, up to :data:`PIPELINE` appends
        in flight: the next one is sent while the one before commits (it
        waits for the register's lock in Postgres, then follows it).  After
        a failure, what is in flight ends first, the register says how far
        the log got, and appending starts again from there."""
        delay = RETRY_MIN_SECONDS
        inflight: deque[tuple[int, asyncio.Task]] = deque()
        sent = self.committed_seq
        try:
            while self.fenced is None and (inflight or self._queue):
                while (len(inflight) < PIPELINE and self._queue
                       and self._queue[-1][0] > sent):
                    offset = sent + 1 - self._queue[0][0]
                    batch = [self._queue[i] for i in range(
                        offset, min(len(self._queue), offset + MAX_BATCH_RECORDS))]
                    sent = batch[-1][0]
                    inflight.append((sent, asyncio.ensure_future(self.store.append(
                        self.lease, batch[0][0], [payload for _, payload in batch]))))
                last, oldest = inflight[0]
                self._more.clear()
                if len(inflight) < PIPELINE:  # wake for new records too
                    more = asyncio.ensure_future(self._more.wait())
                    await asyncio.wait({oldest, more}, return_when=asyncio.FIRST_COMPLETED)
                    more.cancel()
                    if not oldest.done():
                        continue
                else:
                    await asyncio.wait({oldest})
                inflight.popleft()
                failure = oldest.exception()
                if failure is None:
                    self._committed_up_to(last)
                    delay = RETRY_MIN_SECONDS
                    if self.failing is not None:
                        log.warning("group %d: appending again", self.lease.group)
                        self.failing = None
                    continue
                if isinstance(failure, Fenced):
                    self._fence(failure)
                    return
                # Not committed, or not known to be: let the rest end, ask the
                # register how far the log got, and go on from there.
                for later_last, later in inflight:
                    with contextlib.suppress(Exception):
                        await later
                        self._committed_up_to(later_last)
                inflight.clear()
                try:
                    await self._settle()
                except (Fenced, LogLost) as exc:
                    self._fence(exc)
                    return
                except Exception as exc:
                    failure = exc
                sent = self.committed_seq
                if not isinstance(failure, OutOfSequence):
                    if self.failing is None:
                        log.warning("group %d: cannot append to the log yet (%s); retrying",
                                    self.lease.group, failure)
                    self.failing = str(failure)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, RETRY_MAX_SECONDS)
        finally:
            for _, task in inflight:
                task.cancel()
            self._flusher = None

    async def _settle(self) -> None:
        """After a failed append: the register says how far the log got
        (an append whose outcome was unknown may have committed)."""
        register = await self.store.register(self.lease.group)
        if register is None or register["epoch"] != self.lease.epoch:
            # An append whose outcome was unknown may have committed before
            # the group moved on: its records are committed, not refused.
            committed = await self.store.last_seq_of_epoch(self.lease.group, self.lease.epoch)
            if self._queue and committed > self.committed_seq:
                self._committed_up_to(min(committed, self._queue[-1][0]))
            raise Fenced(self.lease.group, self.lease.epoch,
                         register["epoch"] if register else -1,
                         register["holder"] if register else None)
        if register["last_seq"] < self.committed_seq:
            raise LogLost(f"group {self.lease.group}: Postgres's log ends at "
                          f"{register['last_seq']}, before position {self.committed_seq} that "
                          "it committed")
        if self._queue:
            self._committed_up_to(min(register["last_seq"], self._queue[-1][0]))

    def _committed_up_to(self, seq: int) -> None:
        taken = size = 0
        while self._queue and self._queue[0][0] <= seq:
            size += len(self._queue.popleft()[1])
            taken += 1
        self.appends += 1
        self.records += taken
        self.bytes += size
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
        await stop_task(self._flusher, STOP_SECONDS)
        self._flusher = None
