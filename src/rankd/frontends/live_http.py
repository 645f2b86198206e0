"""HTTP endpoints of the live feed: WebSocket, SSE, and the live page.

``GET /v1/boards/{board}/live``   WebSocket (query: window, limit, members)
``GET /v1/boards/{board}/events`` Server-Sent Events, same events and query
``GET /``                         the live leaderboard page (static files)
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
import socket as socket_module
from importlib import resources

from aiohttp import WSMsgType, web

from rankd.engine.errors import EngineError, NotPrimary
from rankd.frontends.forwarding import forwarded
from rankd.frontends.live import (
    CLOSE_TOO_MANY,
    CLOSE_TOO_SLOW,
    DIRECT_WRITE_LIMIT,
    LiveFeed,
    Subscriber,
    parse_client_message,
)
from rankd.frontends.live_proxy import LiveProxy, holder_of
from rankd.frontends.live_proxy_metrics import LiveProxyCollector
from rankd.frontends.origins import PUBLIC_CORS_HEADERS
from rankd.frontends.rest import FORWARDER, GATE, METRICS, ORIGINS, PRINCIPAL, RequestError
from rankd.security import RateLimited

log = logging.getLogger(__name__)

FEED = web.AppKey("live_feed", LiveFeed)
#: A cluster node's proxy of the feeds of boards other nodes hold (None: not a cluster).
PROXY = web.AppKey("live_proxy", LiveProxy | None)
HEARTBEAT_SECONDS = 20.0
SSE_KEEPALIVE_SECONDS = 15.0
SEND_BUFFER_BYTES = 128 * 1024
#: The status counted for a client that left before its answer (as nginx
#: logs it): nothing failed here, and nothing can be written.
CLIENT_CLOSED = 499

routes = web.RouteTableDef()


def _subscription(request: web.Request) -> tuple[str | None, int, list[str]]:
    query = request.query
    unknown = sorted(set(query) - {"window", "limit", "members", "token"})
    if unknown:
        raise RequestError(f"unknown query parameter(s): {', '.join(unknown)}")
    try:
        limit = int(query.get("limit", "10"))
    except ValueError:
        raise RequestError("query parameter 'limit': expected an integer") from None
    members = [m for m in query.get("members", "").split(",") if m]
    return query.get("window") or None, limit, members


def _subscribe(request: web.Request) -> Subscriber:
    window, limit, members = _subscription(request)
    feed = request.app[FEED]
    try:
        return feed.subscribe(request.match_info["board"], window, limit, members,
                              address=request.remote or "")
    except NotPrimary as exc:  # another node holds the board: its feed, proxied
        proxy = request.app.get(PROXY)
        if proxy is None or exc.primary is None or forwarded(request):
            raise
        return proxy.subscribe(request.match_info["board"], window, limit, members,
                               request[PRINCIPAL], request.remote or "",
                               secure=request.secure)


def _feed_of(request: web.Request, subscriber: Subscriber) -> LiveFeed | LiveProxy:
    """The local feed, or the proxy when ``subscriber`` is proxied."""
    proxy = request.app.get(PROXY)
    if proxy is not None and proxy.serves(subscriber):
        return proxy
    return request.app[FEED]


@routes.get("/v1/boards/{board:[^/]+}/live")
async def live_socket(request: web.Request) -> web.StreamResponse:
    # No per-message compression: pushes are written as pre-built frames.
    socket = web.WebSocketResponse(heartbeat=HEARTBEAT_SECONDS, max_msg_size=64 * 1024,
                                   compress=False)
    subscriber = _subscribe(request)  # errors answer as plain HTTP, before the upgrade
    feed = _feed_of(request, subscriber)
    gate, principal, address = request.app[GATE], request[PRINCIPAL], request.remote or ""
    sender = None
    try:
        if not socket.can_prepare(request).ok:
            raise RequestError("this is the WebSocket feed: send a WebSocket upgrade, or read "
                               "the same feed as Server-Sent Events at "
                               f"{request.rel_url.raw_path[:-len('/live')]}/events")
        _bound_send_buffer(request)
        try:
            await socket.prepare(request)
        except ConnectionResetError:  # the client left during the handshake
            return web.Response(status=CLIENT_CLOSED)
        subscriber.transport = request.transport
        sender = asyncio.get_running_loop().create_task(
            _send_loop(socket, request.transport, subscriber, request.app[FEED].send_timeout))
        async for message in socket:
            try:  # each message a subscriber sends counts as a read
                gate.admit(principal, "live_socket", address)
            except RateLimited:
                await socket.close(code=CLOSE_TOO_MANY, message=b"rate limited")
                break
            if message.type == WSMsgType.ERROR:
                # The socket broke (a heartbeat unanswered, a frame over the
                # limit): aiohttp closed it, so nothing can be answered.
                break
            if message.type != WSMsgType.TEXT:
                await socket.send_json({"type": "error", "code": "invalid",
                                        "message": "send JSON text messages"})
                continue
            try:
                action, members = parse_client_message(message.data)
                if action == "ping":
                    await socket.send_str('{"type":"pong"}')
                elif action == "follow":
                    added = feed.follow(subscriber, members)
                    if isinstance(feed, LiveFeed):  # (proxied: the upstream sends them)
                        await feed.engine.settled_read(functools.partial(
                            feed.send_members, subscriber, added))
                else:
                    feed.unfollow(subscriber, members)
            except EngineError as exc:
                await socket.send_json({"type": "error", **exc.to_dict()})
    finally:
        feed.unsubscribe(subscriber)
        if sender is not None:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
    return socket


def _bound_send_buffer(request: web.Request) -> None:
    """Cap the kernel's send buffer of a long-lived push connection.

    Autotuning would let each subscriber park megabytes in the kernel, and a
    reader that stopped reading would go unnoticed for that long.
    """
    sock = request.transport.get_extra_info("socket") if request.transport else None
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket_module.SOL_SOCKET, socket_module.SO_SNDBUF, SEND_BUFFER_BYTES)


async def _send_loop(socket: web.WebSocketResponse, transport: asyncio.Transport | None,
                     subscriber: Subscriber, send_timeout: float) -> None:
    while True:
        message = await subscriber.next_message()
        if message is None:
            code, reason = subscriber.dropped or (1000, "")
            await socket.close(code=code, message=reason.encode())
            return
        try:
            if transport is not None and transport.get_write_buffer_size() > DIRECT_WRITE_LIMIT:
                await asyncio.wait_for(socket.send_frame(message, WSMsgType.TEXT), send_timeout)
            else:  # writes at once; a timer per message would cost more than the write
                await socket.send_frame(message, WSMsgType.TEXT)
        except ConnectionResetError:
            subscriber.dropped = (1006, "connection lost")
            return
        except TimeoutError:
            log.info("live subscriber at %s too slow: disconnecting", subscriber.address)
            subscriber.dropped = (CLOSE_TOO_SLOW, "subscriber too slow")
            # The close frame cannot get through a full buffer: do not wait for it.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(socket.close(code=CLOSE_TOO_SLOW,
                                                    message=b"subscriber too slow"), 1)
            if transport is not None:
                transport.abort()
            return


@routes.get("/v1/boards/{board:[^/]+}/events")
async def live_events(request: web.Request) -> web.StreamResponse:
    subscriber = _subscribe(request)
    feed = _feed_of(request, subscriber)
    _bound_send_buffer(request)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache",
                                           "X-Accel-Buffering": "no"})
    try:
        await response.prepare(request)
        while True:
            try:
                message = await asyncio.wait_for(subscriber.next_message(),
                                                 SSE_KEEPALIVE_SECONDS)
            except TimeoutError:
                await response.write(b": keep-alive\n\n")
                continue
            if message is None:
                code, reason = subscriber.dropped or (1000, "")
                await response.write(f"event: closed\ndata: {code} {reason}\n\n".encode())
                break
            kind = b"leaderboard.updated" if message.startswith(
                b'{"type":"leaderboard') else b"user.rank.updated"
            await asyncio.wait_for(response.write(b"event: " + kind + b"\ndata: " + message
                                                  + b"\n\n"), request.app[FEED].send_timeout)
    except (ConnectionResetError, TimeoutError):
        pass
    finally:
        feed.unsubscribe(subscriber)
    return response


def _static(name: str) -> bytes:
    return resources.files("rankd.frontends").joinpath("static", name).read_bytes()


_CONTENT_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}
#: What a file of the page may be called (no NUL, no path, no dot first).
_STATIC_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}")


@routes.get("/")
async def page(request: web.Request) -> web.Response:
    return web.Response(body=_static("index.html"), content_type="text/html", charset="utf-8",
                        headers=request.app[ORIGINS].page_headers())


@routes.get("/static/{name}")
async def static_file(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    suffix = name[name.rfind("."):] if "." in name else ""
    if not _STATIC_NAME.fullmatch(name) or suffix not in _CONTENT_TYPES:
        raise web.HTTPNotFound()
    try:
        body = _static(name)
    except (FileNotFoundError, IsADirectoryError):
        raise web.HTTPNotFound() from None
    # Public code: any page may load it, one opened from a file included.
    return web.Response(body=body, content_type=_CONTENT_TYPES[suffix], charset="utf-8",
                        headers={**request.app[ORIGINS].page_headers(), **PUBLIC_CORS_HEADERS})


def add_live_routes(app: web.Application, feed: LiveFeed) -> None:
    """Mount the live feed and the page on ``app``; start/stop the feed with it."""
    app[FEED] = feed
    forwarder = app.get(FORWARDER)
    proxy = app[PROXY] = (LiveProxy(feed, forwarder, holder_of(feed.engine))
                          if forwarder is not None else None)
    if proxy is not None:
        app[METRICS].add(LiveProxyCollector(proxy))
    app.add_routes(routes)

    async def on_startup(_: web.Application) -> None:
        feed.start()

    async def on_cleanup(_: web.Application) -> None:
        await feed.stop()
        if proxy is not None:
            await proxy.close()

    app.on_startup.append(on_startup)
    app.on_shutdown.append(on_cleanup)
