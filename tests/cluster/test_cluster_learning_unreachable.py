"""A node cut off from Postgres, sent writes of groups it only guesses it
writes: each write's read of the group's register (``Topology.learn``)
waits at most its bound, and once one found Postgres away the writes
behind it are answered ``-TRYAGAIN`` at once, not after another wait each
(a client's pipeline of writes to many fresh groups, and every command
behind them, waited about four seconds a write).  Nothing is applied, and
once Postgres is back the same writes succeed."""

from __future__ import annotations

import time

from cluster_nodes import keys_guessed_by
from jepsen import Lab

from respclient import RawClient

WRITES = 8


def test_writes_to_guessed_groups_fail_fast_while_postgres_is_away(tmp_path, pg_server) -> None:
    lab = Lab(tmp_path, nodes=2, tcp=False)
    try:
        node = lab.daemons[0]
        keys = keys_guessed_by(node.resp_port, lab.daemons[1].resp_port, "cut-", WRITES)
        lab.pg_proxies[0].set_mode("blackhole")
        try:
            with RawClient(node.resp_port, timeout=120) as client:
                started = time.monotonic()
                replies = client.pipeline([["ZADD", key, "1", "m"] for key in keys] + [["PING"]])
                took = time.monotonic() - started
        finally:
            lab.pg_proxies[0].set_mode("pass")
        assert replies[-1] == b"+PONG\r\n"
        assert all(reply.startswith(b"-TRYAGAIN ") for reply in replies[:-1]), replies
        # b51333b: about 4 s a write (32 s here).
        assert took < 8, took
        deadline = time.monotonic() + 20
        with RawClient(node.resp_port, timeout=30) as client:
            for key in keys:
                while (reply := client.call("ZADD", key, "1", "m")) != b":1\r\n":
                    assert reply.startswith(b"-TRYAGAIN "), reply
                    assert time.monotonic() < deadline, reply
                    time.sleep(0.2)
                assert client.call("ZCARD", key) == b":1\r\n"
    finally:
        lab.close()
