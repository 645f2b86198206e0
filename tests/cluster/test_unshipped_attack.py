"""Attacks on a cluster primary's local log retention (``rankd.engine.unshipped``):
what a ``--ack local`` primary acknowledged and its group's log never took
must stay in its local log until it is set aside."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from jepsen import Lab, read_orphans

from daemon import Daemon

BOARD = "arena"
WRITES = 150


def _write(lab: Lab, event_id: str) -> int:
    status, _ = lab.daemons[0].request("POST", f"/v1/boards/{BOARD}/scores",
                                       {"member": event_id, "delta": 1, "event_id": event_id})
    return status


def _cut_off_primary(root: Path, shim: Path | None = None) -> Lab:
    """A one-node ``--ack local`` cluster with small WAL segments, whose
    node writes ``BOARD``'s group (one record committed), then loses its
    link to Postgres (a long lease and unshipped bound: it goes on
    acknowledging writes)."""
    lab = Lab(root, nodes=1, lease_seconds=30.0, ack="local", shim=shim,
              extra=("--segment-bytes", "4096", "--max-unshipped-ms", "60000"))
    try:
        for _ in range(100):
            if lab.daemons[0].request("PUT", f"/v1/boards/{BOARD}",
                                      {"policy": "sum"})[0] in (200, 201):
                break
            time.sleep(0.1)
        assert _write(lab, "committed") == 200
        time.sleep(1.0)  # (committed to the group's log by now)
        lab.pg_proxies[0].set_mode("blackhole")
    except BaseException:
        lab.close()
        raise
    return lab


def test_snapshot_while_restarting_drops_acknowledged_unshipped_records(tmp_path: Path) -> None:
    """A primary killed with acknowledged records its group's log lacks
    restarts with an empty note of them: local snapshots taken before it
    reached Postgres (its link down) dropped the segments holding them, and
    once it reached Postgres nothing was set aside: the writes were lost."""
    lab = _cut_off_primary(tmp_path)
    with _logged(lab):
        daemon = lab.daemons[0]
        acknowledged = [f"e{i}" for i in range(WRITES) if _write(lab, f"e{i}") == 200]
        assert len(acknowledged) == WRITES
        lab.kill(0)

        # Restart with the link to Postgres still down: the engine recovers
        # and serves /v1/admin/snapshot while the node cannot join yet.
        failed: list[BaseException] = []

        def start() -> None:
            try:
                daemon.start(timeout=20)
            except BaseException as exc:  # (it exits: Postgres is unreachable)
                failed.append(exc)

        starting = threading.Thread(target=start)
        starting.start()
        taken = 0
        deadline = time.monotonic() + 15
        while taken < 2 and time.monotonic() < deadline:
            try:
                if daemon.request("POST", "/v1/admin/snapshot", timeout=5)[0] == 200:
                    taken += 1
                    continue
            except OSError:
                pass
            time.sleep(0.05)
        starting.join(30)
        assert taken == 2, "no snapshot was taken while the node started"
        if lab.alive(0):
            lab.kill(0)
        lab.pg_proxies[0].set_mode("pass")
        lab.restart(0)

        _none_lost(lab, acknowledged)


def test_notes_of_a_writer_given_up_on_a_failed_local_log_keep_every_later_segment(
        tmp_path: Path) -> None:
    """A primary whose local log fails gives its groups up (its committer
    closed with records its link to Postgres never took) and starts again
    on a new, empty log: the closed committer's notes never go (nothing
    commits them, nothing resets the group), so every later snapshot keeps
    every segment from their position on, and the local log grows without
    bound."""
    lab = _cut_off_primary(tmp_path, shim=_shim(tmp_path))
    with _logged(lab):
        daemon = lab.daemons[0]
        assert all(_write(lab, f"u{i}") == 200 for i in range(5))  # (acknowledged, unshipped)
        _fail_local_log_then_recover(lab)
        deadline = time.monotonic() + 30
        written = 0
        while written < 300 and time.monotonic() < deadline:
            if _write(lab, f"later{written}") == 200:
                written += 1
            else:
                time.sleep(0.1)
        assert written == 300
        time.sleep(1.0)  # (committed to the group's log by now)
        for _ in range(2):
            assert daemon.request("POST", "/v1/admin/snapshot")[0] == 200
        segments = sorted((daemon.data_dir / "wal").glob("*.log"))
        assert len(segments) <= 2, (
            f"{len(segments)} segments kept after two snapshots, every record committed")


def test_writes_acknowledged_before_the_local_log_failed_are_not_set_aside(
        tmp_path: Path) -> None:
    """A ``--ack local`` primary whose link to Postgres is down acknowledges
    writes, then its local log fails: it gives the group up and starts again
    on an empty log, the old one moved aside whole.  The writes it
    acknowledged and never shipped are then in neither the group's log nor
    an orphan file (``rankd cluster resubmit``): lost."""
    lab = _cut_off_primary(tmp_path, shim=_shim(tmp_path))
    with _logged(lab):
        acknowledged = [f"u{i}" for i in range(5) if _write(lab, f"u{i}") == 200]
        assert len(acknowledged) == 5
        _fail_local_log_then_recover(lab)

        _none_lost(lab, acknowledged)


@contextlib.contextmanager
def _logged(lab: Lab) -> Iterator[None]:
    """Print the nodes' logs if the block fails; close the lab either way."""
    try:
        yield
    except BaseException:
        print(lab.logs())
        raise
    finally:
        lab.close()


def _none_lost(lab: Lab, acknowledged: list[str]) -> None:
    """Each acknowledged write is on the board or set aside."""
    orphans = read_orphans(lab)
    lost = [event for event in acknowledged
            if event not in orphans and _member_status(lab.daemons[0], event) == 404]
    assert not lost, f"{len(lost)} acknowledged writes lost, not set aside: {lost[:5]}"


def _shim(root: Path) -> Path:
    from faultshim import build_shim

    (root / "shim").mkdir()
    return build_shim(root / "shim")


def _fail_local_log_then_recover(lab: Lab) -> None:
    """Fill the node's disk (its local log fails and it gives its group up,
    its link to Postgres still down), then give room and the link back
    until it started again on a new log."""
    daemon = lab.daemons[0]
    lab.fill_disk(0)
    _write(lab, "fails")  # (the local log fails: the node gives the group up)
    _wait_logged(daemon, "gives up group", 20)
    lab.pg_proxies[0].set_mode("pass")
    lab.free_disk(0)
    _wait_logged(daemon, "recovered from its failed local log", 30)


def _wait_logged(daemon: Daemon, text: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while text not in daemon.log() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert text in daemon.log(), f"never logged: {text}"


def _member_status(daemon: Daemon, member: str) -> int:
    """200 or 404, once the node answers the read (it may catch up first)."""
    deadline = time.monotonic() + 20
    while True:
        status = daemon.request("GET", f"/v1/boards/{BOARD}/members/{member}")[0]
        if status in (200, 404) or time.monotonic() > deadline:
            return status
        time.sleep(0.1)
