"""Small rankd clusters on the session's Postgres, for the tests of a
node's trust, its groups and its clients' sessions: each test gets a fresh
database and its own nodes (no proxies: see jepsen.py for faults)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
from jepsen import wait_ready

from daemon import Daemon
from rankd.cluster.groups import group_of
from rankd.engine.groups import SLOTS_PER_GROUP, slot_of
from respclient import RawClient


def sql(dsn: str, query: str, *args: Any) -> list[asyncpg.Record]:
    """Run one statement on ``dsn``; its rows."""

    async def run() -> list[asyncpg.Record]:
        conn = await asyncpg.connect(dsn)
        try:
            return await conn.fetch(query, *args)
        finally:
            await conn.close()

    return asyncio.run(run())


def node(root: Path, dsn: str, name: str, *args: str) -> Daemon:
    """A cluster node (not started) with a short lease, holding every group
    of a cluster of up to three nodes unless ``args`` say another ``--replicas``."""
    return Daemon(root / name, "--cluster-dsn", dsn, "--node-id", name,
                  "--lease-seconds", "1.5", "--log-format", "text", "--replicas", "2", *args)


@contextlib.contextmanager
def nodes(root: Path, dsn: str, count: int, *args: str) -> Iterator[list[Daemon]]:
    """``count`` started nodes ``n0``, ``n1``...; stopped at the end."""
    daemons: list[Daemon] = []
    try:
        for i in range(count):
            daemon = node(root, dsn, f"n{i}", *args)
            daemons.append(daemon)
            daemon.start()
            wait_ready(daemon)
        yield daemons
    finally:
        for daemon in daemons:
            if daemon.process is not None and daemon.process.poll() is None:
                daemon.stop(timeout=20)


def holder(dsn: str, group: int) -> str | None:
    """The node that holds ``group``'s lease now (None: nobody)."""
    rows = sql(dsn, "SELECT holder FROM rankd_groups WHERE group_id = $1 "
                    "AND lease_until > now()", group)
    return rows[0]["holder"] if rows else None


def boards_in_distinct_groups(prefix: str, count: int, tries: int = 1000) -> list[str]:
    """``count`` board names ``f"{prefix}-{n}"``, each in a group of its own
    (fewer if ``tries`` names do not reach that many groups)."""
    boards, groups = [], set()
    for n in range(tries):
        if group_of(f"{prefix}-{n}") not in groups:
            boards.append(f"{prefix}-{n}")
            groups.add(group_of(f"{prefix}-{n}"))
        if len(boards) == count:
            break
    return boards


def keys_guessed_by(resp_port: int, peer_resp_port: int, prefix: str, count: int) -> list[str]:
    """``count`` keys ``f"{prefix}{n}"`` of distinct groups in the block of
    slots the node at ``resp_port`` serves by its ``CLUSTER NODES`` (a group
    nobody wrote yet falls to it by block), once it sees the node at
    ``peer_resp_port``."""
    deadline = time.monotonic() + 15
    while f":{peer_resp_port}@" not in (
            raw := RawClient(resp_port).call("CLUSTER", "NODES").decode()):
        assert time.monotonic() < deadline, "the nodes never saw each other"
        time.sleep(0.2)
    ranges = [(int(lo), int(hi)) for line in raw.splitlines() if "myself" in line
              for lo, _, hi in (part.partition("-") for part in line.split()[8:])]
    keys: dict[int, str] = {}
    for n in range(100_000):
        key = f"{prefix}{n}"
        if any(lo <= slot_of(key) <= hi for lo, hi in ranges):
            keys.setdefault(slot_of(key) // SLOTS_PER_GROUP, key)
        if len(keys) == count:
            return list(keys.values())
    raise AssertionError("too few groups in the node's block")
