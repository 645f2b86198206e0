"""The JavaScript packages some tests use (TypeScript and axe-core in
clients/js, ioredis in tests/clients/node), installed by the test session
itself from the committed lockfiles, so that README's one test command
passes on a fresh machine wherever Node is.

``npm ci`` runs in a project when its ``node_modules`` is missing or no
longer matches ``package-lock.json`` (npm's own record of what it installed,
``node_modules/.package-lock.json``, differs from the lockfile), at most
once per session, under a file lock so that parallel test runs on one
checkout do not install over each other.  It prefers npm's cache to the
registry.  What cannot be installed (no node or npm, no registry) is given
back as a reason, for the test to skip with.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

NPM_TIMEOUT_SECONDS = 300
#: Per fetch: an unreachable registry fails in about a minute, not npm's five.
NPM_FLAGS = ["--no-audit", "--no-fund", "--loglevel=error", "--prefer-offline",
             "--fetch-timeout=30000", "--fetch-retries=1"]


def _packages(lockfile: Path) -> dict | None:
    try:
        packages = json.loads(lockfile.read_text())["packages"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return {name: entry for name, entry in packages.items() if name}  # "" is the project


def is_current(project: Path) -> bool:
    """Whether ``project/node_modules`` holds what the lockfile pins."""
    installed = _packages(project / "node_modules" / ".package-lock.json")
    return installed is not None and installed == _packages(project / "package-lock.json")


@contextlib.contextmanager
def _locked(project: Path) -> Iterator[None]:
    """One installer at a time per checkout's project, across processes."""
    key = hashlib.sha256(str(project.resolve()).encode()).hexdigest()[:16]
    with open(Path(tempfile.gettempdir()) / f"rankd-npm-ci-{key}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def install(project: Path, npm: str | None = None) -> str | None:
    """``npm ci`` in ``project`` unless its packages are current; ``None``
    once they are, else why they cannot be (a reason to skip with)."""
    if shutil.which("node") is None:
        return f"node is not installed: the JavaScript packages of {project.name} are needed"
    npm = npm or shutil.which("npm")
    if npm is None:
        return f"npm is not installed: cannot run `npm ci` in {project}"
    with _locked(project):
        if is_current(project):  # now, or installed by another run while we waited
            return None
        try:
            done = subprocess.run([npm, "ci", *NPM_FLAGS], cwd=project, capture_output=True,
                                  text=True, timeout=NPM_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            return f"`npm ci` in {project} took over {NPM_TIMEOUT_SECONDS}s (no registry?)"
        if done.returncode != 0 or not is_current(project):
            tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
            return f"`npm ci` in {project} failed (exit {done.returncode}): {tail[-400:]}"
    return None
