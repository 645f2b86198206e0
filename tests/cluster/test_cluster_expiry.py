"""An expiring board on a two-node cluster: the deadline and the deletion
are records of the group's log, written by its primary, so the board goes
at the same log position on both nodes; the follower never deletes on its
own clock, but answers as if the board were gone once the deadline passed
(as a Redis replica does)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from cluster_nodes import nodes
from jepsen import read_log

from rankd.cluster.groups import group_of
from rankd.engine import records
from rankd.engine.wal import scan
from respclient import RawClient

BOARD = "daily"


def _wait(predicate, timeout: float = 20.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _local_records(data_dir: Path, group: int) -> list[tuple[int, tuple]]:
    """``(seq, record)`` of ``group`` in a node's local log (its records
    wrapped with their place in the group's log)."""
    found = []
    for path in sorted((data_dir / "wal").glob("*.log")):
        first = int(path.name.split(".")[0])
        for _, payload in scan(path.read_bytes(), first).records:
            record = records.decode(payload)
            if record[0] == records.REPLICATED and record[1] == group:
                found += [(seq, records.decode(inner))
                          for seq, inner in enumerate(record[4], record[2])]
    return found


def test_a_board_expires_at_the_same_log_position_on_both_nodes(tmp_path: Path,
                                                                pg_dsn: str) -> None:
    group = group_of(BOARD)
    with nodes(tmp_path, pg_dsn, 2, "--fsync", "always") as (primary, follower):
        assert primary.request("PUT", f"/v1/boards/{BOARD}", {"policy": "sum"})[0] == 201
        for n in range(5):
            status, body = primary.request("POST", f"/v1/boards/{BOARD}/scores",
                                           {"member": f"p{n}", "delta": n + 1})
            assert status == 200, body
        with RawClient(primary.resp_port) as one, RawClient(follower.resp_port) as other:
            other.call("READONLY")  # (the follower's own copy: plain reads are relayed)
            assert one.call("PEXPIRE", BOARD, "2500") == b":1\r\n"
            # The follower has the deadline (from the group's log) and the board.
            _wait(lambda: other.call("TTL", BOARD) in (b":2\r\n", b":3\r\n"), what="the TTL")
            assert other.call("ZCARD", BOARD) == b":5\r\n"
            # A write on the follower is the primary's (MOVED), never applied there.
            assert other.call("PERSIST", BOARD).startswith(b"-MOVED "), \
                other.call("PERSIST", BOARD)
            _wait(lambda: other.call("EXISTS", BOARD) == b":0\r\n", what="the expiry")
            for client in (one, other):
                assert client.call("ZCARD", BOARD) == b":0\r\n"
                assert client.call("TTL", BOARD) == b":-2\r\n"
            for daemon in (primary, follower):
                _wait(lambda d=daemon: d.request("GET", f"/v1/boards/{BOARD}")[0] == 404,
                      what="404")
        _wait(lambda: len({d.request("GET", "/v1/admin/digest")[1]["digest"]
                           for d in (primary, follower)}) == 1, what="equal digests")
    # The cluster's log: the deadline, then the deletion, once, written by the primary.
    log = asyncio.run(read_log(pg_dsn))[group]
    kinds = [(seq, record[0]) for seq, _, record in log if record[1] == BOARD]
    expired = [seq for seq, kind in kinds if kind == records.EXPIRED]
    assert len(expired) == 1 and kinds[-1] == (expired[0], records.EXPIRED), kinds
    assert [kind for _, kind in kinds if kind == records.EXPIRE] == [records.EXPIRE]
    # Both nodes applied and logged it at that same position of the group's log.
    for daemon in (primary, follower):
        local = _local_records(daemon.data_dir, group)
        at = [seq for seq, record in local if record[0] == records.EXPIRED]
        assert at == expired, (daemon.data_dir, at, expired)


def test_a_follower_never_deletes_on_its_own_clock(tmp_path: Path, pg_dsn: str) -> None:
    """The primary dies before the deadline: once it passes, the follower
    answers as if the board were gone, but logs no deletion while its
    dead primary's lease lasts; once it takes the group over, it deletes
    the board as the group's primary (a record of the new epoch, in the
    group's log), and a write makes a new one."""
    group = group_of(BOARD)
    with nodes(tmp_path, pg_dsn, 2, "--fsync", "always", "--lease-seconds", "5"
               ) as (primary, follower):
        assert primary.request("PUT", f"/v1/boards/{BOARD}", {"policy": "latest"})[0] == 201
        with RawClient(follower.resp_port) as other:
            other.call("READONLY")  # (the follower's own copy: plain reads are relayed)
            with RawClient(primary.resp_port) as one:
                assert one.call("ZADD", BOARD, "5", "a") == b":1\r\n"
                assert one.call("PEXPIRE", BOARD, "1500") == b":1\r\n"
            _wait(lambda: other.call("PTTL", BOARD) != b":-2\r\n", what="the deadline")
            primary.kill()
            killed = time.monotonic()
            _wait(lambda: other.call("EXISTS", BOARD) == b":0\r\n", what="the deadline")
            assert other.call("ZSCORE", BOARD, "a") == b"$-1\r\n"
            assert other.call("TTL", BOARD) == b":-2\r\n"
            time.sleep(0.5)  # the follower's expiry task had its chances
            local = _local_records(follower.data_dir, group)
            assert time.monotonic() - killed < 4, "the lease ran out: too slow to tell"
            assert not [r for _, r in local if r[0] == records.EXPIRED], local
            _wait(lambda: any(r[0] == records.EXPIRED for _, r in
                              _local_records(follower.data_dir, group)), what="the takeover")
            assert other.call("ZADD", BOARD, "1", "b") == b":1\r\n"
            assert other.call("ZRANGE", BOARD, "0", "-1") == b"*1\r\n$1\r\nb\r\n"
            assert other.call("TTL", BOARD) == b":-1\r\n"
    log = asyncio.run(read_log(pg_dsn))[group]
    mine = [(epoch, record[0]) for _, epoch, record in log if record[1] == BOARD]
    first_epoch = mine[0][0]
    assert [kind for _, kind in mine][-4:-1] == [records.EXPIRE, records.EXPIRED,
                                                 records.BOARD_PUT], mine
    assert mine[-3][0] > first_epoch, mine  # deleted by the new primary, not the old
