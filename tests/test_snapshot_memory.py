"""A snapshot's memory: index dumps written as parts, never copied into an
encoder's buffer, and no encoder buffer kept at the size of the biggest
record (``rankd.engine.sections``, ``rankd.engine.records.encode``)."""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path

import pytest

from engine_helpers import FakeClock, run, sub, with_engine
from rankd.engine import records
from rankd.engine.sections import bin_header, blob_section, index_dump
from rankd.engine.snapshot import SnapshotStore, read_sections


@pytest.mark.parametrize("size", [0, 1, 255, 256, 65535, 65536, 300_000])
def test_blob_section_is_what_encode_makes(size: int) -> None:
    blob = bytes(range(256)) * (size // 256) + bytes(size % 256)
    head = ["index", "board:ü", "all", "2026-W47"]
    prefix, tail = blob_section(head, blob)
    assert tail is blob
    assert prefix + tail == records.encode([*head, blob])
    assert records.decode(prefix + tail) == (*head, blob)


def test_bin_header_refuses_what_msgpack_cannot_hold() -> None:
    with pytest.raises(ValueError, match="4 GiB"):
        bin_header(1 << 32)


def test_add_parts_frames_one_section(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    store.open()
    writer = store.begin(7)
    writer.add(b"first")
    writer.add_parts([b"sec", b"", b"ond"])
    path = writer.commit()
    assert list(read_sections(path)) == [b"first", b"second"]
    assert writer.size == path.stat().st_size


def test_encode_keeps_no_buffer_of_a_big_record() -> None:
    """The shared packer's buffer grew to the biggest record packed and
    stayed so (35 MiB at 1M members, from the snapshot's index section)."""
    records.encode(["warm", 1])
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        payload = records.encode(["index", "b", "all", "all", bytes(8 << 20)])
        assert len(payload) > 8 << 20
        del payload
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept < 1 << 20, f"{kept} bytes kept after encoding an 8 MiB record"


def test_snapshot_peak_is_about_one_dump(tmp_path: Path) -> None:
    """While a board is snapshotted, the memory allocated beyond its index
    is about one copy of the dump (it was three: dump, packer, payload)."""
    clock = FakeClock()
    members = 60_000

    async def body(engine) -> tuple[int, int, int]:
        await engine.put_board("b", {"windows": ["all"]})
        for start in range(0, members, 5_000):
            await engine.submit_many([sub("b", f"player:{i:012d}", score=float(i * 7 % 1000))
                                      for i in range(start, start + 5_000)])
        index = engine._state.boards["b"].periods["all"]["all"]
        dump_size = len(index.dump())
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            path = await engine.snapshot()
            peak = tracemalloc.get_traced_memory()[1] - before
        finally:
            tracemalloc.stop()
        return dump_size, peak, path.stat().st_size

    dump_size, peak, file_size = run(with_engine(tmp_path, clock, body))
    assert file_size > dump_size
    assert peak < 1.5 * dump_size, f"snapshot peak {peak} for a {dump_size}-byte dump"

    async def reopened(engine) -> int:
        return len(engine._state.boards["b"].periods["all"]["all"])

    assert run(with_engine(tmp_path, clock, reopened)) == members


def test_reading_a_snapshot_holds_the_file_once(tmp_path: Path) -> None:
    """A restart read the file, then copied every section out of it: twice
    the snapshot's size before a single index was loaded."""
    store = SnapshotStore(tmp_path)
    store.open()
    writer = store.begin(3)
    for i in range(4):
        writer.add_parts(blob_section(["index", "b", "all", f"p{i}"], bytes([i]) * (2 << 20)))
    path = writer.commit()
    size = path.stat().st_size
    gc.collect()
    tracemalloc.start()
    try:
        lsn, sections = store.latest()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert lsn == 3
    assert [records.decode(s)[3:] for s in sections] == [
        (f"p{i}", bytes([i]) * (2 << 20)) for i in range(4)]
    assert peak < 1.2 * size, f"reading a {size}-byte snapshot peaked at {peak} bytes"


@pytest.mark.parametrize("size", [0, 200, 70_000])
def test_index_dump_reads_an_index_section_in_place(size: int) -> None:
    blob = bytes(range(256)) * (size // 256)
    payload = b"".join(blob_section(["index", "board:ü", "all", "2026-W47"], blob))
    board, window, period, dump = index_dump(payload)
    assert (board, window, period, bytes(dump)) == ("board:ü", "all", "2026-W47", blob)
    assert dump.obj is payload  # a view, not a copy


def test_index_dump_leaves_other_sections_to_the_decoder() -> None:
    assert index_dump(records.encode(["board", "b", {}, 1, 0.0])) is None
    assert index_dump(records.encode(["index", "b", "all", 7, b"x"])) is None  # not a str
    assert index_dump(records.encode(["index", "b" * 5000, "all", "all", b"x"])) is None
    truncated = records.encode(["index", "b", "all", "all", b"xyz"])[:-1]
    assert index_dump(truncated) is None


def test_restart_loads_every_index_from_the_file_in_place(tmp_path: Path) -> None:
    clock = FakeClock()

    async def fill(engine) -> dict:
        await engine.put_board("b", {"windows": ["all", "daily"]})
        await engine.submit_many([sub("b", f"m{i}", score=float(i % 17)) for i in range(500)])
        await engine.snapshot()
        return engine.digest()

    async def digest(engine) -> dict:
        return engine.digest()

    before = run(with_engine(tmp_path, clock, fill, snapshot_every_events=10**6))
    assert run(with_engine(tmp_path, clock, digest)) == before


def test_restart_peak_is_about_one_file(tmp_path: Path) -> None:
    """A restart held the file, a copy of each section, and msgpack's copy
    of the dump inside it: three times the snapshot where one will do."""
    from rankd.engine.state import BoardState

    clock = FakeClock()

    async def fill(engine) -> Path:
        await engine.put_board("b", {"windows": ["all"]})
        for start in range(0, 60_000, 5_000):
            await engine.submit_many([sub("b", f"player:{i:012d}", score=float(i % 977))
                                      for i in range(start, start + 5_000)])
        return await engine.snapshot()

    size = run(with_engine(tmp_path, clock, fill)).stat().st_size
    store = SnapshotStore(tmp_path / "snapshots")
    state = BoardState(clock)
    gc.collect()
    tracemalloc.start()
    try:
        _, sections = store.latest()
        state.load(sections)
        del sections
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(state.boards["b"].periods["all"]["all"]) == 60_000
    assert peak < 1.75 * size, f"a restart from a {size}-byte snapshot peaked at {peak} bytes"


def test_recovery_lets_the_snapshot_file_go_before_reading_the_log(tmp_path: Path,
                                                                   monkeypatch) -> None:
    """The snapshot's bytes stayed referenced while the log was opened and
    replayed, each of which reads a whole segment: the restart peak held both."""
    from rankd.engine import recovery

    clock = FakeClock()

    async def fill(engine) -> Path:
        await engine.put_board("b", {"windows": ["all"]})
        await engine.submit_many([sub("b", f"player:{i:012d}", score=float(i))
                                  for i in range(40_000)])
        return await engine.snapshot()

    size = run(with_engine(tmp_path, clock, fill)).stat().st_size
    held = []
    opened = recovery.WriteAheadLog

    def measured_open(*args, **kwargs):
        gc.collect()
        held.append(tracemalloc.get_traced_memory()[0])
        return opened(*args, **kwargs)

    monkeypatch.setattr(recovery, "WriteAheadLog", measured_open)

    async def reopen(engine) -> int:
        return len(engine._state.boards["b"].periods["all"]["all"])

    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        assert run(with_engine(tmp_path, clock, reopen)) == 40_000
    finally:
        tracemalloc.stop()
    assert held and held[0] - before < size / 2, (
        f"{held[0] - before} bytes held when the log was opened after a {size}-byte snapshot")


def test_restart_holds_one_section_not_the_file(tmp_path: Path) -> None:
    """A board of four windows, with remembered event ids: a restart held the
    whole snapshot file (four dumps and every id chunk) until the last
    section was applied; it now reads one section at a time."""
    from rankd.engine import settings
    from rankd.engine.state import BoardState

    clock = FakeClock()

    async def fill(engine) -> Path:
        await engine.put_board("b", {"windows": ["all", "daily", "weekly", "monthly"]})
        for start in range(0, 40_000, 5_000):
            await engine.submit_many([sub("b", f"player:{i:012d}", score=float(i % 977),
                                          event_id=f"event-{i}")
                                      for i in range(start, start + 5_000)])
        return await engine.snapshot()

    old = settings.SNAPSHOT_LOG_BYTES
    settings.SNAPSHOT_LOG_BYTES = 256 << 10  # (several id sections, as at scale)
    try:
        size = run(with_engine(tmp_path, clock, fill)).stat().st_size
    finally:
        settings.SNAPSHOT_LOG_BYTES = old
    store = SnapshotStore(tmp_path / "snapshots")
    state = BoardState(clock)
    gc.collect()
    tracemalloc.start()
    try:
        _, sections = store.latest()
        biggest = max(map(len, sections))
        state.load(sections)
        del sections
        gc.collect()
        kept, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    board = state.boards["b"]
    assert [len(board.periods[w][p]) for w, periods in board.periods.items()
            for p in periods] == [40_000] * 4
    assert len(board.dedupe) == 40_000
    assert biggest < size / 4
    # Beyond what the state keeps: the section being applied (and what
    # loading it makes) and the one before (the loader's loop variable until
    # the next is read), not the file (over 5 times the biggest here).
    assert peak - kept < 3 * biggest, (
        f"a restart from a {size}-byte snapshot (biggest section {biggest}) "
        f"peaked {peak - kept} bytes above what it kept")


def test_a_snapshot_cut_short_is_refused_before_any_section(tmp_path: Path) -> None:
    """Every frame is checked before the first section is read out, so a
    damaged newest snapshot is skipped for the previous one untouched."""
    from rankd.engine.snapshot import SnapshotError, SnapshotSections

    store = SnapshotStore(tmp_path)
    store.open()
    writer = store.begin(5)
    writer.add(b"first")
    writer.add_parts(blob_section(["index", "b", "all", "all"], bytes(3 << 20)))
    path = writer.commit()
    prefix, blob = blob_section(["index", "b", "all", "all"], bytes(3 << 20))
    assert [len(s) for s in SnapshotSections(path)] == [5, len(prefix) + len(blob)]
    data = path.read_bytes()
    for cut, message in ((len(data) - 3, "truncated"), (len(data) // 2, "truncated")):
        path.write_bytes(data[:cut])
        with pytest.raises(SnapshotError, match=message):
            SnapshotSections(path)
    damaged = bytearray(data)
    damaged[len(data) // 2] ^= 1
    path.write_bytes(bytes(damaged))
    with pytest.raises(SnapshotError, match="checksum"):
        SnapshotSections(path)
    path.write_bytes(data + b"x")
    with pytest.raises(SnapshotError, match="after the end marker"):
        SnapshotSections(path)
