"""Scores are written as Redis 7.2 writes them (issue 45, item 6): its
``d2string``, fpconv's Grisu2 digits (``50 - 0.1`` is ``49.9``, 7.0's
``%.17g`` wrote ``49.899999999999999``).

The native encoders compile Redis 7.2.4's own fpconv; the pure-Python
twin (``rankd.frontends.resp.doubles``, also the reference the
differential tests rewrite Redis 7.0's doubles with) is a port of it.
Both are held to outputs of Redis 7.2.4's ``d2string`` (below: compiled
from its tree, ``deps/fpconv`` and ``src/util.c``) and to each other over
many doubles, so neither drifts."""

from __future__ import annotations

import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daemon import Daemon
from rankd.frontends.resp import doubles
from rankd.frontends.resp.protocol import Replies
from redisserver import as_redis_72
from respclient import RawClient

#: (value, what Redis 7.2.4's d2string writes).  The last four are doubles
#: whose Grisu2 digits are not the shortest (``repr`` writes one fewer).
REDIS_72 = [
    (49.9, b"49.9"), (0.1, b"0.1"), (0.30000000000000004, b"0.30000000000000004"),
    (1.5, b"1.5"), (-2.5, b"-2.5"), (3.14159, b"3.14159"), (100.0, b"100"), (-0.0, b"-0"),
    (0.0, b"0"), (1e-07, b"1e-7"), (1.5e-07, b"1.5e-7"), (1e-05, b"0.00001"),
    (0.0001, b"0.0001"), (2.5e-05, b"0.000025"), (123456789.123, b"123456789.123"),
    (1000000000000000.5, b"1000000000000000.5"), (4.611686018427388e+18, b"4611686018427387904"),
    (-4.611686018427388e+18, b"-4611686018427387904"),
    (4.61168601842739e+18, b"4611686018427390000"), (9.223372036854776e+18, b"9223372036854776000"),
    (1e+16, b"10000000000000000"), (1e+17, b"100000000000000000"), (1e+21, b"1e+21"),
    (1e+22, b"1e+22"), (1.7976931348623157e+308, b"1.7976931348623157e+308"),
    (5e-324, b"5e-324"), (2.2250738585072014e-308, b"2.2250738585072014e-308"),
    (1e+100, b"1e+100"), (-1.5e-300, b"-1.5e-300"), (9007199254740992.0, b"9007199254740992"),
    (0.3333333333333333, b"0.3333333333333333"), (0.6666666666666666, b"0.6666666666666666"),
    (123.456, b"123.456"), (1234567.0625, b"1234567.0625"), (99.99, b"99.99"),
    (-49.9, b"-49.9"), (float("inf"), b"inf"), (float("-inf"), b"-inf"),
    (7.036870839547745e+177, b"7.0368708395477454e+177"),
    (-6016.951217939863, b"-6016.9512179398635"),
    (5.890036180278533e-255, b"5.8900361802785335e-255"),
    (-3.377450749159909e+133, b"-3.3774507491599087e+133"),
]


@pytest.fixture(scope="module")
def open_daemon(tmp_path_factory):
    with Daemon(tmp_path_factory.mktemp("doubles") / "data") as running:
        yield running


def native_format():
    return pytest.importorskip("rankd.frontends.resp._scanner").format_double


@pytest.mark.parametrize(("value", "text"), REDIS_72, ids=[t.decode() for _, t in REDIS_72])
def test_both_implementations_write_what_redis_72_writes(value, text):
    assert doubles.format_double(value) == text
    assert native_format()(value) == text


def test_the_native_encoder_and_its_twin_agree_on_many_doubles():
    native = native_format()
    rng = random.Random(45)
    for i in range(60_000):
        if i % 3 == 0:  # any bit pattern: every exponent, subnormals, nan
            value = struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0]
        elif i % 3 == 1:  # scores with a few decimals, as leaderboards have them
            value = rng.randint(-10**9, 10**9) / 10 ** rng.randint(0, 6)
        else:
            value = rng.uniform(-1e6, 1e6)
        assert native(value) == doubles.format_double(value), repr(value)


@settings(max_examples=2000, deadline=None)
@given(st.floats(allow_nan=False))
def test_every_double_reads_back_exactly(value):
    text = doubles.format_double(value)
    assert float(text) == value and text == native_format()(value)


@pytest.mark.parametrize("version", [2, 3])
def test_replies_carry_redis_72_scores(version):
    replies = Replies(version)
    assert replies.double(50 - 0.1) == (b",49.9\r\n" if version == 3 else b"$4\r\n49.9\r\n")


def test_redis_70_replies_are_rewritten_only_where_they_hold_a_double():
    assert as_redis_72(b"$17\r\n49.899999999999999\r\n") == b"$4\r\n49.9\r\n"
    assert as_redis_72(b",49.899999999999999\r\n") == b",49.9\r\n"
    assert as_redis_72(b"*2\r\n$1\r\na\r\n$19\r\n0.10000000000000001\r\n") == (
        b"*2\r\n$1\r\na\r\n$3\r\n0.1\r\n")
    assert as_redis_72(b"$5\r\n1e+17\r\n") == b"$18\r\n100000000000000000\r\n"
    # Not what %.17g writes: a member or key, left as it is.
    for reply in (b"$4\r\n0.10\r\n", b"$2\r\n01\r\n", b"$3\r\nabc\r\n", b":12\r\n"):
        assert as_redis_72(reply) == reply


def test_a_daemon_answers_as_redis_72(open_daemon):
    """The issue's example through a daemon: ZINCRBY, ZSCORE, ZRANGE
    WITHSCORES (native and general paths) and ZRANK WITHSCORE."""
    with RawClient(open_daemon.resp_port) as client:
        client.call("DEL", "dbl")
        assert client.call("ZADD", "dbl", "50", "a", "1.5", "b") == b":2\r\n"
        assert client.call("ZINCRBY", "dbl", "-0.1", "a") == b"$4\r\n49.9\r\n"
        assert client.call("ZSCORE", "dbl", "a") == b"$4\r\n49.9\r\n"
        assert client.call("ZMSCORE", "dbl", "a") == b"*1\r\n$4\r\n49.9\r\n"
        assert client.call("ZREVRANGE", "dbl", "0", "0", "WITHSCORES") == (
            b"*2\r\n$1\r\na\r\n$4\r\n49.9\r\n")
        assert client.call("ZRANGEBYSCORE", "dbl", "2", "+inf", "WITHSCORES") == (
            b"*2\r\n$1\r\na\r\n$4\r\n49.9\r\n")
        assert client.call("ZRANK", "dbl", "a", "WITHSCORE") == b"*2\r\n:1\r\n$4\r\n49.9\r\n"
        assert client.call("ZREVRANK", "dbl", "a", "WITHSCORE") == b"*2\r\n:0\r\n$4\r\n49.9\r\n"
        assert client.call("ZSCAN", "dbl", "0") == (
            b"*2\r\n$1\r\n0\r\n*4\r\n$1\r\nb\r\n$3\r\n1.5\r\n$1\r\na\r\n$4\r\n49.9\r\n")
        client.call("HELLO", "3")
        assert client.call("ZSCORE", "dbl", "a") == b",49.9\r\n"
        assert client.call("ZREVRANK", "dbl", "a", "WITHSCORE") == b"*2\r\n:0\r\n,49.9\r\n"
        client.call("DEL", "dbl")
