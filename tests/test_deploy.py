"""The deployment files (deploy/): the example config is current and starts
the daemon, the systemd unit keeps its hardening and runs a command line
`rankd serve` accepts, and every metric the Grafana dashboard queries is
one a running daemon exposes."""

from __future__ import annotations

import argparse
import json
import re
import shlex
import tomllib
import urllib.request
from pathlib import Path

from daemon import Daemon
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
