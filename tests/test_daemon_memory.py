"""The daemon's resident memory, measured from outside (``/proc``) on a real
process: what remembered event ids cost it, and glibc's heap not keeping
the memory of big freed blocks (``rankd.engine.heap``)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from daemon import SRC, Daemon
from rankd.engine import heap

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")


def _status(pid: int, field: str) -> int:
    """A ``/proc/<pid>/status`` memory field, in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field}")


def _rss(pid: int) -> int:
    return _status(pid, "VmRSS")


def _least_rss(pid: int, seconds: float) -> int:
    least = _rss(pid)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.1)
        least = min(least, _rss(pid))
    return least


_CHURN = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {src!r})
    from rankd.engine import heap
    if {tuned!r}:
        heap.tune()
    def rss():
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    first = b"x" * (8 << 20)   # mapped, then freed: glibc raises its threshold to 8 MiB
    del first
    before = rss()
    big, pins = [], []
    for i in range(16):      # a snapshot's chunks, with small long-lived blocks between
        big.append(b"x" * (4 << 20))
        pins.append(b"y" * (200 << 10))
    del big
    print(json.dumps({{"kept": rss() - before}}))
""")


@pytest.mark.parametrize("tuned", [False, True])
def test_big_freed_blocks_go_back_to_the_kernel(tuned: bool) -> None:
    """With glibc's dynamic threshold, 4 MiB blocks freed once come from the
    heap from then on, and stay resident when smaller blocks sit above them
    (as a snapshot's event-id chunks did: 35 MiB of heap, 13 in use);
    :func:`heap.tune` fixes the threshold so that they are mapped and
    given back.  The untuned run shows the test sees the difference."""
    if heap._glibc() is None:
        pytest.skip("glibc only")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", _CHURN.format(src=str(SRC), tuned=tuned)],
                         check=True, capture_output=True, text=True, env=env).stdout
    kept = json.loads(out.strip().splitlines()[-1])["kept"]
    pins = 16 * (200 << 10)
    if tuned:
        assert kept < pins + (8 << 20), f"{kept >> 20} MiB kept after freeing 64 MiB"
    else:
        assert kept > 32 << 20, f"only {kept >> 20} MiB kept untuned: the test shows nothing"


def test_tune_leaves_a_threshold_the_environment_set() -> None:
    assert heap.set_by_environment({"MALLOC_MMAP_THRESHOLD_": "65536"})
    assert heap.set_by_environment({"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=65536"})
    assert not heap.set_by_environment({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})
    assert not heap.set_by_environment({})


@pytest.mark.slow
def test_remembered_event_ids_cost_the_daemon_about_32_bytes(tmp_path: Path) -> None:
    """300,000 submissions with fresh UUID event ids over TCP (1,000 members,
    so the index stays small): the daemon's RSS, settled after a snapshot,
    grows by at most 34 B per remembered id: the store's own 24-byte records
    and 5.7 to 7.1 B of slots, and the daemon's own buffers, which weigh
    1-2 B per id at this size (``bench_memory.py --event-ids 1000000``
    gives 30.5 B).  The start revision gave 88.5 B here (freed heap)."""
    from rankd.client import Client

    count = 300_000
    rng = random.Random(47)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    daemon = Daemon(tmp_path / "data", "--fsync", "everysec", env=env)
    daemon.start(timeout=120)
    try:
        assert daemon.process is not None
        pid = daemon.process.pid
        daemon.request("PUT", "/v1/boards/ids", {"policy": "sum"})
        names = [f"player:{i:012d}" for i in range(1000)]
        with Client("127.0.0.1", daemon.tcp_port) as client:
            client.submit_many([{"member": name, "delta": 1} for name in names], board="ids")
            time.sleep(0.5)
            empty = _least_rss(pid, 1.0)
            for start in range(0, count, 1000):
                events = [{"member": names[n % 1000], "delta": 1,
                           "event_id": str(uuid.UUID(int=rng.getrandbits(128)))}
                          for n in range(start, start + 1000)]
                results = client.submit_many(events, board="ids")["results"]
                assert not any("error" in r or r.get("duplicate") for r in results)
        status, _ = daemon.request("POST", "/v1/admin/snapshot")
        assert status == 200
        live = _least_rss(pid, 2.0)
    finally:
        daemon.stop(timeout=120)
    per_id = (live - empty) / count
    assert per_id <= 34, f"{per_id:.1f} B of RSS per remembered event id"


@pytest.mark.parametrize("size", [300 << 10, 900 << 10])
def test_encode_keeps_no_grown_buffer(size: int) -> None:
    """A record between msgpack's initial buffer (256 KiB) and 1 MiB, as a
    snapshot's last event-id section is, left the shared packer's buffer
    grown to twice its size for the life of the process."""
    import gc
    import tracemalloc

    from rankd.engine import records

    records.encode(["warm", 1])
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        payload = records.encode(["event_id_store", "b", bytes(size)])
        assert len(payload) > size
        del payload
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept <= (256 << 10) + 4096, f"{kept} bytes kept after encoding a {size}-byte record"


def _zadd_all(port: int, count: int, rng: random.Random) -> None:
    """``count`` members through the Redis port, in pipelined ZADDs of 1,000."""
    import socket

    from rankd.frontends.resp.protocol import encode_request

    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        for start in range(0, count, 20_000):
            requests = []
            for first in range(start, min(start + 20_000, count), 1000):
                words: list[bytes | str] = [b"ZADD", b"lb"]
                for i in range(first, min(first + 1000, count)):
                    words += [b"%d" % rng.randrange(10**9), b"player:%012d" % i]
                requests.append(encode_request(words))
            sock.sendall(b"".join(requests))
            replies = b""
            while replies.count(b"\r\n") < len(requests):
                chunk = sock.recv(65536)
                assert chunk, "the daemon closed the connection"
                replies += chunk
            assert b"-" not in replies[:1] and b"\r\n-" not in replies, replies[:200]


@pytest.mark.slow
def test_snapshot_and_restart_peaks_stay_near_live(tmp_path: Path) -> None:
    """A 200,000-member board loaded through the Redis port, with event ids
    on another board: the high-water mark (``VmHWM``, reset through
    ``clear_refs``) while a snapshot is written, and a restarted daemon's
    during its start, stay within 1.3x the live RSS.  (A restart held the
    whole snapshot file; a snapshot, three copies of a dump.)"""
    from rankd.client import Client

    rng = random.Random(47)
    daemon = Daemon(tmp_path / "data", "--fsync", "everysec")
    daemon.start(timeout=120)
    try:
        assert daemon.process is not None
        pid = daemon.process.pid
        _zadd_all(daemon.resp_port, 200_000, rng)
        daemon.request("PUT", "/v1/boards/ids", {"policy": "sum"})
        with Client("127.0.0.1", daemon.tcp_port) as client:
            for start in range(0, 200_000, 1000):
                client.submit_many([{"member": f"m{n % 100}", "delta": 1,
                                     "event_id": str(uuid.UUID(int=rng.getrandbits(128)))}
                                    for n in range(start, start + 1000)], board="ids")
        assert daemon.request("POST", "/v1/admin/snapshot")[0] == 200
        live = _least_rss(pid, 2.0)
        try:
            with open(f"/proc/{pid}/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pytest.skip("cannot reset the high-water mark (clear_refs)")
        assert daemon.request("POST", "/v1/admin/snapshot")[0] == 200
        snapshot_peak = _status(pid, "VmHWM")
        daemon.stop(timeout=120)
        daemon.start(timeout=120)  # (a new process: its peak so far is the start's)
        assert daemon.process is not None
        restart_peak = _status(daemon.process.pid, "VmHWM")
        status, body = daemon.request("GET", "/v1/boards/ids/members/m7")
        assert status == 200, body
    finally:
        daemon.stop(timeout=120)
    assert snapshot_peak <= 1.3 * live, f"snapshot peak {snapshot_peak / live:.2f}x live"
    assert restart_peak <= 1.3 * live, f"restart peak {restart_peak / live:.2f}x live"
