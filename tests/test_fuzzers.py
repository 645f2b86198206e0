"""The coverage-guided fuzzers (fuzz/, atheris) run a bounded number of
inputs per target, and every seed and regression case in fuzz/corpus is
replayed.  A failing input is saved under fuzz/corpus/<target>/regressions/
so that the replay keeps it from coming back."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fuzz.targets import TARGETS  # noqa: E402

#: Inputs per target in CI (a few seconds each), and the time cap.
RUNS = {"resp": 3000, "tcp": 10000, "wal": 20000, "live": 10000, "rest": 10000,
        "relay": 10000}
SECONDS = 20


def atheris_or_skip() -> None:
    try:
        import atheris  # noqa: F401
    except ImportError:
        if os.environ.get("RANKD_REQUIRE_FUZZ"):
            raise
        pytest.skip("atheris is not installed (pip install -e '.[fuzz]'); it has wheels "
                    "for CPython on Linux and macOS only")


def test_every_corpus_input_replays_without_failing():
    result = subprocess.run([sys.executable, "-m", "fuzz", "replay"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    for name in TARGETS:
        assert f"{name}: replayed" in result.stdout


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_fuzz_target_runs_clean(name, tmp_path):
    atheris_or_skip()
    artifacts = tmp_path / "artifacts"
    command = [sys.executable, "-m", "fuzz", "run", name, "--runs", str(RUNS[name]),
               "--seconds", str(SECONDS), "--work", str(tmp_path / "corpus"),
               "--artifacts", str(artifacts)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                            timeout=SECONDS + 60)
    found = sorted(artifacts.glob("*")) if artifacts.exists() else []
    kept = ROOT / "fuzz" / "corpus" / name / "regressions"
    for path in found:  # kept as regression cases, replayed from now on
        shutil.copy(path, kept / path.name)
    assert result.returncode == 0 and not found, (
        f"fuzz target {name} failed; inputs saved as {[p.name for p in found]} in {kept}:\n"
        + result.stderr[-4000:])
    assert "Done" in result.stderr
