"""Packed index states: ``(member, score, seq)`` runs as one byte buffer.

Recovery hands a replayed log tail to the index as absolute states
(``RankIndex.set_states``).  As tuples, a million-record tail costs a
million tuples, strings, floats and ints built by the replay only to be
taken apart again by the index.  A *packed* run is the same states in one
``bytearray`` that the native replay (``rankd.engine._replay``) appends to
and the native index reads in place (``RankIndex.set_states_packed``): no
object per state.

Layout, one entry after another, nothing between them (the machine's
byte order, unaligned: a run lives in memory only, never on disk)::

    f64 score | u64 seq | u16 n | n bytes: the member, UTF-8

An entry is checked as ``set_states`` checks a tuple (a member of 1 to
``MAX_MEMBER_BYTES`` bytes of valid UTF-8, a finite score, a seq of at most
``MAX_SEQ``); a buffer that ends inside an entry is refused.  Every entry
is checked before anything changes.

This module is the format's reference: :func:`pack_state` appends one
entry (the pure-Python replay uses it) and :func:`unpack_states` reads a
run back as tuples (what the pure-Python index does with one).
"""

from __future__ import annotations

import math
import struct

from rankd.index._contract import MAX_MEMBER_BYTES, MAX_SEQ

#: An entry's fixed head: score, seq, member length.
HEAD = struct.Struct("=dQH")


def pack_state(out: bytearray, member: str, score: float, seq: int) -> None:
    """Append the state ``(member, score, seq)`` to the packed run ``out``
    (unchecked: the index checks it when it reads the run)."""
    data = member.encode()
    out += HEAD.pack(score, seq, len(data))
    out += data


def unpack_states(buffer: bytes | bytearray | memoryview) -> list[tuple[str, float, int]]:
    """The states of a packed run, as ``set_states`` takes them; ``ValueError``
    for a run that is not one (cut short, a member too long or not UTF-8,
    a score not finite, a seq out of range)."""
    view = memoryview(buffer).cast("B")
    states = []
    at, end = 0, len(view)
    while at < end:
        if end - at < HEAD.size:
            raise ValueError("a packed state run ends inside an entry's head")
        score, seq, size = HEAD.unpack_from(view, at)
        at += HEAD.size
        if size == 0 or size > MAX_MEMBER_BYTES or end - at < size:
            raise ValueError(f"a packed state's member of {size} bytes does not fit")
        try:
            member = str(view[at:at + size], "utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"a packed state's member is not UTF-8: {exc.reason}") from None
        at += size
        if not math.isfinite(score):
            raise ValueError(f"score must be finite, got {score!r}")
        if seq > MAX_SEQ:
            raise ValueError(f"seq must be between 0 and 2**63 - 1, got {seq}")
        states.append((member, score, seq))
    return states
