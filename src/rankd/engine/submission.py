"""The value a front-end hands the engine for one score: :class:`Submission`.

It lives on its own, importing only the engine's errors, so that every
module that takes submissions (the engine, the coalescer, ingest, replay,
transactions, the front-ends) names the type without importing
:mod:`rankd.engine.engine`, which imports them: no module here may import
another engine module but :mod:`rankd.engine.errors`.
"""

from __future__ import annotations

from dataclasses import dataclass

from rankd.engine.errors import InvalidInput


@dataclass(slots=True)
class Submission:
    """One score submission, as front-ends hand it to the engine."""

    board: str
    member: str
    score: float | None = None
    delta: float | None = None
    event_id: str | None = None
    ts: float | None = None
    label: str | None = None
    #: ``rankd.engine.ingest.IF_*`` bits (what Redis's ``ZADD NX|XX|GT|LT``
    #: send); 0: none.  Not a field of REST or TCP submissions.
    condition: int = 0

    FIELDS = frozenset({"member", "score", "delta", "event_id", "ts", "label"})

    @classmethod
    def from_dict(cls, board: str, data: object) -> Submission:
        """Build from JSON/msgpack data, refusing unknown fields."""
        if not isinstance(data, dict):
            raise InvalidInput("a submission must be an object")
        if not cls.FIELDS.issuperset(data):
            unknown = sorted(map(str, set(data) - cls.FIELDS))
            raise InvalidInput(f"unknown submission field(s): {', '.join(unknown)}")
        if "member" not in data:
            raise InvalidInput("a submission needs a member")
        return cls(board=board, **data)
