"""Security: authentication, scopes, rate limits, signed submissions, audit.

Every front-end asks one :class:`Gate` before it runs an operation, by the
operation's name, so REST, the TCP protocol and the live feed enforce the
same rules from the one table :data:`OPERATION_SCOPES`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from rankd.security.auth import (
    ANONYMOUS_ALL,
    AuthConfig,
    Authenticator,
    Forbidden,
    Principal,
    Unauthorized,
    require,
)
from rankd.security.limits import LimitsConfig, RateLimited, RateLimiter

audit_log = logging.getLogger("rankd.audit")

#: Operation -> scope it needs.  None: open to all; "self": any
#: authenticated caller (reads its own standing).  Operations missing here
#: need ``admin``: a new endpoint is closed until someone opens it.
OPERATION_SCOPES: dict[str, str | None] = {
    "health": None, "openapi": None, "page": None, "static_file": None,
    "hello": None, "auth": None, "ready": None, "metrics": "read",
    "list_boards": "read", "get_board": "read", "top": "read", "member": "read",
    "around": "read", "ranks": "read", "periods": "read", "live_socket": "read",
    "live_events": "read", "realtime_token": "read",
    "submit": "write", "submit_batch": "write", "submit_many": "write",
    "remove_member": "write",
    "put_board": "admin", "patch_board": "admin", "delete_board": "admin", "digest": "admin",
    "snapshot": "admin",
    "me": "self",
}
ADMIN_ACTIONS = frozenset({"put_board", "patch_board", "delete_board", "snapshot"})

__all__ = [
    "ANONYMOUS_ALL",
    "OPERATION_SCOPES",
    "AuthConfig",
    "Forbidden",
    "Gate",
    "LimitsConfig",
    "Principal",
    "RateLimited",
    "Unauthorized",
]


def audit(event: str, **fields: object) -> None:
    """One structured audit line (JSON logs carry the fields); never secrets."""
    details = " ".join(f"{name}={value}" for name, value in fields.items())
    audit_log.info("%s %s", event, details, extra={"fields": {"audit": event, **fields}})


@dataclass
class Gate:
    """Admits or refuses an operation for a caller."""

    authenticator: Authenticator
    limiter: RateLimiter
    signing_secret: str | None = None

    @classmethod
    def open(cls) -> Gate:
        """No authentication, no limits (embedded use and tests)."""
        return cls(Authenticator(AuthConfig()), RateLimiter(LimitsConfig(0, 0, 0, 0)))

    @property
    def auth_enabled(self) -> bool:
        return self.authenticator.enabled

    def identify(self, credential: str | None, operation: str, address: str) -> Principal:
        """The caller behind ``credential``; audited and raised when refused."""
        try:
            return self.authenticator.authenticate(credential)
        except Unauthorized as exc:
            audit("auth_rejected", operation=operation, address=address, reason=exc.message)
            raise

    def admit(self, principal: Principal, operation: str, address: str, cost: int = 1) -> None:
        """Check scope and rate limits for ``operation`` (``cost``: events in it)."""
        scope = OPERATION_SCOPES.get(operation, "admin")
        if scope == "self":
            if principal.subject is None and self.auth_enabled:
                raise Forbidden("this operation needs a token whose subject is a member")
        elif scope is not None:
            try:
                require(principal, scope)
            except Forbidden as exc:
                audit("auth_rejected", operation=operation, address=address,
                      principal=principal.name, reason=exc.message)
                raise
        if scope is not None:
            kind = "read" if scope in ("read", "self") else "write"
            self.limiter.check(kind, address, principal.name, cost)

    def admitted(self, credential: str | None, operation: str, address: str,
                 cost: int = 1) -> Principal:
        """:meth:`identify` then :meth:`admit`."""
        if OPERATION_SCOPES.get(operation, "admin") is None:
            return ANONYMOUS_ALL
        principal = self.identify(credential, operation, address)
        self.admit(principal, operation, address, cost)
        return principal

    def done(self, principal: Principal, operation: str, address: str, **fields: object
             ) -> None:
        """Record an admin action once it succeeded."""
        if operation in ADMIN_ACTIONS:
            audit("admin_action", operation=operation, principal=principal.name,
                  address=address, **fields)
