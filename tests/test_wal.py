"""The write-ahead log on its own: framing, segments, policies, failures,
torn tails, corruption, repair and the tail reader."""

from __future__ import annotations

import asyncio
import errno
import os
import threading
import time

import pytest

from engine_helpers import engine_config, run, sub
from rankd.engine import wal as wal_module
from rankd.engine.engine import Engine
from rankd.engine.errors import ReadOnly
from rankd.engine.frames import frame
from rankd.engine.wal import (
    HEADER_BYTES,
    WalCorruptError,
    WalFailedError,
    WalReader,
    WriteAheadLog,
)


def payload(i: int) -> bytes:
    return f"record-{i}".encode() * (1 + i % 7)


async def write(directory, count: int, start: int = 0, **options) -> WriteAheadLog:
    log = WriteAheadLog(directory, **options)
    await log.start()
    for i in range(start, start + count):
        log.append(payload(i))
    await log.commit(log.last_lsn)
    await log.close()
    return log


def records(directory, from_lsn: int = 1, **options) -> list[tuple[int, bytes]]:
    return list(WriteAheadLog(directory, **options).iter_records(from_lsn))


@pytest.mark.parametrize("fsync", ["always", "everysec", "no"])
def test_records_come_back_in_order_across_segments_and_reopens(tmp_path, fsync):
    run(write(tmp_path, 300, fsync=fsync, segment_bytes=4096))
    run(write(tmp_path, 200, start=300, fsync=fsync, segment_bytes=4096))
    log = WriteAheadLog(tmp_path, segment_bytes=4096)
    assert len(log.segments()) > 5
    assert all(path.stat().st_size <= 4096 + 200 for _, path in log.segments())
    got = list(log.iter_records())
    assert got == [(i + 1, payload(i)) for i in range(500)]
    assert list(log.iter_records(450)) == got[449:]
    assert log.first_lsn == 1 and log.last_lsn == 500


def test_frame_layout_is_crc_length_lsn_payload(tmp_path):
    run(write(tmp_path, 2))
    data = (tmp_path / wal_module.segment_name(1)).read_bytes()
    assert data == frame(1, payload(0)) + frame(2, payload(1))
    assert len(frame(1, b"xyz")) == HEADER_BYTES + 3


def test_group_commit_shares_fsyncs_between_concurrent_committers(tmp_path, monkeypatch):
    calls = []
    real_fsync = os.fsync

    def counting_fsync(fd):
        calls.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(wal_module.os, "fsync", counting_fsync)

    async def scenario():
        log = WriteAheadLog(tmp_path, fsync="always")
        await log.start()

        async def committer(n):
            for i in range(20):
                lsn = log.append(payload(n * 100 + i))
                await log.commit(lsn)
                assert log.durable_lsn >= lsn

        await asyncio.gather(*(committer(n) for n in range(32)))
        await log.close()
        return log.last_lsn

    assert run(scenario()) == 640
    assert len(calls) < 640 / 4  # many commits per fsync
    assert len(records(tmp_path)) == 640


def test_everysec_writes_before_ack_and_fsyncs_in_the_background(tmp_path):
    async def scenario():
        log = WriteAheadLog(tmp_path, fsync="everysec")
        await log.start()
        lsn = log.append(b"x")
        await log.commit(lsn)
        written = (log.written_lsn, log.durable_lsn)
        on_disk = list(WriteAheadLog(tmp_path).iter_records())  # visible to a reader now
        await asyncio.sleep(1.3)
        durable = log.durable_lsn
        await log.close()
        return written, on_disk, durable

    written, on_disk, durable = run(scenario())
    assert written == (1, 0)
    assert on_disk == [(1, b"x")]
    assert durable == 1


@pytest.mark.parametrize("fsync", ["everysec", "no"])
def test_committers_of_one_pass_share_one_write(tmp_path, monkeypatch, fsync):
    """Without fsync per commit, the commits of one pass of the event loop
    go to the OS in one write, and each returns only once it is written."""
    writes = []
    real_write = os.write

    def counting_write(fd, data):
        writes.append(len(data))
        return real_write(fd, data)

    monkeypatch.setattr(wal_module.os, "write", counting_write)

    async def scenario():
        log = WriteAheadLog(tmp_path, fsync=fsync)
        await log.start()

        async def committer(n):
            lsn = log.append(payload(n))
            await log.commit(lsn)
            assert log.written_lsn >= lsn

        await asyncio.gather(*(committer(n) for n in range(50)))
        await log.close()

    run(scenario())
    assert len(writes) == 1
    assert len(records(tmp_path)) == 50


def test_a_failed_write_is_never_retried_and_the_engine_turns_read_only(tmp_path, monkeypatch):
    async def scenario():
        engine = await Engine.open(engine_config(tmp_path, fsync="always"))
        await engine.put_board("b", {"policy": "sum"})
        await engine.submit(sub("b", "ann", delta=1))

        def broken_write(fd, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(wal_module.os, "write", broken_write)
        with pytest.raises(ReadOnly, match="No space left"):
            await engine.submit(sub("b", "ann", delta=1))
        monkeypatch.undo()  # the disk is fine again: still no writes until restart
        with pytest.raises(ReadOnly):
            await engine.submit(sub("b", "bob", delta=1))
        await engine.settled()
        reads = engine.standing("b", "ann")
        await engine.close()
        return reads

    reads = run(scenario())
    # Reads keep working, and never show the write the log refused.
    assert reads is not None and reads["score"] == 1.0

    async def restart():
        engine = await Engine.open(engine_config(tmp_path))
        try:
            return engine.standing("b", "ann")["score"], engine.standing("b", "bob")
        finally:
            await engine.close()

    # Only the acknowledged event is there after a restart.
    assert run(restart()) == (1.0, None)


def test_a_failed_fsync_fails_the_log(tmp_path, monkeypatch):
    def broken_fsync(fd):
        raise OSError(errno.EIO, "Input/output error")

    async def scenario():
        log = WriteAheadLog(tmp_path, fsync="always")
        log.append(b"a")
        monkeypatch.setattr(wal_module.os, "fsync", broken_fsync)
        with pytest.raises(WalFailedError, match="Input/output error"):
            await log.commit(1)
        monkeypatch.undo()
        assert log.failed
        with pytest.raises(WalFailedError):
            log.append(b"b")
        with pytest.raises(WalFailedError):
            await log.commit(1)
        await log.close()

    run(scenario())


def test_torn_tail_is_truncated_and_appends_continue_after_it(tmp_path, caplog):
    run(write(tmp_path, 10))
    segment = tmp_path / wal_module.segment_name(1)
    with open(segment, "ab") as handle:
        handle.write(frame(11, b"torn record")[:-3])
    with caplog.at_level("WARNING"):
        log = WriteAheadLog(tmp_path)
    assert log.last_lsn == 10
    assert "dropping its" in caplog.text and "bytes" in caplog.text
    run(write(tmp_path, 1, start=10))
    assert [lsn for lsn, _ in records(tmp_path)] == list(range(1, 12))


def test_zeroed_tail_counts_as_torn(tmp_path):
    run(write(tmp_path, 5))
    segment = tmp_path / wal_module.segment_name(1)
    with open(segment, "ab") as handle:
        handle.write(bytes(64))
    assert WriteAheadLog(tmp_path).last_lsn == 5


def test_damage_in_an_older_segment_is_corruption_and_repair_moves_the_rest_aside(tmp_path):
    run(write(tmp_path, 400, segment_bytes=4096))
    segments = WriteAheadLog(tmp_path, segment_bytes=4096).segments()
    first_lsn, victim = segments[1]
    data = bytearray(victim.read_bytes())
    data[HEADER_BYTES + 2] ^= 0x55  # inside the first record's payload
    victim.write_bytes(bytes(data))
    with pytest.raises(WalCorruptError, match=f"{victim.name} at byte offset 0"):
        records(tmp_path)
    repaired = WriteAheadLog(tmp_path, segment_bytes=4096, repair=True)
    kept = list(repaired.iter_records())
    assert [lsn for lsn, _ in kept] == list(range(1, first_lsn))
    assert repaired.last_lsn == first_lsn - 1
    aside = sorted(p.name for p in tmp_path.glob("corrupt-*"))
    assert len(aside) == len(segments) - 1  # the damaged tail and every later segment
    # New records continue right after the kept prefix.
    lsn = repaired.append(b"after repair")
    run(repaired.commit(lsn))
    run(repaired.close())
    assert records(tmp_path)[-1] == (first_lsn, b"after repair")


def test_a_snapshot_position_beyond_the_log_starts_a_new_segment(tmp_path):
    run(write(tmp_path, 3))
    log = WriteAheadLog(tmp_path, after_lsn=10)
    assert log.last_lsn == 10
    assert log.append(b"eleven") == 11
    run(log.commit(11))
    run(log.close())
    names = sorted(p.name for p in tmp_path.glob("*.log"))
    assert names == [wal_module.segment_name(1), wal_module.segment_name(11)]


def test_remove_segments_before_keeps_the_active_segment(tmp_path):
    run(write(tmp_path, 300, segment_bytes=4096))
    log = WriteAheadLog(tmp_path, segment_bytes=4096)
    segments = log.segments()
    cut = segments[3][0]
    assert log.remove_segments_before(cut) == 3
    assert log.first_lsn == cut
    log.remove_segments_before(10**9)
    assert len(log.segments()) == 1
    assert list(log.iter_records())[-1][0] == 300


def test_reader_follows_a_live_log_across_segments(tmp_path):
    async def scenario():
        log = WriteAheadLog(tmp_path, segment_bytes=4096)
        reader = WalReader(log, 1)
        seen = []
        for round_ in range(10):
            for i in range(round_ * 37, (round_ + 1) * 37):
                log.append(payload(i))
            assert reader.read(1000) == []  # nothing reaches readers before commit
            await log.commit(log.last_lsn)
            while batch := reader.read(25):
                seen.extend(batch)
        reader.seek(100)
        again = reader.read(5)
        await log.close()
        return seen, again

    seen, again = run(scenario())
    assert seen == [(i + 1, payload(i)) for i in range(370)]
    assert [lsn for lsn, _ in again] == [100, 101, 102, 103, 104]


def test_bad_options_are_refused(tmp_path):
    with pytest.raises(ValueError, match="fsync policy"):
        WriteAheadLog(tmp_path, fsync="sometimes")
    with pytest.raises(ValueError, match="segment_bytes"):
        WriteAheadLog(tmp_path, segment_bytes=10)


def test_a_write_is_readable_before_its_fsync_and_pushed_only_after(tmp_path, monkeypatch):
    """docs/durability.md: reads see a write at once, as in Redis; the
    writer's acknowledgement and the live feed wait for the fsync."""
    import threading

    release = threading.Event()
    real_fsync = os.fsync

    def slow_fsync(fd):
        release.wait(5)
        real_fsync(fd)

    async def scenario():
        engine = await Engine.open(engine_config(tmp_path, fsync="always"))
        await engine.put_board("b", {"policy": "sum"})
        told = []
        engine.listeners.append(told.append)
        monkeypatch.setattr(wal_module.os, "fsync", slow_fsync)
        writer = asyncio.ensure_future(engine.submit(sub("b", "ann", delta=5)))
        for _ in range(100):
            await asyncio.sleep(0.01)
            if engine.standing("b", "ann") is not None:
                break
        seen = engine.standing("b", "ann")
        state_before_fsync = (seen and seen["score"], writer.done(), list(told))
        release.set()
        await writer
        monkeypatch.undo()
        await engine.close()
        return state_before_fsync, told

    (seen, acknowledged, pushed), told = run(scenario())
    assert seen == 5 and not acknowledged and pushed == []
    assert told == ["b"]


@pytest.mark.parametrize("fsync", ["always", "everysec", "no"])
def test_a_segment_is_fsynced_before_the_next_one_exists(tmp_path, monkeypatch, fsync):
    """So a power cut during a roll can only tear the newest segment: any
    damage in an older one is corruption, never a torn tail."""
    events = []
    real_open, real_write, real_fsync = os.open, os.write, os.fsync

    def opening(path, flags, *mode):
        fd = real_open(path, flags, *mode)
        if flags & os.O_CREAT and str(path).endswith(".log"):
            events.append(("create", fd))
        return fd

    def writing(fd, data):
        events.append(("write", fd))
        return real_write(fd, data)

    def syncing(fd):
        events.append(("fsync", fd))
        return real_fsync(fd)

    monkeypatch.setattr(wal_module.os, "open", opening)
    monkeypatch.setattr(wal_module.os, "write", writing)
    monkeypatch.setattr(wal_module.os, "fsync", syncing)
    run(write(tmp_path, 300, fsync=fsync, segment_bytes=4096))
    created = [fd for kind, fd in events if kind == "create"]
    assert len(created) > 3
    for previous, position in zip(created, [i for i, e in enumerate(events)
                                            if e[0] == "create"][1:], strict=False):
        last_use = [kind for kind, fd in events[:position] if fd == previous][-1]
        assert last_use == "fsync", events[:position]


async def _synced_then_written(directory, fsync: str) -> int:
    """50 records fsynced, then 50 written but not fsynced (a crash follows:
    the log is left open).  Returns the size the fsync made durable."""
    log = WriteAheadLog(directory, fsync=fsync)
    for i in range(50):
        log.append(payload(i))
    await log.commit(log.last_lsn)
    await log.sync()
    durable = (directory / wal_module.segment_name(1)).stat().st_size
    if fsync != "always":
        for i in range(50, 100):
            log.append(payload(i))
        await log.commit(log.last_lsn)
    return durable


@pytest.mark.parametrize("fsync", ["everysec", "no"])
def test_a_hole_of_zeroes_after_the_last_fsync_is_cut_off_without_repair(tmp_path, fsync):
    """Pages written back out of order leave zeroes with whole records after
    them; the sync mark proves they lie beyond what was promised durable."""
    durable = run(_synced_then_written(tmp_path, fsync))
    segment = tmp_path / wal_module.segment_name(1)
    data = bytearray(segment.read_bytes())
    hole = durable + 200
    data[hole:hole + 300] = bytes(300)
    segment.write_bytes(bytes(data))
    records = list(WriteAheadLog(tmp_path, fsync=fsync).iter_records())
    assert records[:50] == [(i + 1, payload(i)) for i in range(50)]
    assert 50 <= len(records) < 100
    # The same hole before the mark is corruption.
    run(_synced_then_written(tmp_path / "again", fsync))
    segment = tmp_path / "again" / wal_module.segment_name(1)
    data = bytearray(segment.read_bytes())
    data[100:400] = bytes(300)
    segment.write_bytes(bytes(data))
    with pytest.raises(WalCorruptError):
        WriteAheadLog(tmp_path / "again", fsync=fsync)


def test_under_always_no_mark_is_kept_and_a_hole_with_records_after_it_is_corruption(
        tmp_path):
    """Every acknowledged record is fsynced there: a hole could be one."""
    run(_synced_then_written(tmp_path, "always"))
    assert not (tmp_path / "synced").exists()
    segment = tmp_path / wal_module.segment_name(1)
    data = bytearray(segment.read_bytes())
    data[len(data) // 2:len(data) // 2 + 100] = bytes(100)
    segment.write_bytes(bytes(data))
    with pytest.raises(WalCorruptError):
        WriteAheadLog(tmp_path, fsync="always")


@pytest.mark.parametrize("fsync", ["everysec", "no"])
def test_a_segment_roll_fsyncs_off_the_event_loop_and_keeps_the_order(tmp_path, monkeypatch,
                                                                       fsync):
    """The finished segment's fsync (before the next one exists) once ran in
    the committer's thread, the event loop's, for as long as the disk took
    (35 ms seen on a node writing a snapshot's 35 MB).  Now a write that
    starts a segment goes to a worker thread: the loop serves meanwhile, and
    the writes committed while it runs wait for it and follow it."""
    loop_thread = threading.get_ident()
    real_fsync = os.fsync
    slow_on_loop = []
    loop_stalled = []  # per slow fsync: True if the loop never beat while it ran
    under_way: list[threading.Event] = []

    def slow_fsync(fd):
        slow_on_loop.append(threading.get_ident() == loop_thread)
        # A slow disk that finishes only once the event loop showed it is
        # serving meanwhile (a heartbeat after this fsync began): a loop that
        # waits for the fsync never beats, and the wait ends at the timeout.
        served = threading.Event()
        under_way.append(served)
        loop_stalled.append(not served.wait(5.0))
        return real_fsync(fd)

    async def scenario() -> int:
        log = WriteAheadLog(tmp_path, fsync=fsync, segment_bytes=4096)

        async def heartbeat() -> None:
            while True:
                while under_way:
                    under_way.pop().set()
                await asyncio.sleep(0.005)
        beating = asyncio.ensure_future(heartbeat())
        await asyncio.sleep(0.03)
        monkeypatch.setattr(wal_module.os, "fsync", slow_fsync)
        committed = []
        for i in range(200):  # several rolls; each commit as a pass of the engine does it
            lsn = log.append(payload(i))
            if not log.commit_now(lsn):
                committed.append(asyncio.ensure_future(log.commit(lsn)))
            if i % 20 == 0:
                await asyncio.sleep(0)
        await asyncio.gather(*committed)
        monkeypatch.setattr(wal_module.os, "fsync", real_fsync)
        beating.cancel()
        await log.close()
        return len(committed)

    waited = run(scenario())
    assert slow_on_loop and not any(slow_on_loop)  # every slow fsync off the loop
    assert not any(loop_stalled)  # the loop served while each one ran
    assert waited > 0  # commits that met a roll waited for it
    assert records(tmp_path) == [(i + 1, payload(i)) for i in range(200)]


def test_a_reader_goes_on_through_the_segments_a_snapshot_left_when_it_drops_some(tmp_path):
    """A reader (``written_by``, in a worker thread) and a snapshot's
    ``remove_segments_before`` (in another) race: the reader once indexed the
    live list of segments, so dropping the two oldest while it read the first
    made it pass over the third, still kept (its records silently missing),
    or stop on a broken chain."""
    log = run(write(tmp_path, 400, segment_bytes=4096))
    log = WriteAheadLog(tmp_path, segment_bytes=4096)
    segments = log.segments()
    assert len(segments) > 5
    reading = log.iter_batches(1, size=5)
    seen = [lsn for lsn, _ in next(reading)]  # inside the first segment
    kept_from = segments[2][0]
    assert log.remove_segments_before(kept_from) == 2
    for batch in reading:
        seen += [lsn for lsn, _ in batch]
    rest = [lsn for lsn in seen if lsn >= kept_from]
    assert rest == list(range(kept_from, 401))  # every kept record, in order


def test_a_closed_log_refuses_appends_and_opens_no_file(tmp_path):
    # A record appended once close began would never be written (close
    # writes out what came before), and its commit reopened a segment file
    # that nothing closed: refused now, and no descriptor is left open.
    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    async def scenario():
        log = WriteAheadLog(tmp_path, fsync="everysec")
        await log.start()
        for i in range(5):
            log.append(payload(i))
        await log.commit(log.last_lsn)
        before = open_fds()
        await log.close()
        closed = open_fds()
        with pytest.raises(WalFailedError, match="closed"):
            log.append(payload(5))
        with pytest.raises(WalFailedError, match="closed"):
            log.append_many([payload(6), payload(7)])
        await log.commit(log.last_lsn)  # (what was appended before is written)
        assert log.commit_now(log.last_lsn)
        await log.sync()
        return before, closed, open_fds(), log.last_lsn

    before, closed, after, last = run(scenario())
    assert closed < before and after == closed
    assert last == 5
    assert [lsn for lsn, _ in records(tmp_path)] == [1, 2, 3, 4, 5]


def test_under_always_a_sync_during_a_group_commit_writes_from_one_thread(tmp_path, monkeypatch):
    # Under ``always`` the group commit writes from a worker thread; a
    # ``sync()`` (shutdown calls one) during such a flush wrote what was
    # appended since from the loop's thread at the same time.  Now it goes
    # through the group commit: no two writes at once, the records in order.
    real_write = wal_module.os.write
    busy = []
    overlaps = []
    writers = set()

    def slow_write(fd, data):
        if busy:
            overlaps.append(len(data))
        busy.append(1)
        writers.add(threading.get_ident())
        try:
            time.sleep(0.05)
            return real_write(fd, data)
        finally:
            busy.pop()

    monkeypatch.setattr(wal_module.os, "write", slow_write)

    async def scenario():
        log = WriteAheadLog(tmp_path, fsync="always")
        await log.start()
        loop_thread = threading.get_ident()
        first = log.append(payload(0))
        committing = asyncio.ensure_future(log.commit(first))
        await asyncio.sleep(0.01)  # the flush of record 1 is in its worker thread
        for i in range(1, 50):
            log.append(payload(i))
        await log.sync()
        await committing
        assert log.durable_lsn == 50
        await log.close()
        return loop_thread

    loop_thread = run(scenario())
    assert overlaps == []
    assert loop_thread not in writers
    assert [lsn for lsn, _ in records(tmp_path)] == list(range(1, 51))
