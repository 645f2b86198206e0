"""The client addresses of a cluster's live peers, for the per-address
connection cap.

A node opens many connections to each peer on behalf of its own clients:
a REST forward, a live feed's upstream, a plain RESP client's relay link
(one per client connection).  They all come from the peer's one address,
so the per-address cap of ``--max-connections-per-address``, meant for one
client, would let one client holding a few hundred relaying connections
to a node fill its peer's cap for that node, and the node's forwards and
every other client's relays would be refused.  A vouched peer's addresses
are exempt from the cap as loopback and trusted proxies are (the total
cap still holds): :class:`PeerHosts` keeps them, resolving an advertised
host name in a task of its own when it first appears.
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
from collections.abc import Iterable

#: Seconds one resolution of an advertised host name may take.
RESOLVE_SECONDS = 2.0
#: Seconds after which a name that did not resolve is tried again.
RETRY_SECONDS = 60.0


def host_of(advertised: str) -> str:
    """The host of an advertised ``host:port`` (an IPv6 literal unbracketed)."""
    host = advertised.rpartition(":")[0] if ":" in advertised else advertised
    return host.strip("[]")


class PeerHosts:
    """The IP addresses of a cluster's live, vouched peers."""

    def __init__(self) -> None:
        self.addresses: frozenset[str] = frozenset()
        self._names: frozenset[str] = frozenset()
        #: Each advertised host's addresses (an IP literal: itself).
        self._resolved: dict[str, frozenset[str]] = {}
        self._resolving: asyncio.Task[None] | None = None
        self._tried_at = 0.0

    def __contains__(self, address: object) -> bool:
        return address in self.addresses

    def update(self, advertised: Iterable[str]) -> None:
        """Take the peers' advertised ``host:port`` addresses of a round.
        Host names not resolved yet are resolved in a task of their own:
        a slow resolver never holds up the round (its leases and heartbeat)."""
        names = frozenset(host_of(address) for address in advertised if address)
        unresolved = names - self._resolved.keys()
        if names == self._names and not (
                unresolved and time.monotonic() - self._tried_at > RETRY_SECONDS):
            return
        self._names = names
        unknown = []
        for name in unresolved:
            try:
                self._resolved[name] = frozenset({str(ipaddress.ip_address(name))})
            except ValueError:
                unknown.append(name)
        self._settle()
        if unknown and (self._resolving is None or self._resolving.done()):
            self._tried_at = time.monotonic()
            self._resolving = asyncio.ensure_future(self._resolve(unknown))

    def _settle(self) -> None:
        for name in self._resolved.keys() - self._names:
            del self._resolved[name]
        self.addresses = frozenset().union(*(self._resolved.get(name, ())
                                              for name in self._names))

    async def _resolve(self, names: list[str]) -> None:
        loop = asyncio.get_running_loop()
        tried: set[str] = set()
        while names:  # (and the names that came while it resolved)
            for name in names:
                tried.add(name)
                try:
                    infos = await asyncio.wait_for(loop.getaddrinfo(name, None),
                                                   RESOLVE_SECONDS)
                except (OSError, TimeoutError, ValueError):
                    continue  # (not exempt; tried again after RETRY_SECONDS)
                self._resolved[name] = frozenset(str(info[4][0]) for info in infos)
            self._settle()
            names = [name for name in self._names - self._resolved.keys() if name not in tried]

    async def settled(self) -> None:
        """Wait for the names being resolved (for tests)."""
        if self._resolving is not None:
            await self._resolving
