"""Daemon settings: command-line flags > ``RANKD_*`` environment > TOML file
> defaults.

Every option is declared once in :data:`OPTIONS`; the ``rankd serve`` flags,
the environment variable names, the TOML keys and ``--help`` all come from
that table, so they cannot drift apart.
"""

from __future__ import annotations

import argparse
import math
import os
import socket
import ssl
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from rankd.cluster.node import ClusterConfig
from rankd.cluster.trust import MIN_SECRET_BYTES as CLUSTER_SECRET_BYTES
from rankd.engine.engine import FSYNC_POLICIES, EngineConfig
from rankd.engine.tail import (
    DEFAULT_SNAPSHOT_EVERY_BYTES,
    DEFAULT_SNAPSHOT_EVERY_EVENTS,
    MAX_SNAPSHOT_EVERY_BYTES,
    MAX_SNAPSHOT_EVERY_EVENTS,
)
from rankd.frontends.origins import OriginPolicy
from rankd.index.kinds import INDEX_KINDS
from rankd.security import Gate, TrustedProxies
from rankd.security.auth import MIN_SECRET_BYTES, AuthConfig, Authenticator
from rankd.security.limits import LimitsConfig, RateLimiter, is_loopback
from rankd.security.signing import SIGNATURE_LIFETIME


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` names only loopback addresses.  An empty host is not
    one: a listener bound to it listens on every interface."""
    return host == "localhost" or (host != "" and is_loopback(host))


@dataclass(frozen=True)
class Option:
    name: str
    type: type
    default: Any
    help: str
    choices: tuple[str, ...] | None = None
    #: The smallest value a number may take (else: not negative).
    minimum: float = 0
    #: The largest value a number may take (None: no limit).
    maximum: float | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return "RANKD_" + self.name.upper()


OPTIONS = (
    Option("host", str, "127.0.0.1", "address the HTTP, TCP and RESP listeners bind to"),
    Option("port", int, 7700, "HTTP port (REST, live feed, page)"),
    Option("tcp_port", int, 7701, "msgpack TCP protocol port (0 disables it)"),
    Option("resp_port", int, 7702,
           "Redis protocol (RESP) port: Redis clients use boards as sorted sets (see "
           "docs/redis.md; 0 disables it)"),
    Option("data_dir", Path, Path("rankd-data"), "directory for the WAL, snapshots and archive"),
    Option("fsync", str, "everysec",
           "WAL fsync policy: always (ack after fsync, group commit), everysec (a machine "
           "crash may lose the last second), no (left to the OS)", FSYNC_POLICIES),
    Option("index", str, "pages",
           "rank index layout of every board: pages (compact: entries packed in pages, "
           "names stored once) or skiplist (one node a member); both take the native "
           "fast paths (see docs/operations.md, \"Index layout\")",
           INDEX_KINDS),
    Option("segment_bytes", int, 64 << 20, "size at which the WAL starts a new segment file",
           minimum=4096),
    Option("postgres_dsn", str, None, "ship every event to this PostgreSQL database"),
    Option("cluster_dsn", str, None,
           "run as a node of the cluster whose logs and leases are in this PostgreSQL "
           "database (see docs/cluster.md); every node is started the same way"),
    Option("node_id", str, None, "this node's name in the cluster (default: hostname:port)"),
    Option("advertise", str, None,
           "host:port other nodes and clients reach this node's HTTP API at (default: "
           "--host:--port, or hostname:port when --host is every interface)"),
    Option("ack", str, "log",
           "cluster: acknowledge a write once Postgres committed it (log: nothing "
           "acknowledged is lost on failover) or once the local WAL holds it (local)",
           ("log", "local")),
    Option("ack_timeout", float, 10.0,
           "cluster: seconds a write waits for the log before it answers unacknowledged",
           minimum=0.001),
    Option("lease_seconds", float, 4.0,
           "cluster: how long a primary's lease lasts without renewal (failover takes about "
           "this long)", minimum=0.3),
    Option("max_unshipped_ms", float, 1000.0,
           "cluster, --ack local: refuse writes while the oldest record not in Postgres is "
           "older than this", minimum=1),
    Option("group_snapshot_records", int, 100_000,
           "cluster: a primary stores each group's state in Postgres after this many of its "
           "records, once the log grew by the last snapshot's size too, and the log older "
           "than the snapshot before drops (followers that far behind load the snapshot)",
           minimum=1),
    Option("group_idle_seconds", float, 30.0,
           "cluster: a primary gives up a group nothing was written to for this long, once "
           "all of it is in Postgres (its lease stops being renewed; the next write takes "
           "it again; 0: never)", minimum=0),
    Option("max_follow_lag", float, 5.0,
           "cluster: refuse reads (503 unavailable) of a board group this node cannot vouch "
           "is at most this many seconds behind the cluster's log (a node cut off from "
           "Postgres, or whose disk is full), and leave /v1/ready meanwhile; 0: never "
           "refuse", minimum=0),
    Option("replicas", int, 1,
           "cluster: followers each board group is placed on besides its primary (a node "
           "holds in memory only the groups it writes or follows once they are placed)",
           minimum=0),
    Option("max_moves", int, 8,
           "cluster: group moves the planner keeps in progress at most (a rebalance goes "
           "on round after round until balanced; fewer: gentler on the nodes, slower)",
           minimum=1),
    Option("auto_rebalance", float, 300.0,
           "cluster: seconds the heaviest node must lead more than 1.25 times the mean "
           "load before the planner rebalances by itself (0: only when asked or when nodes "
           "join or leave)", minimum=0),
    Option("min_free_disk", int, 256 << 20,
           "cluster: a node whose data dir has fewer free bytes than this is given no "
           "group by the planner (it keeps those it holds)", minimum=0),
    Option("cluster_secret", str, None,
           "cluster: the secret every node of the cluster shares (at least 32 bytes; "
           "required with credentials; --cluster-secret-file keeps it out of `ps`): nodes "
           "sign their rows and forwards with it (see docs/cluster.md, Trust)"),
    Option("cluster_secret_file", Path, None, "read --cluster-secret from this file"),
    Option("snapshot_every_events", int, DEFAULT_SNAPSHOT_EVERY_EVENTS,
           "snapshot after this many WAL records since the last snapshot (or, if more, as "
           "many as the last snapshot wrote entries, up to 4,000,000; or "
           "--snapshot-every-bytes, whichever first): bounds what a crash restart replays",
           minimum=1, maximum=MAX_SNAPSHOT_EVERY_EVENTS),
    Option("snapshot_every_bytes", int, DEFAULT_SNAPSHOT_EVERY_BYTES,
           "snapshot after this many bytes of WAL since the last snapshot (or "
           "--snapshot-every-events, whichever first)",
           minimum=4096, maximum=MAX_SNAPSHOT_EVERY_BYTES),
    Option("snapshot_every_seconds", float, 300.0, "snapshot at least this often when busy"),
    Option("dedupe_ttl", float, 86_400.0, "seconds an event_id is remembered"),
    Option("ts_tolerance", float, 300.0, "how far an event timestamp may be from now, seconds"),
    Option("repair", bool, False, "start even if the WAL is corrupt mid-log: truncate it there "
                                  "and move the rest aside to wal/corrupt-* files"),
    Option("live_interval", float, 0.25,
           "seconds between live-feed pushes (changes in between are coalesced)"),
    Option("live_send_timeout", float, 10.0,
           "seconds a live subscriber may leave a push unread before it is disconnected"),
    Option("live_max_per_address", int, 1000, "live-feed connections allowed per client address"),
    Option("max_connections", int, 0, "open HTTP, TCP and RESP connections allowed in all "
                                      "(0: what the descriptor limit leaves after a reserve)"),
    Option("max_connections_per_address", int, 256,
           "open connections allowed per client address (0: no cap; loopback, trusted "
           "proxies and a cluster's live nodes are exempt)"),
    Option("idle_timeout", float, 300.0,
           "seconds a TCP or RESP connection may stay silent before it is closed (0: never); "
           "a client whose replies wait this long (at most 60 s) for it to read is dropped"),
    Option("max_request_bytes", int, 4 << 20,
           "the most bytes of one RESP request rankd buffers (all its words); a larger one "
           "is refused with a protocol error and the connection closed (before AUTH: "
           "16 KiB)", minimum=65536),
    Option("pacing_us", float, 0.0,
           "while many TCP or RESP clients are in flight, a loop pass that answered at "
           "most half of them ends with a sleep of this many microseconds, instead of "
           "being woken by each client's send (0: off; see docs/operations.md, \"Loop "
           "pacing\", for when to turn it on)", minimum=0),
    Option("http_idle_timeout", float, 30.0,
           "seconds an HTTP connection may wait for (or trickle in) its next request, "
           "and a request body may take to arrive",
           minimum=1),
    Option("jwt_secret", str, None, "accept HS256 JWTs signed with this secret (at least 32 "
                                    "bytes; --jwt-secret-file keeps it out of `ps`)"),
    Option("jwt_secret_file", Path, None, "read --jwt-secret from this file"),
    Option("jwt_issuer", str, None, "accept only JWTs whose iss is this"),
    Option("jwt_audience", str, None, "accept only JWTs whose aud includes this"),
    Option("jwt_max_lifetime", float, 86_400.0,
           "refuse JWTs valid for longer than this many seconds (0: no limit)"),
    Option("jwt_public_key", Path, None, "accept RS256/ES256 JWTs verified with this PEM key"),
    Option("api_keys", str, None, "accepted API keys, comma-separated id:sha256hex:scopes "
                                  "entries (see rankd keygen); only hashes, never keys"),
    Option("signing_secret_file", Path, None, "read --signing-secret from this file"),
    Option("signing_secret", str, None, "HMAC secret of signed submissions (boards with "
                                        "\"signed\": true)"),
    Option("cors_origins", str, None,
           "web origins (scheme://host[:port], comma-separated) whose pages may call rankd "
           "from a browser; pages of any other origin are refused"),
    Option("frame_ancestors", str, None,
           "web origins (scheme://host[:port], comma-separated) whose pages may show the live "
           "page in a frame; by default no page may (Content-Security-Policy frame-ancestors)"),
    Option("trusted_proxies", str, None,
           "reverse proxies (addresses or CIDRs, comma-separated) whose X-Forwarded-For names "
           "an HTTP request's client for the per-address limits (see docs/security.md)"),
    Option("insecure_no_auth", bool, False, "allow listening beyond loopback without any "
                                            "credential configured"),
    Option("rate_address_writes", float, 2000.0,
           "writes/s per client address (0: unlimited; loopback is exempt)"),
    Option("rate_address_reads", float, 5000.0, "reads/s per client address (0: unlimited)"),
    Option("rate_credential_writes", float, 0.0, "writes/s per credential (0: unlimited)"),
    Option("rate_credential_reads", float, 0.0, "reads/s per credential (0: unlimited)"),
    Option("tls_cert", Path, None, "serve HTTP, TCP and RESP over TLS with this certificate (PEM)"),
    Option("tls_key", Path, None, "private key (PEM) of --tls-cert"),
    Option("log_format", str, "auto",
           "log format; auto: JSON lines when stderr is not a terminal (systemd, containers, "
           "files), text on a terminal", ("auto", "text", "json")),
    Option("log_level", str, "info", "log level", ("debug", "info", "warning", "error")),
)


@dataclass(frozen=True)
class ServerConfig:
    """Resolved daemon settings."""

    host: str = "127.0.0.1"
    port: int = 7700
    tcp_port: int = 7701
    resp_port: int = 7702
    data_dir: Path = Path("rankd-data")
    fsync: str = "everysec"
    index: str = "pages"
    segment_bytes: int = 64 << 20
    postgres_dsn: str | None = None
    cluster_dsn: str | None = None
    node_id: str | None = None
    advertise: str | None = None
    ack: str = "log"
    ack_timeout: float = 10.0
    lease_seconds: float = 4.0
    max_unshipped_ms: float = 1000.0
    group_snapshot_records: int = 100_000
    group_idle_seconds: float = 30.0
    max_follow_lag: float = 5.0
    replicas: int = 1
    max_moves: int = 8
    auto_rebalance: float = 300.0
    min_free_disk: int = 256 << 20
    cluster_secret: str | None = None
    cluster_secret_file: Path | None = None
    snapshot_every_events: int = DEFAULT_SNAPSHOT_EVERY_EVENTS
    snapshot_every_bytes: int = DEFAULT_SNAPSHOT_EVERY_BYTES
    snapshot_every_seconds: float = 300.0
    dedupe_ttl: float = 86_400.0
    ts_tolerance: float = 300.0
    repair: bool = False
    live_interval: float = 0.25
    live_send_timeout: float = 10.0
    live_max_per_address: int = 1000
    max_connections: int = 0
    max_connections_per_address: int = 256
    idle_timeout: float = 300.0
    max_request_bytes: int = 4 << 20
    pacing_us: float = 0.0
    http_idle_timeout: float = 30.0
    jwt_secret: str | None = None
    jwt_public_key: Path | None = None
    api_keys: str | None = None
    signing_secret: str | None = None
    jwt_secret_file: Path | None = None
    jwt_issuer: str | None = None
    jwt_audience: str | None = None
    jwt_max_lifetime: float = 86_400.0
    signing_secret_file: Path | None = None
    cors_origins: str | None = None
    frame_ancestors: str | None = None
    trusted_proxies: str | None = None
    insecure_no_auth: bool = False
    rate_address_writes: float = 2000.0
    rate_address_reads: float = 5000.0
    rate_credential_writes: float = 0.0
    rate_credential_reads: float = 0.0
    tls_cert: Path | None = None
    tls_key: Path | None = None
    log_format: str = "auto"
    log_level: str = "info"

    def gate(self) -> Gate:
        """Authentication, scopes and rate limits as configured."""
        keys = [entry for entry in (self.api_keys or "").split(",") if entry.strip()]
        jwt_secret = _secret(self.jwt_secret, self.jwt_secret_file, "jwt-secret")
        signing_secret = _secret(self.signing_secret, self.signing_secret_file,
                                 "signing-secret")
        if signing_secret is not None and len(signing_secret.encode()) < MIN_SECRET_BYTES:
            raise ConfigError(f"--signing-secret: {len(signing_secret.encode())} bytes; it "
                              f"needs at least {MIN_SECRET_BYTES}")
        if signing_secret is not None and self.dedupe_ttl < SIGNATURE_LIFETIME:
            # A signed event stays acceptable that long; forgotten sooner, it
            # could be sent again and applied twice.
            raise ConfigError(f"--dedupe-ttl {self.dedupe_ttl:g} is shorter than the "
                              f"{SIGNATURE_LIFETIME:g} s a signed submission stays valid: a "
                              "replayed one would be applied again")
        try:
            authenticator = Authenticator(AuthConfig(
                jwt_secret, self.jwt_public_key, keys, self.jwt_issuer, self.jwt_audience,
                self.jwt_max_lifetime))
        except (ValueError, OSError) as exc:
            raise ConfigError(f"credentials: {exc}") from None
        limits = LimitsConfig(self.rate_address_writes, self.rate_address_reads,
                              self.rate_credential_writes, self.rate_credential_reads)
        try:
            proxies = TrustedProxies.parse(self.trusted_proxies)
        except ValueError as exc:
            raise ConfigError(f"--trusted-proxies: {exc}") from None
        return Gate(authenticator, RateLimiter(limits), signing_secret, proxies)

    def origin_policy(self, gate: Gate) -> OriginPolicy:
        """Which pages may call from a browser (see rankd.frontends.origins)."""
        try:
            policy = OriginPolicy.parse((self.cors_origins or "").split(","),
                                        loopback_only=not (gate.auth_enabled
                                                           or self.insecure_no_auth))
        except ValueError as exc:
            raise ConfigError(f"--cors-origins: {exc}") from None
        try:
            return policy.framed_by((self.frame_ancestors or "").split(","))
        except ValueError as exc:
            raise ConfigError(f"--frame-ancestors: {exc}") from None

    def check_exposure(self, gate: Gate, bound: list[str] | None = None) -> None:
        """Secure by default: no credentials means loopback only.  Checked
        on ``--host`` before listening and again on the addresses the
        listeners really ``bound`` (a host name may resolve to anything)."""
        if gate.auth_enabled or self.insecure_no_auth:
            return
        exposed = ([address for address in bound if not is_loopback(address)]
                   if bound is not None else
                   [] if is_loopback_host(self.host) else [self.host])
        if exposed:
            raise ConfigError(f"refusing to listen on {', '.join(exposed)} without "
                              "authentication: configure --jwt-secret, --jwt-public-key or "
                              "--api-keys, or pass --insecure-no-auth to accept anyone who "
                              "can reach it")

    def ssl_context(self) -> ssl.SSLContext | None:
        if self.tls_cert is None and self.tls_key is None:
            return None
        if self.tls_cert is None or self.tls_key is None:
            raise ConfigError("TLS needs both --tls-cert and --tls-key")
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(self.tls_cert, self.tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"cannot load the TLS certificate or key: {exc}") from None
        return context

    def cluster_config(self) -> ClusterConfig | None:
        """How this node joins its cluster (None: a single node)."""
        if self.cluster_dsn is None:
            return None
        if self.postgres_dsn is not None:
            raise ConfigError("--postgres-dsn and --cluster-dsn: a cluster node's events are "
                              "in the cluster's log in Postgres already; give only "
                              "--cluster-dsn")
        secret = _secret(self.cluster_secret, self.cluster_secret_file, "cluster-secret")
        if secret is not None and len(secret.encode()) < CLUSTER_SECRET_BYTES:
            raise ConfigError(f"--cluster-secret: {len(secret.encode())} bytes; it needs at "
                              f"least {CLUSTER_SECRET_BYTES}")
        if secret is None and (self.api_keys or self.jwt_secret or self.jwt_secret_file
                               or self.jwt_public_key):
            raise ConfigError("a cluster node with credentials needs --cluster-secret (or "
                              "--cluster-secret-file), the same on every node: nodes prove "
                              "to each other with it that they are nodes (docs/cluster.md)")
        if not math.isfinite(self.max_follow_lag):
            raise ConfigError(f"--max-follow-lag: expected a number of seconds (0: never "
                              f"refuse reads), got {self.max_follow_lag!r}")
        host = self.host if self.host not in ("", "0.0.0.0", "::") else socket.gethostname()
        advertise = self.advertise or f"{host}:{self.port}"
        return ClusterConfig(
            dsn=self.cluster_dsn, node_id=self.node_id or f"{socket.gethostname()}:{self.port}",
            advertise=advertise, ack=self.ack,
            advertise_tcp=(f"{advertise.rpartition(':')[0]}:{self.tcp_port}"
                           if self.tcp_port else None),
            advertise_resp=(f"{advertise.rpartition(':')[0]}:{self.resp_port}"
                            if self.resp_port else None),
            ack_timeout=self.ack_timeout, lease_seconds=self.lease_seconds,
            max_unshipped_ms=self.max_unshipped_ms,
            group_snapshot_records=self.group_snapshot_records,
            secret=secret.encode() if secret is not None else None,
            group_idle_seconds=self.group_idle_seconds, max_follow_lag=self.max_follow_lag,
            replicas=self.replicas, max_moves=self.max_moves,
            auto_rebalance=self.auto_rebalance, min_free_disk=self.min_free_disk)

    def engine_config(self) -> EngineConfig:
        engine_fields = {f.name for f in fields(EngineConfig)}
        return EngineConfig(**{f.name: getattr(self, f.name) for f in fields(self)
                               if f.name in engine_fields})


def _secret(given: str | None, path: Path | None, name: str) -> str | None:
    """A secret from its option or from its file (one line), not both."""
    if path is None:
        return given
    if given is not None:
        raise ConfigError(f"--{name} and --{name}-file both given: use one")
    try:
        return path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"--{name}-file {path}: {exc.strerror}") from None


class ConfigError(Exception):
    """A setting has a bad value or name; the message says which and where."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--config`` and one flag per option to ``parser``."""
    parser.add_argument("--config", type=Path, metavar="FILE",
                        help="TOML file with any of the settings below (env: RANKD_CONFIG)")
    for option in OPTIONS:
        default = "none" if option.default is None else option.default
        if option.type is bool:
            parser.add_argument(option.flag, dest=option.name, default=None,
                                action="store_const", const=True,
                                help=f"{option.help} (env: {option.env}=1)")
            continue
        parser.add_argument(option.flag, dest=option.name, default=None,
                            metavar=option.name.upper(),
                            choices=option.choices,
                            help=f"{option.help} (env: {option.env}; default: {default})")


def resolve(args: argparse.Namespace, environ: dict[str, str] | None = None) -> ServerConfig:
    """Merge flags, environment, config file and defaults, checking every value."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {option.name: option.default for option in OPTIONS}
    config_path = args.config or (Path(environ["RANKD_CONFIG"]) if "RANKD_CONFIG" in environ
                                  else None)
    if config_path is not None:
        values.update(_from_file(config_path))
    for option in OPTIONS:
        if option.env in environ:
            values[option.name] = _convert(option, environ[option.env], option.env)
        given = getattr(args, option.name, None)
        if given is not None:
            values[option.name] = _convert(option, given, option.flag)
    return ServerConfig(**values)


def _from_file(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    by_name = {option.name: option for option in OPTIONS}
    unknown = sorted(set(data) - set(by_name))
    if unknown:
        raise ConfigError(f"unknown setting(s) in {path}: {', '.join(unknown)}")
    return {name: _convert(by_name[name], value, f"{path}: {name}")
            for name, value in data.items()}


def _convert(option: Option, value: Any, where: str) -> Any:
    if option.type is Path:
        return Path(value)
    if option.type is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off", ""):
            return False
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    if option.name == "host" and not str(value).strip():
        raise ConfigError(f"{where}: empty; name the address to listen on (127.0.0.1, ::1, a "
                          "host name, or 0.0.0.0 for every interface)")
    try:
        if option.type is int and isinstance(value, bool | float):
            raise ValueError(value)
        converted = option.type(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: expected {option.type.__name__}, got {value!r}") from None
    if option.choices and converted not in option.choices:
        raise ConfigError(f"{where}: must be one of {', '.join(option.choices)}, got {value!r}")
    if option.type in (int, float) and converted < option.minimum:
        raise ConfigError(f"{where}: must be at least {option.minimum:g}, got {value!r}"
                          if option.minimum else f"{where}: must not be negative, got {value!r}")
    if option.maximum is not None and converted > option.maximum:
        limit = int(option.maximum) if option.type is int else option.maximum
        raise ConfigError(f"{where}: must be at most {limit:,}, got {value!r}")
    return converted
