"""The RESP front-end beyond Redis's own answers: authentication and
scopes, limits and bad input, what rankd refuses by design, boards made
through REST read and written through RESP, rankd's own commands, the
tooling commands, and acknowledged writes surviving ``kill -9``."""

from __future__ import annotations

import random
import signal
import socket
import threading
import time
import urllib.request

import pytest

from daemon import Daemon
from rankd.frontends.resp.protocol import encode_request
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


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    with Daemon(tmp_path_factory.mktemp("resp-sec") / "data", "--jwt-secret", SECRET,
                "--api-keys", f"{WRITER_ENTRY},{READER_ENTRY}",
                # (low: 120 pipelined writes outrun it however slowly a
                # loaded machine applies them)
                "--rate-credential-writes", "5") as running:
        running.request("PUT", "/v1/boards/lb", {"order": "asc", "policy": "latest",
                                                "tie_break": "member"},
                        headers={"Authorization": f"Bearer {ADMIN}"})
        yield running


@pytest.fixture(scope="module")
def open_daemon(tmp_path_factory):
    with Daemon(tmp_path_factory.mktemp("resp-open") / "data") as running:
        yield running


def test_commands_need_authentication_and_repeated_failures_close(secured):
    with RawClient(secured.resp_port) as client:
        assert client.call("PING") == b"+PONG\r\n"  # open before AUTH, as HELLO and AUTH
        assert client.call("ZSCORE", "lb", "a") == b"-NOAUTH Authentication required.\r\n"
        assert client.call("AUTH", "nope").startswith(b"-WRONGPASS")
        assert client.call("ZCARD", "lb") == b"-NOAUTH Authentication required.\r\n"
        with pytest.raises(ConnectionError):  # the third failure closes it
            client.call("ZCARD", "lb")
            client.call("PING")


def test_scopes_decide_what_a_credential_may_do(secured):
    with RawClient(secured.resp_port) as writer, RawClient(secured.resp_port) as reader:
        assert writer.call("AUTH", "default", WRITER_KEY) == b"+OK\r\n"
        assert writer.call("ZADD", "lb", "3", "ann") == b":1\r\n"
        # Creating a board takes the admin scope; a write key only writes.
        assert writer.call("ZADD", "newkey", "1", "x").startswith(b"-NOPERM")
        assert writer.call("ZSCORE", "lb", "ann").startswith(b"-NOPERM")
        assert writer.call("FLUSHALL").startswith(b"-NOPERM")
        assert reader.call("AUTH", READER_KEY) == b"+OK\r\n"
        assert reader.call("ZSCORE", "lb", "ann") == b"$1\r\n3\r\n"
        assert reader.call("ZINCRBY", "lb", "1", "ann").startswith(b"-NOPERM")
        assert reader.call("DEL", "lb").startswith(b"-NOPERM")
    with RawClient(secured.resp_port) as admin:
        hello = admin.call("HELLO", "3", "AUTH", "default", token("admin write read"),
                           "SETNAME", "ops")
        assert hello.startswith(b"%7\r\n") and b"proto\r\n:3" in hello
        assert admin.call("CLIENT", "GETNAME") == b"$3\r\nops\r\n"
        assert admin.call("ZADD", "made", "1", "x") == b":1\r\n"
        assert admin.call("ZSCORE", "made", "x") == b",1\r\n"  # RESP3 double
        assert admin.call("DEL", "made") == b":1\r\n"


def test_write_rate_limits_apply(secured):
    with RawClient(secured.resp_port) as writer:
        assert writer.call("AUTH", WRITER_KEY) == b"+OK\r\n"
        replies = writer.pipeline([["ZINCRBY", "lb", "1", "rate"]] * 120)
    limited = [r for r in replies if r.startswith(b"-ERR too many writes from this credential")]
    assert limited and len(limited) < 120


def test_before_authentication_requests_stay_small(secured):
    """A client that has not authenticated cannot make the server buffer
    more than a JWT's worth: a large announced bulk is refused at once."""
    with socket.create_connection(("127.0.0.1", secured.resp_port), timeout=5) as sock:
        sock.sendall(b"*2\r\n$4\r\nAUTH\r\n$1000000\r\n")
        answer = sock.recv(1000)
        assert answer == b"-ERR Protocol error: invalid bulk length\r\n"
        assert sock.recv(100) == b""  # and closed
    assert secured.request("GET", "/v1/health")[0] == 200


def test_bad_streams_close_the_connection_never_the_daemon(open_daemon):
    for stream, message in [(b"*2\r\n$3\r\nGET\r\n+x\r\n", b"expected '$', got '+'"),
                            (b"*3000000\r\n", b"invalid multibulk length"),
                            (b"*1\r\n$2000000\r\n", b"invalid bulk length"),
                            (b'ZCARD "unbalanced\r\n', b"unbalanced quotes in request")]:
        with socket.create_connection(("127.0.0.1", open_daemon.resp_port), timeout=5) as sock:
            sock.sendall(encode_request(["PING"]) + stream)
            received = b""
            while chunk := sock.recv(1000):
                received += chunk
        assert received == b"+PONG\r\n-ERR Protocol error: " + message + b"\r\n"
    assert open_daemon.request("GET", "/v1/health")[0] == 200


def test_large_pipelines_of_writes_are_split_into_engine_batches(open_daemon):
    """30 ZADDs of 1,000 members each, pipelined: more than one engine batch
    holds, all applied, answered in order."""
    commands = [["ZADD", "bulk", *[w for i in range(1000) for w in (str(i), f"m{n}:{i}")]]
                for n in range(30)]
    with RawClient(open_daemon.resp_port) as client:
        assert client.pipeline(commands) == [b":1000\r\n"] * 30
        assert client.call("ZCARD", "bulk") == b":30000\r\n"


def test_a_client_not_reading_large_replies_does_not_make_them_pile_up(open_daemon):
    """80 pipelined reads of 20,000 entries each (about 50 MB of replies) from
    a client that reads nothing for a while: the daemon makes replies only
    as they drain (its memory grows by far less than they weigh), and every
    reply arrives, in order, as when asked alone."""
    def rss() -> int:
        with urllib.request.urlopen(open_daemon.url + "/metrics", timeout=10) as response:
            for line in response.read().decode().splitlines():
                if line.startswith("rankd_process_rss_bytes "):
                    return int(float(line.split()[1]))
        raise AssertionError("no rankd_process_rss_bytes")

    members = [w for i in range(20_000) for w in (str(i * 1.5), f"member:{i:06d}")]
    with RawClient(open_daemon.resp_port) as client:
        for start in range(0, len(members), 2000):
            client.call("ZADD", "huge", *members[start:start + 2000])
        alone = client.call("ZRANGE", "huge", "0", "-1", "WITHSCORES")
        before = rss()
        client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        client.send(b"".join(encode_request(["ZRANGE", "huge", "0", "-1", "WITHSCORES"])
                             for _ in range(80)))
        time.sleep(1.5)
        grown = rss() - before
        assert grown < 80 * len(alone) // 3, (grown, 80 * len(alone))
        for _ in range(80):
            assert client.reply() == alone


def test_what_rankd_refuses_by_design_is_refused_clearly(open_daemon):
    with RawClient(open_daemon.resp_port) as client:
        assert client.call("ZADD", "r", "inf", "a") == b"-ERR rankd keeps finite scores only\r\n"
        assert client.call("ZINCRBY", "r", "-inf", "a").startswith(b"-ERR rankd keeps finite")
        assert client.call("ZADD", "bad\nkey", "1", "a").startswith(b"-ERR rankd board names")
        assert client.call("ZADD", "x" * 513, "1", "a").startswith(b"-ERR rankd board names")
        assert client.call("ZADD", "r", "1", "").startswith(b"-ERR member must be")
        assert client.call("ZADD", "r", "1", "a\x00b").startswith(b"-ERR member must not")
        assert client.call("ZADD", "r", "1", b"\xff").startswith(b"-ERR rankd members are")
        # None of them created the key, as a refused write in Redis creates none.
        assert client.call("EXISTS", "r") == b":0\r\n"
        assert client.call("ZADD", "r", "1", "a", "2", "b") == b":2\r\n"
        assert client.call("ZRANGE", "r", "a", "b", "BYLEX").startswith(
            b"-ERR min or max not valid")
        assert client.call("ZRANGE", "r", "[a", "[b", "BYLEX") == (  # (a board orders by name
            b"*2\r\n$1\r\na\r\n$1\r\nb\r\n")                     # within a score)
        assert client.call("CONFIG", "SET", "save", "").startswith(b"-ERR rankd's config")
        assert client.call("SELECT", "1") == b"-ERR DB index is out of range\r\n"


def test_boards_made_through_rest_are_read_in_their_own_order(open_daemon):
    """A descending best-score board: ZREVRANGE and ZREVRANK are its
    leaderboard, ZADD keeps the best score, ZINCRBY is refused, and
    emptying it leaves the board a key (an emptied RESP-made board stays
    too, but is no key, as in Redis)."""
    open_daemon.request("PUT", "/v1/boards/arena", {"order": "desc", "policy": "best",
                                                     "tie_break": "first"})
    for member, score in [("ann", 10), ("bob", 30), ("cy", 30), ("dee", 5)]:
        open_daemon.request("POST", "/v1/boards/arena/scores", {"member": member,
                                                                 "score": score})
    with RawClient(open_daemon.resp_port) as client:
        # Ties: bob reached 30 first, so bob ranks above cy.
        assert client.call("ZREVRANGE", "arena", "0", "1") == b"*2\r\n$3\r\nbob\r\n$2\r\ncy\r\n"
        assert client.call("ZREVRANK", "arena", "bob") == b":0\r\n"
        assert client.call("ZRANK", "arena", "dee") == b":0\r\n"
        assert client.call("ZADD", "arena", "CH", "7", "ann", "40", "dee") == b":1\r\n"
        assert client.call("ZSCORE", "arena", "ann") == b"$2\r\n10\r\n"  # best kept
        assert client.call("ZINCRBY", "arena", "1", "ann").startswith(b"-ERR board 'arena'")
        assert client.call("ZREM", "arena", "ann", "bob", "cy", "dee") == b":4\r\n"
        assert client.call("EXISTS", "arena") == b":1\r\n"
        assert client.call("ZADD", "mine", "1", "x") == b":1\r\n"
        assert client.call("ZPOPMAX", "mine") == b"*2\r\n$1\r\nx\r\n$1\r\n1\r\n"
        assert client.call("EXISTS", "mine") == b":0\r\n"
    status, board = open_daemon.request("GET", "/v1/boards/arena")
    assert status == 200 and board["config"]["policy"] == "best"


def test_pipelined_reads_mixing_native_and_general_answers_keep_their_order(open_daemon):
    """Plain reads are answered natively unless a board reads another window
    by default: such a read in the middle of a run is answered the general
    way, in its place."""
    open_daemon.request("PUT", "/v1/boards/wk", {"windows": ["weekly"], "policy": "latest"})
    open_daemon.request("POST", "/v1/boards/wk/scores", {"member": "w", "score": 5})
    with RawClient(open_daemon.resp_port) as client:
        client.call("ZADD", "plain", "1", "a", "2", "b")
        replies = client.pipeline([["ZSCORE", "plain", "b"], ["ZSCORE", "wk", "w"],
                                   ["ZREVRANK", "plain", "a"], ["ZRANGE", "wk", "0", "-1"],
                                   ["ZRANGE", "plain", "0", "-1", "WITHSCORES"],
                                   ["ZSCORE", "nokey", "x"], ["ZRANK", "plain", "zz"]])
        assert replies == [b"$1\r\n2\r\n", b"$1\r\n5\r\n", b":1\r\n",
                           b"*1\r\n$1\r\nw\r\n",
                           b"*4\r\n$1\r\na\r\n$1\r\n1\r\n$1\r\nb\r\n$1\r\n2\r\n",
                           b"$-1\r\n", b"$-1\r\n"]


def test_a_long_pipeline_of_reads_answers_as_the_reads_one_by_one(open_daemon):
    """A run of reads is warmed in groups of 32 before it is answered (the
    members' hash slots, then their nodes): across groups, boards that are
    missing or read another window, ranges and absent members, a pipeline
    of them answers exactly what each read alone answers."""
    open_daemon.request("PUT", "/v1/boards/wk2", {"windows": ["weekly"], "policy": "latest"})
    open_daemon.request("POST", "/v1/boards/wk2/scores", {"member": "w", "score": 5})
    rng = random.Random(7)
    with RawClient(open_daemon.resp_port) as client:
        for board in ("p1", "p2"):
            client.call("ZADD", board, *[part for i in range(300)
                                         for part in (str(rng.randrange(50)), f"m{i}")])
        reads = []
        for _ in range(150):
            board = rng.choice(["p1", "p2", "p2", "wk2", "nokey"])
            member = rng.choice([f"m{rng.randrange(320)}", "w"])
            kind = rng.choice(["ZSCORE", "ZRANK", "ZREVRANK", "ZRANGE"])
            reads.append([kind, board, "0", "2"] if kind == "ZRANGE" else [kind, board, member])
        alone = [client.call(*read) for read in reads]
        assert client.pipeline(reads) == alone
        assert len(set(alone)) > 20  # scores, ranks, nulls and ranges all came up


def send_in_pieces(client: RawClient, data: bytes, cuts: list[int]) -> None:
    """``data`` in separate reads of the server, cut at ``cuts``."""
    client.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for start, end in zip([0, *cuts], [*cuts, len(data)], strict=True):
        client.send(data[start:end])
        time.sleep(0.02)  # (so each piece is a read of its own)


def test_a_command_cut_across_reads_is_read_whole(open_daemon):
    """A read that ends inside a command leaves part of it in the
    connection's reader, and the next read completes it, however well that
    next read would parse alone: here its first bytes are an argument's,
    which with the plain write after them read as two plain writes."""
    text = encode_request([b"ZADD", b"not-written", b"5", b"z"])[:-2]
    command = encode_request([b"ECHO", text])
    with RawClient(open_daemon.resp_port) as client:
        send_in_pieces(client, command + encode_request([b"ZADD", b"cut", b"1", b"m"]),
                       [command.index(text)])
        assert [client.reply(), client.reply()] == [
            b"$%d\r\n%s\r\n" % (len(text), text), b":1\r\n"]
        assert client.call("EXISTS", "not-written") == b":0\r\n"


def test_a_stream_cut_anywhere_answers_as_the_stream_whole(open_daemon):
    """The plain writes and reads the native lane answers, and the commands
    the general path does, cut into reads at random places: the replies are
    the ones the same stream gets in one read (on a board of its own)."""
    rng = random.Random(11)
    commands: list[list[str]] = []
    for _ in range(40):
        member = f"m{rng.randrange(8)}"
        commands.append(rng.choice([["ZADD", "{}", str(rng.randrange(5)), member],
                                    ["ZINCRBY", "{}", "2", member],
                                    ["ZSCORE", "{}", member], ["ZREVRANK", "{}", member],
                                    ["ZRANGE", "{}", "0", "-1", "WITHSCORES"],
                                    ["ZCARD", "{}"]]))

    def stream(board: str) -> bytes:
        return b"".join(encode_request([word.format(board) for word in words])
                        for words in commands)

    with RawClient(open_daemon.resp_port) as client:
        whole = client.pipeline([[word.format("stream-whole") for word in words]
                                 for words in commands])
        data = stream("stream-cut")
        send_in_pieces(client, data, sorted(rng.sample(range(1, len(data)), 12)))
        assert [client.reply() for _ in commands] == whole


def test_rankd_commands_reach_what_redis_lacks(open_daemon):
    with RawClient(open_daemon.resp_port) as client:
        client.call("ZADD", "friends", "10", "a", "20", "b", "20", "c", "30", "d")
        rank = client.call("RANKD.RANK", "friends", "b")
        # Highest first, as ZREVRANGE lists them: d is best (rank 1); b and c
        # tie at 20, c first (ties Z to A), so b's rank is ZREVRANK + 1.
        assert b"rank\r\n:3\r\n" in rank and b"dense_rank\r\n:2\r\n" in rank
        assert b"competition_rank\r\n:2\r\n" in rank
        assert client.call("ZREVRANK", "friends", "b") == b":2\r\n"
        assert client.call("RANKD.RANK", "friends", "nobody") == b"$-1\r\n"
        listed = client.call("RANKD.FRIENDS", "friends", "d", "a", "ghost")
        assert listed.startswith(b"*2\r\n") and listed.index(b"$1\r\nd") < listed.index(b"$1\r\na")
        around = client.call("RANKD.AROUND", "friends", "b", "1", "1")
        assert around.startswith(b"*3\r\n")
        assert client.call("RANKD.WINDOW", "weekly") == b"+OK\r\n"
        assert client.call("ZCARD", "friends").startswith(b"-ERR board 'friends' does not keep")
        assert client.call("RANKD.WINDOW") == b"+OK\r\n"
        assert client.call("ZCARD", "friends") == b":4\r\n"
        docs = client.call("COMMAND", "DOCS", "rankd.rank", "zadd")
        assert b"rankd.rank" in docs and b"summary" in docs


def test_tooling_commands_answer_what_clients_and_tools_ask(open_daemon):
    with RawClient(open_daemon.resp_port) as client:
        info = client.call("INFO")
        for field in (b"redis_version:7.2.0", b"connected_clients:", b"used_memory:",
                      b"loading:0", b"role:master", b"aof_enabled:1", b"appendfsync:"):
            assert field in info
        assert b"# Keyspace" in client.call("INFO", "keyspace")
        assert client.call("CONFIG", "GET", "save") == b"*2\r\n$4\r\nsave\r\n$0\r\n\r\n"
        assert client.call("CONFIG", "GET", "appendonly") == (
            b"*2\r\n$10\r\nappendonly\r\n$3\r\nyes\r\n")
        count = int(client.call("COMMAND", "COUNT")[1:-2])
        assert count >= 40 and client.call("COMMAND").startswith(b"*%d\r\n" % count)
        assert client.call("CLIENT", "SETNAME", "my conn").startswith(b"-ERR Client names")
        assert client.call("CLIENT", "SETNAME", "game-1") == b"+OK\r\n"
        assert client.call("CLIENT", "SETINFO", "LIB-NAME", "redis-py") == b"+OK\r\n"
        assert b"name=game-1" in client.call("CLIENT", "INFO")
        assert client.call("CLIENT", "ID").startswith(b":")
        assert client.call("CLIENT", "NOPE").startswith(b"-ERR unknown subcommand 'NOPE'")
        assert client.call("RESET") == b"+RESET\r\n"
        assert client.call("CLIENT", "GETNAME") == b"$-1\r\n"
        assert client.call("ECHO", "hi") == b"$2\r\nhi\r\n"
        assert client.call("QUIT") == b"+OK\r\n"
    with urllib.request.urlopen(open_daemon.url + "/metrics", timeout=10) as response:
        metrics = response.read().decode()
    assert "rankd_resp_connections" in metrics
    assert 'rankd_resp_commands_total{command="echo",status="ok"}' in metrics


def resp_commands_counted(daemon: Daemon, command: str) -> float:
    """``rankd_resp_commands_total`` of ``command`` with status ok (0 if absent)."""
    with urllib.request.urlopen(daemon.url + "/metrics", timeout=10) as response:
        metrics = response.read().decode()
    prefix = f'rankd_resp_commands_total{{command="{command}",status="ok"}} '
    return sum(float(line[len(prefix):]) for line in metrics.splitlines()
               if line.startswith(prefix))


def test_metrics_count_the_commands_the_native_lane_answers(open_daemon):
    """Plain writes and reads one at a time take the native lane, which
    counts them in the server's tallies as the general path does."""
    with RawClient(open_daemon.resp_port) as client:
        assert client.call("ZADD", "counted", "1", "ann") == b":1\r\n"  # makes the board
        writes, reads = (resp_commands_counted(open_daemon, name) for name in ("write", "read"))
        for _ in range(5):
            assert client.call("ZINCRBY", "counted", "2", "ann").startswith(b"$")
        for _ in range(3):
            assert client.call("ZSCORE", "counted", "ann").startswith(b"$")
    assert resp_commands_counted(open_daemon, "write") == writes + 5
    assert resp_commands_counted(open_daemon, "read") == reads + 3
    with RawClient(open_daemon.resp_port) as client:  # and CONFIG RESETSTAT clears them
        assert client.call("CONFIG", "RESETSTAT") == b"+OK\r\n"
        assert b"total_commands_processed:1\r\n" in client.call("INFO", "stats")
    assert resp_commands_counted(open_daemon, "write") == 0


def test_every_acknowledged_zincrby_survives_kill_9(tmp_path):
    """Increments pipelined through RESP while the daemon is killed with
    SIGKILL: after a restart each member's score holds at least every
    acknowledged increment and at most every one sent (with --fsync always)."""
    daemon = Daemon(tmp_path / "data", "--fsync", "always", "--tcp-port", "0").start()
    members = [f"p{i}" for i in range(20)]
    sent = dict.fromkeys(members, 0)
    acknowledged = dict.fromkeys(members, 0)
    try:
        with RawClient(daemon.resp_port) as client:
            assert client.call("ZADD", "kill", "0", "seed") == b":1\r\n"
            stop = threading.Event()
            threading.Timer(1.5, lambda: (daemon.process.send_signal(signal.SIGKILL),
                                          stop.set())).start()
            round_ = 0
            while not stop.is_set():
                batch = [members[(round_ * 7 + i) % len(members)] for i in range(16)]
                for member in batch:
                    sent[member] += 1
                try:
                    replies = client.pipeline([["ZINCRBY", "kill", "1", m] for m in batch])
                except (ConnectionError, OSError):
                    break
                for member, reply in zip(batch, replies, strict=True):
                    assert reply.startswith(b"$"), reply
                    acknowledged[member] += 1
                round_ += 1
        daemon.process.wait(10)
        daemon.stop()
        assert sum(acknowledged.values()) > 100
        daemon = Daemon(tmp_path / "data", "--fsync", "always", "--tcp-port", "0").start()
        with RawClient(daemon.resp_port) as client:
            for member in members:
                reply = client.call("ZSCORE", "kill", member)
                score = 0 if reply == b"$-1\r\n" else int(reply.split(b"\r\n")[1])
                assert acknowledged[member] <= score <= sent[member], member
    finally:
        daemon.stop()
    time.sleep(0)
