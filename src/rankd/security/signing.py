"""Signed submissions: proof that a score came from a trusted game server.

For a board created with ``"signed": true`` every submission must carry an
``event_id``, a ``ts`` (Unix seconds) and a ``signature``::

    v2=<hex HMAC-SHA256 of the canonical bytes, with the signing secret>

The canonical bytes are the tag ``rankd-signed-submission/v2`` and a NUL,
then each of these fields as a big-endian u32 byte length and its UTF-8
bytes, in this order::

    board, member, kind ("score" or "delta"), value, event_id, ts, label

``value`` and ``ts`` are written as C's ``printf("%.17g")`` writes a float64
(every language can reproduce the exact bytes); an absent ``label`` is the
length ``0xFFFFFFFF`` with no bytes, so it differs from an empty one.  Each
field's length comes first, so no byte of one field can move into another
(the ``|``-joined text of version 1 let ``member "dave", event_id "7|z"``
sign for ``member "dave|3", event_id "z"``), and the version is both in the
bytes and in the signature, so the format can change again.  Version 1
signatures are refused.  ``docs/security.md`` and
``protocol/signing-vectors.json`` give test vectors.

A bad signature, or a ``ts`` more than 60 s away from the server clock, is
refused; a replayed event is answered with its original result and never
applied twice (the engine's event-id dedupe).

The server's check and the Python client's signer are the one function
:func:`canonical` (the client re-exports :func:`sign`).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
import time
from collections.abc import Mapping
from typing import Any

from rankd.engine.errors import InvalidInput
from rankd.security.auth import Unauthorized

MAX_SKEW_SECONDS = 60.0
#: How long one signed submission may be accepted: from 60 s before its
#: ``ts`` to 60 s after it.
SIGNATURE_LIFETIME = 2 * MAX_SKEW_SECONDS
VERSION = "v2"
TAG = b"rankd-signed-submission/v2\x00"
ABSENT = 0xFFFFFFFF
_SIGNATURE = re.compile(r"v2=[0-9a-f]{64}")


def _number(value: float) -> str:
    return f"{float(value):.17g}"


def canonical(board: str, event: Mapping[str, Any]) -> bytes:
    """The bytes a submission's signature covers (see the module docstring).

    ``event`` holds the submission's fields (``member``, ``score`` or
    ``delta``, ``event_id``, ``ts``, optionally ``label``); a ``signature``
    in it is ignored.
    """
    kind = "score" if event.get("score") is not None else "delta"
    fields = (board, event["member"], kind, _number(event[kind]), event["event_id"],
              _number(event["ts"]), event.get("label"))
    out = bytearray(TAG)
    for field in fields:
        if field is None:
            out += ABSENT.to_bytes(4, "big")
        else:
            data = field.encode()
            out += len(data).to_bytes(4, "big") + data
    return bytes(out)


def sign(secret: str, board: str, event: Mapping[str, Any]) -> str:
    """The ``signature`` a game server attaches to ``event`` for ``board``."""
    digest = hmac.new(secret.encode(), canonical(board, event), hashlib.sha256).hexdigest()
    return f"{VERSION}={digest}"


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
    if signature is None:
        raise Unauthorized(f"board {board!r} requires a signature on every submission")
    if not isinstance(signature, str) or not _SIGNATURE.fullmatch(signature):
        raise InvalidInput("a signature is 'v2=' and 64 lowercase hex digits (the format of "
                           "docs/security.md; version 1 signatures are no longer accepted)")
    ts, member, event_id, label = (event["ts"], event.get("member"), event["event_id"],
                                   event.get("label"))
    if (isinstance(ts, bool) or not isinstance(ts, int | float)
            or isinstance(value, bool) or not isinstance(value, int | float)
            or not isinstance(member, str) or not isinstance(event_id, str)
            or not (label is None or isinstance(label, str))):
        raise InvalidInput("signed submissions need a member, a number, a numeric ts and "
                           "text for event_id and label")
    now = time.time() if now is None else now
    if not math.isfinite(ts) or abs(now - ts) > MAX_SKEW_SECONDS:
        raise Unauthorized(f"the signed timestamp {ts!r} is more than "
                           f"{MAX_SKEW_SECONDS:.0f} s away from the server clock")
    if not hmac.compare_digest(sign(secret, board, event), signature):
        raise Unauthorized("the submission's signature does not match")
    return event
