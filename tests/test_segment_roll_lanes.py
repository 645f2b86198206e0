"""Pipelined writes on the native lanes (the intake's own pass, which hands
records to the OS in the loop's thread) across segment rolls of the
write-ahead log: a write that starts a segment runs in a worker thread
(``WriteAheadLog._roll_out``), so such a pass is told later, by a task,
instead of at once.  Once it asserted that ``commit_now`` never declines
under ``everysec`` and closed the connection: the first pipelined ``ZADD``
of a fresh daemon met the first segment's creation."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from daemon import Daemon
from respclient import RawClient

CLIENTS = 4
PIPELINES = 10
DEPTH = 100


@pytest.mark.parametrize("fsync", ["everysec", "no"])
def test_pipelined_writes_across_segment_rolls_are_all_answered_and_kept(
        tmp_path: Path, fsync: str) -> None:
    replies: list[list[bytes]] = [[] for _ in range(CLIENTS)]

    def client(port: int, n: int) -> None:
        with RawClient(port) as raw:
            for p in range(PIPELINES):
                replies[n] += raw.pipeline([["ZADD", "lb", str(i), f"c{n}:{p}:{i}"]
                                            for i in range(DEPTH)])

    args = ("--segment-bytes", "4096", "--fsync", fsync, "--tcp-port", "0")
    with Daemon(tmp_path / "data", *args) as daemon:
        threads = [threading.Thread(target=client, args=(daemon.resp_port, n))
                   for n in range(CLIENTS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert all(reply == [b":1\r\n"] * (PIPELINES * DEPTH) for reply in replies)
        segments = list((tmp_path / "data" / "wal").glob("*.log"))
        assert len(segments) > 10  # (the writes rolled the log many times)
    with Daemon(tmp_path / "data", *args) as daemon, RawClient(daemon.resp_port) as raw:
        assert raw.call("ZCARD", "lb") == f":{CLIENTS * PIPELINES * DEPTH}\r\n".encode()
