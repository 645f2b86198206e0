"""A store command on a cluster: ``ZUNIONSTORE`` on the primary of its
destination's group replaces the destination whole, swapped in by one
record of the group's log (a large one built from parts logged before it),
and every node then holds exactly that; another node answers ``TRYAGAIN``
naming the primary and changes nothing."""

from __future__ import annotations

import select
import time
from urllib.parse import quote

import pytest
from jepsen import Lab

from rankd.engine.groups import slot_of
from rankd.frontends.resp.protocol import encode_request
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
            client.call("READONLY")  # (this node's copy, not relayed to the primary)
            while (answer := client.call(*words)) != expected:
                assert time.monotonic() < deadline, (daemon.resp_port, answer, expected)
                time.sleep(0.1)


def test_a_store_is_one_replicated_unit_on_its_primary(lab: Lab) -> None:
    dst = "weekly"
    sources = [f"{{{dst}}}:day-{n}" for n in range(2)]  # (one slot: a hash tag)
    assert len({slot_of(name) for name in (dst, *sources)}) == 1
    for name in (dst, *sources):
        status, made = lab.daemons[0].request("PUT", f"/v1/boards/{quote(name, safe='')}",
                                              REDIS_BOARD_DICT)
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
        other.call("CLUSTER", "SLOTS")  # (a cluster client: sent to the primary)
        assert other.call("ZUNIONSTORE", dst, "1", sources[0]).startswith(
            b"-MOVED %d " % slot_of(dst))
    _everywhere(lab, ["ZRANGE", dst, "0", "-1", "WITHSCORES"], stored)
    digests = {d.request("GET", "/v1/admin/digest")[1]["digest"]
               for d in lab.daemons}
    assert len(digests) == 1


def test_a_large_store_is_built_in_steps_and_swapped_in_on_every_node(lab: Lab) -> None:
    """A store of 30,000 members (refused before: 10,000 at most) goes to
    the group's log as parts and one record that swaps it in: every node
    ends with exactly the new board, and none ever shows part of it (a
    follower read while the store runs answers the old board or the new
    one whole)."""
    dst = "season"
    sources = [f"{{{dst}}}:week-{n}" for n in range(2)]  # (one slot: a hash tag)
    for name in (dst, *sources):
        status, made = lab.daemons[0].request("PUT", f"/v1/boards/{quote(name, safe='')}",
                                              REDIS_BOARD_DICT)
        assert status in (200, 201), made
    primary = lab.primary_of(dst)
    assert primary is not None
    follower = (primary + 1) % 3
    with RawClient(lab.daemons[primary].resp_port) as client:
        for key, offset in zip(sources, (0, 15_000), strict=True):
            for first in range(0, 15_000, 5_000):
                words = [w for i in range(first, first + 5_000)
                         for w in (str(i), f"p{offset + i}")]
                assert client.call("ZADD", key, *words) == b":5000\r\n"
        assert client.call("ZADD", dst, "1", "old", "2", "older") == b":2\r\n"
        _everywhere(lab, ["ZCARD", dst], b":2\r\n")
        with RawClient(lab.daemons[follower].resp_port) as reader:
            reader.call("READONLY")  # (the follower's copy)
            client.send(encode_request(["ZUNIONSTORE", dst, "2", *sources]))
            seen = set()
            while not client.buffer and not select.select([client.sock], [], [], 0)[0]:
                seen.add(reader.call("ZCARD", dst))
            assert client.reply() == b":30000\r\n"
            # (a follower lagging past --max-follow-lag, as on a loaded machine,
            # answers -TRYAGAIN: a retry, never a wrong answer)
            answers = {reply for reply in seen if not reply.startswith(b"-TRYAGAIN ")}
            assert answers <= {b":2\r\n", b":30000\r\n"}, seen
        stored = client.call("ZRANGE", dst, "0", "-1", "WITHSCORES")
    _everywhere(lab, ["ZRANGE", dst, "0", "-1", "WITHSCORES"], stored)
    digests = {d.request("GET", "/v1/admin/digest")[1]["digest"] for d in lab.daemons}
    assert len(digests) == 1
