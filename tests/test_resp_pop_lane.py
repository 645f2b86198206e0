"""Pipelined pops on the native path (``rankd.frontends.resp.pop_lane``):
what the scanner packs, and what the native removal must keep of the
general one.

The differential tests against Redis (``test_resp_pop_pipelines.py``) run
through this path; here: the scanner takes exactly the plain pops; the
native removal takes a member out of every window of a board and pops the
right end of a board in either order; pops it does not take (a board with
a deadline, another window) keep their place in the pipeline; and
``ZMPOP`` and blocking pops that find members share a pipeline's commits.
"""

from __future__ import annotations

import pytest

from daemon import Daemon
from redisserver import RedisClient, RedisServer
from respclient import RawClient
from test_resp_pop_pipelines import _metric

_scanner = pytest.importorskip("rankd.frontends.resp._scanner")


def _encode(words: list[str]) -> bytes:
    return b"*%d\r\n" % len(words) + b"".join(
        b"$%d\r\n%s\r\n" % (len(word.encode()), word.encode()) for word in words)


def test_the_scanner_packs_plain_pops_and_leaves_the_rest():
    """Runs of ``ZPOPMIN``/``ZPOPMAX key [count]`` (any case, a positive
    count as ``string2ll`` reads it) come out as one ``PackedPops`` each,
    between the runs of writes and reads; any other pop is left as words,
    for the general path to answer (or refuse) as Redis does."""
    plain = [["ZPOPMIN", "lb"], ["zpopmax", "lb", "3"], ["ZPopMin", "other", "12"]]
    left = [["ZPOPMIN", "lb", "0"], ["ZPOPMIN", "lb", "-1"], ["ZPOPMIN", "lb", "01"],
            ["ZPOPMIN", "lb", "+1"], ["ZPOPMIN", "lb", "x"], ["ZPOPMIN", "lb", "1", "2"],
            ["ZPOPMIN", "é"], ["ZPOPMIN", ".."], ["ZPOPMINX", "lb"]]
    commands = [*plain, ["ZADD", "lb", "1", "a"], ["ZPOPMAX", "lb"], ["ZSCORE", "lb", "a"],
                *left, ["ZPOPMIN", "lb"]]
    data = b"".join(_encode(words) for words in commands)
    items, end, error = _scanner.scan(data, 0, 1 << 20, 1 << 20, True)
    assert error is None and end == len(data)
    kinds = [type(item).__name__ for item in items]
    assert kinds == ["PackedPops", "Packed", "PackedPops", "PackedReads",
                     *["list"] * len(left), "PackedPops"]
    first = items[0]
    assert [first.source(i) for i in range(len(first))] == [_encode(w) for w in plain]
    assert [first.board(i) for i in range(3)] == ["lb", "lb", "other"]
    assert [first.highest(i) for i in range(3)] == [False, True, False]
    assert first.board_end(0) == 2 and first.board_end(2) == 3
    assert items[4:4 + len(left)] == [[w.encode() for w in words] for words in left]
    # Without packing (before AUTH, inside MULTI, with a monitor) nothing is packed.
    items, _, _ = _scanner.scan(data, 0, 1 << 20, 1 << 20, False)
    assert all(type(item) is list for item in items)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with Daemon(tmp_path_factory.mktemp("pop-lane") / "data", "--tcp-port", "0",
                "--fsync", "no") as running:
        yield running


def _top(daemon: Daemon, board: str, window: str) -> list[str]:
    status, page = daemon.request("GET", f"/v1/boards/{board}/top?window={window}&limit=100")
    assert status == 200, page
    return [entry["member"] for entry in page["entries"]]


@pytest.mark.parametrize("order", ["asc", "desc"])
def test_pops_remove_from_every_window_and_take_the_right_end(daemon, order):
    """On a REST board of two windows, in either order, pipelined pops take
    the lowest (ZPOPMIN) and highest (ZPOPMAX) scores, and what they pop is
    gone from both windows, as a REST removal would leave them."""
    board = f"windows-{order}"
    status, _ = daemon.request("PUT", f"/v1/boards/{board}",
                               {"order": order, "windows": ["all", "daily"]})
    assert status in (200, 201)
    for i in range(10):
        status, _ = daemon.request("POST", f"/v1/boards/{board}/scores",
                                   {"member": f"m{i}", "score": i})
        assert status == 200
    with RawClient(daemon.resp_port) as client:
        replies = client.pipeline([["ZPOPMIN", board], ["ZPOPMIN", board, "2"],
                                   ["ZPOPMAX", board], ["ZPOPMAX", board, "2"],
                                   ["ZCARD", board]])
        assert replies == [b"*2\r\n$2\r\nm0\r\n$1\r\n0\r\n",
                           b"*4\r\n$2\r\nm1\r\n$1\r\n1\r\n$2\r\nm2\r\n$1\r\n2\r\n",
                           b"*2\r\n$2\r\nm9\r\n$1\r\n9\r\n",
                           b"*4\r\n$2\r\nm8\r\n$1\r\n8\r\n$2\r\nm7\r\n$1\r\n7\r\n",
                           b":4\r\n"]
    left = {"m3", "m4", "m5", "m6"}
    for window in ("all", "daily"):
        assert set(_top(daemon, board, window)) == left, window


def test_pops_the_native_path_leaves_keep_their_place(daemon):
    """Pops on a board with a deadline (the general way) between pops on
    plain boards (the native way), with writes and reads among them: each
    sees what came before it, in the pipeline's order."""
    with RawClient(daemon.resp_port) as client:
        client.call("ZADD", "plain", "1", "a", "2", "b", "3", "c")
        client.call("ZADD", "timed", "1", "x", "2", "y", "3", "z")
        assert client.call("EXPIRE", "timed", "100") == b":1\r\n"
        replies = client.pipeline([["ZPOPMIN", "plain"], ["ZPOPMIN", "timed"],
                                   ["ZPOPMIN", "plain"], ["ZADD", "timed", "0", "w"],
                                   ["ZPOPMIN", "timed", "2"], ["ZPOPMAX", "plain"],
                                   ["ZRANGE", "timed", "0", "-1"], ["ZPOPMAX", "nosuch"]])
        assert replies == [b"*2\r\n$1\r\na\r\n$1\r\n1\r\n", b"*2\r\n$1\r\nx\r\n$1\r\n1\r\n",
                           b"*2\r\n$1\r\nb\r\n$1\r\n2\r\n", b":1\r\n",
                           b"*4\r\n$1\r\nw\r\n$1\r\n0\r\n$1\r\ny\r\n$1\r\n2\r\n",
                           b"*2\r\n$1\r\nc\r\n$1\r\n3\r\n", b"*1\r\n$1\r\nz\r\n", b"*0\r\n"]
        assert client.call("ZCARD", "plain") == b":0\r\n"
        assert client.call("TTL", "timed") != b":-1\r\n"  # (popped: its deadline stays)


def test_pipelined_zmpop_and_blocking_pops_share_their_commits(tmp_path):
    """Under ``--fsync always``, 600 pipelined ``ZMPOP``s and blocking pops
    that find members are acknowledged, in order, after a fraction of the
    fsyncs they would take if each awaited its own commit."""
    with (Daemon(tmp_path / "data", "--tcp-port", "0", "--fsync", "always") as daemon,
          RawClient(daemon.resp_port) as client):
        words = [w for i in range(2_000) for w in (str(i), f"m{i:04d}")]
        assert client.call("ZADD", "shared", *words) == b":2000\r\n"
        before = _metric(daemon, "rankd_wal_fsyncs")
        replies = client.pipeline([["ZMPOP", "2", "none", "shared", "MIN", "COUNT", "2"]] * 200
                                  + [["BZPOPMAX", "none", "shared", "1"]] * 200
                                  + [["BZMPOP", "1", "1", "shared", "MIN"]] * 200)
        fsyncs = _metric(daemon, "rankd_wal_fsyncs") - before
        assert replies[0] == (b"*2\r\n$6\r\nshared\r\n*2\r\n*2\r\n$5\r\nm0000\r\n$1\r\n0\r\n"
                              b"*2\r\n$5\r\nm0001\r\n$1\r\n1\r\n")
        assert replies[200] == b"*3\r\n$6\r\nshared\r\n$5\r\nm1999\r\n$4\r\n1999\r\n"
        assert replies[400] == b"*2\r\n$6\r\nshared\r\n*1\r\n*2\r\n$5\r\nm0400\r\n$3\r\n400\r\n"
        assert client.call("ZCARD", "shared") == b":1200\r\n"
    # Group commit: each fsync covers what queued while the one before ran,
    # so the count follows the disk's speed and the machine's load (19-22
    # here when quiet, 35 with two busy cores, 41 on a loaded CI run); one
    # commit each would be 600.
    assert fsyncs <= 120, fsyncs


@pytest.fixture(scope="module")
def redis_port():
    redis = RedisServer()
    try:
        yield redis.port
    finally:
        redis.stop()


@pytest.mark.parametrize("protocol", [2, 3])
def test_pops_of_many_members_answer_as_redis_in_steps(daemon, redis_port, protocol):
    """A pipeline of pops removing 30,000 members (a run is answered
    10,000 members at a time, the loop free between) gets Redis's replies,
    in order, and leaves what Redis leaves."""
    fill = [w for i in range(30_000) for w in (str(i % 1_009), f"p{i:05d}")]
    commands = [["ZPOPMIN" if i % 3 else "ZPOPMAX", "many", "2300"] for i in range(12)]
    commands += [["ZPOPMAX", "many"], ["ZPOPMIN", "many", "7"]] * 100 + [["ZCARD", "many"]]
    with RedisClient(redis_port) as redis, RawClient(daemon.resp_port) as rankd:
        for client in (redis, rankd):
            if protocol == 3:
                client.call("HELLO", "3")
            client.call("DEL", "many")
            for start in range(0, len(fill), 10_000):
                client.call("ZADD", "many", *fill[start:start + 10_000])
        assert rankd.pipeline(commands) == redis.pipeline(commands)
        words = ["ZRANGE", "many", "0", "-1", "WITHSCORES"]
        assert rankd.call(*words) == redis.call(*words)
