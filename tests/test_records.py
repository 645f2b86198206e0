"""WAL and snapshot payload encoding (rankd.engine.records)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rankd.engine import records

keys = st.text(max_size=20)
values = st.one_of(st.binary(max_size=40), st.text(max_size=10), st.integers(-2**63, 2**63 - 1))


@given(st.lists(st.lists(st.tuples(keys, values), min_size=1, max_size=40), max_size=5),
       st.lists(st.one_of(st.text(max_size=5), st.integers(0, 9)), max_size=3))
def test_columns_in_chunks_decode_as_one_pair_of_arrays(chunks, head):
    pieces = [([k for k, _ in chunk], [v for _, v in chunk]) for chunk in chunks]
    decoded = records.decode(b"".join(records.encode_columns(head, pieces)))
    assert list(decoded[:-2]) == head
    assert list(decoded[-2]) == [k for chunk in chunks for k, _ in chunk]
    assert list(decoded[-1]) == [v for chunk in chunks for _, v in chunk]
    assert records.decode_columns(decoded[-2], decoded[-1]) == dict(
        pair for chunk in chunks for pair in chunk)


def test_columns_of_different_lengths_are_refused():
    with pytest.raises(ValueError, match="3 keys but 2 values"):
        records.decode_columns(("a", "b", "c"), (1, 2))
