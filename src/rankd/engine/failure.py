"""What the engine does after a storage failure: read-only, and back to
what the log acknowledged.

Owns ``failure`` (the error that made the engine read-only, if any) and the
roll-back that follows a failed log.  Writes are applied in memory before
their records reach the log; when the log fails, the ones it never took
were refused to their writers, so readers must not see them either: the
state is rebuilt from the snapshot and the log up to the last acknowledged
position (:meth:`rankd.engine.recovery.Recovery.rebuild`, in a worker
thread), and reads answer ``ReadOnly`` meanwhile (``rolling_back``, which
the native plain reads see as ``paused``).  Writes stay refused until
restart.

May not touch: the commit pipeline (it is told of failures, it never
commits), the cluster (it only passes the state's positions on).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from rankd.engine.core import Core
from rankd.engine.errors import ReadOnly
from rankd.engine.state import BoardState
from rankd.engine.wal import WalFailedError, WriteAheadLog

log = logging.getLogger("rankd.engine.engine")


class StorageGuard:
    """Whether the engine may write, and the roll-back after it may not."""

    def __init__(self, core: Core,
                 rebuild: Callable[[WriteAheadLog, int], BoardState]) -> None:
        self.core = core
        #: Builds the state as of a log position (``Recovery.rebuild``).
        self._rebuild = rebuild
        self.rolled_back = asyncio.Event()

    @property
    def failure(self) -> BaseException | None:
        """The storage error that made the engine read-only, if any (kept,
        and published to the pass, by the core)."""
        return self.core.failure

    @failure.setter
    def failure(self, failure: BaseException | None) -> None:
        self.core.publish(failure=failure)

    @property
    def rolling_back(self) -> bool:
        """Set while the state is rebuilt after a storage failure: reads are
        refused meanwhile (the native ones too, ``plain_reads.paused``)."""
        return self.core.plain_reads.paused

    @rolling_back.setter
    def rolling_back(self, rolling_back: bool) -> None:
        self.core.plain_reads.paused = rolling_back

    def reset(self) -> None:
        """Writable again (a cluster node's new, empty log)."""
        self.failure = None
        self.rolled_back = asyncio.Event()
        self.rolling_back = False

    def check_writable(self) -> None:
        """Raise ``ReadOnly`` unless the engine may write now."""
        core = self.core
        wal = core.wal
        if core.failure is not None or (wal is not None and wal.failed):
            self.fail(core.failure or wal.failure)
            raise ReadOnly("rankd stopped accepting writes after a storage failure "
                           f"({core.failure}); restart it after fixing the disk")
        if not self.core.ready:
            raise ReadOnly("rankd is not serving yet")

    def read_only_after(self, exc: WalFailedError) -> ReadOnly:
        """Refuse writes after the log failed with ``exc``: the error to raise."""
        self.fail(exc)
        return ReadOnly(f"the write-ahead log failed ({exc}); rankd accepts no writes "
                        "until it is restarted")

    def fail(self, exc: BaseException) -> None:
        """Refuse writes from now on, after ``exc`` (a failed log, or a bug)."""
        if self.failure is None:
            log.critical("refusing writes until restart after: %r", exc)
            self.failure = exc
        # Whoever notices a failed log first: the state goes back to what it
        # acknowledged (once).  A bug with the log healthy rolls nothing back:
        # the commits under way still complete.
        core = self.core
        if (core.wal is not None and core.wal.failed and core.ready
                and not self.rolled_back.is_set() and not self.rolling_back):
            self.rolling_back = True
            core.tasks.append(asyncio.ensure_future(self._roll_back_unlogged()))

    async def settled(self) -> None:
        """Return once reads are served again after a storage failure (at once
        when there was none, or the state could not be read back)."""
        if self.rolling_back:
            await self.rolled_back.wait()

    async def _roll_back_unlogged(self) -> None:
        """After the log failed, serve only what it acknowledged (module
        docstring); reads stay refused for good if the disk cannot be read."""
        core = self.core
        state = core.state
        acknowledged = core.wal.acknowledged_lsn
        try:
            shadow = await asyncio.to_thread(self._rebuild, core.wal, acknowledged)
        except Exception:
            log.exception("cannot read back the state the log acknowledged; reads stay "
                          "refused until restart")
            self.rolled_back.set()
            return
        for name, board in shadow.boards.items():
            before = state.boards.get(name)
            # Readers cache by version: move on from theirs.  Not on a cluster
            # node, whose versions are its groups' log positions, the same on
            # every node: the state rolled back to had those versions, and a
            # group that went back is refused as stale (cluster.freshness).
            if before is not None and core.replication is None:
                board.version = max(board.version, before.version) + 1
        changed = set(state.boards) | set(shadow.boards)
        state.replace(shadow.boards)
        state.deadlines.rebuild(((name, board.expires_at) for name, board
                                 in shadow.boards.items() if board.expires_at is not None),
                                state.now_ms())
        state.positions = shadow.positions
        self.rolling_back = False
        self.rolled_back.set()
        log.warning("rolled back to log position %d, the last one acknowledged; reads "
                    "resume (writes still refused until restart)", acknowledged)
        for name in changed:
            for listener in core.listeners:
                listener(name)
