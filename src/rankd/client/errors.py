"""Exceptions of the rankd client, one per protocol error code."""

from __future__ import annotations


class RankdError(Exception):
    """An error answered by the server (``code`` as in the protocol spec)."""

    code = "error"

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class InvalidInput(RankdError):
    code = "invalid"


class GuardViolation(RankdError):
    code = "guard"


class NotFound(RankdError):
    code = "not_found"


class Conflict(RankdError):
    code = "conflict"


class EventConflict(Conflict):
    """An event id already used for another submission (not a retry)."""

    code = "event_conflict"


class TooLarge(RankdError):
    code = "too_large"


class ReadOnly(RankdError):
    """The server stopped taking writes after a storage failure; reads work."""

    code = "read_only"


class Unavailable(RankdError):
    """The server is recovering or shutting down: retry later."""

    code = "unavailable"


class Moved(RankdError):
    """A cluster node that does not write this board's group: ``address``
    (``host:port``) is the node that does.  Nothing was applied; the client
    sends the request there by itself (``follow_moved``)."""

    code = "moved"

    def __init__(self, message: str, code: str | None = None,
                 address: str | None = None, group: int | None = None,
                 node: str | None = None, epoch: int | None = None) -> None:
        super().__init__(message, code)
        self.address = address
        #: The board's group, the node that writes it and the topology epoch
        #: (a server before hash slots sends none of them).
        self.group, self.node, self.epoch = group, node, epoch


class NotPrimary(RankdError):
    """A cluster write no node could take just now (a failover under way):
    nothing was applied; retry shortly."""

    code = "not_primary"


class Unacknowledged(RankdError):
    """A cluster write the cluster's log did not confirm in time: it may
    still be applied; resubmit it with the same event id."""

    code = "unacknowledged"


class Unauthorized(RankdError):
    """No valid credential."""

    code = "unauthorized"


class Forbidden(RankdError):
    """The credential lacks the scope the operation needs."""

    code = "forbidden"


class RateLimited(RankdError):
    """Over a rate limit: slow down."""

    code = "rate_limited"


class ProtocolError(RankdError):
    """The client and server disagree about the protocol (a bug, or a version)."""

    code = "protocol"


class ConnectionLost(RankdError, ConnectionError):
    """The connection broke before the answer came; the request may or may not
    have been applied."""

    code = "connection_lost"


class RequestTimeout(RankdError, TimeoutError):
    """No answer within the timeout; the request may or may not have been applied."""

    code = "timeout"


_BY_CODE: dict[str, type[RankdError]] = {
    cls.code: cls for cls in (InvalidInput, GuardViolation, NotFound, Conflict, EventConflict,
                              TooLarge, ReadOnly, Unavailable, Unauthorized, Forbidden,
                              RateLimited, Moved, NotPrimary, Unacknowledged)
}
_PROTOCOL_CODES = {"bad_frame", "bad_request", "unknown_op", "hello_required",
                   "unsupported_version"}


def error_for(code: str, message: str, body: dict | None = None) -> RankdError:
    """The exception for an error body ``{"code", "message", ...}``."""
    if code in _PROTOCOL_CODES:
        return ProtocolError(message, code)
    if code == "moved":
        body = body or {}
        return Moved(message, code, body.get("address"), body.get("group"), body.get("node"),
                     body.get("epoch"))
    return _BY_CODE.get(code, RankdError)(message, code)
