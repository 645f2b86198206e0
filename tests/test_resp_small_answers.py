"""Small answers that once differed from Redis's (issue 45, item 7), each
checked against ``redis-server``: SCAN/ZSCAN cursors as ``strtoul`` reads
them, COMMAND INFO's ACL categories, COMMAND LIST FILTERBY, INFO's
sections (commandstats, errorstats, replication, ``# CPU``), and CLIENT
LIST's ``addr`` with its port."""

from __future__ import annotations

import re

import pytest

from daemon import Daemon
from redisserver import RedisClient, RedisServer
from respclient import RawClient

CURSORS = ["-1", "+1", "+0", "-0", "", "1\x00x", "18446744073709551615", "18446744073709551616",
           "-18446744073709551615", "-18446744073709551616", " 1", "1 ", "+", "-", "0x1", "1.0",
           "00000000000000000000000000001", "abc"]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    redis = RedisServer()
    with Daemon(tmp_path_factory.mktemp("small") / "data") as daemon:
        yield redis, daemon
    redis.stop()


@pytest.fixture
def clients(servers):
    redis, daemon = servers
    with RedisClient(redis.port) as theirs, RawClient(daemon.resp_port) as ours:
        for client in (theirs, ours):
            assert client.call("FLUSHALL") == b"+OK\r\n"
            assert client.call("ZADD", "z", "1", "a", "2.5", "b") == b":2\r\n"
        yield theirs, ours


@pytest.mark.parametrize("cursor", CURSORS)
def test_scan_cursors_are_read_as_redis_reads_them(clients, cursor):
    theirs, ours = clients
    # A small set answers whole whatever the cursor: the replies are equal.
    assert ours.call("ZSCAN", "z", cursor) == theirs.call("ZSCAN", "z", cursor)
    # SCAN walks Redis's hash table (its order is not rankd's): refused
    # alike, and where the cursor is past every key, the same end.
    expected = theirs.call("SCAN", cursor)
    answered = ours.call("SCAN", cursor)
    assert answered.startswith(b"-") == expected.startswith(b"-"), (expected, answered)
    if expected.startswith(b"-"):
        assert answered == expected


def _categories(reply: bytes) -> list[bytes]:
    """The categories of the first entry of a COMMAND INFO reply (its own,
    before its subcommands' entries)."""
    lines = reply.split(b"\r\n")
    first = next(i for i, line in enumerate(lines) if line.startswith(b"+@"))
    count = int(lines[first - 1][1:])
    return lines[first:first + count]


def test_command_info_lists_redis_acl_categories(clients):
    theirs, ours = clients
    names = _names(ours.call("COMMAND", "LIST"))
    assert b"zadd" in names and b"client|list" in names
    for name in sorted(names):
        expected = theirs.call("COMMAND", "INFO", name)
        if name.startswith(b"rankd.") or expected == b"*1\r\n$-1\r\n":
            continue  # rankd's own; a 7.2 command 7.0 lacks (client|setinfo...)
        assert _categories(ours.call("COMMAND", "INFO", name)) == _categories(expected), name
    assert _categories(ours.call("COMMAND", "INFO", "zadd")) == [b"+@write", b"+@sortedset",
                                                                 b"+@fast"]


def _names(reply: bytes) -> set[bytes]:
    return {line for line in reply.split(b"\r\n") if line and line[:1] not in b"*$"}


@pytest.mark.parametrize("words", [
    ["FILTERBY", "ACLCAT", "sortedset"], ["FILTERBY", "ACLCAT", "keyspace"],
    ["FILTERBY", "aclcat", "FAST"], ["FILTERBY", "ACLCAT", "dangerous"],
    ["FILTERBY", "PATTERN", "z*"], ["FILTERBY", "PATTERN", "client*"],
    ["filterby", "pattern", "*|*"], ["FILTERBY", "ACLCAT", "nope"], ["FILTERBY", "MODULE", "x"],
    ["FILTERBY", "bad", "x"], ["FILTERBY"], ["x"], ["FILTERBY", "PATTERN", "a", "FILTERBY",
                                                    "PATTERN", "b"]])
def test_command_list_honours_its_filter(clients, words):
    theirs, ours = clients
    expected, answered = theirs.call("COMMAND", "LIST", *words), ours.call("COMMAND", "LIST",
                                                                         *words)
    if expected.startswith(b"-"):
        assert answered == expected
        return
    ours_all = _names(ours.call("COMMAND", "LIST"))
    # Redis's list, but for the commands rankd does not have (and rankd's own).
    assert {n for n in _names(answered) if not n.startswith(b"rankd.")} == \
        _names(expected) & ours_all - {b"client|setinfo", b"client|no-touch"} | (
            _names(answered) & {b"client|setinfo", b"client|no-touch"})


def _sections(reply: bytes) -> list[str]:
    return re.findall(r"^# (.+?)\r$", reply.decode(), re.MULTILINE)


@pytest.mark.parametrize("words", [[], ["default"], ["all"], ["everything"],
                                   ["cpu", "server"], ["commandstats"], ["ERRORSTATS"]])
def test_info_sections_are_redis_sections(clients, words):
    theirs, ours = clients
    assert _sections(ours.call("INFO", *words)) == _sections(theirs.call("INFO", *words))


def test_info_counts_commands_and_errors_and_describes_replication(clients):
    theirs, ours = clients
    for client in (theirs, ours):
        assert client.call("CONFIG", "RESETSTAT") == b"+OK\r\n"
        client.call("ZCARD", "z")
        client.call("ZCARD", "z")
        client.call("ZCOUNT", "z", "x", "y")  # ERR min or max is not a float
        client.call("NOPE")
    for client in (theirs, ours):
        stats = client.call("INFO", "commandstats").decode()
        assert "cmdstat_zcard:calls=2," in stats, stats
        assert re.search(r"cmdstat_zcount:calls=1,.*failed_calls=1", stats), stats
        errors = client.call("INFO", "errorstats").decode()
        assert "errorstat_ERR:count=2" in errors, errors
    keys = [re.findall(r"^(\w+):", client.call("INFO", "replication").decode(), re.MULTILINE)
            for client in (theirs, ours)]
    assert keys[0] == keys[1]
    assert "# CPU" in ours.call("INFO", "cpu").decode()


def test_client_list_addr_has_the_port(clients):
    _, ours = clients
    port = ours.sock.getsockname()[1]
    line = ours.call("CLIENT", "INFO").decode()
    assert f" addr=127.0.0.1:{port} " in line and " laddr=127.0.0.1:" in line, line
    assert f"addr=127.0.0.1:{port} " in ours.call("CLIENT", "LIST").decode()
