"""Which client a request behind a reverse proxy comes from.

Behind a proxy every connection comes from the proxy's address (loopback,
when it runs on the same host, which the limits exempt): the per-address
rate and connection limits would see one client, or none.  With
``--trusted-proxies`` (CIDRs) the client of an HTTP request whose peer is
one of them is read from ``X-Forwarded-For``: the rightmost hop that is not
itself a trusted proxy.  Hops to its left were written by whoever sent the
request and prove nothing; a peer outside the list is the client, whatever
the header says.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass, field

from rankd.security.limits import is_loopback

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
#: The client of a request whose forwarded hop is no address (a proxy that
#: passed on what the client wrote): all such share one rate-limit bucket.
UNPARSABLE = "unparsable-forwarded-for"
#: Hops looked at, from the right: a proxy chain is a few hops long.
MAX_HOPS = 16


def _address(text: str) -> Address | None:
    """An address as proxies write it: bare, ``[v6]``, ``[v6]:port`` or ``v4:port``."""
    text = text.strip()
    if text.startswith("["):
        text = text[1:text.find("]")] if "]" in text else text[1:]
    elif text.count(":") == 1:
        text = text.split(":", 1)[0]
    try:
        return ipaddress.ip_address(text.split("%")[0])
    except ValueError:
        return None


@dataclass(frozen=True)
class TrustedProxies:
    """The proxies whose ``X-Forwarded-For`` is believed (none by default)."""

    networks: tuple[Network, ...] = field(default_factory=tuple)

    @classmethod
    def parse(cls, text: str | Iterable[str] | None) -> TrustedProxies:
        """Comma-separated CIDRs (or addresses); ``ValueError`` naming a bad one."""
        entries = text.split(",") if isinstance(text, str) else list(text or ())
        networks = []
        for entry in (e.strip() for e in entries):
            if not entry:
                continue
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                raise ValueError(f"{entry!r} is not an address or CIDR block (e.g. "
                                 "127.0.0.1/32, 10.0.0.0/8, ::1)") from None
        return cls(tuple(networks))

    def __bool__(self) -> bool:
        return bool(self.networks)

    def trusts(self, address: str | Address | None) -> bool:
        """Whether ``address`` is one of the trusted proxies."""
        if not isinstance(address, ipaddress.IPv4Address | ipaddress.IPv6Address):
            address = _address(address or "")
        if address is None:
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return any(address in network for network in self.networks)

    def exempt_from_address_caps(self, address: str) -> bool:
        """Whether a connection from ``address`` is exempt from the per-address
        connection cap: loopback as before, and a trusted proxy, which
        carries many clients."""
        return is_loopback(address) or self.trusts(address)

    def client_address(self, peer: str, forwarded_for: Iterable[str]) -> str:
        """The client of a request from ``peer`` that carried these
        ``X-Forwarded-For`` header values (in order): ``peer`` unless it
        is trusted, else the rightmost untrusted hop."""
        if not self.trusts(peer):
            return peer
        hops = [hop for value in forwarded_for for hop in value.split(",")][-MAX_HOPS:]
        client = peer
        for hop in reversed(hops):
            address = _address(hop)
            if address is None:
                return UNPARSABLE
            client = str(address)
            if not self.trusts(address):
                break
        return client
