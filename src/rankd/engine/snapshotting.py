"""Taking snapshots: the whole state as of a log position, written while
the engine serves, and the log segments it makes unneeded dropped.

Owns when a snapshot is taken (the loop: after enough events, or time) and
how: each board is copied while its writers wait (``BoardState.hold``; other
boards' writes go on), its indexes dumped in a worker thread, and the
snapshot published only once the log holds durably everything it shows.
A cluster node's group snapshot (for a follower whose position the
group's log no longer holds) is copied the same way.  The files themselves
are :mod:`rankd.engine.snapshot`'s.

May not touch: the board state beyond holding and reading it; the commit
pipeline beyond its event count and trigger (which it resets).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from rankd.engine import records, settings, staging
from rankd.engine.board import Board
from rankd.engine.commits import Commits
from rankd.engine.core import Core
from rankd.engine.errors import StorageError
from rankd.engine.failure import StorageGuard
from rankd.engine.groups import group_of
from rankd.engine.sections import blob_prefix, blob_section
from rankd.engine.tail import MAX_SNAPSHOT_EVERY_EVENTS
from rankd.engine.wal import WalFailedError

log = logging.getLogger("rankd.engine.engine")
T = TypeVar("T")


class Snapshotter:
    """The engine's snapshots (module docstring)."""

    def __init__(self, core: Core, guard: StorageGuard, commits: Commits) -> None:
        self.core = core
        self.state = core.state
        self.guard = guard
        self.commits = commits
        self.lock = asyncio.Lock()
        self.last_snapshot: dict[str, Any] = {}
        self.last_time = 0.0

    async def snapshot(self) -> Path:
        """Write every board to a new snapshot, then drop WAL segments it covers.

        Only what the log holds durably is ever in a snapshot (the log is
        fsynced up to every write the snapshot may hold before it is
        published), and none is taken after a storage failure
        (``ReadOnly``).

        Each index is copied in a worker thread (the copy runs without the
        GIL) while writes to *that board* wait; the event loop keeps serving.

        A snapshot writes the whole state, remembered event ids included, so
        the next one is wanted only after at least as many records as this
        one wrote entries (or ``snapshot_every_events``, if more), but never
        more than ``MAX_SNAPSHOT_EVERY_EVENTS``, or after
        ``snapshot_every_bytes`` bytes of log, whichever first: a busy
        server with a big dedupe table does not spend most of its time
        rewriting it, and the WAL tail a crash leaves stays bounded (see
        :mod:`rankd.engine.tail`).
        """
        core, state, commits = self.core, self.state, self.commits
        async with self.lock:
            self.guard.check_writable()
            started = time.monotonic()
            lsn = core.wal.last_lsn
            logged_bytes = core.wal.stats.bytes
            positions = dict(state.positions)
            building = staging.parts_of(state.staged)  # (at `lsn`: no await between)
            try:
                writer = await asyncio.to_thread(core.snapshots.begin, lsn)
            except OSError as exc:
                raise StorageError(f"cannot write a snapshot: {exc}") from exc
            entries = 0
            try:
                if core.replication is not None:
                    await asyncio.to_thread(writer.add, records.encode(
                        ["positions", {g: list(p) for g, p in positions.items()}]))
                for name, board in list(state.boards.items()):
                    if state.boards.get(name) is not board:
                        continue  # dropped meanwhile; the WAL replays the drop
                    entries += await self.snapshot_board(writer, board)
                for part in building:
                    await asyncio.to_thread(writer.add, staging.section(part))
                # The boards may hold writes logged after `lsn`: every one of
                # them must be durable before a snapshot that holds them is.
                try:
                    await core.wal.make_durable(core.wal.last_lsn)
                except WalFailedError as exc:
                    raise self.guard.read_only_after(exc) from exc
                path = await asyncio.to_thread(writer.commit)
            except OSError as exc:
                await asyncio.to_thread(writer.abort)
                raise StorageError(f"cannot write a snapshot: {exc}") from exc
            except BaseException:
                await asyncio.to_thread(writer.abort)
                raise
            commits.snapshot_threshold = min(max(core.config.snapshot_every_events, entries),
                                             MAX_SNAPSHOT_EVERY_EVENTS)
            commits.events_since_snapshot = max(0, core.wal.last_lsn - lsn)
            commits.tail_bytes.set_mark(logged_bytes)
            self.last_time = time.monotonic()
            self.last_snapshot = {"lsn": lsn, "path": str(path), "bytes": writer.size,
                                  "entries": entries, "seconds": time.monotonic() - started}
            log.info("snapshot @%d: %d boards, %d bytes in %.2fs", lsn, len(state.boards),
                     writer.size, self.last_snapshot["seconds"])
            await self._drop_covered_segments()
            return path

    async def snapshot_board(self, writer: Any, board: Board, *, hold: bool = True) -> int:
        """Write one board; return how many entries (members of every
        window and period, labels, event ids) it wrote.  Its writers wait
        (other boards' do not) while its indexes are dumped, in a worker
        thread without the GIL, and while its labels are copied a chunk at
        a time; the copies are encoded and written after writes resume.
        Its event ids are copied a chunk at a time as each is written,
        while writes go on: a copy of them all would double the memory
        they take (hundreds of megabytes on a busy board) for as long as
        the snapshot runs.  Event ids remembered meanwhile are in the WAL
        after the snapshot's position, and ids expired meanwhile would be
        expired again.  The event loop never waits long."""
        async def add(section: list) -> None:
            await asyncio.to_thread(writer.add, records.encode(section))

        entries = 0
        if hold:
            self.state.hold(board)
        try:
            await add(["board", board.name, board.config.to_dict(), board.version,
                       board.updated_at])
            if board.expires_at is not None:
                await add(["expiry", board.name, board.expires_at])
            for window, periods in board.periods.items():
                for period, index in list(periods.items()):
                    entries += len(index)
                    # In pieces, each written as it is made (sections.py).
                    chunks = index.dump_chunks(settings.SNAPSHOT_INDEX_BYTES)
                    await asyncio.to_thread(
                        writer.add_stream, blob_prefix(["index", board.name, window, period],
                                                       chunks.size), chunks, chunks.size)
            labels = [chunk async for chunk in _yielding(_columns(board.labels))]
            entries += len(board.dedupe)
        finally:
            if hold:
                self.state.release(board)
        # As columns: a msgpack map's decoder would intern every key.
        for keys, values in labels:
            await add(["label_columns", board.name, keys, values])
        for chunk in board.dedupe.log_chunks(settings.SNAPSHOT_LOG_BYTES):
            # As parts: no encoded copy of the chunk, nor a packer grown to it.
            await asyncio.to_thread(writer.add_parts,
                                    blob_section(["event_id_store", board.name], chunk))
            del chunk  # (not held while the next is made)
        return entries + sum(len(keys) for keys, _ in labels)

    async def group_snapshot(self, group: int) -> tuple[int, int, list[bytes]]:
        """The state of ``group``'s boards at its last applied position:
        ``(seq, epoch, sections)`` (snapshot sections, as
        ``Engine.load_group_snapshot`` takes them).  The group's writers wait
        while its indexes and labels are copied, as for a local snapshot."""
        state = self.state
        boards = [board for name, board in state.boards.items() if group_of(name) == group]
        for board in boards:
            await board.writable.wait()
        boards = [board for name, board in state.boards.items() if group_of(name) == group]
        seq, epoch = state.positions.get(group, (0, 0))
        sections = _Sections()
        building = staging.parts_of(state.staged, group)  # (at `seq`: no await between)
        for board in boards:  # held at once: the copy is of one position
            state.hold(board)
        try:
            for board in boards:
                await self.snapshot_board(sections, board, hold=False)
        finally:
            for board in boards:
                state.release(board)
        for part in building:
            sections.add(staging.section(part))
        return seq, epoch, sections.parts

    async def _drop_covered_segments(self) -> None:
        core = self.core
        keep_from = core.snapshots.oldest_kept_lsn() + 1
        if core.shipper is not None:
            keep_from = min(keep_from, core.shipper.shipped_lsn + 1)
        await asyncio.to_thread(core.wal.remove_segments_before, keep_from)

    async def loop(self) -> None:
        """Take a snapshot when enough events or time went by since the last."""
        interval = self.core.config.snapshot_every_seconds
        commits = self.commits
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(commits.snapshot_wanted.wait(),
                                       timeout=min(interval, 5))
            commits.snapshot_wanted.clear()
            due = time.monotonic() - self.last_time >= interval
            if self.guard.failure is not None:
                return  # nothing more may become durable: see snapshot()
            events = commits.events_since_snapshot
            if events and (due or events >= commits.snapshot_threshold
                           or self.core.wal.stats.bytes >= commits.tail_bytes.due_at):
                try:
                    await self.snapshot()
                except Exception:
                    log.exception("snapshot failed; the WAL keeps everything meanwhile")


class _Sections:
    """Collects snapshot sections in memory (a group snapshot)."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def add(self, section: bytes) -> None:
        self.parts.append(section)

    def add_parts(self, parts: Sequence[bytes]) -> None:
        self.parts.append(b"".join(parts))

    def add_stream(self, prefix: bytes, pieces: Iterable[bytes], size: int) -> None:
        self.parts.append(b"".join([prefix, *pieces]))


async def _yielding(chunks: Iterator[T]) -> AsyncIterator[T]:
    """``chunks``, letting the event loop run after each."""
    for chunk in chunks:
        yield chunk
        await asyncio.sleep(0)


def _columns(mapping: Mapping[str, Any]) -> Iterator[tuple[list, list]]:
    """``mapping``'s keys and values, in lists of ``SNAPSHOT_CHUNK`` (``mapping``
    must not change meanwhile)."""
    keys, values = iter(mapping), iter(mapping.values())
    while chunk := list(itertools.islice(keys, settings.SNAPSHOT_CHUNK)):
        yield chunk, list(itertools.islice(values, len(chunk)))
