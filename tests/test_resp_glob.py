"""Glob patterns (KEYS, SCAN MATCH, ZSCAN MATCH, CONFIG GET) match exactly
as a real redis-server matches them, in linear time: the backtracking
matcher once took 10-17 s on a 20-byte pattern (Redis's CVE-2022-36021)."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rankd.frontends.resp.glob import MAX_PATTERN_BYTES, PatternTooLong, glob_match
from redisserver import RedisServer
from respclient import RawClient

PATTERN = st.lists(st.sampled_from([b"a", b"b", b"*", b"?", b"[", b"]", b"^", b"-", b"\\",
                                    b"c"]), max_size=10).map(b"".join)
SUBJECT = st.lists(st.sampled_from([b"a", b"b", b"c", b"-", b"]", b"^", b"\\", b"*"]),
                   min_size=1, max_size=8).map(b"".join)


@pytest.fixture(scope="module")
def redis():
    server = RedisServer()
    with RawClient(server.port) as client:
        yield client
    server.stop()


@settings(max_examples=400, deadline=None)
@given(PATTERN, SUBJECT)
def test_patterns_match_as_redis_matches_them(redis, pattern, subject):
    redis.call("FLUSHALL")
    redis.call("SET", subject, "1")
    expected = redis.call("KEYS", pattern) != b"*0\r\n"
    assert glob_match(pattern, subject) is expected, (pattern, subject)


@settings(max_examples=100, deadline=None)
@given(PATTERN, SUBJECT)
def test_nocase_patterns_match_as_config_get_does(pattern, subject):
    assert glob_match(pattern, subject, nocase=True) is \
        glob_match(pattern.lower(), subject.lower())


@pytest.mark.parametrize("pattern", [b"*a" * 10 + b"*b", b"a*" * 200 + b"b",
                                     b"*?" * 300 + b"*[b]", b"*[a]*" * 100 + b"c*"])
def test_pathological_patterns_answer_in_milliseconds(pattern):
    subject = b"a" * 256
    started = time.perf_counter()
    for _ in range(100):
        assert not glob_match(pattern, subject)
    assert (time.perf_counter() - started) / 100 < 0.005


def test_a_pattern_longer_than_any_name_could_need_is_refused():
    assert glob_match(b"*" * MAX_PATTERN_BYTES, b"x")
    with pytest.raises(PatternTooLong):
        glob_match(b"*" * (MAX_PATTERN_BYTES + 1), b"x")
