"""The local log positions a cluster primary keeps for records its groups'
logs may lack (``rankd.engine.unshipped``): the least one not committed,
per writer, until the group's state is reset."""

from __future__ import annotations

from dataclasses import dataclass

from rankd.engine.unshipped import UnshippedRecords


@dataclass
class Writer:
    group: int
    committed_seq: int = 0


def test_the_lowest_position_is_the_first_record_not_committed_of_any_group():
    held = UnshippedRecords()
    assert held.lowest() is None
    a, b = Writer(1), Writer(2)
    held.written(a, 3, 10)   # group 1 up to position 3, local log at 10
    held.written(b, 1, 11)
    held.written(a, 5, 12)
    assert held.lowest() == 10
    a.committed_seq = 3      # group 1's first record committed
    assert held.lowest() == 11
    b.committed_seq = 1
    assert held.lowest() == 12
    a.committed_seq = 5
    assert held.lowest() is None


def test_a_deposed_writers_records_stay_until_the_group_is_reset():
    held = UnshippedRecords()
    old, new = Writer(7, committed_seq=2), Writer(7, committed_seq=4)
    held.written(old, 4, 20)  # never committed: the old primary was deposed
    held.written(new, 5, 30)
    new.committed_seq = 5
    assert held.lowest() == 20  # kept while nothing set them aside
    held.forget(7)              # set aside (or dropped), the state reset
    assert held.lowest() is None
    held.forget(7)              # (a group never written: nothing)


def test_notes_of_committed_records_go_as_records_are_written():
    """A busy primary between snapshots keeps only the notes of what is in
    flight, not one for every write since the last snapshot."""
    held = UnshippedRecords()
    writer = Writer(3)
    for seq in range(1, 10_001):
        held.written(writer, seq, 100 + seq)
        writer.committed_seq = seq - 1  # its log commits one behind
    assert len(held._held[3]) <= 2
    assert held.lowest() == 100 + 10_000
