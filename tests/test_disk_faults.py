"""The daemon under storage faults, through its public interfaces only.

Real ``rankd serve`` processes run under an LD_PRELOAD shim
(``fault_shim.c``) that records what every fsync made durable and can slow
fsync down or make fsync or write fail by path.  A load generator records
each submission's outcome (see ``faultshim``); the checker then proves from
that history that every acknowledged submission is present exactly once,
that no refused one is, and (with Postgres) that Postgres holds exactly the
same events as the node.

``RANKD_FAULT_CYCLES`` sets how many kill/power-loss cycles each variant
runs (2 by default, as in CI; the long form: ``RANKD_FAULT_CYCLES=25
python -m pytest tests/test_disk_faults.py``).  Every random choice comes
from a seed that a failure prints.
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
from pathlib import Path

import asyncpg
import pytest

from daemon import Daemon
from faultshim import History, all_scores, build_shim, check, cut_to_durable, submit_load

CYCLES = int(os.environ.get("RANKD_FAULT_CYCLES", "2"))
BOARD = "b"
#: Small segments and frequent snapshots, so kills land during rolls and
#: snapshots too.
SMALL = ("--segment-bytes", "16384", "--snapshot-every-events", "2000")


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> Path:
    return build_shim(tmp_path_factory.mktemp("shim"))


@pytest.fixture
def daemons():
    """Start daemons through this; any still running when the test ends
    (a failed assertion) is killed by its pid."""
    started: list[Daemon] = []

    def start(*args, **options) -> Daemon:
        daemon = Daemon(*args, **options)
        started.append(daemon)
        return daemon.start()

    yield start
    for daemon in started:
        if daemon.process is not None and daemon.process.poll() is None:
            daemon.kill()


def under_shim(shim: Path, fault_log: Path, **faults: str) -> dict[str, str]:
    return {"LD_PRELOAD": str(shim), "RANKD_FAULT_LOG": str(fault_log), **faults}


def make_board(daemon: Daemon) -> None:
    status, body = daemon.request("PUT", f"/v1/boards/{BOARD}", {"policy": "sum"})
    assert status in (200, 201), body


def kill_during_load(daemon: Daemon, history: History, prefix: str, rng: random.Random,
                     during=None) -> None:
    """Load the daemon, kill -9 it at a random moment of the load."""
    loader = threading.Thread(target=submit_load, args=(daemon.port, BOARD, history, prefix),
                              kwargs={"seconds": 4.0})
    loader.start()
    if during is not None:
        during(daemon)
    time.sleep(rng.uniform(0.3, 1.5))
    daemon.kill()
    loader.join()


def seeded() -> tuple[int, random.Random]:
    seed = int(os.environ.get("RANKD_FAULT_SEED", random.SystemRandom().randrange(2**32)))
    return seed, random.Random(seed)


@pytest.mark.parametrize("variant", ["exact", "less", "zeros"])
def test_power_loss_never_loses_an_acknowledged_submission(tmp_path, shim, daemons, variant):
    seed, rng = seeded()
    data_dir, fault_log, history = tmp_path / "data", tmp_path / "fsynced.log", History()
    args = ("--fsync", "always", *SMALL)
    dropped_total = 0
    for cycle in range(CYCLES):
        daemon = daemons(data_dir, *args, env=under_shim(shim, fault_log))
        if cycle == 0:
            make_board(daemon)
        kill_during_load(daemon, history, f"c{cycle}", rng)
        dropped_total += sum(cut_to_durable(data_dir, fault_log, rng, variant).values())
        # Only what no fsync covered was damaged: it starts without --repair.
        with Daemon(data_dir, *args) as restarted:
            verdict = check(all_scores(restarted, BOARD), history)
        assert verdict.ok, f"seed {seed}, cycle {cycle}: {verdict}"
    assert verdict.acknowledged > 100
    print(f"power loss ({variant}): {CYCLES} cycles, {verdict.acknowledged} acknowledged, "
          f"0 lost, 0 doubled, {dropped_total} unsynced bytes cut, seed {seed}")


def test_power_loss_with_postgres_leaves_postgres_and_the_node_agreeing(tmp_path, shim, pg_dsn,
                                                                      daemons):
    seed, rng = seeded()
    data_dir, fault_log, history = tmp_path / "data", tmp_path / "fsynced.log", History()
    # A slow disk: snapshots and shipping race the fsyncs (a snapshot once
    # got ahead of the log this way, and Postgres ahead of the disk).
    args = ("--fsync", "always", "--postgres-dsn", pg_dsn, *SMALL)
    slow = {"RANKD_FAULT_FSYNC_DELAY_MS": "15"}

    def snapshot_meanwhile(daemon: Daemon) -> None:
        time.sleep(0.2)
        status, body = daemon.request("POST", "/v1/admin/snapshot")
        assert status == 200, body

    for cycle in range(CYCLES):
        daemon = daemons(data_dir, *args, env=under_shim(shim, fault_log, **slow))
        if cycle == 0:
            make_board(daemon)
        kill_during_load(daemon, history, f"c{cycle}", rng, during=snapshot_meanwhile)
        cut_to_durable(data_dir, fault_log, rng, "exact")
        with Daemon(data_dir, *args) as restarted:
            scores = all_scores(restarted, BOARD)
            verdict = check(scores, history)
            assert verdict.ok, f"seed {seed}, cycle {cycle}: {verdict}"
            shipped = asyncio.run(wait_shipped_members(pg_dsn, restarted))
            status, ready = restarted.request("GET", "/v1/ready")
            assert status == 200 and ready["checks"]["postgres_shipping"], ready
        doubled = {member: count for member, count in shipped.items() if count != 1}
        assert not doubled and set(shipped) == set(scores), f"seed {seed}: {doubled}"
    print(f"power loss with Postgres: {CYCLES} cycles, {verdict.acknowledged} acknowledged, "
          f"0 lost, Postgres equal to the node, seed {seed}")


async def wait_shipped_members(dsn: str, daemon: Daemon) -> dict[str, int]:
    """Once Postgres has every record of the daemon's log: member -> events."""
    deadline = time.monotonic() + 30
    conn = await asyncpg.connect(dsn)
    try:
        while True:
            last = wal_position(daemon)
            shipped = await conn.fetchval("SELECT shipped_lsn FROM rankd_shipper")
            if shipped == last:
                break
            assert time.monotonic() < deadline, f"shipped {shipped} of {last}"
            await asyncio.sleep(0.1)
        rows = await conn.fetch("SELECT member, count(*) FROM rankd_events WHERE kind = "
                                "'submit' GROUP BY member")
    finally:
        await conn.close()
    return {row[0]: row[1] for row in rows}


def wal_position(daemon: Daemon) -> int:
    import urllib.request

    with urllib.request.urlopen(daemon.url + "/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("rankd_wal_last_position "):
                return int(float(line.split()[1]))
    raise AssertionError("no rankd_wal_last_position metric")


@pytest.mark.parametrize(("fsync", "fault"), [
    ("always", {"RANKD_FAULT_FSYNC_FAIL": "/wal/:5"}),      # EIO from fsync
    ("everysec", {"RANKD_FAULT_WRITE_FAIL": "/wal/:28"}),   # ENOSPC from write
])
def test_a_failed_disk_refuses_writes_hides_them_and_never_brings_them_back(
        tmp_path, shim, daemons, fsync, fault):
    data_dir, fault_log, history = tmp_path / "data", tmp_path / "fsynced.log", History()
    trigger = tmp_path / "armed"
    env = under_shim(shim, fault_log, RANKD_FAULT_TRIGGER=str(trigger), **fault)
    daemon = daemons(data_dir, "--fsync", fsync, env=env)
    make_board(daemon)
    submit_load(daemon.port, BOARD, history, "before", seconds=0.5)
    trigger.touch()
    submit_load(daemon.port, BOARD, history, "after", seconds=0.5, limit=200)
    assert history.with_outcome("fail") and not any(
        m.startswith("after") for m in history.with_outcome("ok"))

    # Reads show only what was acknowledged (once the state is rolled back).
    deadline = time.monotonic() + 10
    while daemon.request("GET", f"/v1/boards/{BOARD}")[0] != 200:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    verdict = check(all_scores(daemon, BOARD), history)
    assert verdict.ok and verdict.acknowledged > 10, verdict

    # Nothing more becomes durable: no snapshot, a JSON error, not ready.
    status, body = daemon.request("POST", "/v1/admin/snapshot")
    assert status == 503 and body["error"]["code"] == "read_only", body
    status, ready = daemon.request("GET", "/v1/ready")
    assert status == 503 and ready["checks"]["wal_writable"] is False

    # SIGTERM in the failed state is not a clean stop.
    assert daemon.stop() == 1
    assert "stopped after a storage failure" in daemon.log()
    assert "stopped cleanly" not in daemon.log()

    trigger.unlink()
    with Daemon(data_dir, "--fsync", fsync) as restarted:
        verdict = check(all_scores(restarted, BOARD), history)
    assert verdict.ok, verdict


def test_a_full_disk_at_the_shutdown_snapshot_loses_nothing_and_leaves_no_file(tmp_path, shim,
                                                                               daemons):
    data_dir, fault_log, history = tmp_path / "data", tmp_path / "fsynced.log", History()
    trigger = tmp_path / "armed"
    env = under_shim(shim, fault_log, RANKD_FAULT_TRIGGER=str(trigger),
                     RANKD_FAULT_WRITE_FAIL="/snapshots/:28")
    daemon = daemons(data_dir, env=env)
    make_board(daemon)
    submit_load(daemon.port, BOARD, history, "m", seconds=0.5)
    trigger.touch()
    status, body = daemon.request("POST", "/v1/admin/snapshot")
    assert status == 503 and body["error"]["code"] == "storage", body
    assert daemon.stop() == 0  # the log has everything: a snapshot is only a shortcut
    assert "no snapshot at shutdown" in daemon.log()
    assert not list((data_dir / "snapshots").glob("*.tmp"))
    trigger.unlink()
    with Daemon(data_dir) as restarted:
        verdict = check(all_scores(restarted, BOARD), history)
    assert verdict.ok and verdict.acknowledged > 10, verdict
