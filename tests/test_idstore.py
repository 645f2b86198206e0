"""The compact event-id store (``rankd.engine._idstore`` and its twin in
``rankd.engine.idstore``): a model test against a dict, fingerprints
shared by both, the portable form, and old snapshots turned into
fingerprints."""

from __future__ import annotations

import math
import os
import pathlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from rankd.engine import idstore
from rankd.engine.dedupe import fingerprint
from rankd.engine.idstore import CONFLICT, FingerprintDict, load_old_chunk, siphash13

_idstore = pytest.importorskip("rankd.engine._idstore")
STORES = [_idstore.FingerprintLog, FingerprintDict]
CHUNK_HEAD_SIZE, PORTABLE_SIZE = idstore.CHUNK_HEAD.size, idstore.PORTABLE.size
OLD_CHUNK = pathlib.Path(__file__).parent / "data" / "dedupe-log-2026-11.bin"


@pytest.fixture
def small_blocks():
    """Tables made meanwhile keep a time per 4 records, move 1 record a put
    during a resize (so resizes stay under way), and renumber early."""
    _idstore._set_block_bits(2)
    _idstore._set_moves_per_put(1)
    _idstore._set_rebase_at(64)
    _idstore._set_min_slots(4)
    idstore.BLOCK_BITS = 2
    yield
    _idstore._set_min_slots(64)
    _idstore._set_block_bits(10)
    _idstore._set_moves_per_put(32)
    _idstore._set_rebase_at(1 << 31)
    idstore.BLOCK_BITS = 10


def same_keys(a, b) -> None:
    """Make ``b`` fingerprint as ``a`` does (through the portable form)."""
    a.put("seed", 1.0, "m", 1, (1.0, 1, None, True))
    b.load_log(next(a.log_chunks(1 << 20)))
    assert a.key == b.key


@given(st.binary(max_size=40), st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))
def test_siphash_twin_matches_native(data, k0, k1):
    native = _idstore.FingerprintLog()
    # The native id fingerprint is the hash's top 56 bits, under its own key.
    text = data.decode("latin-1")
    assert native.id_fingerprint(text) == siphash13(native.k0, native.k1,
                                                     text.encode()) >> 8
    assert siphash13(k0, k1, data) < 2**64


def test_fingerprints_agree_between_native_and_python():
    native, python = _idstore.FingerprintLog(), FingerprintDict()
    same_keys(native, python)
    for text in ["", "a", "abcdefgh", "x" * 17, "é" * 9, "550e8400-e29b-41d4-a716-446655440000"]:
        assert native.id_fingerprint(text) == python.id_fingerprint(text)
        for content in (None, 0, 2**64 - 1, fingerprint(True, 2.5, "gold")):
            assert native.payload_fingerprint(text, content) == python.payload_fingerprint(
                text, content)


@pytest.mark.parametrize("store", STORES)
def test_retry_conflict_and_unknown(store):
    table = store()
    content = fingerprint(False, 10.0, None)
    table.put("e1", 100.0, "alice", content, (10.0, 1, None, True))
    assert table.get("e1", "alice", content, 50.0) == (10.0, 1, None, True)
    assert table.get("e1", "bob", content, 50.0) is CONFLICT  # another member
    assert table.get("e1", "alice", fingerprint(False, 11.0, None), 50.0) is CONFLICT
    assert table.get("e1", "alice", fingerprint(True, 10.0, None), 50.0) is CONFLICT
    assert table.get("e1", "alice", fingerprint(False, 10.0, "x"), 50.0) is CONFLICT
    assert table.get("e2", "alice", content, 50.0) is None
    assert table.get("e1", "alice", content, 100.0) is None  # expired (not yet forgotten)


@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("answer", [
    (1e300, 5_000_000_000, 3.0, True),          # wide: score and rank
    (-0.0, 1, 0.0, False),                      # -0.0 is not an int32
    (2.5, 2**32 - 1, -2147483648.0, True),      # the int32 edges
    (2147483648.0, 0, None, True),
    (math.inf, None, -math.inf, False),
    (None, None, None, False),
])
def test_answers_round_trip_exactly(store, answer):
    table = store()
    table.put("e", 100.0, "m", 7, answer)
    got = table.get("e", "m", 7, 1.0)
    assert got == answer
    if answer[0] == 0.0:
        assert math.copysign(1, got[0]) == math.copysign(1, answer[0])
    other = store()
    other.load_log(b"".join(table.log_chunks(1 << 20)))
    assert other.get("e", "m", 7, 1.0) == answer


@pytest.mark.parametrize("store", STORES)
def test_bad_input_is_refused_and_changes_nothing(store):
    table = store()
    table.put("e", 100.0, "m", 7, (1.0, 1, None, True))
    chunk = next(table.log_chunks(1 << 20))
    with pytest.raises(ValueError):
        table.put("", 100.0, "m", 7, (1.0, 1, None, True))
    with pytest.raises(ValueError):
        table.put("x" * 65536, 100.0, "m", 7, (1.0, 1, None, True))
    with pytest.raises(ValueError):
        table.put_fingerprint(1 << 56, 0, 100.0, (1.0, 1, None, True))
    for bad in (chunk[:-1], b"XXXX" + chunk[4:], chunk[:20] + b"\xff" * 8 + chunk[28:]):
        with pytest.raises(ValueError):
            table.load_log(bad)
    other = store()
    other.put("o", 100.0, "m", 7, (1.0, 1, None, True))
    with pytest.raises(ValueError, match="other fingerprint keys"):
        other.load_log(chunk)
    assert len(table) == 1 and len(other) == 1
    assert table.get("e", "m", 7, 1.0) == (1.0, 1, None, True)


@pytest.mark.parametrize("store", STORES)
def test_a_block_lives_until_its_newest_expiry(store, small_blocks):
    table = store()
    for n in range(6):  # blocks of 4: [0..3] [4, 5]
        table.put(f"e{n}", 100.0 + n, "m", n, (float(n), n, None, True))
    # e0 expires at 100 alone, but its block lives until e3's 103.
    assert table.get("e0", "m", 0, 101.0) == (0.0, 0, None, True)
    assert table.expire(102.5) == 0
    assert table.get("e0", "m", 0, 103.0) is None
    assert table.expire(103.0) == 4
    assert len(table) == 2 and table.get("e4", "m", 4, 103.0) == (4.0, 4, None, True)


@pytest.mark.parametrize("store", STORES)
def test_old_snapshot_chunk_turns_into_fingerprints(store):
    """A dedupe section written by the code before this store
    (``tests/data/dedupe-log-2026-11.bin``: ``DedupeTable.log_chunks``
    of main at 19:05) loads as fingerprints, with the same answers."""
    table = store()
    assert load_old_chunk(table, OLD_CHUNK.read_bytes()) == 5
    assert len(table) == 5
    c1 = fingerprint(False, 10.0, None)
    assert table.get("evt-1", "player:000000000001", c1, 500.0) == (10.0, 1, None, True)
    assert table.get("evt-1", "player:000000000009", c1, 500.0) is CONFLICT
    assert table.get("evt-1", "player:000000000001", fingerprint(False, 11.0, None),
                     500.0) is CONFLICT
    assert table.get("evt-2", "player:000000000002", fingerprint(True, 5.0, "gold"),
                     500.0) == (15.0, 2, 10.0, True)
    assert table.get("550e8400-e29b-41d4-a716-446655440000", "joueur:é",
                     fingerprint(False, 2.5, None), 500.0) == (2.5, 3, -0.0, False)
    # Written before there was a content fingerprint: checked on its member alone.
    assert table.get("evt-old", "player:000000000004", 12345, 500.0) == (
        None, None, None, False)
    assert table.get("evt-old", "someone-else", 12345, 500.0) is CONFLICT
    assert table.get("evt-big", "p5", fingerprint(False, 1e300, "l"), 500.0) == (
        1e300, 5000000000, 3.0, True)
    # The old expiries are kept, per block: all five share one, the latest.
    assert table.get("evt-1", "player:000000000001", c1, 1003.9) == (10.0, 1, None, True)
    assert table.get("evt-1", "player:000000000001", c1, 1004.0) is None
    with pytest.raises(ValueError):
        load_old_chunk(table, OLD_CHUNK.read_bytes()[:-3])
    assert len(table) == 5


def test_native_and_python_read_each_others_chunks(small_blocks):
    native, python = _idstore.FingerprintLog(), FingerprintDict()
    for n in range(50):
        native.put(f"id-{n}", 100.0 + n, f"m{n}", n, (float(n), n, float(n - 1), n % 2 == 0))
    for chunk in native.log_chunks(200):
        python.load_log(chunk)
    again = _idstore.FingerprintLog()
    for chunk in python.log_chunks(300):
        again.load_log(chunk)
    assert list(native.items()) == list(python.items()) == list(again.items())
    assert again.get("id-7", "m7", 7, 1.0) == (7.0, 7, 6.0, False)


ANSWERS = st.tuples(
    st.one_of(st.none(), st.integers(-2**31, 2**31 - 1).map(float),
              st.floats(allow_nan=False, width=64)),
    st.one_of(st.none(), st.integers(0, 2**40)),
    st.one_of(st.none(), st.integers(-5, 5).map(float), st.floats(allow_nan=False)),
    st.booleans())


class StoreModel(RuleBasedStateMachine):
    """Both stores against a dict model, with blocks of 4 records, tables
    of 4 slots at first (so they grow often), resizes under way across
    operations, and early renumbering."""

    @initialize()
    def start(self):
        _idstore._set_block_bits(2)
        _idstore._set_moves_per_put(1)
        _idstore._set_rebase_at(64)
        _idstore._set_min_slots(4)
        idstore.BLOCK_BITS = 2
        self.stores = [_idstore.FingerprintLog(), FingerprintDict()]
        same_keys(self.stores[0], self.stores[1])
        # id -> (member, content, answer, sequence number); block -> latest expiry
        self.model = {"seed": ("m", 1, (1.0, 1, None, True), 0)}
        self.blocks = {0: 1.0}
        self.seq = 1
        self.head_block = 0
        self.now = 0.0

    def teardown(self):
        _idstore._set_min_slots(64)
        _idstore._set_block_bits(10)
        _idstore._set_moves_per_put(32)
        _idstore._set_rebase_at(1 << 31)
        idstore.BLOCK_BITS = 10

    def _live(self, event_id):
        entry = self.model.get(event_id)
        return entry is not None and self.blocks[entry[3] >> 2] > self.now

    @rule(n=st.integers(0, 40), member=st.sampled_from(["a", "b"]),
          content=st.integers(0, 3), answer=ANSWERS, ttl=st.floats(1, 20))
    def put(self, n, member, content, answer, ttl):
        event_id = f"id-{n}"
        for store in self.stores:
            store.put(event_id, self.now + ttl, member, content, answer)
        block = self.seq >> 2
        if self.seq % 4 == 0 or self.blocks[block] < self.now + ttl:
            self.blocks[block] = self.now + ttl
        self.model.pop(event_id, None)
        self.model[event_id] = (member, content, answer, self.seq)
        self.seq += 1

    @rule(n=st.integers(0, 40), member=st.sampled_from(["a", "b"]), content=st.integers(0, 3))
    def get(self, n, member, content):
        event_id = f"id-{n}"
        if not self._live(event_id):
            expected = None
        else:
            m, c, answer, _ = self.model[event_id]
            expected = answer if (m, c) == (member, content) else CONFLICT
        for store in self.stores:
            got = store.get(event_id, member, content, self.now)
            assert got == expected or (got is expected)

    @rule(step=st.floats(0, 10))
    def expire(self, step):
        """Whole blocks from the front, up to the first live one (even if
        it holds superseded entries only)."""
        self.now += step
        gone = []
        last = (self.seq - 1) >> 2
        while self.head_block <= last and self.blocks[self.head_block] <= self.now:
            end = (self.head_block + 1) * 4
            dropped = [event_id for event_id, entry in self.model.items() if entry[3] < end]
            for event_id in dropped:
                del self.model[event_id]
            gone += dropped
            if end > self.seq:
                break
            self.head_block += 1
        for store in self.stores:
            assert store.expire(self.now) == len(gone)

    @rule(cross=st.booleans(), max_bytes=st.integers(1, 400))
    def snapshot_round_trip(self, cross, max_bytes):
        """Each store into a fresh one (of the other kind if ``cross``):
        entries keep their block's expiry, in new blocks."""
        if not self.model:
            return  # (an empty table writes no chunk, so a fresh one keeps its own keys)
        fresh = [type(store)() for store in self.stores]
        if cross:
            fresh.reverse()
        for store, into in zip(self.stores, fresh, strict=True):
            for chunk in store.log_chunks(max_bytes):
                into.load_log(chunk)
        self.stores = fresh if not cross else fresh[::-1]
        model, old_blocks, self.blocks = self.model, self.blocks, {}
        self.model = {}
        for seq, (event_id, (member, content, answer, old)) in enumerate(model.items()):
            expires_at = old_blocks[old >> 2]
            if seq % 4 == 0 or self.blocks[seq >> 2] < expires_at:
                self.blocks[seq >> 2] = expires_at
            self.model[event_id] = (member, content, answer, seq)
        self.seq = len(self.model)
        self.head_block = 0

    @invariant()
    def same_contents(self):
        assert len(self.stores[0]) == len(self.stores[1]) == len(self.model)
        native, python = (list(store.items()) for store in self.stores)
        assert native == python
        assert [fp for fp, *_ in native] == [
            self.stores[1].id_fingerprint(event_id) for event_id in self.model]


StoreModel.TestCase.settings = settings(max_examples=60, stateful_step_count=60,
                                        deadline=None)
TestStoreModel = StoreModel.TestCase


def test_many_ids_with_growth_and_compaction():
    """Enough ids for several resizes and compactions of the native store,
    against a dict."""
    table = _idstore.FingerprintLog()
    ids = [os.urandom(8).hex() for _ in range(60_000)]
    for n, event_id in enumerate(ids):
        table.put(event_id, 1000.0 + n // 1024, "m", n, (float(n), n, None, True))
        if n % 5000 == 4999:
            table.expire(1000.0 + (n - 20_000) // 1024)
    now = 1000.0 + (len(ids) - 20_000) // 1024
    table.expire(now)
    live = {event_id: n for n, event_id in enumerate(ids) if 1000.0 + n // 1024 > now}
    assert len(table) == len(live)
    for n, event_id in enumerate(ids):
        got = table.get(event_id, "m", n, now)
        assert got == ((float(n), n, None, True) if event_id in live else None)


@pytest.mark.parametrize("store", STORES)
def test_log_chunks_taken_while_the_table_changes(store, small_blocks):
    """A snapshot takes chunks while ids keep arriving: they hold the ids
    remembered when the first was taken, less those expired or remembered
    again since, and nothing remembered later."""
    table = store()
    for n in range(200):
        table.put(f"id-{n}", 100.0 + n // 4, "m", n, (float(n), n, None, True))
    chunks = table.log_chunks(CHUNK_HEAD_SIZE + 10 * PORTABLE_SIZE)
    taken = [next(chunks)]
    for n in range(200, 400):  # arrivals, growth, expiry and compaction meanwhile
        table.put(f"id-{n}", 100.0 + n // 4, "m", n, (float(n), n, None, True))
    table.put("id-150", 500.0, "m", 999, (0.0, 0, None, False))  # remembered again
    table.expire(120.0)  # forgets id-0 .. id-83
    taken += list(chunks)
    loaded = store()
    for chunk in taken:
        loaded.load_log(chunk)
    ids = {fp for fp, *_ in loaded.items()}
    expected = {table.id_fingerprint(f"id-{n}")
                for n in [*range(10), *range(84, 200)] if n != 150}
    assert ids == expected
    assert loaded.get("id-120", "m", 120, 0.0) == (120.0, 120, None, True)


@pytest.mark.parametrize("store", STORES)
def test_iterating_items_while_the_table_changes_is_refused(store):
    table = store()
    table.put("a", 100.0, "m", 1, (1.0, 1, None, True))
    table.put("b", 100.0, "m", 1, (1.0, 1, None, True))
    items = table.items()
    next(items)
    table.put("c", 100.0, "m", 1, (1.0, 1, None, True))
    with pytest.raises(RuntimeError):
        list(items)
