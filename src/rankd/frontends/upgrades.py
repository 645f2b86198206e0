"""Requests asking for a protocol upgrade that rankd answers without one.

A client that sends WebSocket frames right behind its upgrade request, not
waiting for the answer, leaves them buffered behind the request.  When the
upgrade is declined (a 421 from the Host check, a 401, a 404...) aiohttp
parses them as the next HTTP request, and the parse error it makes of them
quotes everything it read, about four bytes of message a byte, in an
exception held in a reference cycle: ~0.9 MB for 240 KB of frames, kept
until the next collection of the cyclic garbage collector, which the
daemon makes rare (:mod:`rankd.engine.collector`).  So the answer to a
declined upgrade closes the connection, and what the client sent after the
request is read and dropped, never parsed.
"""

from __future__ import annotations

from aiohttp import hdrs, web


class _Dropped:
    """Stands in for the WebSocket reader aiohttp hands what follows an
    upgrade to (``RequestHandler.set_parser``): takes it and keeps nothing."""

    __slots__ = ()

    def feed_data(self, data: bytes) -> tuple[bool, bytes]:
        return False, b""

    def feed_eof(self) -> None:
        return None


_DROPPED = _Dropped()


def asks_upgrade(request: web.BaseRequest) -> bool:
    """Whether aiohttp may have taken ``request`` for an upgrade (any
    ``Upgrade`` header, or CONNECT), after which it buffers what follows."""
    return hdrs.UPGRADE in request.headers or request.method == hdrs.METH_CONNECT


def decline_unanswered_upgrade(request: web.BaseRequest,
                               response: web.StreamResponse) -> None:
    """After any answer to an upgrade request but a WebSocket's (call it
    once the handler has answered, before the answer is sent): close the
    connection after the answer and drop what the client sent after the
    request.  The REST app's outermost middleware calls it, so a request
    without ``Upgrade`` costs one header lookup."""
    if asks_upgrade(request) and not response.prepared:  # (a WebSocket's is prepared)
        response.force_close()
        request.protocol.set_parser(_DROPPED)  # type: ignore[arg-type]
