"""Two REST applications over engines of their own, served on loopback for
a test module, to answer the same requests two ways (one way on, the other
off): the differential tests of the REST fast paths use them.

``make(engine, on, clock)`` builds a twin: an object with ``engine``,
``start()`` and ``close()`` (coroutines); ``clock`` is a one-item list the
twins' rate-limit buckets read, moved only by the test, so both see the
same limits whatever time their requests take.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jwt
from hypothesis import strategies as st

from engine_helpers import engine_config
from rankd.engine.engine import Engine
from rankd.security import Gate
from rankd.security.auth import AuthConfig, Authenticator
from rankd.security.limits import LimitsConfig, RateLimiter


@contextlib.contextmanager
def running_twins(root: Path, make: Callable[[Engine, bool, list[float]], Any]
                  ) -> Iterator[tuple[asyncio.AbstractEventLoop, list[float], Any, Any]]:
    """``(loop, clock, twin with its way on, twin with it off)``, each
    started on ``loop``, closed with their engines at the end."""
    loop = asyncio.new_event_loop()
    clock = [0.0]

    async def start() -> list[Any]:
        pair = []
        for name, on in (("on", True), ("off", False)):
            twin = make(await Engine.open(engine_config(root / name)), on, clock)
            await twin.start()
            pair.append(twin)
        return pair

    on, off = loop.run_until_complete(start())
    try:
        yield loop, clock, on, off
    finally:
        async def stop() -> None:
            for twin in (on, off):
                await twin.close()
                await twin.engine.close()

        loop.run_until_complete(stop())
        loop.close()


def twin_gate(secret: str, api_keys: list[Any], limits: LimitsConfig, clock: list[float],
              **options: Any) -> Gate:
    """A gate taking JWTs signed with ``secret`` and ``api_keys``, under
    ``limits`` whose buckets refill only when the test moves ``clock``."""
    gate = Gate(Authenticator(AuthConfig(jwt_secret=secret, api_keys=api_keys)),
                RateLimiter(limits), signing_secret=secret, **options)
    for buckets in gate.limiter._buckets.values():
        buckets.clock = lambda: clock[0]
    return gate


def bearer(secret: str, scopes: str, expires_in: float) -> str:
    """An ``Authorization`` header of a JWT with ``scopes``, signed with ``secret``."""
    return "Bearer " + jwt.encode({"scope": scopes, "exp": int(time.time() + expires_in)},
                                  secret, algorithm="HS256")


#: A submission's number: in range, fractional, or of a type the API refuses.
NUMBERS = st.one_of(st.integers(-10, 10), st.floats(-1e3, 1e3, allow_nan=False),
                    st.sampled_from([True, None, "1", 2**60]))


@st.composite
def submissions(draw: st.DrawFn, members: list[str], event_ids: list[str]) -> dict[str, Any]:
    """A submission body (as a dict): one of ``members``, a delta or a score,
    and maybe one of ``event_ids`` (drawn again, so maybe a duplicate)."""
    event: dict[str, Any] = {"member": draw(st.sampled_from(members))}
    event[draw(st.sampled_from(["delta", "score"]))] = draw(NUMBERS)
    if draw(st.booleans()):
        event["event_id"] = draw(st.sampled_from(event_ids))
    return event
