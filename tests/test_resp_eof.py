"""A client that pipelines commands and then closes (or half-closes) its
connection: every command the server received before the EOF runs, in
order, as in Redis (``redis-cli --pipe``, ``nc -q0``, a batch then
``shutdown(SHUT_WR)``).  The same bytes go to a real ``redis-server`` and
to rankd; the replies of a half-close and the state left behind (read
from another connection) must match.

A full close gets no replies; the commands still run.  The pipelines of
full closes stay under 16 KiB, what Redis reads at once: past that a
Redis that meets the client's reset while answering drops the rest (rankd
runs all it has read, which is at least as much).
"""

from __future__ import annotations

import contextlib
import signal
import socket
import ssl
import time

import pytest

from daemon import Daemon
from rankd.frontends.resp.protocol import encode_request
from redisserver import RedisClient, RedisServer, as_redis_72, paired
from respclient import RawClient


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    with paired(tmp_path_factory.mktemp("resp-eof") / "data", "--fsync", "no") as ports:
        yield ports


def _payload(commands: list[list[str]]) -> bytes:
    return b"".join(encode_request(words) for words in commands)


def half_close(port: int, payload: bytes, timeout: float = 20.0) -> bytes:
    """Send ``payload``, half-close, and read every reply until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(1 << 16):
            chunks.append(chunk)
    return b"".join(chunks)


def full_close(port: int, payload: bytes) -> None:
    """Send ``payload`` and close at once, reading nothing."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(payload)


def _state(client: RawClient, keys: list[str]) -> list[bytes]:
    return [client.call("ZRANGE", key, "0", "-1", "WITHSCORES") for key in keys]


def _flush(*clients: RawClient) -> None:
    for client in clients:
        assert client.call("FLUSHALL") == b"+OK\r\n"


def settled_state(port: int, keys: list[str], expected: list[bytes],
                  timeout: float = 10.0) -> list[bytes]:
    """The state of ``keys`` once it equals ``expected`` (or at ``timeout``):
    after a full close no reply says when the server is done."""
    deadline = time.monotonic() + timeout
    with RawClient(port) as client:
        while True:
            state = [as_redis_72(part) for part in _state(client, keys)]
            if state == expected or time.monotonic() > deadline:
                return state
            time.sleep(0.05)


def compare(servers, setup: list[list[str]], commands: list[list[str]], keys: list[str],
            mode: str) -> bytes:
    """Run ``setup`` on both servers, send ``commands`` and close (``mode``);
    assert both end in the same state (and, half-closed, answer the same).
    Returns rankd's replies."""
    redis_port, rankd_port = servers
    with RedisClient(redis_port) as redis, RawClient(rankd_port) as rankd:
        _flush(redis, rankd)
        if setup:
            assert redis.pipeline(setup) == rankd.pipeline(setup)
    payload = _payload(commands)
    if mode == "half":
        expected_replies = as_redis_72(half_close(redis_port, payload))
        replies = half_close(rankd_port, payload)
        assert replies == expected_replies
    else:
        assert len(payload) < 16 * 1024  # what Redis reads at once (see the docstring)
        full_close(redis_port, payload)
        replies = b""
    with RedisClient(redis_port) as redis:
        time.sleep(0.1 if mode == "full" else 0)
        expected = _state(redis, keys)
    if mode == "full":
        full_close(rankd_port, payload)
    assert settled_state(rankd_port, keys, expected) == expected
    return replies


MODES = ["half", "full"]


@pytest.mark.parametrize("mode", MODES)
def test_plain_commands(servers, mode):
    """The general path: new keys, options, removals, reads, after EOF."""
    commands = [["ZADD", "a", "1", "x", "2", "y"], ["ZADD", "a", "XX", "CH", "5", "x"],
                ["ZINCRBY", "b", "2.5", "m"], ["ZSCORE", "a", "x"], ["ZREM", "a", "y"],
                ["ZADD", "c", "3", "p", "4", "q"], ["ZPOPMAX", "c"], ["DEL", "b"],
                ["ZINCRBY", "b", "-1", "n"], ["ZRANGE", "a", "0", "-1", "WITHSCORES"],
                ["ZADD", "a", "NX", "9", "x", "8", "z"]]
    compare(servers, [], commands, ["a", "b", "c"], mode)


@pytest.mark.parametrize("mode", MODES)
def test_native_write_and_pop_runs(servers, mode):
    """Runs the native lanes take (ZADD/ZINCRBY on an existing key, plain
    ZPOPMIN), one behind the other, behind which the client closes."""
    rounds, size = (12, 8) if mode == "full" else (50, 100)
    setup = [["ZADD", "n", "0", "seed"], ["ZADD", "p", "0", "seed"]]
    commands = []
    for round_ in range(rounds):
        base = round_ * size
        commands += [["ZADD", "n", str(i), f"m{i}"] for i in range(base, base + size)]
        commands += [["ZINCRBY", "n", "1.5", f"m{i}"] for i in range(base, base + size, 3)]
        commands += [["ZADD", "p", str(i), f"q{i}"] for i in range(base, base + size // 2)]
        commands += [["ZPOPMIN", "p"] for _ in range(size // 4)]
    compare(servers, setup, commands, ["n", "p"], mode)


def test_large_pipeline_half_closed(servers):
    """More than the connection queues at once (reading pauses and resumes
    after the EOF is already on its way)."""
    commands = [["ZADD", "big", str(i), f"member:{i}:" + "x" * 40] for i in range(40000)]
    replies = compare(servers, [["ZADD", "big", "0", "seed"]], commands, ["big"], "half")
    assert replies.count(b":1\r\n") == 40000


@pytest.mark.parametrize("mode", MODES)
def test_exec_and_stores(servers, mode):
    """A transaction and stores received before the EOF are applied; a
    MULTI the client never EXECs applies nothing."""
    setup = [["ZADD", "s1", "1", "a", "2", "b"], ["ZADD", "s2", "3", "b", "4", "c"]]
    commands = [["MULTI"], ["ZADD", "t", "1", "x"], ["ZINCRBY", "t", "2", "y"],
                ["ZUNIONSTORE", "u", "2", "s1", "s2"], ["EXEC"],
                ["ZINTERSTORE", "i", "2", "s1", "s2", "WEIGHTS", "2", "3"],
                ["ZRANGESTORE", "r", "s2", "0", "0"],
                ["MULTI"], ["ZADD", "never", "1", "x"], ["DEL", "t"]]
    compare(servers, setup, commands, ["t", "u", "i", "r", "never"], mode)


@pytest.mark.parametrize("mode", MODES)
def test_blocking_pop_at_eof(servers, mode):
    """Redis frees a client whose blocking pop would wait after its EOF:
    the pop and what came after it are dropped; one that finds members pops."""
    setup = [["ZADD", "full", "1", "a", "2", "b"]]
    commands = [["ZADD", "before", "1", "x"], ["BZPOPMIN", "full", "0"],
                ["BZPOPMIN", "empty", "0"], ["ZADD", "after", "1", "x"]]
    replies = compare(servers, setup, commands, ["before", "full", "after"], mode)
    if mode == "half":
        assert replies.startswith(b":1\r\n*3\r\n")


def test_blocked_pop_then_eof_frees_the_client(servers):
    """A pop already blocked when the client half-closes is dropped, and
    the commands queued behind it with it, at once (not at its timeout);
    what came before it is answered and applied."""
    payload = _payload([["ZADD", "k", "0", "seed"]] * 2 + [
        ["ZADD", "k", str(i), f"m{i}"] for i in range(300)] + [
        ["BZPOPMIN", "nothing", "5"], ["ZADD", "after", "1", "x"]])
    for port in servers:
        with RawClient(port) as client:
            _flush(client)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)
            started = time.monotonic()
            chunks = []
            while chunk := sock.recv(1 << 16):
                chunks.append(chunk)
            assert time.monotonic() - started < 2
        assert b"".join(chunks) == b":1\r\n:0\r\n" + b":1\r\n" * 300
        with RawClient(port) as client:
            assert client.call("EXISTS", "after") == b":0\r\n"
            assert client.call("ZCARD", "k") == b":301\r\n"


def test_kill_after_full_close_keeps_what_was_applied(tmp_path):
    """A client pipelines and closes at once; once another connection sees
    the state Redis ends in (and a write of its own is acknowledged, so all
    logged before it is durable), a kill -9 loses none of it."""
    redis = RedisServer()
    daemon = Daemon(tmp_path / "data", "--fsync", "always")
    daemon.start()
    try:
        commands = [["ZADD", "k", "0", "seed"]]
        commands += [["ZADD", "k", str(i), f"m{i}"] for i in range(150)]
        commands += [["ZINCRBY", "k", "2", f"m{i}"] for i in range(0, 150, 7)]
        commands += [["ZADD", "q", "1", "a", "2", "b"], ["ZPOPMIN", "q"],
                     ["MULTI"], ["ZADD", "t", "1", "x"], ["EXEC"]]
        payload = _payload(commands)
        keys = ["k", "q", "t"]
        full_close(redis.port, payload)
        time.sleep(0.2)
        with RedisClient(redis.port) as client:
            expected = _state(client, keys)
        full_close(daemon.resp_port, payload)
        assert settled_state(daemon.resp_port, keys, expected) == expected
        with RawClient(daemon.resp_port) as client:
            # Acknowledged once durable, after all the log holds before it.
            assert client.call("ZADD", "barrier", "1", "x") == b":1\r\n"
        daemon.process.send_signal(signal.SIGKILL)
        daemon.process.wait(10)
        daemon.start()
        with RawClient(daemon.resp_port) as client:
            assert [as_redis_72(part) for part in _state(client, keys)] == expected
    finally:
        daemon.stop()
        redis.stop()


def test_over_tls_a_half_close_still_runs_what_was_sent(tmp_path):
    """asyncio's TLS transport cannot stay open half-closed: the commands
    sent before the EOF run all the same, unanswered."""
    from test_security import _self_signed

    cert, key = _self_signed(tmp_path)
    context = ssl.create_default_context(cafile=str(cert))
    with Daemon(tmp_path / "data", "--tls-cert", str(cert), "--tls-key", str(key),
                ssl_context=context) as daemon:
        commands = [["ZADD", "tls", "0", "seed"]] + [
            ["ZADD", "tls", str(i), f"m{i}"] if i % 3 else ["ZPOPMIN", "tls"]
            for i in range(3000)]
        raw = socket.create_connection(("127.0.0.1", daemon.resp_port), timeout=10)
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
            sock.sendall(_payload(commands))
            sock.shutdown(socket.SHUT_WR)
            with contextlib.suppress(OSError):
                while sock.recv(1 << 16):
                    pass
        expected = 1 + sum(1 for i in range(3000) if i % 3) - 1000
        deadline = time.monotonic() + 10
        while True:
            raw = socket.create_connection(("127.0.0.1", daemon.resp_port), timeout=10)
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
                sock.sendall(encode_request(["ZCARD", "tls"]))
                card = sock.recv(100)
            if card == b":%d\r\n" % expected or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert card == b":%d\r\n" % expected


def test_a_half_closed_client_that_never_reads_is_dropped(tmp_path):
    """Replies wait for a half-closed client no longer than for an open one
    (the idle timeout, at most a minute): then the connection is dropped
    and its slot freed, though it is closing."""
    with Daemon(tmp_path / "data", "--fsync", "no", "--idle-timeout", "2") as daemon, \
            RawClient(daemon.resp_port) as other:
        other.call("ZADD", "wide", *(w for i in range(2000) for w in (str(i), f"m{i:05}")))
        connected = other.call("INFO", "clients")
        assert b"connected_clients:1\r\n" in connected
        sock = socket.create_connection(("127.0.0.1", daemon.resp_port), timeout=10)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        try:
            sock.sendall(_payload([["ZRANGE", "wide", "0", "-1", "WITHSCORES"]] * 300))
            sock.shutdown(socket.SHUT_WR)  # and never reads
            deadline = time.monotonic() + 15
            while b"connected_clients:1\r\n" not in other.call("INFO", "clients"):
                assert time.monotonic() < deadline, "the half-closed client stays"
                time.sleep(0.2)
        finally:
            sock.close()
