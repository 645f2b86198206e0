"""RESP reading and writing (rankd.frontends.resp.protocol): requests split
anywhere read the same, limits refuse before buffering, inline requests
split exactly as a real redis-server splits them."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rankd.frontends.resp.protocol import (
    FEED_MOST,
    ProtocolError,
    Replies,
    RequestReader,
    encode_request,
    format_double,
    split_inline,
)
from redisserver import RedisServer, as_redis_72

WORDS = st.lists(st.binary(max_size=40), min_size=1, max_size=6)


@settings(max_examples=300, deadline=None)
@given(st.lists(WORDS, min_size=1, max_size=8), st.data())
def test_multibulk_requests_read_the_same_however_the_stream_is_cut(commands, data):
    stream = b"".join(encode_request(command) for command in commands)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    reader = RequestReader()
    seen = []
    start = 0
    for cut in [*cuts, len(stream)]:
        seen += reader.feed(stream[start:cut])
        start = cut
    assert seen == commands and reader.pending_bytes == 0


def test_empty_multibulk_requests_are_ignored_and_inline_ones_read():
    reader = RequestReader()
    assert reader.feed(b"*0\r\n*-1\r\nPING\r\n\r\nECHO  hi\n") == [[b"PING"], [b"ECHO", b"hi"]]


@pytest.mark.parametrize(("stream", "message"), [
    (b"*x\r\n", "invalid multibulk length"),
    (b"*2000000\r\n", "invalid multibulk length"),
    (b"*1\r\n:3\r\n", "expected '$', got ':'"),
    (b"*1\r\n$-3\r\n", "invalid bulk length"),
    (b"*1\r\n$2000000\r\n", "invalid bulk length"),  # refused before a byte of it
    (b"*1\r\n" + b"$" + b"9" * 70000, "too big bulk count string"),
    (b"A" * 70000, "too big inline request"),
    (b'SET "a"b\r\n', "unbalanced quotes in request"),
])
def test_bad_streams_raise_redis_protocol_errors(stream, message):
    with pytest.raises(ProtocolError) as raised:
        RequestReader().feed(stream)
    assert raised.value.message == message
    assert raised.value.reply() == f"-ERR Protocol error: {message}\r\n".encode()


INLINE_ALPHABET = st.sampled_from(['a', 'b', ' ', '"', "'", "\\", "x", "4", "1", "n", "t"])


@pytest.fixture(scope="module")
def redis():
    server = RedisServer()
    yield server
    server.stop()


@settings(max_examples=150, deadline=None)
@given(st.lists(INLINE_ALPHABET, min_size=1, max_size=12).map("".join))
def test_inline_requests_split_as_redis_splits_them(redis, argument):
    """``ECHO <argument>`` sent inline to redis-server and read here: the
    server echoes its one word, refuses another count of words, or closes on
    unbalanced quotes; the reader must agree in each case."""
    line = b"ECHO " + argument.encode()
    answer = redis.exchange(line + b"\r\nQUIT\r\n")
    try:
        words = split_inline(line)
    except ProtocolError as exc:
        assert answer == exc.reply(), (line, answer)
        return
    replies = Replies(2)
    if len(words) == 2:
        expected = replies.bulk(words[1])
    else:
        expected = replies.error("ERR wrong number of arguments for 'echo' command")
    assert answer == expected + b"+OK\r\n", (line, words, answer)


def test_replies_in_resp2_and_resp3():
    two, three = Replies(2), Replies(3)
    assert two.bulk(None) == b"$-1\r\n" and three.bulk(None) == b"_\r\n"
    assert two.double(1.5) == b"$3\r\n1.5\r\n" and three.double(1.5) == b",1.5\r\n"
    assert two.map_header(2) == b"*4\r\n" and three.map_header(2) == b"%2\r\n"
    assert two.boolean(True) == b":1\r\n" and three.boolean(False) == b"#f\r\n"
    assert two.error("ERR bad\r\nthing") == b"-ERR bad  thing\r\n"


@pytest.mark.parametrize("score", [1.5, 1.0, -0.0, 0.1, 1e20, 1e16, 123456789012345678.0, 1e-5,
                                   3.0e-310, -2.5e300, float("inf"), float("-inf"), 1e23])
def test_scores_are_written_as_redis_writes_them(redis, score):
    # A new member's ZINCRBY answers the increment as Redis formats it
    # (ZSCORE would show how a small sorted set stores it: -0 as 0).
    text = format_double(score)
    # (Redis 7.0's %.17g rewritten as Redis 7.2, whose format rankd writes.)
    answer = as_redis_72(redis.exchange(encode_request([b"DEL", b"k"])
                                        + encode_request([b"ZINCRBY", b"k", b"%r" % score, b"m"])
                                        + b"QUIT\r\n"))
    assert answer in (b":%d\r\n" % deleted + Replies(2).bulk(text) + b"+OK\r\n"
                      for deleted in (0, 1))


@pytest.mark.parametrize("version", [2, 3])
@settings(max_examples=500, deadline=None)
@given(scores=st.lists(st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(-(10**18), 10**18).map(float),
    st.sampled_from([-0.0, 0.0, 1e16, 1e17 - 16, 1e17, -1e17, 99999999999999984.0, 5e-324])),
    max_size=8))
def test_native_range_replies_equal_the_python_encoder(scores, version):
    """The native encoder writes integral scores itself (not through
    ``%.17g``): byte for byte what ``Replies`` writes, RESP2 and RESP3."""
    # (Where the build is required, test_daemon fails if it is missing.)
    _scanner = pytest.importorskip("rankd.frontends.resp._scanner")
    entries = [(i, f"m{i}é", value) for i, value in enumerate(scores)]
    replies = Replies(version)
    for nested in (False, True):
        pairs = nested and version == 3
        expected = replies.array_header(len(entries) if pairs else 2 * len(entries))
        for _, member, value in entries:
            expected += (b"*2\r\n" if pairs else b"") + replies.bulk(member) + \
                replies.double(value)
        assert _scanner.encode_entries(entries, True, version, nested) == expected


@settings(max_examples=500, deadline=1000)
@given(st.binary(max_size=200))
def test_any_inline_line_is_read_in_one_pass(line):
    """Whatever its bytes (NULs, quotes, escapes), a line is split or
    refused, never looped on: the ``\\x00\\n`` that once froze the daemon
    among them.  A NUL ends the line, as a C string's end does in Redis."""
    try:
        words = split_inline(line)
    except ProtocolError:
        return
    assert all(b"\x00" not in word for word in words)
    assert split_inline(line.split(b"\x00")[0]) == words


def test_a_read_of_many_commands_is_read_a_thousand_at_a_time():
    """256 KiB of ``a\\n`` are 131,072 commands: ``feed`` reads at most
    FEED_MOST of them and says there are more; blank lines cost nothing."""
    reader = RequestReader()
    seen = reader.feed(b"\r\n" * 100_000 + b"a\n" * 3000)
    assert len(seen) == FEED_MOST and reader.more
    while reader.more:
        seen += reader.feed(b"")
    assert seen == [[b"a"]] * 3000 and reader.pending_bytes == 0


def test_a_large_request_that_trickles_in_is_read_in_linear_time():
    """Scanned again from its start on every read, a 2 MiB request sent
    1 KiB at a time cost the square of its length; past VET_AFTER it is
    read word by word instead."""
    request = encode_request([b"ZADD", b"lb", *[b"%d" % i for i in range(200_000)]])
    assert len(request) > 2 << 20
    reader = RequestReader(max_request=8 << 20)
    started = time.perf_counter()
    seen = []
    for start in range(0, len(request), 1024):
        seen += reader.feed(request[start:start + 1024])
    assert time.perf_counter() - started < 1.5  # (2.4 s scanned again each time)
    assert len(seen) == 1 and len(seen[0]) == 200_002
