"""MONITOR (issue 45, item 8): its lines against ``redis-server``'s (the
same commands on both, lines compared but for the time and the client's
port), and through real daemons: admin only, credentials redacted,
commands of the native paths shown, what a monitor may run, a monitor
that does not read disconnected."""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daemon import Daemon
from rankd.frontends.resp.connection import FAST_WRITES
from rankd.frontends.resp.monitor import OUTPUT_LIMIT, _quoted, quoted
from rankd.frontends.resp.protocol import encode_request
from redisserver import RedisServer
from respclient import RawClient
from test_security import (
    ADMIN,
    READER_ENTRY,
    READER_KEY,
    SECRET,
    WRITER_ENTRY,
    WRITER_KEY,
    token,
)

END = "monitor-test-end"
#: The most a socket's send buffer grows to (Linux's default: 4 MiB).
TCP_WMEM_MAX = int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2]) if Path(
    "/proc/sys/net/ipv4/tcp_wmem").exists() else 4 << 20
LINE = re.compile(rb"^\+(\d+)\.(\d{6}) \[0 127\.0\.0\.1:(\d+)\] (.*)\r\n$", re.S)
#: What every test's script sends, one command at a time (replies differ
#: where the servers do: an open rankd takes any credential).
SCRIPT: list[list[str | bytes]] = [
    ["PING"], ["ping", "hello"], ["ECHO", b"\x00\x07\x08\t\n\r\"\\'\x7f\xff \xc3\xa9"],
    ["ZADD", 'k"\\ \xe9', "1", "m'1"], ["ZADD", "lb", "1", "a"], ["ZINCRBY", "lb", "2", "a"],
    ["ZSCORE", "lb", "a"], ["ZRANK", "lb", "a"], ["ZRANGE", "lb", "0", "-1"],
    ["ZADD", "lb", "x", "a"], ["ZADD", "lb"], ["NOPE", "x"], ["ZCARD", "lb"],
    ["MULTI"], ["ZADD", "lb", "3", "b"], ["ZCARD", "lb"], ["EXEC"],
    ["MULTI"], ["ZADD", "lb", "4", "c"], ["DISCARD"], ["EXEC"],
    ["MULTI"], ["ZADD", "lb", "4", "c"], ["ZFOO"], ["EXEC"],
    ["CONFIG", "GET", "maxmemory"], ["CLIENT", "LIST"], ["CLIENT", "ID"],
    ["AUTH", "s3cret"], ["AUTH", "user", "s3cret"],
    ["HELLO", "2", "AUTH", "default", "s3cret", "SETNAME", "x"],
    ["BZPOPMIN", "empty", "0.01"], ["DEL", "lb"], ["EXISTS", "lb"],
]


def lines_until_end(monitor: RawClient) -> list[bytes]:
    """The monitor's lines up to the one of ``ECHO END``, without it."""
    lines = []
    while END.encode() not in (line := monitor.reply()):
        lines.append(line)
    return lines


def shown(lines: list[bytes]) -> list[bytes]:
    """The lines without their time and client port (checked well formed)."""
    out = []
    for line in lines:
        found = LINE.match(line)
        assert found, line
        assert abs(int(found[1]) - time.time()) < 60
        out.append(found[4])
    return out


def run_script(port: int, script: list[list[str | bytes]], monitor: RawClient
               ) -> tuple[list[bytes], int]:
    """Run ``script`` on a new connection; the monitor's lines, and that
    connection's port."""
    with RawClient(port) as client:
        for words in script:
            client.call(*words)
        client.call("ECHO", END)
        return lines_until_end(monitor), client.sock.getsockname()[1]


@pytest.fixture(scope="module")
def redis():
    server = RedisServer()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def open_daemon(tmp_path_factory):
    with Daemon(tmp_path_factory.mktemp("monitor-open") / "data") as running:
        yield running


@pytest.fixture
def monitors(redis, open_daemon):
    with RawClient(redis.port) as theirs, RawClient(open_daemon.resp_port) as ours:
        for client in (theirs, ours):
            assert client.call("FLUSHALL") == b"+OK\r\n"
            assert client.call("MONITOR") == b"+OK\r\n"
        yield theirs, ours


def test_lines_are_redis_lines(redis, open_daemon, monitors):
    theirs, ours = monitors
    expected, _ = run_script(redis.port, SCRIPT, theirs)
    got, port = run_script(open_daemon.resp_port, SCRIPT, ours)
    assert shown(got) == shown(expected)
    assert all(int(LINE.match(line)[3]) == port for line in got)  # the client's own port
    assert b'"AUTH" "(redacted)" "(redacted)"' in b"".join(got)


def test_pipelined_plain_commands_are_shown(redis, open_daemon, monitors):
    """Plain ZADD/ZSCORE/ZRANGE, which the native paths answer when no
    monitor is attached, pipelined as a client sends them."""
    script = [["ZADD", "p", str(i), f"m{i}"] for i in range(50)] + [
        ["ZSCORE", "p", f"m{i}"] for i in range(20)] + [["ZREVRANGE", "p", "0", "2"]]
    for port, monitor in ((redis.port, monitors[0]), (open_daemon.resp_port, monitors[1])):
        with RawClient(port) as client:
            client.pipeline([*script, ["ECHO", END]])
            lines = shown(lines_until_end(monitor))
        assert lines == [b" ".join(b'"%s"' % w.encode() for w in words) for words in script]


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(words=st.lists(st.binary(max_size=12), min_size=1, max_size=3),
       name=st.sampled_from(["ECHO", "ZSCORE", "ZCARD", "PING"]))
def test_any_bytes_are_quoted_as_redis_quotes_them(redis, open_daemon, monitors, words, name):
    arity = {"ECHO": 1, "ZSCORE": 2, "ZCARD": 1, "PING": 1}[name]
    script: list[list[str | bytes]] = [[name, *words[:arity]]]
    expected, _ = run_script(redis.port, script, monitors[0])
    got, _ = run_script(open_daemon.resp_port, script, monitors[1])
    assert shown(got) == shown(expected)
    for word in words:
        assert quoted(word) == _quoted(word)  # the native and the Python quoting


def test_a_monitor_runs_what_a_redis_monitor_runs(redis, open_daemon):
    """Its own PING is answered, then shown to itself; keyspace commands are
    refused; MONITOR again answers nothing; RESET ends it."""
    script = [["PING"], ["ECHO", "x"], ["ZSCORE", "lb", "a"], ["ZADD", "lb", "1", "a"],
              ["DBSIZE"], ["CLIENT", "ID"], ["MONITOR"], ["TIME"], ["MULTI"], ["EXEC"],
              ["RESET"], ["ECHO", "y"]]
    self_shown = {"PING", "ECHO", "CLIENT", "TIME", "MULTI", "EXEC"}
    replies = {}
    for port in (redis.port, open_daemon.resp_port):
        with RawClient(port) as monitor:
            assert monitor.call("MONITOR") == b"+OK\r\n"
            got = []
            for position, words in enumerate(script):
                monitor.send(encode_request(words))
                if words == ["MONITOR"]:
                    continue  # no reply: the next one is TIME's
                reply = monitor.reply()
                got.append(reply if words[0] not in ("CLIENT", "TIME") else reply[:2])
                if words[0] in self_shown and ["RESET"] not in script[:position]:
                    got.append(shown([monitor.reply()])[0])  # then its line, to itself
            replies[port] = got
    assert replies[open_daemon.resp_port] == replies[redis.port]
    assert b"-ERR Replica can't interact with the keyspace\r\n" in replies[redis.port]


# --- through a daemon with credentials -------------------------------------------------


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    with Daemon(tmp_path_factory.mktemp("monitor-sec") / "data", "--jwt-secret", SECRET,
                "--api-keys", f"{WRITER_ENTRY},{READER_ENTRY}") as running:
        yield running


def native_writes(client: RawClient) -> int:
    info = client.call("INFO", "stats").decode()
    return int(re.search(r"rankd_native_writes:(\d+)", info)[1])


def test_monitor_is_for_admins_and_redacts_credentials(secured):
    port = secured.resp_port
    with RawClient(port) as reader, RawClient(port) as writer, RawClient(port) as admin:
        assert reader.call("AUTH", READER_KEY) == b"+OK\r\n"
        assert reader.call("MONITOR").startswith(b"-NOPERM ")
        assert writer.call("AUTH", WRITER_KEY) == b"+OK\r\n"
        assert writer.call("MONITOR").startswith(b"-NOPERM ")
        assert admin.call("AUTH", ADMIN) == b"+OK\r\n"
        assert admin.call("CLIENT", "INFO").find(b" flags=N ") > 0
        assert admin.call("MONITOR") == b"+OK\r\n"
        with RawClient(port) as client:
            client.call("ZSCORE", "lb", "a")  # before AUTH: NOAUTH, not shown
            assert client.call("AUTH", "wrong-key").startswith(b"-WRONGPASS")
            assert client.call("AUTH", "user", WRITER_KEY) == b"+OK\r\n"
            client.call("AUTH", "a", WRITER_KEY, "c")
            client.call("HELLO", "3", "AUTH", "default", ADMIN, "SETNAME", "me")
            client.call("HELLO", "x", "AUTH", "default", ADMIN)
            # A lone token, with or without a version or an option before:
            # shown redacted all the same (they once went out in clear).
            client.call("HELLO", "3", "AUTH", ADMIN)
            client.call("HELLO", "AUTH", ADMIN)
            client.call("HELLO", "3", "SETNAME", "n", "AUTH", ADMIN)
            client.call("MONITOR")  # a writer: NOPERM, not shown
            client.call("ECHO", END)
        text = b"\n".join(shown(lines_until_end(admin)))
        assert text == b"\n".join([
            b'"AUTH" "(redacted)"', b'"AUTH" "(redacted)" "(redacted)"',
            b'"AUTH" "(redacted)" "(redacted)" "(redacted)"',
            b'"HELLO" "3" "AUTH" "(redacted)" "(redacted)" "SETNAME" "me"',
            b'"HELLO" "x" "AUTH" "(redacted)" "(redacted)"',
            b'"HELLO" "3" "AUTH" "(redacted)"', b'"HELLO" "AUTH" "(redacted)"',
            b'"HELLO" "3" "SETNAME" "n" "AUTH" "(redacted)"'])
        assert WRITER_KEY.encode() not in text and ADMIN.encode() not in text


@pytest.mark.skipif(not FAST_WRITES, reason="the native paths are not built (or not used)")
def test_native_paths_are_shown_then_resumed(secured):
    """A plain ZADD takes the native path; with a monitor attached it goes
    the general way and is shown; once the monitor is gone it is native again."""
    port = secured.resp_port
    with RawClient(port) as admin, RawClient(port) as client:
        admin.call("AUTH", ADMIN)
        client.call("AUTH", token("admin write read"))
        client.call("ZADD", "native", "1", "a")  # made (the general way), then:
        before = native_writes(client)
        client.call("ZADD", "native", "2", "a")
        assert native_writes(client) == before + 1
        assert admin.call("MONITOR") == b"+OK\r\n"
        client.call("ZADD", "native", "3", "a")
        client.call("ZSCORE", "native", "a")
        client.call("ECHO", END)
        assert shown(lines_until_end(admin)) == [b'"ZADD" "native" "3" "a"',
                                                 b'"ZSCORE" "native" "a"']
        assert admin.call("CLIENT", "INFO").find(b" flags=O ") > 0
        assert shown([admin.reply()]) == [b'"CLIENT" "INFO"']  # (to itself, after its reply)
        assert admin.call("RESET") == b"+RESET\r\n"  # (shown to other monitors only)
        assert admin.call("ZCARD", "native") == b"-NOAUTH Authentication required.\r\n"
        counted = native_writes(client)
        client.call("ZADD", "native", "4", "a")
        assert native_writes(client) == counted + 1


def test_a_monitor_that_does_not_read_is_disconnected(secured):
    port = secured.resp_port
    slow = socket.socket()
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.connect(("127.0.0.1", port))
    slow.sendall(encode_request(["AUTH", ADMIN]) + encode_request(["MONITOR"]))
    with RawClient(port) as client:
        client.call("AUTH", ADMIN)
        word = b"\x01" * (1 << 20)  # a 4 MiB line each (\x01 is written \x01)
        for _ in range(OUTPUT_LIMIT // (4 << 20) + 6):
            started = time.monotonic()
            assert client.call("ECHO", word) == b"$%d\r\n%s\r\n" % (len(word), word)
            assert time.monotonic() - started < 2
        assert client.call("PING") == b"+PONG\r\n"
    slow.settimeout(10)
    received = 0
    with pytest.raises(OSError):  # the connection reset, or closed:
        while chunk := slow.recv(1 << 20):
            received += len(chunk)
        raise ConnectionResetError
    # What rankd held (never past the limit, not even by one line) and what
    # the kernel's buffers held.
    assert received < OUTPUT_LIMIT + TCP_WMEM_MAX + (64 << 10)
    slow.close()
    assert "would hold more than" in secured.log_path.read_text()
