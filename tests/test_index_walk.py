"""Walked dumps (``dump_walk``): a board's records written a piece at a time
while it takes writes between pieces, so a snapshot never holds a board's
writers for the size of the board.

The property a snapshot relies on: the walked dump, loaded, then given the
final state of every member written during the walk (what replaying the log
from before the walk does, its records being absolute states), is the live
index exactly.  Checked for every kind (and across kinds) against random
indexes, piece sizes and writes between pieces, with tiny pieces so that
the walk resumes at every kind of place (a page's end, a removed member,
a tie)."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rankd.index._contract import DUMP_HEADER, DUMP_RECORD, DUMP_RECORD_NO_SEQ
from rankd.index._fallback import RankIndex as Fallback

native = pytest.importorskip("rankd._skiplist")
pages = pytest.importorskip("rankd._pages")
KINDS = {"skiplist": native.RankIndex, "pages": pages.RankIndex, "fallback": Fallback}
MEMBERS = [f"m{i}" for i in range(40)] + ["é" * 3, "a" * 200]


def states(index) -> dict[str, tuple[float, int]]:
    """``member -> (score, seq)`` of ``index``, read from its dump (seq 0 on
    a board tied by member, whose order never reads it: the paged index
    does not keep it)."""
    dump = index.dump()
    _, version, _, _, _, count, _ = DUMP_HEADER.unpack_from(dump)
    record = DUMP_RECORD if version == 1 else DUMP_RECORD_NO_SEQ
    position, found = DUMP_HEADER.size, {}
    for _ in range(count):
        if record is DUMP_RECORD:
            score, seq, length = record.unpack_from(dump, position)
        else:
            (score, length), seq = record.unpack_from(dump, position), 0
        position += record.size
        found[dump[position:position + length].decode()] = (score, seq * (index.tie_break
                                                                            == "first"))
        position += length
    return found


def walked(walk, pieces: list[bytes]) -> bytes:
    body = walk.header() + b"".join(pieces)
    return body + struct.pack("<I", zlib.crc32(body))


write = st.one_of(
    st.tuples(st.just("set"), st.sampled_from(MEMBERS), st.integers(-5, 5)),
    st.tuples(st.just("incr"), st.sampled_from(MEMBERS), st.integers(-3, 3)),
    st.tuples(st.just("remove"), st.sampled_from(MEMBERS), st.just(0)))


def apply(index, op: tuple[str, str, int]) -> None:
    kind, member, value = op
    if kind == "set":
        index.set(member, value)
    elif kind == "incr":
        index.incr(member, value)
    else:
        index.remove(member)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("load_kind", KINDS)
@pytest.mark.parametrize("tie", ["first", "member", "member_desc"])
@settings(max_examples=60, deadline=None)
@given(before=st.lists(write, max_size=80), during=st.lists(st.lists(write, max_size=6),
                                                            max_size=30),
       max_bytes=st.integers(1, 300))
def test_a_walked_dump_and_the_writes_made_meanwhile_are_the_index(
        kind, load_kind, tie, before, during, max_bytes) -> None:
    index = KINDS[kind]("desc", tie)
    for op in before:
        apply(index, op)
    walk = index.dump_walk(max_bytes)
    pieces, written = [], set()
    for piece in walk:
        pieces.append(piece)
        assert len(piece) <= max(max_bytes, DUMP_RECORD.size + 400)
        for op in during.pop() if during else ():
            apply(index, op)
            written.add(op[1])
    loaded = KINDS[load_kind].load(walked(walk, pieces))
    loaded._check()
    live = states(index)
    # The members nobody wrote meanwhile are there as they are live.
    got = states(loaded)
    for member in set(live) | set(got):
        if member not in written:
            assert got.get(member) == live.get(member), member
    # And replaying the writes' final states makes it the live index.
    loaded.set_states([(m, *live[m]) for m in written if m in live])
    for member in written - set(live):
        loaded.remove(member)
    loaded._check()
    assert states(loaded) == live
    assert list(loaded) == list(index)


@pytest.mark.parametrize("kind", KINDS)
def test_a_walk_of_an_unchanged_index_is_its_dump(kind) -> None:
    index = KINDS[kind]("asc", "first")
    for i in range(500):
        index.set(f"p{i % 300}", i % 17)
    walk = index.dump_walk(64)
    dump = walked(walk, list(walk))
    plain = bytearray(index.dump())
    assert dump[:7] == plain[:7] and dump[7] == 1 and plain[7] == 0
    assert dump[8:-4] == plain[8:-4]
    assert list(type(index).load(dump)) == list(index)


@pytest.mark.parametrize("kind", KINDS)
def test_a_repeat_is_refused_unless_the_dump_says_it_was_walked(kind) -> None:
    """A repeated member stays damage in a plain dump; only the walked flag
    lets a loader skip it."""
    index = KINDS[kind]("desc", "first")
    for i in range(50):
        index.set(f"q{i}", i)
    walk = index.dump_walk(30)
    pieces = [next(walk)]
    assert pieces[0].endswith(b"q49")
    index.set("q49", -1)  # from behind the walk to ahead of it: written again
    pieces += list(walk)
    body = bytearray(walk.header() + b"".join(pieces))
    assert body.count(b"q49") == 2
    loaded = type(index).load(bytes(body) + struct.pack("<I", zlib.crc32(body)))
    assert len(loaded) == 50
    body[7] = 0
    with pytest.raises(ValueError, match="repeats a member"):
        type(index).load(bytes(body) + struct.pack("<I", zlib.crc32(body)))
    body[7] = 2
    with pytest.raises(ValueError, match="unknown order or tie-break"):
        type(index).load(bytes(body) + struct.pack("<I", zlib.crc32(body)))


@pytest.mark.parametrize("kind", KINDS)
def test_a_walk_survives_its_index_being_cleared(kind) -> None:
    index = KINDS[kind]("desc", "first")
    for i in range(100):
        index.set(f"r{i}", i)
    walk = index.dump_walk(40)
    pieces = [next(walk)]
    index.clear()
    index.set("late", 5)
    pieces += list(walk)
    loaded = type(index).load(walked(walk, pieces))
    loaded._check()
    assert 1 <= len(loaded) <= 3
