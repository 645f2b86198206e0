"""A blocking pop on a cluster node woken by a write to its board: the
write wakes it once this node applied it, before the cluster's log
committed it; the pop waits for that commit and pops (as a read does),
never answers ``-TRYAGAIN`` for writes still on their way to the log.
Checked on a group the node already writes and on a fresh one (its first
write reads the group's register, then takes it), the pop and the write
on one node and with the write relayed from another."""

from __future__ import annotations

import threading
import time

import pytest
from cluster_nodes import keys_guessed_by, nodes

from respclient import RawClient


@pytest.fixture(scope="module")
def pair(tmp_path_factory, pg_server):
    with nodes(tmp_path_factory.mktemp("pops"), pg_server.create_database(), 2) as ds:
        # Until each node saw the other (its heartbeat: a round of a second).
        deadline = time.monotonic() + 15
        while b"127.0.0.1:%d" % ds[1].resp_port not in RawClient(ds[0].resp_port).call(
                "CLUSTER", "NODES"):
            assert time.monotonic() < deadline, "the nodes never saw each other"
            time.sleep(0.2)
        yield ds


@pytest.mark.parametrize("writer", [0, 1], ids=["write-here", "write-relayed"])
@pytest.mark.parametrize("fresh", [True, False], ids=["fresh-group", "held-group"])
def test_a_woken_blocking_pop_pops_the_member(pair, writer: int, fresh: bool) -> None:
    key = keys_guessed_by(pair[0].resp_port, pair[1].resp_port, f"pop-{writer}-{fresh}-", 1)[0]
    if not fresh:  # the node writes the group already
        assert RawClient(pair[0].resp_port).call("ZADD", key, "0", "warm") == b":1\r\n"
        assert RawClient(pair[0].resp_port).call("ZPOPMIN", key).startswith(b"*2\r\n")
    for round_ in range(3):
        member = f"m{round_}"

        def write(member: str = member) -> None:
            time.sleep(0.3)  # (the pop is blocked by then)
            assert RawClient(pair[writer].resp_port).call("ZADD", key, "5", member) == b":1\r\n"

        thread = threading.Thread(target=write)
        thread.start()
        popped = RawClient(pair[0].resp_port, timeout=15).call("BZPOPMIN", key, "10")
        thread.join()
        assert popped == b"*3\r\n$%d\r\n%s\r\n$2\r\n%s\r\n$1\r\n5\r\n" % (
            len(key), key.encode(), member.encode()), popped
        assert RawClient(pair[0].resp_port).call("ZCARD", key) == b":0\r\n"
