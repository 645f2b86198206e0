"""The dedupe table: packed entries give back exactly what was remembered."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rankd.engine.dedupe import DedupeTable

scores = st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False))
results = st.tuples(scores, st.one_of(st.none(), st.integers(1, 2**32)), scores, st.booleans(),
                    st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=64))
event_ids = st.sampled_from([f"e{i}" for i in range(6)] + ["ü-1", "x" * 128])


@given(st.lists(st.tuples(event_ids, st.floats(0, 100), results), max_size=20),
       st.floats(0, 100))
def test_the_table_behaves_like_a_dict_in_insertion_order(entries, now):
    table = DedupeTable()
    model: dict[str, tuple[float, tuple]] = {}
    for event_id, expires_at, result in entries:
        table.remember(event_id, expires_at, result)
        model.pop(event_id, None)  # remembered again: moves to the end
        model[event_id] = (expires_at, result)
    assert list(table.items()) == [(e, x, r) for e, (x, r) in model.items()]
    for event_id in {e for e, _, _ in entries}:
        expires_at, result = model[event_id]
        assert table.get(event_id, now) == (result if expires_at > now else None)
    # Expiry walks from the front and stops at the first live entry.
    expired = 0
    for expires_at, _ in model.values():
        if expires_at > now:
            break
        expired += 1
    assert table.expire(now) == expired
    assert list(table.items()) == [(e, x, r) for e, (x, r) in list(model.items())[expired:]]

    # Both snapshot forms load back the same table: unpacked (older) and packed.
    for load in ("load", "load_packed"):
        copy = DedupeTable()
        if load == "load":
            copy.load(table.items())
        else:
            copy.load_packed(list(table.packed()), list(table.packed().values()))
        assert list(copy.items()) == list(table.items())


def test_a_packed_entry_too_short_to_hold_a_result_is_refused():
    table = DedupeTable()
    with pytest.raises(ValueError, match="1 event ids but 2 entries"):
        table.load_packed(["e1"], [b"\x00" * 40, b"\x00" * 40])
    with pytest.raises(ValueError, match="too short"):
        table.load_packed(["e1"], [b"\x00" * 8])
    assert len(table) == 0


def test_negative_zero_and_none_survive_packing():
    table = DedupeTable()
    table.remember("a", 10.0, (-0.0, None, None, False, "ann"))
    score, rank, previous, changed, member = table.get("a", 0.0)
    assert str(score) == "-0.0" and (rank, previous, changed, member) == (None, None, False, "ann")
