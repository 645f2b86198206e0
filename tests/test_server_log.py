"""What a client sending malformed requests in a loop makes the daemon log:
a bounded number of short lines, not a traceback per request."""

from __future__ import annotations

import contextlib
import json
import socket
import time

from daemon import Daemon
from rankd.logbudget import BURST, EXCERPT_CHARS, LineBudget

#: An invalid Content-Length behind a 5 KB header: aiohttp's error quotes it all.
MALFORMED = (b"POST /v1/boards/b/scores HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: "
             + b"a" * 5000 + b"\r\nContent-Length: -1\r\n\r\n")


def test_malformed_requests_in_a_loop_log_a_bounded_number_of_short_lines(tmp_path):
    with Daemon(tmp_path / "data") as daemon:
        for _ in range(3 * BURST):
            with socket.create_connection(("127.0.0.1", daemon.port), timeout=2) as each, \
                    contextlib.suppress(OSError):
                each.sendall(MALFORMED)
                assert each.recv(12)[-3:] == b"400"
            time.sleep(0.01)
        assert daemon.request("GET", "/v1/health")[0] == 200
        daemon.stop()
        lines = [json.loads(line) for line in daemon.log().splitlines()
                 if line.startswith("{")]
    errors = [line for line in lines if line["logger"] == "aiohttp.server"]
    assert len(errors) == BURST, len(errors)
    for line in errors:
        assert line["level"] == "error"
        assert line["message"].startswith("Error handling request from 127.0.0.1: BadHttpMessage")
        assert "exception" not in line  # no traceback
        assert len(line["message"]) < EXCERPT_CHARS + 100


def test_a_budget_counts_the_lines_it_leaves_out_and_reports_them_with_the_next():
    budget = LineBudget(burst=2, window=0.05)
    assert [budget.admit("k") for _ in range(5)] == [0, 0, None, None, None]
    assert budget.admit("other") == 0
    time.sleep(0.06)
    assert budget.admit("k") == 3
    assert budget.admit("k") == 0
