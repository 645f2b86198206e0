"""Fixtures shared by the tests, and the way they load native extensions.

``index_cls`` runs a test once per implementation of the rank index: the
pure-Python fallback ("python") and the Cython skip list ("native").  When the
extension is not built the "native" runs are skipped, unless
``RANKD_REQUIRE_NATIVE=1`` (CI sets it): then they fail, so a broken build
cannot pass CI by silently testing only the fallback.

Tests marked ``npm("clients/js")`` (TypeScript, axe-core) or
``npm("tests/clients/node")`` (ioredis) get those JavaScript packages
installed by the session from the committed lockfiles (``npm_deps``).
"""

from __future__ import annotations

import contextlib
import importlib
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from rankd._native import pure_python_forced

settings.register_profile(
    "default",
    deadline=None,
    print_blob=True,
    derandomize=False,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "ci",
    parent=settings.get_profile("default"),
    # CI machines are slow and shared: no deadline, and keep the run bounded.
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


def native_required() -> bool:
    return os.environ.get("RANKD_REQUIRE_NATIVE", "") == "1"


def native(module: str, name: str) -> Any:
    """``name`` from the native extension ``module``; the test is skipped when
    it was not built, and fails instead under ``RANKD_REQUIRE_NATIVE=1``.
    Skipped too under ``RANKD_PURE_PYTHON=1``, where the engine and the
    front-ends use none of them."""
    if pure_python_forced():
        pytest.skip("RANKD_PURE_PYTHON=1: the native modules are not used")
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as exc:
        message = f"native {module} cannot be imported: {exc}"
        if native_required():
            pytest.fail(f"RANKD_REQUIRE_NATIVE=1 but {message}", pytrace=False)
        pytest.skip(message)


def load_implementation(name: str) -> type:
    """The ``RankIndex`` class of one implementation, or skip/fail the test."""
    if name == "python":
        from rankd.index._fallback import RankIndex

        return RankIndex
    if name == "pages":
        return native("rankd._pages", "RankIndex")
    return native("rankd._skiplist", "RankIndex")


@pytest.fixture(scope="session", params=["python", "native", "pages"])
def index_cls(request: pytest.FixtureRequest) -> type:
    """Each implementation of ``RankIndex`` in turn (``pages``: the compact
    paged layout of ``rankd._pages``)."""
    return load_implementation(request.param)


@pytest.fixture(scope="session")
def python_cls() -> type:
    return load_implementation("python")


@pytest.fixture(scope="session")
def native_cls() -> type:
    return load_implementation("native")


@pytest.fixture(scope="module")
def same_event_id_keys() -> Any:
    """Dedupe tables made meanwhile all take one fingerprint key (in both
    stores), so that tests comparing two boards' state side by side (native
    against reference) compare the same fingerprints; random keys again after."""
    from rankd.engine import idstore

    modules: list[Any] = [idstore]
    with contextlib.suppress(ImportError):  # (not built: the pure store only)
        modules.append(importlib.import_module("rankd.engine._idstore"))
    for module in modules:
        module._set_test_key(bytes(range(16)))
    yield
    for module in modules:
        module._set_test_key(None)


ROOT = Path(__file__).resolve().parent.parent
#: Each JavaScript project's ``npm ci`` outcome this session: None once installed.
_npm_installed: dict[Path, str | None] = {}


#: Parallel test workers at most (``-n auto``): each cluster test runs several
#: daemons and a Postgres, and timing checks need some CPU left to them.
MAX_WORKERS = 4


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker more than cores (most tests wait on I/O), at
    most :data:`MAX_WORKERS`."""
    return min(MAX_WORKERS, (os.cpu_count() or 1) + 1)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "npm(project, required=ENV): the test uses the JavaScript packages of "
                   "PROJECT (a path from the repository root); the session installs them "
                   "with `npm ci` first when missing or stale, and the test skips when that "
                   "cannot be done, or fails when the environment variable ENV is set")


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Install the JavaScript packages an ``npm``-marked test needs (once)."""
    from npm_deps import install

    for marker in item.iter_markers("npm"):
        project = ROOT / marker.args[0]
        if project not in _npm_installed:
            _npm_installed[project] = install(project)
        reason = _npm_installed[project]
        if reason is None:
            continue
        required = marker.kwargs.get("required", "RANKD_REQUIRE_CLIENTS")
        if os.environ.get(required, "") not in ("", "0"):
            pytest.fail(f"{reason} ({required} is set)", pytrace=False)
        pytest.skip(reason)


def pytest_report_header(config: pytest.Config) -> str:
    try:
        import rankd._skiplist  # noqa: F401
    except ImportError as exc:
        state = f"NOT importable ({exc})"
    else:
        state = "importable"
    return f"rankd native index: {state}; RANKD_REQUIRE_NATIVE={int(native_required())}"


@pytest.fixture(scope="session")
def pg_server():
    """A Postgres server for the session (throwaway cluster or RANKD_TEST_POSTGRES_DSN)."""
    from pgcluster import start_server

    server = start_server()
    yield server
    if server.cluster is not None:
        server.cluster.destroy()


@pytest.fixture
def pg_dsn(pg_server) -> str:
    """DSN of a fresh, empty database."""
    return pg_server.create_database()


@pytest.fixture
def pg_cluster():
    """A private cluster this test may stop and start."""
    from pgcluster import Cluster, _bin_dir, unavailable

    bin_dir = _bin_dir()
    if bin_dir is None:
        unavailable("no PostgreSQL server binaries (initdb) to run a private cluster")
    cluster = Cluster(bin_dir)
    cluster.init()
    cluster.start()
    yield cluster
    cluster.destroy()
