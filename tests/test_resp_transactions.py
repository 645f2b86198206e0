"""RESP transactions (MULTI/EXEC/DISCARD/WATCH/UNWATCH): Redis's semantics,
checked against a real ``redis-server`` with random sequences from several
connections, real clients' transactional pipelines, and rankd's guarantee on
top: an EXEC is one atomic commit, wholly there or wholly absent after a
``kill -9``."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daemon import Daemon
from redisserver import RedisClient, RedisServer
from respclient import RawClient
from test_resp_aggregates import aggregation, pop, rangestore
from test_resp_differential import KEYS, MEMBERS, SCORES, command, members
from test_resp_expiry import _same

EXAMPLES = int(os.environ.get("RANKD_RESP_EXAMPLES", "300"))
NODE_DIR = Path(__file__).parent / "clients" / "node"
REQUIRED = os.environ.get("RANKD_REQUIRE_CLIENTS", "") not in ("", "0")
CONNECTIONS = 3


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    redis_server = RedisServer()
    daemon = Daemon(tmp_path_factory.mktemp("resp-tx") / "data", "--tcp-port", "0",
                    "--fsync", "no")
    daemon.start()
    try:
        yield redis_server.port, daemon
    finally:
        daemon.stop()
        redis_server.stop()


# --- differential: random transactions from several connections -------------------------

keys = st.sampled_from(KEYS)


#: Any command of the differential test.
ANY_COMMAND = command()


@st.composite
def step(draw, commands: st.SearchStrategy = ANY_COMMAND) -> tuple[int, list[str]]:
    """A command of one of the connections: transaction control (often), or
    one of ``commands`` (queued when inside MULTI; by default any command
    of the differential test)."""
    connection = draw(st.integers(0, CONNECTIONS - 1))
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return connection, ["MULTI"]
    if kind == 1:
        return connection, [draw(st.sampled_from(["EXEC", "exec", "DISCARD"]))]
    if kind == 2:
        return connection, ["WATCH", *draw(st.lists(keys, min_size=1, max_size=3))]
    if kind == 3:
        return connection, draw(st.sampled_from([["UNWATCH"], ["EXEC", "x"], ["MULTI", "x"],
                                                 ["WATCH"], ["RESET"], ["FLUSHALL"]]))
    return connection, draw(commands)


#: Deadlines that keep a key for the test: relative ones, and absolute ones
#: far later (so NX/XX/GT/LT compare them alike on both servers, whose
#: clocks are read a few ms apart); and deadlines that delete it at once.
#: A small positive *relative* deadline (``PEXPIRE k 1``) is not one of
#: them: it passes between the two servers' replies, so it would compare
#: their timing, not their semantics.
RELATIVE_FUTURE = st.integers(1_000_000, 2_000_000)
ABSOLUTE_FUTURE = st.integers(10**7, 10**9)
RELATIVE_PAST = st.sampled_from(["0", "-1", "-100"])
ABSOLUTE_PAST = st.sampled_from(["0", "-1", "-100", "1", "1000"])


@st.composite
def deadline(draw) -> list[str]:
    """EXPIRE, PEXPIRE, EXPIREAT, PEXPIREAT (options, bad ones too), PERSIST."""
    key = draw(st.sampled_from([*KEYS, "absent"]))
    if draw(st.integers(0, 5)) == 0:
        return draw(st.sampled_from([["PERSIST", key], ["EXISTS", key], ["TYPE", key]]))
    name = draw(st.sampled_from(["EXPIRE", "PEXPIRE", "EXPIREAT", "PEXPIREAT", "pexpire"]))
    relative = name.upper() in ("EXPIRE", "PEXPIRE")
    milliseconds = name.upper().startswith("P")
    if draw(st.integers(0, 3)) == 0:
        past = RELATIVE_PAST if relative else ABSOLUTE_PAST
        when = draw(st.one_of(past, st.sampled_from(["abc", "1.5", "9223372036854775807"])))
    else:
        seconds = draw(RELATIVE_FUTURE if relative else ABSOLUTE_FUTURE)
        if not relative:
            seconds += int(time.time())
        when = str(seconds * 1000 if milliseconds else seconds)
    options = draw(st.lists(st.sampled_from(["NX", "XX", "GT", "LT", "gt", "FOO"]), max_size=2))
    return [name, key, when, *options]


#: The commands of a transaction: deadlines, stores and pops (blocking ones
#: too) mixed with the writes they meet (ZADD, ZINCRBY, ZREM).
txmore_command = st.one_of(
    deadline(), aggregation(), rangestore(), pop(),
    st.builds(lambda key, pairs: ["ZADD", key, *[w for p in pairs for w in p]],
              st.sampled_from(KEYS), st.lists(st.tuples(st.sampled_from(SCORES), members),
                                              min_size=1, max_size=3)),
    st.builds(lambda key, score, member: ["ZINCRBY", key, score, member],
              st.sampled_from(KEYS), st.sampled_from(SCORES), members),
    st.builds(lambda key, member: ["ZREM", key, member], st.sampled_from(KEYS), members))


def _answer_alike(servers, protocol: int, steps: list[tuple[int, list[str]]]) -> None:
    """Run ``steps`` on both servers, comparing every reply, then the keys'
    members, scores and deadlines."""
    redis_port, daemon = servers
    pairs = [(RedisClient(redis_port), RawClient(daemon.resp_port)) for _ in range(CONNECTIONS)]
    try:
        for redis_client, rankd_client in pairs:
            for client in (redis_client, rankd_client):
                if protocol == 3:
                    client.call("HELLO", "3")
        pairs[0][0].call("FLUSHALL")
        pairs[0][1].call("FLUSHALL")
        for connection, words in steps:
            redis_client, rankd_client = pairs[connection]
            expected = redis_client.call(*words)
            if words[0] == "RESET" and protocol == 3:  # RESET goes back to RESP2: again 3
                redis_client.call("HELLO", "3")
            answered = rankd_client.call(*words)
            if words[0] == "RESET" and protocol == 3:
                rankd_client.call("HELLO", "3")
            assert answered == expected, (connection, words, expected, answered)
        for redis_client, rankd_client in pairs:  # leave no transaction open
            redis_client.call("RESET")
            rankd_client.call("RESET")
        for key in KEYS:
            words = ["ZRANGE", key, "0", "-1", "WITHSCORES"]
            assert pairs[0][1].call(*words) == pairs[0][0].call(*words), key
            expected, answered = pairs[0][0].call("PTTL", key), pairs[0][1].call("PTTL", key)
            assert _same(["PTTL"], expected, answered), (key, expected, answered)
    finally:
        for redis_client, rankd_client in pairs:
            redis_client.close()
            rankd_client.close()


@pytest.mark.parametrize("protocol", [2, 3])
@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(steps=st.lists(step(), min_size=1, max_size=50))
def test_transactions_from_several_connections_answer_as_redis(servers, protocol, steps):
    _answer_alike(servers, protocol, steps)


@pytest.mark.parametrize("protocol", [2, 3])
@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(steps=st.lists(step(txmore_command), min_size=1, max_size=50))
def test_deadlines_stores_and_pops_in_transactions_answer_as_redis(servers, protocol, steps):
    """Random transactions from several connections holding EXPIRE and its
    kin, PERSIST, the stores, ZMPOP and the blocking pops (which never
    block inside MULTI), mixed with ZADD/ZINCRBY/ZREM, WATCH and DISCARD."""
    _answer_alike(servers, protocol, steps)


@pytest.mark.parametrize("protocol", [2, 3])
def test_pipelined_transactions_answer_as_redis(servers, protocol):
    """MULTI ... EXEC sent in one pipeline (the plain writes inside are not
    taken by the native path: they are queued), interleaved with plain
    pipelined writes and reads before and after."""
    redis_port, daemon = servers
    pipeline = [["FLUSHALL"]]
    for i in range(60):
        key, member = KEYS[i % 3], MEMBERS[i % len(MEMBERS)]
        pipeline += [["ZINCRBY", key, "1", member], ["ZSCORE", key, member], ["MULTI"],
                     ["ZADD", key, str(i), member], ["ZINCRBY", KEYS[(i + 1) % 3], "2", member],
                     ["ZSCORE", key, member], ["ZREVRANGE", key, "0", "2", "WITHSCORES"]]
        if i % 7 == 0:
            pipeline.append(["ZPOPMIN", key])
        if i % 11 == 0:
            pipeline.append(["NOSUCHCOMMAND"])
        pipeline += [["DISCARD" if i % 5 == 0 else "EXEC"], ["ZCARD", key]]
    with RedisClient(redis_port) as redis_client, RawClient(daemon.resp_port) as rankd_client:
        if protocol == 3:
            redis_client.call("HELLO", "3")
            rankd_client.call("HELLO", "3")
        assert rankd_client.pipeline(pipeline) == redis_client.pipeline(pipeline)


def test_watch_sees_writes_from_rest(servers):
    """A watched board written through REST (another front-end) aborts EXEC."""
    _, daemon = servers
    with RawClient(daemon.resp_port) as client:
        client.call("FLUSHALL")
        assert client.call("ZADD", "watched", "1", "a") == b":1\r\n"
        assert client.call("WATCH", "watched") == b"+OK\r\n"
        status, _ = daemon.request("POST", "/v1/boards/watched/scores",
                                   {"member": "b", "score": 2})
        assert status == 200
        assert client.call("MULTI") == b"+OK\r\n"
        assert client.call("ZADD", "watched", "9", "a") == b"+QUEUED\r\n"
        assert client.call("EXEC") == b"*-1\r\n"
        assert client.call("ZSCORE", "watched", "a") == b"$1\r\n1\r\n"
        # Deleted through REST: aborted too.
        assert client.call("WATCH", "watched") == b"+OK\r\n"
        assert daemon.request("DELETE", "/v1/boards/watched")[0] in (200, 204)
        assert client.call("MULTI") == b"+OK\r\n"
        assert client.call("ZADD", "watched", "9", "a") == b"+QUEUED\r\n"
        assert client.call("EXEC") == b"*-1\r\n"
        assert client.call("EXISTS", "watched") == b":0\r\n"


#: One transaction of each command once refused when queued, with reads
#: after each (they see it), run-time errors (a bad option, a negative
#: timeout) among them, then queue-time errors (wrong arity: EXECABORT).
EVERY_WRITE = [
    ["FLUSHALL"], ["ZADD", "d1", "1", "a", "2", "b"], ["ZADD", "d2", "3", "b", "4", "c"],
    ["MULTI"], ["ZINCRBY", "d1", "5", "a"], ["ZUNIONSTORE", "w", "2", "d1", "d2"],
    ["ZRANGE", "w", "0", "-1", "WITHSCORES"], ["EXPIRE", "w", "100000"], ["TTL", "w"],
    ["PERSIST", "w"], ["TTL", "w"], ["EXPIRE", "w", "100", "XX"], ["EXPIRE", "w", "100", "BOGUS"],
    ["PEXPIRE", "w", "100000000", "GT"], ["EXPIREAT", "w", "1", "NX"], ["PEXPIREAT", "d2", "1"],
    ["EXISTS", "d2"], ["ZADD", "d2", "9", "z"], ["TTL", "d2"], ["EXPIRE", "absent", "100"],
    ["BZPOPMIN", "nothing", "0"], ["BZPOPMAX", "nothing", "d1", "0"],
    ["BZMPOP", "0", "2", "nothing", "d1", "MIN", "COUNT", "5"], ["BZMPOP", "0", "1", "x", "MAX"],
    ["BZPOPMIN", "x", "-1"], ["ZINTERSTORE", "i", "2", "d1", "w", "WEIGHTS", "2", "3"],
    ["ZDIFFSTORE", "df", "1", "w"], ["ZRANGESTORE", "rs", "w", "0", "1"],
    ["ZRANGE", "rs", "0", "-1", "WITHSCORES"], ["ZUNIONSTORE", "w", "0", "d1"],
    ["ZINTERSTORE", "i", "2", "d1", "nothing"], ["EXISTS", "i"], ["EXPIRE", "rs", "0"],
    ["ZUNIONSTORE", "rs", "1", "rs"], ["EXEC"],
    ["ZRANGE", "w", "0", "-1", "WITHSCORES"], ["ZRANGE", "df", "0", "-1", "WITHSCORES"],
    ["ZRANGE", "d1", "0", "-1", "WITHSCORES"], ["EXISTS", "rs", "i", "d2"], ["TTL", "w"],
    ["MULTI"], ["ZADD", "w", "1", "q"], ["EXPIRE", "w"], ["ZUNIONSTORE", "w", "x"],
    ["BZPOPMIN", "w"], ["EXEC"], ["ZSCORE", "w", "q"],
]


@pytest.mark.parametrize("protocol", [2, 3])
def test_every_write_command_runs_inside_exec_as_in_redis(servers, protocol):
    """EXPIRE and its kin, PERSIST, the stores and the blocking pops run
    inside EXEC as Redis runs them (they were refused when queued, which
    discarded the transaction): later commands see what they did."""
    redis_port, daemon = servers
    with RedisClient(redis_port) as redis_client, RawClient(daemon.resp_port) as rankd_client:
        for client in (redis_client, rankd_client):
            if protocol == 3:
                client.call("HELLO", "3")
        for words in EVERY_WRITE:
            expected = redis_client.call(*words)
            assert rankd_client.call(*words) == expected, words


#: Each: what another client does to the watched key ``k`` (set up as
#: ``ZADD k 1 a``, ``ZADD src 2 b``), as Redis counts it (a change aborts
#: the watcher's EXEC) or not.
TOUCHES = [
    [["EXPIRE", "k", "1000"]], [["PERSIST", "k"]], [["EXPIRE", "k", "1000", "GT"]],
    [["PEXPIREAT", "k", "1"]], [["EXPIRE", "k", "1000"], ["PERSIST", "k"]],
    [["ZUNIONSTORE", "k", "1", "src"]], [["ZINTERSTORE", "k", "2", "src", "nothing"]],
    [["ZINTERSTORE", "nothing", "2", "src", "k"]], [["ZRANGESTORE", "k", "src", "0", "0"]],
    [["BZPOPMIN", "k", "0.01"]], [["BZMPOP", "0.01", "2", "nothing", "k", "MAX"]],
    [["BZPOPMAX", "src", "0.01"]],
    [["MULTI"], ["EXPIRE", "k", "1000"], ["EXEC"]],
    [["MULTI"], ["EXPIRE", "k", "1000", "XX"], ["EXEC"]],
    [["MULTI"], ["ZDIFFSTORE", "k", "1", "src"], ["EXEC"]],
    [["MULTI"], ["BZPOPMIN", "k", "0"], ["EXEC"]],
    [["MULTI"], ["BZPOPMIN", "nothing", "0"], ["EXEC"]],
]


@pytest.mark.parametrize("touch", TOUCHES, ids=lambda t: " ".join(map(" ".join, t)))
def test_watch_sees_deadlines_stores_and_pops_as_redis(servers, touch):
    """A key whose deadline is set or cleared, a store's destination and a
    popped key count as changed for another client's WATCH (outside MULTI
    and inside another client's EXEC); what leaves them as they were does
    not, as in Redis."""
    script = [("b", ["FLUSHALL"]), ("b", ["ZADD", "k", "1", "a"]), ("b", ["ZADD", "src", "2", "b"]),
              ("a", ["WATCH", "k"]), *(("b", words) for words in touch), ("a", ["MULTI"]),
              ("a", ["ZADD", "k", "5", "z"]), ("a", ["EXEC"]),
              ("a", ["ZRANGE", "k", "0", "-1", "WITHSCORES"]), ("a", ["EXISTS", "k", "src"])]
    _two_clients_answer_alike(servers, script)


def _two_clients_answer_alike(servers, script: list[tuple[str, list[str]]]) -> None:
    """Run ``script`` (client "a" or "b", command) on Redis and on rankd, two
    connections each: every answer rankd gives is Redis's."""
    redis_port, daemon = servers
    with RedisClient(redis_port) as redis_a, RedisClient(redis_port) as redis_b, \
            RawClient(daemon.resp_port) as rankd_a, RawClient(daemon.resp_port) as rankd_b:
        clients = {"a": (redis_a, rankd_a), "b": (redis_b, rankd_b)}
        for who, words in script:
            redis_client, rankd_client = clients[who]
            expected = redis_client.call(*words)
            assert rankd_client.call(*words) == expected, (who, words)


@pytest.mark.parametrize("made_and_dropped", [
    [["ZINCRBY", "k", "0", "a"], ["FLUSHALL"]],
    [["ZADD", "k", "1", "a"], ["ZREM", "k", "a"]],
    [["ZADD", "k", "1", "a"], ["DEL", "k"]],
    [["ZADD", "other", "1", "a"], ["DEL", "other"]],
], ids=["flushall", "last member removed", "del", "another key"])
def test_watch_sees_a_key_made_and_dropped_again_as_redis(servers, made_and_dropped):
    """A watched key absent at WATCH, made and dropped again before EXEC,
    was touched: Redis aborts the EXEC.  Its board was absent at both looks,
    so only the drops counted in between tell (the state's ``dropped``);
    another key made and dropped does not abort it."""
    script = [("b", ["FLUSHALL"]), ("a", ["WATCH", "k"]),
              *(("b", words) for words in made_and_dropped), ("a", ["MULTI"]),
              ("a", ["ZADD", "k", "5", "z"]), ("a", ["EXEC"]),
              ("a", ["ZRANGE", "k", "0", "-1", "WITHSCORES"])]
    _two_clients_answer_alike(servers, script)


def test_emptying_a_board_inside_exec_clears_its_deadline_as_redis(servers):
    """A board emptied by a pop inside EXEC loses its deadline, as a Redis
    key that went away with its last member and came back would."""
    redis_port, daemon = servers
    script = [["FLUSHALL"], ["ZADD", "short", "1", "a"], ["EXPIRE", "short", "100"],
              ["MULTI"], ["ZPOPMIN", "short"], ["ZADD", "short", "2", "b"], ["EXEC"],
              ["TTL", "short"], ["ZRANGE", "short", "0", "-1", "WITHSCORES"]]
    with RedisClient(redis_port) as redis_client, RawClient(daemon.resp_port) as rankd_client:
        assert rankd_client.pipeline(script) == redis_client.pipeline(script)


def test_watch_sees_a_board_expire(servers):
    """A watched board whose deadline passes (deleted by its EXPIRED record)
    aborts EXEC, as a deleted key does in Redis."""
    _, daemon = servers
    with RawClient(daemon.resp_port) as client:
        client.call("FLUSHALL")
        assert client.call("ZADD", "brief", "1", "a") == b":1\r\n"
        assert client.call("WATCH", "brief") == b"+OK\r\n"
        assert client.call("PEXPIRE", "brief", "50") == b":1\r\n"
        time.sleep(0.3)
        assert client.call("MULTI") == b"+OK\r\n"
        assert client.call("ZADD", "brief", "9", "a") == b"+QUEUED\r\n"
        assert client.call("EXEC") == b"*-1\r\n"
        assert client.call("EXISTS", "brief") == b":0\r\n"


def test_queue_is_bounded(servers, monkeypatch):
    """Past the queue's bound the command is refused and EXEC aborts."""
    _, daemon = servers
    with RawClient(daemon.resp_port) as client:
        client.call("FLUSHALL")
        assert client.call("MULTI") == b"+OK\r\n"
        big = "x" * 500_000
        replies = client.pipeline([["ZADD", "bounded", "1", big[:200]]]
                                  + [["ECHO", big]] * 9)
        assert replies[0] == b"+QUEUED\r\n"
        assert any(r.startswith(b"-ERR rankd queues at most") for r in replies), replies
        assert client.call("ZADD", "bounded", "2", "b") == b"+QUEUED\r\n"
        assert client.call("EXEC").startswith(b"-EXECABORT")
        assert client.call("EXISTS", "bounded") == b":0\r\n"


# --- real clients -------------------------------------------------------------------------


BOARDS = ["tx-daily", "tx-weekly", "tx-all"]


@pytest.mark.parametrize("protocol", [2, 3])
def test_redis_py_transactional_pipeline_is_all_or_nothing(servers, protocol):
    _, daemon = servers
    client = redis.Redis(port=daemon.resp_port, protocol=protocol, decode_responses=True)
    other = redis.Redis(port=daemon.resp_port, decode_responses=True)
    try:
        client.delete(*BOARDS)
        with client.pipeline(transaction=True) as pipe:
            for board in BOARDS:
                pipe.zincrby(board, 10, "alice")
            assert [float(v) for v in pipe.execute()] == [10, 10, 10]
        with client.pipeline(transaction=True) as pipe:  # a queue-time error: nothing
            for board in BOARDS:
                pipe.zincrby(board, 5, "alice")
            pipe.execute_command("NOSUCHCOMMAND", "x")
            with pytest.raises(redis.exceptions.ResponseError):
                pipe.execute()
        with client.pipeline(transaction=True) as pipe:  # WATCH, then written by another
            pipe.watch("tx-all")
            other.zadd("tx-all", {"bob": 1})
            pipe.multi()
            for board in BOARDS:
                pipe.zincrby(board, 7, "alice")
            with pytest.raises(redis.exceptions.WatchError):
                pipe.execute()
        assert [client.zscore(board, "alice") for board in BOARDS] == [10, 10, 10]
    finally:
        client.close()
        other.close()


@pytest.mark.npm("tests/clients/node")
@pytest.mark.parametrize("library", ["io", "node-redis"])
def test_node_clients_transactions_are_all_or_nothing(servers, library):
    _, daemon = servers
    node = shutil.which("node")
    package = "ioredis" if library == "io" else "redis"
    if node is None or not (NODE_DIR / "node_modules" / package).is_dir():
        reason = f"node or {package} is not installed: run `npm ci` in tests/clients/node"
        if REQUIRED:
            pytest.fail(f"{reason} (RANKD_REQUIRE_CLIENTS is set)")
        pytest.skip(reason)
    with RawClient(daemon.resp_port) as client:
        client.call("DEL", *BOARDS)
    done = subprocess.run([node, str(NODE_DIR / "transactions.mjs"), str(daemon.resp_port),
                           library], capture_output=True, text=True, timeout=60, cwd=NODE_DIR)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert [float(v) for v in out["applied"]] == [10, 10, 10]
    assert "EXECABORT" in out["aborted"]
    assert out["watched"] in (None, "WatchError")
    assert [float(v) for v in out["scores"]] == [10, 10, 10]


# --- the guarantee: one commit, after kill -9 too ------------------------------------------


def _exec_stream(port: int, worker: int, acked: list[int], stop: threading.Event) -> None:
    """EXECs incrementing member ``w<worker>-<n>`` on three boards together,
    eight in flight at a time; each acknowledged one is noted."""
    request = b""
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    except OSError:
        return
    buffer = b""
    n = 0
    try:
        while not stop.is_set():
            batch = range(n, n + 8)
            request = b"".join(
                _encode(["MULTI"]) + b"".join(_encode(["ZINCRBY", board, "1", f"w{worker}-{i}"])
                                              for board in BOARDS) + _encode(["EXEC"])
                for i in batch)
            sock.sendall(request)
            for i in batch:
                # +OK, 3 x +QUEUED, then the EXEC's array of 3 bulk strings.
                while buffer.count(b"\r\n") < 4 + 1 + 6:
                    chunk = sock.recv(65536)
                    if not chunk:
                        return
                    buffer += chunk
                lines = buffer.split(b"\r\n")
                assert lines[:4] == [b"+OK", b"+QUEUED", b"+QUEUED", b"+QUEUED"], lines[:6]
                assert lines[4] == b"*3", lines[4]
                buffer = b"\r\n".join(lines[11:])
                acked.append(i)
            n += 8
    except OSError:
        return
    finally:
        sock.close()


def _encode(words: list[str]) -> bytes:
    out = [b"*%d\r\n" % len(words)]
    for word in words:
        data = word.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


@pytest.mark.parametrize("fsync", ["no", "always"])
def test_exec_is_whole_or_absent_after_kill_9(tmp_path, fsync):
    """A stream of EXECs, each adding 1 to one member on three boards, from
    four connections while the daemon is killed with SIGKILL at random
    moments, a few times over: after each restart every member has the same
    score on the three boards (no transaction half there), and every
    acknowledged one is there."""
    data_dir = tmp_path / "data"
    acknowledged: dict[int, list[int]] = {w: [] for w in range(4)}
    for cycle, pause in enumerate([0.4, 0.7, 0.25, 0.9]):
        daemon = Daemon(data_dir, "--tcp-port", "0", "--fsync", fsync)
        daemon.start()
        if cycle == 0:
            with RawClient(daemon.resp_port) as client:
                for board in BOARDS:  # the boards exist: the writes are plain ones
                    client.call("ZADD", board, "0", "seed")
        stop = threading.Event()
        acked: dict[int, list[int]] = {w: [] for w in range(4)}
        workers = [threading.Thread(target=_exec_stream, args=(daemon.resp_port, w + 10 * cycle,
                                                               acked[w], stop))
                   for w in range(4)]
        for worker in workers:
            worker.start()
        time.sleep(pause)
        daemon.kill()
        stop.set()
        for worker in workers:
            worker.join(30)
        for w in range(4):
            acknowledged.setdefault(w + 10 * cycle, []).extend(acked[w])
    assert sum(map(len, acknowledged.values())) > 100
    daemon = Daemon(data_dir, "--tcp-port", "0", "--fsync", fsync)
    daemon.start()
    try:
        client = redis.Redis(port=daemon.resp_port, decode_responses=True)
        scores = [dict(client.zrange(board, 0, -1, withscores=True)) for board in BOARDS]
        client.close()
    finally:
        daemon.stop()
    assert scores[0] == scores[1] == scores[2], "a transaction is half there"
    for worker, done in acknowledged.items():
        for i in done:
            assert scores[0].get(f"w{worker}-{i}") == 1, (worker, i)


def _store_stream(port: int, worker: int, acked: list[int], stop: threading.Event) -> None:
    """EXECs of worker ``w``, eight in flight at a time, each: a store of
    ``c:w`` into ``b:w`` (before it changes: computed ahead of the step),
    ``ZINCRBY c:w 1 n``, a ZINCRBY of member ``w-i`` on three boards, a
    store of ``c:w`` into ``a:w`` (after: computed in the step), and a
    deadline on both stores; each acknowledged one is noted."""
    count, before, after = f"c:{worker}", f"b:{worker}", f"a:{worker}"
    try:
        client = RawClient(port)
    except OSError:
        return
    n = 0
    try:
        while not stop.is_set():
            batch = range(n, n + 8)
            pipeline = []
            for i in batch:
                pipeline += [["MULTI"], ["ZUNIONSTORE", before, "1", count],
                             ["ZINCRBY", count, "1", "n"],
                             *(["ZINCRBY", board, "1", f"w{worker}-{i}"] for board in BOARDS),
                             ["ZUNIONSTORE", after, "1", count], ["EXPIRE", after, "100000"],
                             ["EXPIRE", before, "100000"], ["EXEC"]]
            client.send(b"".join(_encode(words) for words in pipeline))
            for i in batch:
                replies = [client.reply() for _ in range(10)]
                assert replies[:9] == [b"+OK\r\n"] + [b"+QUEUED\r\n"] * 8, replies
                assert replies[9].startswith(b"*8\r\n") and b"\r\n-" not in replies[9], \
                    replies[9]
                acked.append(i)
            n += 8
    except OSError:
        return
    finally:
        client.close()


@pytest.mark.parametrize("fsync", ["no", "always"])
def test_exec_with_stores_and_deadlines_is_whole_or_absent_after_kill_9(tmp_path, fsync):
    """The kill -9 test of EXECs holding two stores (one computed before
    the step, one in it), two EXPIREs and ZINCRBYs: after each restart
    every transaction is wholly there or wholly absent (the stores hold the
    count before and after the transaction's increment, both with their
    deadline; the three boards agree), and every acknowledged one is there."""
    data_dir = tmp_path / "data"
    acknowledged: dict[int, list[int]] = {}
    for cycle, pause in enumerate([0.5, 0.8, 0.3, 1.0]):
        daemon = Daemon(data_dir, "--tcp-port", "0", "--fsync", fsync)
        daemon.start()
        if cycle == 0:
            with RawClient(daemon.resp_port) as client:
                for board in BOARDS:
                    client.call("ZADD", board, "0", "seed")
        stop = threading.Event()
        acked: dict[int, list[int]] = {w + 10 * cycle: [] for w in range(4)}
        workers = [threading.Thread(target=_store_stream,
                                    args=(daemon.resp_port, w, acked[w], stop))
                   for w in acked]
        for worker in workers:
            worker.start()
        time.sleep(pause)
        daemon.kill()
        stop.set()
        for worker in workers:
            worker.join(30)
        acknowledged.update(acked)
    assert sum(map(len, acknowledged.values())) > 50
    daemon = Daemon(data_dir, "--tcp-port", "0", "--fsync", fsync)
    daemon.start()
    try:
        client = redis.Redis(port=daemon.resp_port, decode_responses=True)
        scores = [dict(client.zrange(board, 0, -1, withscores=True)) for board in BOARDS]
        for worker, done in acknowledged.items():
            count = int(client.zscore(f"c:{worker}", "n") or 0)
            assert count >= len(done), (worker, count, len(done))
            after, before = f"a:{worker}", f"b:{worker}"
            if count == 0:
                assert client.exists(after, before) == 0, worker
                continue
            assert client.zscore(after, "n") == count, (worker, "after")
            assert client.pttl(after) > 0, (worker, "after's deadline")
            if count == 1:
                assert client.exists(before) == 0, worker
            else:
                assert client.zscore(before, "n") == count - 1, (worker, "before")
                assert client.pttl(before) > 0, (worker, "before's deadline")
            applied = [i for i in range(count) if scores[0].get(f"w{worker}-{i}") == 1]
            assert applied == list(range(count)), (worker, "increments", count)
        client.close()
    finally:
        daemon.stop()
    assert scores[0] == scores[1] == scores[2], "a transaction is half there"
    for worker, done in acknowledged.items():
        for i in done:
            assert scores[0].get(f"w{worker}-{i}") == 1, (worker, i)


# --- bounds: what one EXEC's step may do ------------------------------------------------


def test_an_exec_step_is_bounded_and_its_stores_computed_in_steps(tmp_path):
    """A store whose inputs the transaction does not write is computed
    before EXEC's step, in steps (another client's PINGs are answered
    within a few ms meanwhile: the best of three tries, as a busy machine
    may delay a PING by itself); one whose inputs it wrote is computed in
    the step, within ``MAX_STEP_READ`` entries (else its error, the rest
    applied); the stores of one EXEC write ``MAX_STEP_STORED`` members."""
    with Daemon(tmp_path / "data", "--fsync", "no") as daemon, \
            RawClient(daemon.resp_port) as client, RawClient(daemon.resp_port) as other:
        for key, start in (("a", 0), ("b", 55_000)):  # 60,000 each, 5,000 in both
            for first in range(start, start + 60_000, 10_000):
                words = [w for i in range(first, first + 10_000) for w in (str(i), f"m{i}")]
                assert client.call("ZADD", key, *words) == b":10000\r\n"
        worsts = []
        for _ in range(3):
            client.send(b"".join(_encode(words) for words in [
                ["MULTI"], ["ZINCRBY", "elsewhere", "1", "x"],
                ["ZINTERSTORE", "both", "2", "a", "b"], ["EXPIRE", "both", "1000"],
                ["ZCARD", "both"], ["EXEC"]]))
            worst = 0.0
            deadline = time.monotonic() + 0.4
            while time.monotonic() < deadline:
                started = time.monotonic()
                assert other.call("PING") == b"+PONG\r\n"
                worst = max(worst, time.monotonic() - started)
            replies = [client.reply() for _ in range(6)]
            assert replies[-1].startswith(b"*4\r\n$1\r\n") and replies[-1].endswith(
                b":5000\r\n:1\r\n:5000\r\n"), replies[-1]
            worsts.append(worst)
            if worst < 0.06:
                break
        assert min(worsts) < 0.06, worsts
        replies = client.pipeline([["MULTI"], ["ZADD", "a", "1", "new"],
                                   ["ZINTERSTORE", "again", "2", "a", "b"], ["EXEC"]])
        assert replies[-1].startswith(b"*2\r\n:1\r\n-ERR rankd computes at most 16384 "
                                      b"entries of aggregations in the step of one EXEC"), \
            replies[-1]
        assert client.call("EXISTS", "again") == b":0\r\n"
        assert client.call("ZSCORE", "a", "new") == b"$1\r\n1\r\n"
        replies = client.pipeline([["MULTI"], ["ZRANGESTORE", "first", "a", "0", "5999"],
                                   ["ZRANGESTORE", "second", "a", "0", "5999"],
                                   ["ZRANGESTORE", "third", "a", "0", "3999"], ["EXEC"]])
        assert replies[-1] == (b"*3\r\n:6000\r\n-ERR rankd stores at most 10000 members in "
                               b"one EXEC (they are written in one step); store fewer\r\n"
                               b":4000\r\n"), replies[-1]
        assert client.call("EXISTS", "first", "second", "third") == b":2\r\n"
