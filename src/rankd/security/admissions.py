"""Callers already admitted to one operation, remembered: the gate's answer
for a credential worked out once, not on every request.

A REST client sends the same ``Authorization`` header from the same address
request after request; :meth:`Gate.admitted` would parse the header, look up
or verify the credential (a SHA-256 or a JWT signature check), check the
scope and work out which rate limits apply, every time.  :class:`Admissions`
keeps, per (header, address), the :class:`Principal` that was admitted and
the rate-limit charge that applies to it (``Gate.charger``: None when
nothing can refuse it), so a later request only pays the charge.

Only successful admissions are kept, and only of principals that hold the
operation's scope outright (a refusal is audited, so it always takes the
gate's way).  An entry lasts until its credential expires (a token's
``exp``; after that the gate decides again, and refuses it), and the table
is bounded (entries, and the length of a header kept): full, it is emptied.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rankd.security import OPERATION_SCOPES, Gate
from rankd.security.auth import Principal

#: Distinct (header, address) pairs kept at most.
MAX_ADMISSIONS = 4096
#: Headers longer than this are not kept (the table stays under ~10 MB even
#: where any header is admitted: a server without authentication).
MAX_HEADER_CHARS = 2048


class Admissions:
    """The gate's admissions of one ``operation``, by (header, address)."""

    def __init__(self, gate: Gate, operation: str, max_entries: int = MAX_ADMISSIONS) -> None:
        self.gate = gate
        self.operation = operation
        self.max_entries = max_entries
        self._scope = OPERATION_SCOPES.get(operation, "admin")
        #: (Authorization header or None, address) -> (principal, charge, expires)
        self._entries: dict[tuple[str | None, str],
                            tuple[Principal, Callable[[int], None] | None, float | None]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, header: str | None, address: str) -> Principal | None:
        """The principal admitted before for ``header`` from ``address``,
        charged one request against its rate limits (``RateLimited`` when
        over, as the gate raises it), or None: ask the gate."""
        entry = self._entries.get((header, address))
        if entry is None:
            return None
        principal, charge, expires = entry
        if expires is not None and time.time() >= expires:
            del self._entries[(header, address)]
            return None
        if charge is not None:
            charge(1)
        return principal

    def put(self, header: str | None, address: str, principal: Principal) -> None:
        """Remember that the gate admitted ``principal`` for ``header`` from
        ``address`` (only if it holds the operation's scope outright)."""
        scope = self._scope
        if (scope in (None, "self") or not principal.allows(scope)
                or (header is not None and len(header) > MAX_HEADER_CHARS)):
            return
        if len(self._entries) >= self.max_entries:
            self._entries.clear()
        self._entries[(header, address)] = (
            principal, self.gate.charger(principal, self.operation, address), principal.expires)
