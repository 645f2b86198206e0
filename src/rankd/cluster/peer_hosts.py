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
host name only when the set of names changes.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Iterable

#: Seconds one resolution of an advertised host name may take.
RESOLVE_SECONDS = 2.0


def host_of(advertised: str) -> str:
    """The host of an advertised ``host:port`` (an IPv6 literal unbracketed)."""
    host = advertised.rpartition(":")[0] if ":" in advertised else advertised
    return host.strip("[]")


class PeerHosts:
    """The IP addresses of a cluster's live, vouched peers."""

    def __init__(self) -> None:
        self.addresses: frozenset[str] = frozenset()
        self._names: frozenset[str] = frozenset()

    def __contains__(self, address: object) -> bool:
        return address in self.addresses

    async def update(self, advertised: Iterable[str]) -> None:
        """Take the peers' advertised ``host:port`` addresses of a round."""
        names = frozenset(host_of(address) for address in advertised if address)
        if names == self._names:
            return
        resolved: set[str] = set()
        for name in names:
            try:
                resolved.add(str(ipaddress.ip_address(name)))
                continue
            except ValueError:
                pass
            try:
                infos = await asyncio.wait_for(
                    asyncio.get_running_loop().getaddrinfo(name, None), RESOLVE_SECONDS)
            except (OSError, TimeoutError):
                continue  # (tried again when the names change; the cap holds meanwhile)
            resolved.update(str(info[4][0]) for info in infos)
        self.addresses, self._names = frozenset(resolved), names
