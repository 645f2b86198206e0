"""What the fault harness records: every write, every read and every live
message, each with when it was invoked and when it completed (the
harness's monotonic clock), so the checker (``properties.py``) can decide
from the history alone."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Operation:
    """One write attempt: ``delta: 1`` to ``member`` of ``board`` with ``event_id``."""

    event_id: str
    board: str
    member: str
    node: int
    invoked: float
    completed: float = 0.0
    #: ok, fail or unknown
    outcome: str = "unknown"
    detail: str = ""
    #: A probe member's write: its number n (the member's n-th write); None for the load's.
    number: int | None = None
    #: The group epoch an acknowledgement named: the term of the primary that
    #: applied it (None: not acknowledged, or a single node's answer).
    epoch: int | None = None

    @property
    def applied_here(self) -> bool:
        """Acknowledged as applied by this very attempt (not as a duplicate)."""
        return self.outcome == "ok" and "duplicate" not in self.detail


@dataclass
class Read:
    """One member read (``GET /v1/boards/{board}/members/{member}``) on ``node``."""

    node: int
    #: The node's incarnation (how often the harness restarted it): reads of a
    #: node are compared within one incarnation only.
    incarnation: int
    board: str
    member: str
    invoked: float
    completed: float = 0.0
    #: The HTTP status, 0 when no answer came (a timeout, a broken connection).
    status: int = 0
    #: The member's score on 200, 0.0 on 404 ``no member``, else None.
    score: float | None = None
    version: int | None = None
    #: The error code of a refusal (``not_found``, ``unavailable``...).
    code: str = ""

    @property
    def board_missing(self) -> bool:
        """A 404 saying the board itself is not there (not just the member)."""
        return self.status == 404 and self.score is None


@dataclass
class LiveMessage:
    """One ``leaderboard.updated`` message of ``board``'s live feed on ``node``."""

    node: int
    incarnation: int
    board: str
    received: float
    version: int
    #: The top-N as ``(member, score)`` pairs, in rank order.
    top: tuple[tuple[str, float], ...]


@dataclass
class History:
    operations: list[Operation] = field(default_factory=list)
    reads: list[Read] = field(default_factory=list)
    live: list[LiveMessage] = field(default_factory=list)
    #: The checker's own resubmissions of unresolved events (after the load).
    resubmissions: list[Operation] = field(default_factory=list)
    #: (time, what the nemesis did)
    faults: list[tuple[float, str]] = field(default_factory=list)

    def outcomes(self) -> Counter:
        return Counter(op.outcome for op in self.operations)

    def latencies(self) -> list[float]:
        return sorted(op.completed - op.invoked for op in self.operations if op.outcome == "ok")

    def acknowledged(self) -> set[str]:
        """Event ids some attempt got acknowledged (``ok``)."""
        return {op.event_id for op in self.operations if op.outcome == "ok"}
