"""A cluster node whose local log failed (a full disk) gets back by itself.

A single rankd whose write-ahead log fails stays read-only until it is
restarted: nothing else holds its data.  A cluster node's data is in the
cluster's log, so once its log fails (:attr:`Engine.failure`) the node

1. stops following (it could not log what it applies: its copy only ages,
   and :mod:`rankd.cluster.freshness` refuses its reads past
   ``--max-follow-lag``; ``/v1/ready`` fails meanwhile);
2. gives up every group it writes, once what it sent to their logs
   committed, so another node takes their writes at once (it could not
   log them; its lease would otherwise keep them unwritable);
3. takes no group while failed;
4. tries its data dir every :data:`PROBE_SECONDS` (a small write and an
   fsync) and, once it takes writes again, sets its local state aside
   (``aside-*``, kept: see :meth:`Engine.set_local_state_aside`), opens a
   new log and follows every group again from the cluster's log (or a
   group's snapshot), with no restart.  Under ``--ack local`` the records
   of a group given up that its log never took were acknowledged: they are
   set aside then (``orphan-*``, for ``rankd cluster resubmit``), as a
   deposed primary's are (a full disk had no room for them before).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path
from typing import Protocol

from rankd._tasks import STOP_SECONDS, stop_task
from rankd.cluster.committer import GroupCommitter
from rankd.cluster.groups import GroupLocks
from rankd.cluster.leases import LeaseKeeper
from rankd.cluster.log import ClusterLog, Fenced
from rankd.cluster.tail import LogTail
from rankd.engine.engine import Engine

log = logging.getLogger(__name__)

#: How often a node whose log failed tries its data dir again.
PROBE_SECONDS = 2.0
#: How soon a node notices its log failed (its tail stops retrying then).
NOTICE_SECONDS = 0.25
#: What the probe writes (and fsyncs): room for a little more than nothing.
PROBE_BYTES = 64 << 10
PROBE_NAME = ".write-probe"


def writable(directory: Path) -> bool:
    """Whether ``directory`` takes a write and an fsync now (the probe file
    is removed again)."""
    path = directory / PROBE_NAME
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(bytes(PROBE_BYTES))
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        return False
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
    return True


class RecoveringNode(Protocol):
    """What disk recovery uses of its node (``rankd.cluster.node.ClusterNode``,
    which builds it: a protocol, so the two do not import each other)."""

    engine: Engine
    node_id: str
    ack: str
    ack_timeout: float
    #: The groups this node writes, by group.
    writers: dict[int, GroupCommitter]
    #: Its cluster log, leases and tail, once started.
    store: ClusterLog | None
    keeper: LeaseKeeper | None
    tail: LogTail | None
    #: The per-group locks of its writes.
    _lock: GroupLocks

    async def _orphan(self, group: int, epoch: int, orphans: list[tuple[int, bytes]]) -> None:
        """Set ``orphans`` of ``group`` aside (applied here, never committed)."""


class DiskRecovery:
    """Watches one node's local log, and brings the node back after it failed."""

    def __init__(self, node: RecoveringNode, *, interval: float = PROBE_SECONDS) -> None:
        self.node = node
        self.interval = interval
        #: Times the node started again from the cluster's log after a failure.
        self.recoveries = 0
        self._stepped_back = False
        self._task: asyncio.Task | None = None
        #: (group, epoch, records) acknowledged in groups given up, never
        #: committed: set aside once the data dir takes writes again.
        self._unshipped: list[tuple[int, int, list[tuple[int, bytes]]]] = []

    @property
    def failed(self) -> bool:
        """Whether the node's local log failed (and it has not recovered yet)."""
        engine = self.node.engine
        return engine.failure is not None or (engine.wal is not None and engine.wal.failed)

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="rankd-disk-recovery")

    async def stop(self) -> None:
        await stop_task(self._task, STOP_SECONDS)
        self._task = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        probed = 0.0
        while True:
            await asyncio.sleep(NOTICE_SECONDS)
            if not self.failed:
                continue
            try:
                if not self._stepped_back:
                    await self._step_back()
                    probed = loop.time()
                if loop.time() - probed < self.interval:
                    continue
                probed = loop.time()
                if await asyncio.to_thread(writable, self.node.engine.config.data_dir):
                    await self._start_again()
            except Exception:
                log.exception("node %s cannot recover from its failed local log yet; trying "
                              "again in %g s", self.node.node_id, self.interval)

    async def _step_back(self) -> None:
        """Stop following and give up the written groups (see the module)."""
        node = self.node
        failure = node.engine.failure or node.engine.wal.failure
        log.error("node %s: its local log failed (%s); it stops following the cluster's "
                  "log, gives up the groups it writes, refuses reads older than "
                  "--max-follow-lag and tries its data dir every %g s to start again",
                  node.node_id, failure, self.interval)
        await node.tail.stop()
        for group, writer in list(node.writers.items()):
            async with node._lock(group):
                if node.writers.get(group) is not writer:
                    continue
                del node.writers[group]
                node.keeper.held.pop(group, None)
                with contextlib.suppress(TimeoutError, Fenced):
                    if writer.next_seq - 1 > writer.committed_seq:
                        await asyncio.wait_for(writer.committed(writer.next_seq - 1),
                                               node.ack_timeout)
                await writer.close()
                unshipped = writer.unshipped()
                if node.ack == "local" and unshipped:
                    self._unshipped.append((group, writer.epoch, unshipped))
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(node.store.release(writer.lease), STOP_SECONDS)
                node.tail.paused.discard(group)
                log.error("node %s gives up group %d at position %d (its local log failed): "
                          "another node takes its writes", node.node_id, group,
                          writer.committed_seq)
        self._stepped_back = True

    async def _start_again(self) -> None:
        node = self.node
        log.warning("node %s: its data dir takes writes again; setting the local state "
                    "aside and following every group again from the cluster's log",
                    node.node_id)
        aside = await node.engine.start_again_empty()
        while self._unshipped:  # (the new log's directory has room for them now)
            await node._orphan(*self._unshipped[0])
            del self._unshipped[0]
        node.tail.applied.clear()
        await node.tail.start()
        self._stepped_back = False
        self.recoveries += 1
        log.warning("node %s recovered from its failed local log without a restart: the old "
                    "local state is kept in %s (remove it once no longer wanted); it serves "
                    "each group again once it caught up with it", node.node_id, aside)
