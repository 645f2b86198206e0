"""The contract every rank index implementation honours.

There are two implementations of :class:`RankIndex`: the native one
(``rankd._skiplist``, a Cython skip list with a C hash table) and the
pure-Python fallback (``rankd.index._fallback``, on ``sortedcontainers``).
They share the names, argument names, results, exceptions and the dump
format defined here, so a snapshot written by one loads in the other and
every test runs against both.

Vocabulary
----------
* **rank** is 1-based: rank 1 is the best member.  "Best" means the highest
  score for ``order="desc"`` and the lowest for ``order="asc"``.
* **unique rank** (``rank``) gives every member its own position: 1, 2, 3, 4.
  Equal scores are ordered by the tie-break policy:

  - ``"first"``: whoever reached that score first ranks higher.  Every write
    that changes a member's score stamps it with an *arrival sequence*; the
    lower sequence wins.  The caller may pass the sequence explicitly (the
    engine passes its event sequence, so replaying a log reproduces the
    exact order); otherwise the index uses its own counter, ``next_seq``.
    Two members can only share a sequence when the caller passes equal
    sequences explicitly; they are then ordered by member, as below, so
    the order is always total.
  - ``"member"``: by member, ascending in UTF-8 byte order (which equals
    code point order), in *both* board orders.  Redis orders ties of a
    descending ``ZREVRANGE`` by member descending; rankd does not, because
    alphabetical order among ties is what a leaderboard reader expects.

* **competition rank** ("1224"): 1 + the number of members with a strictly
  better score.
* **dense rank** ("1223"): 1 + the number of distinct scores strictly better.
* **percentile**: the share of members whose score is equal to or worse than
  the member's, in percent: ``100 * (len - competition_rank + 1) / len``.
  The best member is at 100; a member alone is at 100.

Results of writes
-----------------
Every write returns ``(old, new, changed)``: the score before (``None`` if
the member was absent), the score after (``None`` if absent after) and
whether anything changed.  Callers log and broadcast from it without a
second lookup.  :meth:`RankIndexAPI.apply_batch` adds the unique rank after
the operation: ``(old, new, changed, rank)``.

Validation
----------
Invalid input raises and changes nothing:

* a member that is not a ``str`` raises ``TypeError``; an empty member, one
  that is not encodable as UTF-8 (lone surrogates) or longer than
  :data:`MAX_MEMBER_BYTES` bytes in UTF-8 raises ``ValueError``;
* a score or delta that is not an ``int``/``float`` (``bool`` included)
  raises ``TypeError``; NaN or an infinity raises ``ValueError``; an ``int``
  whose magnitude exceeds :data:`MAX_EXACT_INT` raises ``ValueError``
  because a float64 cannot hold it exactly;
* an increment whose result is not finite raises ``ValueError``;
* a ``seq`` outside ``0 <= seq <= MAX_SEQ`` raises ``ValueError``.

Zeros
-----
A score of ``-0.0`` is kept as given (a Redis skiplist keeps it; the
engine decides which zero a board stores, ``rankd.engine.zeros``), and
ranks exactly as ``0.0``: the two are one score for every order, count,
range and rank.  Setting ``0.0`` over ``-0.0`` (or the reverse) changes
nothing, as setting any equal score does.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable, Iterator
from typing import Protocol, TypeAlias

#: Longest member, in UTF-8 bytes.
MAX_MEMBER_BYTES = 256
#: Largest integer score accepted: every integer up to it is exact in float64.
MAX_EXACT_INT = 2**53
#: Largest arrival sequence (fits a signed 64-bit integer).
MAX_SEQ = 2**63 - 1

ORDERS = ("desc", "asc")
#: By value, as dumps store them (``member_desc``: equal scores by member, Z to A).
TIE_BREAKS = ("first", "member", "member_desc")


class When(enum.IntEnum):
    """Condition of :meth:`RankIndexAPI.set` (Redis ``ZADD`` NX/XX/GT/LT)."""

    #: Add or update unconditionally.
    ALWAYS = 0
    #: Only add a new member; never update an existing one (``NX``).
    NEW = 1
    #: Only update an existing member; never add (``XX``).
    EXISTS = 2
    #: Add, or update only when the new score ranks strictly better.
    BETTER = 3
    #: Add, or update only when the new score ranks strictly worse.
    WORSE = 4


class Op(enum.IntEnum):
    """Operation codes of :meth:`RankIndexAPI.apply_batch`.

    The ``SET_*`` codes equal the matching :class:`When` values.
    """

    SET = 0
    SET_NEW = 1
    SET_EXISTS = 2
    SET_BETTER = 3
    SET_WORSE = 4
    INCR = 5
    REMOVE = 6


WriteResult: TypeAlias = tuple[float | None, float | None, bool]
BatchResult: TypeAlias = tuple[float | None, float | None, bool, int | None]
Entry: TypeAlias = tuple[int, str, float]
"""A ranked entry: ``(rank, member, score)`` with the unique 1-based rank."""

# --- dump format, version 1 (all integers little-endian) -------------------
#
#   header  magic b"RKIX" | u8 version | u8 order (0 desc, 1 asc)
#           | u8 tie_break (0 first, 1 member, 2 member_desc) | u8 reserved = 0
#           | u64 count | u64 next_seq
#   count records, in rank order (best first):
#           f64 score | u64 seq | u16 member length | member UTF-8 bytes
#   trailer u32 CRC-32 (zlib.crc32) of everything before it
#
# Version 2 is version 1 without the seqs, for boards tied by member (whose
# order never reads a seq): records are  f64 score | u16 member length |
# member UTF-8 bytes.  The compact paged index (rankd._pages) writes it for
# such boards and loads both versions (a version 1 dump's seqs are dropped);
# the other implementations write version 1 and load both (a version 2
# record's seq reads as 0), so a data dir moves between index kinds.
#
# load() rejects a wrong magic/version/CRC, a truncated or over-long body,
# records out of rank order, duplicate members and non-finite scores.
#
# A *walked* dump (dump_walk) has reserved = DUMP_WALKED.  Its records were
# written a piece at a time while the index took writes between pieces:
# each piece goes on after the last record written, so they are in rank
# order, but a member written meanwhile may be missing (it moved behind the
# walk) or repeat (it moved ahead of it).  load() keeps a member's first
# record and skips later ones.  The snapshot that holds it is taken at a log
# position from before the walk: replaying the log's absolute states from
# there sets every member written meanwhile (rankd.engine.snapshotting).
DUMP_MAGIC = b"RKIX"
DUMP_WALKED = 1
DUMP_VERSION = 1
DUMP_VERSION_NO_SEQS = 2
DUMP_HEADER = struct.Struct("<4sBBBBQQ")
DUMP_RECORD = struct.Struct("<dQH")
DUMP_RECORD_NO_SEQ = struct.Struct("<dH")
DUMP_TRAILER = struct.Struct("<I")


class RankIndexAPI(Protocol):
    """What ``rankd.index.RankIndex`` provides, whichever implementation.

    ``RankIndex(order="desc", tie_break="first", *, max_level=32,
    branching=4, seed=None)`` creates an empty index.  ``max_level``
    (1..32), ``branching`` (2..64, the skip list's 1/p) and ``seed`` (of its
    level generator) tune the native skip list's shape; tests shrink them to
    force deep or flat lists.  The fallback validates and ignores them.
    """

    order: str
    tie_break: str

    @property
    def next_seq(self) -> int:
        """The arrival sequence the next unsequenced write will get."""

    def __len__(self) -> int: ...

    def __contains__(self, member: object) -> bool:
        """``True`` if ``member`` is present (``False`` for non-strings)."""

    def __iter__(self) -> Iterator[tuple[str, float]]:
        """``(member, score)`` in rank order.

        Changing the index while iterating raises ``RuntimeError``.
        """

    # --- writes ------------------------------------------------------------

    def set(
        self, member: str, score: float, when: When = When.ALWAYS, seq: int | None = None
    ) -> WriteResult:
        """Set ``member``'s score if ``when`` allows it.  O(log n).

        Setting the score a member already has changes nothing (its arrival
        sequence is kept: it reached that score first).
        """

    def incr(self, member: str, delta: float, seq: int | None = None) -> WriteResult:
        """Add ``delta`` to ``member``'s score (an absent member starts at 0,
        and is added even when ``delta`` is 0).  O(log n)."""

    def remove(self, member: str) -> WriteResult:
        """Remove ``member``: ``(old, None, True)``, or ``(None, None, False)``
        if it was absent.  O(log n)."""

    def clear(self) -> None:
        """Remove every member.  ``next_seq`` is kept, so arrival order stays
        monotonic."""

    @property
    def peaks(self) -> tuple[int, int]:
        """``(length, member bytes)``: the most members the index held and the
        longest member (UTF-8 bytes) it took since it was made, cleared,
        loaded, emptied by a removal or :meth:`reset_peaks` (a Redis set's
        encoding follows them: an emptied Redis set is a deleted key)."""

    @property
    def full(self) -> bool:
        """Whether a write that changes a score may be refused with
        ``OverflowError`` for want of room the index numbers (not memory):
        a native index numbers its members, pages and name bytes in
        fixed-width fields.  The engine asks before a submission changes
        any window, so that such a write is refused whole.  O(1)."""

    def reach(self, length: int) -> None:
        """Count ``length`` members as held in :attr:`peaks` (a Redis ``ZADD``
        of that many pairs converts its set first, whatever it adds).  O(1)."""

    def reset_peaks(self) -> None:
        """Set :attr:`peaks` to what the index holds now.  O(n)."""

    def positive_zeros(self) -> int:
        """Make every score of ``-0.0`` ``0.0`` (no member moves); return how
        many were.  O(n)."""

    def apply_batch(
        self,
        ops: Iterable[tuple[int, str, float | None] | tuple[int, str, float | None, int | None]],
    ) -> list[BatchResult | Exception]:
        """Apply ``(op, member, value[, seq])`` operations in order.

        ``op`` is an :class:`Op`; ``value`` is the score (``SET*``), the delta
        (``INCR``) or ignored (``REMOVE``).  Each result is
        ``(old, new, changed, rank)`` with the unique rank after the
        operation (``None`` if absent), or, for an invalid operation, the
        ``TypeError``/``ValueError`` that the single-call method would have
        raised, or for one the index has no room for (``full``), its
        ``OverflowError``: that operation changes nothing and the others
        still apply.
        """

    def set_states(self, states: Iterable[tuple[str, float, int]]) -> None:
        """Give members exact ``(member, score, seq)`` states; a later entry
        for the same member wins.

        For replaying a log that recorded absolute states: unlike ``set``,
        the arrival sequence is taken as given even when the score does not
        change, so the outcome does not depend on the order in which
        different members are applied (a log collapsed to each member's
        last state replays to the same index).  Every entry is validated
        first: an invalid one raises the error ``set`` would raise and
        nothing changes.  ``next_seq`` moves past the largest ``seq``.

        O(k log n) for k entries; a batch large against the index is
        applied by re-threading the whole list once, O(n + k log k).
        """

    def set_states_packed(self, states: bytes | bytearray | memoryview) -> int:
        """``set_states`` for the same states packed in one buffer
        (:mod:`rankd.index.packed`), which a native index reads in place;
        returns how many states the run held.  A run that is not one (cut
        short, a member empty, too long or not UTF-8, a score not finite, a
        seq beyond ``MAX_SEQ``) raises ``ValueError`` and changes nothing.
        """

    # --- reads ---------------------------------------------------------------

    def score(self, member: str) -> float | None:
        """``member``'s score, or ``None``.  O(1)."""

    def rank(self, member: str) -> int | None:
        """Unique 1-based rank, or ``None``.  O(log n)."""

    def competition_rank(self, member: str) -> int | None:
        """1 + members with a strictly better score, or ``None``.  O(log n)."""

    def dense_rank(self, member: str) -> int | None:
        """1 + distinct scores strictly better, or ``None``.  O(log n)."""

    def percentile(self, member: str) -> float | None:
        """Share of members scoring equal or worse, in percent.  O(log n)."""

    def ranks(self, members: Iterable[str]) -> list[int | None]:
        """Unique ranks of many members (``None`` for absent ones)."""

    def member_at(self, rank: int) -> tuple[str, float] | None:
        """``(member, score)`` at a 1-based unique rank, or ``None`` past the
        end.  ``rank < 1`` raises ``ValueError``.  O(log n)."""

    def range_by_rank(
        self, offset: int = 0, limit: int | None = None, *, reverse: bool = False
    ) -> list[Entry]:
        """Entries by rank, skipping ``offset`` and returning at most
        ``limit`` (``None``: to the end).

        ``reverse=True`` starts from the worst member; the ranks reported are
        still the true ranks.  Negative ``offset`` or ``limit`` raises
        ``ValueError``.  O(log n + limit).
        """

    def range_by_score(
        self,
        low: float,
        high: float,
        *,
        low_exclusive: bool = False,
        high_exclusive: bool = False,
        offset: int = 0,
        limit: int | None = None,
        reverse: bool = False,
    ) -> list[Entry]:
        """Entries with ``low <= score <= high`` (bounds may be excluded or be
        infinite), in rank order (or from the worst with ``reverse``).

        ``low > high`` gives an empty list; a NaN bound raises ``ValueError``.
        O(log n + offset + limit).
        """

    def count(
        self,
        low: float,
        high: float,
        *,
        low_exclusive: bool = False,
        high_exclusive: bool = False,
    ) -> int:
        """Number of members with a score in the range.  O(log n)."""

    def around(self, member: str, above: int = 5, below: int = 5) -> list[Entry] | None:
        """Up to ``above`` entries ranked better than ``member``, the member,
        and up to ``below`` ranked worse; ``None`` if absent.  Negative
        counts raise ``ValueError``.  O(log n + above + below).
        """

    # --- snapshots and checks ----------------------------------------------

    def dump(self) -> bytes:
        """The whole index in the dump format above.  O(n)."""

    def dump_chunks(self, max_bytes: int) -> Iterable[bytes]:
        """:meth:`dump`'s bytes as pieces of about ``max_bytes`` (the native
        indexes cut between records, one record at least a piece), made as
        they are iterated, so a snapshot never holds a board's whole dump;
        the iterable's ``size`` is their total.  The index must not change
        meanwhile (``RuntimeError``).  O(n)."""

    def dump_walk(self, max_bytes: int) -> Iterator[bytes]:
        """The records of a walked dump (format above) in pieces of about
        ``max_bytes`` (one record at least), each made when it is asked
        for; the index may change between pieces, never during one.  After
        the last piece, ``header()`` gives the dump's 24-byte header; the
        dump is the header, the pieces and the CRC-32 of both.  O(log n)
        a piece to find its place, O(n) in all."""

    @classmethod
    def load(cls, data: bytes) -> RankIndexAPI:
        """Rebuild an index from :meth:`dump` output; ``ValueError`` if the
        data is corrupt.  O(n)."""

    @classmethod
    def load_chunks(cls, pieces: Iterable[bytes], size: int | None = None) -> RankIndexAPI:
        """:meth:`load` of a dump given as pieces cut anywhere (``size``:
        their total, if known), each let go before the next is read: a
        restart holds a window of the snapshot, not the board's dump.
        ``ValueError`` as :meth:`load`.  O(n)."""

    def _check(self) -> None:
        """Verify every internal invariant; raise ``AssertionError`` if one
        fails.  O(n): for tests."""
