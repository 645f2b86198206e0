"""Board names are keys as Redis users write them (issue 45, item 5): any
UTF-8 text of 1 to 512 bytes without control or invisible formatting
characters, hash tags, slashes and spaces included, but ``.`` and ``..``;
through RESP (the native path and the general one), REST (percent-encoded
in the path) and the TCP protocol; and never a file path."""

from __future__ import annotations

import binascii
import urllib.parse

import pytest

from daemon import Daemon
from engine_helpers import FakeClock, run, sub, with_engine
from rankd.client import Client
from rankd.cluster.groups import group_of
from rankd.engine.config import file_name_of, is_board_name
from respclient import RawClient

#: Keys Redis users write that rankd refused before.
KEYS = ["{user:1}:daily", "{user:1}:weekly", "a/b", "../../etc/passwd", "café au lait",
        "名前", "100%", "q?x=1#f", "x" * 512, "é" * 256, "'\"<>&*!~+,;=@$", "..."]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with Daemon(tmp_path_factory.mktemp("keys") / "data") as running:
        yield running


def test_the_name_rule():
    for name in KEYS:
        assert is_board_name(name), name
    for name in ["", ".", "..", "x" * 513, "é" * 257, "a\nb", "a\x7fb", "a\x85b", "a\u200bb",
                 "a\u202eb", "\ufeff", "a\ud800b"]:
        assert not is_board_name(name), name


def test_keys_are_written_and_read_through_resp_rest_and_tcp(daemon):
    with RawClient(daemon.resp_port) as client:
        for key in KEYS:
            # Pipelined: plain ZADD/ZINCRBY/ZSCORE of an ASCII key take the
            # native path, the others the general one; the replies agree.
            replies = client.pipeline([["ZADD", key, "1", "ann", "2", "bob"],
                                       ["ZADD", key, "3", "cy"], ["ZINCRBY", key, "5", "ann"],
                                       ["ZSCORE", key, "ann"], ["ZREVRANGE", key, "0", "0"],
                                       ["EXISTS", key], ["TYPE", key]])
            assert replies == [b":2\r\n", b":1\r\n", b"$1\r\n6\r\n", b"$1\r\n6\r\n",
                               b"*1\r\n$3\r\nann\r\n", b":1\r\n", b"+zset\r\n"], key
        keys = client.call("KEYS", "*")
        for key in KEYS:
            assert key.encode() in keys
        assert client.call("KEYS", "{user:1}:*") == (
            b"*2\r\n$14\r\n{user:1}:daily\r\n$15\r\n{user:1}:weekly\r\n")
    for key in KEYS:
        status, top = daemon.request(
            "GET", f"/v1/boards/{urllib.parse.quote(key, safe='')}/top")
        assert status == 200 and [e["member"] for e in top["entries"]] == ["ann", "cy", "bob"]
    with Client("127.0.0.1", daemon.tcp_port) as client:
        for key in KEYS:
            assert client.submit(key, "dee", score=9)["rank"] == 1
    with RawClient(daemon.resp_port) as client:
        assert client.call("ZREVRANK", "a/b", "dee") == b":0\r\n"
        assert client.call("DEL", *KEYS) == f":{len(KEYS)}\r\n".encode()
        assert client.call("DBSIZE") == b":0\r\n"


def test_keys_rankd_refuses_are_refused_as_before(daemon):
    with RawClient(daemon.resp_port) as client:
        for key in ["x" * 513, "a\r\nb", "a\x00b", ".", "..", "a\u2028b"]:
            assert client.call("ZADD", key, "1", "a").startswith(
                b"-ERR rankd board names (keys) are 1 to 512 bytes of UTF-8"), key
            assert client.call("ZSCORE", key, "a") == b"$-1\r\n"
            assert client.call("EXISTS", key) == b":0\r\n"


def test_a_board_name_never_reaches_a_file_path(tmp_path):
    clock = FakeClock()
    names = ["../../escaped", "a/b", ".hidden", "x" * 512, "~" + "0" * 64, "k:1"]

    async def body(engine):
        for name in names:
            await engine.put_board(name, {"windows": ["daily"], "retain": 0})
            await engine.submit(sub(name, "p", score=1))
        clock.advance(2 * 86400)
        await engine.housekeeping()

    run(with_engine(tmp_path / "data", clock, body))
    archive = tmp_path / "data" / "archive"
    made = sorted(path.name for path in archive.iterdir())
    assert made == sorted(file_name_of(name) for name in names)
    assert len(set(made)) == len(names)  # no two names share a directory
    assert "k:1" in made  # names of before keep their directories
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "data" / "a").exists()
    for name in made:
        assert "/" not in name and name not in (".", "..") and len(name) <= 200
        assert len(list((archive / name / "daily").iterdir())) == 1


def test_a_hash_tag_picks_the_group_as_redis_cluster_picks_the_slot():
    assert group_of("{cup}:daily") == group_of("{cup}:weekly") == group_of("cup")
    assert group_of("a{cup}b{x}") == group_of("cup")
    assert group_of("arena") == 906 and group_of("été") == 630  # docs/cluster.md
    # An empty tag, or an unclosed one, is no tag: the whole name is hashed.
    for name in ("{}cup", "{cup", "cup}", "}{"):
        assert group_of(name) == (binascii.crc_hqx(name.encode(), 0) % 16384) // 16


def test_writes_to_boards_of_any_name_survive_a_crash(tmp_path):
    """Scores sent to boards whose names are not ASCII, through REST, TCP
    and RESP, are all there after kill -9 (the native ingest once wrote such
    a name's characters as Latin-1 or UCS-2 bytes into the log, which no
    restart could then read)."""
    names = ["café au lait", "名前", "{user:é}:daily", "🏆 cup", "plain"]
    with Daemon(tmp_path / "data", "--fsync", "always") as daemon:
        for name in names:
            status, _ = daemon.request("POST", f"/v1/boards/{urllib.parse.quote(name, safe='')}"
                                       "/scores", {"member": "ann", "delta": 1})
            if status == 404:
                assert daemon.request("PUT", f"/v1/boards/{urllib.parse.quote(name, safe='')}",
                                      {"policy": "sum"})[0] in (200, 201)
                status, _ = daemon.request(
                    "POST", f"/v1/boards/{urllib.parse.quote(name, safe='')}/scores",
                    {"member": "ann", "delta": 1})
            assert status == 200, name
        with Client("127.0.0.1", daemon.tcp_port) as client:
            for name in names:
                client.submit(name, "ann", delta=2)
        with RawClient(daemon.resp_port) as client:
            for name in names:
                assert client.call("ZINCRBY", name, "4", "ann") == b"$1\r\n7\r\n", name
            assert client.call("MULTI") == b"+OK\r\n"
            for name in names[:3]:
                client.call("ZINCRBY", name, "8", "ann")
            client.call("EXEC")
        daemon.kill()
        daemon.start()
        with RawClient(daemon.resp_port) as client:
            for name in names:
                expected = b"$2\r\n15\r\n" if name in names[:3] else b"$1\r\n7\r\n"
                assert client.call("ZSCORE", name, "ann") == expected, name
