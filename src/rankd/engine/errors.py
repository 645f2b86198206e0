"""Errors the engine reports to its callers.

Every error carries a stable machine-readable ``code`` that front-ends map
to a status (HTTP) or an error frame (TCP), and a message for people.
"""

from __future__ import annotations


class EngineError(Exception):
    """A request the engine refused; nothing was changed."""

    code = "invalid"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


class InvalidInput(EngineError):
    """Malformed or out-of-range input (HTTP 422)."""

    code = "invalid"


class GuardViolation(EngineError):
    """A submission outside the board's score guards (HTTP 422)."""

    code = "guard"


class NotFound(EngineError):
    """No such board, member or period (HTTP 404)."""

    code = "not_found"


class Conflict(EngineError):
    """The request contradicts the current state (HTTP 409)."""

    code = "conflict"


class BoardFull(Conflict):
    """A submission that would change a window whose index has no room left
    that it numbers (hundreds of millions of members, or gigabytes of
    names: see ``RankIndexAPI.full``): refused whole, in every window, and
    the engine goes on taking writes that need no room there."""


class StorageError(EngineError):
    """The disk refused an operation that is not a write, such as a
    snapshot (HTTP 503); the log and the state are unchanged."""

    code = "storage"


class EventConflict(Conflict):
    """An event id already used for another submission (HTTP 409): the
    second is not a retry of the first, and is not applied."""

    code = "event_conflict"


class ReadOnly(EngineError):
    """The engine stopped accepting writes after a storage failure (HTTP 503).

    Reads keep working; a restart is needed to accept writes again.
    """

    code = "read_only"


class NotPrimary(EngineError):
    """A cluster node asked to write a board whose group another node
    writes (HTTP 421): nothing was applied.  ``primary`` is that node's
    advertised address when known; front-ends forward the request there."""

    code = "not_primary"

    def __init__(self, message: str, primary: str | None = None,
                 primary_tcp: str | None = None, *, group: int | None = None,
                 node: str | None = None, epoch: int | None = None,
                 primary_resp: str | None = None) -> None:
        super().__init__(message)
        self.primary = primary
        #: The primary's TCP protocol address (the TCP front-end answers ``moved``).
        self.primary_tcp = primary_tcp
        #: The primary's Redis-protocol address (what a RESP error names).
        self.primary_resp = primary_resp
        #: The board's group, the node that writes it, and the topology epoch
        #: this was decided at (clients keep the newest map they were told).
        self.group, self.node, self.epoch = group, node, epoch

    def resp_message(self) -> str:
        """The message as a Redis client reads it: the primary named at its
        RESP address (``host:port`` of its Redis port, as ``-MOVED`` names
        it), not at its HTTP one, which ``message`` names for REST."""
        if self.primary is None:
            return self.message
        named = f"at {self.primary}"
        if self.primary_resp is not None:
            return self.message.replace(named, f"at {self.primary_resp}")
        return self.message.replace(named, "which serves no RESP port this node knows of")


class Unacknowledged(EngineError):
    """A cluster write whose commit to the cluster's log is not confirmed
    in time (HTTP 503): it may still commit.  Resubmitting it with the same
    event id is safe (a committed one answers as a duplicate)."""

    code = "unacknowledged"


class Unavailable(EngineError):
    """A cluster node that may not take writes of a group just now (HTTP
    503): nothing was applied; try again shortly."""

    code = "unavailable"


class Unsettled(Unavailable):
    """A read of a group whose primary (this node) applied writes its log
    has not committed yet (``--ack log``): a front-end waits for them
    (``Engine.settle``) and reads again.  Answered as it is (HTTP 503,
    ``unavailable``) only when they do not commit in time."""

    def __init__(self, group: int, board: str) -> None:
        super().__init__(f"board {board!r} has writes this node applied that the cluster's "
                         "log has not committed yet; read again shortly")
        self.group = group
