"""Blocking pops (``BZPOPMIN``, ``BZPOPMAX``, ``BZMPOP``) and
``ZRANDMEMBER`` beyond what one connection's replies show: clients blocked
on a board are served in arrival order, as by ``redis-server``; a write
through REST wakes them; timeouts answer a null array; a client that
leaves while blocked takes no member with it.  (Their replies and errors
are checked against ``redis-server`` in ``test_resp_aggregates``.)"""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from daemon import Daemon
from redisserver import RedisServer
from respclient import RawClient


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    redis = RedisServer()
    daemon = Daemon(tmp_path_factory.mktemp("resp-pops") / "data", "--fsync", "no")
    daemon.start()
    try:
        yield redis, daemon
    finally:
        daemon.stop()
        redis.stop()


def _blocked_in_order(port: int, commands: list[list[str]]) -> tuple[list[RawClient], list]:
    """Clients each sending one blocking command, a few ms apart (so they
    arrive in order); their replies are read by threads."""
    clients, replies, threads = [], [None] * len(commands), []
    for position, words in enumerate(commands):
        client = RawClient(port)
        clients.append(client)

        def wait(client=client, words=words, position=position) -> None:
            replies[position] = client.call(*words)
        thread = threading.Thread(target=wait)
        thread.start()
        threads.append(thread)
        time.sleep(0.05)
    return clients, (threads, replies)


def _served(port: int, writes: list[list[str]]) -> list[bytes]:
    commands = [["BZPOPMIN", "q", "5"], ["BZPOPMAX", "other", "q", "5"],
                ["BZMPOP", "5", "2", "q", "other", "MIN", "COUNT", "2"],
                ["BZPOPMIN", "q", "5"]]
    clients, (threads, replies) = _blocked_in_order(port, commands)
    with RawClient(port) as writer:
        for words in writes:
            writer.call(*words)
        for thread in threads:
            thread.join(10)
    for client in clients:
        client.close()
    return replies


def test_blocked_clients_are_served_in_arrival_order_as_by_redis(servers):
    redis, daemon = servers
    writes = [["ZADD", "q", "1", "a", "2", "b", "3", "c", "4", "d", "5", "e"]]
    expected = _served(redis.port, writes)
    assert expected == [b"*3\r\n$1\r\nq\r\n$1\r\na\r\n$1\r\n1\r\n",
                        b"*3\r\n$1\r\nq\r\n$1\r\ne\r\n$1\r\n5\r\n",
                        b"*2\r\n$1\r\nq\r\n*2\r\n*2\r\n$1\r\nb\r\n$1\r\n2\r\n"
                        b"*2\r\n$1\r\nc\r\n$1\r\n3\r\n",
                        b"*3\r\n$1\r\nq\r\n$1\r\nd\r\n$1\r\n4\r\n"]
    assert _served(daemon.resp_port, writes) == expected


def test_a_rest_write_wakes_a_blocked_pop_and_timeouts_answer_null(servers):
    _, daemon = servers
    status, _ = daemon.request("PUT", "/v1/boards/restq", {"order": "desc"})
    assert status in (200, 201)
    with RawClient(daemon.resp_port) as client:
        started = time.monotonic()
        assert client.call("BZPOPMAX", "restq", "0.2") == b"*-1\r\n"
        assert 0.15 < time.monotonic() - started < 2
        client.call("HELLO", "3")
        assert client.call("BZMPOP", "0.1", "1", "restq", "MAX") == b"_\r\n"
    clients, (threads, replies) = _blocked_in_order(daemon.resp_port,
                                                    [["BZPOPMAX", "restq", "0"]])
    status, _ = daemon.request("POST", "/v1/boards/restq/scores",
                               {"member": "ann", "score": 42})
    assert status == 200
    threads[0].join(10)
    clients[0].close()
    assert replies == [b"*3\r\n$5\r\nrestq\r\n$3\r\nann\r\n$2\r\n42\r\n"]


def test_a_client_that_leaves_while_blocked_takes_nothing(servers):
    _, daemon = servers
    with RawClient(daemon.resp_port) as leaving:
        leaving.send(b"*3\r\n$8\r\nBZPOPMIN\r\n$4\r\ngone\r\n$1\r\n0\r\n")
        time.sleep(0.1)
    time.sleep(0.1)
    clients, (threads, replies) = _blocked_in_order(daemon.resp_port,
                                                    [["BZPOPMIN", "gone", "5"]])
    with RawClient(daemon.resp_port) as writer:
        assert writer.call("ZADD", "gone", "1", "x") == b":1\r\n"
    threads[0].join(10)
    clients[0].close()
    assert replies == [b"*3\r\n$4\r\ngone\r\n$1\r\nx\r\n$1\r\n1\r\n"]


def test_zrandmember_samples_as_redis_does(servers):
    """Distinct members for a positive count, repeats for a negative one,
    every member reachable; on a board of 5,000 members, in steps."""
    _, daemon = servers
    with RawClient(daemon.resp_port) as client:
        words = [w for i in range(5_000) for w in (str(i), f"m{i}")]
        assert client.call("ZADD", "pool", *words) == b":5000\r\n"
        members = client.call("ZRANDMEMBER", "pool", "3000").split(b"\r\n")[2::2]
        assert len(members) == 3000 == len(set(members))
        repeated = client.call("ZRANDMEMBER", "pool", "-4000", "WITHSCORES")
        assert repeated.startswith(b"*8000\r\n")
        assert client.call("ZADD", "three", "1", "a", "2", "b", "3", "c") == b":3\r\n"
        seen = Counter(client.call("ZRANDMEMBER", "three") for _ in range(200))
        assert set(seen) == {b"$1\r\na\r\n", b"$1\r\nb\r\n", b"$1\r\nc\r\n"}
        assert client.call("ZRANDMEMBER", "pool", "-100001").startswith(
            b"-ERR rankd answers at most 100000 entries")


def test_info_counts_blocked_clients(servers):
    """INFO's ``blocked_clients`` counts the connections waiting in a
    blocking pop (what Redis's own tests wait for)."""
    _, daemon = servers
    clients, (threads, replies) = _blocked_in_order(
        daemon.resp_port, [["BZPOPMIN", "waiting", "5"], ["BZMPOP", "5", "1", "waiting", "MAX"]])
    with RawClient(daemon.resp_port) as client:
        assert b"blocked_clients:2\r\n" in client.call("INFO", "clients")
        assert client.call("ZADD", "waiting", "1", "a", "2", "b") == b":2\r\n"
        for thread in threads:
            thread.join(10)
        assert b"blocked_clients:0\r\n" in client.call("INFO", "clients")
    for other in clients:
        other.close()
    assert replies == [b"*3\r\n$7\r\nwaiting\r\n$1\r\na\r\n$1\r\n1\r\n",
                       b"*2\r\n$7\r\nwaiting\r\n*1\r\n*2\r\n$1\r\nb\r\n$1\r\n2\r\n"]
