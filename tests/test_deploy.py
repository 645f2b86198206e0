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
    """The unit's settings, a line ending in a backslash continued on the next."""
    settings: dict[str, list[str]] = {}
    text = re.sub(r"\\\n\s*", " ", (DEPLOY / "rankd.service").read_text())
    for line in text.splitlines():
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


def test_the_systemd_unit_caps_memory_and_hands_secrets_over_as_credentials():
    """The unit had no memory cap and the secrets were meant for the config
    file, which is readable; its comment said ``pip install rankd``,
    although rankd is not published."""
    unit = _unit()
    assert re.fullmatch(r"\d+[KMGT]", unit["MemoryMax"][0]), unit.get("MemoryMax")
    assert unit.get("MemorySwapMax") == ["0"]
    credentials = dict(entry.split(":", 1) for entry in unit["LoadCredential"])
    assert credentials == {"jwt-secret": "/etc/rankd/credentials/jwt-secret"}
    command = shlex.split(unit["ExecStart"][0])
    assert command[command.index("--jwt-secret-file") + 1] == "%d/jwt-secret"
    header = (DEPLOY / "rankd.service").read_text().split("[Unit]")[0]
    assert "pip install rankd" not in header
    assert "deploy/install.sh install" in header and "deploy/install.sh wheels" in header


def test_the_units_command_line_reads_the_jwt_secret_from_the_credentials_dir(tmp_path):
    """The unit's ExecStart, with ``%d`` (systemd's credentials directory)
    a directory holding the secret and the shipped example config: rankd
    reads the secret from there and requires a token signed with it."""
    import jwt

    secret = "credential-secret-" + "k" * 24
    credentials = tmp_path / "credentials"
    credentials.mkdir(mode=0o700)
    (credentials / "jwt-secret").write_text(secret + "\n")
    command = [part.replace("%d", str(credentials)) for part in
               shlex.split(_unit()["ExecStart"][0])[2:]]
    command[command.index("--config") + 1] = str(DEPLOY / "rankd.toml")
    with Daemon(tmp_path / "data", *command) as running:
        assert running.request("GET", "/v1/boards")[0] == 401
        token = jwt.encode({"sub": "ops", "scope": "read", "exp": int(time.time()) + 60},
                           secret, algorithm="HS256")
        status, _ = running.request("GET", "/v1/boards",
                                    headers={"Authorization": f"Bearer {token}"})
        assert status == 200


def test_compose_publishes_on_loopback_and_passes_secrets_as_files():
    """compose.yaml published all three ports on every interface and passed
    the JWT secret and the Postgres password in the environment."""
    import yaml

    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    declared = compose["secrets"]
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), (name, port)
        environment = service.get("environment", {})
        for key, value in environment.items():
            value = str(value)
            assert not re.search(r"SECRET$|PASSWORD$", key), (name, key)
            assert not re.search(r"://[^/@]*:[^/@]*@", value), (name, key)  # user:password@
            for path in re.findall(r"/run/secrets/(\w+)", value):
                assert path in declared and path in service["secrets"], (name, key, path)
    rankd = compose["services"]["rankd"]
    assert rankd["environment"]["RANKD_JWT_SECRET_FILE"] == "/run/secrets/jwt_secret"
    assert "passfile=/run/secrets/pgpass" in rankd["environment"]["RANKD_POSTGRES_DSN"]
    assert compose["services"]["postgres"]["environment"]["POSTGRES_PASSWORD_FILE"] == \
        "/run/secrets/postgres_password"
    for secret in declared.values():
        assert secret["file"].startswith("./secrets/")
    ignored = (DEPLOY.parent / ".dockerignore").read_text().split()
    assert "deploy/secrets" in ignored  # never in an image's build context
    assert (DEPLOY / "secrets" / ".gitignore").read_text().splitlines()[1:] == ["*",
                                                                                "!.gitignore"]


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
