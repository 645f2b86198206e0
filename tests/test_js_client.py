"""The JavaScript client (clients/js): its own tests under Node's test runner
(they start real daemons of this rankd), its TypeScript types compiled
against a usage file, and its generated API types current.

Needs ``node`` and ``npm ci`` in clients/js (TypeScript); skipped without
them, except under ``RANKD_REQUIRE_CLIENTS=1`` (CI), where that fails.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from daemon import SRC
from rankd.frontends.openapi import openapi_document
from rankd.frontends.openapi_typescript import typescript

CLIENT = Path(__file__).resolve().parent.parent / "clients" / "js"
REQUIRED = os.environ.get("RANKD_REQUIRE_CLIENTS", "") not in ("", "0")


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        reason = "node is not installed"
        if REQUIRED:
            pytest.fail(f"{reason} (RANKD_REQUIRE_CLIENTS is set)")
        pytest.skip(reason)
    return node


def _websocket_flag(node: str) -> list[str]:
    """Node < 22 has WebSocket behind a flag; Node >= 22 has it anyway."""
    probe = subprocess.run([node, "--experimental-websocket", "-e", "WebSocket"],
                           capture_output=True, timeout=30)
    return ["--experimental-websocket"] if probe.returncode == 0 else []


def test_the_generated_api_types_are_current():
    committed = (CLIENT / "src" / "api.d.ts").read_text()
    assert committed == typescript(openapi_document()), \
        "clients/js/src/api.d.ts is stale: python -m rankd.docs"


def test_the_client_passes_its_tests_against_real_daemons():
    node = _node()
    flag = _websocket_flag(node)
    native = subprocess.run([node, "-e", "process.exit(typeof WebSocket === 'function' ? 0 : 1)"],
                            timeout=30).returncode == 0
    if REQUIRED and not (flag or native):
        pytest.fail("this node has no WebSocket: the client's WebSocket tests cannot run")
    env = {**os.environ, "RANKD_PYTHON": sys.executable, "PYTHONPATH": str(SRC)}
    done = subprocess.run([node, *flag, "--test", "--test-reporter=tap", "test/"], cwd=CLIENT,
                          env=env, capture_output=True, text=True, timeout=600)
    report = done.stdout + done.stderr
    assert done.returncode == 0, report[-6000:]
    passed = re.search(r"^# pass (\d+)", report, re.M)
    skipped = re.search(r"^# skipped (\d+)", report, re.M)
    assert passed and int(passed.group(1)) >= 20, report[-3000:]
    if flag or REQUIRED:
        assert skipped and skipped.group(1) == "0", report[-3000:]


@pytest.mark.npm("clients/js")
def test_the_typescript_types_compile_against_a_usage_file():
    _node()
    tsc = CLIENT / "node_modules" / ".bin" / "tsc"
    if not tsc.exists():
        reason = "TypeScript is not installed: run `npm ci` in clients/js"
        if REQUIRED:
            pytest.fail(reason)
        pytest.skip(reason)
    done = subprocess.run([str(tsc), "-p", "test/tsconfig.json"], cwd=CLIENT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
