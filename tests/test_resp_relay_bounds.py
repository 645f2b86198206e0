"""A relayed reply is bounded in bytes before it is read: a far end that
announces a bulk string larger than a node's largest reply, or sends an
endless array, fails the relay (the link is dropped) instead of making the
node buffer it; a node's largest real reply still passes whole."""

from __future__ import annotations

import asyncio

import pytest

from rankd.frontends.resp import relay
from rankd.frontends.resp.limits import MAX_REPLY_ENTRIES
from rankd.frontends.resp.relay import MAX_REPLY_BYTES, RelayFailed, read_reply
from rankd.index._contract import MAX_MEMBER_BYTES


def reply_of(data: bytes, eof: bool = True) -> bytes:
    async def read() -> bytes:
        reader = asyncio.StreamReader(limit=1 << 16)
        reader.feed_data(data)
        if eof:
            reader.feed_eof()
        return await asyncio.wait_for(read_reply(reader), 5)
    return asyncio.run(read())


def test_an_announced_bulk_over_the_bound_fails_before_it_is_read() -> None:
    # Not fed, and no end of stream: the relay must not wait to read it.
    with pytest.raises(RelayFailed, match="over"):
        reply_of(b"$%d\r\n" % (MAX_REPLY_BYTES + 1), eof=False)


def test_an_endless_array_fails_once_past_the_bound(monkeypatch) -> None:
    monkeypatch.setattr(relay, "MAX_REPLY_BYTES", 1 << 16)  # (the same check, sooner)
    entries = (1 << 16) // 4 + 1
    with pytest.raises(RelayFailed, match="over"):
        reply_of(b"*%d\r\n" % entries + b":1\r\n" * entries)


def test_a_nodes_largest_range_reply_passes_whole() -> None:
    member = b"m" * MAX_MEMBER_BYTES
    pair = b"*2\r\n$%d\r\n%s\r\n,-1.2345678901234567e+300\r\n" % (len(member), member)
    largest = b"*%d\r\n" % MAX_REPLY_ENTRIES + pair * MAX_REPLY_ENTRIES
    assert len(largest) < MAX_REPLY_BYTES
    assert reply_of(largest + b"+next\r\n") == largest

