"""A cluster node while it starts: found by the long-form fault suite's
``move`` scenario, whose restarted nodes were asked ``GET /v1/cluster`` by
the harness and answered 500 (the node had not built its view of the nodes
yet).

Real nodes on the session's Postgres; the test holds the advisory lock the
nodes' schema migrations take, so a node's start waits in its first
migration for as long as the test wants.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import asyncpg
from cluster_nodes import node, sql
from jepsen import wait_ready

from rankd.cluster.log import _MIGRATION_LOCK


@contextlib.contextmanager
def migration_lock(dsn: str) -> Iterator[threading.Event]:
    """Hold the schema migrations' advisory lock until the yielded event is
    set (or the block ends)."""
    release = threading.Event()
    held = threading.Event()

    async def hold() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute("SELECT pg_advisory_lock($1)", _MIGRATION_LOCK)
            held.set()
            while not release.is_set():
                await asyncio.sleep(0.02)
        finally:
            await conn.close()

    thread = threading.Thread(target=asyncio.run, args=(hold(),))
    thread.start()
    try:
        assert held.wait(10), "could not take the migration lock"
        yield release
    finally:
        release.set()
        thread.join(10)


def start_in_background(daemon) -> threading.Thread:
    """``daemon.start()`` in a thread (it returns once health answers, which
    may be after the cluster start the test holds)."""
    thread = threading.Thread(target=daemon.start, daemon=True)
    thread.start()
    return thread


def test_cluster_routes_answer_unavailable_until_the_node_joined(tmp_path: Path,
                                                                 pg_dsn: str) -> None:
    daemon = node(tmp_path, pg_dsn, "n0", "--lease-seconds", "30")
    try:
        with migration_lock(pg_dsn) as release:
            starting = start_in_background(daemon)
            deadline = time.monotonic() + 30
            answers: list[tuple[int, object]] = []
            while time.monotonic() < deadline and len(answers) < 3:
                with contextlib.suppress(OSError):
                    answers.append(daemon.request("GET", "/v1/cluster", timeout=2))
                    answers.append(daemon.request("POST", "/v1/cluster/moves",
                                                  {"group": 1, "node": "n0"}, timeout=2))
                    answers.append(daemon.request("POST", "/v1/cluster/rebalance", {},
                                                  timeout=2))
                time.sleep(0.05)
            assert daemon.process.poll() is None, daemon.log()[-3000:]
            release.set()
        starting.join(30)
        for status, body in answers:
            assert status == 503 and body["error"]["code"] == "unavailable", (status, body)
            assert "joining" in body["error"]["message"], body
        wait_ready(daemon)
        status, body = daemon.request("GET", "/v1/cluster")
        assert status == 200 and body["this_node"]["node"] == "n0", body
    finally:
        if daemon.process is not None and daemon.process.poll() is None:
            daemon.stop(timeout=20)



def test_a_node_paused_in_the_middle_of_a_migration_still_starts(tmp_path: Path,
                                                                 pg_dsn: str) -> None:
    """A node stalled inside a migration's transaction for longer than half
    a lease (a loaded machine: the move scenario's restarted node) has its
    session ended by Postgres (``idle_in_transaction_session_timeout``); it
    migrates again on a new connection and joins, rather than exit."""
    daemon = node(tmp_path, pg_dsn, "n0")  # a 1.5 s lease: ended after 0.75 s idle
    try:
        with migration_lock(pg_dsn) as release:
            starting = start_in_background(daemon)
            waiting = "SELECT pg_advisory_xact_lock"
            deadline = time.monotonic() + 20
            while not sql(pg_dsn, "SELECT 1 FROM pg_stat_activity WHERE query LIKE $1 "
                                  "AND wait_event_type = 'Lock'", waiting + "%"):
                assert time.monotonic() < deadline, daemon.log()[-3000:]
                time.sleep(0.05)
            daemon.process.send_signal(signal.SIGSTOP)
            try:
                release.set()  # its lock is granted while it is stopped: idle in transaction
                time.sleep(2.0)
            finally:
                daemon.process.send_signal(signal.SIGCONT)
        starting.join(30)
        assert daemon.process.poll() is None, daemon.log()[-3000:]
        wait_ready(daemon)
        assert "a schema migration was ended midway" in daemon.log(), daemon.log()[-3000:]
    finally:
        if daemon.process is not None and daemon.process.poll() is None:
            daemon.stop(timeout=20)
