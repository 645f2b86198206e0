"""A throwaway PostgreSQL cluster for tests.

``RANKD_TEST_POSTGRES_DSN`` points the tests at an existing server instead
(each test still gets its own fresh database there).  Otherwise the cluster
is created with PostgreSQL's own ``initdb``/``pg_ctl`` in a temporary
directory, listening on 127.0.0.1 on a free port, and removed afterwards.
Running as root, the server runs as the ``postgres`` user (it refuses root).
It runs with ``fsync=off`` (fast, and only an OS crash could lose data) but
keeps synchronous commit, so stopping it abruptly loses no committed
transaction, as with a production server.

When neither is available the tests skip, unless ``RANKD_REQUIRE_POSTGRES``
is set (CI sets it): then they fail, so they can never silently skip there.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from ports import free_port

PG_BIN_DIRS = [Path("/usr/lib/postgresql/15/bin"), Path("/usr/lib/postgresql/16/bin"),
               Path("/usr/lib/postgresql/17/bin")]


def _bin_dir() -> Path | None:
    for directory in PG_BIN_DIRS:
        if (directory / "initdb").exists():
            return directory
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def unavailable(reason: str) -> None:
    """Skip, or fail when Postgres tests are required."""
    if os.environ.get("RANKD_REQUIRE_POSTGRES", "") not in ("", "0"):
        pytest.fail(f"Postgres tests are required but cannot run: {reason}")
    pytest.skip(reason)


class Cluster:
    """A PostgreSQL server in a temporary directory, started and stopped by the tests."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="rankd-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.user = "postgres" if os.geteuid() == 0 else None
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        self.admin_dsn = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        command = [str(self.bin_dir / args[0]), *args[1:]]
        if self.user is not None:
            command = ["runuser", "-u", self.user, "--", *command]
        return subprocess.run(command, check=check, capture_output=True, text=True,
                              timeout=120, cwd=self.root)

    def init(self) -> None:
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust",
                  "--no-sync", "-E", "UTF8")

    def start(self, *, durable: bool = False, settings: dict[str, str] | None = None) -> None:
        """Start; ``durable`` keeps Postgres's own fsync and full-page writes
        (benchmarks), else they are off (tests: faster)."""
        options = (f"-p {self.port} -c listen_addresses=127.0.0.1 "
                   f"-c unix_socket_directories={self.root}")
        if not durable:
            options += " -c fsync=off -c full_page_writes=off"
        for name, value in (settings or {}).items():
            options += f" -c {name}={value}"
        result = self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options,
                           "-w", "-t", "60", "start", check=False)
        if result.returncode != 0:
            raise RuntimeError(f"pg_ctl start failed: {result.stderr}\n{self.log_text()}")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def make_standby_of(self, primary: Cluster, name: str) -> None:
        """Instead of :meth:`init`: a streaming standby of ``primary``
        (``pg_basebackup``), known to it as ``name`` (for
        ``synchronous_standby_names``)."""
        conninfo = f"host=127.0.0.1 port={primary.port} user=postgres application_name={name}"
        self._run("pg_basebackup", "-d", conninfo, "-D", str(self.data), "-X", "stream", "-R",
                  "--no-sync")
        with open(self.data / "postgresql.auto.conf", "a") as conf:
            conf.write(f"primary_conninfo = '{conninfo}'\n")

    def promote(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-w", "promote")

    def log_text(self) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text()
        return ""

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


class Server:
    """Where test databases are created: a throwaway cluster or a given DSN."""

    def __init__(self, admin_dsn: str, cluster: Cluster | None) -> None:
        self.admin_dsn = admin_dsn
        self.cluster = cluster

    def create_database(self) -> str:
        """A new empty database; returns its DSN."""
        name = f"rankd_test_{uuid.uuid4().hex[:12]}"

        async def create() -> None:
            conn = await asyncpg.connect(self.admin_dsn)
            try:
                await conn.execute(f'CREATE DATABASE "{name}"')
            finally:
                await conn.close()

        asyncio.run(create())
        base, _, _ = self.admin_dsn.rpartition("/")
        return f"{base}/{name}"


def start_server() -> Server:
    dsn = os.environ.get("RANKD_TEST_POSTGRES_DSN")
    if dsn:
        return Server(dsn, None)
    bin_dir = _bin_dir()
    if bin_dir is None:
        unavailable("no PostgreSQL server binaries (initdb) and no RANKD_TEST_POSTGRES_DSN")
    cluster = Cluster(bin_dir)
    cluster.init()
    cluster.start()
    return Server(cluster.admin_dsn, cluster)


@contextlib.contextmanager
def database(dsn: str | None = None) -> Iterator[str]:
    """``dsn`` itself, or (None) an empty database on a throwaway server
    that is destroyed at the end: what a benchmark's ``--dsn`` defaults to."""
    if dsn is not None:
        yield dsn
        return
    server = start_server()
    try:
        yield server.create_database()
    finally:
        if server.cluster is not None:
            server.cluster.destroy()
