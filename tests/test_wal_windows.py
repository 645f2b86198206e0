"""Opening and replaying the log in bounded memory: the last segment is
checked a window at a time, and a recovery's skip to the snapshot's
position walks the mapping a window at a time, letting its pages go
(``rankd.engine.wal._scan_windows``, ``_skip_to``, ``_let_go``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from rankd.engine import wal
from rankd.engine.wal import WriteAheadLog


def _payload(i: int) -> bytes:
    # Mostly small, every 37th bigger than the tiny windows below.
    return (b"big-%d." % i) * 60 if i % 37 == 0 else b"record-%d" % i


async def _write(directory: Path, count: int) -> None:
    log = WriteAheadLog(directory, segment_bytes=1 << 20)
    await log.start()
    for i in range(count):
        log.append(_payload(i))
    await log.commit(log.last_lsn)
    await log.close()


@pytest.fixture(params=[64, 1000, 4 << 20])
def window(request, monkeypatch) -> int:
    """Windows smaller than a frame, than a few, and the default."""
    monkeypatch.setattr(wal, "_CHECK_WINDOW", request.param)
    return request.param


def test_opening_checks_the_last_segment_in_windows(tmp_path: Path, window: int) -> None:
    asyncio.run(_write(tmp_path, 2000))
    log = WriteAheadLog(tmp_path)
    assert log.last_lsn == 2000
    path = log.segments()[-1][1]
    assert wal._scan_windows(path, 1) == (path.stat().st_size, 2001)


def test_a_torn_tail_is_still_found_and_cut(tmp_path: Path, window: int) -> None:
    asyncio.run(_write(tmp_path, 500))
    path = WriteAheadLog(tmp_path).segments()[-1][1]
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 3)  # the last record cut short
    assert wal._scan_windows(path, 1) is None
    log = WriteAheadLog(tmp_path)
    assert log.last_lsn == 499
    assert list(log.iter_records(495)) == [(i + 1, _payload(i)) for i in range(494, 499)]


@pytest.mark.parametrize("from_lsn", [1, 2, 37, 38, 1500, 2000, 2001])
def test_replay_in_place_from_a_position(tmp_path: Path, window: int, from_lsn: int) -> None:
    asyncio.run(_write(tmp_path, 2000))
    log = WriteAheadLog(tmp_path)
    got = [(lsn, bytes(p)) for batch in log.iter_batches(from_lsn, 300, in_place=True)
           for lsn, p in batch]
    assert got == [(i + 1, _payload(i)) for i in range(from_lsn - 1, 2000)]


def test_damage_before_the_position_is_still_stepped_over(tmp_path: Path, window: int) -> None:
    """A corrupt record the snapshot covers: the skip stops at it, and the
    replay's own walk steps over it as before."""
    asyncio.run(_write(tmp_path, 300))
    path = WriteAheadLog(tmp_path).segments()[-1][1]
    data = bytearray(path.read_bytes())
    data[200] ^= 0xFF  # inside one of the first records
    path.write_bytes(bytes(data))
    log = WriteAheadLog(tmp_path, after_lsn=250)
    got = [(lsn, bytes(p)) for batch in log.iter_batches(251, 100, in_place=True)
           for lsn, p in batch]
    assert got == [(i + 1, _payload(i)) for i in range(250, 300)]
