"""kill -9 under load with event ids, snapshots taken meanwhile (index dumps
written as parts and loaded where they lie in the file: rankd.engine.sections):
nothing acknowledged is lost, and after the restart every acknowledged id
sent again is answered as a duplicate (nothing applied twice), and an id sent
again with another payload is refused."""

from __future__ import annotations

import random
import signal
import threading
import time

from daemon import Daemon
from rankd.client import Client, RankdError


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

        def load(worker: int, daemon=daemon, stop=stop, lock=lock, cycle=cycle) -> None:
            client = Client("127.0.0.1", daemon.tcp_port, retries=0, timeout=5)
            n = 0
            try:
                while not stop.is_set():
                    batch = [{"member": f"p{cycle}-{worker}-{n + i}", "delta": 1,
                              "event_id": f"e{cycle}-{worker}-{n + i}"} for i in range(50)]
                    n += 50
                    results = client.submit_many(batch, board="crash")["results"]
                    with lock:
                        acked.update(r["event_id"] for r in results if "error" not in r)
            except (RankdError, OSError):
                pass
            finally:
                client.close()

        threads = [threading.Thread(target=load, args=(w,)) for w in range(3)]
        for thread in threads:
            thread.start()
        time.sleep(rng.uniform(1.0, 2.0))
        daemon.process.send_signal(signal.SIGKILL)
        daemon.process.wait(30)
        stop.set()
        for thread in threads:
            thread.join(30)
        daemon.stop()
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
