"""Sending a write one hop on, to the node that writes its board's group.

On a cluster any node accepts any request.  A write whose board's group
another node writes (the engine raises ``NotPrimary`` naming it) is sent
there once, as it came (method, path, query, body, credentials), and its
answer is returned as that node gave it.  The forwarded request carries
:data:`FORWARDED`: a node that gets one and does not write the group
either (the group moved meanwhile) answers ``not_primary`` itself instead
of forwarding again, so a request never goes round.

The first node already checked the request's ``Origin`` (and its own
``Host``), so neither is passed on; the credential is, and the primary
checks it again.
"""

from __future__ import annotations

import aiohttp
from aiohttp import web

#: Marks a forwarded request (its value: the forwarding node).
FORWARDED = "X-Rankd-Forwarded-By"
#: Headers not passed on: per-connection ones, and those the first node checked.
_DROPPED = frozenset({"host", "origin", "connection", "keep-alive", "transfer-encoding",
                      "content-length", "te", "trailer", "upgrade", "proxy-authorization",
                      FORWARDED.lower()})



def forwarded(request: web.Request) -> bool:
    """Whether ``request`` was forwarded to this node already."""
    return FORWARDED in request.headers


class Forwarder:
    """Forwards requests from node ``node`` (one HTTP client, made on first use)."""

    def __init__(self, node: str, timeout: float) -> None:
        self.node = node
        self.timeout = timeout
        self.forwarded = 0
        self._client: aiohttp.ClientSession | None = None

    async def forward(self, request: web.Request, address: str) -> web.Response:
        """Send ``request`` to the node at ``address`` (``host:port``) and
        return its answer."""
        if self._client is None:
            self._client = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout), auto_decompress=False)
        headers = {name: value for name, value in request.headers.items()
                   if name.lower() not in _DROPPED}
        headers[FORWARDED] = self.node
        scheme = "https" if request.secure else "http"
        body = await request.read()
        self.forwarded += 1
        async with self._client.request(request.method,
                                        f"{scheme}://{address}{request.path_qs}",
                                        data=body, headers=headers,
                                        allow_redirects=False) as answer:
            payload = await answer.read()
            kept = {name: value for name, value in answer.headers.items()
                    if name.lower() in ("content-type", "retry-after", "www-authenticate",
                                        "content-encoding")}
            return web.Response(status=answer.status, body=payload, headers=kept)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
