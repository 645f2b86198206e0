"""Writes to groups a cluster node only guesses it writes read the group's
register first (``Topology.learn``).  Writes that take nothing (``ZREM`` of
absent members) never make the node the group's writer, so each would
read the register again: many clients sending them must not turn into one
Postgres query each (the node's pool also carries its log's appends and
heartbeats).  Reads of one group's register are shared and kept a moment."""

from __future__ import annotations

import asyncio
import threading
import time

import asyncpg
from cluster_nodes import keys_guessed_by, nodes

from respclient import RawClient

CLIENTS = 16
PIPELINE = 20
ROUNDS = 10
#: How long Postgres may take to count a backend's transactions (its
#: statistics are flushed when idle, up to 10 s late).
STATS_SECONDS = 11


def _transactions(dsn: str) -> int:
    async def read() -> int:
        conn = await asyncpg.connect(dsn)
        try:
            return await conn.fetchval("SELECT xact_commit + xact_rollback FROM "
                                       "pg_stat_database WHERE datname = current_database()")
        finally:
            await conn.close()
    return asyncio.run(read())


def test_writes_that_take_nothing_do_not_query_postgres_each(tmp_path, pg_server) -> None:
    dsn = pg_server.create_database()
    with nodes(tmp_path, dsn, 2) as (node, other):
        boards = keys_guessed_by(node.resp_port, other.resp_port, "learn-", PIPELINE)
        replies: list[bytes] = []

        def client(index: int) -> None:
            with RawClient(node.resp_port, timeout=30) as raw:
                for _ in range(ROUNDS):
                    words = [["ZREM", boards[(index + i) % len(boards)], "absent"]
                             for i in range(PIPELINE)]
                    replies.extend(raw.pipeline(words))

        time.sleep(STATS_SECONDS)
        before = _transactions(dsn)
        started = time.monotonic()
        threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        took = time.monotonic() - started
        time.sleep(STATS_SECONDS)  # (until every backend reported its counts)
        queries = _transactions(dsn) - before
        sent = CLIENTS * ROUNDS * PIPELINE
        assert replies == [b":0\r\n"] * sent  # every reply, each once
        # b51333b: a query per command (3200 here, 3528 counted).  The
        # nodes' own rounds add a few dozen a second.
        assert queries < sent / 5, (queries, sent, took)
