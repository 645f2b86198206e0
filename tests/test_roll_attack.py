"""Attacks on the skip list's clock-paced relayout and the write-ahead
log's segment roll off the event loop: each test is named for the defect
it exposes."""

from __future__ import annotations

import random
import statistics
import time

import pytest

skiplist = pytest.importorskip("rankd._skiplist")
from rankd.index.packed import pack_state  # noqa: E402

BOARD = 1_000_000
#: A pace close to what a move costs on a big board (a node copied, its
#: links and hash slot repointed: cache misses), so that the share of the
#: write's time a relayout takes shows.
PACE_NS = 200


def _board(*, relayout: bool) -> object:
    index = skiplist.RankIndex()
    if relayout:
        index._growth_knobs(32768, 256, pace_ns=PACE_NS)
    else:
        index._growth_knobs(1 << 40, 256)  # (never relaid out)
    rng = random.Random(7)
    run = bytearray()
    for i in range(BOARD):
        pack_state(run, f"m{i}", rng.random(), i + 1)
    index.set_states_packed(run)
    return index


def _batch(tag: str, count: int, seq: int) -> bytearray:
    rng = random.Random(tag)
    run = bytearray()
    for j in range(count):
        pack_state(run, f"{tag}-{j}", rng.random(), seq + j)
    return run


def _cpu_ms(index, run: bytearray) -> float:
    started = time.process_time()
    index.set_states_packed(run)
    return (time.process_time() - started) * 1e3


def test_relayout_credit_earned_by_its_own_moves_holds_a_batch_for_long():
    """The credit grows with wall time, and the time a step spends moving
    nodes counts too: once a move costs about the pace, each step earns the
    next one and every write of a run moves the most it may (256 nodes),
    so a run of new members applied at once during a relayout costs many
    times what it costs on a board not being relaid out."""
    relaid, plain = _board(relayout=True), _board(relayout=False)
    relaid.set("start", 0.5)  # a relayout begins (every node was placed at random)
    assert relaid._relaying
    during, without = [], []
    seq = BOARD + 10
    for rep in range(3):
        if not relaid._relaying:
            break
        during.append(_cpu_ms(relaid, _batch(f"a{rep}", 500, seq)))
        without.append(_cpu_ms(plain, _batch(f"b{rep}", 500, seq)))
        seq += 1000
    ratio = statistics.median(during) / statistics.median(without)
    # Without the defect about 1 + (a move) / PACE_NS: 2-3x here alone, up to
    # 8.4x under a whole CI run's load on a slow day (2026-12-02); with it
    # 17-19x.
    assert ratio < 11, (f"500 new members: {statistics.median(during):.1f} ms of CPU during a "
                       f"relayout, {statistics.median(without):.1f} ms without ({ratio:.1f}x)")


# --- the write-ahead log's segment roll in a worker thread ---------------------------------

def test_roll_acknowledges_records_a_concurrent_fsync_failure_cut_off(tmp_path, monkeypatch):
    """The once-a-second fsync fails (EIO) while a roll runs in another
    worker thread: the failure cuts the files back to the last acknowledged
    record (deleting the segment the roll just made), and the roll, which
    checks the failure only before it starts, then marks its records
    written: their commits return as if they were safe, the log failed,
    and after a restart the records are gone."""
    import asyncio
    import errno
    import sys
    import threading

    from rankd.engine import wal as walmod
    from rankd.engine.wal import WalCorruptError, WalFailedError, WriteAheadLog

    real_fsync = os_fsync = walmod.os.fsync
    roll_in = threading.Event()
    log = WriteAheadLog(tmp_path / "wal", fsync="everysec", segment_bytes=4096)

    def fsync(fd: int) -> None:
        caller = sys._getframe(1).f_code.co_name
        if caller == "_sync":  # the background fsync: fails while the roll is under way
            roll_in.wait(10)
            raise OSError(errno.EIO, "Input/output error")
        if caller == "_start_segment":  # the roll: carries on once the failure cut back
            roll_in.set()
            deadline = time.monotonic() + 10
            while log.failure is None and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.3)
        os_fsync(fd)

    async def scenario() -> tuple[list[int], list[object]]:
        first = log.append(b"a" * 100)
        await log.commit(first)
        while log._active_bytes < 3500:
            await log.commit(log.append(b"b" * 100))
        monkeypatch.setattr(walmod.os, "fsync", fsync)
        syncing = asyncio.ensure_future(log.sync())  # (its fsync waits for the roll)
        await asyncio.sleep(0.1)
        lsns = [log.append(b"c" * 300) for _ in range(4)]  # (the 1st fits, the 2nd rolls)
        results = await asyncio.gather(*(log.commit(lsn) for lsn in lsns),
                                       return_exceptions=True)
        await syncing
        monkeypatch.setattr(walmod.os, "fsync", real_fsync)
        await log.close()
        return lsns, results

    lsns, results = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert log.failed
    acknowledged = [lsn for lsn, result in zip(lsns, results, strict=True)
                    if not isinstance(result, BaseException)]
    reopened = WriteAheadLog(tmp_path / "wal", fsync="everysec", segment_bytes=4096)
    try:
        found = [lsn for lsn, _ in reopened.iter_records()]
    except WalCorruptError as exc:
        found = [f"corrupt: {exc}"]
    assert all(isinstance(result, WalFailedError) for result in results) or (
        found[-len(acknowledged):] == acknowledged), (
        f"commits of records {acknowledged} returned, then the log failed; reopened, it "
        f"holds {found[-3:]}")
