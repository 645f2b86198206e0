"""The daemon as a whole: settings, start-up, the data-dir lock, graceful
shutdown, hostile bytes, and a crash test under REST and TCP load."""

from __future__ import annotations

import json
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from crash_load import kill_under_load, submit_over_rest, submit_over_tcp
from daemon import SRC, Daemon
from rankd.cli import build_parser
from rankd.client import Client, RankdError
from rankd.config import ConfigError, resolve


def settings(argv, environ=None):
    return resolve(build_parser().parse_args(["serve", *argv]), environ or {})


def test_settings_come_from_flags_then_env_then_file_then_defaults(tmp_path):
    defaults = settings([])
    assert (defaults.host, defaults.port, defaults.tcp_port, defaults.fsync) == (
        "127.0.0.1", 7700, 7701, "everysec")
    assert str(defaults.data_dir) == "rankd-data" and defaults.postgres_dsn is None
    config = tmp_path / "rankd.toml"
    config.write_text('port = 9000\nfsync = "always"\ntcp_port = 9001\n')
    from_file = settings(["--config", str(config)])
    assert (from_file.port, from_file.fsync, from_file.tcp_port) == (9000, "always", 9001)
    from_env = settings(["--config", str(config)], {"RANKD_PORT": "9100"})
    assert from_env.port == 9100 and from_env.fsync == "always"
    from_flag = settings(["--config", str(config), "--port", "9200"], {"RANKD_PORT": "9100"})
    assert from_flag.port == 9200


@pytest.mark.parametrize("argv, environ, message", [
    (["--port", "http"], {}, "--port: expected int"),
    ([], {"RANKD_FSYNC": "sometimes"}, "RANKD_FSYNC: must be one of"),
    ([], {"RANKD_PORT": "-1"}, "must not be negative"),
])
def test_bad_settings_are_refused_with_where_they_came_from(argv, environ, message):
    with pytest.raises(ConfigError, match=message):
        settings(argv, environ)


def test_unknown_setting_in_the_config_file_is_refused(tmp_path):
    config = tmp_path / "rankd.toml"
    config.write_text("prot = 1\n")
    with pytest.raises(ConfigError, match="unknown setting"):
        settings(["--config", str(config)])


def test_help_documents_every_option():
    result = subprocess.run([sys.executable, "-m", "rankd.cli", "serve", "--help"],
                            capture_output=True, text=True, env={"PYTHONPATH": str(SRC)})
    for flag in ("--host", "--port", "--tcp-port", "--data-dir", "--fsync", "--postgres-dsn",
                 "--config", "RANKD_FSYNC"):
        assert flag in result.stdout


def test_startup_summary_second_daemon_refused_and_graceful_stop(tmp_path):
    data_dir = tmp_path / "data"
    with Daemon(data_dir) as first:
        first.request("PUT", "/v1/boards/b", {"policy": "sum"})
        first.request("POST", "/v1/boards/b/scores", {"member": "ann", "delta": 2})
        summary = first.log()
        assert "serving: index=native" in summary or "serving: index=python" in summary
        for part in ("fsync=everysec", f"tcp=127.0.0.1:{first.tcp_port}", "postgres=off",
                     str(data_dir)):
            assert part in summary
        second = subprocess.run(
            [sys.executable, "-m", "rankd.cli", "serve", "--data-dir", str(data_dir),
             "--port", "0", "--tcp-port", "0", "--resp-port", "0"],
            capture_output=True, text=True, env={"PYTHONPATH": str(SRC)}, timeout=60)
        assert second.returncode == 1
        assert "in use" in second.stderr
        assert first.stop(signal.SIGTERM) == 0
    assert "snapshot @" in first.log() and "stopped cleanly" in first.log()
    # stderr is a file here, so the default log format is one JSON object per line
    entries = [json.loads(line) for line in first.log().splitlines() if line.strip()]
    assert {"ts", "level", "logger", "message"} <= set(entries[0])
    assert any(entry["message"].startswith("rankd ") and "serving:" in entry["message"]
               for entry in entries)
    with Daemon(data_dir, "--log-format", "text") as again:
        status, standing = again.request("GET", "/v1/boards/b/members/ann")
        assert status == 200 and standing["score"] == 2.0
    assert re.search(r"^\S+ \S+ INFO rankd: rankd \S+ serving:", again.log(), re.MULTILINE)


def test_sigterm_finishes_in_flight_requests(tmp_path):
    with Daemon(tmp_path / "data") as daemon:
        daemon.request("PUT", "/v1/boards/b", {"policy": "sum"})
        client = Client("127.0.0.1", daemon.tcp_port)
        acknowledged = []
        errors = []

        def load():
            try:
                for i in range(100_000):
                    acknowledged.append(client.submit("b", f"m{i % 10}", delta=1,
                                                      event_id=f"e{i}"))
            except RankdError as exc:
                errors.append(exc)

        worker = threading.Thread(target=load)
        worker.start()
        time.sleep(0.5)
        assert daemon.stop(signal.SIGTERM) == 0
        worker.join(60)
        client.close()
    assert acknowledged and errors  # the load was cut by the shutdown, not by a crash
    with Daemon(tmp_path / "data") as daemon:
        status, page = daemon.request("GET", "/v1/boards/b/top?limit=10")
    assert status == 200
    assert sum(e["score"] for e in page["entries"]) >= len(acknowledged)


def test_hostile_bytes_do_not_take_the_daemon_down(tmp_path):
    rng = random.Random(3)
    with Daemon(tmp_path / "data") as daemon:
        for port in (daemon.port, daemon.tcp_port):
            for _ in range(30):
                with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                    try:
                        sock.sendall(rng.randbytes(rng.randint(1, 4096)))
                        sock.settimeout(0.5)
                        sock.recv(4096)
                    except OSError:
                        pass
        status, _ = daemon.request("GET", "/v1/health")
        assert status == 200
        status, body = daemon.request("POST", "/v1/boards/x/scores", raw=b"\xff\xfe{")
        assert status == 400 and body["error"]["code"] == "bad_request"
        assert daemon.process.poll() is None


@pytest.mark.slow
def test_sigkill_under_rest_and_tcp_load_never_loses_an_acknowledged_submission(tmp_path):
    data_dir = tmp_path / "data"
    acked: set[str] = set()
    rng = random.Random(11)
    for cycle in range(10):
        daemon = Daemon(data_dir, "--fsync", rng.choice(["everysec", "always"])).start()
        daemon.request("PUT", "/v1/boards/crash", {"policy": "sum"})
        stop = threading.Event()
        lock = threading.Lock()

        threads = [threading.Thread(target=submit_over_rest, args=(daemon, stop, acked, lock),
                                    kwargs={"prefix": f"r{cycle}-{w}"}) for w in range(4)]
        tcp = (daemon.tcp_port, stop, acked, lock)
        threads += [threading.Thread(target=submit_over_tcp, args=tcp, kwargs={
            "member": f"t{cycle}-{w}", "event": f"t{cycle}-{w}", "batch": 20}) for w in range(4)]
        kill_under_load(daemon, threads, stop, rng.uniform(0.3, 1.0))

    with Daemon(data_dir) as daemon:
        status, info = daemon.request("GET", "/v1/boards/crash")
        assert status == 200
        members = info["members"]["all"]
        with Client("127.0.0.1", daemon.tcp_port) as client:
            sample = sorted(acked)
            ranks = {}
            for start in range(0, len(sample), 1000):
                chunk = sample[start:start + 1000]
                found = client.ranks("crash", chunk)
                ranks.update({e["member"]: e["score"] for e in found["entries"]})
    assert len(acked) > 500
    missing = [event for event in acked if event not in ranks]
    doubled = [event for event, score in ranks.items() if score != 1.0]
    assert missing == [], f"{len(missing)} acknowledged submissions lost"
    assert doubled == [], f"{len(doubled)} submissions applied twice"
    assert members >= len(acked)
    assert json.dumps(info)  # the board info survived intact


def test_ready_only_once_every_listener_accepts(tmp_path):
    """/v1/ready once said 200 before the TCP port was bound (and a busy TCP
    port then stopped the daemon): ready means every listener accepts."""
    import os
    import urllib.error
    import urllib.request

    from daemon import SRC, Daemon, free_port

    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = free_port()
    command = [sys.executable, "-m", "rankd.cli", "serve", "--host", "127.0.0.1", "--port",
               str(port), "--tcp-port", str(busy.getsockname()[1]), "--resp-port", "0",
               "--data-dir",
               str(tmp_path / "data")]
    process = subprocess.Popen(command, env={**os.environ, "PYTHONPATH": str(SRC)},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    answers = []
    try:
        while process.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/ready",
                                            timeout=5) as response:
                    answers.append(response.status)
            except urllib.error.HTTPError as error:
                answers.append(error.code)
            except OSError:
                pass
        _, stderr = process.communicate(timeout=30)
    finally:
        busy.close()
        if process.poll() is None:
            process.kill()
    assert 200 not in answers
    assert process.returncode == 1
    assert "rankd: cannot listen for TCP on 127.0.0.1" in stderr and "--tcp-port" in stderr
    assert "Traceback" not in stderr
    with Daemon(tmp_path / "data") as running:
        # Health answers once the engine recovered; ready once every listener is up too.
        deadline = time.monotonic() + 10
        while (status := running.request("GET", "/v1/ready")[0]) != 200 \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        status, ready = running.request("GET", "/v1/ready")
        assert status == 200 and ready["checks"]["listening"] is True
        with socket.create_connection(("127.0.0.1", running.tcp_port), timeout=5):
            pass


def test_data_files_are_private_to_the_daemon_user(tmp_path):
    """They were world-readable (0644/0755): scores, event ids, labels."""
    import os
    import stat

    from daemon import Daemon

    with Daemon(tmp_path / "data", "--segment-bytes", "4096") as daemon:
        daemon.request("PUT", "/v1/boards/b", {"policy": "sum", "windows": ["all", "daily"]})
        daemon.request("POST", "/v1/boards/b/scores/batch", {"events": [
            {"member": f"m{i}", "delta": 1, "event_id": f"e{i}"} for i in range(200)]})
        assert daemon.request("POST", "/v1/admin/snapshot")[0] == 200
    paths = [tmp_path / "data", *(tmp_path / "data").rglob("*")]
    assert len(paths) > 5
    for path in paths:
        mode = stat.S_IMODE(os.stat(path).st_mode)
        assert mode & 0o077 == 0, (path, oct(mode))


def test_the_daemon_under_test_says_what_it_runs(tmp_path):
    """A benchmark once measured the pure-Python fallback without a word."""
    from conftest import native_required
    from daemon import Daemon

    with Daemon(tmp_path / "data") as daemon:
        parts = daemon.implementations()
        assert set(parts) == {"index", "ingest", "wal_frames", "dedupe", "replay", "tcp_scanner",
                              "resp_scanner", "resp_reads", "lanes", "intake",
                              "rest_ingest", "rest_reads"}
        if native_required():
            assert set(parts.values()) == {"native"}, parts
        assert daemon.wait_for_log("serving:")
        assert all(f"{part}={kind}" in daemon.log() for part, kind in parts.items())
    with Daemon(tmp_path / "data", env={"RANKD_PURE_PYTHON": "1"}) as daemon:
        assert set(daemon.implementations().values()) == {"python"}


def test_a_damaged_data_dir_stops_the_start_in_one_line(tmp_path):
    """It once printed a 40-line traceback."""
    import os

    from daemon import SRC, Daemon

    with Daemon(tmp_path / "data") as daemon:
        daemon.request("PUT", "/v1/boards/b", {"policy": "sum"})
        daemon.request("POST", "/v1/boards/b/scores/batch", {"events": [
            {"member": f"m{i}", "delta": 1} for i in range(50)]})
    (segment,) = (tmp_path / "data" / "wal").glob("*.log")
    data = bytearray(segment.read_bytes())
    data[100] ^= 0xFF
    segment.write_bytes(bytes(data))
    done = subprocess.run([sys.executable, "-m", "rankd.cli", "serve", "--port", "0",
                           "--tcp-port", "0", "--resp-port", "0", "--data-dir",
                           str(tmp_path / "data")],
                          env={**os.environ, "PYTHONPATH": str(SRC)}, capture_output=True,
                          text=True, timeout=60)
    lines = [line for line in done.stderr.splitlines() if line.startswith("rankd:")]
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert len(lines) == 1 and segment.name in lines[0] and "byte offset" in lines[0]
    assert "--repair" in lines[0]


def test_insecure_no_auth_says_plainly_what_it_opens(tmp_path):
    from daemon import Daemon

    with Daemon(tmp_path / "data", "--insecure-no-auth") as daemon:
        assert daemon.wait_for_log("any web page a user of this network opens, can read and "
                                   "write")
