"""The dedupe table on the compact event-id store (native ``FingerprintLog``
and the pure ``FingerprintDict``): a retry is answered with what was
remembered, a conflicting one is told apart, ids expire, and every
snapshot form loads: the new portable one and the older ones (packed-entry
log chunks, columns, unpacked entries), whose ids still deduplicate."""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import native
from rankd.engine import idstore
from rankd.engine.dedupe import CONFLICT, DedupeTable, fingerprint
from rankd.engine.idstore import FingerprintDict

scores = st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False))
answers = st.tuples(scores, st.one_of(st.none(), st.integers(1, 2**32)), scores, st.booleans())
members = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=64)
event_ids = st.sampled_from([f"e{i}" for i in range(6)] + ["ü-1", "x" * 128])


@pytest.fixture(scope="module", params=["python", "native", "native, resizing slowly"])
def store(request: pytest.FixtureRequest) -> Iterator[type]:
    """Each store class in turn; the native one also with its slot table
    resizes moving one record a put, so that resizes stay under way."""
    if request.param == "python":
        yield FingerprintDict
        return
    log = native("rankd.engine._idstore", "FingerprintLog")
    if request.param == "native":
        yield log
        return
    module = pytest.importorskip("rankd.engine._idstore")
    module._set_moves_per_put(1)
    module._set_min_slots(4)
    try:
        yield log
    finally:
        module._set_moves_per_put(32)
        module._set_min_slots(64)


@pytest.fixture(scope="module")
def table(store: type) -> Callable[[], DedupeTable]:
    """New ``DedupeTable``s on that store."""
    return lambda: DedupeTable(store())


def same(answer: tuple) -> tuple:
    """An answer as the store gives it back (numbers as floats, changed a bool)."""
    score, rank, previous, changed = answer
    return (None if score is None else float(score), rank,
            None if previous is None else float(previous), bool(changed))


def test_the_daemon_uses_the_compact_store():
    from rankd.engine.idstore import FingerprintLog
    assert type(DedupeTable().log) is FingerprintLog


@given(entries=st.lists(st.tuples(event_ids, members, st.integers(0, 2**64 - 1), answers),
                        max_size=20))
def test_a_retry_is_answered_and_another_payload_is_a_conflict(table, entries):
    t = table()
    model: dict[str, tuple] = {}
    for event_id, member, content, answer in entries:
        t.remember(event_id, 100.0, answer, member, content)
        model[event_id] = (member, content, same(answer))
    assert len(t) == len(model)
    for event_id, (member, content, answer) in model.items():
        assert t.remembers(event_id, 50.0)
        assert t.get(event_id, member, content, 50.0) == answer
        assert t.get(event_id, member + "x", content, 50.0) is CONFLICT
        assert t.get(event_id, member, content ^ 1, 50.0) is CONFLICT
        assert t.get(event_id, member, content, 100.0) is None  # expired
    assert t.get("never", "m", 0, 50.0) is None and not t.remembers("never", 50.0)


def test_expiry_forgets_ids_once_their_time_is_past(table):
    t = table()
    t.remember("a", 10.0, (1.0, 1, None, True), "ann", 7)
    assert t.get("a", "ann", 7, 9.99) == (1.0, 1, None, True)
    assert t.get("a", "ann", 7, 10.0) is None
    assert t.expire(10.0) == 1 and len(t) == 0 and not t.remembers("a", 0.0)


def test_negative_zero_and_none_survive(table):
    t = table()
    t.remember("a", 10.0, (-0.0, None, None, False), "ann", 1)
    score, rank, previous, changed = t.get("a", "ann", 1, 0.0)
    assert str(score) == "-0.0" and (rank, previous, changed) == (None, None, False)


@given(entries=st.lists(st.tuples(event_ids, members, st.integers(0, 2**64 - 1), answers),
                        max_size=30))
def test_the_portable_form_loads_back_the_same_table(table, entries):
    t = table()
    for event_id, member, content, answer in entries:
        t.remember(event_id, 100.0, answer, member, content)
    copy = table()
    for chunk in t.log_chunks(100):
        copy.load_store(chunk)
    if entries:
        assert copy.log.key == t.log.key  # (adopted: the fingerprints stay valid)
    assert copy.packed_items() == t.packed_items()


# --- the forms written before the compact store ------------------------------------------


def old_entry(expires_at: float, answer: tuple, member: str, content: int | None) -> bytes:
    """A packed entry as ``PackedLog``/``DictLog`` wrote them until 2026-11-29."""
    score, rank, previous, changed = answer
    flags = ((1 if changed else 0) | (2 if score is not None else 0)
             | (4 if previous is not None else 0) | (8 if rank is not None else 0)
             | (16 if content is not None else 0))
    head = struct.pack("<dddqB", expires_at, score or 0.0, previous or 0.0, rank or 0, flags)
    if content is not None:
        head += struct.pack("<Q", content)
    return head + member.encode()


def old_chunk(pairs: list[tuple[str, bytes]]) -> bytes:
    return b"".join(struct.pack("<HH", len(e.encode()), len(p)) + e.encode() + p
                    for e, p in pairs)


OLD = [("e1", (5.0, 1, None, True), "ann", fingerprint(True, 5.0, None)),
       ("e2", (7.0, 1, None, True), "bob", fingerprint(True, 7.0, "gold")),
       ("e3", (3.0, 2, 1.0, True), "cy", None)]  # before there were content fingerprints


@pytest.mark.parametrize("form", ["event_id_log", "event_id_columns", "dedupe"])
def test_every_older_snapshot_form_still_deduplicates(table, form):
    t = table()
    pairs = [(e, old_entry(100.0, a, m, c)) for e, a, m, c in OLD]
    if form == "event_id_log":
        assert t.load_log(old_chunk(pairs)) == 3
    elif form == "event_id_columns":
        t.load_packed([e for e, _ in pairs], [p for _, p in pairs])
    else:
        t.load([(e, 100.0, [*a, m, *([] if c is None else [c])]) for e, a, m, c in OLD])
    assert len(t) == 3
    assert t.get("e1", "ann", fingerprint(True, 5.0, None), 50.0) == (5.0, 1, None, True)
    assert t.get("e1", "ann", fingerprint(True, 6.0, None), 50.0) is CONFLICT
    assert t.get("e1", "bob", fingerprint(True, 5.0, None), 50.0) is CONFLICT
    assert t.get("e2", "bob", fingerprint(True, 7.0, "gold"), 50.0) == (7.0, 1, None, True)
    assert t.get("e2", "bob", fingerprint(True, 7.0, None), 50.0) is CONFLICT
    # An entry without a content fingerprint is checked on its member, as before.
    assert t.get("e3", "cy", 12345, 50.0) == (3.0, 2, 1.0, True)
    assert t.get("e3", "dee", 12345, 50.0) is CONFLICT
    assert t.get("e1", "ann", fingerprint(True, 5.0, None), 100.0) is None
    # And the converted entries go on in the new form.
    copy = table()
    for chunk in t.log_chunks(1 << 20):
        copy.load_store(chunk)
    assert copy.get("e3", "cy", 1, 50.0) == (3.0, 2, 1.0, True)


def test_the_old_fixture_chunk_converts(table):
    chunk = (pytest.importorskip("pathlib").Path(__file__).parent / "data"
             / "dedupe-log-2026-11.bin").read_bytes()
    pairs = idstore.read_old_chunk(chunk)
    t = table()
    assert t.load_log(chunk) == len(pairs) > 0
    for event_id, entry in pairs:
        expires_at, (score, rank, previous, changed, member, content) = (
            idstore.unpack_old_entry(entry))
        assert t.get(event_id, member, content or 0, expires_at - 1) == (
            score, rank, previous, changed)


@pytest.mark.parametrize("chunk, message", [
    (b"\x02\x00", "inside an entry header"),
    (struct.pack("<HH", 0, 40) + b"x" * 40, "empty event id"),
    (struct.pack("<HH", 2, 8) + b"e1" + b"x" * 8, "too short"),
    (struct.pack("<HH", 2, 40) + b"e1" + b"x" * 39, "inside an entry"),
])
def test_a_malformed_old_chunk_is_refused_and_changes_nothing(table, chunk, message):
    t = table()
    good = old_chunk([("ok", old_entry(5.0, (1.0, 1, None, True), "m", 1))])
    with pytest.raises(ValueError, match=message):
        t.load_log(good + chunk)
    assert len(t) == 0


def test_old_columns_of_mismatched_or_short_entries_are_refused(table):
    t = table()
    with pytest.raises(ValueError, match="1 event ids but 2 entries"):
        t.load_packed(["e1"], [b"\x00" * 40, b"\x00" * 40])
    with pytest.raises(ValueError, match="too short"):
        t.load_packed(["e1"], [b"\x00" * 8])
    assert len(t) == 0


def test_a_malformed_new_chunk_is_refused_and_changes_nothing(table):
    t = table()
    t.remember("a", 10.0, (1.0, 1, None, True), "ann", 7)
    chunk = next(t.log_chunks(1 << 20))
    other = table()
    with pytest.raises(ValueError, match="bad size"):
        other.load_store(chunk[:-1])
    with pytest.raises(ValueError, match="not an event-id store chunk"):
        other.load_store(b"XXXX" + chunk[4:])
    assert len(other) == 0
    other.remember("b", 10.0, (1.0, 1, None, True), "bob", 7)
    if other.log.key != t.log.key:
        with pytest.raises(ValueError, match="other fingerprint keys"):
            other.load_store(chunk)
        assert len(other) == 1
