"""The dedupe table and its two stores (the native PackedLog and the pure
DictLog): packed entries give back exactly what was remembered, in
arrival order, expiring from the front."""

from __future__ import annotations

import struct
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import native
from rankd.engine.dedupe import DedupeTable, DictLog

scores = st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False))
results = st.tuples(scores, st.one_of(st.none(), st.integers(1, 2**32)), scores, st.booleans(),
                    st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=64))
event_ids = st.sampled_from([f"e{i}" for i in range(6)] + ["ü-1", "x" * 128])


@pytest.fixture(scope="module", params=["python", "native"])
def store(request: pytest.FixtureRequest) -> type:
    """Each store class in turn."""
    if request.param == "python":
        return DictLog
    return native("rankd.engine._dedupe", "PackedLog")


@pytest.fixture(scope="module")
def table(store: type) -> Callable[[], DedupeTable]:
    """New ``DedupeTable``s on that store."""
    return lambda: DedupeTable(store())


def entry(expires_at: float, tag: bytes = b"m") -> bytes:
    return struct.pack("<dddqB", expires_at, 0.0, 0.0, 0, 0) + tag


@given(entries=st.lists(st.tuples(event_ids, st.floats(0, 100), results), max_size=20),
       now=st.floats(0, 100))
def test_the_table_behaves_like_a_dict_in_insertion_order(table, entries, now):
    t = table()
    model: dict[str, tuple[float, tuple]] = {}
    for event_id, expires_at, result in entries:
        t.remember(event_id, expires_at, result)
        model.pop(event_id, None)  # remembered again: moves to the end
        model[event_id] = (expires_at, result)
    assert list(t.items()) == [(e, x, r) for e, (x, r) in model.items()]
    for event_id in {e for e, _, _ in entries}:
        expires_at, result = model[event_id]
        assert t.get(event_id, now) == (result if expires_at > now else None)
    # Expiry walks from the front and stops at the first live entry.
    expired = 0
    for expires_at, _ in model.values():
        if expires_at > now:
            break
        expired += 1
    assert t.expire(now) == expired
    assert len(t) == len(model) - expired
    assert list(t.items()) == [(e, x, r) for e, (x, r) in list(model.items())[expired:]]

    # Every snapshot form loads back the same table: the log (current),
    # columns of packed entries and unpacked entries (older).
    for load in ("load_log", "load_packed", "load"):
        copy = table()
        if load == "load_log":
            for chunk in t.log_chunks(64):
                copy.load_log(chunk)
        elif load == "load_packed":
            pairs = t.packed_items()
            copy.load_packed([e for e, _ in pairs], [p for _, p in pairs])
        else:
            copy.load(t.items())
        assert list(copy.items()) == list(t.items())


operations = st.lists(st.one_of(
    st.tuples(st.just("put"), st.integers(0, 300), st.integers(0, 1000),
              st.binary(max_size=40)),
    st.tuples(st.just("expire"), st.integers(0, 1000)),
    st.tuples(st.just("get"), st.integers(0, 300)),
), max_size=400)


@settings(max_examples=200)
@given(ops=operations)
def test_the_stores_match_an_ordered_dict_through_growth_and_compaction(store, ops):
    """Enough ids, of varied sizes, to grow the slots and the log, expire
    fronts and compact them; every answer matches a dict in arrival order."""
    log = store()
    model: dict[str, bytes] = {}
    clock = 0
    for op in ops:
        if op[0] == "put":
            _, n, ttl, tag = op
            event_id = f"ev-{n}-" + "z" * (n % 37)
            packed = entry(clock + ttl, tag)
            log.put(event_id, packed)
            model.pop(event_id, None)
            model[event_id] = packed
        elif op[0] == "expire":
            clock += op[1]
            expired = 0
            for packed in model.values():
                if struct.unpack_from("<d", packed)[0] > clock:
                    break
                expired += 1
            for event_id in list(model)[:expired]:
                del model[event_id]
            assert log.expire(clock) == expired
        else:
            event_id = f"ev-{op[1]}-" + "z" * (op[1] % 37)
            assert log.get(event_id) == model.get(event_id)
        assert len(log) == len(model)
    assert list(log.items()) == list(model.items())
    for event_id, packed in model.items():
        assert log.get(event_id) == packed
    chunks = list(log.log_chunks(100))
    assert all(chunks)
    copy = store()
    assert sum(copy.load_log(chunk) for chunk in chunks) == len(model)
    assert list(copy.items()) == list(model.items())


def test_both_stores_write_the_same_portable_log(table):
    native_log = native("rankd.engine._dedupe", "PackedLog")()
    python_log = DictLog()
    for log in (native_log, python_log):
        for i in range(1000):
            log.put(f"e{i}", entry(i, b"member-%d" % i))
        log.put("e3", entry(5000))  # again: moves to the end
        log.expire(10.5)
    assert list(native_log.log_chunks(1 << 20)) == list(python_log.log_chunks(1 << 20))


def test_a_million_ids_are_found_and_expired(store):
    log = store()
    for i in range(1_000_000):
        log.put(f"event-{i}", entry(i))
    assert len(log) == 1_000_000
    assert log.get("event-999999") == entry(999_999)
    assert log.get("event-1000000") is None
    assert log.expire(499_999.5) == 500_000
    assert log.get("event-499999") is None and log.get("event-500000") == entry(500_000)
    log.put("event-0", entry(2_000_000))
    assert len(log) == 500_001
    assert next(iter(log.items()))[0] == "event-500000"


def test_iterating_while_the_table_changes_is_refused():
    log = native("rankd.engine._dedupe", "PackedLog")()
    for i in range(10):
        log.put(f"e{i}", entry(i))
    items = log.items()
    next(items)
    log.put("late", entry(100))
    with pytest.raises(RuntimeError, match="changed during iteration"):
        next(items)
    chunks = log.log_chunks(10)
    next(chunks)
    log.expire(3)
    with pytest.raises(RuntimeError, match="changed during iteration"):
        next(chunks)


@pytest.mark.parametrize("chunk, message", [
    (b"\x02\x00", "inside an entry header"),
    (struct.pack("<HH", 0, 40) + b"x" * 40, "empty event id"),
    (struct.pack("<HH", 2, 8) + b"e1" + b"x" * 8, "too short"),
    (struct.pack("<HH", 2, 40) + b"e1" + b"x" * 39, "inside an entry"),
])
def test_a_malformed_log_chunk_is_refused_and_changes_nothing(store, chunk, message):
    log = store()
    good = struct.pack("<HH", 2, len(entry(5))) + b"ok" + entry(5)
    with pytest.raises(ValueError, match=message):
        log.load_log(good + chunk)
    assert len(log) == 0


def test_oversized_ids_and_short_entries_are_refused(store):
    log = store()
    with pytest.raises(ValueError, match="event id must be 1 to 65535 bytes"):
        log.put("x" * 65536, entry(1))
    with pytest.raises(ValueError, match="event id must be 1 to 65535 bytes"):
        log.put("", entry(1))
    with pytest.raises(ValueError, match="packed dedupe entry must be 33"):
        log.put("e", b"\x00" * 32)
    assert len(log) == 0


def test_a_packed_entry_too_short_to_hold_a_result_is_refused(table):
    t = table()
    with pytest.raises(ValueError, match="1 event ids but 2 entries"):
        t.load_packed(["e1"], [b"\x00" * 40, b"\x00" * 40])
    with pytest.raises(ValueError, match="too short"):
        t.load_packed(["e1"], [b"\x00" * 8])
    assert len(t) == 0


def test_negative_zero_and_none_survive_packing(table):
    t = table()
    t.remember("a", 10.0, (-0.0, None, None, False, "ann"))
    score, rank, previous, changed, member = t.get("a", 0.0)
    assert str(score) == "-0.0" and (rank, previous, changed, member) == (None, None, False, "ann")


def test_a_day_of_churn_keeps_every_live_id_and_forgets_every_expired_one(store):
    """Ids arrive and expire in waves, as on a busy board: expired fronts
    are dropped and compacted away, and slots freed amid their neighbours'
    probe runs, over and over; every live id stays findable, in order."""
    log = store()
    model: dict[str, bytes] = {}
    for wave in range(30):
        for i in range(3000):
            event_id = f"w{wave}-{i}" + "p" * (i % 23)
            model[event_id] = entry(wave, b"x" * (i % 7))
            log.put(event_id, model[event_id])
        expired = [e for e, packed in model.items()
                   if struct.unpack_from("<d", packed)[0] <= wave - 3]
        assert log.expire(wave - 3 + 0.5) == len(expired)
        for event_id in expired:
            del model[event_id]
            assert log.get(event_id) is None
        assert len(log) == len(model)
        assert all(log.get(event_id) == packed for event_id, packed in model.items())
    assert list(log.items()) == list(model.items())
