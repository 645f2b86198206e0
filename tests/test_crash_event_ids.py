"""kill -9 under load with event ids, snapshots taken meanwhile (index dumps
written as parts and loaded where they lie in the file: rankd.engine.sections):
nothing acknowledged is lost, and after the restart every acknowledged id
sent again is answered as a duplicate (nothing applied twice), and an id sent
again with another payload is refused."""

from __future__ import annotations

import random
import threading

from crash_load import kill_under_load, submit_over_tcp
from daemon import Daemon
from rankd.client import Client


def test_sigkill_with_event_ids_loses_nothing_and_retries_stay_deduplicated(tmp_path):
    data_dir = tmp_path / "data"
    acked: set[str] = set()
    rng = random.Random(47)
    for cycle in range(3):
        # Small snapshot thresholds: snapshots run while the load goes on.
        daemon = Daemon(data_dir, "--fsync", "everysec", "--snapshot-every-events",
                        "3000").start()
        daemon.request("PUT", "/v1/boards/crash", {"policy": "sum"})
        stop = threading.Event()
        lock = threading.Lock()

        tcp = (daemon.tcp_port, stop, acked, lock)
        threads = [threading.Thread(target=submit_over_tcp, args=tcp, kwargs={
            "member": f"p{cycle}-{w}", "event": f"e{cycle}-{w}", "batch": 50}) for w in range(3)]
        kill_under_load(daemon, threads, stop, rng.uniform(1.0, 2.0))
    assert any(path.suffix == ".snap" for path in (data_dir / "snapshots").iterdir())

    def member_of(event_id: str) -> str:
        return "p" + event_id[1:]

    with Daemon(data_dir) as daemon, Client("127.0.0.1", daemon.tcp_port) as client:
        sample = sorted(acked)
        scores = {}
        for start in range(0, len(sample), 1000):
            found = client.ranks("crash", [member_of(e) for e in sample[start:start + 1000]])
            scores.update({e["member"]: e["score"] for e in found["entries"]})
        missing = [e for e in sample if member_of(e) not in scores]
        assert len(acked) > 1000
        assert missing == [], f"{len(missing)} acknowledged submissions lost"
        assert all(scores[member_of(e)] == 1.0 for e in sample)
        # Every acknowledged id sent again: a duplicate, applied once.
        duplicates = 0
        for start in range(0, len(sample), 500):
            batch = [{"member": member_of(e), "delta": 1, "event_id": e}
                     for e in sample[start:start + 500]]
            results = client.submit_many(batch, board="crash")["results"]
            duplicates += sum(1 for r in results if r.get("duplicate") is True)
        assert duplicates == len(sample)
        again = client.ranks("crash", [member_of(e) for e in sample[:1000]])
        assert all(e["score"] == 1.0 for e in again["entries"])
        # Sent again with another payload: refused, nothing changed.
        conflict = client.submit_many([{"member": member_of(sample[0]), "delta": 5,
                                        "event_id": sample[0]}], board="crash")["results"][0]
        assert "error" in conflict and "event_conflict" in str(conflict["error"])
        assert client.ranks("crash", [member_of(sample[0])])["entries"][0]["score"] == 1.0
