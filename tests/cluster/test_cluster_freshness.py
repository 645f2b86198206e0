"""Bounded staleness (``--max-follow-lag``): a node that cannot follow the
cluster's log refuses reads (503 ``unavailable``) instead of answering old
data, leaves ``/v1/ready``, and serves again by itself once it can follow.

Real ``rankd serve`` nodes and a real Postgres on loopback; each node
reaches Postgres through its own proxy (:class:`~nemesis.Proxy`, as in
jepsen.py's :class:`Lab`), and a full disk is the LD_PRELOAD fault shim
making every write under one node's data dir fail with ENOSPC.
"""

from __future__ import annotations

import asyncio
import errno
import os
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from jepsen import Lab, converge, wait_ready

from daemon import Daemon
from faultshim import build_shim
from test_startup_errors import _serve

#: The bound the nodes run with (seconds), and the slack a refusal may take
#: beyond it (a poll interval, a request, a loaded machine).
LAG = 2.0
SLACK = 3.0
BOARD = "b"


def wait_until(what: str, condition: Callable[[], bool], timeout: float) -> float:
    """Poll ``condition`` until true; the seconds it took."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.05)
    return time.monotonic() - started


def read_member(daemon: Daemon, member: str) -> tuple[int, dict]:
    return daemon.request("GET", f"/v1/boards/{BOARD}/members/{member}", timeout=10)


def metrics(daemon: Daemon) -> dict[str, float]:
    """The daemon's cluster gauges, by name."""
    with urllib.request.urlopen(daemon.url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    return {name: float(value) for name, _, value in
            (line.partition(" ") for line in text.splitlines())
            if name.startswith("rankd_cluster_")}


def ready(daemon: Daemon) -> tuple[int, dict]:
    return daemon.request("GET", "/v1/ready", timeout=10)


class Writes:
    """New members written to one node, one at a time, until stopped; the
    acknowledged ones in ``acknowledged``."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.acknowledged: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        number = 0
        while not self._stop.is_set():
            member = f"w{number:05d}"
            number += 1
            status, _ = self.daemon.request("POST", f"/v1/boards/{BOARD}/scores",
                                            {"member": member, "delta": 1,
                                             "event_id": member})
            if status == 200:
                self.acknowledged.append(member)
            time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def start_lab(tmp_path: Path) -> Lab:
    """Two nodes with a short bound; node 0 writes the board, node 1 follows it."""
    lab = Lab(tmp_path, nodes=2, tcp=False, extra=("--max-follow-lag", str(LAG)))
    primary = lab.daemons[0]
    wait_until("the board is made", lambda: primary.request(
        "PUT", f"/v1/boards/{BOARD}", {"policy": "sum"})[0] in (200, 201), 20)
    assert primary.request("POST", f"/v1/boards/{BOARD}/scores",
                           {"member": "first", "delta": 1, "event_id": "first"})[0] == 200
    assert lab.primary_of(BOARD) == 0
    return lab


def refused_within_bound(follower: Daemon, since: float) -> tuple[float, str]:
    """Read ``follower`` until it refuses; every read before must be within
    the bound (plus slack) of ``since``.  The refusal's delay and message."""
    while True:
        status, body = read_member(follower, "first")
        elapsed = time.monotonic() - since
        if status == 503 and body["error"]["code"] == "unavailable":
            return elapsed, body["error"]["message"]
        assert elapsed < LAG + SLACK, (
            f"the follower still answers {status} {body} {elapsed:.1f} s after it stopped "
            f"following (--max-follow-lag {LAG})")
        time.sleep(0.05)


def stays_refused(follower: Daemon, seconds: float) -> None:
    """No read of ``follower`` answers old data for ``seconds``, and it is not ready."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        status, body = read_member(follower, "first")
        assert status == 503, (status, body)
        status, body = ready(follower)
        assert status == 503 and body["checks"]["cluster_fresh"] is False, body
        time.sleep(0.2)


def agrees(lab: Lab, writes: Writes) -> None:
    """Both nodes reach one digest, and the follower shows every acknowledged write."""
    digests = asyncio.run(converge(lab))
    assert len(digests) == 2, digests
    follower = lab.daemons[1]
    for member in writes.acknowledged[-20:]:
        status, body = read_member(follower, member)
        assert status == 200 and body["score"] == 1, (member, status, body)


def test_a_follower_cut_off_from_postgres_refuses_reads_then_serves_again(tmp_path,
                                                                        pg_server) -> None:
    lab = start_lab(tmp_path)
    follower = lab.daemons[1]
    writes = None
    try:
        wait_until("the follower reads the first write",
                   lambda: read_member(follower, "first")[0] == 200, 10)
        status, body = ready(follower)
        assert status == 200 and body["checks"]["cluster_fresh"] is True, body
        writes = Writes(lab.daemons[0])
        lab.pg_proxies[1].set_mode("blackhole")  # queries hang, nothing is refused
        cut = time.monotonic()
        refused_after, message = refused_within_bound(follower, cut)
        assert f"board '{BOARD}'" in message and "--max-follow-lag" in message, message
        assert "read another node" in message, message
        stays_refused(follower, 3.0)
        figures = metrics(follower)
        assert figures["rankd_cluster_stale_groups"] >= 1, figures
        assert figures["rankd_cluster_read_staleness_seconds"] > LAG, figures
        lab.pg_proxies[1].set_mode("pass")
        healed = time.monotonic()
        back_after = wait_until("the follower is ready again",
                                lambda: ready(follower)[0] == 200, 60)
        writes.stop()
        agrees(lab, writes)
        print(f"blackholed follower: refused {refused_after:.2f} s after the cut "
              f"(bound {LAG} s), ready {back_after:.2f} s after the heal "
              f"({time.monotonic() - healed:.2f} s to agree)")
    except BaseException:
        print(lab.logs())
        raise
    finally:
        if writes is not None:
            writes.stop()
        lab.close()


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> Path:
    return build_shim(tmp_path_factory.mktemp("shim"))


def test_a_follower_whose_disk_fills_refuses_reads_then_recovers_by_itself(
        tmp_path, pg_server, shim) -> None:
    lab = start_lab(tmp_path)
    follower = lab.daemons[1]
    trigger = tmp_path / "disk-full"
    writes = None
    try:
        under_full_disk(follower, shim, trigger)
        wait_until("the follower reads the first write",
                   lambda: read_member(follower, "first")[0] == 200, 10)
        writes = Writes(lab.daemons[0])
        wait_until("writes go on", lambda: len(writes.acknowledged) > 5, 10)
        trigger.touch()
        filled = time.monotonic()
        refused_after, message = refused_within_bound(follower, filled)
        assert "local log failed" in message, message
        stays_refused(follower, 3.0)
        trigger.unlink()
        freed = time.monotonic()
        back_after = wait_until("the follower is ready again",
                                lambda: ready(follower)[0] == 200, 60)
        writes.stop()
        agrees(lab, writes)
        log = follower.log()
        assert "recovered from its failed local log without a restart" in log, log[-3000:]
        assert follower.process.poll() is None
        assert list(follower.data_dir.glob("aside-*")), "the old local state is kept"
        print(f"full-disk follower: refused {refused_after:.2f} s after the disk filled "
              f"(bound {LAG} s), ready {back_after:.2f} s after space returned "
              f"({time.monotonic() - freed:.2f} s to agree)")
    except BaseException:
        print(lab.logs())
        raise
    finally:
        if writes is not None:
            writes.stop()
        trigger.unlink(missing_ok=True)
        lab.close()


def under_full_disk(daemon: Daemon, shim: Path, trigger: Path) -> None:
    """Restart ``daemon`` under the shim: every write under its data dir
    fails with ENOSPC while ``trigger`` exists."""
    daemon.stop(timeout=20)
    daemon.env.update(LD_PRELOAD=str(shim), RANKD_FAULT_TRIGGER=str(trigger),
                      RANKD_FAULT_WRITE_FAIL=f"{os.path.realpath(daemon.data_dir)}/:"
                                             f"{errno.ENOSPC}")
    daemon.start()
    wait_ready(daemon)


def test_a_primary_whose_disk_fills_gives_its_groups_up(tmp_path, pg_server, shim) -> None:
    """It can log nothing: another node takes the group's writes (they were
    stuck until a restart, the full node renewing its lease and refusing
    every write), and the full node recovers once space returns."""
    lab = start_lab(tmp_path)
    primary, other = lab.daemons
    trigger = tmp_path / "disk-full"
    writes = None
    try:
        under_full_disk(primary, shim, trigger)
        # The other node may have taken the board meanwhile: stopped, it gives
        # it up, and the next write, on the node under the shim, takes it.
        other.stop(timeout=20)
        wait_until("the restarted node writes the board again", lambda: primary.request(
            "POST", f"/v1/boards/{BOARD}/scores", {"member": "again", "delta": 1,
                                                   "event_id": "again"})[0] == 200, 20)
        other.start()
        wait_ready(other)
        assert lab.primary_of(BOARD) == 0
        trigger.touch()
        filled = time.monotonic()
        writes = Writes(other)
        moved_after = wait_until("the other node takes the board's writes",
                                 lambda: len(writes.acknowledged) >= 5, 20)
        assert lab.primary_of(BOARD, avoid=0) == 1
        trigger.unlink()
        wait_until("the full node is ready again", lambda: ready(primary)[0] == 200, 60)
        writes.stop()
        digests = asyncio.run(converge(lab))
        assert len(digests) == 2, digests
        print(f"full-disk primary: writes moved {moved_after:.2f} s after the disk filled "
              f"({time.monotonic() - filled:.2f} s to agree again)")
    except BaseException:
        print(lab.logs())
        raise
    finally:
        if writes is not None:
            writes.stop()
        trigger.unlink(missing_ok=True)
        lab.close()


@pytest.mark.parametrize(("value", "complaint"), [
    ("-1", "--max-follow-lag: must not be negative"),
    ("soon", "--max-follow-lag: expected float"),
    ("nan", "--max-follow-lag: expected a number of seconds"),
    ("inf", "--max-follow-lag: expected a number of seconds"),
])
def test_a_bad_max_follow_lag_is_refused_at_start(tmp_path, value: str, complaint: str) -> None:
    code, lines = _serve(tmp_path / "data", "--node-id", "a", "--cluster-dsn",
                         "postgresql://rankd@127.0.0.1:1/ranks", "--max-follow-lag", value)
    assert code == 2, lines
    assert len(lines) == 1 and complaint in lines[0], lines
