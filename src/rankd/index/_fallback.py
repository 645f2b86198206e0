"""Pure-Python rank index on ``sortedcontainers``: the native index's stand-in.

Used when the extension is not compiled (or ``RANKD_PURE_PYTHON=1``).  It
honours the same contract (:mod:`rankd.index._contract`) and the same dump
format, so either implementation loads the other's snapshots.

Every member has a *sort key*: a tuple that orders members exactly like
the skip list does.  ``k`` is the score turned so that smaller is better
(``-score`` for descending boards), then the tie-break:

* ``first``:  ``(k, seq, member)``
* ``member``: ``(k, member)``
* ``member_desc``: ``(k, reversed(member), member)``, where ``reversed``
  is the member's negated code points and a closing ``1`` (so members
  compare Z to A, and a member before a longer one it begins)

Python compares ``str`` by code point, which is the UTF-8 byte order the
contract asks for.  A ``SortedList`` of keys gives unique ranks by
bisection, a second one over the distinct ``k`` values gives dense ranks,
and a dict maps each member to its score and arrival sequence.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Iterator
from typing import Any

from sortedcontainers import SortedList

from rankd.index._contract import (
    DUMP_HEADER,
    DUMP_MAGIC,
    DUMP_RECORD,
    DUMP_RECORD_NO_SEQ,
    DUMP_TRAILER,
    DUMP_VERSION,
    DUMP_VERSION_NO_SEQS,
    DUMP_WALKED,
    MAX_EXACT_INT,
    MAX_MEMBER_BYTES,
    MAX_SEQ,
    TIE_BREAKS,
    BatchResult,
    Entry,
    Op,
    WriteResult,
)
from rankd.index.packed import unpack_states

_REFUSED = object()  # a condition (NX/XX/GT/LT) refused the write


# --- validation (same exceptions and messages as the native index) -------------


def _member(member: object) -> str:
    if not isinstance(member, str):
        raise TypeError(f"member must be a str, got {type(member).__name__}")
    try:
        size = len(member.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise ValueError(f"member is not encodable as UTF-8: {exc.reason}") from None
    if size == 0:
        raise ValueError("member must not be empty")
    if size > MAX_MEMBER_BYTES:
        raise ValueError(f"member must be at most {MAX_MEMBER_BYTES} bytes in UTF-8, got {size}")
    return member


def _number(value: object, what: str) -> float:
    if type(value) is float:
        number = value
    elif isinstance(value, bool):
        raise TypeError(f"{what} must be an int or float, got bool")
    elif isinstance(value, int):
        if value > MAX_EXACT_INT or value < -MAX_EXACT_INT:
            raise ValueError(f"{what} {value} is beyond 2**53 and cannot be stored exactly "
                             "as a float")
        number = float(value)
    elif isinstance(value, float):
        number = float(value)
    else:
        raise TypeError(f"{what} must be an int or float, got {type(value).__name__}")
    if not math.isfinite(number):
        raise ValueError(f"{what} must be finite, got {value!r}")
    return number  # -0.0 is kept: it ranks as 0.0 (the caller decides which zero it stores)


def _bound(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} must be an int or float, got {type(value).__name__}")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf if value > 0 else -math.inf
    if number != number:
        raise ValueError(f"{what} must not be NaN")
    return number


def _seq(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"seq must be an int, got {type(value).__name__}")
    if value < 0 or value > MAX_SEQ:
        raise ValueError(f"seq must be between 0 and 2**63 - 1, got {value}")
    return value


def _count(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{what} must not be negative, got {value}")
    return value


class RankIndex:
    """A leaderboard index (pure Python); see :class:`rankd.index.RankIndexAPI`."""

    def __init__(self, order: str = "desc", tie_break: str = "first", *,
                 max_level: int = 32, branching: int = 4, seed: int | None = None) -> None:
        if order not in ("desc", "asc"):
            raise ValueError(f"order must be 'desc' or 'asc', got {order!r}")
        if tie_break not in TIE_BREAKS:
            raise ValueError("tie_break must be 'first', 'member' or 'member_desc', "
                             f"got {tie_break!r}")
        if isinstance(max_level, bool) or not isinstance(max_level, int) \
                or not 1 <= max_level <= 32:
            raise ValueError(f"max_level must be between 1 and 32, got {max_level}")
        if isinstance(branching, bool) or not isinstance(branching, int) \
                or not 2 <= branching <= 64:
            raise ValueError(f"branching must be between 2 and 64, got {branching}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")
        self._order = order
        self._tie_break = tie_break
        self._sign = -1.0 if order == "desc" else 1.0
        self._by_member = tie_break == "member"
        self._by_member_desc = tie_break == "member_desc"
        #: member -> (score, seq)
        self._entries: dict[str, tuple[float, int]] = {}
        self._keys = SortedList()
        self._distinct = SortedList()
        self._key_counts: dict[float, int] = {}
        self._next_seq = 0
        self._mutations = 0
        #: High-water marks: see :attr:`peaks`.
        self._peak_length = 0
        self._peak_member_bytes = 0

    # --- properties -------------------------------------------------------------------

    @property
    def order(self) -> str:
        return self._order

    @property
    def tie_break(self) -> str:
        return self._tie_break

    @property
    def next_seq(self) -> int:
        return self._next_seq

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def peaks(self) -> tuple[int, int]:
        """``(length, member bytes)``: the most members the index held, and
        the longest member (UTF-8 bytes) it took, since it was made, cleared,
        emptied by a removal or :meth:`reset_peaks`."""
        return self._peak_length, self._peak_member_bytes

    def _note_peaks(self, member: str) -> None:
        self._peak_length = max(self._peak_length, len(self._entries))
        self._peak_member_bytes = max(self._peak_member_bytes, len(member.encode()))

    @property
    def full(self) -> bool:
        """Never: a dict and a sorted list hold what memory holds."""
        return False

    def reach(self, length: int) -> None:
        """Count ``length`` members as held (in :attr:`peaks`)."""
        self._peak_length = max(self._peak_length, length)

    def reset_peaks(self) -> None:
        """Set :attr:`peaks` to what the index holds now."""
        self._peak_length = len(self._entries)
        self._peak_member_bytes = max((len(m.encode()) for m in self._entries), default=0)

    def positive_zeros(self) -> int:
        """Make every score of -0.0 0.0 (their places do not change); return
        how many were."""
        changed = 0
        for member, (score, seq) in self._entries.items():
            if score == 0.0 and math.copysign(1.0, score) < 0:
                self._entries[member] = (0.0, seq)
                changed += 1
        if changed:
            self._mutations += 1
        return changed

    def __contains__(self, member: object) -> bool:
        return isinstance(member, str) and member in self._entries

    def __repr__(self) -> str:
        return (f"RankIndex(order={self._order!r}, tie_break={self._tie_break!r}, "
                f"members={len(self._entries)})")

    def __iter__(self) -> Iterator[tuple[str, float]]:
        mutations = self._mutations
        for key in self._keys:
            if self._mutations != mutations:
                raise RuntimeError("rank index changed during iteration")
            member = key[-1]
            yield member, self._entries[member][0]
        if self._mutations != mutations:
            raise RuntimeError("rank index changed during iteration")

    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        return (_load_from_dump, (self.dump(),))

    # --- keys ----------------------------------------------------------------------------

    def _sort_key(self, member: str, score: float, seq: int) -> tuple:
        k = self._sign * score + 0.0
        if self._by_member_desc:
            return (k, (*[-ord(c) for c in member], 1), member)
        return (k, member) if self._by_member else (k, seq, member)

    def _link(self, member: str, score: float, seq: int) -> None:
        key = self._sort_key(member, score, seq)
        self._entries[member] = (score, seq)
        self._note_peaks(member)
        self._keys.add(key)
        k = key[0]
        seen = self._key_counts.get(k, 0)
        if not seen:
            self._distinct.add(k)
        self._key_counts[k] = seen + 1

    def _unlink(self, member: str) -> None:
        score, seq = self._entries.pop(member)
        key = self._sort_key(member, score, seq)
        self._keys.remove(key)
        k = key[0]
        left = self._key_counts[k] - 1
        if left:
            self._key_counts[k] = left
        else:
            del self._key_counts[k]
            self._distinct.remove(k)

    def _rank(self, member: str) -> int:
        score, seq = self._entries[member]
        return self._keys.bisect_left(self._sort_key(member, score, seq)) + 1

    def _count_before(self, k: float, inclusive: bool) -> int:
        """Members whose turned score is < k (or <= k when ``inclusive``)."""
        if inclusive:
            if k == math.inf:
                return len(self._keys)
            k = math.nextafter(k, math.inf)
        return self._keys.bisect_left((k,))

    # --- writes ---------------------------------------------------------------------------

    def _write(self, member: object, value: float, op: int, seq: int | None
               ) -> tuple[float | None, float | None, bool]:
        """Apply one write whose number is validated; raises before any change."""
        member = _member(member)
        entry = self._entries.get(member)
        old = None if entry is None else entry[0]
        if op == Op.REMOVE:
            if entry is None:
                return None, None, False
            self._unlink(member)
            if not self._entries:
                self._peak_length = self._peak_member_bytes = 0  # emptied: as new
            self._mutations += 1
            return old, None, True
        if op == Op.INCR:
            target = value if old is None else old + value
            if not math.isfinite(target):
                raise ValueError(f"incrementing by {value!r} gives a non-finite score")
        else:
            target = value
            if old is not None:
                turned_new, turned_old = self._sign * value, self._sign * old
                if (op == Op.SET_NEW
                        or (op == Op.SET_BETTER and not turned_new < turned_old)
                        or (op == Op.SET_WORSE and not turned_new > turned_old)):
                    target = _REFUSED
            elif op == Op.SET_EXISTS:
                return None, None, False
        if target is _REFUSED or (old is not None and old == target):
            return old, old, False
        if seq is None:
            if self._next_seq > MAX_SEQ:
                raise ValueError("arrival sequences are exhausted (next_seq is past "
                                 "2**63 - 1); pass seq explicitly")
            seq = self._next_seq
        if entry is not None:
            self._unlink(member)
        self._link(member, target, seq)
        if seq >= self._next_seq:
            self._next_seq = seq + 1
        self._mutations += 1
        return old, target, True

    def set(self, member: str, score: float, when: int = Op.SET,
            seq: int | None = None) -> WriteResult:
        """Set ``member``'s score if ``when`` allows it: ``(old, new, changed)``."""
        if isinstance(when, bool) or not isinstance(when, int):
            raise TypeError(f"an integer is required, got {type(when).__name__}")
        if not Op.SET <= when <= Op.SET_WORSE:
            raise ValueError(f"when must be a When value (0..4), got {when}")
        value = _number(score, "score")
        return self._write(member, value, int(when), None if seq is None else _seq(seq))

    def incr(self, member: str, delta: float, seq: int | None = None) -> WriteResult:
        """Add ``delta`` to ``member``'s score (absent members start at 0)."""
        value = _number(delta, "delta")
        return self._write(member, value, Op.INCR, None if seq is None else _seq(seq))

    def remove(self, member: str) -> WriteResult:
        """Remove ``member``: ``(old, None, True)``, or ``(None, None, False)``."""
        return self._write(member, 0.0, Op.REMOVE, None)

    def clear(self) -> None:
        """Remove every member; ``next_seq`` is kept."""
        self._entries.clear()
        self._keys.clear()
        self._distinct.clear()
        self._key_counts.clear()
        self._peak_length = self._peak_member_bytes = 0
        self._mutations += 1

    def apply_batch(self, ops: Iterable[tuple]) -> list[BatchResult | Exception]:
        """Apply ``(op, member, value[, seq])`` operations in order."""
        results: list[BatchResult | Exception] = []
        for item in ops:
            try:
                if type(item) is not tuple:
                    raise TypeError(f"an operation must be a tuple, got {type(item).__name__}")
                if len(item) not in (3, 4):
                    raise TypeError(
                        f"an operation is (op, member, value[, seq]), got {len(item)} items")
                op = item[0]
                if isinstance(op, bool) or not isinstance(op, int):
                    raise TypeError(f"op must be an Op, got {type(op).__name__}")
                if not Op.SET <= op <= Op.REMOVE:
                    raise ValueError(f"op must be an Op value (0..6), got {op}")
                value = 0.0
                if op != Op.REMOVE:
                    value = _number(item[2], "delta" if op == Op.INCR else "score")
                seq = item[3] if len(item) == 4 else None
                old, new, changed = self._write(item[1], value, int(op),
                                                None if seq is None else _seq(seq))
            except (TypeError, ValueError) as exc:
                results.append(exc)
                continue
            results.append((old, new, changed, None if new is None else self._rank(item[1])))
        return results

    def set_states(self, states: Iterable[tuple[str, float, int]]) -> None:
        """Give members exact ``(member, score, seq)`` states (see the contract)."""
        checked = []
        for item in states:
            if type(item) is not tuple:
                raise TypeError(f"a state must be a tuple, got {type(item).__name__}")
            if len(item) != 3:
                raise TypeError(f"a state is (member, score, seq), got {len(item)} items")
            checked.append((_member(item[0]), _number(item[1], "score"), _seq(item[2])))
        for member, score, seq in checked:
            if member in self._entries:
                self._unlink(member)
            self._link(member, score, seq)
            if seq >= self._next_seq:
                self._next_seq = seq + 1
        if checked:
            self._mutations += 1

    def set_states_packed(self, states: bytes | bytearray | memoryview) -> int:
        """``set_states`` for a packed run (see the contract); how many it held."""
        unpacked = unpack_states(states)
        self.set_states(unpacked)
        return len(unpacked)

    # --- reads ----------------------------------------------------------------------------

    def _present(self, member: object) -> str | None:
        if isinstance(member, str) and member in self._entries:
            return member
        _member(member)  # the same errors as the native index for bad members
        return None

    def score(self, member: str) -> float | None:
        """``member``'s score, or ``None``."""
        present = self._present(member)
        return None if present is None else self._entries[present][0]

    def rank(self, member: str) -> int | None:
        """Unique 1-based rank, or ``None``."""
        present = self._present(member)
        return None if present is None else self._rank(present)

    def competition_rank(self, member: str) -> int | None:
        """1 + members with a strictly better score, or ``None``."""
        present = self._present(member)
        if present is None:
            return None
        return self._count_before(self._sign * self._entries[present][0] + 0.0, False) + 1

    def dense_rank(self, member: str) -> int | None:
        """1 + distinct scores strictly better, or ``None``."""
        present = self._present(member)
        if present is None:
            return None
        return self._distinct.bisect_left(self._sign * self._entries[present][0] + 0.0) + 1

    def percentile(self, member: str) -> float | None:
        """Share of members scoring equal or worse, in percent."""
        present = self._present(member)
        if present is None:
            return None
        better = self._count_before(self._sign * self._entries[present][0] + 0.0, False)
        return 100.0 * (len(self._entries) - better) / len(self._entries)

    def ranks(self, members: Iterable[str]) -> list[int | None]:
        """Unique ranks of many members (``None`` for absent ones)."""
        return [self.rank(member) for member in members]

    def member_at(self, rank: int) -> tuple[str, float] | None:
        """``(member, score)`` at a 1-based rank, ``None`` past the end."""
        if isinstance(rank, bool) or not isinstance(rank, int):
            raise TypeError(f"rank must be an int, got {type(rank).__name__}")
        if rank < 1:
            raise ValueError(f"rank must be at least 1, got {rank}")
        if rank > len(self._keys):
            return None
        member = self._keys[rank - 1][-1]
        return member, self._entries[member][0]

    def _collect(self, first: int, last: int, reverse: bool) -> list[Entry]:
        """Entries of 1-based ranks first..last (inclusive)."""
        if first > last:
            return []
        entries = self._entries
        keys = self._keys.islice(first - 1, last, reverse=reverse)
        ranks = range(last, first - 1, -1) if reverse else range(first, last + 1)
        return [(rank, key[-1], entries[key[-1]][0]) for rank, key in zip(ranks, keys, strict=True)]

    def _window(self, lo: int, hi: int, offset: object, limit: object,
                reverse: bool) -> list[Entry]:
        skip = _count(offset, "offset")
        available = max(0, hi - lo + 1 - skip)
        take = available if limit is None else min(_count(limit, "limit"), available)
        if take <= 0:
            return []
        if reverse:
            return self._collect(hi - skip - take + 1, hi - skip, True)
        return self._collect(lo + skip, lo + skip + take - 1, False)

    def range_by_rank(self, offset: int = 0, limit: int | None = None, *,
                      reverse: bool = False) -> list[Entry]:
        """Entries by rank after ``offset``, at most ``limit``; ``reverse`` from the worst."""
        return self._window(1, len(self._keys), offset, limit, reverse)

    def _key_range(self, low: object, high: object, low_exclusive: bool,
                   high_exclusive: bool) -> tuple[int, int]:
        low_score, high_score = _bound(low, "low"), _bound(high, "high")
        if self._order == "desc":
            key_low, key_high = -high_score, -low_score
            ex_low, ex_high = high_exclusive, low_exclusive
        else:
            key_low, key_high = low_score, high_score
            ex_low, ex_high = low_exclusive, high_exclusive
        if key_low > key_high:
            return 1, 0
        return (self._count_before(key_low + 0.0, bool(ex_low)) + 1,
                self._count_before(key_high + 0.0, not ex_high))

    def range_by_score(self, low: float, high: float, *, low_exclusive: bool = False,
                       high_exclusive: bool = False, offset: int = 0,
                       limit: int | None = None, reverse: bool = False) -> list[Entry]:
        """Entries with ``low <= score <= high`` in rank order, after ``offset``."""
        lo, hi = self._key_range(low, high, low_exclusive, high_exclusive)
        return self._window(lo, hi, offset, limit, reverse)

    def count(self, low: float, high: float, *, low_exclusive: bool = False,
              high_exclusive: bool = False) -> int:
        """Members with a score in the range."""
        lo, hi = self._key_range(low, high, low_exclusive, high_exclusive)
        return hi - lo + 1 if hi >= lo else 0

    def around(self, member: str, above: int = 5, below: int = 5) -> list[Entry] | None:
        """Up to ``above`` better entries, the member, up to ``below`` worse; or ``None``."""
        _count(above, "above")
        _count(below, "below")
        present = self._present(member)
        if present is None:
            return None
        rank = self._rank(present)
        return self._collect(max(1, rank - above), min(len(self._keys), rank + below), False)

    # --- snapshots --------------------------------------------------------------------------

    def dump(self) -> bytes:
        """The whole index in the shared dump format."""
        parts = [self._dump_header(len(self._keys))]
        parts += self._records(self._keys)
        body = b"".join(parts)
        return body + DUMP_TRAILER.pack(zlib.crc32(body))

    def _dump_header(self, count: int, walked: bool = False) -> bytes:
        return DUMP_HEADER.pack(DUMP_MAGIC, DUMP_VERSION, 0 if self._order == "desc" else 1,
                                TIE_BREAKS.index(self._tie_break), DUMP_WALKED if walked else 0,
                                count, self._next_seq)

    def _records(self, keys: Iterable[tuple]) -> list[bytes]:
        """The dump records of the entries of ``keys`` (sort keys), in turn."""
        pack = DUMP_RECORD.pack
        entries = self._entries
        parts = []
        for key in keys:
            member = key[-1]
            score, seq = entries[member]
            raw = member.encode("utf-8")
            parts.append(pack(score, seq, len(raw)))
            parts.append(raw)
        return parts

    def dump_walk(self, max_bytes: int) -> DumpWalk:
        """The records of a walked dump in pieces of about ``max_bytes``
        (see the contract); the index may change between pieces."""
        return DumpWalk(self, max_bytes)

    def dump_chunks(self, max_bytes: int) -> DumpChunks:
        """:meth:`dump`'s bytes in pieces of at most ``max_bytes`` (made
        whole first: the fallback is not for boards of millions)."""
        return DumpChunks(self.dump(), max_bytes)

    @classmethod
    def load_chunks(cls, pieces: Iterable[Any], size: int | None = None) -> RankIndex:
        """Rebuild an index from :meth:`dump` output in pieces."""
        return cls.load(b"".join(pieces))

    @classmethod
    def load(cls, data: bytes) -> RankIndex:
        """Rebuild an index from :meth:`dump` output; ``ValueError`` if corrupt."""
        view = memoryview(data).cast("B")
        size = len(view)
        if size < DUMP_HEADER.size + DUMP_TRAILER.size:
            raise ValueError(f"rank index dump is truncated: {size} bytes")
        magic, version, order, tie, reserved, count, next_seq = DUMP_HEADER.unpack_from(view)
        if magic != DUMP_MAGIC:
            raise ValueError("not a rank index dump (bad magic)")
        if version not in (DUMP_VERSION, DUMP_VERSION_NO_SEQS):
            raise ValueError(f"unsupported rank index dump version {version}")
        if order > 1 or tie >= len(TIE_BREAKS) or reserved not in (0, DUMP_WALKED):
            raise ValueError("rank index dump has an unknown order or tie-break code")
        # Version 2 has no seqs (a board tied by member, which never orders by them).
        record = DUMP_RECORD if version == DUMP_VERSION else DUMP_RECORD_NO_SEQ
        if record is DUMP_RECORD_NO_SEQ and tie == 0:
            raise ValueError("a version 2 rank index dump (no seqs) of a board tied by arrival")
        (stored_crc,) = DUMP_TRAILER.unpack_from(view, size - DUMP_TRAILER.size)
        if zlib.crc32(view[: size - DUMP_TRAILER.size]) != stored_crc:
            raise ValueError("rank index dump is corrupt (CRC mismatch)")
        if next_seq > MAX_SEQ + 1:
            raise ValueError("rank index dump has an invalid next_seq")
        if count > size // record.size:
            raise ValueError(f"rank index dump claims {count} members, more than it holds")
        index = cls("desc" if order == 0 else "asc", TIE_BREAKS[tie])
        index._next_seq = next_seq
        position = DUMP_HEADER.size
        end = size - DUMP_TRAILER.size
        keys: list[tuple] = []
        for i in range(count):
            if end - position < record.size:
                raise ValueError(f"rank index dump is truncated at record {i}")
            if record is DUMP_RECORD:
                score, seq, length = record.unpack_from(view, position)
            else:
                (score, length), seq = record.unpack_from(view, position), 0
            position += record.size
            if length == 0 or length > MAX_MEMBER_BYTES or end - position < length:
                raise ValueError(f"rank index dump has a bad member length at record {i}")
            try:
                member = str(view[position:position + length], "utf-8")
            except UnicodeDecodeError:
                raise ValueError(
                    f"rank index dump has a member that is not UTF-8 at record {i}") from None
            position += length
            if not math.isfinite(score):
                raise ValueError(f"rank index dump has a non-finite score at record {i}")
            if seq > MAX_SEQ or seq >= next_seq:
                raise ValueError(f"rank index dump has an invalid seq at record {i}")
            key = index._sort_key(member, score, seq)
            if keys and not keys[-1] < key:
                if keys[-1][-1] == member:
                    raise ValueError(f"rank index dump repeats a member at record {i}")
                raise ValueError(f"rank index dump is out of order at record {i}")
            if member in index._entries:
                if reserved == DUMP_WALKED:
                    continue  # written again while walked: its first record stays
                raise ValueError(f"rank index dump repeats a member at record {i}")
            index._entries[member] = (score, seq)
            keys.append(key)
            k = key[0]
            seen = index._key_counts.get(k, 0)
            if not seen:
                index._distinct.add(k)
            index._key_counts[k] = seen + 1
        if position != end:
            raise ValueError(f"rank index dump has {end - position} bytes after its last record")
        index._keys.update(keys)
        index.reset_peaks()
        return index

    # --- invariants ---------------------------------------------------------------------------

    def _check(self) -> None:
        """Verify every invariant; ``AssertionError`` names the first broken one."""
        self._keys._check()
        self._distinct._check()
        assert len(self._keys) == len(self._entries), "keys and entries disagree in number"
        previous = None
        distinct: dict[float, int] = {}
        for key in self._keys:
            member = key[-1]
            assert member in self._entries, f"key of {member!r} has no entry"
            score, seq = self._entries[member]
            assert key == self._sort_key(member, score, seq), f"stale key for {member!r}"
            assert previous is None or previous < key, "keys out of order"
            assert self._next_seq > seq, f"next_seq {self._next_seq} <= seq {seq}"
            distinct[key[0]] = distinct.get(key[0], 0) + 1
            previous = key
        assert distinct == self._key_counts, "distinct score counts are wrong"
        assert list(self._distinct) == sorted(distinct), "distinct scores are wrong"


def _load_from_dump(data: bytes) -> RankIndex:
    return RankIndex.load(data)


class DumpWalk:
    """:meth:`RankIndex.dump_walk`: each piece goes on after the sort key
    of the last record written."""

    def __init__(self, index: RankIndex, max_bytes: int) -> None:
        self._index = index
        self._max_bytes = max(1, max_bytes)
        self._after: tuple | None = None
        self._done = False
        self.records = 0

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        if self._done:
            raise StopIteration
        keys = self._index._keys
        following = (iter(keys) if self._after is None
                     else keys.irange(minimum=self._after, inclusive=(False, True)))
        taken, size = [], 0
        for key in following:
            size += DUMP_RECORD.size + len(key[-1].encode("utf-8"))
            if taken and size > self._max_bytes:
                break  # (this one starts the next piece)
            taken.append(key)
        else:
            self._done = True
        if not taken:
            raise StopIteration
        self._after = taken[-1]
        self.records += len(taken)
        return b"".join(self._index._records(taken))

    def header(self) -> bytes:
        """The walked dump's header (the records written so far)."""
        return self._index._dump_header(self.records, walked=True)


class DumpChunks:
    """A dump's bytes as pieces of at most ``max_bytes`` (``size``: their total)."""

    def __init__(self, dump: bytes, max_bytes: int) -> None:
        self.size = len(dump)
        self._dump = dump
        self._step = max(1, max_bytes)

    def __iter__(self) -> Iterator[bytes]:
        view = memoryview(self._dump)
        for start in range(0, self.size, self._step):
            yield bytes(view[start:start + self._step])
