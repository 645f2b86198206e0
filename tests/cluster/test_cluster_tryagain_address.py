"""A RESP ``-TRYAGAIN`` that names the node writing a key names it at its
RESP address (``host:port`` of its Redis port, as ``-MOVED`` does), while
REST's ``not_primary`` answer keeps naming its HTTP address."""

from __future__ import annotations

from cluster_nodes import nodes

from rankd.engine.errors import NotPrimary
from rankd.frontends.resp.context import error_text
from respclient import RawClient

BOARD = "alpha"


def test_resp_tryagain_names_the_primary_s_resp_address(tmp_path, pg_dsn):
    with nodes(tmp_path, pg_dsn, 2) as (primary, other):
        with RawClient(primary.resp_port) as client:
            assert client.call("ZADD", BOARD, "1", "a") == b":1\r\n"  # n0 takes its group
        with RawClient(other.resp_port) as client:
            # Inside MULTI nothing is relayed: the write is refused here.
            replies = client.pipeline([["MULTI"], ["ZINCRBY", BOARD, "1", "a"], ["EXEC"]])
        reply = replies[-1].decode()
        assert reply.startswith("-TRYAGAIN "), replies
        assert f"node n0 does, at 127.0.0.1:{primary.resp_port}" in reply, reply
        assert f":{primary.port}" not in reply, reply
        with RawClient(primary.resp_port) as client:
            assert client.call("ZSCORE", BOARD, "a") == b"$1\r\n1\r\n"  # nothing applied


def test_rest_keeps_the_http_address_and_resp_without_a_port_says_so():
    exc = NotPrimary("node n1 does not write group 3; node n0 does, at 10.0.0.1:8080",
                     "10.0.0.1:8080", "10.0.0.1:9090", primary_resp="10.0.0.1:6379")
    assert exc.message.endswith("at 10.0.0.1:8080")  # REST's answer
    assert error_text(exc).endswith("node n0 does, at 10.0.0.1:6379")
    exc.primary_resp = None
    assert error_text(exc) == ("TRYAGAIN node n1 does not write group 3; node n0 does, "
                               "which serves no RESP port this node knows of")
