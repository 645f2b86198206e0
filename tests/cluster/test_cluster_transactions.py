"""RESP transactions on a cluster: a transaction's keys must be of one board
group (``CROSSSLOT`` otherwise, nothing applied); one group's transaction is
applied by its primary as one run of the group's log, which the other nodes
replay whole; a node that does not write the group answers ``TRYAGAIN``, as
it does for single writes."""

from __future__ import annotations

import time

from cluster_nodes import nodes, sql

from rankd.cluster.groups import group_of
from respclient import RawClient

# Two boards of one slot (so one group), and one of another group.
SAME, ALSO, OTHER = "alpha", "tx38395", "beta"
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
        with RawClient(other.resp_port) as reader:
            # The other node replays the transaction whole (its own copy:
            # a plain client's reads are relayed to the primary)...
            reader.call("READONLY")
            deadline = time.monotonic() + 15
            while reader.call("ZSCORE", ALSO, "b") != b"$1\r\n2\r\n":
                assert time.monotonic() < deadline, "not replicated"
                time.sleep(0.05)
            assert reader.call("ZSCORE", SAME, "a") == b"$1\r\n6\r\n"
        with RawClient(other.resp_port) as client:
            # ...and does not write the group: TRYAGAIN, nothing applied.
            replies = _transaction(client, ["ZINCRBY", SAME, "1", "a"])
            assert replies[-1].startswith(b"-TRYAGAIN "), replies
        with RawClient(primary.resp_port) as client:
            assert client.call("ZSCORE", SAME, "a") == b"$1\r\n6\r\n"


def _same_group(count: int) -> list[str]:
    """Names of ``SAME``'s slot (by its hash tag): a transaction's keys must
    share a slot, as on Redis Cluster."""
    return [f"{{{SAME}}}:tx-{n}" for n in range(count)]


def test_cluster_transaction_of_stores_deadlines_and_pops(tmp_path, pg_dsn):
    """An EXEC holding stores, deadlines and pops of one group goes to the
    group's log as one append, and the other node applies it whole; their
    keys count for CROSSSLOT, per slot as on Redis Cluster (the inputs of a
    store, the keys of ZMPOP),
    and a node that does not write the group answers TRYAGAIN."""
    src, dst, popped, doomed, nothing = _same_group(5)
    group = group_of(SAME)
    with nodes(tmp_path, pg_dsn, 2) as (primary, other):
        with RawClient(primary.resp_port) as client:
            assert client.call("ZADD", src, "1", "a", "2", "b", "3", "c") == b":3\r\n"
            assert client.call("ZADD", popped, "1", "x", "2", "y") == b":2\r\n"
            assert client.call("ZADD", doomed, "1", "z") == b":1\r\n"
            appends = sql(pg_dsn, "SELECT count(*) FROM rankd_log WHERE group_id = $1",
                          group)[0]["count"]
            replies = _transaction(
                client, ["ZINCRBY", src, "10", "a"], ["ZUNIONSTORE", dst, "2", src, SAME],
                ["EXPIRE", dst, "100000"], ["ZRANGESTORE", SAME, src, "0", "0"],
                ["BZPOPMIN", popped, "0"], ["ZMPOP", "2", nothing, popped, "MAX"],
                ["BZPOPMAX", popped, "0"], ["PEXPIREAT", doomed, "1"], ["PERSIST", src])
            assert replies[-1] == (b"*9\r\n$2\r\n11\r\n:3\r\n:1\r\n:1\r\n"
                                   b"*3\r\n$%d\r\n%s\r\n$1\r\nx\r\n$1\r\n1\r\n"
                                   % (len(popped), popped.encode())
                                   + b"*2\r\n$%d\r\n%s\r\n*1\r\n*2\r\n$1\r\ny\r\n$1\r\n2\r\n"
                                   % (len(popped), popped.encode())
                                   + b"*-1\r\n:1\r\n:0\r\n"), replies[-1]
            assert sql(pg_dsn, "SELECT count(*) FROM rankd_log WHERE group_id = $1",
                       group)[0]["count"] == appends + 1, "not one append"
            stored = client.call("ZRANGE", dst, "0", "-1", "WITHSCORES")
            assert stored == (b"*6\r\n$1\r\nb\r\n$1\r\n2\r\n$1\r\nc\r\n$1\r\n3\r\n"
                              b"$1\r\na\r\n$2\r\n11\r\n")
            # Keys of two slots, counted by numkeys: refused when queued (as
            # Redis Cluster does), so the whole transaction is.
            for words in (["ZUNIONSTORE", dst, "2", src, OTHER],
                          ["ZMPOP", "2", src, OTHER, "MIN"], ["ZINTERSTORE", OTHER, "1", src]):
                replies = _transaction(client, ["EXPIRE", src, "5000"], words)
                assert replies[-2:] == [
                    b"-CROSSSLOT Keys in request don't hash to the same slot\r\n",
                    b"-EXECABORT Transaction discarded because of previous errors.\r\n"]
            # Commands of two slots, each of one: refused at EXEC.
            replies = _transaction(client, ["EXPIRE", src, "5000"], ["EXPIRE", OTHER, "5"])
            assert replies[-1] == b"-CROSSSLOT Keys in request don't hash to the same slot\r\n"
            assert client.call("TTL", src) == b":-1\r\n"
        with RawClient(other.resp_port) as reader:
            reader.call("READONLY")  # (its own copy: plain reads are relayed)
            deadline = time.monotonic() + 15
            while reader.call("ZRANGE", dst, "0", "-1", "WITHSCORES") != stored:
                assert time.monotonic() < deadline, "not replicated"
                time.sleep(0.05)
            assert reader.call("EXISTS", doomed) == b":0\r\n"
            assert 99_000 < int(reader.call("TTL", dst)[1:-2]) <= 100_000
            assert reader.call("ZRANGE", SAME, "0", "-1") == b"*1\r\n$1\r\nb\r\n"
            assert reader.call("EXISTS", popped) == b":0\r\n"
        with RawClient(other.resp_port) as client:
            replies = _transaction(client, ["EXPIRE", src, "100"])
            assert replies[-1].startswith(b"-TRYAGAIN "), replies
        digests = {d.request("GET", "/v1/admin/digest")[1]["digest"] for d in (primary, other)}
        assert len(digests) == 1
