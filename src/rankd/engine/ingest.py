"""The ingest path: how a batch of submissions changes the boards.

:func:`ingest` takes submissions in order and, for each one, all before
the next:

1. validates it, refusing it with its own :class:`EngineError` (the others
   still apply);
2. answers a repeated ``event_id`` from the board's dedupe table, changing
   nothing (a repeat later in the same batch finds the earlier event there);
3. applies the board's policy and guards to compute the member's new score
   in every window, *before* changing any, so a guard violation in one
   window changes nothing in the others;
4. writes the changed windows to their indexes with the record's log
   position as arrival sequence, and reads the unique rank in the board's
   primary window;
5. builds the WAL record (:mod:`rankd.engine.records`), which carries the
   absolute new scores, and notes the event in the dedupe table, the labels
   and the board version (:func:`note_submit`, which replay shares).

The caller then appends the records to the WAL and acknowledges only once
the fsync policy is met.  It runs synchronously, so no other coroutine
sees a batch half-applied.

Doing each submission to the end before the next is simpler than
preparing a whole batch against an overlay of its own pending changes and
applying it afterwards (what rankd did before), and 1.5x faster.

This is the hot loop of every write, so like the index it has a native
implementation, ``rankd.engine._ingest``, chosen at import
(``RANKD_PURE_PYTHON=1`` forces :func:`ingest_python`).  The native one
takes the common shape of submission through C (see its docstring) and
hands every other one to :func:`ingest_one` here, so errors and rare cases
are written once; the tests check that both leave the same answers, WAL
records and state.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from rankd._native import native_or
from rankd.engine import records, zeros
from rankd.engine.config import (
    MAX_EVENT_ID_BYTES,
    MAX_LABEL_CHARS,
    REFUSED_CHARACTERS,
    BoardConfig,
)
from rankd.engine.dedupe import CONFLICT, fingerprint
from rankd.engine.errors import (
    BoardFull,
    EngineError,
    EventConflict,
    GuardViolation,
    InvalidInput,
    NotFound,
)
from rankd.engine.periods import period_of
from rankd.index import MAX_MEMBER_BYTES

if TYPE_CHECKING:
    from rankd.engine.board import Board
    from rankd.engine.submission import Submission


#: Integers beyond this do not survive the trip through a float64 score.
_MAX_EXACT_INT = 2**53

#: Conditions a submission may carry (``Submission.condition``, bits), as
#: Redis's ``ZADD NX|XX|GT|LT`` has them: a submission whose condition does
#: not hold against the member's current score in the board's primary
#: window changes nothing and is answered ``"skipped": true``.
IF_ABSENT = 1
IF_PRESENT = 2
#: The resulting score must be above (or below) the current one; a member
#: not on the board yet passes.
IF_GREATER = 4
IF_LESS = 8
CONDITIONS = IF_ABSENT | IF_PRESENT | IF_GREATER | IF_LESS
#: Not a condition: the submission is the first of a Redis ``ZADD`` of
#: more than 128 pairs, which makes a RESP board's set a skiplist before it
#: adds anything (Redis 7.2's ``zsetTypeMaybeConvert``, see
#: rankd.engine.zeros).  It rides in ``condition`` so that the native
#: ingest, which takes no conditional submission, hands it here.
SKIPLIST_FIRST = 16


class Ingested(NamedTuple):
    """What one :func:`ingest` call did."""

    #: One per submission: its answer (a dict) or its ``EngineError``.
    answers: list[dict[str, Any] | EngineError]
    #: Encoded WAL records of the applied submissions, in log order.
    payloads: list[bytes]
    #: Names of the boards those records changed or touched.
    boards: set[str]
    rejected: int
    duplicates: int


def ingest_python(boards: dict[str, Board], submissions: Iterable[Submission], now: float,
                  first_lsn: int, dedupe_ttl: float, ts_tolerance: float) -> Ingested:
    """Apply ``submissions`` to ``boards``; the records get log positions
    ``first_lsn, first_lsn + 1, ...`` (see the module docstring)."""
    answers: list[dict[str, Any] | EngineError] = []
    payloads: list[bytes] = []
    names: set[str] = set()
    rejected = duplicates = 0
    now_ms = round(now * 1000)
    for submission in submissions:
        try:
            answer = ingest_one(boards, submission, now, now_ms, first_lsn + len(payloads),
                                dedupe_ttl, ts_tolerance, payloads)
        except EngineError as error:
            answers.append(error)
            rejected += 1
            continue
        if answer["duplicate"]:
            duplicates += 1
        else:
            names.add(submission.board)
        answers.append(answer)
    return Ingested(answers, payloads, names, rejected, duplicates)


def ingest_one(boards: dict[str, Board], sub: Submission, now: float, now_ms: int, lsn: int,
               dedupe_ttl: float, ts_tolerance: float, payloads: list[bytes]
               ) -> dict[str, Any]:
    """Apply one submission (its record, at log position ``lsn``, goes to
    ``payloads``) and return its answer, or raise its ``EngineError``
    having changed nothing."""
    name = sub.board
    board = boards.get(name) if type(name) is str else None
    if board is None:
        raise missing_board(name)
    config = board.config
    member = check_member(sub.member)
    label = sub.label
    if label is not None:
        check_label(label)
    event_id = sub.event_id
    value = None
    condition = sub.condition
    skiplist_first = type(condition) is int and condition & SKIPLIST_FIRST
    if skiplist_first:
        condition &= ~SKIPLIST_FIRST
    if event_id is not None:
        if condition:
            raise InvalidInput("a conditional submission takes no event_id")
        check_event_id(event_id)
        if board.dedupe.remembers(event_id, now):
            value = submitted_value(name, config, sub.score, sub.delta)
            remembered = board.dedupe.get(event_id, member,
                                          fingerprint(sub.delta is not None, value, label), now)
            check_same_event(event_id, remembered)
            return answer(member, event_id, remembered, True)
    ts = now if sub.ts is None else check_ts(sub.ts, now, ts_tolerance)
    if value is None:
        value = submitted_value(name, config, sub.score, sub.delta)
    is_delta = sub.delta is not None
    if skiplist_first and config in zeros.REDIS_CONFIGS:  # (even if NX or XX skip it)
        for window in config.windows:
            board.index_for_write(window, period_of(window, ts)).reach(zeros.LISTPACK_ENTRIES + 1)
    if condition:
        skipped = unmet_condition(board, member, condition, is_delta, value, ts)
        if skipped is not None:
            return skipped

    changes = []
    for window in config.windows:
        period = period_of(window, ts)
        index = board.index(window, period)
        old = None if index is None else index.score(member)
        new = new_score(config, old, value, is_delta)
        if new == 0.0 and new is not old and zeros.is_negative_zero(new):
            new = zeros.stored_zero(config, index, member, old is None)
        changes.append((window, period, old, new))
    for window, period, old, new in changes:
        if new != old:
            check_room(board, window, period)
    updates = []
    primary = config.primary_window
    score = previous = rank = None
    for window, period, old, new in changes:
        if new != old:
            board.index_for_write(window, period).set(member, new, seq=lsn)
            updates.append([window, period, new])
        if window == primary:
            score, previous = new, old
            if new is not None:
                rank = board.index(window, period).rank(member)
    result = [score, rank, previous, bool(updates)]
    record = [records.SUBMIT, name, member, value, is_delta, event_id,
              round(ts * 1000), now_ms, label, updates, result]
    payloads.append(records.encode(record))
    note_submit(board, record, dedupe_ttl)
    return answer(member, event_id, result, False)


def check_room(board: Board, window: str, period: str) -> None:
    """Raise ``BoardFull`` if the index of ``window``'s ``period`` may
    refuse a write for want of room: checked in every window a submission
    changes before any changes, so that the refusal is whole."""
    index = board.index(window, period)
    if index is not None and index.full:
        raise BoardFull(f"board {board.name!r} holds as many members as one index can in "
                        f"window {window!r} (period {period!r}); remove members to write "
                        "new scores there")


def unmet_condition(board: Board, member: str, condition: object, is_delta: bool,
                    value: float, ts: float) -> dict[str, Any] | None:
    """The answer of a submission whose ``condition`` does not hold (it
    changes nothing), or None if it holds."""
    if type(condition) is not int or not 0 < condition <= CONDITIONS:
        raise InvalidInput("condition must be a combination of IF_ABSENT, IF_PRESENT, "
                           "IF_GREATER and IF_LESS")
    window = board.config.primary_window
    index = board.index(window, period_of(window, ts))
    old = None if index is None else index.score(member)
    if old is None:
        held = not condition & IF_PRESENT
    else:
        new = old + value if is_delta else value
        held = not (condition & IF_ABSENT or (condition & IF_GREATER and not new > old)
                    or (condition & IF_LESS and not new < old))
    if held:
        return None
    rank = None if old is None else index.rank(member)
    return {**answer(member, None, [old, rank, old, False], False), "skipped": True}


def check_same_event(event_id: str, remembered: object) -> None:
    """A remembered event id sent again must be the same submission (a
    retry); with another member, kind, value or label (the dedupe table
    answers ``CONFLICT``) it is ``EventConflict``."""
    if remembered is CONFLICT or remembered is None:
        raise EventConflict(f"event_id {event_id!r} was already used for another submission; "
                            "a retry must repeat it exactly (member, value and label), and "
                            "a new event needs a new id")


def note_submit(board: Board, record: Sequence, dedupe_ttl: float) -> None:
    """What a SUBMIT record changes besides the indexes: label, dedupe, version.

    Live ingest and replay share it.
    """
    if record[8] is not None:
        board.labels[record[2]] = record[8]
    if record[5] is not None:
        # The original answer, which a retry repeats, under what it asked for.
        board.dedupe.remember(record[5], record[7] / 1000 + dedupe_ttl, record[10], record[2],
                              fingerprint(record[4], float(record[3]), record[8]))
    if record[9]:
        board.version += 1
        board.updated_at = record[7] / 1000


def answer(member: str, event_id: str | None, result: Sequence, duplicate: bool
           ) -> dict[str, Any]:
    """The answer to a submission, from its record's result ``[score, rank,
    previous, changed]``."""
    score, rank, previous, changed = result[:4]
    return {"member": member, "score": score, "rank": rank, "previous": previous,
            "changed": changed, "duplicate": duplicate, "event_id": event_id}


# --- validation ---------------------------------------------------------------------


def missing_board(name: object) -> EngineError:
    if not isinstance(name, str):
        return InvalidInput("board name must be a string")
    return NotFound(f"no board named {name!r}")


def check_text(text: str, what: str) -> None:
    """Refuse ``text`` holding any of :data:`REFUSED_CHARACTERS`, naming it."""
    found = REFUSED_CHARACTERS.search(text)
    if found is not None:
        raise InvalidInput(f"{what} must not contain U+{ord(found.group()):04X} (control "
                           "and invisible formatting characters are refused)")


def check_member(member: object) -> str:
    if (type(member) is str and 0 < len(member) <= MAX_MEMBER_BYTES and member.isascii()
            and member.isprintable()):
        return member  # the common case, without encoding
    if not isinstance(member, str) or not member:
        raise InvalidInput("member must be a non-empty string")
    check_text(member, "member")
    try:
        size = len(member.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidInput("member is not valid UTF-8 text") from None
    if size > MAX_MEMBER_BYTES:
        raise InvalidInput(f"member must be at most {MAX_MEMBER_BYTES} bytes in UTF-8, "
                           f"got {size}")
    return member


def check_label(label: object) -> None:
    if not isinstance(label, str) or len(label) > MAX_LABEL_CHARS or utf8_size(label) is None:
        raise InvalidInput(f"label must be text of at most {MAX_LABEL_CHARS} characters")
    check_text(label, "label")


def check_event_id(event_id: object) -> None:
    if (type(event_id) is str and 0 < len(event_id) <= MAX_EVENT_ID_BYTES
            and event_id.isascii() and event_id.isprintable()):
        return
    if (not isinstance(event_id, str) or not event_id
            or not 0 < (utf8_size(event_id) or 0) <= MAX_EVENT_ID_BYTES):
        raise InvalidInput(f"event_id must be a non-empty string of at most "
                           f"{MAX_EVENT_ID_BYTES} bytes")
    check_text(event_id, "event_id")


def check_ts(ts: object, now: float, tolerance: float) -> float:
    value = number(ts, "ts")
    if abs(value - now) > tolerance:
        raise InvalidInput(f"ts {value} is more than {tolerance:g}s away "
                           f"from the server clock ({now:.3f})")
    return value


def submitted_value(name: str, config: BoardConfig, score: object, delta: object) -> float:
    """The submitted number, checked against the board's policy: a score,
    or a delta on ``sum`` boards; ``latest`` boards take either (a delta
    is an explicit increment of the latest score)."""
    if config.policy == "latest" and delta is not None and score is None:
        value = number(delta, "delta")
        if config.max_delta is not None and abs(value) > config.max_delta:
            raise GuardViolation(f"delta {value:g} exceeds max_delta {config.max_delta:g}")
        return value
    if config.policy == "sum":
        if delta is None or score is not None:
            raise InvalidInput(f"board {name!r} sums deltas: submit 'delta', not 'score'")
        value = number(delta, "delta")
        if config.max_delta is not None and abs(value) > config.max_delta:
            raise GuardViolation(f"delta {value:g} exceeds max_delta {config.max_delta:g}")
        return value
    if score is None or delta is not None:
        raise InvalidInput(f"board {name!r} keeps the {config.policy} score: "
                           "submit 'score', not 'delta'")
    return number(score, "score")


def new_score(config: BoardConfig, old: float | None, value: float, is_delta: bool
              ) -> float | None:
    """Apply the policy and guards: the member's score after ``value`` (a
    delta if ``is_delta``)."""
    if is_delta:
        new = value if old is None else old + value
        if not math.isfinite(new):
            raise InvalidInput("the resulting score is not finite")
    elif config.policy == "best" and old is not None:
        better = value > old if config.order == "desc" else value < old
        new = value if better else old
    else:
        new = value
    if new == old:
        return old
    if config.min_score is not None and new < config.min_score:
        raise GuardViolation(f"score {new:g} is below min_score {config.min_score:g}")
    if config.max_score is not None and new > config.max_score:
        raise GuardViolation(f"score {new:g} is above max_score {config.max_score:g}")
    if (config.max_delta is not None and old is not None and config.policy != "sum"
            and abs(new - old) > config.max_delta):
        raise GuardViolation(f"a change of {abs(new - old):g} exceeds max_delta "
                             f"{config.max_delta:g}")
    return new


def number(value: object, what: str) -> float:
    """``value`` as a float, or ``InvalidInput``: finite, integers exact (at
    most 2**53).  A -0.0 stays one: which zero a board stores is
    :func:`rankd.engine.zeros.stored_zero`'s to say."""
    if type(value) is float and math.isfinite(value):
        return value
    if type(value) is int and -_MAX_EXACT_INT <= value <= _MAX_EXACT_INT:
        return float(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(f"{what} must be a number")
    if isinstance(value, int) and abs(value) > _MAX_EXACT_INT:
        raise InvalidInput(f"{what} {value} is beyond 2**53 and cannot be stored exactly")
    value = float(value)
    if not math.isfinite(value):
        raise InvalidInput(f"{what} must be finite")
    return value


def utf8_size(text: str) -> int | None:
    """Bytes of ``text`` in UTF-8, or None if it cannot be encoded (lone surrogates)."""
    if text.isascii():
        return len(text)
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return None


def ingest_packed_unavailable(*args: Any) -> Ingested:
    raise RuntimeError("packed submissions come only from native front-ends, and need the "
                       "native ingest kernel")


ingest, IMPLEMENTATION = native_or("rankd.engine._ingest", "ingest", ingest_python)
#: Native ingest of ``rankd.engine._packed.Packed`` submissions (see
#: ``Engine.submit_packed``); front-ends pack only when it is built.
ingest_packed, _ = native_or("rankd.engine._ingest", "ingest_packed",
                             ingest_packed_unavailable)
