"""Start-up failures blame the right thing, in one line: a Postgres that is
down, a host name that resolves nowhere and a database that does not exist
name the database, the host and what to do (they once said ``cannot listen
on 127.0.0.1: Connection refused``, or printed a 44-line traceback); a port
clash names the listener and its flag."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from daemon import SRC, free_port


def _serve(data_dir: Path, *args: str) -> tuple[int, list[str]]:
    """``rankd serve`` on free loopback ports; its exit code and the stderr
    lines that are not JSON log records."""
    ports = {"--port": free_port(), "--tcp-port": free_port(), "--resp-port": free_port()}
    for flag, port in zip(args[::2], args[1::2], strict=False):
        if flag in ports:
            ports[flag] = int(port)
    rest = [a for i, a in enumerate(args)
            if not (a in ports or (i and args[i - 1] in ports))]
    command = [sys.executable, "-m", "rankd.cli", "serve", "--host", "127.0.0.1",
               "--data-dir", str(data_dir), "--log-format", "json",
               *(str(part) for pair in ports.items() for part in pair), *rest]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"})
    return done.returncode, [line for line in done.stderr.splitlines()
                             if not line.startswith("{")]


def _closed_port() -> int:
    return free_port()  # bound once and released: nothing listens there


def test_postgres_down_names_the_database_and_host(tmp_path):
    port = _closed_port()
    code, lines = _serve(tmp_path / "data", "--node-id", "a",
                         "--cluster-dsn", f"postgresql://rankd:pw@127.0.0.1:{port}/ranks")
    assert code == 1
    assert len(lines) == 1, lines
    line = lines[0]
    assert line.startswith("rankd: cannot use the Postgres database 'ranks' on "
                           f"127.0.0.1:{port} (--cluster-dsn)"), line
    assert "is Postgres running" in line and "listen" not in line and "pw" not in line


def test_a_host_that_resolves_nowhere_says_so(tmp_path):
    code, lines = _serve(tmp_path / "data", "--node-id", "a",
                         "--cluster-dsn", "postgresql://rankd@db.rankd-test.invalid/ranks")
    assert code == 1
    assert len(lines) == 1, lines
    assert "database 'ranks' on db.rankd-test.invalid:5432 (--cluster-dsn)" in lines[0]
    assert "does not resolve" in lines[0] and "listen" not in lines[0]


def test_a_missing_database_is_one_line_saying_to_create_it(tmp_path, pg_server):
    base, _, _ = pg_server.admin_dsn.rpartition("/")
    code, lines = _serve(tmp_path / "data", "--node-id", "a",
                         "--cluster-dsn", f"{base}/rankd_never_created")
    assert code == 1
    assert len(lines) == 1, lines
    assert "database 'rankd_never_created'" in lines[0]
    assert "does not exist; create it first: createdb" in lines[0]


@pytest.mark.parametrize(("flag", "listener"), [("--port", "HTTP"), ("--tcp-port", "TCP"),
                                                ("--resp-port", "RESP")])
def test_a_port_clash_names_the_listener_and_its_flag(tmp_path, flag, listener):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, lines = _serve(tmp_path / "data", flag, str(port))
    assert code == 1
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"rankd: cannot listen for {listener} on 127.0.0.1:{port} "
                               f"({flag}):"), lines[0]
    assert f"give {flag} another port" in lines[0]
