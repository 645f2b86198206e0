"""The contract of the RESP front-end: random sequences of the supported
commands, sent to a real ``redis-server`` and to a real rankd daemon, get
byte-identical replies, in RESP2 and in RESP3.

Keys, members and scores are drawn to hit the edges: ties, ``-0``, large
integers, hexadecimal and exponent forms, exclusive and infinite bounds,
indexes past either end, negative counts, bad floats and integers, option
soup, wrong arities.  What rankd refuses by design (infinite scores,
empty or non-UTF-8 members, keys that are not board names: docs/redis.md)
is left out of the draw; ``test_resp_refusals`` checks those answers.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daemon import Daemon
from redisserver import RedisClient, RedisServer
from respclient import RawClient

#: Examples per protocol version (the long form: RANKD_RESP_EXAMPLES=5000).
EXAMPLES = int(os.environ.get("RANKD_RESP_EXAMPLES", "300"))
KEYS = ["lb", "k:1", "week.2", "{t}:lb", "a/é b"]
MEMBERS = ["a", "b", "c", "m:1", "zz", "é", "A", "bb"]
SCORES = ["0", "1", "-1", "2", "10", "1.5", "-0", "0.1", "1e3", "-2.5e-3", "9007199254740993",
          "123456789012345678", "0x10", "1E2", ".5", "5.", "+3", "3.0", "1e-310", "7",
          # the scanner reads up to 15 digits itself, strtod the rest
          "007", "-007", "+0", "-00", "999999999999999", "-999999999999999", "1234567890123456"]
BAD_FLOATS = ["abc", "", "nan", " 1", "1 ", "1e400", "1e-400", "--1", "1x", "inf-"]
BOUNDS = ["-inf", "+inf", "inf", "(1", "(-1", "(0", "2", "(2", "1.5", "-0", "(", "", " 3",
          "1e400", "-1e400", "abc", "(abc", "nan"]
INDEXES = ["0", "1", "-1", "2", "-2", "5", "-100", "100", "3", "abc", "+1", "01", "-0",
           "9223372036854775807", "-9223372036854775808", "9223372036854775808"]

scores = st.one_of(st.sampled_from(SCORES), st.integers(-20, 20).map(str),
                   st.floats(-1e6, 1e6, allow_nan=False).map(repr))
keys = st.sampled_from(KEYS)
members = st.sampled_from(MEMBERS)
indexes = st.one_of(st.sampled_from(INDEXES), st.integers(-12, 12).map(str))
bounds = st.one_of(st.sampled_from(BOUNDS), scores, scores.map(lambda s: "(" + s))


@st.composite
def zadd(draw) -> list[str]:
    options = draw(st.lists(st.sampled_from(["NX", "XX", "GT", "LT", "CH", "INCR", "nx", "ch"]),
                            max_size=3))
    pairs = draw(st.lists(st.tuples(scores, members), min_size=0, max_size=3))
    words = ["ZADD", draw(keys), *options]
    for value, member in pairs:
        words += [value, member]
    if draw(st.integers(0, 15)) == 0:
        words.append(draw(st.sampled_from([*BAD_FLOATS, "x"])))
    return words


@st.composite
def zrange(draw) -> list[str]:
    name = draw(st.sampled_from(["ZRANGE", "ZREVRANGE", "ZRANGEBYSCORE", "ZREVRANGEBYSCORE",
                                 "zrange"]))
    by_score = "SCORE" in name or draw(st.booleans())
    low, high = (draw(bounds), draw(bounds)) if by_score else (draw(indexes), draw(indexes))
    words = [name, draw(keys), low, high]
    options = draw(st.lists(st.sampled_from(["WITHSCORES", "LIMIT", "REV", "BYSCORE", "BYLEX",
                                             "withscores"]), max_size=3))
    for option in options:
        words.append(option)
        if option == "LIMIT":
            words += [draw(indexes), draw(indexes)][:draw(st.integers(0, 2))]
    return words


@st.composite
def command(draw) -> list[str]:
    kind = draw(st.integers(0, 22))
    key, member = draw(keys), draw(members)
    if kind <= 4:
        return draw(zadd())
    if kind <= 6:
        return ["ZINCRBY", key, draw(st.one_of(scores, st.sampled_from(BAD_FLOATS))), member]
    if kind <= 9:
        return draw(zrange())
    return draw(st.sampled_from([
        ["ZSCORE", key, member],
        ["ZMSCORE", key, member, draw(members)],
        ["ZRANK", key, member],
        ["ZREVRANK", key, member],
        ["ZCARD", key],
        ["ZCOUNT", key, draw(bounds), draw(bounds)],
        ["ZREM", key, member, draw(members)],
        ["ZREMRANGEBYRANK", key, draw(indexes), draw(indexes)],
        ["ZREMRANGEBYSCORE", key, draw(bounds), draw(bounds)],
        ["ZPOPMIN", key],
        ["ZPOPMAX", key, draw(indexes)],
        ["ZPOPMIN", key, draw(indexes), "x"],
        ["ZSCAN", key, "0"],
        ["ZSCAN", key, "0", "MATCH", draw(st.sampled_from(["*", "a*", "?", "[ab]*", "m:*"])),
         "COUNT", draw(st.sampled_from(["1", "10", "0", "x"]))],
        ["EXISTS", key, draw(keys)],
        ["TYPE", key],
        ["DEL", key],
        ["DBSIZE"],
        ["ZSCORE", key],
        ["ZINCRBY", key, "1"],
        ["ZCARD", key, key],
        ["ZCOUNT", key, "0"],
        ["NOSUCHCOMMAND", key, member],
        ["ECHO", member],
        ["PING"],
        ["SELECT", draw(st.sampled_from(["0", "abc", "-1", "01", "+0"]))],
    ]))


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    redis = RedisServer()
    daemon = Daemon(tmp_path_factory.mktemp("resp-diff") / "data", "--tcp-port", "0",
                    "--fsync", "no")
    daemon.start()
    try:
        yield redis.port, daemon.resp_port
    finally:
        daemon.stop()
        redis.stop()


def _clients(servers, protocol: int) -> tuple[RawClient, RawClient]:
    redis, rankd = RedisClient(servers[0]), RawClient(servers[1])
    for client in (redis, rankd):
        if protocol == 3:
            client.call("HELLO", "3")  # its reply names the server: not compared
        assert client.call("FLUSHALL") == b"+OK\r\n"
    return redis, rankd


@pytest.mark.parametrize("protocol", [2, 3])
@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow])
@given(commands=st.lists(command(), min_size=1, max_size=40))
def test_replies_are_byte_identical_to_redis(servers, protocol, commands):
    redis, rankd = _clients(servers, protocol)
    with redis, rankd:
        for words in commands:
            expected = redis.call(*words)
            answered = rankd.call(*words)
            assert answered == expected, (words, expected, answered)
        # And the state: every key's members and scores, and the keyspace.
        for key in KEYS:
            words = ["ZRANGE", key, "0", "-1", "WITHSCORES"]
            assert rankd.call(*words) == redis.call(*words), key
        assert sorted(_keys(rankd)) == sorted(_keys(redis))


@pytest.mark.parametrize("protocol", [2, 3])
def test_pipelined_writes_and_reads_answer_in_order(servers, protocol):
    """A pipeline of writes and reads (writes go to the engine in one batch)
    gets the replies Redis gives, in order."""
    redis, rankd = _clients(servers, protocol)
    pipeline = []
    for i in range(300):
        pipeline.append(["ZINCRBY", KEYS[i % 2], str(i % 7), MEMBERS[i % len(MEMBERS)]])
        if i % 10 == 0:
            pipeline.append(["ZADD", KEYS[i % 3], "XX", "GT", "CH", str(i), MEMBERS[i % 5]])
        if i % 25 == 0:
            pipeline.append(["ZREVRANGE", KEYS[i % 2], "0", "2", "WITHSCORES"])
            pipeline.append(["ZRANK", KEYS[i % 2], MEMBERS[i % 3]])
        if i % 60 == 0:
            pipeline.append(["ZPOPMIN", KEYS[1]])
    with redis, rankd:
        assert rankd.pipeline(pipeline) == redis.pipeline(pipeline)


def _keys(client: RawClient) -> list[bytes]:
    reply = client.call("KEYS", "*")
    return [line for line in reply.split(b"\r\n")[1:] if line and not line.startswith(b"$")]


@pytest.mark.parametrize("protocol", [2, 3])
def test_large_boards_with_ties_answer_as_redis(servers, protocol):
    """A board of 6,000 members on 40 scores (long runs of ties): ranges of
    every size (native up to 100 entries, general past it, built in steps
    past 2,048), ranks of tied members, ZMSCORE and pops are Redis's, byte
    for byte, the board ranking highest first (``desc``, ties Z to A) and
    ZRANGE still lowest first."""
    redis, rankd = _clients(servers, protocol)
    members = [f"p{i:05d}" for i in range(6_000)]
    words = [w for i, member in enumerate(members) for w in (str(i * 7 % 40), member)]
    commands = [["ZADD", "big", *words[:6_000]], ["ZADD", "big", *words[6_000:]],
                ["ZRANGE", "big", "0", "-1", "WITHSCORES"], ["ZREVRANGE", "big", "0", "-1"],
                ["ZRANGE", "big", "5", "104"], ["ZREVRANGE", "big", "17", "117", "WITHSCORES"],
                ["ZRANGE", "big", "100", "2500", "REV", "WITHSCORES"],
                ["ZRANGEBYSCORE", "big", "3", "(30", "WITHSCORES", "LIMIT", "10", "4000"],
                ["ZREVRANGEBYSCORE", "big", "+inf", "-inf", "LIMIT", "2", "-1"],
                ["ZRANGE", "big", "(5", "20", "BYSCORE", "REV", "LIMIT", "0", "3000"],
                ["ZMSCORE", "big", *members[::2], "nope"],
                ["ZPOPMIN", "big", "2500"], ["ZPOPMAX", "big", "3"], ["ZCARD", "big"]]
    commands += [[kind, "big", member] for kind in ("ZRANK", "ZREVRANK")
                 for member in members[:: 97]]
    with redis, rankd:
        for words in commands:
            expected = redis.call(*words)
            assert rankd.call(*words) == expected, words[:6]


#: Keys of the ``-0`` sequences: a set grown past 128 members, one that may
#: grow there, and store destinations.
ZERO_KEYS = ["big", "edge", "dst", "dst2"]
ZERO_MEMBERS = ["z", "y", "a", "m1", "m120", "m127", "x" * 65]
ZERO_SCORES = ["-0", "0", "-0.0", "+0", "1", "-1", "2.5", "-0e3"]
WEIGHTS = ["1", "-1", "-2", "0", "0.5", "-0"]


@st.composite
def zero_command(draw) -> list[str]:
    key, member, value = (draw(st.sampled_from(ZERO_KEYS)), draw(st.sampled_from(ZERO_MEMBERS)),
                          draw(st.sampled_from(ZERO_SCORES)))
    sources = draw(st.lists(st.sampled_from(ZERO_KEYS), min_size=1, max_size=2))
    store = draw(st.sampled_from(["ZUNIONSTORE", "ZINTERSTORE", "ZDIFFSTORE"]))
    words = [store, draw(st.sampled_from(["dst", "dst2", "edge"])), str(len(sources)), *sources]
    if store != "ZDIFFSTORE" and draw(st.booleans()):
        words += ["WEIGHTS", *[draw(st.sampled_from(WEIGHTS)) for _ in sources]]
        if draw(st.booleans()):
            words += ["AGGREGATE", draw(st.sampled_from(["SUM", "MIN", "MAX"]))]
    many = [w for i in range(draw(st.integers(1, 12)))
            for w in (draw(st.sampled_from(ZERO_SCORES)), f"n{draw(st.integers(0, 40))}")]
    return draw(st.sampled_from([
        ["ZADD", key, value, member],
        ["ZADD", key, *many],
        ["ZADD", key, draw(st.sampled_from(["XX", "NX", "GT", "LT", "CH"])), value, member],
        ["ZADD", key, "INCR", value, member],
        ["ZINCRBY", key, value, member],
        ["ZREM", key, member, f"m{draw(st.integers(0, 140))}"],
        ["ZREMRANGEBYRANK", key, "0", str(draw(st.integers(0, 30)))],
        ["ZPOPMAX", key, str(draw(st.integers(1, 20)))],
        words,
        ["ZUNION", "2", key, draw(st.sampled_from(ZERO_KEYS)), "WEIGHTS",
         draw(st.sampled_from(WEIGHTS)), "1", "WITHSCORES"],
        ["ZRANGESTORE", draw(st.sampled_from(["dst", "dst2"])), key,
         *draw(st.sampled_from([["0", "-1"], ["0", "130"], ["-0", "0", "BYSCORE"],
                                ["-inf", "+inf", "BYSCORE"], ["(0", "+inf", "BYSCORE", "REV"],
                                ["-", "+", "BYLEX"], ["0", "5", "REV"]]))],
        ["ZSCORE", key, member],
        ["ZMSCORE", key, member, "z", "y"],
        ["OBJECT", "ENCODING", key],
        ["ZRANGEBYSCORE", key, "-0", "0", "WITHSCORES"],
        ["DEL", key],
    ]))


@pytest.mark.parametrize("protocol", [2, 3])
@settings(max_examples=max(20, EXAMPLES // 5), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow])
@given(grown=st.integers(120, 140), commands=st.lists(zero_command(), min_size=1, max_size=30))
def test_minus_zero_is_kept_as_redis_keeps_it(servers, protocol, grown, commands):
    """``-0`` on sets grown past 128 members (a skiplist keeps it, a listpack
    stores 0), that shrink (a skiplist stays one), that are emptied, and
    written by store commands (a small result is a listpack again): the
    replies, ``OBJECT ENCODING`` and every score's sign are Redis's.  (No
    ``ZADD`` here has more than 128 pairs: Redis 7.2 converts first then,
    7.0.15 does not; ``test_zeros.py`` checks 7.2's way.)"""
    redis, rankd = _clients(servers, protocol)
    setup = []
    for key, count in (("big", 150), ("edge", grown)):
        for start in range(0, count, 100):
            setup.append(["ZADD", key, *[w for i in range(start, min(count, start + 100))
                                         for w in (str(i % 7), f"m{i}")]])
    with redis, rankd:
        for words in [*setup, *commands]:
            expected = redis.call(*words)
            answered = rankd.call(*words)
            assert answered == expected, (words[:8], expected, answered)
        for key in ZERO_KEYS:
            for words in (["ZRANGE", key, "0", "-1", "WITHSCORES"], ["OBJECT", "ENCODING", key]):
                assert rankd.call(*words) == redis.call(*words), words
