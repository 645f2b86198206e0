"""Pipelined pops (``ZPOPMIN``/``ZPOPMAX``, with and without a count) on the
fast paths (``rankd.frontends.resp.pop_lane``, natively, and
``rankd.frontends.resp.pop_runs``): applied at once, a run of them on one
board as one removal, acknowledged with their commit.

Differential: random pipelines mixing pops (and ``ZMPOP``) with ``ZADD``,
``ZINCRBY``, ``ZREM`` and ``ZRANGE`` on the same and on other boards get Redis's replies,
byte for byte, and leave Redis's state.  Through real daemons: a pipeline's
pops share their commits (one fsync for many, under ``--fsync always``);
scopes, rate limits and ``WATCH`` hold as one pop at a time; and after
``kill -9`` no acknowledged pop is lost and none is applied twice.
"""

from __future__ import annotations

import threading
import time
import urllib.request

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daemon import Daemon
from redisserver import RedisClient, RedisServer
from respclient import RawClient
from test_resp_differential import EXAMPLES
from test_security import READER_ENTRY, READER_KEY, SECRET, WRITER_ENTRY, token

KEYS = ["q", "r", "{t}:q"]
MEMBERS = ["a", "b", "c", "d", "e", "f", "g", "m:1", "zz", "é"]
SCORES = ["0", "1", "-1", "2", "2", "1.5", "0.1", "10", "-0", "3"]
COUNTS = ["0", "1", "2", "3", "5", "20", "-1", "x", "01"]

keys = st.sampled_from(KEYS)
members = st.sampled_from(MEMBERS)
scores = st.one_of(st.sampled_from(SCORES), st.integers(-5, 5).map(str))


@st.composite
def pop(draw, key: str | None = None) -> list[str]:
    words = [draw(st.sampled_from(["ZPOPMIN", "ZPOPMAX", "zpopmin", "ZPopMax"])),
             key or draw(keys)]
    if draw(st.booleans()):
        words.append(draw(st.sampled_from(COUNTS)))
    if draw(st.integers(0, 30)) == 0:
        words.append("extra")  # a syntax error in the middle of a run
    return words


@st.composite
def other(draw) -> list[str]:
    key = draw(keys)
    return draw(st.sampled_from([
        ["ZADD", key, draw(scores), draw(members), draw(scores), draw(members)],
        ["ZADD", key, draw(scores), draw(members)],
        ["ZINCRBY", key, draw(scores), draw(members)],
        ["ZREM", key, draw(members), draw(members)],
        ["ZRANGE", key, "0", "-1", "WITHSCORES"],
        ["ZCARD", key],
        ["ZSCORE", key, draw(members)],
        ["ZMPOP", "2", key, draw(keys), draw(st.sampled_from(["MIN", "max"])),
         *draw(st.sampled_from([[], ["COUNT", draw(st.sampled_from(COUNTS))]]))],
    ]))


@st.composite
def pipeline(draw) -> list[list[str]]:
    """Runs of pops on one board (what the fast path takes whole), single
    pops, and other commands, in any order."""
    commands: list[list[str]] = []
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.integers(0, 2))
        if kind == 0:
            key = draw(keys)
            commands += draw(st.lists(pop(key), min_size=2, max_size=20))
        elif kind == 1:
            commands.append(draw(pop()))
        else:
            commands += draw(st.lists(other(), min_size=1, max_size=4))
    return commands


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    redis = RedisServer()
    daemon = Daemon(tmp_path_factory.mktemp("resp-pops") / "data", "--tcp-port", "0",
                    "--fsync", "no")
    daemon.start()
    try:
        yield redis.port, daemon.resp_port
    finally:
        daemon.stop()
        redis.stop()


def _filled(servers, protocol: int) -> tuple[RawClient, RawClient]:
    """Clients of both servers, every board of :data:`KEYS` holding members."""
    redis, rankd = RedisClient(servers[0]), RawClient(servers[1])
    for client in (redis, rankd):
        if protocol == 3:
            client.call("HELLO", "3")
        assert client.call("FLUSHALL") == b"+OK\r\n"
        for number, key in enumerate(KEYS):
            words = [w for i, member in enumerate(MEMBERS) for w in (str(i % (3 + number)),
                                                                     member)]
            client.call("ZADD", key, *words)
    return redis, rankd


@pytest.mark.parametrize("protocol", [2, 3])
@settings(max_examples=max(EXAMPLES // 2, 20), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(commands=pipeline())
def test_pipelined_pops_answer_as_redis(servers, protocol, commands):
    """One pipeline each: the replies are Redis's, in order, and so is what
    the boards hold after."""
    redis, rankd = _filled(servers, protocol)
    with redis, rankd:
        assert rankd.pipeline(commands) == redis.pipeline(commands)
        for key in KEYS:
            words = ["ZRANGE", key, "0", "-1", "WITHSCORES"]
            assert rankd.call(*words) == redis.call(*words), key


@pytest.mark.parametrize("protocol", [2, 3])
def test_a_long_pipeline_of_pops_answers_as_redis(servers, protocol):
    """Thousands of pops, runs past the fast path's bounds (512 commands,
    10,000 members), both ends of one board, and pops of other boards and
    writes in between."""
    redis, rankd = _filled(servers, protocol)
    fill = [w for i in range(12_000) for w in (str(i % 997), f"p{i:05d}")]
    commands = [["ZADD", "big", *fill[:12_000]], ["ZADD", "big", *fill[12_000:]]]
    for i in range(3_000):
        commands.append(["ZPOPMIN" if i % 7 else "ZPOPMAX", "big", *(["3"] if i % 5 == 0 else [])])
        if i % 600 == 599:
            commands += [["ZPOPMIN", "big", "4000"], ["ZPOPMAX", "q"], ["ZADD", "big", "1", "x"],
                         ["ZCARD", "big"]]
    with redis, rankd:
        assert rankd.pipeline(commands) == redis.pipeline(commands)
        assert rankd.call("ZRANGE", "big", "0", "-1", "WITHSCORES") == redis.call(
            "ZRANGE", "big", "0", "-1", "WITHSCORES")


# --- through real daemons ---------------------------------------------------------------


def _metric(daemon: Daemon, name: str) -> float:
    with urllib.request.urlopen(f"{daemon.url}/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "_total "):
                return float(line.split()[-1])
    raise AssertionError(f"no metric {name}")


def test_a_pipelines_pops_share_their_commits(tmp_path):
    """Under ``--fsync always`` 1,000 pipelined pops are acknowledged after
    a handful of fsyncs, not one each (as when every pop awaited its own
    commit), and answer the members in order."""
    with (Daemon(tmp_path / "data", "--tcp-port", "0", "--fsync", "always") as daemon,
          RawClient(daemon.resp_port) as client):
        words = [w for i in range(2_000) for w in (str(i), f"m{i:04d}")]
        assert client.call("ZADD", "shared", *words) == b":2000\r\n"
        before = _metric(daemon, "rankd_wal_fsyncs")
        replies = client.pipeline([["ZPOPMIN", "shared"]] * 500
                                  + [["ZPOPMAX", "shared", "2"]] * 500)
        fsyncs = _metric(daemon, "rankd_wal_fsyncs") - before
        assert replies[0] == b"*2\r\n$5\r\nm0000\r\n$1\r\n0\r\n"
        assert replies[499] == b"*2\r\n$5\r\nm0499\r\n$3\r\n499\r\n"
        assert replies[500] == (b"*4\r\n$5\r\nm1999\r\n$4\r\n1999\r\n"
                                b"$5\r\nm1998\r\n$4\r\n1998\r\n")
        assert client.call("ZCARD", "shared") == b":500\r\n"
    assert fsyncs <= 40, fsyncs


@pytest.fixture(scope="module")
def limited(tmp_path_factory):
    """Credentials limited to 10 writes/s (a burst of 20), boards ``lim1``..
    ``lim3`` of 300 members each (written before the limit was set)."""
    data_dir = tmp_path_factory.mktemp("resp-pop-limits") / "data"
    with Daemon(data_dir) as unlimited, RawClient(unlimited.resp_port) as client:
        for key in ("lim1", "lim2", "lim3"):
            words = [w for i in range(300) for w in (str(i), f"m{i:03d}")]
            assert client.call("ZADD", key, *words) == b":300\r\n"
    with Daemon(data_dir, "--jwt-secret", SECRET, "--api-keys",
                f"{WRITER_ENTRY},{READER_ENTRY}", "--rate-credential-writes", "10") as running:
        yield running


def _answered(port: int, credential: str, commands: list[list[str]]) -> list[bytes]:
    with RawClient(port) as client:
        assert client.call("AUTH", credential) == b"+OK\r\n"
        return client.pipeline(commands)


def test_pipelined_pops_are_admitted_one_by_one(limited):
    """A run of 100 pops from a credential limited to a burst of 20 pops 20
    (or one more, refilled meanwhile) and refuses the rest, as the same pops
    each followed by a read (no run) do; a read-only key's pops are all
    refused and pop nothing."""
    port = limited.resp_port
    run = _answered(port, token("write", sub="runs"), [["ZPOPMIN", "lim1"]] * 100)
    alone = _answered(port, token("write", sub="alone"),
                      [c for _ in range(100) for c in (["ZPOPMIN", "lim2"], ["PING"])])[::2]
    for replies in (run, alone):
        popped = [r for r in replies if r.startswith(b"*2")]
        assert 20 <= len(popped) <= 22, len(popped)
        assert replies[:len(popped)] == popped  # the first ones, then refusals
        assert all(b"too many" in r for r in replies[len(popped):]), replies[len(popped)]
    refused = _answered(port, READER_KEY, [["ZPOPMIN", "lim3"], ["ZPOPMAX", "lim3", "2"]] * 10)
    assert all(r.startswith(b"-NOPERM") for r in refused), refused[:2]
    with RawClient(port) as admin:
        assert admin.call("AUTH", token("admin write read")) == b"+OK\r\n"
        assert admin.call("ZCARD", "lim3") == b":300\r\n"


def test_pipelined_pops_abort_a_watching_transaction(servers):
    """``WATCH`` sees a run of pops from another connection, as any write."""
    port = servers[1]
    with RawClient(port) as watcher, RawClient(port) as popper:
        watcher.call("ZADD", "watched", "1", "a", "2", "b", "3", "c")
        assert watcher.call("WATCH", "watched") == b"+OK\r\n"
        assert popper.pipeline([["ZPOPMIN", "watched"], ["ZPOPMAX", "watched"]]) == [
            b"*2\r\n$1\r\na\r\n$1\r\n1\r\n", b"*2\r\n$1\r\nc\r\n$1\r\n3\r\n"]
        assert watcher.pipeline([["MULTI"], ["ZADD", "watched", "9", "z"], ["EXEC"]]) == [
            b"+OK\r\n", b"+QUEUED\r\n", b"*-1\r\n"]
        assert watcher.call("ZRANGE", "watched", "0", "-1") == b"*1\r\n$1\r\nb\r\n"


# --- kill -9: acknowledged pops are neither lost nor applied twice ------------------------

BOARD_SIZE = 300_000
PIPELINE = 16


def _members_of(reply: bytes) -> list[str]:
    """The members of a RESP2 pop reply (``m`` and six digits: neither the
    key ``q`` nor a score)."""
    return [line.decode() for line in reply.split(b"\r\n") if line.startswith(b"m")]


def _pop_stream(port: int, worker: int, acked: list[str], sent: list[int],
                stop: threading.Event, mixed: bool = False) -> None:
    """Pipelines of :data:`PIPELINE` pops (lowest and highest, some of two;
    ``mixed``: ``ZMPOP`` and ``BZPOPMIN`` among them, and pops of a board
    that does not exist) until stopped or cut off; the members of each
    acknowledged pop noted, and how many members the pops sent could take
    at most."""
    commands = [["ZPOPMIN" if (i + worker) % 3 else "ZPOPMAX", "q", *(["2"] if i % 4 == 0
                                                                     else [])]
                for i in range(PIPELINE)]
    if mixed:
        commands[1::4] = [["ZMPOP", "2", "none", "q", "MIN", "COUNT", "2"]] * len(commands[1::4])
        commands[2::8] = [["BZPOPMIN", "none", "q", "1"]] * len(commands[2::8])
        commands[3::8] = [["ZPOPMAX", "none", "3"]] * len(commands[3::8])
    try:
        with RawClient(port, timeout=10) as client:
            while not stop.is_set():
                sent.append(sum(2 if len(words) in (3, 7) else 1 for words in commands))
                client.send(b"".join(_encode(words) for words in commands))
                for _ in commands:
                    acked.extend(_members_of(client.reply()))
    except (OSError, ConnectionError):
        return


def _encode(words: list[str]) -> bytes:
    return b"*%d\r\n" % len(words) + b"".join(
        b"$%d\r\n%s\r\n" % (len(word), word.encode()) for word in words)


@pytest.mark.parametrize(("fsync", "mixed"), [("no", False), ("always", False), ("no", True)])
def test_acknowledged_pops_survive_kill_9_once(tmp_path, fsync, mixed):
    """Streams of pipelined pops from three connections while the daemon is
    killed with SIGKILL at random moments, a few times over: after the last
    restart no acknowledged pop is back (none lost), no member was popped
    twice, what is left is one run of scores (pops take the ends only: a
    hole would be a removal applied where none was asked), and no more is
    gone than the pops sent could take (none applied twice).  ``mixed``:
    ``ZMPOP`` and ``BZPOPMIN`` in the pipelines too."""
    data_dir = tmp_path / "data"
    acked: list[str] = []
    sent: list[int] = []
    for cycle, pause in enumerate([0.5, 0.3, 0.8, 0.4]):
        daemon = Daemon(data_dir, "--tcp-port", "0", "--fsync", fsync)
        daemon.start()
        if cycle == 0:
            with RawClient(daemon.resp_port, timeout=60) as client:
                for start in range(0, BOARD_SIZE, 10_000):
                    words = [w for i in range(start, start + 10_000)
                             for w in (str(i), f"m{i:06d}")]
                    assert client.call("ZADD", "q", *words) == b":10000\r\n"
        stop = threading.Event()
        workers = [threading.Thread(target=_pop_stream, args=(daemon.resp_port, w, acked, sent,
                                                               stop, mixed)) for w in range(3)]
        for worker in workers:
            worker.start()
        time.sleep(pause)
        daemon.kill()
        stop.set()
        for worker in workers:
            worker.join(30)
    assert len(acked) > 1_000, len(acked)
    assert len(set(acked)) == len(acked), "a member was popped twice"
    with (Daemon(data_dir, "--tcp-port", "0", "--fsync", fsync) as daemon,
          RawClient(daemon.resp_port, timeout=60) as client):
        size = int(client.call("ZCARD", "q")[1:-2])
        left = [int(m[1:]) for start in range(0, size, 50_000)
                for m in _members_of_range(client.call("ZRANGE", "q", str(start),
                                                       str(start + 49_999)))]
    assert not {f"m{i:06d}" for i in left} & set(acked), "an acknowledged pop is back"
    assert left == list(range(left[0], left[0] + len(left))), "a hole: a removal not asked"
    assert len(acked) <= BOARD_SIZE - len(left) <= sum(sent), (len(acked), len(left), sum(sent))


def _members_of_range(reply: bytes) -> list[str]:
    """The members of a RESP2 array of bulk strings."""
    return [line.decode() for line in reply.split(b"\r\n")[2::2] if line]


# --- a commit that fails ------------------------------------------------------------------


def test_pops_whose_commit_fails_are_refused_and_undone(tmp_path):
    """The disk fails (fsync answers EIO) under a pipeline of pops: each
    pop answers ``READONLY``, none acknowledged, and none stays applied,
    neither in what the daemon serves nor after a restart."""
    from faultshim import build_shim
    from test_disk_faults import under_shim

    shim = build_shim(tmp_path)
    data_dir, trigger = tmp_path / "data", tmp_path / "armed"
    env = under_shim(shim, tmp_path / "fsynced.log", RANKD_FAULT_TRIGGER=str(trigger),
                     RANKD_FAULT_FSYNC_FAIL="/wal/:5")
    daemon = Daemon(data_dir, "--tcp-port", "0", "--fsync", "always", env=env).start()
    try:
        with RawClient(daemon.resp_port) as client:
            words = [w for i in range(300) for w in (str(i), f"m{i:03d}")]
            assert client.call("ZADD", "failing", *words) == b":300\r\n"
            trigger.touch()
            replies = client.pipeline([["ZPOPMIN", "failing"], ["ZPOPMAX", "failing", "2"]] * 50)
            assert all(r.startswith(b"-READONLY") for r in replies), replies[:2]
            deadline = time.monotonic() + 10
            while (card := client.call("ZCARD", "failing")) != b":300\r\n":
                assert card.startswith(b"-READONLY") and time.monotonic() < deadline, card
                time.sleep(0.05)
    finally:
        daemon.kill()
    trigger.unlink()
    with (Daemon(data_dir, "--tcp-port", "0") as restarted,
          RawClient(restarted.resp_port) as client):
        assert client.call("ZCARD", "failing") == b":300\r\n"
