"""Which board-grouping scheme a cluster's Postgres holds, and the refusal of another.

A cluster's logs, registers and snapshots are keyed by board group, so
every node must group boards alike.  Clusters made before hash slots
grouped by CRC-32 (``rankd.engine.groups.legacy_group_of``); this version
groups by Redis Cluster's slots (``SCHEME``).  The scheme is recorded in
``rankd_cluster_meta`` (key ``board_groups``) by the first node of a new
cluster, in the same transaction that finds the cluster empty, so:

* a cluster whose meta row names another scheme, or that holds groups but
  no meta row (made by an older rankd), is refused at start
  (:class:`SchemeMismatch`, naming ``rankd cluster migrate-slots``); nothing
  is ever re-hashed silently;
* the row also holds a *layout id*, new at each marking (a new cluster, a
  migration).  A node keeps the id it joined under in its data dir
  (:data:`LAYOUT_FILE`); a data dir holding cluster state but another id (or
  none: written before a migration) is refused too, since its positions
  and boards are of groups that no longer exist.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import asyncpg

from rankd.cluster.log import lock_schema
from rankd.engine.groups import SCHEME

#: The row's key in ``rankd_cluster_meta``.
KEY = "board_groups"
#: The file, in a node's data dir, naming the layout id it joined under.
LAYOUT_FILE = "cluster-layout"
MIGRATION = "rankd cluster migrate-slots --dsn DSN"

META_SCHEMA = """
CREATE TABLE IF NOT EXISTS rankd_cluster_meta (
    key    text PRIMARY KEY,
    value  text NOT NULL,
    layout text NOT NULL
);
"""


class SchemeMismatch(RuntimeError):
    """The cluster's Postgres (or this node's data dir) holds boards grouped
    by another scheme than this rankd's."""


async def has_groups(conn: asyncpg.Connection) -> bool:
    """Whether the cluster's tables hold any group (register, log or snapshot)."""
    for table in ("rankd_groups", "rankd_log", "rankd_group_snapshots"):
        if await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", table) and \
                await conn.fetchval(f"SELECT EXISTS (SELECT 1 FROM {table})"):
            return True
    return False


async def check_scheme(conn: asyncpg.Connection) -> str:
    """The cluster's layout id, marking a cluster with no group yet as
    grouped by :data:`SCHEME`; :class:`SchemeMismatch` if it is grouped by
    another scheme."""
    async with conn.transaction():
        await lock_schema(conn)
        await conn.execute(META_SCHEMA)
        row = await conn.fetchrow(
            "SELECT value, layout FROM rankd_cluster_meta WHERE key = $1", KEY)
        if row is not None:
            if row["value"] != SCHEME:
                raise SchemeMismatch(
                    f"the cluster's Postgres groups boards by {row['value']!r}; this rankd "
                    f"groups them by {SCHEME!r} and cannot read it")
            return str(row["layout"])
        if await has_groups(conn):
            raise SchemeMismatch(
                "the cluster's Postgres was written by a rankd before hash slots (its board "
                "groups are CRC-32's, this rankd's are Redis Cluster slots' CRC16); nothing "
                f"was changed.  Stop every node, run `{MIGRATION}` once, then start the "
                "nodes with empty data dirs (docs/cluster.md, Hash slots)")
        return await mark(conn)


async def mark(conn: asyncpg.Connection) -> str:
    """Within a transaction: record :data:`SCHEME` with a new layout id."""
    await conn.execute(META_SCHEMA)
    layout = secrets.token_hex(8)
    await conn.execute(
        "INSERT INTO rankd_cluster_meta (key, value, layout) VALUES ($1, $2, $3) "
        "ON CONFLICT (key) DO UPDATE SET value = excluded.value, layout = excluded.layout",
        KEY, SCHEME, layout)
    return layout


def check_data_dir(data_dir: Path, layout: str, holds_cluster_state: bool) -> None:
    """Refuse a data dir holding cluster state of another layout; record
    ``layout`` in it otherwise."""
    path = data_dir / LAYOUT_FILE
    try:
        kept = path.read_text().strip()
    except FileNotFoundError:
        kept = None
    if holds_cluster_state and kept != layout:
        raise SchemeMismatch(
            f"data dir {data_dir} holds cluster state of board groups that no longer exist "
            "(written before the cluster's `rankd cluster migrate-slots`, or by another "
            "cluster); nothing was changed.  Move it aside and start the node with an empty "
            "data dir: it loads every group from the cluster")
    if kept != layout:
        path.write_text(layout + "\n")
