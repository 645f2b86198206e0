"""Pipelined ``top`` reads on the TCP port against health requests.

``python bench/bench_tcp_holds.py TREE``: a daemon of TREE (a checkout with
its extensions built) gets a 20,000-member board, then one TCP client
pipelines 3,000 ``top`` pages of a thousand and reads them as they come,
while health requests are timed for 4 s.  Prints the health requests'
p50 and worst, the loop watchdog's bucket of the longest hold, and the
daemon's CPU time (user + system) meanwhile.  Run trees alternately: see
bench/RESULTS.md, "TCP: pipelined reads and the loop".
"""

from __future__ import annotations

import pathlib
import socket
import sys
import tempfile
import threading
import time

sys.path[:0] = [str(pathlib.Path(__file__).resolve().parents[1] / "tests")]

from daemon import Daemon  # noqa: E402
from rankd import wire  # noqa: E402
from test_gone_reads import _cpu, _fill  # noqa: E402
from test_resp_large_stores import _longest, _stalls  # noqa: E402
from test_tcp_holds import _read_all  # noqa: E402

PAGES = 3000
SECONDS = 4.0


def main(tree: pathlib.Path) -> None:
    data = pathlib.Path(tempfile.mkdtemp()) / "data"
    with Daemon(data, "--fsync", "no", env={"PYTHONPATH": str(tree / "src")}) as daemon:
        _fill(daemon)
        payload = b"".join(
            wire.request(10 + i, "top", {"board": "big", "limit": 1000,
                                         "offset": (i * 37) % 19_000})
            for i in range(PAGES))
        time.sleep(0.3)
        before, cpu, got, waits = _stalls(daemon), _cpu(daemon), [0], []
        with socket.create_connection(("127.0.0.1", daemon.tcp_port), timeout=10) as sock:
            sock.sendall(wire.request(1, "hello", {"version": 1}))
            reader = threading.Thread(target=_read_all, args=(sock, got))
            reader.start()
            sent = time.monotonic()
            sock.sendall(payload)
            while time.monotonic() - sent < SECONDS:
                started = time.monotonic()
                assert daemon.request("GET", "/v1/health")[0] == 200
                waits.append(time.monotonic() - started)
                time.sleep(0.01)
            sock.shutdown(socket.SHUT_WR)
            reader.join(30)
        waits.sort()
        print(f"{tree.name}: health p50 {waits[len(waits) // 2] * 1000:.1f} ms,"
              f" max {waits[-1] * 1000:.0f} ms ({len(waits)} requests),"
              f" watchdog bucket {_longest(before, _stalls(daemon)) * 1000:.0f} ms,"
              f" CPU {_cpu(daemon) - cpu:.2f} s, bytes read {got[0]}")


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]).resolve())
