"""How write-ahead log records are framed on disk, and the frame scanner.

A frame is a 16-byte header and the payload::

    crc32 (u32) | length (u32) | lsn (u64) | payload (length bytes)

little-endian, where the CRC-32 covers the 12 header bytes after it and the
payload, and ``lsn`` is the record's log position (consecutive within a
segment, starting at the position in the segment's file name).

:func:`frame_into` frames records into the log's write buffer, and
:func:`scan` walks the frames of a buffer and stops at the first one that
is bad.  They are the hot loops of every write and of recovery, so they
have a native implementation in ``rankd.engine._frames``, chosen at import
like the rank index (``RANKD_PURE_PYTHON=1`` forces the pure-Python ones
below; both give identical results).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable
from typing import NamedTuple

from rankd._native import native_or

HEADER = struct.Struct("<IIQ")
HEADER_BYTES = HEADER.size
CHECKED = struct.Struct("<IQ")  # the (length, lsn) part the CRC covers
#: A record larger than this is a corrupt length, not a record.
MAX_RECORD_BYTES = 256 * 1024 * 1024
#: The largest log position (signed 64-bit).
MAX_LSN = 2**63 - 1


class BadFrame(NamedTuple):
    """Where and why a scan stopped early."""

    offset: int
    reason: str
    #: True when the frame runs past the end of the data (cut short).
    torn: bool


class Scan(NamedTuple):
    """What :func:`scan` found."""

    #: ``(lsn, payload)`` of each collected record.
    records: list[tuple[int, bytes]]
    #: Offset just past the last good frame scanned.
    end: int
    #: Log position of the frame at ``end``.
    next_lsn: int
    bad: BadFrame | None


def frame(lsn: int, payload: bytes) -> bytes:
    """One record as stored on disk."""
    checked = CHECKED.pack(len(payload), lsn)
    return HEADER.pack(zlib.crc32(payload, zlib.crc32(checked)), len(payload), lsn) + payload


def frame_into_python(buffer: bytearray, payloads: Iterable[bytes], last_lsn: int,
                      active: int, limit: int, rolls: list[tuple[int, int]]
                      ) -> tuple[int, int, int]:
    """Append the frames of ``payloads``, at positions ``last_lsn + 1, ...``,
    to ``buffer``.  ``active`` bytes are in the segment being written; a
    frame that would take it past ``limit`` bytes starts a new segment,
    noted in ``rolls`` as ``(offset in buffer, lsn)``.  Returns ``(last
    lsn, active bytes, bytes appended)``."""
    lsn = last_lsn
    appended = 0
    for payload in payloads:
        lsn += 1
        if active and active + len(payload) > limit:
            rolls.append((len(buffer), lsn))
            active = 0
        framed = frame(lsn, payload)
        buffer += framed
        active += len(framed)
        appended += len(framed)
    return lsn, active, appended


def scan_python(data: bytes | bytearray | memoryview, first_lsn: int, check: bool = True,
                from_lsn: int = 0, upto_lsn: int = MAX_LSN, limit: int = MAX_LSN,
                collect: bool = True) -> tuple:
    """Pure-Python :func:`scan` (same arguments and result, as a plain tuple)."""
    records: list[tuple[int, bytes]] = []
    view = memoryview(data)
    size = len(view)
    offset = 0
    expected = first_lsn
    bad = None
    unpack = HEADER.unpack_from
    crc32 = zlib.crc32
    while offset < size and expected <= upto_lsn and len(records) < limit:
        if size - offset < HEADER_BYTES:
            bad = (offset, "incomplete record header", True)
            break
        crc, length, lsn = unpack(view, offset)
        end = offset + HEADER_BYTES + length
        if length > MAX_RECORD_BYTES:
            bad = (offset, f"impossible record length {length}", False)
            break
        if end > size:
            bad = (offset, f"record of {length} bytes runs past the end", True)
            break
        if check and crc32(view[offset + 4:end]) != crc:
            bad = (offset, "checksum mismatch", end == size)
            break
        if lsn != expected:
            bad = (offset, f"log position {lsn} where {expected} was expected", False)
            break
        if collect and lsn >= from_lsn:
            records.append((lsn, bytes(view[offset + HEADER_BYTES:end])))
        expected += 1
        offset = end
    return records, offset, expected, bad


_scan, IMPLEMENTATION = native_or("rankd.engine._frames", "scan", scan_python)
frame_into, _ = native_or("rankd.engine._frames", "frame_into", frame_into_python)


def scan(data: bytes | bytearray | memoryview, first_lsn: int, *, check: bool = True,
         from_lsn: int = 0, upto_lsn: int = MAX_LSN, limit: int = MAX_LSN,
         collect: bool = True) -> Scan:
    """Walk the frames of ``data``, whose first frame holds ``first_lsn``.

    Stops at the end of the data, before the frame of position
    ``upto_lsn + 1``, once ``limit`` records are collected, or at the first
    bad frame (``bad`` says where and why; nothing after it is read).
    Frames of positions ``>= from_lsn`` are collected when ``collect``.
    ``check=False`` skips checksums (for bytes validated already).
    """
    records, end, next_lsn, bad = _scan(data, first_lsn, check, from_lsn, upto_lsn, limit,
                                        collect)
    return Scan(records, end, next_lsn, None if bad is None else BadFrame(*bad))
