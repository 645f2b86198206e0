"""Group commit into a board group's log in Postgres.

Under ``--ack log`` a write is acknowledged only once the Postgres
transaction holding it committed.  One transaction per write would cap a
group at a few thousand writes a second; :class:`GroupCommitter` makes the
records of every submitter that arrive while one append is in flight go
together in the next one, as the local WAL's group commit does with fsyncs.
"""

from __future__ import annotations

import asyncio

from rankd.cluster.log import ClusterLog, Fenced, Lease, OutOfSequence

#: Records in one append at most (one Postgres row).
MAX_BATCH_RECORDS = 5000


class GroupCommitter:
    """Commits records to one group's log as ``lease`` allows."""

    def __init__(self, store: ClusterLog, lease: Lease) -> None:
        self.store = store
        self.lease = lease
        self.next_seq = lease.last_seq + 1
        #: Set once the group moved on: every later commit raises it.
        self.fenced: Fenced | None = None
        self._pending: list[tuple[list[bytes], asyncio.Future[int]]] = []
        self._flusher: asyncio.Task | None = None
        #: Appends made and records in them, for metrics and benchmarks.
        self.appends = 0
        self.records = 0

    async def commit(self, payloads: list[bytes]) -> int:
        """Return the log position of the last of ``payloads`` once the
        transaction holding them committed; :class:`Fenced` if the group
        has a newer primary (nothing of them was committed)."""
        if self.fenced is not None:
            raise self.fenced
        done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._pending.append((payloads, done))
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush())
        return await asyncio.shield(done)

    async def _flush(self) -> None:
        try:
            while self._pending:
                taken, count = [], 0
                while self._pending and count < MAX_BATCH_RECORDS:
                    payloads, done = self._pending.pop(0)
                    taken.append((payloads, done))
                    count += len(payloads)
                records = [p for payloads, _ in taken for p in payloads]
                try:
                    await self._append(records)
                except Fenced as exc:
                    self.fenced = exc
                    for _, done in [*taken, *self._pending]:
                        if not done.done():
                            done.set_exception(exc)
                    self._pending.clear()
                    return
                except Exception as exc:  # not committed, or not known to be
                    for _, done in taken:
                        if not done.done():
                            done.set_exception(exc)
                    continue
                position = self.next_seq - 1
                for payloads, done in taken:
                    position += len(payloads)
                    if not done.done():
                        done.set_result(position)
                self.next_seq += len(records)
                self.appends += 1
                self.records += len(records)
        finally:
            self._flusher = None

    async def _append(self, records: list[bytes]) -> None:
        """One append at ``next_seq``.  When its outcome is unknown (the
        connection broke, perhaps during COMMIT) the register says whether
        it committed; when Postgres is at another position than expected
        (an earlier unknown outcome that did commit), ``next_seq`` follows
        it and the append is tried once more."""
        try:
            await self.store.append(self.lease, self.next_seq, records)
        except OutOfSequence:
            register = await self.store.register(self.lease.group)
            if register is None or register["epoch"] != self.lease.epoch:
                raise
            self.next_seq = register["last_seq"] + 1
            await self.store.append(self.lease, self.next_seq, records)
        except (Fenced, ValueError):
            raise
        except Exception:
            try:
                committed = await self._committed_anyway(len(records))
            except Exception:
                committed = False
            if not committed:
                raise

    async def _committed_anyway(self, count: int) -> bool:
        """After an append whose outcome is unknown: whether it committed
        (the register moved on by ``count`` under this epoch).  Raises if
        Postgres cannot be asked either: the caller's outcome stays unknown."""
        register = await self.store.register(self.lease.group)
        if register is None or register["epoch"] != self.lease.epoch:
            return False
        return register["last_seq"] == self.next_seq - 1 + count
