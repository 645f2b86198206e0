"""A node cut off from Postgres, sent writes of groups it only guesses it
writes: each write's read of the group's register (``Topology.learn``)
waits at most its bound, and once one found Postgres away the writes
behind it are answered ``-TRYAGAIN`` at once, not after another wait each
(a client's pipeline of writes to many fresh groups, and every command
behind them, waited about four seconds a write).  Nothing is applied, and
once Postgres is back the same writes succeed."""

from __future__ import annotations

import time

from jepsen import Lab

from rankd.engine.groups import SLOTS_PER_GROUP, slot_of
from respclient import RawClient

WRITES = 8


def _fresh_keys(port: int, peer_port: int, count: int) -> list[str]:
    """Keys of ``count`` distinct groups in the block of slots the node at
    ``port`` guesses it writes, once it sees its peer."""
    deadline = time.monotonic() + 15
    while f":{peer_port}@" not in (raw := RawClient(port).call("CLUSTER", "NODES").decode()):
        assert time.monotonic() < deadline, "the nodes never saw each other"
        time.sleep(0.2)
    ranges = [(int(lo), int(hi)) for line in raw.splitlines() if "myself" in line
              for lo, _, hi in (part.partition("-") for part in line.split()[8:])]
    keys: dict[int, str] = {}
    for n in range(100_000):
        key = f"cut-{n}"
        if any(lo <= slot_of(key) <= hi for lo, hi in ranges):
            keys.setdefault(slot_of(key) // SLOTS_PER_GROUP, key)
        if len(keys) == count:
            return list(keys.values())
    raise AssertionError("too few groups in the node's block")


def test_writes_to_guessed_groups_fail_fast_while_postgres_is_away(tmp_path, pg_server) -> None:
    lab = Lab(tmp_path, nodes=2, tcp=False)
    try:
        node = lab.daemons[0]
        keys = _fresh_keys(node.resp_port, lab.daemons[1].resp_port, WRITES)
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
