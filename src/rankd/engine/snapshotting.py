"""Taking snapshots: the whole state as of a log position, written while
the engine serves, and the log segments it makes unneeded dropped.

Owns when a snapshot is taken (the loop: after enough events, or time) and
how: each board is copied while its writes go on, its indexes walked a
piece at a time on the event loop (``dump_walk``: what a write changes
meanwhile the log replays from the snapshot's position), and the snapshot
published only once the log holds durably everything it shows.  No write
ever waits for a snapshot's copy of its board.  A cluster node's group
snapshot (for a follower whose position the group's log no longer holds)
is copied the same way, and says how far its copy may reach (``walked``).
The files themselves are :mod:`rankd.engine.snapshot`'s.

May not touch: the board state beyond reading it; the commit pipeline
beyond its event count and trigger (which it resets).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

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

        Each board is copied while its writes go on
        (:meth:`snapshot_board`); the event loop keeps serving.

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
            # The boards as of `lsn` (one made since is made again by the log).
            boards = at_position(state.boards.values())
            try:
                writer = await asyncio.to_thread(core.snapshots.begin, lsn)
            except OSError as exc:
                raise StorageError(f"cannot write a snapshot: {exc}") from exc
            entries = 0
            try:
                if core.replication is not None:
                    await asyncio.to_thread(writer.add, records.encode(
                        ["positions", {g: list(p) for g, p in positions.items()}]))
                for group, covers in list(state.walked.items()):
                    if positions.get(group, (0, 0))[0] < covers:  # (still catching up)
                        await asyncio.to_thread(writer.add, records.encode(
                            ["walked", group, covers]))
                for board, version, updated_at in boards:
                    if state.boards.get(board.name) is not board:
                        continue  # dropped meanwhile; the WAL replays the drop
                    entries += await self.snapshot_board(writer, board, version, updated_at)
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

    async def snapshot_board(self, writer: Any, board: Board, version: int,
                             updated_at: float) -> int:
        """Write one board; return how many entries (members of every
        window and period, labels, event ids) it wrote.  ``version`` and
        ``updated_at`` are its own at the snapshot's position
        (:func:`at_position`): the log replayed from there counts every
        version since again.

        Its writes go on meanwhile: each index is walked (``dump_walk``) a
        piece at a time on the event loop (well under a millisecond each),
        its labels copied a chunk at a time.  What a write changes meanwhile
        may be in the snapshot or not; the snapshot's position is from
        before the walk, so replaying the log from there sets it again (its
        records are absolute states).  No write waits for the size of a
        board, and no other thread reads an index while the loop writes it.

        Its event ids are copied a chunk at a time as each is written: a
        copy of them all would double the memory they take (hundreds of
        megabytes on a busy board) for as long as the snapshot runs.  Event
        ids remembered meanwhile are in the log after the snapshot's
        position, and ids expired meanwhile would be expired again."""
        async def add(section: list) -> None:
            await asyncio.to_thread(writer.add, records.encode(section))

        # The windows walked are the config's written here (no await between):
        # a window added meanwhile has no place in the board a restart makes.
        windows = list(board.periods.items())
        await add(["board", board.name, board.config.to_dict(), version, updated_at])
        if board.expires_at is not None:
            await add(["expiry", board.name, board.expires_at])
        entries = 0
        for window, periods in windows:
            for period, index in list(periods.items()):
                entries += await _walk_index(writer, ["index", board.name, window, period],
                                             index)
        labels = board.labels
        names = list(labels)  # (one copy of the keys; their values are read as written)
        for start in range(0, len(names), settings.SNAPSHOT_CHUNK):
            keys = names[start:start + settings.SNAPSHOT_CHUNK]
            values = list(map(labels.get, keys))
            if None in values:  # (removed since the copy)
                kept = [i for i, value in enumerate(values) if value is not None]
                keys, values = [keys[i] for i in kept], [values[i] for i in kept]
            # As columns: a msgpack map's decoder would intern every key.
            section = records.encode(["label_columns", board.name, keys, values])
            await asyncio.to_thread(writer.add, section)
            entries += len(keys)
        return entries + await _event_ids(writer, board)

    async def group_snapshot(self, group: int) -> tuple[int, int, list[bytes], int]:
        """The state of ``group``'s boards from its last applied position:
        ``(seq, epoch, sections, covers)`` (snapshot sections, as
        ``Engine.load_group_snapshot`` takes them).

        Its boards are walked while their writes go on, as for a local
        snapshot: the sections hold the group's state at ``seq`` and some of
        the writes applied after it, up to ``covers`` (the position applied
        when the copy ended), which the group's log applied from ``seq``
        sets again.  It may be kept only once the log holds ``covers`` (a
        write applied here and never committed must not reach a follower),
        and a follower loaded from it serves no read of the group before it
        applied that far (the ``walked`` section)."""
        state = self.state
        boards = [board for name, board in state.boards.items() if group_of(name) == group]
        for board in boards:  # (a store swapping a board in: after it)
            await board.writable.wait()
        boards = at_position(board for name, board in state.boards.items()
                             if group_of(name) == group)
        seq, epoch = state.positions.get(group, (0, 0))
        sections = _Sections()
        building = staging.parts_of(state.staged, group)  # (at `seq`: no await between)
        for board, version, updated_at in boards:
            await self.snapshot_board(sections, board, version, updated_at)
        covers = max(state.positions.get(group, (0, 0))[0], seq)
        for part in building:
            sections.add(staging.section(part))
        if covers > seq:  # (a follower serves no read of it before it applied this far)
            sections.parts.insert(0, records.encode(["walked", group, covers]))
        return seq, epoch, sections.parts, covers

    async def _drop_covered_segments(self) -> None:
        core = self.core
        keep_from = core.snapshots.oldest_kept_lsn() + 1
        if core.shipper is not None:
            keep_from = min(keep_from, core.shipper.shipped_lsn + 1)
        unshipped = core.unshipped.lowest()  # (a cluster primary's, not in Postgres yet)
        if unshipped is not None:
            keep_from = min(keep_from, unshipped)
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


def at_position(boards: Iterable[Board]) -> list[tuple[Board, int, float]]:
    """``(board, version, updated_at)`` of each of ``boards`` now: taken at a
    snapshot's position (no await between), written in its section, so that
    the versions the writes after it count are counted once."""
    return [(board, board.version, board.updated_at) for board in boards]


async def _walk_index(writer: Any, head: list, index: Any) -> int:
    """Write ``index`` walked (:meth:`Snapshotter.snapshot_board`) as the
    section ``head``; return the records written.  Each piece is made on
    the event loop, which runs writes between pieces; the file is written
    from a worker thread, a few MiB at a time."""
    batch = settings.SNAPSHOT_INDEX_BYTES // 4  # (pieces held before a write)
    walk = index.dump_walk(min(settings.SNAPSHOT_WALK_BYTES, batch))
    section = writer.walked(head)
    pending: list[bytes] = []
    size = 0
    for piece in walk:
        pending.append(piece)
        size += len(piece)
        if size >= batch:
            await asyncio.to_thread(section.write, pending)
            pending, size = [], 0
        else:
            await asyncio.sleep(0)
    if pending:
        await asyncio.to_thread(section.write, pending)
    await asyncio.to_thread(section.finish, walk.header())
    return walk.records


async def _event_ids(writer: Any, board: Board) -> int:
    """Write ``board``'s remembered event ids a chunk at a time, while its
    writes go on (:meth:`Snapshotter.snapshot_board`); return how many."""
    count = len(board.dedupe)
    for chunk in board.dedupe.log_chunks(settings.SNAPSHOT_LOG_BYTES):
        # As parts: no encoded copy of the chunk, nor a packer grown to it.
        await asyncio.to_thread(writer.add_parts,
                                blob_section(["event_id_store", board.name], chunk))
        del chunk  # (not held while the next is made)
    return count


class _Walked:
    """A walked index section collected in memory (:class:`_Sections`)."""

    def __init__(self, sections: _Sections, head: list) -> None:
        self._sections = sections
        self._head = head
        self._pieces: list[bytes] = []

    def write(self, pieces: list[bytes]) -> None:
        self._pieces += pieces

    def finish(self, header: bytes) -> None:
        body = [header, *self._pieces]
        crc = 0
        for part in body:
            crc = zlib.crc32(part, crc)
        body.append(crc.to_bytes(4, "little"))
        self._sections.parts.append(
            b"".join([blob_prefix(self._head, sum(map(len, body))), *body]))
        self._pieces = []


class _Sections:
    """Collects snapshot sections in memory (a group snapshot)."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def add(self, section: bytes) -> None:
        self.parts.append(section)

    def add_parts(self, parts: Sequence[bytes]) -> None:
        self.parts.append(b"".join(parts))

    def walked(self, head: list) -> _Walked:
        return _Walked(self, head)
