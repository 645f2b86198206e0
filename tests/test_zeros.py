"""``-0`` scores as Redis 7.2 keeps them (rankd.engine.zeros): which zero a
write stores on a RESP board, in the Python and native ingest alike; what
store commands keep; what a restart decides; and what REST shows.

What ``redis-server`` answers the same way is compared byte for byte in
``test_resp_differential.py``; here are the rules themselves, the
restart, and what Debian's 7.0.15 cannot show (7.2's ``ZADD`` of more than
128 pairs), checked against what 7.2.4's source does.
"""

from __future__ import annotations

import math
from typing import Any

import asyncpg
import pytest

from conftest import native
from daemon import Daemon
from engine_helpers import SUNDAY, engine_config, run, sub
from rankd.engine import postgres, records, zeros
from rankd.engine.board import Board
from rankd.engine.config import BoardConfig
from rankd.engine.engine import Engine
from rankd.engine.ingest import SKIPLIST_FIRST, ingest_python
from rankd.engine.submission import Submission
from redisserver import RedisClient, RedisServer
from respclient import RawClient

TTL = 3600.0
TOLERANCE = 300.0


def negative(value: float | None) -> bool:
    return value is not None and value == 0.0 and math.copysign(1.0, value) < 0


def implementations():
    return [ingest_python, native("rankd.engine._ingest", "ingest")]


def board(config: BoardConfig = zeros.REDIS_BOARD, members: int = 0,
          member_bytes: int = 1) -> Board:
    made = Board("lb", config)
    made.new_index = lambda: native("rankd._skiplist", "RankIndex")(  # type: ignore[method-assign]
        config.order, config.tie_break)
    index = made.index_for_write("all", "all")
    for i in range(members):
        index.set(f"m{i:0{member_bytes}d}", float(i + 1))
    return made


def write(ingest, made: Board, *submissions: Submission) -> list:
    done = ingest({"lb": made}, list(submissions), SUNDAY, 1, TTL, TOLERANCE)
    updates = [records.decode(payload)[9] for payload in done.payloads]
    return [done.answers, [[u[2] for u in update] for update in updates]]


@pytest.mark.parametrize("ingest", implementations())
def test_a_small_set_stores_zero_and_a_skiplist_keeps_minus_zero(ingest):
    small = board(members=3)
    answers, logged = write(ingest, small, Submission(board="lb", member="z", score=-0.0),
                            Submission(board="lb", member="y", delta=-0.0))
    assert not any(negative(a["score"]) for a in answers)
    assert not any(negative(v) for update in logged for v in update)
    assert zeros.encoding(small.index("all", "all")) == "listpack"

    # The 129th member converts the set before it is added: it keeps its -0.
    grown = board(members=128)
    answers, logged = write(ingest, grown, Submission(board="lb", member="z", score=-0.0),
                            Submission(board="lb", member="y", delta=-0.0))
    assert [negative(a["score"]) for a in answers] == [True, True]
    assert logged == [[-0.0], [-0.0]] and all(negative(u[0]) for u in logged)
    index = grown.index("all", "all")
    assert negative(index.score("z")) and zeros.encoding(index) == "skiplist"
    # Still a skiplist once small again (until emptied, stored or restarted).
    for i in range(128):
        index.remove(f"m{i:01d}" if i < 10 else f"m{i}")
    write(ingest, grown, Submission(board="lb", member="x", score=-0.0))
    assert len(index) <= 4 and negative(index.score("x"))


@pytest.mark.parametrize("ingest", implementations())
def test_a_member_longer_than_64_bytes_makes_a_skiplist(ingest):
    made = board(members=2)
    long_member = "x" * 65
    answers, _ = write(ingest, made, Submission(board="lb", member="a", score=-0.0),
                       Submission(board="lb", member=long_member, score=-0.0),
                       Submission(board="lb", member="b", score=-0.0))
    assert [negative(a["score"]) for a in answers] == [False, True, True]


@pytest.mark.parametrize("ingest", implementations())
def test_equal_scores_keep_their_zero_and_other_boards_store_zero(ingest):
    made = board(members=200)
    index = made.index("all", "all")
    index.set("z", -0.0)
    index.set("p", 0.0)
    answers, logged = write(ingest, made, Submission(board="lb", member="z", score=0.0),
                            Submission(board="lb", member="z", delta=0.0),
                            Submission(board="lb", member="p", score=-0.0))
    assert negative(index.score("z")) and not negative(index.score("p"))
    assert [a["changed"] for a in answers] == [False, False, False]
    assert logged == [[], [], []]
    # A board made through REST (another config) keeps one zero, whatever its size.
    rest = board(BoardConfig(policy="latest"), members=200)
    answers, logged = write(ingest, rest, Submission(board="lb", member="z", score=-0.0))
    assert not negative(answers[0]["score"]) and not negative(logged[0][0])


@pytest.mark.parametrize("ingest", implementations())
def test_a_zadd_of_more_than_128_pairs_makes_a_skiplist_first(ingest):
    """Redis 7.2's zsetTypeMaybeConvert (7.0.15 converts only at the 129th member)."""
    made = board(members=1)
    first = Submission(board="lb", member="a", score=-0.0, condition=SKIPLIST_FIRST)
    answers, _ = write(ingest, made, first)
    assert negative(answers[0]["score"])
    assert zeros.encoding(made.index("all", "all")) == "skiplist"


def test_store_zeros_follow_the_store_command():
    small = {"a": -0.0, "b": 1.0}
    assert not negative(zeros.store_zeros(dict(small))["a"])
    large = {f"m{i}": -0.0 for i in range(129)}
    assert all(map(negative, zeros.store_zeros(dict(large)).values()))
    long_member = {"x" * 65: -0.0, "a": -0.0}
    assert all(map(negative, zeros.store_zeros(dict(long_member)).values()))
    # ZRANGESTORE by rank: made for its length; by score: grows as ZADD does.
    assert all(map(negative, zeros.store_zeros(dict(large), "rank").values()))
    grown = zeros.store_zeros(dict(large), "score")
    assert [negative(v) for v in grown.values()] == [False] * 128 + [True]
    ordered = zeros.store_zeros({"a": -0.0, "x" * 65: -0.0, "b": -0.0}, "lex")
    assert [negative(v) for v in ordered.values()] == [False, True, True]


def test_a_restart_decides_encodings_from_what_boards_hold():
    shrunk = board(members=130)
    shrunk.index("all", "all").set("z", -0.0)
    for i in range(100, 130):
        shrunk.index("all", "all").remove(f"m{i}")
    large = board(members=130)
    large.index("all", "all").set("z", -0.0)
    rest = board(BoardConfig(policy="latest"))
    rest.index("all", "all").set("z", -0.0)  # (no ingest writes that: the rule is Redis's)
    boards = {"shrunk": shrunk, "large": large, "rest": rest}
    assert zeros.settle_after_load(boards) == 1
    assert zeros.encoding(shrunk.index("all", "all")) == "listpack"
    assert not negative(shrunk.index("all", "all").score("z"))
    assert zeros.encoding(large.index("all", "all")) == "skiplist"
    assert negative(large.index("all", "all").score("z"))
    assert negative(rest.index("all", "all").score("z"))  # not a Redis board: untouched


def _call(client: RawClient, *words: str) -> bytes:
    return client.call(*words)


def test_minus_zero_survives_a_restart_as_redis_decides_at_load(tmp_path):
    """Built through RESP: a board past 128 members keeps its -0 across a
    clean restart and a kill -9 (snapshot, then WAL replay); one that shrank
    back to 128 is a listpack again and answers 0, as Redis after a restart
    (DEBUG RELOAD); REST shows 0 either way."""
    daemon = Daemon(tmp_path / "data", "--fsync", "always")
    daemon.start()
    try:
        client = RawClient(daemon.resp_port)
        for key in ("big", "shrunk"):
            for start in range(0, 140, 70):
                words = [w for i in range(start, start + 70) for w in (str(i + 1), f"m{i}")]
                assert _call(client, "ZADD", key, *words).startswith(b":")
            assert _call(client, "ZADD", key, "-0", "z") == b":1\r\n"
        assert _call(client, "ZREMRANGEBYRANK", "shrunk", "-40", "-1") == b":40\r\n"
        for key in ("big", "shrunk"):
            assert _call(client, "ZSCORE", key, "z") == b"$2\r\n-0\r\n"
            assert _call(client, "OBJECT", "ENCODING", key) == b"$8\r\nskiplist\r\n"
        status, body = daemon.request("GET", "/v1/boards/big/members/z")
        assert status == 200 and body["score"] == 0 and not negative(body["score"])
        client.close()
        daemon.stop()
        for restart in ("clean", "kill"):
            daemon.start()
            client = RawClient(daemon.resp_port)
            assert _call(client, "ZSCORE", "big", "z") == b"$2\r\n-0\r\n", restart
            assert _call(client, "OBJECT", "ENCODING", "big") == b"$8\r\nskiplist\r\n"
            assert _call(client, "ZSCORE", "shrunk", "z") == b"$1\r\n0\r\n", restart
            assert _call(client, "OBJECT", "ENCODING", "shrunk") == b"$8\r\nlistpack\r\n"
            # A write after the restart follows the new encoding.
            assert _call(client, "ZADD", "shrunk", "-0", f"w{restart}") == b":1\r\n"
            assert _call(client, "ZSCORE", "shrunk", f"w{restart}") == b"$1\r\n0\r\n"
            client.close()
            if restart == "clean":
                daemon.kill()
    finally:
        if daemon.process is not None and daemon.process.poll() is None:
            daemon.stop()


def _redis_board_with_minus_zero(engine) -> Any:
    async def fill() -> None:
        await engine.put_board("lb", zeros.REDIS_BOARD.to_dict())
        await engine.submit_many([sub("lb", f"m{i}", score=i + 1) for i in range(130)])
        await engine.submit_many([sub("lb", "z", score=-0.0), sub("lb", "y", delta=-0.0)])
    return fill()


def test_the_log_snapshot_and_postgres_keep_the_sign(tmp_path, pg_dsn):
    """The records carry -0 (WAL replay, a snapshot, Postgres's float8
    ``value`` and its payloads, a restore from Postgres alone)."""
    async def live() -> list:
        engine = await Engine.open(engine_config(tmp_path / "live", postgres_dsn=pg_dsn))
        await _redis_board_with_minus_zero(engine)
        await engine.shipper.wait_shipped(engine.wal.last_lsn)
        await engine.close(snapshot=False)  # WAL replay
        engine = await Engine.open(engine_config(tmp_path / "live", postgres_dsn=pg_dsn))
        replayed = [engine.view("lb", None, None).score(m) for m in ("z", "y")]
        await engine.snapshot()
        await engine.close(snapshot=False)
        engine = await Engine.open(engine_config(tmp_path / "live", postgres_dsn=pg_dsn))
        loaded = [engine.view("lb", None, None).score(m) for m in ("z", "y")]
        await engine.close()
        conn = await asyncpg.connect(pg_dsn)
        try:
            values = await conn.fetch("SELECT value FROM rankd_events WHERE member IN ('z', 'y')")
        finally:
            await conn.close()
        return [replayed, loaded, [row["value"] for row in values]]

    replayed, loaded, shipped = run(live())
    assert all(map(negative, [*replayed, *loaded])) and len(shipped) == 2
    assert all(map(negative, shipped))
    restored_dir = tmp_path / "restored"
    run(postgres.restore(pg_dsn, restored_dir, Engine.rebuild))

    async def restored() -> list:
        engine = await Engine.open(engine_config(restored_dir))
        try:
            return [engine.view("lb", None, None).score(m) for m in ("z", "y")]
        finally:
            await engine.close()

    assert all(map(negative, run(restored())))


def _scanned(client: RawClient, key: str) -> dict[bytes, bytes]:
    found: dict[bytes, bytes] = {}
    cursor = b"0"
    while True:
        lines = client.call("ZSCAN", key, cursor, "COUNT", "50").split(b"\r\n")
        cursor = lines[2]
        items = [line for line in lines[4:] if line and line[:1] not in (b"$", b"*")]
        found.update(zip(items[0::2], items[1::2], strict=True))
        if cursor == b"0":
            return found


def test_zscan_of_a_skiplist_shows_scores_as_redis(tmp_path):
    """A skiplist's ZSCAN writes scores with ``ld2string`` (``%.17Lg``, the
    same in 7.0 and 7.2.4: compared with redis-server's raw replies), ``-0``
    included; a listpack's as 7.2 stores them.  (The order is the
    documented difference: Redis's is its hash table's.)"""
    redis = RedisServer()
    daemon = Daemon(tmp_path / "data", "--tcp-port", "0", "--fsync", "no")
    daemon.start()
    try:
        theirs, ours = RawClient(redis.port), RawClient(daemon.resp_port)
        pairs = (["-0", "z"], ["1e20", "e"], ["-3.5", "n"], ["123456789012345678", "h"])
        for client in (theirs, ours):
            for key, count in (("big", 130), ("small", 5)):
                client.call("ZADD", key, *[w for i in range(count)
                                           for w in (str(i * 0.1), f"m{i}")])
                for pair in pairs:
                    client.call("ZADD", key, *pair)
        big = _scanned(ours, "big")
        assert big == _scanned(theirs, "big") and big[b"z"] == b"-0"
        # A listpack stores 7.2's shortest text (7.0's %.17g rewritten so).
        assert _scanned(ours, "small") == _scanned(RedisClient(redis.port), "small")
    finally:
        daemon.stop()
        redis.stop()


def test_a_zadd_of_more_than_128_pairs_converts_first_over_resp(tmp_path):
    """Redis 7.2.4 makes the set a skiplist before a ZADD of more than 128
    pairs adds anything (``zsetTypeCreate(elements, ...)`` for a new key,
    ``zsetTypeMaybeConvert`` for a listpack), whatever the pairs add:
    7.0.15 answers ``listpack`` and ``0`` to each of these."""
    with Daemon(tmp_path / "data", "--tcp-port", "0", "--fsync", "no") as daemon:
        client = RawClient(daemon.resp_port)
        assert _call(client, "ZADD", "new", *["-0", "a"] * 129) == b":1\r\n"
        assert _call(client, "ZADD", "old", "1", "b") == b":1\r\n"
        assert _call(client, "OBJECT", "ENCODING", "old") == b"$8\r\nlistpack\r\n"
        assert _call(client, "ZADD", "old", *["-0", "a"] * 129) == b":1\r\n"
        for key in ("new", "old"):
            assert _call(client, "OBJECT", "ENCODING", key) == b"$8\r\nskiplist\r\n"
            assert _call(client, "ZSCORE", key, "a") == b"$2\r\n-0\r\n"
        # 128 pairs: still a listpack, as both versions keep it.
        assert _call(client, "ZADD", "few", *["-0", "a"] * 128) == b":1\r\n"
        assert _call(client, "OBJECT", "ENCODING", "few") == b"$8\r\nlistpack\r\n"
        assert _call(client, "ZSCORE", "few", "a") == b"$1\r\n0\r\n"
        client.close()
