"""Signed submissions: proof that a score came from a trusted game server.

For a board created with ``"signed": true`` every submission must carry an
``event_id``, a ``ts`` (Unix seconds) and ``signature``, the hex
HMAC-SHA256 with the configured signing secret of::

    board | member | value | event_id | ts

where ``value`` is the score or delta and both numbers are written as C's
``printf("%.17g")`` writes a float64 (so every language can reproduce the
exact bytes).  A bad signature, or a ``ts`` more than 60 s away from the
server clock, is refused; a replayed event is answered with its original
result and never applied twice (the engine's event-id dedupe).
"""

from __future__ import annotations

import hashlib
import hmac
import time
from typing import Any

from rankd.engine.errors import InvalidInput
from rankd.security.auth import Unauthorized

MAX_SKEW_SECONDS = 60.0


def canonical(board: str, member: str, value: float, event_id: str, ts: float) -> bytes:
    return "|".join((board, member, f"{float(value):.17g}", event_id,
                     f"{float(ts):.17g}")).encode()


def sign(secret: str, board: str, member: str, value: float, event_id: str, ts: float) -> str:
    """The signature a game server attaches (also used by tests and the client)."""
    message = canonical(board, member, value, event_id, ts)
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def verify(secret: str | None, board: str, event: dict[str, Any], now: float | None = None
           ) -> dict[str, Any]:
    """Check a signed submission; returns the event without its signature."""
    if not secret:
        raise InvalidInput(f"board {board!r} requires signed submissions but no signing "
                           "secret is configured")
    if not isinstance(event, dict):
        raise InvalidInput("a submission must be an object")
    event = dict(event)
    signature = event.pop("signature", None)
    for name in ("event_id", "ts"):
        if event.get(name) is None:
            raise InvalidInput(f"signed submissions need {name!r}")
    value = event.get("score", event.get("delta"))
    if not isinstance(signature, str):
        raise Unauthorized(f"board {board!r} requires a signature on every submission")
    ts, member, event_id = event["ts"], event.get("member"), event["event_id"]
    if (isinstance(ts, bool) or not isinstance(ts, int | float)
            or isinstance(value, bool) or not isinstance(value, int | float)
            or not isinstance(member, str) or not isinstance(event_id, str)):
        raise InvalidInput("signed submissions need a member, a number and a numeric ts")
    now = time.time() if now is None else now
    if abs(now - ts) > MAX_SKEW_SECONDS:
        raise Unauthorized(f"the signed timestamp is {abs(now - ts):.0f} s away from the "
                           f"server clock (at most {MAX_SKEW_SECONDS:.0f} s)")
    expected = sign(secret, board, member, value, event_id, ts)
    if not hmac.compare_digest(expected, signature):
        raise Unauthorized("the submission's signature does not match")
    return event
