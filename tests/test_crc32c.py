"""CRC-32C in the WAL (frame format 2): the checksum's known vectors, its
hardware, portable and pure-Python implementations agreeing, damage still
found, and logs of format 1 (CRC-32, as every version before wrote them)
still read, continued and recovered."""

from __future__ import annotations

import shutil
import struct
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import native
from engine_helpers import FakeClock, engine_config, run, sub
from rankd.engine import frames
from rankd.engine.engine import Engine
from rankd.engine.frames import (
    CRC32C_FLAG,
    HEADER,
    HEADER_BYTES,
    crc32c_python,
    frame,
    frame_v1,
    scan_python,
)
from rankd.engine.wal import WalCorruptError, WriteAheadLog, inspect_log, segment_name

#: A segment written by rankd before format 2 (da1102d's engine: a board
#: ``arena``, 40 submissions ``delta=i`` to ``p{i % 7}`` with event ids,
#: a label on every fifth).
FORMAT1_SEGMENT = Path(__file__).parent / "data" / "wal-format1.log"

#: RFC 3720 (iSCSI), appendix B.4, and the customary check value.
VECTORS = [
    (b"123456789", 0xE3069283),
    (bytes(32), 0x8A9136AA),
    (b"\xff" * 32, 0x62A8AB43),
    (bytes(range(32)), 0x46DD794E),
    (bytes(range(31, -1, -1)), 0x113FDB5C),
    (b"", 0),
]


def implementations() -> list:
    """Every CRC-32C there is here: the one the WAL uses, the pure-Python
    reference, and (native builds) the table walk and the instruction."""
    found = [frames.crc32c, crc32c_python]
    try:
        from rankd.engine import _frames
    except ImportError:
        return found
    found.append(_frames.crc32c_portable)
    if _frames.has_hardware_crc32c():
        found.append(_frames.crc32c_hardware)
    return found


@pytest.mark.parametrize("data,expected", VECTORS)
def test_crc32c_known_vectors(data, expected):
    for crc32c in implementations():
        assert crc32c(data) == expected, crc32c


def test_the_cpu_instruction_is_used_where_the_cpu_has_it():
    has_hardware = native("rankd.engine._frames", "has_hardware_crc32c")
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    if " sse4_2" not in flags:
        pytest.skip("no SSE4.2 here")
    assert has_hardware()


@settings(max_examples=300)
@given(data=st.binary(max_size=300), cut=st.integers(0, 300), start=st.integers(0, 2**32 - 1))
def test_implementations_agree_on_random_data_and_continue_alike(data, cut, start):
    cut = min(cut, len(data))
    results = set()
    for crc32c in implementations():
        whole = crc32c(data, start)
        assert crc32c(data[cut:], crc32c(data[:cut], start)) == whole
        results.add(whole)
    assert len(results) == 1


@settings(max_examples=50)
@given(data=st.binary(min_size=1000, max_size=5000))
def test_hardware_and_table_agree_on_longer_data(data):
    portable = native("rankd.engine._frames", "crc32c_portable")
    hardware = native("rankd.engine._frames", "crc32c_hardware")
    if hardware(b"") is None:
        pytest.skip("no SSE4.2 here")
    for offset in range(8):  # every alignment of the 8-byte steps
        assert hardware(data[offset:]) == portable(data[offset:])


def test_frames_are_written_in_format_2():
    data = frame(7, b"payload")
    crc, word, lsn = HEADER.unpack_from(data)
    assert word == len(b"payload") | CRC32C_FLAG and lsn == 7
    assert crc == crc32c_python(data[4:])
    assert frames.frame_many(7, [b"payload"]) == data


def test_a_log_mixing_both_formats_scans_whole_in_both_scanners():
    payloads = [b"a" * n for n in range(12)]
    data = b"".join((frame if i % 3 else frame_v1)(i + 1, p) for i, p in enumerate(payloads))
    for scanner in (frames.scan, scan_python):
        found = scanner(data, 1)
        records = found.records if hasattr(found, "records") else found[0]
        assert records == [(i + 1, p) for i, p in enumerate(payloads)]


@pytest.mark.parametrize("make", [frame, frame_v1])
@pytest.mark.parametrize("where", [0, 3, 4, 8, 15, HEADER_BYTES, HEADER_BYTES + 5])
def test_a_flipped_bit_is_a_checksum_mismatch_in_either_format(make, where):
    data = bytearray(make(1, b"hello world") + make(2, b"second"))
    data[where] ^= 0x01
    for scanner in (frames.scan, scan_python):
        records, _, next_lsn, bad = tuple(scanner(bytes(data), 1))
        assert records == [] and next_lsn == 1 and bad is not None
        assert bad[1] == "checksum mismatch"


def test_the_format_flag_is_covered_by_the_checksum():
    """A format-2 frame with the flag cleared is not read as format 1."""
    data = bytearray(frame(1, b"x" * 20))
    data[7] ^= 0x80  # the top bit of the length word
    assert frames.scan(bytes(data), 1).bad.reason == "checksum mismatch"
    assert scan_python(bytes(data), 1)[3][1] == "checksum mismatch"


def test_a_corrupt_format_2_record_mid_log_is_still_corruption(tmp_path):
    segment = tmp_path / segment_name(1)
    data = bytearray(b"".join(frame(i, b"record %d" % i) for i in range(1, 6)))
    data[HEADER_BYTES + 3] ^= 0x10  # inside the first payload: whole records follow
    segment.write_bytes(bytes(data))
    with pytest.raises(WalCorruptError, match="checksum mismatch"):
        WriteAheadLog(tmp_path)


def test_a_torn_format_2_tail_is_cut_off(tmp_path):
    segment = tmp_path / segment_name(1)
    whole = b"".join(frame(i, b"record %d" % i) for i in range(1, 4))
    segment.write_bytes(whole + frame(4, b"record 4")[:-3])
    log = WriteAheadLog(tmp_path)
    assert [lsn for lsn, _ in log.iter_records()] == [1, 2, 3]
    assert segment.stat().st_size == len(whole)


def test_the_committed_segment_is_format_1():
    data = FORMAT1_SEGMENT.read_bytes()
    crc, word, lsn = HEADER.unpack_from(data)
    assert lsn == 1 and not word & CRC32C_FLAG
    assert crc == zlib.crc32(data[4:HEADER_BYTES + word])


def test_a_format_1_segment_reads_and_takes_format_2_records_after_it(tmp_path):
    shutil.copy(FORMAT1_SEGMENT, tmp_path / segment_name(1))
    old = list(WriteAheadLog(tmp_path).iter_records())
    assert len(old) == 41  # the board, then 40 submissions

    async def append() -> None:
        log = WriteAheadLog(tmp_path)
        await log.start()
        log.append(b"new record")
        await log.commit(log.last_lsn)
        await log.close()

    run(append())
    data = (tmp_path / segment_name(1)).read_bytes()
    assert data.startswith(FORMAT1_SEGMENT.read_bytes())
    assert not struct.unpack_from("<I", data, 4)[0] & CRC32C_FLAG
    assert struct.unpack_from("<I", data, FORMAT1_SEGMENT.stat().st_size + 4)[0] & CRC32C_FLAG
    assert list(WriteAheadLog(tmp_path).iter_records()) == [*old, (42, b"new record")]
    [(_, report)] = inspect_log(tmp_path)
    assert report["status"] == "ok" and report["records"] == 42


def expected_scores(count: int) -> dict[str, float]:
    scores: dict[str, float] = {}
    for i in range(count):
        scores[f"p{i % 7}"] = scores.get(f"p{i % 7}", 0.0) + i
    return scores


def test_an_engine_recovers_a_format_1_log_and_continues_it(tmp_path):
    wal = tmp_path / "wal"
    wal.mkdir(parents=True)
    shutil.copy(FORMAT1_SEGMENT, wal / segment_name(1))
    clock = FakeClock()

    async def scores(engine: Engine) -> dict[str, float]:
        return {e["member"]: e["score"] for e in engine.top("arena", limit=10)["entries"]}

    async def scenario() -> tuple[dict, dict, str, str]:
        engine = await Engine.open(engine_config(tmp_path), clock=clock)
        first = await scores(engine)
        applied = engine.stats["applied"]
        await engine.submit(sub("arena", "p3", delta=10.0, event_id="e10", label="L"))
        assert engine.stats["applied"] == applied  # its event id came back: a duplicate
        await engine.submit(sub("arena", "p0", delta=1000.0, event_id="new"))
        live = engine.digest()
        await engine.close(snapshot=False)
        engine = await Engine.open(engine_config(tmp_path), clock=clock)
        second = await scores(engine)
        recovered = engine.digest()
        await engine.close(snapshot=False)
        return first, second, live, recovered

    first, second, live, recovered = run(scenario())
    assert first == expected_scores(40)
    assert second == {**first, "p0": first["p0"] + 1000.0}
    assert recovered == live
