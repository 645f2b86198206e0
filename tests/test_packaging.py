"""Installing rankd on a machine without a C compiler: the native modules
are left out with a warning and the pure-Python fallback runs, as the
README says; ``RANKD_REQUIRE_NATIVE=1`` makes that an error (CI sets it).
Builds real wheels through pip (an isolated build, as a user's ``pip
install`` does)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build_wheel(out: Path, **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "CC": "/bin/false", **env}
    environment.pop("RANKD_REQUIRE_NATIVE", None)
    environment.update(env)
    return subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w",
                           str(out), str(ROOT)], env=environment, capture_output=True,
                          text=True, timeout=600)


def test_without_a_compiler_rankd_installs_and_runs_the_fallback(tmp_path):
    built = build_wheel(tmp_path / "wheels")
    assert built.returncode == 0, built.stderr[-2000:]
    assert "cannot build" in built.stdout + built.stderr
    (wheel,) = (tmp_path / "wheels").glob("rankd-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "rankd/index/_fallback.py" in names
    assert not [name for name in names if name.endswith(".so")]
    # The page's copy of the JavaScript client is the client (a link in the sources).
    client = Path(__file__).resolve().parent.parent / "clients" / "js" / "src" / "index.js"
    assert zipfile.ZipFile(wheel).read("rankd/frontends/static/rankd.js") == client.read_bytes()
    target = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(target)
    ran = subprocess.run(
        [sys.executable, "-c", "import rankd._native as n; print(n.implementations())"],
        env={**os.environ, "PYTHONPATH": str(target)}, capture_output=True, text=True,
        timeout=60, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert "'index': 'python'" in ran.stdout and "native" not in ran.stdout


def test_require_native_turns_a_failed_build_into_an_error(tmp_path):
    built = build_wheel(tmp_path / "wheels", RANKD_REQUIRE_NATIVE="1")
    assert built.returncode != 0
    assert not list((tmp_path / "wheels").glob("*.whl"))
