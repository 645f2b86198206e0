"""Blocking pops (``BZPOPMIN``, ``BZPOPMAX``, ``BZMPOP``) with real blocked
clients, each scenario run on ``redis-server`` and on rankd and their
transcripts compared byte for byte: Redis's own ``unit/type/zset`` blocking
tests, wake-ups by every kind of write, several keys, arrival order,
timeouts; random runs of writes (``MULTI``/``EXEC`` included) against
several blocked connections; and what a client that leaves, or a timeout
as Redis 7.2 reads it, leaves behind.

Every wait is bounded: sockets time out after 5 s, and a scenario waits for
its clients to block by ``INFO``'s ``blocked_clients``, as Redis's tests do.
"""

from __future__ import annotations

import os
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daemon import Daemon
from rankd.frontends.resp.protocol import encode_request
from redisserver import RedisClient, RedisServer
from respclient import RawClient

#: Examples of the random runs, a third of the other differential tests'
#: (each run blocks clients on both servers): 100, or 1,666 in the long form
#: (RANKD_RESP_EXAMPLES=5000).
EXAMPLES = max(1, int(os.environ.get("RANKD_RESP_EXAMPLES", "300")) // 3)
WAIT_SECONDS = 5.0


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    redis = RedisServer()
    daemon = Daemon(tmp_path_factory.mktemp("resp-blocking") / "data", "--fsync", "no")
    daemon.start()
    try:
        yield redis.port, daemon.resp_port
    finally:
        daemon.stop()
        redis.stop()


def _blocked(client: RawClient) -> int:
    info = client.call("INFO", "clients")
    line = next(line for line in info.split(b"\r\n") if line.startswith(b"blocked_clients:"))
    return int(line.split(b":")[1])


def _wait_blocked(client: RawClient, count: int) -> bool:
    """Whether ``count`` clients are blocked within :data:`WAIT_SECONDS`
    (Redis's tests' ``wait_for_blocked_clients_count``)."""
    deadline = time.monotonic() + WAIT_SECONDS
    while _blocked(client) != count:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def run(port: int, steps: list[tuple], reference: bool) -> list:
    """Run a scenario: ``("call", who, *words)`` answers at once (``"do"``:
    its reply left out of the transcript), ``("send", who, *words)`` leaves
    a command waiting, ``("read", who)`` reads its reply, ``("blocked", n)``
    waits for n blocked clients, ``("sleep", s)``.
    Its transcript: each reply, and whether each wait was met."""
    clients: dict[str, RawClient] = {}
    transcript: list = []
    make = RedisClient if reference else RawClient
    try:
        for kind, *rest in steps:
            if kind == "blocked":
                transcript.append(("blocked", rest[0], _wait_blocked(clients["w"], rest[0])))
                continue
            if kind == "sleep":
                time.sleep(rest[0])
                continue
            who, *words = rest
            client = clients.get(who)
            if client is None:
                client = clients[who] = make(port, timeout=WAIT_SECONDS)
            if kind == "send":
                client.send(encode_request(words))
            elif kind == "call":
                transcript.append((who, client.call(*words)))
            elif kind == "do":
                client.call(*words)
            else:
                transcript.append((who, client.reply()))
    finally:
        for client in clients.values():
            client.close()
    return transcript


def _same(servers, steps: list[tuple]) -> list:
    expected = run(servers[0], [("call", "w", "FLUSHALL"), *steps], reference=True)
    assert all(entry[2] for entry in expected if entry[0] == "blocked"), expected
    assert run(servers[1], [("call", "w", "FLUSHALL"), *steps], reference=False) == expected
    return expected


def _pop(pop: str, key: str, timeout: str = "0") -> list[str]:
    """Redis's tests' ``bzpop_command``: BZPOPMIN, or BZMPOP ... MIN COUNT 1."""
    if pop == "BZMPOP":
        return ["BZMPOP", timeout, "1", key, "MIN", "COUNT", "1"]
    return [pop, key, timeout]


# --- Redis's own tests (unit/type/zset, 7.2.4), each as a scenario ---------------------

@pytest.mark.parametrize("pop", ["BZPOPMIN", "BZMPOP"])
def test_zadd_then_del_in_one_exec_does_not_wake(servers, pop):
    """``$pop, ZADD + DEL should not awake blocked client``."""
    replies = _same(servers, [
        ("send", "b", *_pop(pop, "zset")), ("blocked", 1),
        ("call", "w", "MULTI"), ("call", "w", "ZADD", "zset", "0", "foo"),
        ("call", "w", "DEL", "zset"), ("call", "w", "EXEC"),
        ("call", "w", "DEL", "zset"), ("call", "w", "ZADD", "zset", "1", "bar"), ("read", "b")])
    assert b"bar" in replies[-1][1]


def test_the_same_key_named_several_times(servers):
    """``BZPOPMIN with same key multiple times should work``."""
    keys = ["z1{t}", "z2{t}", "z2{t}", "z1{t}"]
    _same(servers, [
        ("send", "b", "BZPOPMIN", *keys, "0"), ("blocked", 1),
        ("call", "w", "ZADD", "z1{t}", "0", "a"), ("read", "b"),
        ("send", "b", "BZPOPMIN", *keys, "0"), ("blocked", 1),
        ("call", "w", "ZADD", "z2{t}", "1", "b"), ("read", "b"),
        ("call", "w", "ZADD", "z1{t}", "0", "a"), ("call", "w", "ZADD", "z2{t}", "1", "b"),
        ("call", "b", "BZPOPMIN", *keys, "0"), ("call", "b", "BZPOPMIN", *keys, "0")])


@pytest.mark.parametrize("pop", ["BZPOPMIN", "BZMPOP"])
def test_an_exec_wakes_once_it_is_whole(servers, pop):
    """``MULTI/EXEC is isolated from the point of view of $pop``: the
    client pops the lowest of the three members the EXEC added."""
    _same(servers, [
        ("send", "b", *_pop(pop, "zset")), ("blocked", 1), ("call", "w", "MULTI"),
        *[("call", "w", "ZADD", "zset", score, member) for score, member
          in (("0", "a"), ("1", "b"), ("2", "c"))],
        ("call", "w", "EXEC"), ("read", "b")])


@pytest.mark.parametrize("pop", ["BZPOPMIN", "BZMPOP"])
def test_a_variadic_zadd_wakes_one_pop(servers, pop):
    """``$pop with variadic ZADD``."""
    _same(servers, [
        ("send", "b", *_pop(pop, "zset")), ("blocked", 1),
        ("call", "w", "ZADD", "zset", "-1", "foo", "1", "bar"), ("read", "b"),
        ("call", "w", "ZRANGE", "zset", "0", "-1")])


def test_bzmpop_with_several_blocked_clients(servers):
    """``BZMPOP with multiple blocked clients``: four clients on two keys,
    one EXEC filling both, each served in turn from the first key with
    members."""
    keys = ["2", "myzset{t}", "myzset2{t}"]
    members = ["1", "a", "2", "b", "3", "c", "4", "d", "5", "e"]
    _same(servers, [
        ("send", "c1", "BZMPOP", "0", *keys, "min", "count", "1"), ("blocked", 1),
        ("send", "c2", "BZMPOP", "0", *keys, "max", "count", "10"), ("blocked", 2),
        ("send", "c3", "BZMPOP", "0", *keys, "min", "count", "10"), ("blocked", 3),
        ("send", "c4", "BZMPOP", "0", *keys, "max", "count", "1"), ("blocked", 4),
        ("call", "w", "MULTI"), ("call", "w", "ZADD", "myzset{t}", *members),
        ("call", "w", "ZADD", "myzset2{t}", *members), ("call", "w", "EXEC"),
        ("read", "c1"), ("read", "c2"), ("read", "c3"),
        ("call", "w", "ZADD", "myzset2{t}", *members[:6]), ("read", "c4")])


def test_arguments_that_are_not_keys_do_not_wake(servers):
    """``BZMPOP should not blocks on non key arguments - #10762``."""
    _same(servers, [
        ("send", "c1", "BZMPOP", "0", "1", "myzset", "min", "count", "10"), ("blocked", 1),
        ("send", "c2", "BZMPOP", "0", "2", "myzset2", "myzset3", "max", "count", "10"),
        ("blocked", 2),
        *[("call", "w", "ZADD", key, "1", "m") for key in ("0", "1", "min", "max", "count",
                                                           "10")],
        ("blocked", 2), ("call", "w", "ZADD", "myzset", "1", "zset"),
        ("call", "w", "ZADD", "myzset3", "1", "zset3"), ("read", "c1"), ("read", "c2")])


# --- wake-ups, keys, order ----------------------------------------------------------------

WAKING_WRITES = {
    "zincrby": [("call", "w", "ZINCRBY", "k", "5", "m")],
    "zadd incr": [("call", "w", "ZADD", "k", "INCR", "2.5", "m")],
    "a store into the key": [("call", "w", "ZADD", "s", "1", "a", "2", "b"),
                             ("call", "w", "ZUNIONSTORE", "k", "2", "s", "missing")],
    "zrangestore": [("call", "w", "ZADD", "s", "1", "a", "2", "b", "3", "c"),
                    ("call", "w", "ZRANGESTORE", "k", "s", "1", "-1")],
    "an exec leaving members": [("call", "w", "MULTI"), ("call", "w", "ZADD", "k", "1", "a"),
                                ("call", "w", "ZADD", "k", "2", "b"),
                                ("call", "w", "ZREM", "k", "a"), ("call", "w", "EXEC")],
    "deleted and made again": [("call", "w", "DEL", "k"), ("call", "w", "ZADD", "k", "7", "z")],
}


@pytest.mark.parametrize("pop", ["BZPOPMIN", "BZPOPMAX", "BZMPOP"])
@pytest.mark.parametrize("write", sorted(WAKING_WRITES))
def test_every_write_that_gives_the_key_members_wakes(servers, write, pop):
    steps = WAKING_WRITES[write]
    replies = _same(servers, [("send", "b", *_pop(pop, "k")), ("blocked", 1), *steps,
                              ("read", "b"), ("call", "w", "ZRANGE", "k", "0", "-1",
                                              "WITHSCORES")])
    assert replies[-2][1].startswith(b"*")


NOT_WAKING_WRITES = {
    "an exec adding then removing": [
        ("call", "w", "MULTI"), ("call", "w", "ZADD", "k", "1", "a"),
        ("call", "w", "ZREM", "k", "a"), ("call", "w", "EXEC")],
    "an exec adding then popping": [
        ("call", "w", "MULTI"), ("call", "w", "ZADD", "k", "1", "a"),
        ("call", "w", "ZPOPMIN", "k"), ("call", "w", "EXEC")],
    "an empty store": [("call", "w", "ZRANGESTORE", "k", "missing", "0", "-1")],
    "zadd xx": [("call", "w", "ZADD", "k", "XX", "1", "a")],
    "another key": [("call", "w", "ZADD", "k2", "1", "a")],
}


@pytest.mark.parametrize("write", sorted(NOT_WAKING_WRITES))
def test_writes_that_leave_the_key_empty_do_not_wake(servers, write):
    """The client stays blocked (counted by INFO) and is served by the
    next write that gives the key members."""
    _same(servers, [("send", "b", "BZPOPMIN", "k", "0"), ("blocked", 1),
                    *NOT_WAKING_WRITES[write], ("sleep", 0.05), ("blocked", 1),
                    ("call", "w", "ZADD", "k", "3", "c"), ("read", "b")])


def test_a_client_on_several_keys_is_served_by_the_one_that_gets_members(servers):
    _same(servers, [
        ("send", "b", "BZPOPMIN", "k1", "k2", "k3", "0"), ("blocked", 1),
        ("call", "w", "ZADD", "k3", "1", "x"), ("read", "b"),
        ("send", "b", "BZMPOP", "0", "3", "k1", "k2", "k3", "MAX", "COUNT", "5"), ("blocked", 1),
        ("call", "w", "ZADD", "k2", "1", "y", "2", "z"), ("read", "b")])


def test_clients_of_a_key_are_served_in_arrival_order(servers):
    """Five clients, one key: one ZADD of three members serves the first
    three, the next ZADD the others, each as it arrived."""
    commands = [["BZPOPMIN", "q", "0"], ["BZPOPMAX", "q", "other", "0"],
                ["BZMPOP", "0", "2", "other", "q", "MIN", "COUNT", "2"],
                ["BZPOPMIN", "q", "0"], ["BZMPOP", "0", "1", "q", "MAX"]]
    steps: list[tuple] = []
    for number, words in enumerate(commands):
        steps += [("send", f"c{number}", *words), ("blocked", number + 1)]
    steps += [("call", "w", "ZADD", "q", "1", "a", "2", "b", "3", "c", "4", "d"),
              *[("read", f"c{number}") for number in range(3)],
              ("call", "w", "ZADD", "q", "5", "e", "6", "f"), ("read", "c3"), ("read", "c4")]
    _same(servers, steps)


def test_one_connection_blocks_one_command_at_a_time(servers):
    """What a blocked connection pipelined after its pop waits behind it,
    so a connection is one blocked client whatever it sent."""
    _same(servers, [
        ("send", "b", "BZPOPMIN", "k", "0"), ("send", "b", "BZPOPMAX", "k", "0"),
        ("send", "b", "ZCARD", "k"), ("blocked", 1), ("sleep", 0.05), ("blocked", 1),
        ("call", "w", "ZADD", "k", "1", "a", "2", "b", "3", "c"),
        ("read", "b"), ("read", "b"), ("read", "b")])


@pytest.mark.parametrize("protocol", ["2", "3"])
def test_replies_and_timeouts_in_both_protocols(servers, protocol):
    _same(servers, [
        ("do", "b", "HELLO", protocol), ("call", "b", "BZPOPMIN", "k", "0.01"),
        ("call", "b", "BZMPOP", "0.02", "1", "k", "MAX"),
        ("send", "b", "BZPOPMAX", "k", "0"), ("blocked", 1),
        ("call", "w", "ZADD", "k", "1.5", "a", "-2", "b"), ("read", "b"),
        ("send", "b", "BZMPOP", "0", "1", "k2", "MIN", "COUNT", "3"), ("blocked", 1),
        ("call", "w", "ZADD", "k2", "2.25", "c", "-0.5", "d"), ("read", "b")])


# --- timeouts -----------------------------------------------------------------------------

def test_a_timeout_below_a_millisecond_is_one(servers):
    """Redis rounds a timeout up to a whole millisecond (``ceill``): 0.0001
    waits 1 ms and answers null; it is not 0, which waits for ever."""
    for port, reference in ((servers[0], True), (servers[1], False)):
        with (RedisClient if reference else RawClient)(port, timeout=WAIT_SECONDS) as client:
            started = time.monotonic()
            assert client.call("BZPOPMIN", "none", "0.0001") == b"*-1\r\n"
            assert client.call("BZMPOP", "1e-400", "1", "none", "MIN") == b"*-1\r\n"
            assert time.monotonic() - started < 1


#: Timeouts whose reading Redis 7.0 and 7.2 share, each sent to a key with
#: members (popped at once if the timeout is accepted).
SHARED_TIMEOUTS = ["0", "0.5", "-0", "-0.001", "-0.0009", "-0.00099999999999999999",
                   "-0.0010000000000000000001", "-1", "-1e400", "-inf", "0x10", "0x1p-10",
                   ".5", "5.", "+1", "00001", "1e-400", "1e3", "9223370000000000", "nan",
                   "-nan", "1_0", "0b1", "1e", " 1", "1 ", "", "x", "1" * 5200, "1e4933",
                   "1e99999999999", "-1e-99999999999", "0x1p99999999999", "0x1p-99999999999"]


def test_timeouts_are_read_as_redis_reads_them(servers):
    steps: list[tuple] = []
    for word in SHARED_TIMEOUTS:
        steps += [("call", "w", "ZADD", "k", "1", "a"), ("call", "w", "BZPOPMIN", "k", word),
                  ("call", "w", "ZADD", "k", "1", "a"),
                  ("call", "w", "BZMPOP", word, "1", "k", "MIN")]
    _same(servers, steps)


#: Timeouts Redis 7.2 reads otherwise than 7.0 (which casts an out-of-range
#: value to a negative one, and lets a deadline overflow): Redis 7.2.4's
#: replies, taken from it.
REDIS_72_TIMEOUTS = {
    "inf": "ERR timeout is out of range", "+inf": "ERR timeout is out of range",
    "1e400": "ERR timeout is out of range", "0x1p80": "ERR timeout is out of range",
    "1e16": "ERR timeout is out of range",
    "9223372036854775": "ERR timeout is out of range",
    "9223372036854775.807": "ERR timeout is out of range",
    "9223370300000000": "ERR timeout is out of range",
    "9223370000000000": None,
}


def test_timeouts_out_of_range_answer_as_redis_72(servers):
    with RawClient(servers[1]) as client:
        for word, error in REDIS_72_TIMEOUTS.items():
            client.call("ZADD", "k", "1", "a")
            expected = b"-%s\r\n" % error.encode() if error else b"*3\r\n$1\r\nk\r\n"
            assert client.call("BZPOPMIN", "k", word).startswith(expected), word
            client.call("ZADD", "k", "1", "a")
            expected = b"-%s\r\n" % error.encode() if error else b"*2\r\n$1\r\nk\r\n"
            assert client.call("BZMPOP", word, "1", "k", "MIN").startswith(expected), word


# --- pops with odd counts ------------------------------------------------------------------

POP_COUNTS = ["0", "-1", "-3", "1", "2", "10", "x", "1.5", "+1", "9223372036854775807",
              "9223372036854775808", "-9223372036854775808"]


@pytest.mark.parametrize("protocol", ["2", "3"])
def test_pops_with_zero_negative_and_large_counts_answer_as_redis(servers, protocol):
    """What Redis's ``$pop with the count 0 returns an empty array`` and
    ``$pop with negative count`` check (but on a key of this server's only
    type), on a missing key and on one with members."""
    steps: list[tuple] = [("do", "w", "HELLO", protocol)]
    for count in POP_COUNTS:
        for key in ("missing", "zset"):
            steps += [("do", "w", "ZADD", "zset", "1", "a", "2", "b", "3", "c"),
                      ("call", "w", "ZPOPMIN", key, count), ("call", "w", "ZPOPMAX", key, count),
                      ("call", "w", "ZMPOP", "1", key, "MIN", "COUNT", count),
                      ("call", "w", "BZMPOP", "0.01", "1", key, "MAX", "COUNT", count)]
    steps += [("call", "w", "ZPOPMIN", "zset"), ("call", "w", "ZPOPMIN", "missing"),
              ("call", "w", "ZPOPMIN", "zset", "1", "2"), ("call", "w", "ZCARD", "zset")]
    _same(servers, steps)


# --- what a blocked client leaves behind --------------------------------------------------

def test_a_client_that_closes_while_blocked_leaves_at_once(servers):
    """INFO counts it no more right after it closed (Redis's tests wait on
    that count), and the next write goes to the client behind it."""
    port = servers[1]
    with RawClient(port) as writer:
        leaving = []
        for number in range(3):
            client = RawClient(port)
            client.send(encode_request(["BZPOPMIN", "gone", "0"]))
            leaving.append(client)
            assert _wait_blocked(writer, number + 1)
            time.sleep(0.03)
        with RawClient(port) as staying:
            staying.send(encode_request(["BZPOPMIN", "gone", "0"]))
            assert _wait_blocked(writer, 4)
            for client in leaving:
                client.close()
            time.sleep(0.1)
            assert _blocked(writer) == 1
            assert writer.call("ZADD", "gone", "1", "x") == b":1\r\n"
            assert staying.reply() == b"*3\r\n$4\r\ngone\r\n$1\r\nx\r\n$1\r\n1\r\n"
        assert _wait_blocked(writer, 0)


def test_clients_one_commit_wakes_are_served_in_the_order_they_blocked(servers):
    """One EXEC fills two keys: the client that blocked first (on one of
    them) is served first, whatever the order of the boards in the commit
    (Redis 7.0 serves them so here too); the other pops the other key."""
    port = servers[1]
    for pair in range(6):
        first, second = f"a{pair}", f"b{pair}"
        with RawClient(port) as writer, RawClient(port) as early, RawClient(port) as late:
            writer.call("DEL", first, second)
            early.send(encode_request(["BZPOPMIN", first, "0"]))
            assert _wait_blocked(writer, 1)
            late.send(encode_request(["BZPOPMIN", first, second, "0"]))
            assert _wait_blocked(writer, 2)
            replies = writer.pipeline([["MULTI"], ["ZADD", second, "1", "x"],
                                       ["ZADD", first, "1", "y"], ["EXEC"]])
            assert replies[-1] == b"*2\r\n:1\r\n:1\r\n"
            assert early.reply() == b"*3\r\n$2\r\n%s\r\n$1\r\ny\r\n$1\r\n1\r\n" % first.encode()
            assert late.reply() == b"*3\r\n$2\r\n%s\r\n$1\r\nx\r\n$1\r\n1\r\n" % second.encode()


# --- random runs ----------------------------------------------------------------------------

KEYS = ["k1", "k2", "k3"]
MEMBERS = ["a", "b", "c", "d"]
SCORES = ["1", "2", "-1", "0.5", "3"]


@st.composite
def write(draw) -> list[list[str]]:
    """One write, or a MULTI ... EXEC of a few (stores outside: they are
    not queued in a transaction yet)."""
    def one(stores: bool) -> list[str]:
        key = draw(st.sampled_from(KEYS))
        pairs = draw(st.lists(st.tuples(st.sampled_from(SCORES), st.sampled_from(MEMBERS)),
                              min_size=1, max_size=3))
        return draw(st.sampled_from([
            ["ZADD", key, *[w for pair in pairs for w in pair]],
            ["ZINCRBY", key, pairs[0][0], pairs[0][1]],
            ["ZREM", key, pairs[0][1]], ["ZPOPMIN", key], ["DEL", key],
            *([["ZUNIONSTORE", key, "2", *draw(st.lists(st.sampled_from(KEYS), min_size=2,
                                                        max_size=2))],
               ["ZRANGESTORE", key, draw(st.sampled_from(KEYS)), "0", "1"]] if stores else [])]))
    if draw(st.integers(0, 3)):
        return [one(stores=True)]
    return [["MULTI"], *[one(stores=False) for _ in range(draw(st.integers(1, 4)))], ["EXEC"]]


@st.composite
def blocking_run(draw) -> tuple[list[list[str]], list[list[list[str]]]]:
    """Clients blocked on one key each (on one key Redis 7.0 and 7.2 serve
    alike), then writes."""
    waiters = []
    for _ in range(draw(st.integers(1, 4))):
        key = draw(st.sampled_from(KEYS))
        waiters.append(draw(st.sampled_from([
            ["BZPOPMIN", key, "0"], ["BZPOPMAX", key, "0"],
            ["BZMPOP", "0", "1", key, draw(st.sampled_from(["MIN", "MAX"])), "COUNT",
             draw(st.sampled_from(["1", "2", "3"]))]])))
    return waiters, draw(st.lists(write(), min_size=1, max_size=6))


def _random_run(port: int, reference: bool, waiters: list[list[str]],
                writes: list[list[list[str]]], counts: list[int] | None) -> tuple[list, list]:
    """The transcript of a random run, and the blocked count after each
    write (on the reference; rankd's is waited for, so the next write
    comes after the pops the last one caused, as in Redis)."""
    make = RedisClient if reference else RawClient
    transcript: list = []
    seen: list[int] = []
    with make(port, timeout=WAIT_SECONDS) as writer:
        writer.call("FLUSHALL")
        clients = []
        try:
            for number, words in enumerate(waiters):
                clients.append(make(port, timeout=WAIT_SECONDS))
                clients[-1].send(encode_request(words))
                assert _wait_blocked(writer, number + 1)
            for step, commands in enumerate(writes):
                transcript.append(writer.pipeline(commands))
                if counts is None:
                    seen.append(_blocked(writer))
                else:
                    _wait_blocked(writer, counts[step])
            # Members enough for every client still blocked, then every reply.
            for key in KEYS:
                writer.call("ZADD", key, *[w for n in range(12) for w in (str(100 + n), f"r{n}")])
            assert _wait_blocked(writer, 0)
            transcript += [client.reply() for client in clients]
            transcript += [writer.call("ZRANGE", key, "0", "-1", "WITHSCORES") for key in KEYS]
        finally:
            for client in clients:
                client.close()
    return transcript, seen


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(run_=blocking_run())
def test_random_writes_serve_blocked_clients_as_redis_does(servers, run_):
    waiters, writes = run_
    expected, counts = _random_run(servers[0], True, waiters, writes, None)
    answered, _ = _random_run(servers[1], False, waiters, writes, counts)
    assert answered == expected, (waiters, writes)


def test_blocked_clients_are_bounded_and_a_stopping_daemon_closes_them_at_once(tmp_path):
    """One blocked client per connection, so at most ``--max-connections``
    (a connection past the cap is refused, blocked ones included in it);
    and a client blocked without timeout does not hold a shutdown for the
    grace period (10 s) that queued requests get: it is closed at once, as
    Redis's shutdown closes it, with no reply."""
    daemon = Daemon(tmp_path / "data", "--fsync", "no", "--max-connections", "3")
    daemon.start()
    try:
        blocked = [RawClient(daemon.resp_port, timeout=WAIT_SECONDS * 3) for _ in range(2)]
        for client in blocked:
            client.send(encode_request(["BZPOPMIN", "never", "0"]))
            client.send(encode_request(["BZPOPMAX", "never", "0"]))  # (waits behind)
        with RawClient(daemon.resp_port) as writer:
            assert _wait_blocked(writer, 2)
            with RawClient(daemon.resp_port) as refused:
                assert refused.reply().startswith(b"-ERR max number of clients reached")
            assert _blocked(writer) == 2
        started = time.monotonic()
        assert daemon.stop() == 0
        assert time.monotonic() - started < 5
        for client in blocked:
            with pytest.raises(ConnectionError):
                client.reply()
            client.close()
    finally:
        daemon.stop()
