"""The write-ahead log's frame reader: ``scan`` (native ``_frames.pyx`` and
pure Python), ``find_frame`` and ``is_torn_tail`` in
``rankd/engine/frames.py``, as start-up recovery and the log reader use
them on what a crash or a bad disk left.

An input's first byte picks the mode, its second the first log position:

* raw (even first byte): the rest is scanned as a segment's bytes (either
  frame format, or both).  Both scanners agree; the records they return,
  framed again in their format, are exactly the bytes up to where the scan
  stopped; a bad frame is past every good one;
  and judging whether the damage is a torn tail returns, within the hang
  limit.
* structured (odd first byte): the rest is cut into records (on 0xFF),
  framed, then damaged by the input's last byte (cut short or one byte
  flipped); the scan returns exactly the records before the damage.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fuzz.targets import split

INSTRUMENT = ["rankd.engine.frames"]
MAX_LEN = 16384

frames: Any = None


def load() -> Callable[[bytes], None]:
    global frames
    from rankd.engine import frames as module

    frames = module
    return test_one


def test_one(data: bytes) -> None:
    mode, first, stream = split(data)
    first += 1  # log positions start at 1
    if mode & 1:
        structured(stream, first)
    else:
        raw(stream, first)


def scanned(data: bytes, first: int) -> tuple[list[tuple[int, bytes]], int, int, Any]:
    native = tuple(frames.scan(data, first))
    python = frames.scan_python(data, first)
    python = (*python[:3], None if python[3] is None else frames.BadFrame(*python[3]))
    assert native == python, f"native {native!r:.300} / Python {python!r:.300}"
    return native  # type: ignore[return-value]


def raw(stream: bytes, first: int) -> None:
    records, end, next_lsn, bad = scanned(stream, first)
    assert 0 <= end <= len(stream)
    assert next_lsn == first + len(records)
    assert [lsn for lsn, _ in records] == list(range(first, next_lsn))
    # Framed again in the format each frame carries (CRC-32C or, format 1, CRC-32).
    offset = 0
    for lsn, payload in records:
        word = frames.HEADER.unpack_from(stream, offset)[1]
        make = frames.frame if word & frames.CRC32C_FLAG else frames.frame_v1
        size = frames.HEADER_BYTES + len(payload)
        assert make(lsn, payload) == stream[offset:offset + size]
        offset += size
    assert offset == end
    if bad is None:
        assert end == len(stream)
        return
    assert bad.offset == end
    frames.is_torn_tail(stream, bad, next_lsn)  # must return (recovery's judgement)


def structured(stream: bytes, first: int) -> None:
    if not stream:
        return
    damage, stream = stream[-1], stream[:-1]
    payloads = stream.split(b"\xff")
    log = frames.frame_many(first, payloads)
    assert scanned(log, first)[0] == list(enumerate(payloads, first))
    at = damage * len(log) // 256
    # Odd: cut short there; even: one byte flipped there.
    broken = log[:at] if damage & 1 else log[:at] + bytes([log[at] ^ 0x5A]) + log[at + 1:]
    records, end, _, bad = scanned(broken, first)
    starts, offset = [], 0
    for payload in payloads:
        starts.append(offset)
        offset += frames.HEADER_BYTES + len(payload)
    # The frames that end at or before the damage are all read, no other.
    intact = sum(1 for start, payload in zip(starts, payloads, strict=True)
                 if start + frames.HEADER_BYTES + len(payload) <= at)
    assert records == list(enumerate(payloads, first))[:intact], (damage, at, records)
    if damage & 1 and (intact == len(payloads) or at == starts[intact]):
        assert bad is None, (damage, at, bad)  # cut between two frames: nothing is wrong
    else:
        assert bad is not None and bad.offset == starts[intact] == end, (damage, at, bad)
