"""Attacks on the compact paged index as the daemon's default, through a
real daemon: what held is in the report; what broke is below, one test a
defect."""

from __future__ import annotations

from daemon import Daemon
from respclient import RawClient

#: Members of every UTF-8 width, tied and not (a RESP board ties by member).
MEMBERS = [f"m{i}-é€😀" * (1 + i % 5) for i in range(300)]


def _digest(daemon: Daemon) -> str:
    status, body = daemon.request("GET", "/v1/admin/digest")
    assert status == 200, body
    return body["digest"]


def test_the_digest_of_a_board_tied_by_member_is_the_same_under_either_layout(tmp_path):
    """The digest hashed each index's dump, and the two layouts dump a board
    tied by member differently (pages: version 2, no arrival sequences; the
    skip list: version 1 with them): the same data dir, its boards
    unchanged, gave another digest after a restart with ``--index skiplist``,
    so nodes of a cluster part-way through a layout switch, or an operator
    checking that the switch kept every board, saw states differ that did
    not."""
    data = tmp_path / "data"
    digests = {}
    with Daemon(data, "--index", "pages") as daemon, RawClient(daemon.resp_port) as client:
        for i, member in enumerate(MEMBERS):
            assert client.call("ZADD", "lb", str(i % 7), member) == b":1\r\n"
        ranking = client.call("ZRANGE", "lb", "0", "-1", "WITHSCORES")
        digests["pages"] = _digest(daemon)
    for layout in ("skiplist", "pages"):
        with Daemon(data, "--index", layout) as daemon, RawClient(daemon.resp_port) as client:
            assert client.call("ZRANGE", "lb", "0", "-1", "WITHSCORES") == ranking
            digests[layout] = _digest(daemon)
    assert digests["skiplist"] == digests["pages"]


def test_a_store_in_multi_keeps_the_minus_zero_a_skiplist_result_keeps(tmp_path):
    """``ZUNIONSTORE`` (``ZINTERSTORE``, ``ZDIFFSTORE``) of a result with a
    member of more than 64 bytes makes a skiplist, which keeps ``-0``: rankd
    wrote it so run alone, but queued in ``MULTI`` and run by ``EXEC`` the
    same store wrote ``0`` (what only a listpack result holds), where
    redis-server keeps ``-0`` either way."""
    from redisserver import RedisClient, paired

    short, long = "x" * 30, "y" * 70
    with paired(tmp_path / "data") as (redis_port, rankd_port), \
            RedisClient(redis_port) as redis, RawClient(rankd_port) as rankd:
        for store, key in (("ZUNIONSTORE", "u"), ("ZINTERSTORE", "i"), ("ZDIFFSTORE", "d")):
            commands = [["ZADD", f"{key}:src", "1", long], ["ZADD", f"{key}:src", "-0", short],
                        ["MULTI"], [store, f"{key}:dst", "1", f"{key}:src"], ["EXEC"],
                        ["ZRANGE", f"{key}:dst", "0", "-1", "WITHSCORES"],
                        ["ZSCORE", f"{key}:dst", short]]
            expected = redis.pipeline(commands)
            assert expected[-1] == b"$2\r\n-0\r\n"
            assert rankd.pipeline(commands) == expected, store


def test_periods_opened_by_late_events_are_listed_newest_first(tmp_path):
    """A late event opening an older period was to keep a window's periods
    in time order, but the check compared the new period with itself (the
    last key once inserted): ``GET .../periods`` listed ``retained`` in
    arrival order, not newest first as documented."""
    import time

    day = 86400
    now = time.time()
    with Daemon(tmp_path / "data", "--ts-tolerance", str(10 * day)) as daemon:
        daemon.request("PUT", "/v1/boards/w", {"policy": "sum", "windows": ["all", "daily"]})
        for days_ago in (0, 2, 1, 3):
            status, body = daemon.request("POST", "/v1/boards/w/scores", {
                "member": "a", "delta": 1, "ts": now - days_ago * day})
            assert status == 200, body
        status, body = daemon.request("GET", "/v1/boards/w/periods?window=daily")
    assert status == 200, body
    assert len(body["retained"]) == 3
    assert body["retained"] == sorted(body["retained"], reverse=True)
