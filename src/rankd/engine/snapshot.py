"""Snapshot files: the whole engine state as of a log position.

A snapshot is a sequence of opaque *sections* (the engine writes msgpack:
board configs, index dumps, dedupe tables) framed like WAL records::

    header   magic b"RKSNAP01" | u64 lsn
    section  u32 length | u32 CRC-32 of the payload | payload     (repeated)
    end      u32 0xFFFFFFFF | u32 CRC-32 of the header           (exactly once)

``lsn`` is the log position the snapshot was *started* at: every record
after it is replayed on top.  Because WAL records carry absolute state,
replaying a record whose effect the snapshot already holds changes nothing,
so the engine may keep serving writes while it snapshots board by board.

Files are written to a temporary name, fsynced, renamed into place and the
directory fsynced, so a crash leaves either the old snapshot set or the new
one.  The store keeps the two newest snapshots: if the newest turns out
unreadable the previous one still has its WAL tail, because the engine only
removes segments older than the *oldest* kept snapshot.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from rankd.engine.sections import walked_prefix
from rankd.index._contract import DUMP_HEADER, DUMP_TRAILER

log = logging.getLogger(__name__)

MAGIC = b"RKSNAP01"
_HEADER = struct.Struct("<8sQ")
_FRAME = struct.Struct("<II")
_END = 0xFFFFFFFF
KEEP = 2


class SnapshotError(Exception):
    """A snapshot file is unreadable (truncated, corrupt or not a snapshot)."""


def _name(lsn: int) -> str:
    return f"snapshot-{lsn:020d}.snap"


def fsync_directory(directory: Path) -> None:
    """Make a rename or unlink in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SnapshotWriter:
    """Writes one snapshot; all methods block (run them in an executor)."""

    def __init__(self, store: SnapshotStore, lsn: int) -> None:
        self.lsn = lsn
        self.path = store.directory / _name(lsn)
        self._store = store
        self._tmp = self.path.with_suffix(".tmp")
        fd = os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        self._file = open(fd, "wb")  # noqa: SIM115 - closed by commit/abort
        self._header = _HEADER.pack(MAGIC, lsn)
        self.size = len(self._header)
        try:
            self._file.write(self._header)
        except BaseException:
            self.abort()
            raise

    def add(self, payload: bytes) -> None:
        """Append one section."""
        self._file.write(_FRAME.pack(len(payload), zlib.crc32(payload)))
        self._file.write(payload)
        self.size += _FRAME.size + len(payload)

    def add_parts(self, parts: Sequence[bytes]) -> None:
        """Append one section given as parts written in turn (a big blob
        is written where it is, never copied into one payload)."""
        size = sum(map(len, parts))
        crc = 0
        for part in parts:
            crc = zlib.crc32(part, crc)
        self._file.write(_FRAME.pack(size, crc))
        for part in parts:
            self._file.write(part)
        self.size += _FRAME.size + size

    def walked(self, head: Sequence[Any]) -> WalkedSection:
        """Begin a section of ``head`` then a walked dump (``dump_walk``),
        written as its pieces come (:class:`WalkedSection`)."""
        return WalkedSection(self, head)

    def commit(self) -> Path:
        """Seal, fsync and publish the snapshot; prune old ones."""
        self._file.write(_FRAME.pack(_END, zlib.crc32(self._header)))
        self.size += _FRAME.size
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self._tmp, self.path)
        fsync_directory(self._store.directory)
        self._store.prune()
        return self.path

    def abort(self) -> None:
        """Drop the unfinished snapshot (even when closing it fails: a full
        disk fails the flush of what is still buffered)."""
        for step in (self._file.close, lambda: self._tmp.unlink(missing_ok=True)):
            try:
                step()
            except OSError as exc:  # what is left is cleared at the next start
                log.error("cannot drop the unfinished snapshot %s: %s", self._tmp, exc)


class WalkedSection:
    """A snapshot section ending in a walked dump: its pieces are written as
    they come; its sizes and dump header, known once the walk ends, are put
    in place then, and both checksums (the frame's, the dump's) taken by
    reading the section back (from the page cache: the walk's pieces are
    made on the event loop and must not wait for a checksum pass each)."""

    def __init__(self, writer: SnapshotWriter, head: Sequence[Any]) -> None:
        self._writer = writer
        self._head = head
        self._start = writer._file.tell()
        self._prefix = walked_prefix(head)
        writer._file.write(_FRAME.pack(0, 0) + self._prefix + bytes(DUMP_HEADER.size))
        self._records = 0

    def write(self, pieces: Sequence[bytes]) -> None:
        """Append walked records."""
        self._writer._file.writelines(pieces)
        self._records += sum(map(len, pieces))

    def finish(self, header: bytes) -> None:
        """End the section with the walk's ``header`` (``header()``)."""
        writer, file = self._writer, self._writer._file
        prefix = walked_prefix(self._head, len(header) + self._records + DUMP_TRAILER.size)
        file.write(bytes(DUMP_TRAILER.size))
        end = file.tell()
        file.flush()
        dump_crc = zlib.crc32(header)
        frame_crc = zlib.crc32(header, zlib.crc32(prefix))
        with open(self._tmp_path(), "rb") as read:
            read.seek(self._start + _FRAME.size + len(prefix) + len(header))
            left = self._records
            while left:
                chunk = read.read(min(left, 64 << 10))
                if not chunk:
                    raise OSError(f"snapshot {self._tmp_path()} is shorter than was written")
                dump_crc = zlib.crc32(chunk, dump_crc)
                frame_crc = zlib.crc32(chunk, frame_crc)
                left -= len(chunk)
        trailer = DUMP_TRAILER.pack(dump_crc)
        payload = len(prefix) + len(header) + self._records + len(trailer)
        file.seek(self._start)
        file.write(_FRAME.pack(payload, zlib.crc32(trailer, frame_crc)) + prefix + header)
        file.seek(end - len(trailer))
        file.write(trailer)
        writer.size += _FRAME.size + payload

    def _tmp_path(self) -> Path:
        return self._writer._tmp


class SnapshotStore:
    """The snapshot files of one data directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def open(self) -> None:
        """Create the directory, or clear what an interrupted snapshot left."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        for leftover in self.directory.glob("snapshot-*.tmp"):
            leftover.unlink()  # an interrupted snapshot; the previous ones stand

    def begin(self, lsn: int) -> SnapshotWriter:
        """Start a snapshot of the state as of log position ``lsn``."""
        return SnapshotWriter(self, lsn)

    def snapshots(self) -> list[tuple[int, Path]]:
        """``(lsn, path)`` of every published snapshot, oldest first."""
        found = []
        for path in self.directory.glob("snapshot-*.snap"):
            try:
                found.append((int(path.stem.removeprefix("snapshot-")), path))
            except ValueError:
                log.warning("ignoring %s: not a snapshot name", path)
        return sorted(found)

    def oldest_kept_lsn(self) -> int:
        """Log position the WAL must be kept from (0: keep everything)."""
        snapshots = self.snapshots()
        return snapshots[0][0] if snapshots else 0

    def prune(self) -> None:
        """Remove all but the newest :data:`KEEP` snapshots."""
        snapshots = self.snapshots()
        for _, path in snapshots[:-KEEP]:
            path.unlink()
        if len(snapshots) > KEEP:
            fsync_directory(self.directory)

    def latest(self) -> tuple[int, SnapshotSections] | None:
        """The newest readable snapshot as ``(lsn, sections)``; every frame
        is checked first, and ``sections`` reads them from the file one at a
        time as it is iterated (:class:`SnapshotSections`).

        An unreadable newest snapshot is logged and skipped for the previous
        one.  Returns ``None`` when there is no snapshot at all, and raises
        :class:`SnapshotError` when snapshots exist but none is readable.
        """
        if not self.directory.is_dir():
            return None
        snapshots = self.snapshots()
        errors = []
        for lsn, path in reversed(snapshots):
            try:
                return lsn, SnapshotSections(path)
            except SnapshotError as exc:
                log.error("snapshot %s is unreadable (%s); trying an older one", path, exc)
                errors.append(str(exc))
        if errors:
            raise SnapshotError("no readable snapshot: " + "; ".join(errors))
        return None


#: Bytes read at a time while a snapshot's frames are checked.
_CHECK_READ = 1 << 20


class SnapshotSections:
    """The sections of a snapshot file whose every frame was checked (the
    constructor reads the file through once, a chunk at a time, and raises
    :class:`SnapshotError` if it is not whole).  Each iteration reads the
    sections from the file again, one at a time, each as its own ``bytes``:
    a restart holds the section being applied, not the file (it held the
    whole file until the last index was built: a board's four windows' dumps,
    or all of its event ids, on top of the state built from them).  A file
    changed after the check (it never is: snapshots are written once) is
    caught by each section's checksum again."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.count = 0
        with open(path, "rb") as f:
            header = _read_header(f, path)
            buffer = bytearray(_CHECK_READ)
            while (length := _next_frame(f, path, header)) is not None:
                size, crc = length
                value, left = 0, size
                while left:
                    got = f.readinto(memoryview(buffer)[:min(left, _CHECK_READ)])
                    if not got:
                        raise SnapshotError(f"{path}: truncated at byte {f.tell()}")
                    value = zlib.crc32(memoryview(buffer)[:got], value)
                    left -= got
                if value != crc:
                    raise SnapshotError(
                        f"{path}: checksum mismatch in the section at byte {f.tell() - size}")
                self.count += 1
            if f.read(1):
                raise SnapshotError(f"{path}: bytes after the end marker")

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[bytes]:
        for section in self.stream(-1):
            assert isinstance(section, bytes)
            yield section

    def stream(self, large: int) -> Iterator[bytes | LargeSection]:
        """The sections as :meth:`__iter__` gives them, but each of more
        than ``large`` bytes (-1: none) as a :class:`LargeSection`, to be
        read in pieces before the next section is asked for (a restart
        loads a board's index from its file a window at a time)."""
        with open(self.path, "rb") as f:
            header = _read_header(f, self.path)
            while (length := _next_frame(f, self.path, header)) is not None:
                size, crc = length
                if 0 <= large < size:
                    start = f.tell()
                    yield LargeSection(f, self.path, start, size, crc)
                    f.seek(start + size)
                    continue
                payload = f.read(size)
                if len(payload) != size or zlib.crc32(payload) != crc:
                    raise SnapshotError(f"{self.path}: changed since it was checked")
                yield payload


class LargeSection:
    """A big section of a snapshot file, read when it is applied, whole
    (:meth:`read`) or in pieces (:meth:`pieces`), its checksum checked
    again either way.  Valid until the next section is asked for."""

    def __init__(self, f: BinaryIO, path: Path, offset: int, size: int, crc: int) -> None:
        self._f, self._path, self._offset, self.size, self._crc = f, path, offset, size, crc

    def read(self) -> bytes:
        """The whole section."""
        return b"".join(self.pieces(self.size))

    def pieces(self, window: int) -> Iterator[bytes]:
        """The section in pieces of ``window`` bytes, each read as it is
        asked for; once the last was read,
        :class:`SnapshotError` if the bytes are not those checked."""
        f = self._f
        f.seek(self._offset)
        left, crc = self.size, 0
        while left:
            piece = f.read(min(left, window))
            if not piece:
                break
            crc = zlib.crc32(piece, crc)
            left -= len(piece)
            yield piece
            del piece
        if left or crc != self._crc:
            raise SnapshotError(f"{self._path}: changed since it was checked")


def _read_header(f: BinaryIO, path: Path) -> bytes:
    header = f.read(_HEADER.size)
    if len(header) < _HEADER.size or header[:8] != MAGIC:
        raise SnapshotError(f"{path}: not a snapshot file")
    return header


def _next_frame(f: BinaryIO, path: Path, header: bytes) -> tuple[int, int] | None:
    """The next section's ``(length, crc)``; None at the end marker."""
    frame = f.read(_FRAME.size)
    if len(frame) < _FRAME.size:
        raise SnapshotError(f"{path}: truncated at byte {f.tell() - len(frame)}")
    length, crc = _FRAME.unpack(frame)
    if length == _END:
        if crc != zlib.crc32(header):
            raise SnapshotError(f"{path}: bad end marker")
        return None
    return length, crc


def read_sections(path: Path) -> Iterator[bytes]:
    """Yield the sections of a snapshot file, every frame checked before the
    first is yielded (:class:`SnapshotSections`)."""
    yield from SnapshotSections(path)
