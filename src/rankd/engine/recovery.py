"""Opening a data dir: its lock, the latest snapshot and the log after it.

Owns the data dir's lock and the order of recovery: the newest valid
snapshot is loaded into the board state, the write-ahead log is opened
after it and checked to go on exactly where the snapshot stops, and its
tail is replayed (:class:`rankd.engine.replaying.Replayer`).  With Postgres
configured, records Postgres holds beyond the end of the local log are
taken back first (:meth:`Recovery.take_back_lost_records`).  It also
rebuilds the state as of a position (a roll-back after a storage failure)
and sets a cluster node's local state aside.

May not touch: the commit pipeline, reads, the cluster (it only asks
whether the engine is a node of one, to check the kind of its log).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import gc
import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path

from rankd.engine import collector, heap, records, settings
from rankd.engine.core import Core
from rankd.engine.frames import HEADER_BYTES, payload_bytes
from rankd.engine.replaying import Replayer
from rankd.engine.snapshot import SnapshotStore
from rankd.engine.state import BoardState
from rankd.engine.wal import WalCorruptError, WriteAheadLog

#: The engine's logger: one name for every room, as operators filter it.
log = logging.getLogger("rankd.engine.engine")


class Recovery:
    """The data dir's lock, and the state recovered from it."""

    def __init__(self, core: Core, replayer: Replayer) -> None:
        self.core = core
        self.replayer = replayer
        self._lock_fd: int | None = None
        #: The bytes of log (frames included) the last recovery replayed.
        self.replayed_bytes = 0

    # --- the lock ---------------------------------------------------------------------

    def lock(self) -> None:
        """Take the data dir's lock (once); ``RuntimeError`` if another
        process has it."""
        if self._lock_fd is not None:
            return
        data_dir = self.core.config.data_dir
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = data_dir / "LOCK"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = path.read_text().strip() or "another process"
            raise RuntimeError(
                f"data dir {data_dir} is in use by {holder}; "
                "a second rankd cannot share it"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}\n".encode())
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing releases the flock
            self._lock_fd = None

    # --- recovery ---------------------------------------------------------------------

    def recover(self) -> int:
        """Latest valid snapshot, then the WAL tail through the normal apply
        path; returns how many records it replayed.

        The cyclic garbage collector is paused meanwhile: recovery builds
        millions of long-lived objects and no cycles, and the collector would
        walk them again and again (it doubled recovery time).  Afterwards a
        large recovered state is frozen (:func:`collector.keep_recovered`),
        or the first young collection would walk all of it at once.
        """
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return self._recover_state()
        finally:
            if was_enabled:
                collector.keep_recovered()
                gc.enable()

    def _recover_state(self) -> int:
        core, replayer = self.core, self.replayer
        config = core.config
        started = time.monotonic()
        core.snapshots.open()
        snapshot_lsn = 0
        latest = core.snapshots.latest()
        if latest is not None:
            snapshot_lsn, sections = latest
            core.state.load(sections)
            self._check_snapshot_kind(sections)
            del latest, sections  # (the file's bytes: not held while the log is read too)
        core.publish(wal=WriteAheadLog(config.data_dir / "wal", fsync=config.fsync,
                                       segment_bytes=config.segment_bytes,
                                       repair=config.repair, after_lsn=snapshot_lsn))
        self._check_log_covers(snapshot_lsn)
        total = max(0, core.wal.last_lsn - snapshot_lsn)
        replayed = 0
        reported = 0
        tail_bytes = 0
        # Mapped (nothing else writes the log before recovery ends).
        for batch in core.wal.iter_batches(snapshot_lsn + 1, settings.REPLAY_BATCH,
                                           in_place=True):
            replayer.replay_local(batch)
            replayed += len(batch)
            tail_bytes += payload_bytes(batch)
            if replayed - reported >= settings.REPLAY_BATCH * 20:
                reported = replayed
                log.info("recovery: replayed %d of %d WAL records (%.0f%%)",
                         replayed, total, 100 * replayed / max(total, 1))
        replayer.flush()
        heap.release()  # (the file's and the log's buffers are freed)
        self.replayed_bytes = tail_bytes + replayed * HEADER_BYTES
        log.info("recovered %d boards from snapshot @%d and %d WAL records in %.2fs",
                 len(core.state.boards), snapshot_lsn, replayed, time.monotonic() - started)
        return replayed

    async def take_back_lost_records(self) -> None:
        """Records Postgres holds beyond the end of the local log were durable
        here once (only those are shipped), so the local disk lost them:
        take them back, at the same positions, before taking writes (a new
        write must never reuse a position Postgres already holds)."""
        from rankd.engine.postgres import records_beyond

        wal = self.core.wal
        lost = await records_beyond(self.core.config.postgres_dsn, wal.last_lsn)
        if not lost:
            return
        log.error("the local log ends at position %d but Postgres holds %d records after it "
                  "(%d-%d), shipped from here before this disk lost them; taking them back",
                  wal.last_lsn, len(lost), lost[0][0], lost[-1][0])
        wal.append_many([payload for _, payload in lost])
        await wal.make_durable(wal.last_lsn)
        await asyncio.to_thread(self._replay_taken_back, lost)

    def _replay_taken_back(self, taken: list[tuple[int, bytes]]) -> None:
        self.replayer.replay_local(taken)
        self.replayer.flush()

    def _check_log_covers(self, snapshot_lsn: int) -> None:
        """The log must go on exactly where the snapshot stops: a snapshot
        covers only what was durable in the log when it was written, and
        segments are removed only once a snapshot covers them, so a log
        that starts after it or ends before it lost segments."""
        wal = self.core.wal
        first, found = wal.first_lsn, wal.found_lsn
        missing = None
        if first is not None and first > snapshot_lsn + 1:
            missing = (f"the WAL starts at position {first} but the snapshot covers only up to "
                       f"{snapshot_lsn}: records {snapshot_lsn + 1}-{first - 1} are missing")
        elif found < snapshot_lsn:
            missing = (f"the WAL ends at position {found} but the snapshot was taken at "
                       f"{snapshot_lsn}, once the log held it: its newest segments are missing")
        if missing is None:
            return
        if not self.core.config.repair:
            raise WalCorruptError(wal.directory, 0, missing)
        log.error("%s; going on because repair is enabled", missing)
        if first is not None and first > snapshot_lsn + 1:
            # Nothing of it can follow the snapshot: keep it all aside, replay none.
            wal.set_all_aside(snapshot_lsn)

    def _check_snapshot_kind(self, sections: Iterable[bytes]) -> None:
        """A cluster node's snapshot starts with its positions in the groups'
        logs; a single node's has none.  Neither may start as the other."""
        data_dir = self.core.config.data_dir
        replicated = self.core.replication is not None
        first = next(iter(sections), None)
        of_a_node = first is not None and records.decode(first)[0] == "positions"
        if replicated and not of_a_node and first is not None:
            raise RuntimeError(f"{data_dir}: its snapshot is a single node's; "
                               "this data dir was not a cluster node's: start it without "
                               "--cluster-dsn, or the node with an empty data dir")
        if not replicated and of_a_node:
            raise RuntimeError(f"{data_dir}: its snapshot is a cluster node's: "
                               "start this data dir with the --cluster-dsn it was a node of")

    def rebuild(self, wal: WriteAheadLog, upto_lsn: int) -> BoardState:
        """A new board state as of ``upto_lsn``: the newest snapshot and
        ``wal`` after it (what a restart would recover).  Reads the disk:
        call it in a worker thread."""
        state = BoardState(self.core.clock)
        replayer = Replayer(self.core, state)
        latest = SnapshotStore(self.core.config.data_dir / "snapshots").latest()
        snapshot_lsn = 0
        if latest is not None:
            snapshot_lsn, sections = latest
            state.load(sections)
        # Read, not mapped: the failed log's newest segment may be cut back meanwhile.
        for batch in wal.iter_batches(snapshot_lsn + 1, settings.REPLAY_BATCH, upto_lsn):
            replayer.replay_local(batch)
        replayer.flush()
        return state

    # --- a cluster node starting anew ---------------------------------------------------

    async def set_local_state_aside(self, reason: BaseException) -> Path:
        """Move the local log and snapshots aside (kept, never deleted) and
        start empty (see ``Engine.set_local_state_aside``)."""
        core = self.core
        if core.replication is None:
            raise RuntimeError("only a cluster node may set its local state aside")
        if core.wal is not None:
            with contextlib.suppress(Exception):
                await core.wal.close()
        core.publish(wal=None)
        core.intake.commits_now = False
        core.state.replace({})
        core.state.positions = {}
        self.replayer.clear()
        data_dir = core.config.data_dir
        aside = data_dir / f"aside-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
        aside.mkdir(mode=0o700)
        for part in ("wal", "snapshots"):
            if (data_dir / part).exists():
                os.replace(data_dir / part, aside / part)
        core.snapshots = SnapshotStore(data_dir / "snapshots")
        log.error("the local log cannot be recovered (%s); it is set aside in %s and this "
                  "node starts empty, replaying every group from the cluster's log", reason,
                  aside)
        return aside

