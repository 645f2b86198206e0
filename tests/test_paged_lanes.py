"""The daemon's native lanes on the compact paged index (``--index pages``).

What this file proves: a paged board is served by the native lanes - the
packed RESP writes and plain reads (counted as ``rankd_native_writes`` and
``rankd_native_reads``, which the general path never bumps) and the REST
hot route's standing, written natively (``_rest_reads.standing_json``,
None for an index the native code cannot read) - through the paged
index's C entry points (``rankd/_pages.pxd``), with the answers the skip
list's lanes give.  The whole RESP and REST suites run on the paged index
with ``RANKD_INDEX=pages`` (see ``test_paged_daemon.py``).
"""

from __future__ import annotations

import random
import re

import pytest

from daemon import Daemon
from rankd._native import native_or
from rankd.frontends.resp.connection import FAST_WRITES
from rankd.index import kinds
from respclient import RawClient

standing_json, _ = native_or("rankd.frontends._rest_reads", "standing_json", None)

pytestmark = pytest.mark.skipif(
    not FAST_WRITES or standing_json is None
    or kinds.index_class("pages") is kinds.index_class("skiplist"),
    reason="the native lanes or the native indexes are not built")


def _native_counts(client: RawClient) -> tuple[int, int]:
    """``rankd_native_writes`` and ``rankd_native_reads`` of INFO stats."""
    info = client.call("INFO", "stats").decode()
    return (int(re.search(r"rankd_native_writes:(\d+)", info)[1]),
            int(re.search(r"rankd_native_reads:(\d+)", info)[1]))


def test_a_paged_board_is_served_by_the_native_resp_lane(tmp_path):
    with Daemon(tmp_path / "data", "--index", "pages") as daemon, \
            RawClient(daemon.resp_port) as client:
        assert client.call("ZADD", "lb", "1", "ann") == b":1\r\n"  # makes the board
        writes, reads = _native_counts(client)
        assert client.call("ZADD", "lb", "5", "bob") == b":1\r\n"
        assert client.call("ZINCRBY", "lb", "3", "ann") == b"$1\r\n4\r\n"
        assert client.call("ZSCORE", "lb", "bob") == b"$1\r\n5\r\n"
        assert client.call("ZSCORE", "lb", "nobody") == b"$-1\r\n"
        assert client.call("ZRANK", "lb", "bob") == b":1\r\n"
        assert client.call("ZREVRANK", "lb", "bob") == b":0\r\n"
        assert client.call("ZRANGE", "lb", "0", "-1", "WITHSCORES") == (
            b"*4\r\n$3\r\nann\r\n$1\r\n4\r\n$3\r\nbob\r\n$1\r\n5\r\n")
        assert client.call("ZREVRANGE", "lb", "0", "0") == b"*1\r\n$3\r\nbob\r\n"
        assert _native_counts(client) == (writes + 2, reads + 6)
        # Pipelined pops, then what they left.
        assert client.call("ZPOPMIN", "lb") == b"*2\r\n$3\r\nann\r\n$1\r\n4\r\n"
        assert client.call("ZRANGE", "lb", "0", "-1") == b"*1\r\n$3\r\nbob\r\n"


@pytest.mark.parametrize("tie_break", ["first", "member", "member_desc"])
@pytest.mark.parametrize("order", ["desc", "asc"])
def test_the_rest_standing_of_a_paged_board_is_written_natively(order, tie_break):
    """``standing_json`` of a paged index is the skip list's, byte for byte
    (before the paged entry points it gave None: the general path)."""
    paged = kinds.index_class("pages")(order, tie_break)
    skiplist = kinds.index_class("skiplist")(order, tie_break)
    rng = random.Random(47)
    for _ in range(3000):
        member, score = f"m{rng.randrange(700)}", rng.randrange(-20, 60) / 4
        if rng.random() < 0.1:
            paged.remove(member)
            skiplist.remove(member)
        else:
            paged.set(member, score)
            skiplist.set(member, score)
    for i in range(0, 700, 7):
        args = (f"m{i}", "a label" if i % 2 else None, "all", "all", i)
        assert standing_json(paged, *args) == standing_json(skiplist, *args)
        assert standing_json(paged, *args) is not None
    assert standing_json(paged, "absent", None, "all", "all", 1) == b""
    # What the native lane cannot take goes the general way, which says why.
    assert standing_json(paged, "x" * 257, None, "all", "all", 1) is None
    assert standing_json(paged, "\ud800", None, "all", "all", 1) is None
