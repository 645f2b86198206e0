"""The daemon: one process serving REST (and later the live feed and TCP)
over one engine.

Start-up order matters: the data dir is locked first (a second daemon
fails before it listens), then HTTP starts so ``/v1/health`` can answer 503
while recovery runs, then the engine recovers and serves.  SIGTERM and
SIGINT stop accepting, let in-flight requests finish, flush the WAL, take a
snapshot and exit 0; after a storage failure they take no snapshot and the
exit status is 1.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from rankd import __version__
from rankd._native import implementations
from rankd.cluster.node import ClusterNode
from rankd.config import ServerConfig
from rankd.engine import collector, heap
from rankd.engine.engine import Engine
from rankd.engine.wal import WalCorruptError
from rankd.frontends.connections import ConnectionLimits, GuardedSite, default_max_connections
from rankd.frontends.forwarding import Forwarder
from rankd.frontends.live import LiveFeed
from rankd.frontends.live_http import add_live_routes
from rankd.frontends.pacing import LoopPacer
from rankd.frontends.resp.connection import RespServer
from rankd.frontends.rest import BODY_SECONDS, create_app
from rankd.frontends.service import Service
from rankd.frontends.tcp import TcpServer
from rankd.logbudget import ClientErrorFilter
from rankd.metrics import DaemonCollector, Metrics
from rankd.security import Gate
from rankd.startup import listening, reaching_postgres
from rankd.watchdog import LoopWatchdog

log = logging.getLogger("rankd")

SHUTDOWN_GRACE_SECONDS = 10.0


class StoppedAfterFailure(Exception):
    """The daemon stopped in the read-only state a storage failure left it
    in: what it had not logged was not kept (its exit status is not 0)."""


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for log shippers."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(getattr(record, "fields", {}))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def cap_exemption(gate: Gate, node: ClusterNode | None) -> Callable[[str], bool]:
    """Which client addresses the per-address connection cap spares:
    loopback and trusted proxies, and a cluster node's live peers
    (:mod:`rankd.cluster.peer_hosts`)."""
    exempt = gate.trusted_proxies.exempt_from_address_caps
    if node is None:
        return exempt
    peers = node.peer_hosts
    return lambda address: exempt(address) or address in peers


def setup_logging(config: ServerConfig) -> None:
    handler = logging.StreamHandler(sys.stderr)
    log_format = config.log_format
    if log_format == "auto":
        log_format = "text" if sys.stderr.isatty() else "json"
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(config.log_level.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    # A client sending garbage in a loop: a bounded number of short lines.
    server_log = logging.getLogger("aiohttp.server")
    server_log.filters[:] = [f for f in server_log.filters if not isinstance(f, ClientErrorFilter)]
    server_log.addFilter(ClientErrorFilter())


async def serve(config: ServerConfig, *, started: asyncio.Event | None = None,
                stop: asyncio.Event | None = None) -> None:
    """Run the daemon until ``stop`` is set or SIGTERM/SIGINT arrives."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)

    gate = config.gate()
    config.check_exposure(gate)
    origins = config.origin_policy(gate)
    tls = config.ssl_context()
    engine = Engine(config.engine_config())
    cluster_config = config.cluster_config()
    node = ClusterNode(engine, cluster_config) if cluster_config is not None else None
    engine.lock()
    service = Service(engine, signing_secret=gate.signing_secret)
    service.cluster = node
    service.topology = node.topology if node is not None else None
    service.listening = False  # ready only once the TCP listener is up too
    limits = ConnectionLimits(config.max_connections or default_max_connections(),
                              config.max_connections_per_address,
                              cap_exemption(gate, node))
    tcp = TcpServer(service, gate, limits=limits, idle_timeout=config.idle_timeout)
    resp = RespServer(service, gate, limits=limits, idle_timeout=config.idle_timeout,
                      max_request=config.max_request_bytes, port_of={"fsync": config.fsync})
    if config.pacing_us:
        tcp.pacer = resp.pacer = LoopPacer(config.pacing_us / 1e6)
    feed = LiveFeed(engine, interval=config.live_interval,
                    send_timeout=config.live_send_timeout,
                    max_per_address=config.live_max_per_address)
    watchdog = LoopWatchdog()
    metrics = Metrics()
    metrics.add(DaemonCollector(engine, tcp, feed, resp, watchdog))
    app = create_app(service, gate, metrics, origins,
                     Forwarder(cluster_config.node_id, cluster_config.ack_timeout + 5,
                               node.trust, cluster_config.advertise)
                     if node is not None else None,
                     body_seconds=config.http_idle_timeout or BODY_SECONDS)
    add_live_routes(app, feed)
    # The keep-alive timeout also runs from the moment a connection opens and
    # while a request trickles in: the header-read timeout against slowloris.
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_GRACE_SECONDS,
                           keepalive_timeout=config.http_idle_timeout)
    await runner.setup()
    site = GuardedSite(runner, config.host, config.port, limits, ssl_context=tls)
    try:
        await listening("HTTP", "--port", config.host, config.port, site.start())
        config.check_exposure(gate, [address[0] for address in runner.addresses])
        began = time.monotonic()
        try:
            await engine.start()
        except WalCorruptError as exc:
            if node is None:
                raise
            await engine.set_local_state_aside(exc)
            await engine.start()
        if node is not None:
            await reaching_postgres("--cluster-dsn", node.config.dsn, node.start())
        collector.settle()
        tcp_address = "off"
        if config.tcp_port:
            tcp_port = await listening("TCP", "--tcp-port", config.host, config.tcp_port,
                                       tcp.start(config.host, config.tcp_port, ssl=tls))
            config.check_exposure(gate, tcp.addresses)
            tcp_address = f"{config.host}:{tcp_port}"
        resp_address = "off"
        if config.resp_port:
            resp_port = await listening("RESP", "--resp-port", config.host, config.resp_port,
                                        resp.start(config.host, config.resp_port, ssl=tls))
            config.check_exposure(gate, resp.addresses)
            resp_address = f"{config.host}:{resp_port}"
        service.listening = True
        if not gate.auth_enabled and config.insecure_no_auth:
            log.warning("NO AUTHENTICATION on %s (--insecure-no-auth): anyone who can reach "
                        "it, and any web page a user of this network opens, can read and "
                        "write every board", config.host)
        log.info(
            "rankd %s serving: %s data_dir=%s fsync=%s index_layout=%s http=%s:%d tcp=%s resp=%s "
            "postgres=%s cluster=%s auth=%s tls=%s (recovered in %.2fs)", __version__,
            " ".join(f"{part}={kind}" for part, kind in implementations().items()),
            config.data_dir.resolve(), config.fsync, config.index, config.host, config.port,
            tcp_address,
            resp_address, "on" if config.postgres_dsn else "off",
            f"{cluster_config.node_id}/ack={cluster_config.ack}" if cluster_config else "off",
            "on" if gate.auth_enabled else "off (loopback only)" if not config.insecure_no_auth
            else "OFF (--insecure-no-auth)", "on" if tls else "off",
            time.monotonic() - began)
        watchdog.start(loop)
        if started is not None:
            started.set()
        await stop.wait()
        log.info("shutting down: finishing in-flight requests")
    finally:
        watchdog.stop()
        # Stops listening, then waits for in-flight requests.
        await tcp.close(SHUTDOWN_GRACE_SECONDS)
        await resp.close(SHUTDOWN_GRACE_SECONDS)
        log.debug("shutting down: the TCP and RESP front-ends are closed")
        await runner.cleanup()
        log.debug("shutting down: the HTTP front-end is closed")
        if node is not None:
            await node.stop()
            log.debug("shutting down: the cluster node has left")
        await engine.close()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
    if engine.failure is not None:
        log.error("stopped after a storage failure: %s", engine.failure)
        raise StoppedAfterFailure(
            f"stopped after a storage failure ({engine.failure}); fix the disk, then restart "
            "to recover what the log holds")
    log.info("stopped cleanly")


def run(config: ServerConfig) -> None:
    """Run the daemon on uvloop when it is installed."""
    setup_logging(config)
    heap.tune()  # (before the engine allocates: see engine/heap.py)
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(config))
    else:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(serve(config))
