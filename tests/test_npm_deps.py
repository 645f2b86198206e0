"""The test session installs the JavaScript packages its tests use
(tests/npm_deps.py): README's test command failed on a fresh machine with
"axe-core is not installed: run npm ci", because only .ci/run ran it.

Most of these drive a stand-in ``npm`` (a script that installs by copying
the lockfile as npm records it, and counts its runs), so they need no
registry; one runs the real ``npm ci`` (from npm's cache when it has the
packages) and one a whole pytest session without node."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from npm_deps import install, is_current

ROOT = Path(__file__).resolve().parent.parent
NODE_PROJECT = ROOT / "tests" / "clients" / "node"

FAKE_NPM = """#!/bin/sh
# Stands in for `npm ci`: records the run, then installs what the lockfile pins.
echo run >> "$(dirname "$0")/runs"
sleep 0.3
[ -f fail ] && { echo "npm ERR! network unreachable" >&2; exit 1; }
rm -rf node_modules && mkdir node_modules && cp package-lock.json node_modules/.package-lock.json
"""


def _project(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    for name in ("package.json", "package-lock.json"):
        shutil.copy(NODE_PROJECT / name, project / name)
    return project


def _fake_npm(tmp_path: Path) -> tuple[str, Path]:
    npm = tmp_path / "bin" / "npm"
    npm.parent.mkdir()
    npm.write_text(FAKE_NPM)
    npm.chmod(0o755)
    return str(npm), tmp_path / "bin" / "runs"


def _runs(log: Path) -> int:
    return len(log.read_text().split()) if log.exists() else 0


def _needs_node() -> None:
    if shutil.which("node") is None:
        pytest.skip("node is not installed")


def test_missing_or_stale_packages_are_installed_once_and_current_ones_left(tmp_path):
    _needs_node()
    project = _project(tmp_path)
    npm, runs = _fake_npm(tmp_path)
    assert not is_current(project)
    assert install(project, npm) is None and _runs(runs) == 1
    assert is_current(project)
    assert install(project, npm) is None and _runs(runs) == 1  # current: left alone
    lock = project / "package-lock.json"
    pinned = json.loads(lock.read_text())
    pinned["packages"]["node_modules/ioredis"]["version"] += "-next"
    lock.write_text(json.dumps(pinned))
    assert not is_current(project)  # the lockfile moved on: stale
    assert install(project, npm) is None and _runs(runs) == 2


def test_parallel_sessions_install_one_at_a_time(tmp_path):
    _needs_node()
    project = _project(tmp_path)
    npm, runs = _fake_npm(tmp_path)
    results: list[str | None] = []
    threads = [threading.Thread(target=lambda: results.append(install(project, npm)))
               for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert results == [None, None, None]
    assert _runs(runs) == 1  # the others found the packages current once they had the lock


def test_what_cannot_be_installed_is_a_reason_not_an_error(tmp_path, monkeypatch):
    _needs_node()
    project = _project(tmp_path)
    npm, _ = _fake_npm(tmp_path)
    (project / "fail").touch()
    reason = install(project, npm)
    assert reason is not None and "`npm ci`" in reason and "network unreachable" in reason
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    assert install(project).startswith("node is not installed")


def test_the_real_npm_ci_installs_from_the_lockfile(tmp_path):
    _needs_node()
    project = _project(tmp_path)
    reason = install(project)
    if reason is not None:
        if os.environ.get("RANKD_REQUIRE_CLIENTS", "") not in ("", "0"):
            pytest.fail(reason)
        pytest.skip(reason)
    assert (project / "node_modules" / "ioredis" / "package.json").exists()
    assert is_current(project)


def test_a_session_without_node_skips_the_tests_that_need_it(tmp_path):
    """The whole pytest session, with no node on the PATH: the tests that
    need JavaScript packages skip with the reason, none fails."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("RANKD_REQUIRE_")}
    env["PATH"] = str(Path(sys.executable).parent)  # python, but no node or npm
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
         "tests/test_resp_clients.py::test_ioredis",
         "tests/test_js_client.py::test_the_typescript_types_compile_against_a_usage_file"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "2 skipped" in done.stdout and "node is not installed" in done.stdout, done.stdout


def test_a_fresh_checkout_session_installs_typescript_and_compiles_the_types(tmp_path):
    """README's test command on a fresh checkout (no node_modules): the
    session runs ``npm ci`` in clients/js, and the TypeScript test passes
    instead of skipping (or, for axe-core, failing) for want of it."""
    _needs_node()
    checkout = tmp_path / "checkout"
    ignore = shutil.ignore_patterns("node_modules", "__pycache__", ".hypothesis")
    for part in ("tests", "clients"):
        shutil.copytree(ROOT / part, checkout / part, ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", checkout)
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("RANKD_REQUIRE_")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
         "tests/test_js_client.py::test_the_typescript_types_compile_against_a_usage_file"],
        cwd=checkout, env=env, capture_output=True, text=True, timeout=400)
    if "npm ci` in" in done.stdout and "skipped" in done.stdout:
        pytest.skip(f"no registry or cache to install from: {done.stdout[-500:]}")
    assert "1 passed" in done.stdout, done.stdout[-3000:]
    assert is_current(checkout / "clients" / "js")
