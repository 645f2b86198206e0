"""How write-ahead log records are framed on disk, and the frame scanner.

A frame is a 16-byte header and the payload::

    crc (u32) | length word (u32) | lsn (u64) | payload (length bytes)

little-endian, where the CRC covers the 12 header bytes after it and the
payload, and ``lsn`` is the record's log position (consecutive within a
segment, starting at the position in the segment's file name).

The frame format is versioned by the top bit of the length word
(:data:`CRC32C_FLAG`; lengths never exceed :data:`MAX_RECORD_BYTES`, so
the bit is free): *format 2*, every frame written now, sets it and carries
CRC-32C (Castagnoli: the SSE4.2 instruction computes it, nearly free on the
write path); *format 1*, frames written before, has it clear and carries
zlib's CRC-32.  Each frame says which, so old segments (and a segment that
old frames start and new ones continue, as after an upgrade) read as
before; a version that predates format 2 sees an impossible length and
stops, rather than misreading a newer log.  The flag is inside what the
CRC covers, so a flipped flag bit is a checksum mismatch like any other.

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
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from rankd._native import native_or

HEADER = struct.Struct("<IIQ")
HEADER_BYTES = HEADER.size
CHECKED = struct.Struct("<IQ")  # the (length word, lsn) part the CRC covers
#: A record larger than this is a corrupt length, not a record.
MAX_RECORD_BYTES = 256 * 1024 * 1024
#: The length word's bit of a format-2 (CRC-32C) frame.
CRC32C_FLAG = 0x8000_0000


def _crc32c_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
        table.append(crc)
    return tuple(table)


_CRC32C_TABLE = _crc32c_table()


def crc32c_python(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
    """CRC-32C (Castagnoli) of ``data`` continuing from ``crc``, a byte at a
    time (the reference; the native one is ``rankd.engine._frames.crc32c``)."""
    table = _CRC32C_TABLE
    crc ^= 0xFFFF_FFFF
    for byte in bytes(data):
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFF_FFFF


def frame_checksum(word: int, lsn: int, payload: bytes | bytearray | memoryview) -> int:
    """The CRC a frame of length word ``word`` (flag included), position
    ``lsn`` and ``payload`` must carry: CRC-32C when flagged, else CRC-32."""
    checked = CHECKED.pack(word, lsn)
    if word & CRC32C_FLAG:
        return crc32c(payload, crc32c(checked))
    return zlib.crc32(payload, zlib.crc32(checked))
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

    #: ``(lsn, payload)`` of each collected record (a ``Frames`` batch
    #: from :func:`scan_in_place`).
    records: Sequence[tuple[int, bytes]]
    #: Offset just past the last good frame scanned.
    end: int
    #: Log position of the frame at ``end``.
    next_lsn: int
    bad: BadFrame | None


def frame(lsn: int, payload: bytes) -> bytes:
    """One record as stored on disk (format 2)."""
    word = len(payload) | CRC32C_FLAG
    return HEADER.pack(frame_checksum(word, lsn, payload), word, lsn) + payload


def frame_v1(lsn: int, payload: bytes) -> bytes:
    """One record as format 1 stored it (CRC-32): what older logs hold."""
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
    while offset < size and expected <= upto_lsn and len(records) < limit:
        if size - offset < HEADER_BYTES:
            bad = (offset, "incomplete record header", True)
            break
        crc, word, lsn = unpack(view, offset)
        length = word & ~CRC32C_FLAG
        end = offset + HEADER_BYTES + length
        if length > MAX_RECORD_BYTES:
            bad = (offset, f"impossible record length {length}", False)
            break
        if end > size:
            bad = (offset, f"record of {length} bytes runs past the end", True)
            break
        if check and frame_checksum(word, lsn, view[offset + HEADER_BYTES:end]) != crc:
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


def find_frame_python(data: bytes | bytearray | memoryview, start: int, min_lsn: int,
                      max_lsn: int) -> int:
    """Offset of the first whole frame at or after ``start`` whose checksum
    holds and whose position lies in ``[min_lsn, max_lsn]``, or -1.  Every
    byte offset is tried: after a damaged frame nothing says where the
    next one begins."""
    view = memoryview(data)
    size = len(view)
    unpack = HEADER.unpack_from
    for offset in range(start, size - HEADER_BYTES + 1):
        crc, word, lsn = unpack(view, offset)
        length = word & ~CRC32C_FLAG
        if (min_lsn <= lsn <= max_lsn and length <= MAX_RECORD_BYTES
                and offset + HEADER_BYTES + length <= size
                and frame_checksum(word, lsn,
                                   view[offset + HEADER_BYTES:offset + HEADER_BYTES + length])
                == crc):
            return offset
    return -1


crc32c, _ = native_or("rankd.engine._frames", "crc32c", crc32c_python)
_scan, IMPLEMENTATION = native_or("rankd.engine._frames", "scan", scan_python)
frame_into, _ = native_or("rankd.engine._frames", "frame_into", frame_into_python)
find_frame, _ = native_or("rankd.engine._frames", "find_frame", find_frame_python)


def scan_frames_python(data: bytes | bytearray | memoryview, first_lsn: int, check: bool,
                       from_lsn: int, upto_lsn: int, limit: int) -> tuple:
    """Pure-Python ``scan_frames``: the records as the list :func:`scan` makes."""
    return scan_python(data, first_lsn, check, from_lsn, upto_lsn, limit, True)


_scan_frames, _ = native_or("rankd.engine._frames", "scan_frames", scan_frames_python)


def scan_in_place(data: bytes | bytearray | memoryview, first_lsn: int, *,
                  check: bool = True, from_lsn: int = 0, upto_lsn: int = MAX_LSN,
                  limit: int = MAX_LSN) -> Scan:
    """:func:`scan` for recovery: the records collected are left in ``data``
    (natively a ``Frames`` batch: a sequence of ``(lsn, payload)`` made on
    access, which the native replay reads in place), so a long tail makes
    no object per record.  ``data`` stays referenced while the batch lives."""
    records, end, next_lsn, bad = _scan_frames(data, first_lsn, check, from_lsn, upto_lsn,
                                               limit)
    return Scan(records, end, next_lsn, None if bad is None else BadFrame(*bad))


def payload_bytes(records: Sequence[tuple[int, bytes]]) -> int:
    """The payload bytes of a batch of records (a list, or a ``Frames`` batch)."""
    total = getattr(records, "payload_bytes", None)
    if total is not None:
        return total
    return sum(len(payload) for _, payload in records)


def frame_many(first_lsn: int, payloads: list[bytes]) -> bytes:
    """The frames of ``payloads`` at positions ``first_lsn, first_lsn + 1,
    ...``, back to back (one native call, as the log's writes are)."""
    framed = bytearray()
    frame_into(framed, payloads, first_lsn - 1, 0, MAX_LSN, [])
    return bytes(framed)

#: Power loss drops whole pages the kernel had not written back; a file
#: extended meanwhile reads zeroes there.
PAGE_BYTES = 4096
#: A shorter run of zeroes ending a record may be its own content.
MIN_ZERO_TAIL = HEADER_BYTES


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


def is_torn_tail(data: bytes | bytearray | memoryview, bad: BadFrame, bad_lsn: int) -> bool:
    """Whether the damage :func:`scan` found at ``bad`` in a log file's
    ``data`` (whose frame there should hold ``bad_lsn``) can only be a last
    write cut short by a crash, rather than corruption.

    It can when no whole frame of a position at or after ``bad_lsn``
    follows it (scanned for byte by byte: a flipped length bit sends the
    scan past frames that are still there) and the bad frame is cut short
    by the end of the data, or ends in zeroes that pages never written back
    would leave (from a page boundary, or at least :data:`MIN_ZERO_TAIL`
    bytes of them).  A whole record with a bad checksum and anything else
    is corruption.
    """
    size = len(data)
    latest = bad_lsn + (size - bad.offset) // HEADER_BYTES
    if find_frame(data, bad.offset + 1, bad_lsn, latest) >= 0:
        return False
    if bad.torn and bad.reason != "checksum mismatch":
        # The frame (or its header) runs past the end: cut short, unless a
        # flipped bit of its length is what sends it there.
        return not _length_bit_flipped(data, bad.offset)
    zeros_from = len(bytes(memoryview(data)[bad.offset:]).rstrip(b"\0")) + bad.offset
    if zeros_from == size:
        return False
    return (zeros_from == bad.offset or zeros_from % PAGE_BYTES == 0
            or size - zeros_from >= MIN_ZERO_TAIL)


def _length_bit_flipped(data: bytes | bytearray | memoryview, offset: int) -> bool:
    """Whether the frame at ``offset`` would be whole and checksummed with
    one bit of its length field changed."""
    view = memoryview(data)
    if len(view) - offset < HEADER_BYTES:
        return False
    crc, word, lsn = HEADER.unpack_from(view, offset)
    for bit in range(32):
        candidate = word ^ (1 << bit)
        end = offset + HEADER_BYTES + (candidate & ~CRC32C_FLAG)
        if end <= len(view) and frame_checksum(candidate, lsn,
                                               view[offset + HEADER_BYTES:end]) == crc:
            return True
    return False
