"""Index dumps and loads in bounded pieces (``dump_chunks``/``load_chunks``),
and snapshots that write and restarts that read a board's index that way:
a whole-board dump was a second copy of the index at the daemon's snapshot
and restart peaks.  Piece sizes are forced small here, so every boundary
(header, record, member bytes, checksum) falls inside a piece somewhere."""

from __future__ import annotations

import contextlib
import gc
import random
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine_helpers import FakeClock, run, sub, with_engine
from rankd.engine import records, settings
from rankd.engine.sections import blob_section
from rankd.engine.snapshot import SnapshotError, SnapshotStore
from rankd.engine.state import BoardState
from rankd.index._fallback import RankIndex as Fallback

native = pytest.importorskip("rankd._skiplist")
pages = pytest.importorskip("rankd._pages")
KINDS = {"skiplist": native.RankIndex, "pages": pages.RankIndex, "fallback": Fallback}
ROOM = 24 + 18 + 256 + 4  # header, one record of the longest name, checksum


def board(cls: type, tie: str, members: int = 600, seed: int = 1) -> object:
    rng = random.Random(seed)
    index = cls("desc", tie)
    for i in range(members):  # names of 1 to 250 bytes, many tied scores
        index.set(f"m{i}:" + "é" * rng.choice((0, 1, 5, 120)), rng.randrange(50))
    return index


def cuts(data: bytes, size: int) -> list[bytes]:
    return [data[start:start + size] for start in range(0, len(data), size)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tie", ["first", "member", "member_desc"])
def test_dump_chunks_are_the_dump_cut_between_records(kind: str, tie: str) -> None:
    index = board(KINDS[kind], tie)
    dump = index.dump()
    for max_bytes in (1, 30, 1000, 1 << 20):
        chunks = index.dump_chunks(max_bytes)
        pieces = list(chunks)
        assert b"".join(pieces) == dump
        assert chunks.size == len(dump)
        assert max(map(len, pieces)) <= max(max_bytes, ROOM)
    assert len(list(index.dump_chunks(1000))) > len(dump) // 1000 > 5


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tie", ["first", "member"])
def test_load_chunks_takes_pieces_cut_anywhere_by_either_kind(kind: str, tie: str) -> None:
    expected = board(KINDS[kind], tie)
    dump = expected.dump()
    for cut in (1, 7, 18, 4096):
        for reader in KINDS.values():
            loaded = reader.load_chunks(iter(cuts(dump, cut)))
            if hasattr(loaded, "_check"):
                loaded._check()
            assert list(loaded) == list(expected)
            assert loaded.rank(next(iter(expected))[0]) == 1
    again = KINDS[kind].load_chunks(expected.dump_chunks(100), len(dump))
    assert again.dump() == dump


@pytest.mark.parametrize("kind", ["skiplist", "pages"])
def test_load_chunks_refuses_a_damaged_dump(kind: str) -> None:
    cls = KINDS[kind]
    dump = board(cls, "first", 200).dump()
    flipped, trailer = bytearray(dump), bytearray(dump)
    flipped[len(dump) // 2] ^= 0x01
    trailer[-1] ^= 0x01
    for pieces, message in (
        (cuts(bytes(flipped), 5), None),
        (cuts(bytes(trailer), 5), "corrupt"),
        (cuts(dump[:-1], 5), "truncated"),
        (cuts(dump[:-40], 64), "truncated"),
        ([dump, b"x"], "after its last record"),
        ([b"RKIY" + dump[4:]], "bad magic"),
        ([dump[:10]], "truncated"),
        ([], "truncated"),
    ):
        with pytest.raises(ValueError, match=message):
            cls.load_chunks(pieces)
    with pytest.raises(ValueError, match="claims"):  # a count beyond the size given
        cls.load_chunks([dump], 100)


@pytest.mark.parametrize("kind", ["skiplist", "pages"])
def test_a_dump_in_pieces_refuses_an_index_that_changed(kind: str) -> None:
    index = board(KINDS[kind], "first", 500)
    chunks = iter(index.dump_chunks(100))
    next(chunks)
    index.set("newcomer", 1)
    with pytest.raises(RuntimeError, match="changed"):
        next(chunks)


@contextlib.contextmanager
def traced() -> Iterator[list[int]]:
    """``[peak]``: the most allocated (tracemalloc) in the block, set at its end."""
    found = [0]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        yield found
        found[0] = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


def fill(engine_board: str, members: int) -> list:
    return [sub(engine_board, f"player:{i:012d}", score=float(i * 7 % 1000))
            for i in range(members)]


def test_snapshot_streams_the_dump_and_a_restart_reads_it_in_pieces(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The section holds the dump's records as they are (walked, with no
    write meanwhile: ``test_index_walk.py``), and neither the snapshot nor
    the restart holds more than a few pieces of it (both held the whole
    dump: a copy of a third to a half of the index)."""
    monkeypatch.setattr(settings, "SNAPSHOT_INDEX_BYTES", 16 << 10)
    clock = FakeClock()
    members = 40_000

    async def body(engine) -> tuple[bytes, int, Path]:
        await engine.put_board("b", {"windows": ["all"]})
        for start in range(0, members, 10_000):
            await engine.submit_many(fill("b", members)[start:start + 10_000])
        dump = engine._state.boards["b"].periods["all"]["all"].dump()
        with traced() as peak:
            path = await engine.snapshot()
        return dump, peak[0], path

    dump, peak, path = run(with_engine(tmp_path, clock, body))
    assert len(dump) > 1 << 20
    assert peak < len(dump) // 4, f"snapshot peak {peak} for a {len(dump)}-byte dump"
    assert dump[24:-4] in path.read_bytes()

    from rankd.index import kinds

    with traced() as index_alone:  # (what the index allocates itself)
        kinds.current().load(dump)
    _, sections = SnapshotStore(path.parent).latest()
    state = BoardState(clock)
    with traced() as peak:
        state.load(sections)
    assert peak[0] < index_alone[0] + len(dump) // 4, \
        f"restart peak {peak[0]} for a {len(dump)}-byte dump ({index_alone[0]} the index's own)"
    assert state.boards["b"].periods["all"]["all"].dump() == dump

    async def reopened(engine) -> int:
        index = engine._state.boards["b"].periods["all"]["all"]
        return index.dump() == dump

    assert run(with_engine(tmp_path, clock, reopened))


def test_a_snapshot_written_whole_loads_in_pieces(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A snapshot of the previous writer (the dump whole, ``add_parts``),
    with every kind of section around the index, loads through pieces."""
    monkeypatch.setattr(settings, "SNAPSHOT_INDEX_BYTES", 1000)
    index = board(native.RankIndex, "first", 2000)
    weekly = board(pages.RankIndex, "member", 1500, seed=2)
    store = SnapshotStore(tmp_path)
    store.open()
    writer = store.begin(9)
    writer.add(records.encode(["board", "b", {"windows": ["all", "weekly"],
                                              "tie_break": "first"}, 3, 0.0]))
    writer.add_parts(blob_section(["index", "b", "all", "all"], index.dump()))
    writer.add_parts(blob_section(["index", "b", "weekly", "2026-W48"], weekly.dump()))
    writer.add(records.encode(["label_columns", "b", ["m1:"], ["x" * 3000]]))  # large, not an index
    writer.commit()
    _, sections = store.latest()
    state = BoardState(FakeClock())
    state.load(sections)
    periods = state.boards["b"].periods
    assert periods["all"]["all"].dump() == index.dump()
    assert list(periods["weekly"]["2026-W48"]) == list(weekly)
    assert state.boards["b"].labels == {"m1:": "x" * 3000}


def test_a_section_changed_after_its_check_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(settings, "SNAPSHOT_INDEX_BYTES", 1000)
    index = board(native.RankIndex, "first", 2000)
    store = SnapshotStore(tmp_path)
    store.open()
    writer = store.begin(9)
    writer.add(records.encode(["board", "b", {"windows": ["all"]}, 3, 0.0]))
    writer.add_parts(blob_section(["index", "b", "all", "all"], index.dump()))
    path = writer.commit()
    _, sections = store.latest()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises((SnapshotError, ValueError)):
        BoardState(FakeClock()).load(sections)
