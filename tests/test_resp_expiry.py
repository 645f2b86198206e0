"""Expiring boards over RESP, against a real ``redis-server``: ``EXPIRE``,
``PEXPIRE``, ``EXPIREAT``, ``PEXPIREAT`` (``NX|XX|GT|LT``), ``TTL``,
``PTTL``, ``EXPIRETIME``, ``PEXPIRETIME``, ``PERSIST``, mixed with the
sorted-set commands of ``test_resp_differential``.

Time is controlled by the deadlines drawn: in the past (the key goes at
once), or at least 1,000 s ahead (it stays for the test), so both servers
answer alike although their clocks are read a few ms apart; the replies
that show the time left (``TTL``, ``PTTL``, ``EXPIRETIME``...) may differ
by those ms, and are compared so.  Deadlines that pass during a test are
checked with short waits (``test_a_deadline_that_passes_*``), Redis's own
active expiry turned off (``DEBUG SET-ACTIVE-EXPIRE 0``) so that what it
answers is its lazy expiry's.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daemon import Daemon
from redisserver import RedisClient, RedisServer
from respclient import RawClient
from test_resp_differential import EXAMPLES, KEYS, _keys
from test_resp_differential import command as zset_command

#: Times that keep a key for the test or delete it at once, and bad ones.
FUTURE_SECONDS = st.integers(1_000, 10**9).map(str)
# (Not "1": a key given PEXPIRE 1 may be gone by the next command on one
# server and not yet on the other.)
PAST_OR_NOW = st.sampled_from(["0", "-1", "-100", "1000", "-9223372036854775"])
BAD_TIMES = st.sampled_from(["abc", "", "1.5", " 1", "9223372036854775807",
                             "-9223372036854775808", "9223372036854776",
                             "-9223372036854776", "9223372036854775808", "0x10", "+1"])
OPTIONS = st.lists(st.sampled_from(["NX", "XX", "GT", "LT", "nx", "gt", "FOO"]), max_size=2)
#: Replies that show time, read a few ms apart on each server.
TIMED = {"TTL": 1, "EXPIRETIME": 1, "PTTL": 1000, "PEXPIRETIME": 1000}


@st.composite
def expiry_command(draw) -> list[str]:
    key = draw(st.sampled_from([*KEYS, "absent"]))
    kind = draw(st.integers(0, 9))
    if kind <= 4:
        name = draw(st.sampled_from(["EXPIRE", "PEXPIRE", "EXPIREAT", "PEXPIREAT", "expire"]))
        relative = name.upper() in ("EXPIRE", "PEXPIRE")
        if draw(st.integers(0, 9)) == 0:
            when = draw(BAD_TIMES)
        elif draw(st.integers(0, 4)) == 0:
            when = draw(PAST_OR_NOW)
        else:
            seconds = int(draw(FUTURE_SECONDS))
            if not relative:
                seconds += int(time.time())
            when = str(seconds * (1000 if name.upper().startswith("P") else 1))
        words = [name, key, when, *draw(OPTIONS)]
        if draw(st.integers(0, 20)) == 0:
            words = words[:2]  # wrong arity
        return words
    if kind <= 7:
        return [draw(st.sampled_from(list(TIMED))), key]
    return draw(st.sampled_from([["PERSIST", key], ["PERSIST"], ["TTL", key, key],
                                 ["EXISTS", key], ["TYPE", key]]))


commands = st.one_of(expiry_command(), expiry_command(), zset_command())


def _same(words: list[str], expected: bytes, answered: bytes) -> bool:
    """Whether two replies agree: exactly, or for a timed reply (both
    times) within the ms between the two servers' clocks."""
    if answered == expected:
        return True
    tolerance = TIMED.get(words[0].upper())
    if tolerance is None or not (expected[:1] == answered[:1] == b":"):
        return False
    mine, theirs = int(answered[1:]), int(expected[1:])
    return mine >= 0 and theirs >= 0 and abs(mine - theirs) <= tolerance


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    redis = RedisServer("--enable-debug-command", "yes")  # DEBUG SET-ACTIVE-EXPIRE
    daemon = Daemon(tmp_path_factory.mktemp("resp-expiry") / "data", "--tcp-port", "0",
                    "--fsync", "no")
    daemon.start()
    try:
        yield redis.port, daemon.resp_port
    finally:
        daemon.stop()
        redis.stop()


def _clients(servers, protocol: int = 2) -> tuple[RawClient, RawClient]:
    redis, rankd = RedisClient(servers[0]), RawClient(servers[1])  # (Redis 7.2's doubles)
    for client in (redis, rankd):
        if protocol == 3:
            client.call("HELLO", "3")
        assert client.call("FLUSHALL") == b"+OK\r\n"
    return redis, rankd


def _compare(redis: RawClient, rankd: RawClient, words: list[str]) -> None:
    expected = redis.call(*words)
    answered = rankd.call(*words)
    assert _same(words, expected, answered), (words, expected, answered)


@pytest.mark.parametrize("protocol", [2, 3])
@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow])
@given(sequence=st.lists(commands, min_size=1, max_size=40))
def test_expiry_replies_are_redis(servers, protocol, sequence):
    redis, rankd = _clients(servers, protocol)
    with redis, rankd:
        for words in sequence:
            _compare(redis, rankd, words)
        for key in [*KEYS, "absent"]:  # and the state: members, deadlines, keyspace
            _compare(redis, rankd, ["ZRANGE", key, "0", "-1", "WITHSCORES"])
            _compare(redis, rankd, ["PTTL", key])
        assert sorted(_keys(rankd)) == sorted(_keys(redis))


SCRIPTED = [
    # No key, no deadline; the options' conflicts; a deadline in the past.
    ["TTL", "lb"], ["PTTL", "lb"], ["EXPIRE", "lb", "100"], ["PERSIST", "lb"],
    ["ZADD", "lb", "1", "a", "2", "b"], ["TTL", "lb"], ["EXPIRETIME", "lb"],
    ["EXPIRE", "lb", "100", "NX", "XX"], ["EXPIRE", "lb", "100", "GT", "LT"],
    ["EXPIRE", "lb", "100", "NX", "GT"], ["EXPIRE", "lb", "100", "BOGUS"],
    ["EXPIRE", "lb", "abc"], ["EXPIRE", "lb", "9223372036854775807"],
    ["PEXPIRE", "lb", "9223372036854775807"], ["EXPIREAT", "lb", "-9223372036854775808"],
    ["EXPIRE", "lb", "100", "XX"], ["EXPIRE", "lb", "100", "GT"],
    ["EXPIRE", "lb", "100", "LT"], ["TTL", "lb"], ["EXPIRE", "lb", "1000", "NX"],
    ["EXPIRE", "lb", "50", "GT"], ["EXPIRE", "lb", "500", "GT"], ["TTL", "lb"],
    ["EXPIRE", "lb", "1000", "LT"], ["EXPIRE", "lb", "200", "LT"], ["TTL", "lb"],
    # A write to the board keeps its deadline; PERSIST clears it.
    ["ZADD", "lb", "3", "c"], ["ZINCRBY", "lb", "5", "a"], ["ZREM", "lb", "b"], ["TTL", "lb"],
    ["PERSIST", "lb"], ["PERSIST", "lb"], ["TTL", "lb"], ["EXPIRE", "lb", "300"],
    # DEL and a new board: no deadline.
    ["DEL", "lb"], ["TTL", "lb"], ["ZADD", "lb", "1", "a"], ["TTL", "lb"],
    # Emptied by its last member: the key goes, its deadline with it.
    ["EXPIRE", "lb", "300"], ["ZREM", "lb", "a"], ["TTL", "lb"], ["EXPIRE", "lb", "10"],
    ["ZADD", "lb", "1", "a"], ["TTL", "lb"], ["EXPIRE", "lb", "300"], ["ZPOPMIN", "lb"],
    ["ZADD", "lb", "1", "a"], ["TTL", "lb"],
    # EXPIRE 0, a negative one, and PEXPIREAT in the past delete at once.
    ["EXPIRE", "lb", "0"], ["EXISTS", "lb"], ["ZSCORE", "lb", "a"],
    ["ZADD", "lb", "1", "a"], ["EXPIRE", "lb", "-5"], ["ZCARD", "lb"],
    ["ZADD", "lb", "1", "a"], ["PEXPIREAT", "lb", "1"], ["TYPE", "lb"], ["KEYS", "*"],
    ["ZADD", "lb", "1", "a"], ["EXPIREAT", "lb", "0", "XX"], ["EXISTS", "lb"],
    ["EXPIREAT", "lb", "0"], ["DBSIZE"],
    ["EXPIRE", "lb"], ["TTL"], ["PERSIST", "lb", "x"],
]


@pytest.mark.parametrize("protocol", [2, 3])
def test_scripted_expiry_answers_as_redis(servers, protocol):
    """Each rule, one command at a time (see the comments of SCRIPTED)."""
    redis, rankd = _clients(servers, protocol)
    with redis, rankd:
        for words in SCRIPTED:
            _compare(redis, rankd, words)


def _wait_until(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.mark.parametrize("active", [False, True])
def test_a_deadline_that_passes_deletes_the_board(servers, active):
    """A board whose deadline passes reads as absent at once (lazily), and
    a write to it makes a new board, without the deadline; the same with
    Redis's active expiry on and off."""
    redis, rankd = _clients(servers)
    with redis, rankd:
        assert redis.call("DEBUG", "SET-ACTIVE-EXPIRE", "1" if active else "0") == b"+OK\r\n"
        try:
            for client in (redis, rankd):
                client.call("ZADD", "lb", "1", "a", "2", "b")
                client.call("ZADD", "k:1", "1", "a")
                assert client.call("PEXPIRE", "lb", "300") == b":1\r\n"
                assert client.call("PEXPIRE", "k:1", "300") == b":1\r\n"
            time.sleep(0.45)
            for words in (["TTL", "lb"], ["ZSCORE", "lb", "a"], ["ZRANGE", "lb", "0", "-1"],
                          ["EXISTS", "lb"], ["ZADD", "lb", "5", "c"],
                          ["TTL", "lb"], ["ZRANGE", "lb", "0", "-1", "WITHSCORES"],
                          ["ZCARD", "k:1"], ["KEYS", "*"]):
                _compare(redis, rankd, words)
        finally:
            redis.call("DEBUG", "SET-ACTIVE-EXPIRE", "1")


def test_native_paths_see_a_deadline_pass(servers):
    """Plain ZSCORE/ZADD pipelines take rankd's native paths; a board about
    to expire goes the general way, so they see it gone the moment its
    deadline passes, as Redis's lazy expiry does."""
    redis, rankd = _clients(servers)
    with redis, rankd:
        for client in (redis, rankd):
            client.call("ZADD", "lb", "1", "a")
            client.call("PEXPIRE", "lb", "400")
        pipeline = [["ZSCORE", "lb", "a"], ["ZRANK", "lb", "a"], ["ZINCRBY", "lb", "1", "a"]]
        assert rankd.pipeline(pipeline) == redis.pipeline(pipeline)
        time.sleep(0.6)
        after = [["ZSCORE", "lb", "a"], ["ZRANGE", "lb", "0", "-1"],
                 ["ZINCRBY", "lb", "1", "a"], ["ZSCORE", "lb", "a"], ["TTL", "lb"]]
        assert rankd.pipeline(after) == redis.pipeline(after)
