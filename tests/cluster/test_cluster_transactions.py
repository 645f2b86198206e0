"""RESP transactions on a cluster: a transaction's keys must be of one board
group (``CROSSSLOT`` otherwise, nothing applied); one group's transaction is
applied by its primary as one run of the group's log, which the other nodes
replay whole; a node that does not write the group answers ``TRYAGAIN``, as
it does for single writes."""

from __future__ import annotations

import time

from cluster_nodes import nodes

from rankd.cluster.groups import group_of
from respclient import RawClient

# Two boards of one group, and one of another.
SAME, ALSO, OTHER = "alpha", "tx710", "beta"
assert group_of(SAME) == group_of(ALSO) != group_of(OTHER)


def _transaction(client: RawClient, *commands: list[str]) -> list[bytes]:
    return client.pipeline([["MULTI"], *commands, ["EXEC"]])


def test_cluster_transactions(tmp_path, pg_dsn):
    with nodes(tmp_path, pg_dsn, 2) as (primary, other):
        with RawClient(primary.resp_port) as client:
            replies = _transaction(client, ["ZADD", SAME, "1", "a"], ["ZADD", ALSO, "2", "b"],
                                   ["ZINCRBY", SAME, "5", "a"], ["ZSCORE", ALSO, "b"])
            assert replies[-1] == b"*4\r\n:1\r\n:1\r\n$1\r\n6\r\n$1\r\n2\r\n", replies
            # Keys of two groups: refused whole.
            replies = _transaction(client, ["ZINCRBY", SAME, "1", "a"],
                                   ["ZADD", OTHER, "1", "x"])
            assert replies[-1] == b"-CROSSSLOT Keys in request don't hash to the same slot\r\n"
            assert client.call("ZSCORE", SAME, "a") == b"$1\r\n6\r\n"
            assert client.call("EXISTS", OTHER) == b":0\r\n"
        with RawClient(other.resp_port) as client:
            # The other node replays the transaction whole...
            deadline = time.monotonic() + 15
            while client.call("ZSCORE", ALSO, "b") != b"$1\r\n2\r\n":
                assert time.monotonic() < deadline, "not replicated"
                time.sleep(0.05)
            assert client.call("ZSCORE", SAME, "a") == b"$1\r\n6\r\n"
            # ...and does not write the group: TRYAGAIN, nothing applied.
            replies = _transaction(client, ["ZINCRBY", SAME, "1", "a"])
            assert replies[-1].startswith(b"-TRYAGAIN "), replies
        with RawClient(primary.resp_port) as client:
            assert client.call("ZSCORE", SAME, "a") == b"$1\r\n6\r\n"
