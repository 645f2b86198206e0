"""``/metrics`` of a cluster node's live-feed proxy (:mod:`rankd.frontends.
live_proxy`).

Owns the ``rankd_live_proxy_*`` figures.  The proxy only bumps plain
integers as it relays (as the live feed does); this collector reads them,
and counts its upstreams, lanes and subscribers, when Prometheus scrapes,
so relaying costs nothing more.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rankd.frontends.live_proxy import LiveProxy


class LiveProxyCollector(Collector):
    """The figures of one :class:`LiveProxy`, read at scrape time."""

    def __init__(self, proxy: LiveProxy) -> None:
        self.proxy = proxy

    def collect(self) -> Iterator[Metric]:
        proxy = self.proxy
        upstreams = list(proxy.upstreams.values())
        lanes = [lane for upstream in upstreams for lane in upstream.lanes]
        yield GaugeMetricFamily(
            "rankd_live_proxy_upstreams", "Open upstream connections to the nodes that hold "
            "proxied boards (one per board and window, and one more per 100 followed members)",
            value=sum(1 for lane in lanes if lane.socket is not None and not lane.socket.closed))
        yield GaugeMetricFamily("rankd_live_proxy_boards",
                                "Boards and windows whose live feed this node proxies",
                                value=len(upstreams))
        yield GaugeMetricFamily("rankd_live_proxy_subscribers",
                                "Live subscribers this node serves through its proxy",
                                value=sum(len(upstream.subscribers) for upstream in upstreams))
        yield GaugeMetricFamily("rankd_live_proxy_followed_members",
                                "Members followed upstream (each once, however many local "
                                "subscribers follow it)",
                                value=sum(len(upstream.members) for upstream in upstreams))
        yield GaugeMetricFamily("rankd_live_proxy_buffered_bytes",
                                "Bytes waiting for proxied subscribers (queued, and in their "
                                "sockets' write buffers)", value=proxy.buffered())
        yield CounterMetricFamily("rankd_live_proxy_connections",
                                  "Upstream connections opened", value=proxy.connections)
        yield CounterMetricFamily("rankd_live_proxy_reconnections",
                                  "Upstream connections re-established (the board's group "
                                  "moved, its node failed or restarted)",
                                  value=proxy.reconnections)
        yield CounterMetricFamily("rankd_live_proxy_received",
                                  "Messages received from upstreams", value=proxy.received)
        yield CounterMetricFamily("rankd_live_proxy_relayed",
                                  "Messages queued for proxied subscribers",
                                  value=proxy.relayed)
