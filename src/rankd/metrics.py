"""Prometheus metrics (``GET /metrics``).

Hot paths only bump plain integers (the WAL, the TCP front-end, the live
feed keep their own counters); a collector reads them, and the engine's
state, when Prometheus scrapes.  Only REST requests go through
prometheus-client objects directly, since an HTTP request costs far more
than the observation.
"""

from __future__ import annotations

import bisect
import math
import resource
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from rankd import __version__
from rankd._native import implementations

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


#: Upper bounds of the REST latency histogram's buckets, in seconds.
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Metrics:
    """The registry of one daemon, and the REST request metrics."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        #: (operation, status) -> [requests]; operations are route handler
        #: names and statuses HTTP codes, so this stays small.
        self._requests: dict[tuple[str, int], list[int]] = {}
        #: operation -> [count in each bucket (the last: above every bound),
        #: sum of seconds]: counted here, rendered at scrape time
        #: (:class:`RequestCollector`), as plain integers (prometheus-client's
        #: objects take a lock for each count, three a request).
        self._latency: dict[str, list[Any]] = {}
        self._created: dict[Any, float] = {}
        self.registry.register(RequestCollector(self))

    def observe_request(self, operation: str, status: int, seconds: float) -> None:
        counted = self._requests.get((operation, status))
        if counted is None:
            counted = self._requests[(operation, status)] = [0]
            self._created[(operation, status)] = time.time()
        counted[0] += 1
        latency = self._latency.get(operation)
        if latency is None:
            latency = self._latency[operation] = [0] * (len(LATENCY_BUCKETS) + 2)
            latency[-1] = 0.0
            self._created[operation] = time.time()
        latency[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        latency[-1] += seconds

    def add(self, collector: Collector) -> None:
        self.registry.register(collector)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RequestCollector(Collector):
    """The REST request metrics of a :class:`Metrics`, read at scrape time:
    ``rankd_http_requests_total`` by operation and status, and the
    ``rankd_http_request_seconds`` histogram by operation."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily("rankd_http_requests",
                                       "REST requests by operation and status",
                                       labels=["operation", "status"])
        for (operation, status), (count,) in sorted(self.metrics._requests.items()):
            requests.add_metric([operation, str(status)], count,
                                created=self.metrics._created[(operation, status)])
        yield requests
        latency = HistogramMetricFamily("rankd_http_request_seconds", "REST request latency",
                                        labels=["operation"])
        for operation, counts in sorted(self.metrics._latency.items()):
            cumulative, buckets = 0, []
            for bound, count in zip((*LATENCY_BUCKETS, math.inf), counts, strict=False):
                cumulative += count
                buckets.append((floatToGoString(bound), cumulative))
            latency.add_metric([operation], buckets, counts[-1])
            latency.add_sample("rankd_http_request_seconds_created", {"operation": operation},
                               self.metrics._created[operation])
        yield latency


class DaemonCollector(Collector):
    """Reads the engine, WAL, shipper, TCP and RESP front-ends, live feed and
    loop watchdog at scrape time."""

    def __init__(self, engine: Any, tcp: Any = None, feed: Any = None, resp: Any = None,
                 watchdog: Any = None) -> None:
        self.engine = engine
        self.tcp = tcp
        self.feed = feed
        self.resp = resp
        self.watchdog = watchdog
        self.started = time.time()

    def collect(self) -> Iterator[Metric]:
        yield from self._build()
        yield from self._engine()
        yield from self._wal()
        yield from self._shipper()
        yield from self._cluster()
        yield from self._tcp()
        yield from self._resp()
        yield from self._live()
        yield from self._loop()
        yield from self._process()

    def _engine(self) -> Iterator[Metric]:
        engine = self.engine
        submissions = CounterMetricFamily("rankd_submissions", "Submissions by outcome",
                                          labels=["outcome"])
        for outcome, count in engine.stats.items():
            submissions.add_metric([outcome], count)
        yield submissions
        members = GaugeMetricFamily("rankd_board_members",
                                    "Members in the current period of each board window",
                                    labels=["board", "window"])
        now = engine.clock()
        for name, board in list(engine.boards.items()):
            for window, count in board.member_counts(now).items():
                members.add_metric([name, window], count)
        yield members
        yield GaugeMetricFamily("rankd_boards", "Boards", value=len(engine.boards))
        yield GaugeMetricFamily("rankd_read_only", "1 after a storage failure",
                                value=int(engine.failure is not None))
        snapshot = engine.last_snapshot
        if snapshot:
            yield GaugeMetricFamily("rankd_snapshot_seconds", "Duration of the last snapshot",
                                    value=snapshot["seconds"])
            yield GaugeMetricFamily("rankd_snapshot_bytes", "Size of the last snapshot",
                                    value=snapshot["bytes"])

    def _wal(self) -> Iterator[Metric]:
        wal = self.engine.wal
        if wal is None:
            return
        stats = wal.stats
        yield CounterMetricFamily("rankd_wal_appends", "Records appended", value=stats.appends)
        yield CounterMetricFamily("rankd_wal_bytes", "Bytes appended", value=stats.bytes)
        yield CounterMetricFamily("rankd_wal_fsyncs", "fsync calls", value=stats.fsyncs)
        yield CounterMetricFamily("rankd_wal_fsync_seconds", "Time spent in fsync",
                                  value=stats.fsync_seconds)
        yield GaugeMetricFamily("rankd_wal_last_fsync_seconds", "Duration of the last fsync",
                                value=stats.last_fsync_seconds)
        yield GaugeMetricFamily("rankd_wal_segments", "Segment files",
                                value=len(wal.segments()))
        yield GaugeMetricFamily("rankd_wal_last_position", "Newest log position",
                                value=wal.last_lsn)

    def _cluster(self) -> Iterator[Metric]:
        node = self.engine.replication
        if node is None:
            return
        figures = node.figures()
        for name, text in (
                ("groups_written", "Board groups this node is the primary of"),
                ("groups_followed", "Board groups this node follows"),
                ("unshipped_records", "Records applied here as primary, not yet committed to "
                                      "the cluster's log"),
                ("unshipped_seconds", "Age of the oldest of them"),
                ("follow_lag_records", "Largest lag behind a followed group's log"),
                ("log_connected", "1 while the log tail's connection to Postgres is up"),
                ("read_staleness_seconds", "How stale the stalest group's reads here may be "
                                           "(-1: a group this node cannot vouch for at all)"),
                ("stale_groups", "Groups whose reads are refused here (--max-follow-lag)"),
                ("topology_epoch", "The cluster's placement version as this node last read it"),
                ("groups_unheld", "Board groups placed on other nodes only (not held here)"),
                ("move_last_pause_seconds", "How long the last group this node handed over "
                                            "held its writes")):
            yield GaugeMetricFamily(f"rankd_cluster_{name}", text, value=figures[name])
        for name, text in (
                ("takeovers", "Groups this node became the primary of"),
                ("orphaned_records", "Records set aside after this node was deposed "
                                     "(wal/orphan-*)"),
                ("group_snapshots", "Group snapshots this node stored in Postgres"),
                ("bootstraps", "Groups this node loaded from a snapshot"),
                ("disk_recoveries", "Times this node started again from the cluster's log "
                                    "after its local log failed"),
                ("moves_out", "Board groups this node handed over to another node")):
            yield CounterMetricFamily(f"rankd_cluster_{name}", text, value=figures[name])
        yield from self._planner(figures)
        yield from _move_steps(node, figures)

    @staticmethod
    def _planner(figures: dict[str, float]) -> Iterator[Metric]:
        """The planner's figures (rankd.cluster.drift, rankd.cluster.capacity)."""
        yield GaugeMetricFamily(
            "rankd_cluster_drift_ratio", "On the planner's node: the heaviest node's "
            "load over the mean (0 on the other nodes)", value=figures["drift_ratio"])
        yield GaugeMetricFamily(
            "rankd_cluster_nodes_given_no_group", "On the planner's node: live nodes short of "
            "disk or whose local log fails", value=figures["nodes_given_no_group"])
        yield CounterMetricFamily(
            "rankd_cluster_drift_rebalances", "Rebalances this node's planner started because "
            "the load drifted (--auto-rebalance)", value=figures["drift_rebalances"])

    def _shipper(self) -> Iterator[Metric]:
        shipper = self.engine.shipper
        if shipper is None:
            return
        status = shipper.status()
        yield GaugeMetricFamily("rankd_postgres_connected", "Shipper connected",
                                value=int(status["connected"]))
        yield GaugeMetricFamily("rankd_postgres_lag_records", "Records not yet in Postgres",
                                value=status["lag_records"])
        yield GaugeMetricFamily("rankd_postgres_lag_seconds",
                                "Seconds since the shipper last caught up",
                                value=status["lag_seconds"])
        yield GaugeMetricFamily("rankd_postgres_stalled",
                                "1 when shipping cannot go on without an operator",
                                value=int(status["stalled"] is not None))
        yield CounterMetricFamily("rankd_postgres_dead_letters",
                                  "Records whose columns Postgres refused (set aside)",
                                  value=shipper.dead_letters)
        yield CounterMetricFamily("rankd_postgres_shipped", "Records shipped",
                                  value=shipper.shipped_total)
        yield CounterMetricFamily("rankd_postgres_errors", "Shipping errors",
                                  value=shipper.errors)

    def _build(self) -> Iterator[Metric]:
        """Which implementation each hot loop runs: a benchmark of a daemon
        that fell back to pure Python must be able to tell."""
        parts = implementations()
        info = GaugeMetricFamily("rankd_build_info", "Version and the implementation of "
                                 "each hot loop (native or python)",
                                 labels=["version", *parts])
        info.add_metric([__version__, *parts.values()], 1)
        yield info

    def _tcp(self) -> Iterator[Metric]:
        if self.tcp is None:
            return
        yield GaugeMetricFamily("rankd_tcp_connections", "Open TCP protocol connections",
                                value=len(self.tcp.connections))
        yield GaugeMetricFamily("rankd_connections", "Open HTTP, TCP and RESP connections",
                                value=self.tcp.limits.total)
        yield CounterMetricFamily("rankd_connections_refused",
                                  "Connections refused over a connection cap",
                                  value=self.tcp.limits.refused)
        requests = CounterMetricFamily("rankd_tcp_requests", "TCP requests by op and status",
                                       labels=["op", "status"])
        for (op, status), count in self.tcp.counts().items():
            requests.add_metric([op, status], count)
        yield requests
        if self.tcp.pacer is not None:
            yield CounterMetricFamily(
                "rankd_loop_pauses", "Event-loop passes that ended with a --pacing-us "
                "pause (many TCP or RESP clients in flight)", value=self.tcp.pacer.pauses)

    def _resp(self) -> Iterator[Metric]:
        if self.resp is None:
            return
        yield GaugeMetricFamily("rankd_resp_connections", "Open Redis-protocol connections",
                                value=len(self.resp.connections))
        commands = CounterMetricFamily(
            "rankd_resp_commands", "Redis-protocol commands by command and status (the "
            "native paths count as read and write)", labels=["command", "status"])
        for (command, status), count in self.resp.counts().items():
            commands.add_metric([command, status], count)
        yield commands

    def _live(self) -> Iterator[Metric]:
        feed = self.feed
        if feed is None:
            return
        yield GaugeMetricFamily("rankd_live_subscribers", "Live-feed subscribers",
                                value=sum(feed.per_address.values()))
        yield CounterMetricFamily("rankd_live_pushes", "Messages queued for subscribers",
                                  value=feed.pushes)
        yield CounterMetricFamily("rankd_live_drops", "Subscribers dropped as too slow",
                                  value=feed.drops)
        yield CounterMetricFamily("rankd_live_ticks", "Live-feed ticks", value=feed.ticks)

    def _loop(self) -> Iterator[Metric]:
        watchdog = self.watchdog
        if watchdog is None:
            return
        histogram = watchdog.histogram
        yield HistogramMetricFamily(
            "rankd_loop_stall_seconds", "How late the event loop's heartbeat ran: how long "
            "callbacks held the loop (see docs/operations.md, loop watchdog)",
            buckets=histogram.buckets(), sum_value=histogram.sum)
        yield CounterMetricFamily("rankd_loop_stalls", "Event-loop stalls over the "
                                  "watchdog's threshold (each logged as a warning)",
                                  value=watchdog.stalls)

    def _process(self) -> Iterator[Metric]:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        yield GaugeMetricFamily("rankd_process_max_rss_bytes", "Peak resident memory",
                                value=usage.ru_maxrss * 1024)
        try:
            with open("/proc/self/statm") as handle:
                rss_pages = int(handle.read().split()[1])
            yield GaugeMetricFamily("rankd_process_rss_bytes", "Resident memory",
                                    value=rss_pages * resource.getpagesize())
        except OSError:
            pass
        yield CounterMetricFamily("rankd_process_cpu_seconds", "CPU time used",
                                  value=usage.ru_utime + usage.ru_stime)
        yield GaugeMetricFamily("rankd_uptime_seconds", "Seconds since start",
                                value=time.time() - self.started)


def _move_steps(node: Any, figures: dict[str, float]) -> Iterator[Metric]:
    """A cluster node's last move cut-over, step by step (rankd.cluster.cutover)."""
    mover = getattr(node, "mover", None)
    if mover is None:
        return
    yield CounterMetricFamily("rankd_cluster_move_writes_held", "Writes that waited for a "
                              "move's cut-over on this node", value=figures["move_writes_held"])
    yield GaugeMetricFamily("rankd_cluster_move_longest_hold_seconds", "The longest a write "
                            "waited for a move's cut-over on this node",
                            value=figures["move_longest_hold_seconds"])
    steps = GaugeMetricFamily("rankd_cluster_move_step_seconds", "Each step of the last "
                              "move cut-over this node took part in, as source or target",
                              labels=["side", "step"])
    for (side, step), seconds in mover.last_steps().items():
        steps.add_metric([side, step], seconds)
    yield steps
