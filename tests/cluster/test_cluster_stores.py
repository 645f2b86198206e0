"""A store command on a cluster: ``ZUNIONSTORE`` on the primary of its
destination's group replaces the destination whole, as one unit of the
group's log, and every node then holds exactly that; another node answers
``TRYAGAIN`` naming the primary and changes nothing."""

from __future__ import annotations

import time

import pytest
from jepsen import Lab

from rankd.cluster.groups import group_of
from rankd.frontends.resp.sorted_sets import REDIS_BOARD_DICT
from respclient import RawClient


@pytest.fixture(scope="module")
def lab(tmp_path_factory, pg_server):
    lab = Lab(tmp_path_factory.mktemp("cluster-stores"), lease_seconds=2.0)
    try:
        yield lab
    finally:
        lab.close()


def _everywhere(lab: Lab, words: list[str], expected: bytes, timeout: float = 15.0) -> None:
    """Every node answers ``words`` with ``expected`` within ``timeout``."""
    deadline = time.monotonic() + timeout
    for daemon in lab.daemons:
        with RawClient(daemon.resp_port) as client:
            while (answer := client.call(*words)) != expected:
                assert time.monotonic() < deadline, (daemon.resp_port, answer, expected)
                time.sleep(0.1)


def test_a_store_is_one_replicated_unit_on_its_primary(lab: Lab) -> None:
    dst = "weekly"
    sources = [name for name in (f"day-{n}" for n in range(20_000))
               if group_of(name) == group_of(dst)][:2]
    assert len(sources) == 2
    for name in (dst, *sources):
        status, made = lab.daemons[0].request("PUT", f"/v1/boards/{name}", REDIS_BOARD_DICT)
        assert status == 201, made
    primary = lab.primary_of(dst)
    assert primary is not None
    with RawClient(lab.daemons[primary].resp_port) as client:
        assert client.call("ZADD", sources[0], "1", "a", "2", "b") == b":2\r\n"
        assert client.call("ZADD", sources[1], "10", "b", "20", "c") == b":2\r\n"
        assert client.call("ZADD", dst, "99", "old") == b":1\r\n"
        assert client.call("ZUNIONSTORE", dst, "2", *sources, "WEIGHTS", "1", "2") == b":3\r\n"
        stored = client.call("ZRANGE", dst, "0", "-1", "WITHSCORES")
    assert stored == (b"*6\r\n$1\r\na\r\n$1\r\n1\r\n$1\r\nb\r\n$2\r\n22\r\n"
                      b"$1\r\nc\r\n$2\r\n40\r\n")
    with RawClient(lab.daemons[(primary + 1) % 3].resp_port) as other:
        assert other.call("ZUNIONSTORE", dst, "1", sources[0]).startswith(b"-TRYAGAIN")
    _everywhere(lab, ["ZRANGE", dst, "0", "-1", "WITHSCORES"], stored)
    digests = {d.request("GET", "/v1/admin/digest")[1]["digest"]
               for d in lab.daemons}
    assert len(digests) == 1
