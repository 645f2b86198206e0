"""The dedupe table and its two stores (the native PackedLog and the pure
DictLog): packed entries give back exactly what was remembered, in
arrival order, expiring from the front."""

from __future__ import annotations

import struct
import sys
from collections.abc import Callable, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import native
from rankd.engine.dedupe import DedupeTable, DictLog

scores = st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False))
results = st.tuples(scores, st.one_of(st.none(), st.integers(1, 2**32)), scores, st.booleans(),
                    st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=64))
event_ids = st.sampled_from([f"e{i}" for i in range(6)] + ["ü-1", "x" * 128])


@pytest.fixture(scope="module", params=["python", "native", "native, resizing slowly"])
def store(request: pytest.FixtureRequest) -> Iterator[type]:
    """Each store class in turn; the native one also with its slot table
    resizes moving one record a put (32 by default), so that a resize is
    under way across many puts, lookups and expiries."""
    if request.param == "python":
        yield DictLog
        return
    log = native("rankd.engine._dedupe", "PackedLog")
    if request.param == "native":
        yield log
        return
    module = sys.modules[log.__module__]
    module._set_moves_per_put(1)
    try:
        yield log
    finally:
        module._set_moves_per_put(32)


@pytest.fixture(scope="module")
def table(store: type) -> Callable[[], DedupeTable]:
    """New ``DedupeTable``s on that store."""
    return lambda: DedupeTable(store())


def entry(expires_at: float, tag: bytes = b"m") -> bytes:
    return struct.pack("<dddqB", expires_at, 0.0, 0.0, 0, 0) + tag


contents = st.one_of(st.none(), st.integers(0, 2**64 - 1))


@given(entries=st.lists(st.tuples(event_ids, st.floats(0, 100), results, contents),
                        max_size=20),
       now=st.floats(0, 100))
def test_the_table_behaves_like_a_dict_in_insertion_order(table, entries, now):
    t = table()
    model: dict[str, tuple[float, tuple]] = {}
    for event_id, expires_at, result, content in entries:
        t.remember(event_id, expires_at, result, content)
        model.pop(event_id, None)  # remembered again: moves to the end
        model[event_id] = (expires_at, (*result, content))
    assert list(t.items()) == [(e, x, r) for e, (x, r) in model.items()]
    for event_id in {e for e, _, _, _ in entries}:
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


def expire_model(model: dict[str, bytes], now: float) -> list[str]:
    """Drop the model's entries from the front that expire at or before
    ``now``, up to the first live one; return their ids."""
    gone = []
    for event_id, packed in model.items():
        if struct.unpack_from("<d", packed)[0] > now:
            break
        gone.append(event_id)
    for event_id in gone:
        del model[event_id]
    return gone


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
            assert log.expire(clock) == len(expire_model(model, clock))
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


def test_iterating_items_while_the_table_changes_is_refused():
    log = native("rankd.engine._dedupe", "PackedLog")()
    for i in range(10):
        log.put(f"e{i}", entry(i))
    items = log.items()
    next(items)
    log.put("late", entry(100))
    with pytest.raises(RuntimeError, match="changed during iteration"):
        next(items)


def read_chunk(chunk: bytes) -> list[tuple[str, bytes]]:
    """The ``(event id, entry)`` pairs of a portable log chunk."""
    pairs, offset = [], 0
    while offset < len(chunk):
        id_size, entry_size = struct.unpack_from("<HH", chunk, offset)
        offset += 4
        pairs.append((chunk[offset:offset + id_size].decode(),
                      chunk[offset + id_size:offset + id_size + entry_size]))
        offset += id_size + entry_size
    return pairs


@pytest.fixture
def renumbering_often():
    """The native log renumbers its logical offsets once past 64 bytes
    (instead of 2**40), so that tests reach it."""
    module = pytest.importorskip("rankd.engine._dedupe")
    module._set_rebase_at(64)
    yield
    module._set_rebase_at(1 << 40)


@pytest.mark.parametrize("live", [3, 0])
def test_log_chunks_go_on_across_a_compaction_and_a_restart_of_the_offsets(
        store, renumbering_often, live):
    """After the first chunk, the front expires and new ids arrive.  With
    a few ids still live, the full log is compacted and its offsets
    renumbered; with none, the emptied log starts again at offset 0.
    Either way the chunks go on with the ids still live, not the new ones."""
    log = store()
    for i in range(10):
        log.put(f"old-{i}", entry(1))
    for i in range(live):
        log.put(f"live-{i}", entry(100))
    chunks = log.log_chunks(1)
    assert [e for e, _ in read_chunk(next(chunks))] == ["old-0"]
    assert log.expire(1) == 10
    for i in range(10):
        log.put(f"new-{i}", entry(100))
    assert [e for chunk in chunks for e, _ in read_chunk(chunk)] == [
        f"live-{i}" for i in range(live)]
    assert [e for chunk in log.log_chunks(1) for e, _ in read_chunk(chunk)] == [
        *(f"live-{i}" for i in range(live)), *(f"new-{i}" for i in range(10))]


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # a constant setting
@given(ops=st.lists(st.one_of(
    st.tuples(st.just("put"), st.integers(0, 120), st.integers(0, 1000)),
    st.tuples(st.just("expire"), st.integers(0, 400)),
    st.tuples(st.just("chunk"), st.integers(0, 3)),
), max_size=300), max_bytes=st.sampled_from([1, 60, 200, 1 << 20]))
def test_log_chunks_taken_while_the_table_changes(store, renumbering_often, ops, max_bytes):
    """A snapshot takes the chunks while ids arrive and expire (and the
    log grows, compacts and renumbers its offsets): they hold, in order,
    the entries of when the first chunk was taken, every one of them not
    expired or remembered again since, and nothing newer."""
    log = store()
    model: dict[str, bytes] = {}
    clock = 0
    chunks = None
    taken: list[tuple[str, bytes]] = []
    at_start: list[tuple[str, bytes]] = []
    touched: set[str] = set()  # expired or remembered again since the first chunk
    for op in ops:
        if op[0] == "put":
            event_id = f"ev-{op[1]}-" + "z" * (op[1] % 29)
            packed = entry(clock + op[2], b"%d" % len(taken))
            log.put(event_id, packed)
            touched.add(event_id)
            model.pop(event_id, None)
            model[event_id] = packed
        elif op[0] == "expire":
            clock += op[1]
            gone = expire_model(model, clock)
            touched.update(gone)
            assert log.expire(clock) == len(gone)
        elif chunks is None:
            chunks = log.log_chunks(max_bytes)
            at_start, touched = list(model.items()), set()
            taken += read_chunk(next(chunks, b""))
        else:
            for _ in range(op[1]):
                taken += read_chunk(next(chunks, b""))
    if chunks is None:
        return
    taken += [pair for chunk in chunks for pair in read_chunk(chunk)]
    # In order, from the entries of the start...
    positions = [at_start.index(pair) for pair in taken]
    assert positions == sorted(set(positions))
    # ...every one of them that nothing touched since.
    assert {pair for pair in at_start if pair[0] not in touched} <= set(taken)


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
    score, rank, previous, changed, member, content = t.get("a", 0.0)
    assert str(score) == "-0.0" and (rank, previous, changed, member) == (None, None, False, "ann")
    assert content is None  # remembered without a fingerprint, as older snapshots hold them


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


def test_a_big_table_finds_every_id_while_it_grows_and_churns(store):
    """Past the sizes where the native table maps its memory (a log from 2
    MiB, slot tables from 2 MiB), with resizes under way while ids arrive,
    are remembered again and expire in waves: every live id is found,
    every expired or never-seen one is not, and the order stays that of
    arrival."""
    log = store()
    model: dict[str, bytes] = {}
    forgotten = 0
    for wave in range(8):
        for i in range(40_000):
            event_id = f"w{wave}-{i}"
            model[event_id] = entry(wave, b"n%d" % (i % 11))
            log.put(event_id, model[event_id])
            if i % 7 == 0 and wave:  # remembered again: moves to the end
                again = f"w{wave - 1}-{i}"
                if again in model:
                    del model[again]
                    model[again] = entry(wave, b"again")
                    log.put(again, model[again])
            if i % 4_999 == 0:
                for probe in (f"w{wave}-{i}", f"w{wave - 1}-{i + 1}", f"w{wave - 3}-{i}",
                              f"w{wave - 4}-{i + 2}", f"never-{i}"):
                    assert log.get(probe) == model.get(probe)
        expired = [e for e, packed in model.items()
                   if struct.unpack_from("<d", packed)[0] <= wave - 3]
        assert log.expire(wave - 3 + 0.5) == len(expired)
        for event_id in expired:
            del model[event_id]
        assert len(log) == len(model)
        assert all(log.get(event_id) is None for event_id in expired[::97])
        forgotten += len(expired)
    assert forgotten > 100_000 and len(model) > 100_000
    assert all(log.get(event_id) == packed for event_id, packed in model.items())
    assert list(log.items()) == list(model.items())
