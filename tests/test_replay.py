"""Replay of SUBMIT records: the native kernel against the pure-Python
reference, on random runs of records (other kinds, other boards, repeated
event ids, removed windows, and encodings the kernel leaves to the caller)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import native
from rankd.engine import records
from rankd.engine.board import Board
from rankd.engine.config import BoardConfig
from rankd.engine.frames import MAX_LSN, frame_many
from rankd.engine.replay import Pending, gather_submit, replay_submits_python
from rankd.index.packed import unpack_states

# Native and reference boards are compared side by side: one dedupe key.
pytestmark = pytest.mark.usefixtures("same_event_id_keys")

BOARD = "arena"
TTL = 86_400.0


def native_replay():
    return native("rankd.engine._replay", "replay_submits")


text = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=40)
scores = st.floats(allow_nan=False, allow_infinity=False)
optional_scores = st.one_of(st.none(), scores)
updates = st.lists(st.tuples(st.sampled_from(["all", "daily", "weekly"]),
                             st.sampled_from(["all", "2026-11-22", "2026-W47", "ü"]),
                             scores).map(list), max_size=3)
results = st.tuples(optional_scores, st.one_of(st.none(), st.integers(1, 2**40)),
                    optional_scores, st.booleans()).map(list)
submits = st.builds(
    lambda board, member, value, is_delta, event_id, ts_ms, now_ms, label, ups, result:
    [records.SUBMIT, board, member, value, is_delta, event_id, ts_ms, now_ms, label, ups,
     result],
    st.sampled_from([BOARD, BOARD, BOARD, "other"]), st.sampled_from(["p1", "p2", "é", "x" * 256]),
    st.one_of(scores, st.integers(-2**53, 2**53)), st.booleans(),
    st.one_of(st.none(), st.sampled_from(["e1", "e2", "e3", "ü" * 40])),
    st.integers(0, 2**45), st.integers(0, 2**45), st.one_of(st.none(), text), updates, results)
others = st.one_of(
    st.builds(lambda ts: [records.REMOVE, BOARD, "p1", ts], st.integers(0, 2**45)),
    st.builds(lambda ts: [records.BOARD_PUT, BOARD, {"windows": ["all"]}, ts],
              st.integers(0, 2**45)),
)


def odd(record: list) -> bytes:
    """A valid encoding the packer never writes for a record: scores as integers."""
    def integer(score: float | None) -> int | float | None:
        return round(score) if score is not None and abs(score) < 2**53 else score

    if record[0] == records.SUBMIT:
        record = [*record[:9], [[w, p, integer(s)] for w, p, s in record[9]],
                  [integer(record[10][0]), *record[10][1:]]]
    return records.encode(record)


encoded = st.one_of(
    submits.map(records.encode), submits.map(records.encode), submits.map(odd),
    others.map(records.encode),
)


def fresh_board() -> Board:
    # "weekly" is not one of its windows: as if a config change removed it.
    return Board(BOARD, BoardConfig(policy="sum", windows=("all", "daily")))


def state(board: Board, pending: Pending) -> dict[str, Any]:
    return {"pending": list(pending.items()), "event_ids": board.dedupe.packed_items(),
            "labels": list(board.labels.items()), "version": board.version,
            "updated_at": board.updated_at}


def drive(replay, payloads: list[bytes], batch: Sequence[tuple[int, bytes]] | None = None
          ) -> tuple[dict[str, Any], int]:
    """Replay as the engine does: decode a run's first record, hand the run on
    (the records of ``payloads`` from position 100, or ``batch`` holding them)."""
    board = fresh_board()
    pending: Pending = {}
    if batch is None:
        batch = [(lsn, payload) for lsn, payload in enumerate(payloads, start=100)]
    position = gathered = 0
    while position < len(batch):
        lsn, payload = batch[position]
        record = records.decode(payload)
        position += 1
        if record[0] != records.SUBMIT or record[1] != BOARD:
            continue
        gathered += gather_submit(board, lsn, record, TTL, pending)
        position, more = replay(board, batch, position, TTL, pending)
        gathered += more
    return state(board, pending), gathered


@given(st.lists(encoded, max_size=30))
def test_native_replay_leaves_the_state_the_reference_leaves(payloads):
    assert drive(native_replay(), payloads) == drive(replay_submits_python, payloads)


@given(st.lists(encoded, max_size=30), st.integers(0, 3))
def test_replay_in_place_leaves_the_state_a_list_of_records_leaves(payloads, skipped):
    """Recovery's batches leave the records in the log's buffer (a Frames
    batch, from the frame scanner): the kernel reads them in place to the
    state the reference leaves from a list, and the batch reads back as
    that list (for the code that decodes a record of it)."""
    scan_frames = native("rankd.engine._frames", "scan_frames")
    log = frame_many(100 - skipped, [b"skipped"] * skipped + payloads)
    batch, end, next_lsn, bad = scan_frames(log, 100 - skipped, True, 100, MAX_LSN, MAX_LSN)
    assert (end, next_lsn, bad) == (len(log), 100 + len(payloads), None)
    assert [batch[i] for i in range(len(batch))] == list(enumerate(payloads, 100))
    assert drive(native_replay(), payloads, batch) == drive(replay_submits_python, payloads)


@given(st.lists(submits.filter(lambda r: r[1] == BOARD).map(records.encode), max_size=30),
       st.one_of(st.none(), others.map(records.encode)))
def test_native_replay_reads_every_record_the_engine_writes(payloads, foreign):
    """The records rankd writes never fall back to decoding: the kernel
    stops exactly where the reference does, at the first foreign record."""
    batch = [(lsn, p) for lsn, p in enumerate(payloads + ([foreign] if foreign else []), 1)]
    results = []
    for replay in (native_replay(), replay_submits_python):
        board, pending = fresh_board(), {}
        stop, gathered = replay(board, batch, 0, TTL, pending)
        results.append((stop, gathered, state(board, pending)))
    assert results[0] == results[1]
    assert results[0][0] == len(payloads)


def outcome(replay, payloads: list[bytes]) -> tuple:
    """What :func:`drive` leaves, or the kind of error it stops with."""
    try:
        return drive(replay, payloads)
    except Exception as exc:  # the reference fails as msgpack or Python does
        return (type(exc).__name__,)


@given(st.lists(submits.map(records.encode), min_size=1, max_size=8), st.data())
def test_damaged_records_end_the_same_way_in_both(payloads, data):
    """Damage the WAL's checksums would catch, fed to replay anyway: the
    kernel never reads out of bounds, and it ends (state or error) where
    the reference ends."""
    victim = data.draw(st.integers(0, len(payloads) - 1))
    payload = bytearray(payloads[victim])
    for _ in range(data.draw(st.integers(1, 4))):
        position = data.draw(st.integers(0, len(payload) - 1))
        payload[position] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(payload)))
    payloads[victim] = bytes(payload[:cut] if data.draw(st.booleans()) else payload)
    assert outcome(native_replay(), payloads) == outcome(replay_submits_python, payloads)


def test_a_record_cut_short_changes_nothing_and_is_left_to_the_caller():
    record = [records.SUBMIT, BOARD, "p1", 1.0, True, "e1", 5, 7, "Pat",
              [["all", "all", 3.0]], [3.0, 1, 2.0, True]]
    good = records.encode(record)
    board, pending = fresh_board(), {}
    batch = [(1, good), (2, good[:-1]), (3, good)]
    assert native_replay()(board, batch, 0, TTL, pending) == (1, 1)
    assert {key: unpack_states(run) for key, run in pending.items()} == {
        (BOARD, "all", "all"): [("p1", 3.0, 1)]}
    assert board.version == 1 and board.labels == {"p1": "Pat"}
    with pytest.raises(ValueError):
        records.decode(good[:-1])  # what the caller then meets: recovery stops
