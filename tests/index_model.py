"""A brute-force reference model of the rank index contract.

Everything here is deliberately naive: members live in plain dicts and every
read sorts the whole board again.  It is slow and obviously correct, which
is what the implementations are compared against.  The semantics follow
:mod:`rankd.index._contract`; where the contract is silent the choice made
here is documented next to the code.

The module also holds the dump format encoder/decoder the tests use to
build snapshots by hand (corrupt ones included).
"""

from __future__ import annotations

import math
import struct
import zlib
from dataclasses import dataclass

from rankd.index._contract import (
    DUMP_HEADER,
    DUMP_MAGIC,
    DUMP_RECORD,
    DUMP_RECORD_NO_SEQ,
    DUMP_TRAILER,
    DUMP_VERSION,
    DUMP_VERSION_NO_SEQS,
    MAX_EXACT_INT,
    MAX_MEMBER_BYTES,
    MAX_SEQ,
    ORDERS,
    TIE_BREAKS,
    Op,
    When,
)

# --- validation, straight from the contract's "Validation" section ----------


def check_member(member: object) -> bytes:
    """The member's UTF-8 bytes, or the contract's exception."""
    if not isinstance(member, str):
        raise TypeError(f"member must be a str, got {type(member).__name__}")
    try:
        data = member.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("member is not encodable as UTF-8") from None
    if not data:
        raise ValueError("member must not be empty")
    if len(data) > MAX_MEMBER_BYTES:
        raise ValueError("member is too long")
    return data


def check_number(value: object) -> float:
    """A score or delta as a float, or the contract's exception."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected an int or float, got {type(value).__name__}")
    if isinstance(value, int):
        if abs(value) > MAX_EXACT_INT:
            raise ValueError("int beyond 2**53")
        return float(value)
    if not math.isfinite(value):
        raise ValueError("not finite")
    # -0.0 is kept as given; it ranks as 0.0 (-0.0 == 0.0 in every comparison).
    return float(value)


def check_bound(value: object) -> float:
    """A range bound: like a score, but infinities are allowed, NaN is not."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected an int or float, got {type(value).__name__}")
    if isinstance(value, float) and math.isnan(value):
        raise ValueError("NaN bound")
    return value


def check_seq(seq: object) -> int:
    if isinstance(seq, bool) or not isinstance(seq, int):
        raise TypeError(f"seq must be an int, got {type(seq).__name__}")
    if not 0 <= seq <= MAX_SEQ:
        raise ValueError("seq out of range")
    return seq


def check_count(value: object) -> int:
    """offset, limit, above, below."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError("must not be negative")
    return value


def check_when(when: object) -> When:
    # The contract does not say what an invalid ``when`` raises; tests only
    # require "TypeError or ValueError" of it.
    if isinstance(when, bool) or not isinstance(when, int):
        raise TypeError("when must be a When")
    if when not in set(When):
        raise ValueError("when must be a When")
    return When(when)


# --- the model ------------------------------------------------------------------


class ModelIndex:
    """Reference implementation of ``RankIndexAPI``: a dict and a full sort."""

    def __init__(self, order: str = "desc", tie_break: str = "first") -> None:
        if order not in ORDERS:
            raise ValueError(f"bad order {order!r}")
        if tie_break not in TIE_BREAKS:
            raise ValueError(f"bad tie_break {tie_break!r}")
        self.order = order
        self.tie_break = tie_break
        self.scores: dict[str, float] = {}
        self.seqs: dict[str, int] = {}
        self.next_seq = 0
        #: The most members held and the longest member taken since made,
        #: cleared or emptied by a removal (``RankIndexAPI.peaks``).
        self.peaks = (0, 0)

    # --- ordering ------------------------------------------------------------

    def better(self, a: float, b: float) -> bool:
        """Whether score ``a`` ranks strictly better than score ``b``."""
        return a > b if self.order == "desc" else a < b

    def sort_key(self, member: str) -> tuple:
        score = self.scores[member]
        primary = -score if self.order == "desc" else score
        member_bytes = member.encode("utf-8")
        if self.tie_break == "first":
            return (primary, self.seqs[member], member_bytes)
        if self.tie_break == "member_desc":  # bytes Z to A, a prefix after what it begins
            return (primary, (*[-b for b in member_bytes], 1))
        return (primary, member_bytes)

    def ranked(self) -> list[str]:
        """Every member, best first.  Sorted again on every call."""
        return sorted(self.scores, key=self.sort_key)

    def entries(self) -> list[tuple[int, str, float]]:
        return [(i + 1, m, self.scores[m]) for i, m in enumerate(self.ranked())]

    # --- writes ----------------------------------------------------------------

    def _stamp(self, seq: int | None) -> int:
        # The contract does not say whether an explicit ``seq`` moves
        # ``next_seq``; the model (like the native index) moves it past any
        # explicit seq, so later unsequenced writes still arrive later.
        if seq is None:
            seq = self.next_seq
        self.next_seq = max(self.next_seq, seq + 1)
        return seq

    def _store(self, member: str, score: float, seq: int | None) -> None:
        self.scores[member] = score
        self.seqs[member] = self._stamp(seq)
        self._note(member)

    def _note(self, member: str) -> None:
        self.peaks = (max(self.peaks[0], len(self.scores)),
                      max(self.peaks[1], len(member.encode())))

    def set(self, member, score, when=When.ALWAYS, seq=None):
        when = check_when(when)
        value = check_number(score)
        if seq is not None:
            check_seq(seq)
        check_member(member)
        old = self.scores.get(member)
        if old is None:
            if when == When.EXISTS:
                return (None, None, False)
        elif (
            when == When.NEW
            or (when == When.BETTER and not self.better(value, old))
            or (when == When.WORSE and not self.better(old, value))
            or value == old
        ):
            return (old, old, False)
        self._store(member, value, seq)
        return (old, value, True)

    def incr(self, member, delta, seq=None):
        value = check_number(delta)
        if seq is not None:
            check_seq(seq)
        check_member(member)
        old = self.scores.get(member)
        new = value if old is None else old + value
        if not math.isfinite(new):
            raise ValueError("increment gives a non-finite score")
        if old is not None and new == old:
            return (old, old, False)
        self._store(member, new, seq)
        return (old, new, True)

    def remove(self, member):
        check_member(member)
        if member not in self.scores:
            return (None, None, False)
        old = self.scores.pop(member)
        del self.seqs[member]
        if not self.scores:
            self.peaks = (0, 0)
        return (old, None, True)

    def reach(self, length: int) -> None:
        self.peaks = (max(self.peaks[0], length), self.peaks[1])

    def reset_peaks(self) -> None:
        self.peaks = (len(self.scores), max((len(m.encode()) for m in self.scores), default=0))

    def positive_zeros(self) -> int:
        negative = [m for m, s in self.scores.items() if s == 0.0 and math.copysign(1, s) < 0]
        for member in negative:
            self.scores[member] = 0.0
        return len(negative)

    def clear(self) -> None:
        self.scores.clear()
        self.seqs.clear()
        self.peaks = (0, 0)

    def _apply_one(self, item):
        if not isinstance(item, tuple) or len(item) not in (3, 4):
            raise TypeError("an operation is a tuple (op, member, value[, seq])")
        op, member, value = item[:3]
        seq = item[3] if len(item) == 4 else None
        if isinstance(op, bool) or not isinstance(op, int):
            raise TypeError("op must be an Op")
        if op not in set(Op):
            raise ValueError("op must be an Op")
        if op == Op.REMOVE:
            if seq is not None:
                check_seq(seq)
            old, new, changed = self.remove(member)
        elif op == Op.INCR:
            old, new, changed = self.incr(member, value, seq)
        else:
            old, new, changed = self.set(member, value, When(op), seq)
        return (old, new, changed, None if new is None else self.rank(member))

    def apply_batch(self, ops):
        results = []
        for item in ops:
            try:
                results.append(self._apply_one(item))
            except (TypeError, ValueError) as exc:
                results.append(exc)
        return results

    def set_states(self, states):
        checked = []
        for item in states:
            if not isinstance(item, tuple) or len(item) != 3:
                raise TypeError("a state is a tuple (member, score, seq)")
            member, score, seq = item
            check_member(member)
            checked.append((member, check_number(score), check_seq(seq)))
        for member, score, seq in checked:
            self.scores[member] = score
            self.seqs[member] = self._stamp(seq)
            self._note(member)

    # --- reads -------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.scores)

    def __contains__(self, member: object) -> bool:
        return isinstance(member, str) and member in self.scores

    def __iter__(self):
        return iter([(m, self.scores[m]) for m in self.ranked()])

    def score(self, member):
        check_member(member)
        return self.scores.get(member)

    def rank(self, member):
        check_member(member)
        if member not in self.scores:
            return None
        return self.ranked().index(member) + 1

    def competition_rank(self, member):
        check_member(member)
        if member not in self.scores:
            return None
        mine = self.scores[member]
        return 1 + sum(1 for s in self.scores.values() if self.better(s, mine))

    def dense_rank(self, member):
        check_member(member)
        if member not in self.scores:
            return None
        mine = self.scores[member]
        return 1 + len({s for s in self.scores.values() if self.better(s, mine)})

    def percentile(self, member):
        rank = self.competition_rank(member)
        if rank is None:
            return None
        n = len(self.scores)
        return 100 * (n - rank + 1) / n

    def ranks(self, members):
        return [self.rank(m) for m in members]

    def member_at(self, rank):
        if isinstance(rank, bool) or not isinstance(rank, int):
            raise TypeError("rank must be an int")
        if rank < 1:
            raise ValueError("rank must be at least 1")
        ranked = self.ranked()
        if rank > len(ranked):
            return None
        member = ranked[rank - 1]
        return (member, self.scores[member])

    @staticmethod
    def _window(entries, offset, limit, reverse):
        check_count(offset)
        if limit is not None:
            check_count(limit)
        if reverse:
            entries = entries[::-1]
        stop = None if limit is None else offset + limit
        return entries[offset:stop]

    def range_by_rank(self, offset=0, limit=None, *, reverse=False):
        return self._window(self.entries(), offset, limit, reverse)

    @staticmethod
    def in_range(score, low, high, low_exclusive, high_exclusive) -> bool:
        above_low = low < score if low_exclusive else low <= score
        below_high = score < high if high_exclusive else score <= high
        return above_low and below_high

    def range_by_score(
        self,
        low,
        high,
        *,
        low_exclusive=False,
        high_exclusive=False,
        offset=0,
        limit=None,
        reverse=False,
    ):
        low, high = check_bound(low), check_bound(high)
        selected = [
            e
            for e in self.entries()
            if self.in_range(e[2], low, high, low_exclusive, high_exclusive)
        ]
        return self._window(selected, offset, limit, reverse)

    def count(self, low, high, *, low_exclusive=False, high_exclusive=False):
        low, high = check_bound(low), check_bound(high)
        return sum(
            1
            for s in self.scores.values()
            if self.in_range(s, low, high, low_exclusive, high_exclusive)
        )

    def around(self, member, above=5, below=5):
        check_member(member)
        check_count(above)
        check_count(below)
        if member not in self.scores:
            return None
        rank = self.rank(member)
        return self.entries()[max(0, rank - 1 - above) : rank + below]

    def dump(self) -> bytes:
        records = [
            DumpRecord(self.scores[m], self.seqs[m], m.encode("utf-8")) for m in self.ranked()
        ]
        return encode_dump(self.order, self.tie_break, self.next_seq, records)


# --- the dump format ---------------------------------------------------------------


@dataclass
class DumpRecord:
    score: float
    seq: int
    member: bytes


@dataclass
class Dump:
    magic: bytes
    version: int
    order: int
    tie_break: int
    reserved: int
    count: int
    next_seq: int
    records: list[DumpRecord]
    crc: int


def encode_dump(
    order,
    tie_break,
    next_seq: int,
    records: list[DumpRecord],
    *,
    count: int | None = None,
    magic: bytes = DUMP_MAGIC,
    version: int = DUMP_VERSION,
    reserved: int = 0,
) -> bytes:
    """Bytes in the dump format, with a correct CRC.

    ``order``/``tie_break`` are names or raw codes; the keyword arguments let
    tests write headers that lie.
    """
    order_code = ORDERS.index(order) if isinstance(order, str) else order
    tie_code = TIE_BREAKS.index(tie_break) if isinstance(tie_break, str) else tie_break
    body = bytearray(
        DUMP_HEADER.pack(
            magic,
            version,
            order_code,
            tie_code,
            reserved,
            len(records) if count is None else count,
            next_seq,
        )
    )
    for record in records:
        if version == DUMP_VERSION_NO_SEQS:
            body += DUMP_RECORD_NO_SEQ.pack(record.score, len(record.member))
        else:
            body += DUMP_RECORD.pack(record.score, record.seq, len(record.member))
        body += record.member
    body += DUMP_TRAILER.pack(zlib.crc32(body))
    return bytes(body)


def decode_dump(data: bytes) -> Dump:
    """Parse well-formed dump bytes without judging them (for tests); a
    version 2 record's seq reads as 0."""
    magic, version, order, tie_break, reserved, count, next_seq = DUMP_HEADER.unpack_from(data)
    offset = DUMP_HEADER.size
    records = []
    for _ in range(count):
        if version == DUMP_VERSION_NO_SEQS:
            score, length = DUMP_RECORD_NO_SEQ.unpack_from(data, offset)
            seq = 0
            offset += DUMP_RECORD_NO_SEQ.size
        else:
            score, seq, length = DUMP_RECORD.unpack_from(data, offset)
            offset += DUMP_RECORD.size
        records.append(DumpRecord(score, seq, bytes(data[offset : offset + length])))
        offset += length
    (crc,) = DUMP_TRAILER.unpack_from(data, offset)
    if offset + DUMP_TRAILER.size != len(data):
        raise struct.error("trailing bytes after the CRC")
    return Dump(magic, version, order, tie_break, reserved, count, next_seq, records, crc)


def dump_content(data: bytes) -> tuple:
    """What a dump says, whatever its version: order, tie-break, next_seq and
    the records, without their seqs on a board tied by member (whose order
    never reads them, and whose version 2 dumps leave them out)."""
    dump = decode_dump(data)
    by_member = dump.tie_break != 0
    records = [(struct.pack("<d", r.score), None if by_member else r.seq, r.member)
               for r in dump.records]  # a score's bytes: the sign of a zero too
    return dump.order, dump.tie_break, dump.next_seq, records


def assert_same_dump(got: bytes, expected: bytes) -> None:
    """``got`` says what ``expected`` does: the same bytes, or a version 2
    dump of the same board (see :func:`dump_content`)."""
    if got != expected:
        assert dump_content(got) == dump_content(expected)


# --- comparing an implementation with the model ------------------------------------


def assert_index_matches(index, model: ModelIndex, members=()) -> None:
    """Assert that ``index`` holds exactly the model's state.

    Checks the invariants, the length, iteration, the full ranking, next_seq,
    the dump bytes (which also pins every arrival sequence), and every
    per-member read for the model's members and the extra ``members``.
    """
    index._check()
    expected = model.entries()
    assert len(index) == len(model)
    assert list(index) == [(m, s) for _, m, s in expected]
    assert index.range_by_rank() == expected
    assert index.next_seq == model.next_seq
    assert_same_dump(index.dump(), model.dump())  # scores' bytes: the sign of a zero too
    assert index.peaks == model.peaks
    probe = list(dict.fromkeys([*model.scores, *members]))
    for member in probe:
        assert (member in index) == (member in model), member
        assert index.score(member) == model.score(member), member
        assert index.rank(member) == model.rank(member), member
        assert index.competition_rank(member) == model.competition_rank(member), member
        assert index.dense_rank(member) == model.dense_rank(member), member
        expected_pct = model.percentile(member)
        if expected_pct is None:
            assert index.percentile(member) is None, member
        else:
            assert math.isclose(index.percentile(member), expected_pct, rel_tol=1e-12), member
    assert index.ranks(probe) == model.ranks(probe)
