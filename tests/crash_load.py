"""Load that runs while a test kills the daemon, for the crash tests.

Each submitter thread sends batches of fresh events over TCP until told to
stop or until the daemon dies under it, and records every event id the daemon
acknowledged; after the kill and a restart, the test checks that every one of
them is still there.  Shared by test_daemon.py and test_crash_event_ids.py.
"""

from __future__ import annotations

import signal
import threading
import time

from daemon import Daemon
from rankd.client import Client, RankdError


def submit_over_tcp(port: int, stop: threading.Event, acked: set[str], lock: threading.Lock,
                    *, member: str, event: str, batch: int, board: str = "crash") -> None:
    """Submit batches of ``batch`` events, member ``f"{member}-{k}"`` and event
    id ``f"{event}-{k}"`` for k = 0, 1, ..., adding the acknowledged ids to
    ``acked`` (under ``lock``), until ``stop`` is set or the connection fails."""
    client = Client("127.0.0.1", port, retries=0, timeout=5)
    n = 0
    try:
        while not stop.is_set():
            events = [{"member": f"{member}-{n + i}", "delta": 1,
                       "event_id": f"{event}-{n + i}"} for i in range(batch)]
            n += batch
            results = client.submit_many(events, board=board)["results"]
            with lock:
                acked.update(r["event_id"] for r in results if "error" not in r)
    except (RankdError, OSError):
        pass
    finally:
        client.close()


def submit_over_rest(daemon: Daemon, stop: threading.Event, acked: set[str],
                     lock: threading.Lock, *, prefix: str, board: str = "crash") -> None:
    """Submit events one at a time over REST, member and event id
    ``f"{prefix}-{n}"`` for n = 0, 1, ..., adding the acknowledged ids to
    ``acked`` (under ``lock``), until ``stop`` is set or a request fails."""
    n = 0
    while not stop.is_set():
        event_id = f"{prefix}-{n}"
        n += 1
        try:
            status, _ = daemon.request("POST", f"/v1/boards/{board}/scores", {
                "member": event_id, "delta": 1, "event_id": event_id}, timeout=5)
        except OSError:
            return
        if status == 200:
            with lock:
                acked.add(event_id)


def kill_under_load(daemon: Daemon, threads: list[threading.Thread], stop: threading.Event,
                    seconds: float) -> None:
    """Start ``threads``, SIGKILL the daemon ``seconds`` later, then stop and
    join the threads and reap the daemon."""
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    daemon.process.send_signal(signal.SIGKILL)
    daemon.process.wait(30)
    stop.set()
    for thread in threads:
        thread.join(30)
    daemon.stop()
