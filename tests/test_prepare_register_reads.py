"""A cluster node's ``prepare(take=False)`` (a write that cannot apply
here only learns which node writes its group) reads the group's register
through ``RegisterReads``: a burst of such writes shares a bounded number
of reads, and once Postgres did not answer, the writes that follow are
refused at once, opening no read each."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from rankd.cluster import node as cluster_node
from rankd.cluster.node import ClusterConfig, ClusterNode
from rankd.engine.errors import Unavailable


class Registers:
    """A stand-in for ``ClusterLog.register``: counts the reads; while
    ``away``, Postgres does not answer."""

    def __init__(self) -> None:
        self.reads = 0
        self.away = False

    async def register(self, group: int) -> dict | None:
        self.reads += 1
        await asyncio.sleep(60 if self.away else 0.02)
        return None  # no register yet: nobody ever held the group


def test_writes_that_only_learn_share_bounded_register_reads(monkeypatch) -> None:
    # (A second: a burst of 400 prepares on a loaded machine must not outlast it.)
    monkeypatch.setattr(cluster_node, "REGISTER_READ_SECONDS", 1.0)

    async def run() -> None:
        node = ClusterNode(SimpleNamespace(), ClusterConfig("postgresql:///none", "n1",
                                                            "127.0.0.1:1"))
        node._joined.set()
        store = node.store = Registers()  # type: ignore[assignment]
        groups = range(4)

        async def burst(count: int) -> list[dict]:
            return await asyncio.gather(*(node.prepare({groups[n % len(groups)]}, take=False)
                                          for n in range(count)))

        refusals = await burst(400)
        assert all(not refused for refused in refusals)
        assert store.reads <= len(groups), store.reads  # one per group, not per write
        await asyncio.sleep(0.3)  # the reads are no longer fresh
        store.away, store.reads = True, 0
        started = time.monotonic()
        refusals = await burst(400)
        assert time.monotonic() - started < 2.5  # bounded: not a wait per write
        assert all(isinstance(refused[n % len(groups)], Unavailable)
                   for n, refused in enumerate(refusals))
        assert store.reads <= 2, store.reads  # (RegisterReads' AT_ONCE)
        # Postgres still away: the writes that follow fail at once, reading nothing.
        store.reads = 0
        started = time.monotonic()
        refusals = await burst(400)
        # Well under one read's time bound, which a write waiting for a read
        # would spend (a wall-clock bound: 0.24 s seen for the burst alone on
        # a loaded machine).
        assert time.monotonic() - started < cluster_node.REGISTER_READ_SECONDS
        assert all(refused for refused in refusals) and store.reads == 0

    asyncio.run(run())
