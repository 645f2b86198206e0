"""What each node tells the planner about what it can take, and the planner's reading of it.

What it owns: the ``planning`` report a node sends with every heartbeat
(``rankd_nodes.planning``, jsonb) and its reading by the planner and by a
group's first primary:

* ``free_bytes``: the free bytes of the node's data dir's file system
  (``statvfs``: what an unprivileged process may still write);
* ``log_failed``: whether its local log failed (a full disk, an I/O
  error: :mod:`rankd.cluster.recovery` is getting it back);
* ``spread``: the groups it holds with a board configured ``replicas:
  all`` (every node should follow them, so a hot board's live feed is
  local everywhere).

:func:`read_reports` turns the live nodes' reports into :class:`Capacity`:
the nodes whose log *fails* (the planner empties them as if draining:
their copy is no copy, and they take no group), the nodes *full*
(failing, or with less than ``--min-free-disk`` free: they keep what they
hold but are given no group, as primary or follower, since loading one
would fill the disk and fail their log) and the *spread* groups (any live
node's report counts: a group's primary always holds and reports it).

A node that sent no report yet (an older rankd, or before its first
heartbeat of this version) counts as fit: the planner behaves as before.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from rankd.engine.groups import group_of

#: Free bytes below which a node's data dir counts as full (``--min-free-disk``).
MIN_FREE_BYTES = 256 << 20

SCHEMA = "ALTER TABLE rankd_nodes ADD COLUMN IF NOT EXISTS planning jsonb;"


def free_bytes(directory: Path) -> int | None:
    """The bytes an unprivileged process may still write under ``directory``
    (None: it cannot be asked)."""
    try:
        stat = os.statvfs(directory)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def spread_groups(boards: Iterable[tuple[str, Any]]) -> list[int]:
    """The groups of the ``(name, board)`` pairs whose config keeps them on
    every node (``replicas: all``)."""
    return sorted({group_of(name) for name, board in boards
                   if board.config.replicas == "all"})


def report(data_dir: Path, log_failed: bool, spread: Iterable[int]) -> dict[str, Any]:
    """This node's ``planning`` report (see the module docstring); ``spread``:
    the groups it holds with a ``replicas: all`` board."""
    return {"free_bytes": free_bytes(data_dir), "log_failed": log_failed,
            "spread": sorted(spread)}


@dataclass
class Capacity:
    """What the live nodes reported, for one plan."""

    #: Nodes whose local log fails.
    failing: set[str] = field(default_factory=set)
    #: Nodes given no group (failing, or short of free disk).
    full: set[str] = field(default_factory=set)
    #: Groups every node should follow.
    spread: set[int] = field(default_factory=set)
    #: Each reporting node's free bytes (None: unknown), for status.
    free: dict[str, int | None] = field(default_factory=dict)

    def refusal(self, node: str) -> str | None:
        """Why ``node`` may be given no group (None: it may)."""
        if node in self.failing:
            return f"node {node!r} cannot take a group: its local log fails (a full disk?)"
        if node in self.full:
            return (f"node {node!r} cannot take a group: its data dir has "
                    f"{self.free.get(node) or 0:,} bytes free, under --min-free-disk")
        return None


def capacity_of(reports: dict[str, dict[str, Any] | None], min_free: int) -> Capacity:
    """:class:`Capacity` from each node's last report (None: none sent)."""
    out = Capacity()
    for node, sent in reports.items():
        if not sent:
            continue
        free = sent.get("free_bytes")
        out.free[node] = free
        if sent.get("log_failed"):
            out.failing.add(node)
            out.full.add(node)
        elif free is not None and free < min_free:
            out.full.add(node)
        out.spread.update(int(g) for g in sent.get("spread") or ())
    return out


async def read_reports(pool: asyncpg.Pool, nodes: Iterable[str], min_free: int) -> Capacity:
    """:class:`Capacity` of ``nodes`` (the live ones), from their last heartbeats."""
    async with pool.acquire() as conn:
        rows = await conn.fetch("SELECT node_id, planning FROM rankd_nodes "
                                "WHERE node_id = ANY($1::text[])", list(nodes))
    return capacity_of({row["node_id"]: json.loads(row["planning"]) if row["planning"]
                        else None for row in rows}, min_free)


async def draining(pool: asyncpg.Pool, node: str) -> bool:
    """Whether ``node`` is being drained (``rankd cluster drain``)."""
    async with pool.acquire() as conn:
        return bool(await conn.fetchval(
            "SELECT EXISTS (SELECT 1 FROM rankd_draining WHERE node_id = $1)", node))
