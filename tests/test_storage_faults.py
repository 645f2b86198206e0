"""Storage faults the engine must never mistake for a clean log.

Every case damages a real data dir the way disks and operators do (a byte
flipped in each field of first, middle and last records of first, middle
and last segments; segments deleted or out of order; snapshots truncated,
flipped or deleted) and then checks, through ``Engine.open`` as the daemon
does, one of two outcomes and nothing else: every acknowledged event is
there exactly once, or the engine refuses to start and names the file and
offset of the damage.  Never a silent loss.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_helpers import engine_config, run, sub
from rankd.admin import wal_inspect
from rankd.engine import records
from rankd.engine.engine import Engine
from rankd.engine.frames import HEADER_BYTES, scan
from rankd.engine.snapshot import SnapshotError
from rankd.engine.wal import WalCorruptError

EVENTS = 200
SEGMENT_BYTES = 4096
FIELDS = {"crc": 0, "length": 4, "lsn": 8, "payload": HEADER_BYTES}


@dataclass(frozen=True)
class Frame:
    path: Path
    offset: int
    lsn: int
    size: int
    member: str | None


def frames_of(data_dir: Path) -> list[list[Frame]]:
    """Every frame of every segment, by segment, oldest first."""
    segments = []
    for path in sorted((data_dir / "wal").glob("*.log")):
        data = path.read_bytes()
        found = scan(data, int(path.stem))
        assert found.bad is None
        offset, frames = 0, []
        for lsn, payload in found.records:
            record = records.decode(payload)
            member = record[2] if record[0] == records.SUBMIT else None
            frames.append(Frame(path, offset, lsn, HEADER_BYTES + len(payload), member))
            offset += HEADER_BYTES + len(payload)
        segments.append(frames)
    return segments


async def fill(data_dir: Path, events: int, *, snapshot_after: tuple[int, ...] = ()) -> None:
    """A board of ``events`` acknowledged submissions, each a new member
    with delta 1, one record each; snapshots after the given counts."""
    engine = await Engine.open(engine_config(data_dir, segment_bytes=SEGMENT_BYTES))
    await engine.put_board("b", {"policy": "sum"})
    for i in range(events):
        await engine.submit(sub("b", f"m{i:03d}", delta=1, event_id=f"e{i}"))
        if i + 1 in snapshot_after:
            await engine.snapshot()
    await engine.close(snapshot=False)


@pytest.fixture(scope="module")
def base_log(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("base") / "data"
    run(fill(directory, EVENTS))
    assert len(frames_of(directory)) >= 5
    return directory


@pytest.fixture(scope="module")
def snapshotted_log(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("snapshotted") / "data"
    run(fill(directory, EVENTS, snapshot_after=(60, 130)))
    return directory


def copy_of(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


async def standings(data_dir: Path, **options) -> dict[str, float]:
    engine = await Engine.open(engine_config(data_dir, segment_bytes=SEGMENT_BYTES, **options))
    try:
        if "b" not in engine.boards:  # a repair that cut the log before the board
            return {}
        page = engine.top("b", limit=10_000)
        return {entry["member"]: entry["score"] for entry in page["entries"]}
    finally:
        await engine.close(snapshot=False)


def all_members() -> set[str]:
    return {f"m{i:03d}" for i in range(EVENTS)}


def assert_refused_at(data_dir: Path, path: Path, offset: int) -> None:
    with pytest.raises(WalCorruptError) as refused:
        run(standings(data_dir))
    message = str(refused.value)
    assert path.name in message and f"byte offset {offset}:" in message, message
    assert "--repair" in message


def flip(path: Path, offset: int, mask: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= mask
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("field", list(FIELDS))
@pytest.mark.parametrize("which_record", ["first", "middle", "last"])
@pytest.mark.parametrize("which_segment", ["first", "middle", "last"])
def test_a_flipped_byte_in_any_field_of_any_record_is_never_a_silent_loss(
        tmp_path, base_log, which_segment, which_record, field):
    data_dir = copy_of(base_log, tmp_path / "data")
    segments = frames_of(data_dir)
    segment = segments[{"first": 0, "middle": len(segments) // 2, "last": -1}[which_segment]]
    target = segment[{"first": 0, "middle": len(segment) // 2, "last": -1}[which_record]]
    where = target.offset + FIELDS[field]
    if field == "payload":
        where += (target.size - HEADER_BYTES) // 2
    # Flip a high bit of the length: the record then runs past the end of
    # the file, the case once taken for a torn tail.
    flip(target.path, where + (2 if field == "length" else 0), 0x10)

    assert_refused_at(data_dir, target.path, target.offset)
    assert wal_inspect(data_dir, out=_Sink()) == 1

    # An operator who asks for repair gets every record before the damage,
    # each exactly once, and none after it.
    scores = run(standings(data_dir, repair=True))
    before = {f.member for frames in segments for f in frames
              if f.member is not None and f.lsn < target.lsn}
    assert set(scores) == before
    assert all(score == 1 for score in scores.values())


@settings(max_examples=60)
@given(choice=st.floats(0, 1, exclude_max=True), mask=st.integers(1, 255))
def test_a_byte_flipped_anywhere_in_the_log_is_detected(tmp_path_factory, base_log, choice,
                                                         mask):
    frames = [f for segment in frames_of(base_log) for f in segment]
    total = sum(f.size for f in frames)
    position = int(choice * total)
    for target in frames:
        if position < target.size:
            break
        position -= target.size
    data_dir = copy_of(base_log, tmp_path_factory.mktemp("flip") / "data")
    path = data_dir / "wal" / target.path.name
    flip(path, target.offset + position, mask)
    assert_refused_at(data_dir, path, target.offset)


def test_a_cut_last_record_is_a_torn_tail_and_loses_only_that_record(tmp_path, base_log):
    data_dir = copy_of(base_log, tmp_path / "data")
    last = frames_of(data_dir)[-1][-1]
    with open(last.path, "r+b") as handle:
        handle.truncate(last.offset + last.size - 3)
    scores = run(standings(data_dir))
    assert set(scores) == all_members() - {last.member}


def test_zeroes_over_the_last_record_are_a_torn_tail(tmp_path, base_log):
    data_dir = copy_of(base_log, tmp_path / "data")
    last = frames_of(data_dir)[-1][-1]
    data = bytearray(last.path.read_bytes())
    data[last.offset + 5:] = bytes(len(data) - last.offset - 5)
    last.path.write_bytes(bytes(data))
    assert set(run(standings(data_dir))) == all_members() - {last.member}


def test_zeroes_followed_by_whole_records_are_corruption(tmp_path, base_log):
    data_dir = copy_of(base_log, tmp_path / "data")
    frames = frames_of(data_dir)[-1]
    hole = frames[1]
    data = bytearray(hole.path.read_bytes())
    data[hole.offset:hole.offset + hole.size] = bytes(hole.size)
    hole.path.write_bytes(bytes(data))
    assert_refused_at(data_dir, hole.path, hole.offset)


def test_a_deleted_middle_segment_is_a_gap(tmp_path, base_log):
    data_dir = copy_of(base_log, tmp_path / "data")
    segments = frames_of(data_dir)
    gone = segments[len(segments) // 2]
    gone[0].path.unlink()
    before = segments[len(segments) // 2 - 1][-1]
    with pytest.raises(WalCorruptError, match=rf"records {gone[0].lsn}-{gone[-1].lsn} are "
                                              "missing"):
        run(standings(data_dir))
    out = _Sink()
    assert wal_inspect(data_dir, out=out) == 1
    assert f"ends at {before.lsn}" in out.text
    # Repair keeps what precedes the gap and nothing after it.
    scores = run(standings(data_dir, repair=True))
    assert set(scores) == {f.member for s in segments[:len(segments) // 2] for f in s
                           if f.member}


def test_a_deleted_first_segment_is_a_gap_before_the_log(tmp_path, base_log):
    data_dir = copy_of(base_log, tmp_path / "data")
    segments = frames_of(data_dir)
    segments[0][0].path.unlink()
    kept = {s[0].path.name: s[0].path.read_bytes() for s in segments[1:]}
    with pytest.raises(WalCorruptError, match=r"the WAL starts at position .* records 1-"):
        run(standings(data_dir))
    # Repair replays none of a log that cannot follow the snapshot, and keeps
    # every segment of it aside (it used to replay the rest into nothing,
    # and the next snapshot deleted the segments that held it).
    assert run(standings(data_dir, repair=True)) == {}
    wal = data_dir / "wal"
    aside = {path.name.split("-", 2)[2].removesuffix(".bad"): path.read_bytes()
             for path in wal.glob("corrupt-*")}
    assert aside == kept

    async def write_and_stop_cleanly():  # the log goes on; a snapshot keeps what is aside
        engine = await Engine.open(engine_config(data_dir, segment_bytes=SEGMENT_BYTES))
        await engine.put_board("b", {"policy": "sum"})
        await engine.submit(sub("b", "after", delta=1, event_id="after"))
        await engine.close(snapshot=True)

    run(write_and_stop_cleanly())
    assert run(standings(data_dir)) == {"after": 1.0}
    assert {path.name.split("-", 2)[2].removesuffix(".bad"): path.read_bytes()
            for path in wal.glob("corrupt-*")} == kept


def test_segments_deleted_from_the_end_below_a_snapshot_are_missing(tmp_path, base_log):
    data_dir = copy_of(base_log, tmp_path / "data")

    async def snapshot_now():
        engine = await Engine.open(engine_config(data_dir, segment_bytes=SEGMENT_BYTES))
        await engine.snapshot()
        await engine.close(snapshot=False)
        return engine.last_snapshot["lsn"]

    taken = run(snapshot_now())
    for path in (data_dir / "wal").glob("*.log"):
        path.unlink()
    with pytest.raises(WalCorruptError, match=f"snapshot was taken at {taken}"):
        run(standings(data_dir))


def test_segments_out_of_order_are_corruption(tmp_path, base_log):
    data_dir = copy_of(base_log, tmp_path / "data")
    segments = frames_of(data_dir)
    a, b = segments[1][0].path, segments[2][0].path
    swap = a.with_suffix(".swap")
    a.rename(swap)
    b.rename(a)
    swap.rename(b)
    with pytest.raises(WalCorruptError, match=r"where .* was expected"):
        run(standings(data_dir))


def test_the_newest_snapshot_damaged_falls_back_to_the_previous_and_its_log(
        tmp_path, snapshotted_log):
    for damage in ("truncate", "flip", "delete"):
        data_dir = copy_of(snapshotted_log, tmp_path / damage)
        snapshots = sorted((data_dir / "snapshots").glob("*.snap"))
        assert len(snapshots) == 2
        newest = snapshots[-1]
        if damage == "truncate":
            newest.write_bytes(newest.read_bytes()[:-100])
        elif damage == "flip":
            flip(newest, newest.stat().st_size // 2, 0x40)
        else:
            newest.unlink()
        scores = run(standings(data_dir))
        assert set(scores) == all_members() and set(scores.values()) == {1}, damage


def test_every_snapshot_unreadable_refuses_to_start(tmp_path, snapshotted_log):
    data_dir = copy_of(snapshotted_log, tmp_path / "data")
    for snapshot in (data_dir / "snapshots").glob("*.snap"):
        flip(snapshot, 20, 0x01)
    with pytest.raises(SnapshotError, match="no readable snapshot"):
        run(standings(data_dir))


def test_every_snapshot_deleted_leaves_a_log_that_starts_too_late(tmp_path, snapshotted_log):
    data_dir = copy_of(snapshotted_log, tmp_path / "data")
    for snapshot in (data_dir / "snapshots").glob("*.snap"):
        snapshot.unlink()
    if frames_of(data_dir)[0][0].lsn == 1:
        pytest.fail("the snapshots should have let the oldest segments go")
    with pytest.raises(WalCorruptError, match="snapshot covers only up to 0"):
        run(standings(data_dir))


def test_a_corrupt_record_already_covered_by_the_snapshot_does_not_stop_the_start(
        tmp_path, snapshotted_log):
    data_dir = copy_of(snapshotted_log, tmp_path / "data")
    covered = int(sorted((data_dir / "snapshots").glob("*.snap"))[-1].stem.split("-")[1])
    # The record before the snapshot's position, in the segment replay starts in.
    segment = next(s for s in frames_of(data_dir) if s[0].lsn < covered <= s[-1].lsn)
    frame = next(f for f in segment if f.lsn == covered - 1)
    flip(frame.path, frame.offset + HEADER_BYTES + 1, 0x08)
    scores = run(standings(data_dir))
    assert set(scores) == all_members() and set(scores.values()) == {1}


class _Sink:
    def __init__(self) -> None:
        self.text = ""

    def write(self, text: str) -> None:
        self.text += text


def test_a_corrupt_covered_record_in_the_newest_segment_does_not_stop_the_start(tmp_path):
    data_dir = tmp_path / "data"
    run(fill(data_dir, EVENTS, snapshot_after=(EVENTS - 5,)))
    covered = int(next((data_dir / "snapshots").glob("*.snap")).stem.split("-")[1])
    newest = frames_of(data_dir)[-1]
    assert newest[0].lsn < covered < newest[-1].lsn
    frame = next(f for f in newest if f.lsn == covered - 2)
    flip(frame.path, frame.offset + 5, 0x20)  # its length
    scores = run(standings(data_dir))
    assert set(scores) == all_members() and set(scores.values()) == {1}
