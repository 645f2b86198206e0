"""A cluster node's live peers are spared the per-address connection cap
(rankd.cluster.peer_hosts): each carries many clients' forwards and relay
links from one address, which one client could otherwise fill."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from rankd.cluster.peer_hosts import RETRY_SECONDS, PeerHosts, host_of
from rankd.frontends.connections import ConnectionLimits
from rankd.security import TrustedProxies
from rankd.server import cap_exemption


def test_hosts_of_advertised_addresses() -> None:
    assert host_of("10.0.0.7:7700") == "10.0.0.7"
    assert host_of("[fd00::7]:7701") == "fd00::7"
    assert host_of("node-a.internal:7702") == "node-a.internal"


def test_peer_addresses_are_resolved_and_follow_the_rounds() -> None:
    async def run() -> None:
        hosts = PeerHosts()
        hosts.update(["10.0.0.7:7700", "10.0.0.7:7701", "[fd00::7]:7702", "localhost:7700"])
        assert "10.0.0.7" in hosts  # (literals at once; names once resolved)
        await hosts.settled()
        assert "10.0.0.7" in hosts and "fd00::7" in hosts
        assert "127.0.0.1" in hosts or "::1" in hosts  # (a name, resolved)
        assert "10.0.0.8" not in hosts
        hosts.update(["10.0.0.8:7700"])  # n7 gone, n8 joined
        assert "10.0.0.8" in hosts and "10.0.0.7" not in hosts
        hosts.update(["no-such-host.invalid:7700"])
        await hosts.settled()
        assert hosts.addresses == frozenset()
        # A name that did not resolve is tried again, not every round.
        first = hosts._resolving
        hosts.update(["no-such-host.invalid:7700"])
        assert hosts._resolving is first
        hosts._tried_at -= RETRY_SECONDS + 1
        hosts.update(["no-such-host.invalid:7700"])
        assert hosts._resolving is not first
        await hosts.settled()
        assert hosts.addresses == frozenset()

    asyncio.run(run())


def test_the_cap_spares_peers_but_still_counts_every_other_address() -> None:
    async def run() -> None:
        node = SimpleNamespace(peer_hosts=PeerHosts())
        node.peer_hosts.update(["10.0.0.7:7700"])
        gate = SimpleNamespace(trusted_proxies=TrustedProxies([]))
        limits = ConnectionLimits(10_000, 3, cap_exemption(gate, node))
        assert [limits.admit("10.0.0.7") for _ in range(5)] == [None] * 5
        assert [limits.admit("10.0.0.9") is None for _ in range(4)] == [True] * 3 + [False]
        alone = ConnectionLimits(10_000, 3, cap_exemption(gate, None))
        assert [alone.admit("10.0.0.7") is None for _ in range(4)] == [True] * 3 + [False]

    asyncio.run(run())
