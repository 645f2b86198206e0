"""Security: authentication, scopes, rate limits, signed submissions, audit.

Every front-end asks one :class:`Gate` before it runs an operation, by the
operation's name, so REST, the TCP protocol and the live feed enforce the
same rules from the one table :data:`OPERATION_SCOPES`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from rankd.logbudget import BURST, LineBudget
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
from rankd.security.proxies import TrustedProxies

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
    # The cluster's full state names its nodes' internal addresses: admin only.
    "snapshot": "admin", "cluster": "admin", "cluster_summary": "read",
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
    "TrustedProxies",
    "Unauthorized",
]


#: Audit lines of one kind from one address: at most this many per window;
#: the rest are counted and reported with the next line let through.
AUDIT_BURST = BURST
_audit_budget = LineBudget(AUDIT_BURST)


def audit(event: str, **fields: object) -> None:
    """One structured audit line (JSON logs carry the fields); never secrets.

    A flood of the same event from one address (a password-guessing loop)
    would fill the disk, so past :data:`AUDIT_BURST` lines a minute such
    lines are counted, and the next one written says how many were left out.
    """
    suppressed = _audit_budget.admit((event, fields.get("address")))
    if suppressed is None:
        return
    if suppressed:
        fields = {**fields, "suppressed": suppressed}
    details = " ".join(f"{name}={value}" for name, value in fields.items())
    audit_log.info("%s %s", event, details, extra={"fields": {"audit": event, **fields}})


@dataclass
class Gate:
    """Admits or refuses an operation for a caller."""

    authenticator: Authenticator
    limiter: RateLimiter
    signing_secret: str | None = None
    #: Reverse proxies whose X-Forwarded-For names the client (--trusted-proxies).
    trusted_proxies: TrustedProxies = field(default_factory=TrustedProxies)

    @classmethod
    def open(cls) -> Gate:
        """No authentication, no limits (embedded use and tests)."""
        return cls(Authenticator(AuthConfig()), RateLimiter(LimitsConfig(0, 0, 0, 0)))

    @property
    def auth_enabled(self) -> bool:
        return self.authenticator.enabled

    @staticmethod
    def _kind(operation: str) -> str:
        """Which rate limit ``operation`` counts against: read or write."""
        return ("read" if OPERATION_SCOPES.get(operation, "admin") in (None, "read", "self")
                else "write")

    def identify(self, credential: str | None, operation: str, address: str, *,
                 charged: bool = False, join_only: bool = False) -> Principal:
        """The caller behind ``credential``; audited and raised when refused.
        The client address's rate limit is charged one request first, unless
        the caller ``charged`` it already, so failing credentials cannot be
        tried for free.  ``join_only``: the credential came in a URL, where
        only a join token is accepted."""
        if not charged:
            self.limiter.check_address(self._kind(operation), address)
        try:
            return self.authenticator.authenticate(credential, join_only=join_only)
        except Unauthorized as exc:
            audit("auth_rejected", operation=operation, address=address, reason=exc.message)
            raise

    def charge_refused(self, operation: str, address: str) -> None:
        """Charge one request of ``operation`` to ``address``'s rate limit for
        a credential refused outside :meth:`identify` (a node credential),
        so that it too cannot be tried for free."""
        self.limiter.check_address(self._kind(operation), address)

    def admit(self, principal: Principal, operation: str, address: str, cost: int = 1, *,
              address_charged: bool = False) -> None:
        """Check scope and rate limits for ``operation`` (``cost``: events in
        it); the address's limit only if the caller has not ``address_charged``."""
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
            kind = self._kind(operation)
            if not address_charged:
                self.limiter.check_address(kind, address, cost)
            self.limiter.check_credential(kind, principal.name, cost)

    def charger(self, principal: Principal, operation: str, address: str
                ) -> Callable[[int], None] | None:
        """:meth:`admit` of ``operation`` for this caller at this address as a
        function of the cost, worked out once (for a connection's fast
        path): None when it can never refuse (the scope is held and no rate
        limit applies, e.g. a loopback client under the default limits)."""
        scope = OPERATION_SCOPES.get(operation, "admin")
        if scope is None:
            return None
        if scope == "self" or not principal.allows(scope):
            return functools.partial(self.admit, principal, operation, address)  # refusals audit
        return self.limiter.charger(self._kind(operation), address, principal.name)

    def admitted(self, credential: str | None, operation: str, address: str,
                 cost: int = 1, *, join_only: bool = False) -> Principal:
        """:meth:`identify` then :meth:`admit`, the address's limit charged
        before the credential is even looked at (at least one request: a
        batch's events are charged once its body is read)."""
        if OPERATION_SCOPES.get(operation, "admin") is None:
            return ANONYMOUS_ALL
        self.limiter.check_address(self._kind(operation), address, max(cost, 1))
        principal = self.identify(credential, operation, address, charged=True,
                                  join_only=join_only)
        self.admit(principal, operation, address, cost, address_charged=True)
        return principal

    def done(self, principal: Principal, operation: str, address: str, **fields: object
             ) -> None:
        """Record an admin action once it succeeded."""
        if operation in ADMIN_ACTIONS:
            audit("admin_action", operation=operation, principal=principal.name,
                  address=address, **fields)
