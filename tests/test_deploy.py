"""The deployment files (deploy/): the example config is current and starts
the daemon, the systemd unit keeps its hardening and runs a command line
`rankd serve` accepts, and every metric the Grafana dashboard queries is
one a running daemon exposes."""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

import pytest

from daemon import Daemon, free_port
from rankd.config import OPTIONS, add_arguments
from rankd.docs import render_example_config

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


def test_the_example_config_is_current_and_names_every_setting():
    text = (DEPLOY / "rankd.toml").read_text()
    assert text == render_example_config(), "deploy/rankd.toml is stale: python -m rankd.docs"
    for option in OPTIONS:
        assert re.search(rf"^(# )?{option.name} = ", text, re.MULTILINE), option.name
    assert tomllib.loads(text) == {"data_dir": "/var/lib/rankd"}


def test_the_example_config_starts_the_daemon(tmp_path):
    """The file as shipped; the test harness's flags (a data dir and free
    ports) win over it, as flags do."""
    with Daemon(tmp_path / "data", "--config", str(DEPLOY / "rankd.toml")) as running:
        assert running.request("GET", "/v1/health")[0] == 200
        assert running.request("PUT", "/v1/boards/deployed", {})[0] == 201
    assert (tmp_path / "data" / "wal").is_dir()


def _unit() -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in (DEPLOY / "rankd.service").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "[")):
            continue
        key, _, value = line.partition("=")
        settings.setdefault(key, []).append(value)
    return settings


def test_the_systemd_unit_is_hardened_and_runs_a_valid_command_line():
    unit = _unit()
    for key, value in [("DynamicUser", "yes"), ("StateDirectory", "rankd"),
                       ("ProtectSystem", "strict"), ("ProtectHome", "yes"),
                       ("NoNewPrivileges", "yes"), ("PrivateTmp", "yes"),
                       ("PrivateDevices", "yes"), ("CapabilityBoundingSet", ""),
                       ("RestrictSUIDSGID", "yes"), ("KillSignal", "SIGTERM")]:
        assert value in unit.get(key, []), key
    command = shlex.split(unit["ExecStart"][0])
    assert command[0].endswith("/rankd") and command[1] == "serve"
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    parsed = parser.parse_args(command[2:])  # exits (fails) on a flag rankd lacks
    assert str(parsed.config) == "/etc/rankd/rankd.toml"
    assert "@system-service" in unit["SystemCallFilter"]


def test_every_metric_the_dashboard_queries_exists(tmp_path):
    dashboard = json.loads((DEPLOY / "grafana" / "rankd-dashboard.json").read_text())
    queried = {name for panel in dashboard["panels"] for target in panel["targets"]
               for name in re.findall(r"\brankd_[a-z_]+", target["expr"])}
    queried |= set(re.findall(r"\brankd_[a-z_]+",
                              json.dumps(dashboard["templating"])))
    assert len(queried) >= 20
    with Daemon(tmp_path / "data") as running:
        running.request("PUT", "/v1/boards/b", {})
        running.request("POST", "/v1/boards/b/scores", {"member": "a", "score": 1})
        with urllib.request.urlopen(running.url + "/metrics", timeout=10) as response:
            text = response.read().decode()
    # Families declared (a counter with no samples yet has only its TYPE line),
    # and the series of histograms (name_bucket...).
    exposed = set(re.findall(r"^# TYPE (rankd_[a-z_]+) ", text, re.MULTILINE))
    exposed |= set(re.findall(r"^(rankd_[a-z_]+)", text, re.MULTILINE))
    missing = sorted(name for name in queried if name not in exposed)
    assert not missing, missing


def test_the_dockerfile_builds_in_two_stages_and_runs_unprivileged():
    """No Docker daemon here: the Dockerfile is checked, and its install
    steps (deploy/install.sh) are run by the next test."""
    text = (DEPLOY / "Dockerfile").read_text()
    stages = re.findall(r"^FROM (\S+)", text, re.MULTILINE)
    assert stages == ["python:3.11-slim", "python:3.11-slim"]
    assert "install.sh wheels /wheels" in text and "install.sh install /wheels" in text
    assert "install.sh check /opt/rankd" in text
    user = re.findall(r"^USER (\S+)", text, re.MULTILINE)
    assert user and user[-1] not in ("root", "0")
    assert re.search(r"^HEALTHCHECK .*?/v1/health", text, re.MULTILINE | re.DOTALL)
    compose = (DEPLOY / "compose.yaml").read_text()
    assert "postgres:" in compose and "RANKD_POSTGRES_DSN" in compose
    assert "RANKD_JWT_SECRET: ${RANKD_JWT_SECRET:?" in compose  # no default secret


@pytest.mark.slow
def test_the_image_install_steps_build_and_run_rankd_natively(tmp_path):
    """What the image's stages do, on a clean directory: build the wheels
    (Cython compiles the native modules), install them alone into a fresh
    environment, check every hot loop is native, serve."""
    script = DEPLOY / "install.sh"
    env = {**os.environ, "PYTHON": sys.executable}
    env.pop("PYTHONPATH", None)
    for step in (["wheels", str(tmp_path / "wheels")],
                 ["install", str(tmp_path / "wheels"), str(tmp_path / "rankd")],
                 ["check", str(tmp_path / "rankd")]):
        done = subprocess.run(["sh", str(script), *step], env=env, capture_output=True,
                              text=True, timeout=900, cwd=tmp_path)
        assert done.returncode == 0, (step, done.stdout[-2000:], done.stderr[-2000:])
    port = free_port()
    process = subprocess.Popen(
        [str(tmp_path / "rankd" / "bin" / "rankd"), "serve", "--port", str(port),
         "--tcp-port", "0", "--resp-port", "0", "--data-dir", str(tmp_path / "data")],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as page:
                    assert b"<html" in page.read().lower()
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise
                time.sleep(0.1)
    finally:
        process.terminate()
        process.wait(30)
