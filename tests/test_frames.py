"""The WAL frame scanner: the native one against the pure-Python reference,
on random logs cut short, corrupted, mis-numbered or followed by garbage,
with every combination of the scan's arguments."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import native
from rankd.engine import frames
from rankd.engine.frames import HEADER_BYTES, MAX_LSN, frame, frame_v1, scan_python


def native_scan():
    return native("rankd.engine._frames", "scan")


payloads = st.lists(st.binary(max_size=40), max_size=12)
damage = st.one_of(
    st.none(),
    st.tuples(st.just("cut"), st.integers(0, 10_000)),
    st.tuples(st.just("flip"), st.integers(0, 10_000), st.integers(1, 255)),
    st.tuples(st.just("garbage"), st.binary(min_size=1, max_size=30)),
    st.tuples(st.just("zeros"), st.integers(1, 40)),
    st.tuples(st.just("renumber"), st.integers(0, 11)),
)


def build(first: int, records: list[bytes], harm) -> bytes:
    lsns = [first + i for i in range(len(records))]
    if harm is not None and harm[0] == "renumber" and lsns:
        lsns[harm[1] % len(lsns)] += 1
    # Both frame formats, mixed as an upgraded log mixes them (CRC-32 where
    # the payload's length is a multiple of 3: arbitrary, and varied).
    data = bytearray(b"".join((frame_v1 if len(p) % 3 == 0 else frame)(lsn, p)
                              for lsn, p in zip(lsns, records, strict=True)))
    if harm is None or harm[0] == "renumber":
        return bytes(data)
    kind = harm[0]
    if kind == "cut":
        return bytes(data[: harm[1] % (len(data) + 1)])
    if kind == "flip" and data:
        data[harm[1] % len(data)] ^= harm[2]
    elif kind == "garbage":
        data += harm[1]
    elif kind == "zeros":
        data += bytes(harm[1])
    return bytes(data)


@settings(max_examples=400)
@given(
    first=st.integers(1, 2**40),
    records=payloads,
    harm=damage,
    check=st.booleans(),
    collect=st.booleans(),
    skip=st.integers(0, 14),
    upto=st.one_of(st.none(), st.integers(0, 14)),
    limit=st.one_of(st.none(), st.integers(0, 14)),
)
def test_native_scan_matches_the_reference(first, records, harm, check, collect, skip, upto,
                                           limit):
    native = native_scan()
    data = build(first, records, harm)
    args = (first, check, first + skip, MAX_LSN if upto is None else first + upto - 1,
            MAX_LSN if limit is None else limit, collect)
    assert native(data, *args) == scan_python(data, *args)
    assert native(memoryview(data), *args) == scan_python(bytearray(data), *args)


@settings(max_examples=200)
@given(first=st.integers(1, 2**40), records=payloads)
def test_scan_returns_every_record_of_an_intact_log(first, records):
    data = b"".join(frame(first + i, p) for i, p in enumerate(records))
    found = frames.scan(data, first)
    assert found.records == [(first + i, p) for i, p in enumerate(records)]
    assert (found.end, found.next_lsn, found.bad) == (len(data), first + len(records), None)


def test_scan_reports_where_and_why_it_stopped():
    data = frame(5, b"abc") + frame(6, b"defg")
    second = HEADER_BYTES + 3
    torn = frames.scan(data[:-1], 5)
    assert torn.records == [(5, b"abc")]
    assert torn.end == second and torn.next_lsn == 6
    assert torn.bad == (second, "record of 4 bytes runs past the end", True)
    flipped = bytearray(data)
    flipped[second + HEADER_BYTES] ^= 1
    assert frames.scan(bytes(flipped), 5).bad == (second, "checksum mismatch", True)
    assert frames.scan(bytes(flipped), 5, check=False).bad is None
    assert frames.scan(data, 4).bad == (0, "log position 5 where 4 was expected", False)
    assert frames.scan(data + b"\0" * 3, 5).bad == (len(data), "incomplete record header", True)
    bounded = frames.scan(data, 5, upto_lsn=5)
    assert (bounded.records, bounded.end, bounded.bad) == ([(5, b"abc")], second, None)
    later = frames.scan(data, 5, from_lsn=6)
    assert later.records == [(6, b"defg")] and later.end == len(data)
    assert frames.scan(data, 5, limit=1).records == [(5, b"abc")]
    assert frames.scan(data, 5, collect=False) == (
        [], len(data), 7, None)


def native_frame_into():
    return native("rankd.engine._frames", "frame_into")


@given(st.binary(max_size=20), st.lists(st.binary(max_size=60), max_size=12),
       st.integers(1, 2**40), st.integers(0, 200), st.integers(16, 200))
def test_native_framing_writes_what_the_reference_writes(prefix, records, last, active, limit):
    """Frames, segment rolls and counts agree; the frames scan back."""
    results = []
    for frame_into in (native_frame_into(), frames.frame_into_python):
        buffer, rolls = bytearray(prefix), [(0, 1)]
        summary = frame_into(buffer, iter(records), last, active, limit, rolls)
        results.append((bytes(buffer), rolls, summary))
    assert results[0] == results[1]
    data, _, (end_lsn, _, appended) = results[0]
    assert end_lsn == last + len(records) and appended == len(data) - len(prefix)
    scanned = scan_python(data[len(prefix):], last + 1)
    assert scanned[0] == [(last + 1 + i, p) for i, p in enumerate(records)]
    assert scanned[3] is None


def test_native_framing_refuses_what_is_not_bytes_and_changes_nothing():
    buffer = bytearray(b"x")
    with pytest.raises(TypeError):
        native_frame_into()(buffer, [b"ok", "text"], 0, 0, 1000, [])
    assert buffer == b"x"
