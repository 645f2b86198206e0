"""Pipelined reads on the TCP port leave the event loop to others.

A client that pipelines thousands of ``top`` pages and reads the answers as
fast as they come never clears the connection's ``can_write``: the worker
once answered the whole pipeline without giving way (0.3 ms a page of a
thousand: 3,000 pages held the loop over a second, health requests
waiting as long).  Now it gives way after ``BATCH_SECONDS`` of work, as the
Redis port's worker does.
"""

from __future__ import annotations

import socket
import threading
import time

from daemon import Daemon
from rankd import wire
from test_gone_reads import _fill
from test_resp_large_stores import _longest, _stalls

PAGES = 3_000


def _read_all(sock: socket.socket, got: list[int]) -> None:
    """Read until the daemon closes (or a quiet second): the fast reader."""
    sock.settimeout(5)
    try:
        while chunk := sock.recv(1 << 20):
            got[0] += len(chunk)
    except OSError:
        pass


def test_pipelined_top_reads_hold_the_loop_briefly(tmp_path):
    """While a client pipelines 3,000 ``top`` pages of a thousand and reads
    them as they come, health requests are answered within 500 ms and the
    watchdog sees no hold past its 250 ms bucket (the best of three tries;
    on a quiet machine they are about 40 ms and the 25 ms bucket, but one
    loaded three times over deschedules the daemon that long by itself);
    before, the pipeline held the loop 1.4-5 s in one go (the 2.5 s bucket
    and up)."""
    with Daemon(tmp_path / "data", "--fsync", "no") as daemon:
        _fill(daemon)
        payload = b"".join(
            wire.request(10 + i, "top", {"board": "big", "limit": 1000,
                                         "offset": (i * 37) % 19_000})
            for i in range(PAGES))
        tries = []
        for _ in range(3):
            time.sleep(0.2)  # the fill's own holds are counted before
            before = _stalls(daemon)
            got = [0]
            with socket.create_connection(("127.0.0.1", daemon.tcp_port), timeout=10) as sock:
                sock.sendall(wire.request(1, "hello", {"version": 1}))
                reader = threading.Thread(target=_read_all, args=(sock, got))
                reader.start()
                sock.sendall(payload)
                worst = 0.0
                deadline = time.monotonic() + 3
                while time.monotonic() < deadline:
                    started = time.monotonic()
                    assert daemon.request("GET", "/v1/health")[0] == 200
                    worst = max(worst, time.monotonic() - started)
                    time.sleep(0.005)
                sock.shutdown(socket.SHUT_WR)
                reader.join(30)
            assert got[0] > PAGES * 1000 * 10, got  # every page came (roughly)
            tries.append((worst, _longest(before, _stalls(daemon))))
            if worst < 0.05 and tries[-1][1] <= 0.025:
                break
        print("worst health request, longest loop hold (bucket):", tries)
        assert min(held for _, held in tries) <= 0.25, tries
        assert min(worst for worst, _ in tries) < 0.5, tries
