"""The write-ahead log: append-only segment files of checksummed records.

Every change the engine acknowledges is a record here first.  A record is
identified by its *log position* (LSN): 1, 2, 3... without gaps.  Records
are framed as::

    u32 CRC-32C of (length word, lsn, payload) | u32 length word | u64 lsn | payload

(older logs' frames carry CRC-32; see :mod:`rankd.engine.frames` for how
each frame says which) and stored in segment files named after their first LSN
(``00000000000000000001.log``).  A new segment starts once the current one
holds ``segment_bytes``; segments wholly covered by a snapshot (and shipped
to Postgres, when configured) are deleted by the engine.

Durability is the ``fsync`` policy:

``always``
    ``commit`` returns only after the records are fsynced.  Concurrent
    committers share one write+fsync (group commit): while one fsync runs in
    a worker thread, later records pile up and go out together with the next.
    Loses nothing, not even on power loss.
``everysec`` (default)
    ``commit`` writes the records to the OS (so a crash of rankd loses
    nothing) and a background task fsyncs once a second: an OS crash or
    power loss can lose about the last second of acknowledged writes.
    Committers of one pass of the event loop share one write (group write):
    many connections each committing a few records cost one system call.
``no``
    Written to the OS at ``commit``, fsynced only at close: an OS crash or
    power loss loses whatever the kernel had not yet written back (on Linux
    up to ~30 s by default).

A failed write or fsync is never retried: after ``fsync`` fails the kernel
may have dropped the dirty pages, so retrying could report success for data
that is gone.  The log turns *failed* instead, every later append or commit
raises :class:`WalFailedError`, and the engine stops taking writes until it
is restarted (and recovers from what is really on disk).  Records whose
commit failed were refused to their writers, so the log also cuts its files
back to the end of the last acknowledged record (best effort: the disk may
refuse that too), lest a restart bring refused writes back.

Recovery reads segments back with :meth:`WriteAheadLog.iter_records`.  A
record cut short at the very end of the log (a crash mid-write) is a *torn
tail*: it is truncated with a warning.  Only the last record can be torn,
so damage counts as a torn tail only when no whole record follows it (see
:func:`rankd.engine.frames.is_torn_tail`).  Any other bad record is
corruption, and so is a gap between segments (each segment must start at
the position after the last record of the one before): opening or reading
stops with :class:`WalCorruptError` naming the file and offset, unless
``repair`` is set, which truncates the log there and moves everything after
it aside to ``corrupt-*`` files in the WAL directory.

A segment is fsynced before the next one is created, whatever the policy:
after a power loss only the newest segment can have lost its last writes,
so damage in any other is always corruption.

Under ``everysec`` and ``no`` the log also keeps a *sync mark* (the file
``synced``: segment and size the last fsync made durable, itself fsynced
right after).  What lies beyond it was never promised to survive a power
loss, so damage there (a hole of zeroes that pages written back out of
order leave, with whole records after it) is cut off like a torn tail,
without ``repair``.  Under ``always`` every acknowledged record is fsynced,
a mark would cost a second fsync per commit, and none is kept: damage
followed by whole records is corruption there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import mmap
import os
import struct
import threading
import time
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from rankd._tasks import outcome_seen, stop_task
from rankd.engine.frames import (
    HEADER_BYTES,
    BadFrame,
    find_frame,
    frame_into,
    is_torn_tail,
    scan,
    scan_in_place,
)
from rankd.engine.snapshot import fsync_directory

log = logging.getLogger(__name__)

FSYNC_POLICIES = ("always", "everysec", "no")
DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024
_SUFFIX = ".log"
#: The sync mark: magic, first position of the segment, durable size, CRC-32.
_MARK_NAME = "synced"
_MARK = struct.Struct("<8sQQI")
_MARK_MAGIC = b"RKSYNC01"


@dataclass
class WalStats:
    """Counters for metrics (plain ints: the append path stays cheap)."""

    appends: int = 0
    bytes: int = 0
    fsyncs: int = 0
    fsync_seconds: float = 0.0
    last_fsync_seconds: float = 0.0


class WalFailedError(Exception):
    """A write or fsync failed; the log accepts nothing until reopened."""


class WalCorruptError(Exception):
    """A record in the middle of the log is unreadable."""

    def __init__(self, path: Path, offset: int, reason: str) -> None:
        super().__init__(
            f"write-ahead log corrupt in {path} at byte offset {offset}: {reason}; "
            f"start with --repair (RANKD_REPAIR=1) to truncate the log there and keep the "
            f"rest aside in {path.parent if path.suffix else path}"
        )
        self.path = path
        self.offset = offset


def pack_sync_mark(first_lsn: int, size: int) -> bytes:
    head = _MARK.pack(_MARK_MAGIC, first_lsn, size, 0)[:-4]
    return head + struct.pack("<I", zlib.crc32(head))


def read_sync_mark(directory: Path) -> tuple[int, int] | None:
    """``(segment first lsn, durable size)`` of a log's sync mark, or None
    when there is none or it is unreadable (then nothing is beyond it)."""
    try:
        data = (directory / _MARK_NAME).read_bytes()
    except OSError:
        return None
    if len(data) < _MARK.size:
        return None
    magic, first, size, crc = _MARK.unpack_from(data)
    if magic != _MARK_MAGIC or crc != zlib.crc32(data[:_MARK.size - 4]):
        return None
    return first, size


def _mapped(path: Path) -> mmap.mmap | bytes:
    """A segment's bytes, mapped read-only (recovery reads them in place)."""
    with open(path, "rb") as file:
        if os.fstat(file.fileno()).st_size == 0:
            return b""
        return mmap.mmap(file.fileno(), 0, prot=mmap.PROT_READ)


def _let_go(data: mmap.mmap | bytes, end: int) -> None:
    """Drop the mapped pages of ``data`` before ``end`` from this process's
    resident set (a read-only file mapping: a later read maps them again
    from the page cache, so nothing that refers to them breaks).  A
    recovery's scan touches every page of the segments it replays: up to a
    whole segment more resident memory at a restart's peak."""
    if isinstance(data, mmap.mmap) and end >= mmap.PAGESIZE:
        with contextlib.suppress(OSError, ValueError):
            data.madvise(mmap.MADV_DONTNEED, 0, end - end % mmap.PAGESIZE)


def _skip_to(data: mmap.mmap | bytes, lsn: int, from_lsn: int, check: bool) -> tuple[int, int]:
    """``(offset, lsn)`` of ``data``'s frame of position ``from_lsn`` (or of
    the first damage, or the end), walking sound frames ``_CHECK_WINDOW``
    bytes at a time and letting each window's pages go."""
    offset, window = 0, _CHECK_WINDOW
    view = memoryview(data)
    while lsn < from_lsn and offset < len(view):
        found = scan(view[offset:offset + window], lsn, check=check, upto_lsn=from_lsn - 1,
                     collect=False)
        offset += found.end
        lsn = found.next_lsn
        _let_go(data, offset)
        if found.bad is not None:
            if not found.bad.torn or offset + window >= len(view):
                break  # (the caller's walk finds it again and deals with it)
            if found.end == 0:
                window *= 2  # (one frame bigger than the window)
    view.release()
    return offset, lsn


#: Bytes of a segment checked at a time when the log is opened.
_CHECK_WINDOW = 4 << 20


def _scan_windows(path: Path, first: int) -> tuple[int, int] | None:
    """``(valid bytes, next lsn)`` of a segment whose frames are all whole
    and sound, read ``_CHECK_WINDOW`` bytes at a time (a restart read the
    last segment whole, up to ``segment_bytes``, on top of the state it
    had just loaded); None at the first damage of any kind, which the
    caller then reads whole to mend or report."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        offset, next_lsn, window = 0, first, _CHECK_WINDOW
        while offset < size:
            f.seek(offset)
            data = f.read(window)
            found = scan(data, next_lsn, collect=False)
            offset += found.end
            next_lsn = found.next_lsn
            if found.bad is None:
                continue
            if not found.bad.torn or len(data) < window:
                return None  # (damage, or a frame cut short by the file's end)
            if found.end == 0:
                window *= 2  # (one frame bigger than the window)
        return offset, next_lsn


def segment_name(first_lsn: int) -> str:
    return f"{first_lsn:020d}{_SUFFIX}"


def inspect_segment(path: Path, *, final: bool = True,
                    mark: tuple[int, int] | None = None) -> dict[str, object]:
    """Records, positions and checksum status of one segment, read-only.
    Only the ``final`` segment of a log can end in a torn tail, or be
    damaged after its sync ``mark`` (then start-up cuts it off too)."""
    data = path.read_bytes()
    first = int(path.name[: -len(_SUFFIX)])
    report: dict[str, object] = {"records": 0, "first_lsn": first, "last_lsn": first - 1,
                                 "bytes": len(data), "status": "ok"}
    found = scan(data, first, collect=False)
    report["records"] = found.next_lsn - first
    report["last_lsn"] = found.next_lsn - 1
    bad = found.bad
    if bad is not None:
        torn = final and is_torn_tail(data, bad, found.next_lsn)
        unsynced = final and mark is not None and (
            first > mark[0] or (first == mark[0] and bad.offset >= mark[1]))
        kind = ("torn tail" if torn else
                "damaged after the last fsync (cut off at start)" if unsynced else "CORRUPT")
        report["status"] = (f"{kind} at byte offset {bad.offset} ({bad.reason}; "
                            f"{len(data) - bad.offset} bytes after it)")
    return report


def inspect_log(directory: Path) -> list[tuple[Path, dict[str, object]]]:
    """:func:`inspect_segment` of every segment in ``directory``, oldest
    first, where a segment that does not start right after the one before
    is reported as a gap (records missing)."""
    paths = sorted(directory.glob("*" + _SUFFIX))
    mark = read_sync_mark(directory)
    reports = []
    for position, path in enumerate(paths):
        report = inspect_segment(path, final=position == len(paths) - 1, mark=mark)
        if reports and report["status"] == "ok":
            before = reports[-1][1]
            expected = int(before["last_lsn"]) + 1
            if report["first_lsn"] != expected and before["status"] == "ok":
                report["status"] = (f"CORRUPT: starts at position {report['first_lsn']} but "
                                    f"the segment before ends at {expected - 1} "
                                    f"(a segment is missing or misplaced)")
        reports.append((path, report))
    return reports


class WriteAheadLog:
    """Append-only, checksummed, segmented log with group commit.

    The constructor opens ``directory`` (creating it), checks the final
    segment and truncates a torn tail.  ``after_lsn`` is the position state
    is already known up to (the snapshot's): new records never reuse a
    position at or below it, even if the log itself ends earlier.

    :meth:`append` only buffers; :meth:`commit` makes records as durable as
    the policy promises.  All methods are for the event loop's thread; blocking
    I/O for ``always`` and the once-a-second fsync run in worker threads.
    """

    def __init__(self, directory: str | os.PathLike, *, fsync: str = "everysec",
                 segment_bytes: int = DEFAULT_SEGMENT_BYTES, repair: bool = False,
                 after_lsn: int = 0) -> None:
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync policy must be one of {', '.join(FSYNC_POLICIES)}, "
                             f"not {fsync!r}")
        if segment_bytes < 4096:
            raise ValueError("segment_bytes must be at least 4096")
        self.directory = Path(directory)
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.fsync = fsync
        self.segment_bytes = segment_bytes
        self.repair = repair
        #: (first lsn, path) of every segment, oldest first.
        self._segments: list[tuple[int, Path]] = []
        self._last_lsn = 0
        # Buffered records not yet handed to the OS, and where new segments
        # start inside that buffer: (offset in buffer, first lsn).
        self._pending = bytearray()
        self._rolls: list[tuple[int, int]] = []
        self._active_bytes = 0
        self._fd: int | None = None
        self._retired: list[int] = []  # fds of finished segments awaiting fsync+close
        # Bytes written to the newest segment file, and (file, size) at the end
        # of the last acknowledged record: where a failure cuts back to.
        self._file_bytes = 0
        self._acknowledged_end: tuple[Path, int] | None = None
        self._dir_dirty = False
        self._fd_lock = threading.Lock()
        self._written_lsn = 0
        self._durable_lsn = 0
        self._failure: BaseException | None = None
        self._flush: asyncio.Future | None = None
        self._write_soon: asyncio.Future | None = None
        #: A write that starts a segment, in a worker thread (see _roll_out).
        self._rolling: asyncio.Future | None = None
        self._syncer: asyncio.Task | None = None
        self._closed = False
        self.stats = WalStats()
        self._checked: tuple[Path | None, int] = (None, 0)
        #: (segment first lsn, size) the last fsync made durable, read at
        #: opening from the previous run's mark (see the module docstring).
        self._mark = read_sync_mark(self.directory)
        self._mark_fd: int | None = None
        self._open_existing(after_lsn)
        mark_path = self.directory / _MARK_NAME
        if fsync == "always":
            mark_path.unlink(missing_ok=True)  # none kept: never a stale one
        else:
            self._mark_fd = os.open(mark_path, os.O_RDWR | os.O_CREAT, 0o600)

    # --- opening ----------------------------------------------------------------

    def _open_existing(self, after_lsn: int) -> None:
        for path in sorted(self.directory.glob("*" + _SUFFIX)):
            try:
                first = int(path.name[: -len(_SUFFIX)])
            except ValueError:
                continue
            self._segments.append((first, path))
        if self._segments:
            first, path = self._segments[-1]
            count, valid_bytes = self._check_segment(first, path, final=True,
                                                     covered=after_lsn)
            self._last_lsn = first + count - 1
            self._active_bytes = self._file_bytes = valid_bytes
            self._acknowledged_end = (path, valid_bytes)
        #: The newest position found on disk at opening.
        self.found_lsn = self._last_lsn
        if self._last_lsn < after_lsn or not self._segments:
            # Nothing to append to, or the log ends before state known from a
            # snapshot: the next record opens a new segment at the right position.
            self._last_lsn = max(self._last_lsn, after_lsn)
            self._rolls.append((0, self._last_lsn + 1))
        self._written_lsn = self._durable_lsn = self._last_lsn

    def _check_segment(self, first: int, path: Path, *, final: bool, covered: int = 0
                       ) -> tuple[int, int]:
        """Validate one segment: (records, valid bytes).  Fixes or raises on
        damage, except in records up to ``covered`` (a snapshot holds them)
        when whole records follow from the next position on."""
        whole = _scan_windows(path, first)
        if whole is not None:  # (the usual case, in bounded memory)
            self._checked = (path, whole[0])
            return whole[1] - first, whole[0]
        data = path.read_bytes()
        found = scan(data, first, collect=False)
        if found.bad is not None and found.next_lsn <= covered:
            resume = find_frame(data, found.bad.offset + 1, covered + 1, covered + 1)
            if resume >= 0:
                log.warning("write-ahead log %s: record %d at byte offset %d is corrupt (%s) "
                            "but a snapshot covers it", path.name, found.next_lsn,
                            found.bad.offset, found.bad.reason)
                rest = scan(memoryview(data)[resume:], covered + 1, collect=False)
                found = rest._replace(end=resume + rest.end, bad=None if rest.bad is None
                                      else rest.bad._replace(offset=resume + rest.bad.offset))
        if found.bad is not None:
            self._damaged(path, data, found.bad, found.next_lsn, final=final)
        self._checked = (path, found.end)
        return found.next_lsn - first, found.end

    def _damaged(self, path: Path, data: bytes, bad: BadFrame, bad_lsn: int, *,
                 final: bool) -> None:
        """Truncate a torn tail; raise on corruption, or repair it when allowed."""
        rest = data[bad.offset:]
        if final and not is_torn_tail(data, bad, bad_lsn) and self._beyond_mark(path,
                                                                                bad.offset):
            log.warning("write-ahead log %s is damaged at byte offset %d (%s), after the last "
                        "fsynced byte (a power loss): dropping the %d bytes from there",
                        path.name, bad.offset, bad.reason, len(rest))
            self._truncate(path, bad.offset)
            return
        if final and is_torn_tail(data, bad, bad_lsn):
            log.warning("write-ahead log %s ends with a torn record at byte offset %d "
                        "(a crash mid-write); dropping its %d bytes",
                        path.name, bad.offset, len(rest))
            self._truncate(path, bad.offset)
            return
        if not self.repair:
            raise WalCorruptError(path, bad.offset, bad.reason)
        self._move_aside_from(path, bad.offset, data)

    def _truncate(self, path: Path, length: int) -> None:
        with open(path, "r+b") as handle:
            handle.truncate(length)
            handle.flush()
            os.fsync(handle.fileno())

    def _beyond_mark(self, path: Path, offset: int) -> bool:
        """Whether byte ``offset`` of ``path`` lies after what the last
        recorded fsync made durable."""
        if self._mark is None:
            return False
        first, size = self._mark
        return int(path.stem) > first or (int(path.stem) == first and offset >= size)

    def _broken_chain(self, path: Path, data: bytes, next_lsn: int, follower: int) -> None:
        """The segment after ``path`` starts at ``follower`` where ``next_lsn``
        was expected: records are missing (or segments misplaced)."""
        reason = (f"the log continues at position {follower} in the next segment but this "
                  f"segment ends before position {next_lsn}: records {next_lsn}-"
                  f"{follower - 1} are missing" if follower > next_lsn else
                  f"the next segment starts at position {follower}, inside this segment")
        if not self.repair:
            raise WalCorruptError(path, len(data), reason)
        self._move_aside_from(path, len(data), data)

    def _move_aside_from(self, path: Path, offset: int, data: bytes) -> None:
        """Repair: keep ``path`` up to ``offset``; everything after goes to corrupt-* files."""
        stamp = time.strftime("%Y%m%dT%H%M%S")
        aside = self.directory / f"corrupt-{stamp}-{path.stem}-at-{offset}{_SUFFIX}.bad"
        aside.write_bytes(data[offset:])
        self._truncate(path, offset)
        position = next(i for i, (_, p) in enumerate(self._segments) if p == path)
        for _, later in self._segments[position + 1:]:
            later.rename(self.directory / f"corrupt-{stamp}-{later.name}.bad")
        del self._segments[position + 1:]
        fsync_directory(self.directory)
        log.error("write-ahead log repaired: truncated %s at byte offset %d; %d bytes and "
                  "every later segment moved aside as corrupt-%s-*", path.name, offset,
                  len(data) - offset, stamp)

    def set_all_aside(self, after_lsn: int) -> None:
        """Repair at opening, for a log that starts after the state a
        snapshot restores (records between are missing, so none of it can be
        replayed): every segment is kept aside as a corrupt-* file, and the
        log starts anew after ``after_lsn``."""
        stamp = time.strftime("%Y%m%dT%H%M%S")
        for _, path in self._segments:
            path.rename(self.directory / f"corrupt-{stamp}-{path.name}.bad")
        log.error("write-ahead log repaired: %d segment(s) moved aside as corrupt-%s-*; "
                  "the log starts again after position %d", len(self._segments), stamp,
                  after_lsn)
        self._segments.clear()
        self._active_bytes = self._file_bytes = 0
        self._acknowledged_end = None
        self._last_lsn = self._written_lsn = self._durable_lsn = after_lsn
        self._rolls = [(0, after_lsn + 1)]
        # The mark named segments now set aside: none until the next fsync.
        self._mark = None
        if self._mark_fd is not None:
            os.ftruncate(self._mark_fd, 0)
        fsync_directory(self.directory)

    # --- positions ------------------------------------------------------------------

    @property
    def first_lsn(self) -> int | None:
        """Position of the oldest record on disk, or None when there is none."""
        for first, path in self._segments:
            if path.stat().st_size > 0:
                return first
        return None

    @property
    def last_lsn(self) -> int:
        """Position of the newest record appended (committed or not)."""
        return self._last_lsn

    @property
    def written_lsn(self) -> int:
        """Newest position handed to the OS (readable from the files)."""
        return self._written_lsn

    @property
    def durable_lsn(self) -> int:
        """Newest position known to be fsynced."""
        return self._durable_lsn

    @property
    def acknowledged_lsn(self) -> int:
        """Newest position a committer was told is safe: fsynced under
        ``always``, handed to the OS otherwise."""
        return self._durable_lsn if self.fsync == "always" else self._written_lsn

    @property
    def shippable_lsn(self) -> int:
        """Newest position durable under the fsync policy: what may leave this
        node (a copy elsewhere of a record a power loss could still take
        back would disagree with this log after a restart).  Under ``no``,
        which never promises more, what was handed to the OS."""
        return self._written_lsn if self.fsync == "no" else self._durable_lsn

    @property
    def failed(self) -> bool:
        return self._failure is not None

    @property
    def failure(self) -> BaseException | None:
        """The I/O error that failed the log, if any."""
        return self._failure

    def segments(self) -> list[tuple[int, Path]]:
        """(first lsn, path) of each segment, oldest first."""
        return list(self._segments)

    # --- reading ---------------------------------------------------------------------

    def iter_records(self, from_lsn: int = 1) -> Iterator[tuple[int, bytes]]:
        """Yield ``(lsn, payload)`` of every written record at or after ``from_lsn``
        (see :meth:`iter_batches`)."""
        for batch in self.iter_batches(from_lsn):
            yield from batch

    def iter_batches(self, from_lsn: int = 1, size: int = 10_000, upto_lsn: int | None = None,
                     *, in_place: bool = False) -> Iterator[Sequence[tuple[int, bytes]]]:
        """Lists of up to ``size`` ``(lsn, payload)``: every written record at or
        after ``from_lsn`` (and at or before ``upto_lsn``), in order.

        ``in_place`` (recovery): segments are mapped, not read, and each
        batch leaves its records in the mapping (see ``frames.scan_in_place``).
        Damage in a segment other than the last raises ``WalCorruptError``
        (or, with ``repair``, truncates there and ends the iteration).
        """
        upto = self._written_lsn if upto_lsn is None else min(upto_lsn, self._written_lsn)
        wanted = 0  # the first position of the next segment to read
        while True:
            # Found by position, in a copy: a snapshot may drop segments meanwhile
            # (remove_segments_before, in another thread), and an index into the
            # live list would then pass over a segment still there.
            segments = list(self._segments)
            position = next((i for i, (first, _) in enumerate(segments) if first >= wanted),
                            len(segments))
            if position == len(segments):
                return
            first, path = segments[position]
            upper = segments[position + 1][0] if position + 1 < len(segments) else None
            wanted = first + 1
            if upper is not None and upper <= from_lsn:
                continue
            try:
                data = _mapped(path) if in_place else path.read_bytes()
            except FileNotFoundError:
                if any(path == kept for _, kept in self._segments):
                    raise
                continue  # dropped meanwhile: its records are in a snapshot
            walk = scan_in_place if in_place else scan
            # The final segment was checked when the log was opened.
            check = path != self._checked[0]
            offset, lsn = 0, first
            if in_place and lsn < from_lsn:
                offset, lsn = _skip_to(data, lsn, from_lsn, check)
            while True:
                found = walk(memoryview(data)[offset:], lsn, check=check, from_lsn=from_lsn,
                             upto_lsn=upto, limit=size)
                if found.records:
                    yield found.records
                    _let_go(data, offset)  # (the batch before it is applied)
                if found.bad is not None:
                    bad = found.bad._replace(offset=offset + found.bad.offset)
                    if found.next_lsn < from_lsn:
                        # Damage only in records the caller has already (a
                        # snapshot covers them): go on from the first it wants.
                        resume = find_frame(data, bad.offset + 1, from_lsn, from_lsn)
                        if resume >= 0:
                            log.warning("write-ahead log %s: record %d at byte offset %d is "
                                        "corrupt (%s) but precedes position %d, which "
                                        "recovery starts from", path.name, found.next_lsn,
                                        bad.offset, bad.reason, from_lsn)
                            offset, lsn = resume, from_lsn
                            continue
                    data = path.read_bytes()  # (not a mapping the repair may cut)
                    self._damaged(path, data, bad, found.next_lsn, final=upper is None)
                    # Repaired: the log now ends in this segment.
                    found = scan(path.read_bytes(), first, collect=False)
                    self._reset_end(found.next_lsn - 1, path)
                    return
                offset += found.end
                lsn = found.next_lsn
                if lsn > upto:
                    return
                if offset >= len(data):
                    break
            if upper is not None and upper != lsn:
                self._broken_chain(path, path.read_bytes(), lsn, upper)
                found = scan(path.read_bytes(), first, collect=False)
                self._reset_end(found.next_lsn - 1, path)
                return

    def _reset_end(self, last_lsn: int, path: Path) -> None:
        self._last_lsn = self._written_lsn = self._durable_lsn = last_lsn
        self._active_bytes = self._file_bytes = path.stat().st_size
        self._acknowledged_end = (path, self._file_bytes)
        self._pending.clear()
        self._rolls = []

    # --- writing -------------------------------------------------------------------------

    def append(self, payload: bytes) -> int:
        """Buffer one record; returns its log position.  Not durable until ``commit``."""
        return self.append_many((payload,))

    def append_many(self, payloads: Iterable[bytes]) -> int:
        """Buffer records in order; returns the log position of the last.
        ``WalFailedError`` once the log failed or began closing (a record
        appended then would never be written: close writes out only what
        came before it, and a write after it would reopen a segment)."""
        if self._failure is not None:
            raise WalFailedError(f"write-ahead log failed earlier: {self._failure}")
        if self._closed:
            raise WalFailedError("write-ahead log is closed")
        lsn, self._active_bytes, appended = frame_into(
            self._pending, payloads, self._last_lsn, self._active_bytes,
            self.segment_bytes - HEADER_BYTES, self._rolls)
        self.stats.appends += lsn - self._last_lsn
        self.stats.bytes += appended
        self._last_lsn = lsn
        return lsn

    async def commit(self, lsn: int) -> None:
        """Return once record ``lsn`` (and all before it) meets the fsync policy."""
        if self.fsync != "always":
            while self._written_lsn < lsn:
                if self._failure is not None:
                    raise WalFailedError(f"write-ahead log failed: {self._failure}")
                if self._rolling is not None or self._rolls:
                    await asyncio.shield(self._rolled())
                    continue
                if self._write_soon is None:
                    loop = asyncio.get_running_loop()
                    self._write_soon = loop.create_future()
                    # After the callbacks already queued: the other commits of
                    # this pass of the loop go out in the same write.
                    loop.call_soon(self._write_shared, self._write_soon)
                await asyncio.shield(self._write_soon)
            return
        while self._durable_lsn < lsn:
            if self._failure is not None:
                raise WalFailedError(f"write-ahead log failed: {self._failure}")
            if self._flush is None:
                self._flush = asyncio.ensure_future(self._flush_and_sync())
            # Shielded: a cancelled committer must not cancel the shared fsync.
            await asyncio.shield(self._flush)

    def commit_now(self, lsn: int) -> bool:
        """Under ``everysec`` and ``no``: hand records up to ``lsn`` to the OS
        now, in this thread, and return True (what :meth:`commit` waits a
        turn of the event loop for, so that the commits of one turn share a
        write: a caller that gathered them already saves that turn).  Under
        ``always`` nothing is done and False returned: await :meth:`commit`.
        ``WalFailedError`` if the write fails."""
        if self.fsync == "always":
            return False
        return self._written_lsn >= lsn or self._write_out()

    async def make_durable(self, lsn: int) -> None:
        """Return once records up to ``lsn`` are written *and* fsynced, whatever
        the policy (a snapshot must never hold more than the log can give
        back); ``WalFailedError`` if they cannot be."""
        await self.commit(lsn)
        if self.fsync != "always":
            await self.sync()
        if self._durable_lsn < lsn:
            raise WalFailedError(f"write-ahead log failed: {self._failure}")

    async def _flush_and_sync(self) -> None:
        try:
            taken = self._take_pending()
            await asyncio.to_thread(self._write_and_sync, *taken)
        finally:
            self._flush = None

    def _take_pending(self) -> tuple[bytearray, list[tuple[int, int]], int]:
        taken = (self._pending, self._rolls, self._last_lsn)
        self._pending = bytearray()
        self._rolls = []
        return taken

    def _rolled(self) -> asyncio.Future:
        """The write under way that starts a segment, or one begun now."""
        if self._rolling is None:
            self._rolling = asyncio.ensure_future(self._roll_out())
            self._rolling.add_done_callback(outcome_seen)
        return self._rolling

    async def _roll_out(self) -> None:
        """Write what is pending when it starts a new segment, in a worker
        thread: the finished segment is fsynced before the next one exists
        (see :meth:`_start_segment`), tens of ms on the event loop at every
        segment (hundreds on a slow disk).  Writes on the loop wait for it
        (:meth:`_write_out`), so records reach the files in order."""
        try:
            while self._rolls and self._failure is None:
                data, rolls, last = self._take_pending()
                await asyncio.to_thread(self._guarded, self._write, data, rolls)
                self._acknowledge(last)
        finally:
            self._rolling = None

    def _write_shared(self, done: asyncio.Future) -> None:
        self._write_soon = None
        try:
            self._write_out()
        except Exception as exc:  # WalFailedError: every committer of the pass gets it
            done.set_exception(exc)
        else:
            done.set_result(None)

    def _write_out(self) -> bool:
        """Hand buffered records to the OS (no fsync), in the caller's
        thread; False, writing nothing, if they start a new segment or such
        a write is under way (they go with it: :meth:`_roll_out`)."""
        if self._failure is not None:
            raise WalFailedError(f"write-ahead log failed: {self._failure}")
        if self._rolls or self._rolling is not None:
            self._rolled()
            return False
        data, last = self._pending, self._last_lsn
        self._pending = bytearray()
        try:  # (no segment starts here: the records go to the newest, opened if need be)
            self._write_all(memoryview(data))
        except OSError as exc:
            raise self._failed_with(exc) from exc
        self._acknowledge(last)
        return True

    def _acknowledge(self, last: int) -> None:
        """Mark records up to ``last``, just written, as handed to the OS,
        unless the log failed meanwhile (the background fsync, in another
        thread): its cut-back may have removed them, so they are refused."""
        with self._fd_lock:  # (against _failed_with: which end it cuts back to)
            if self._failure is None:
                self._written_lsn = last
                self._acknowledged_end = self._file_end()
                return
        # Cut back again: the write may have landed after the first cut-back.
        self._cut_back_to_acknowledged()
        raise WalFailedError(f"write-ahead log failed: {self._failure}")

    def _write_and_sync(self, data: bytearray, rolls: list[tuple[int, int]], last: int) -> None:
        if self._failure is not None:
            raise WalFailedError(f"write-ahead log failed: {self._failure}")
        self._guarded(self._write, data, rolls)
        self._written_lsn = last
        end = self._file_end()
        self._guarded(self._sync)
        self._durable_lsn = last
        self._acknowledged_end = end

    def _file_end(self) -> tuple[Path, int]:
        return self._segments[-1][1], self._file_bytes

    def _guarded(self, operation, *args) -> None:
        try:
            operation(*args)
        except OSError as exc:
            raise self._failed_with(exc) from exc

    def _failed_with(self, exc: OSError) -> WalFailedError:
        """Fail the log for good after an I/O error (see ``_cut_back_to_acknowledged``)."""
        with self._fd_lock:  # (against _acknowledge: no record acknowledged after this)
            self._failure = exc
        log.critical("write-ahead log I/O failed, not retrying: %s", exc)
        self._cut_back_to_acknowledged()
        return WalFailedError(f"write-ahead log I/O failed: {exc}")

    def _cut_back_to_acknowledged(self) -> None:
        """Drop from the files every record after the last acknowledged one
        (their writers were refused).  Best effort, once failed."""
        if self._acknowledged_end is None:
            return
        path, size = self._acknowledged_end
        try:
            with self._fd_lock:
                later = [p for first, p in self._segments if first > int(path.stem)]
            for extra in later:
                extra.unlink(missing_ok=True)
            os.truncate(path, size)
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            fsync_directory(self.directory)
        except OSError as exc:
            log.critical("cannot cut the write-ahead log back to its last acknowledged record "
                         "(%s at byte %d): %s; records refused to their writers may come back "
                         "at restart", path.name, size, exc)
    def _write(self, data: bytearray, rolls: list[tuple[int, int]]) -> None:
        view = memoryview(data)
        start = 0
        for offset, first_lsn in [*rolls, (len(data), 0)]:
            if offset > start:
                self._write_all(view[start:offset])
            if first_lsn:
                self._start_segment(first_lsn)
            start = offset

    def _write_all(self, chunk: memoryview) -> None:
        if self._fd is None:
            self._fd = os.open(self._segments[-1][1], os.O_WRONLY | os.O_APPEND)
        while chunk:
            written = os.write(self._fd, chunk)
            self._file_bytes += written
            chunk = chunk[written:]

    def _start_segment(self, first_lsn: int) -> None:
        # The finished segment is made durable before the next one exists,
        # so a power loss can only ever tear the newest segment.
        if self._fd is not None:
            os.fsync(self._fd)
        path = self.directory / segment_name(first_lsn)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_EXCL, 0o600)
        if self._acknowledged_end is None:
            self._acknowledged_end = (path, 0)
        with self._fd_lock:  # the syncer reads the segment and its size together
            if self._fd is not None:
                self._retired.append(self._fd)
            self._fd = fd
            self._file_bytes = 0
            self._dir_dirty = True
            self._segments.append((first_lsn, path))

    def _sync(self) -> None:
        """fsync every file written since the last sync (blocking)."""
        with self._fd_lock:
            retired, self._retired = self._retired, []
            current = self._fd
            dir_dirty, self._dir_dirty = self._dir_dirty, False
            # Written before the fsync below starts, so durable once it returns.
            mark = (self._segments[-1][0], self._file_bytes) if self._segments else None
        started = time.monotonic()
        for fd in retired:
            os.fsync(fd)
            os.close(fd)
        if current is not None:
            os.fsync(current)
        if dir_dirty:
            fsync_directory(self.directory)
        if self._mark_fd is not None and mark is not None and current is not None:
            os.pwrite(self._mark_fd, pack_sync_mark(*mark), 0)
            os.fsync(self._mark_fd)
        elapsed = time.monotonic() - started
        self.stats.fsyncs += 1
        self.stats.fsync_seconds += elapsed
        self.stats.last_fsync_seconds = elapsed

    # --- background fsync, close ----------------------------------------------------------

    async def start(self) -> None:
        """Start the once-a-second fsync (policy ``everysec``)."""
        if self.fsync == "everysec" and self._syncer is None:
            self._syncer = asyncio.create_task(self._sync_every_second(), name="rankd-wal-fsync")

    async def _sync_every_second(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            await self.sync()

    async def sync(self) -> None:
        """Write out and fsync everything appended so far."""
        if self._failure is not None:
            return
        if self.fsync == "always":
            # Through the group commit: its flush writes from a worker thread,
            # and a write from this one meanwhile would interleave with it.
            with contextlib.suppress(WalFailedError):
                await self.commit(self._last_lsn)
            return
        if self._written_lsn < self._last_lsn:
            with contextlib.suppress(WalFailedError):
                if not self._write_out():  # (a segment starts: once it is written)
                    await asyncio.shield(self._rolled())
                    self._write_out()
        target = self._written_lsn
        if self._durable_lsn < target:
            with contextlib.suppress(WalFailedError):
                await asyncio.to_thread(self._guarded, self._sync)
                self._durable_lsn = max(self._durable_lsn, target)

    async def close(self) -> None:
        """Write out and fsync everything (unless failed), then close the files."""
        if self._closed:
            return
        self._closed = True
        await stop_task(self._syncer)
        for pending in (self._flush, self._write_soon, self._rolling):
            if pending is not None:
                with contextlib.suppress(WalFailedError):
                    await asyncio.shield(pending)
        await self.sync()
        with self._fd_lock:
            fds = [*self._retired, *([self._fd] if self._fd is not None else [])]
            self._retired, self._fd = [], None
        for fd in fds:
            os.close(fd)
        if self._mark_fd is not None:
            os.close(self._mark_fd)
            self._mark_fd = None

    # --- compaction ------------------------------------------------------------------------

    def remove_segments_before(self, lsn: int) -> int:
        """Delete segments whose records all precede ``lsn``; returns how many.

        The active segment is never deleted.
        """
        removed = 0
        while len(self._segments) > 1 and self._segments[1][0] <= lsn:
            if self._segments[1][0] > self._written_lsn + 1:
                break  # the next segment exists only in the buffer so far
            _, path = self._segments.pop(0)
            path.unlink(missing_ok=True)
            removed += 1
        if removed:
            fsync_directory(self.directory)
        return removed


class WalReader:
    """Follows a live log from a position: what the Postgres shipper tails.

    Reads only records already handed to the OS (``written_lsn``), or with
    ``durable_only`` only those the fsync policy made durable
    (``shippable_lsn``), from the files, and moves on to the next segment
    when one starts.  The engine never deletes a segment the reader has not
    passed (it keeps unshipped segments), so a missing record is corruption
    (:class:`WalCorruptError`), never a reason to wait.
    """

    def __init__(self, wal: WriteAheadLog, from_lsn: int = 1,
                 chunk_bytes: int = 4 * 1024 * 1024, *, durable_only: bool = False) -> None:
        self._wal = wal
        self._chunk_bytes = chunk_bytes
        self._upto = (lambda: wal.shippable_lsn) if durable_only else (lambda: wal.written_lsn)
        self.seek(from_lsn)

    @property
    def next_lsn(self) -> int:
        return self._next

    def seek(self, lsn: int) -> None:
        """Continue from record ``lsn``."""
        self._next = lsn
        self._segment: tuple[int, Path] | None = None
        self._offset = 0
        self._file_lsn = 0  # lsn of the record at self._offset

    def _locate(self) -> bool:
        """Find the segment holding ``self._next``; False if none does yet."""
        candidates = [s for s in self._wal.segments() if s[0] <= self._next]
        if not candidates:
            first = self._wal.first_lsn
            if first is not None and first > self._next:
                raise WalCorruptError(self._wal.directory, 0,
                                      f"record {self._next} was removed before it was read")
            return False
        self._segment = candidates[-1]
        self._offset = 0
        self._file_lsn = self._segment[0]
        return True

    def read(self, limit: int) -> list[tuple[int, bytes]]:
        """Up to ``limit`` records from the current position (may be fewer, or none)."""
        out: list[tuple[int, bytes]] = []
        while len(out) < limit and self._next <= self._upto():
            if self._segment is None and not self._locate():
                break
            before = len(out)
            self._read_chunk(out, limit)
            if len(out) == before and not self._advance_segment():
                break
        return out

    def _read_chunk(self, out: list[tuple[int, bytes]], limit: int) -> None:
        _, path = self._segment
        try:
            with open(path, "rb") as handle:
                handle.seek(self._offset)
                data = handle.read(self._chunk_bytes)
        except FileNotFoundError:
            # The engine keeps every segment a reader has not passed.
            raise WalCorruptError(path, self._offset,
                                  f"the segment was deleted before record {self._next} "
                                  "was read") from None
        found = scan(data, self._file_lsn, from_lsn=self._next, upto_lsn=self._upto(),
                     limit=limit - len(out))
        out.extend(found.records)
        if found.records:
            self._next = found.records[-1][0] + 1
        # A record cut by the chunk boundary (torn) is read next time.
        if found.bad is not None and not found.bad.torn:
            raise WalCorruptError(path, self._offset + found.bad.offset, found.bad.reason)
        self._offset += found.end
        self._file_lsn = found.next_lsn

    def _advance_segment(self) -> bool:
        """Move to the next segment if the current one is finished.

        Called when the current segment gave nothing although record
        ``next_lsn`` was written: if a later segment starts elsewhere than
        at that record, records are missing and the reader says so rather
        than wait for them forever.
        """
        later = [s for s in self._wal.segments() if s[0] > self._segment[0]]
        if later and later[0][0] == self._next:
            self._segment = later[0]
            self._offset = 0
            self._file_lsn = later[0][0]
            return True
        if later:
            raise WalCorruptError(self._segment[1], self._offset,
                                  f"record {self._next} is missing: the next segment starts "
                                  f"at position {later[0][0]}")
        return False
