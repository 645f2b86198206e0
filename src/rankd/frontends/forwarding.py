"""Sending a write one hop on, to the node that writes its board's group.

On a cluster any node accepts any request.  A write whose board's group
another node writes (the engine raises ``NotPrimary`` naming it: only a node
the cluster vouches for, see :mod:`rankd.cluster.trust`) is sent there
once, as it came (method, path, query, body), and its answer is returned as
that node gave it.  The forwarded request carries :data:`FORWARDED` and its
hop (:data:`HOP`): a node that gets one and does not write the group either
sends it on once more (:data:`MAX_HOPS`), and answers ``not_primary`` itself
after that, so a request never goes round.  The second hop is for a group
that moved meanwhile: a write sent to the source just before a move's
cut-over waits there (:mod:`rankd.cluster.cutover`) and then goes on to
the target, rather than back to the client as ``421`` to be sent again.

The first node already checked the request's ``Origin`` (and its own
``Host``), and the client's credential: none of them is passed on.  The
forward carries the node's own credential instead (:data:`FORWARD_AUTH`, an
HMAC with the cluster secret over the request and the caller the first node
admitted); the primary accepts a forward only with a valid one, and then
checks that caller's scope and rate limits as its own.  The signature names
the node it is sent to (its advertised address), and no other accepts it:
each node remembers only the nonces it accepted, so a forward taken off the
wire and sent to another node (the forwarding one included, which would
send it on once more) would be applied again.  A forward refused for its
credential is charged to the sender's address, as a failed credential is.
"""

from __future__ import annotations

import aiohttp
from aiohttp import web
from yarl import URL

from rankd.cluster.trust import FORWARD_AUTH, ClusterTrust
from rankd.security import Gate, Principal, Unauthorized, audit

#: Marks a forwarded request (its value: the forwarding node).
FORWARDED = "X-Rankd-Forwarded-By"
#: A forward's hop, from 2 on (absent: the first), signed with it.
HOP = "X-Rankd-Forward-Hop"
#: The most nodes a request is sent through after the one it reached.
MAX_HOPS = 2
#: The request key of a forwarded request's caller address (as the first node saw it).
CALLER_ADDRESS = "rankd_caller_address"
#: Headers not passed on: per-connection ones, the client's credential, and
#: those the first node checked.
_DROPPED = frozenset({"host", "origin", "connection", "keep-alive", "transfer-encoding",
                      "content-length", "te", "trailer", "upgrade", "proxy-authorization",
                      "authorization", "cookie", FORWARDED.lower(), FORWARD_AUTH.lower(),
                      HOP.lower()})


def forwarded(request: web.Request) -> bool:
    """Whether ``request`` says it was forwarded to this node already."""
    return FORWARDED in request.headers


def hop(request: web.Request) -> int:
    """How many nodes forwarded ``request`` on its way here (0: from a client)."""
    if FORWARDED not in request.headers:
        return 0
    try:
        return max(1, int(request.headers.get(HOP, "1")))
    except ValueError:
        return MAX_HOPS  # (the signature fails too: it covers the hop)


def may_forward(request: web.Request) -> bool:
    """Whether this node may send ``request`` on (it has hops left)."""
    return hop(request) < MAX_HOPS


def signed_node(node: str, hop: int, to: str) -> str:
    """What a forward's signature names as its node: the node, its hop past
    the first (so that a hop changed on the way fails the signature), and
    the address of the node it is for (so that no other node accepts it)."""
    return f"{node}\0to={to}" if hop <= 1 else f"{node}\0hop={hop}\0to={to}"


class Forwarder:
    """Forwards requests from node ``node`` (one HTTP client, made on first
    use), and admits the requests other nodes forward to it (at
    ``advertise``, the address they send them to)."""

    def __init__(self, node: str, timeout: float, trust: ClusterTrust, advertise: str) -> None:
        self.node = node
        self.advertise = advertise
        self.timeout = timeout
        self.trust = trust
        self.forwarded = 0
        self._client: aiohttp.ClientSession | None = None

    async def forward(self, request: web.Request, address: str,
                      principal: Principal) -> web.Response:
        """Send ``request``, admitted for ``principal``, to the node at
        ``address`` (``host:port``) and return its answer."""
        if self._client is None:
            self._client = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout), auto_decompress=False)
        body = await request.read()
        headers = {name: value for name, value in request.headers.items()
                   if name.lower() not in _DROPPED}
        headers[FORWARDED] = self.node
        sent_hop = hop(request) + 1
        if sent_hop > 1:
            headers[HOP] = str(sent_hop)
        # The path as it came, percent-encoding kept (a board "a/b" is a%2Fb),
        # sent as is (encoded=True): the signed bytes are the ones received.
        path_qs = request.rel_url.raw_path_qs
        headers[FORWARD_AUTH] = self.trust.forward_header(
            signed_node(self.node, sent_hop, address), request.method, path_qs, body, principal,
            request.get(CALLER_ADDRESS, request.remote or ""))
        scheme = "https" if request.secure else "http"
        self.forwarded += 1
        async with self._client.request(request.method,
                                        URL(f"{scheme}://{address}{path_qs}", encoded=True),
                                        data=body, headers=headers,
                                        allow_redirects=False) as answer:
            payload = await answer.read()
            kept = {name: value for name, value in answer.headers.items()
                    if name.lower() in ("content-type", "retry-after", "www-authenticate",
                                        "content-encoding")}
            return web.Response(status=answer.status, body=payload, headers=kept)

    async def admitted(self, request: web.Request, gate: Gate, operation: str,
                       cost: int) -> tuple[Principal, str]:
        """The caller of a request another node forwarded, and its address,
        admitted by ``gate`` (scope, rate limits); :class:`Unauthorized`
        unless the request carries a valid node credential."""
        try:
            caller = self.trust.verify_forward(
                signed_node(request.headers[FORWARDED], hop(request), self.advertise),
                request.headers.get(FORWARD_AUTH), request.method,
                request.rel_url.raw_path_qs, await request.read())
        except Unauthorized as exc:
            audit("auth_rejected", operation=operation, address=request.remote or "",
                  node=request.headers[FORWARDED][:64], reason=exc.message)
            # A client's forged forward is charged to its address as a failed
            # credential is (a valid forward is charged to its caller, below).
            gate.charge_refused(operation, request.remote or "")
            raise
        gate.admit(caller.principal, operation, caller.address, cost)
        request[CALLER_ADDRESS] = caller.address  # (passed on if sent on again)
        return caller.principal, caller.address

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
