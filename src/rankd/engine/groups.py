"""Which board group a board belongs to.

Boards fall into :data:`GROUPS` groups by a hash of the board name; in a
cluster each group has its own log and at most one primary at a time, so a
group can later move, or live on any subset of the nodes, without touching
the others.  The hash is CRC-32 (zlib's, IEEE 802.3) of the name's UTF-8
bytes, modulo :data:`GROUPS`: any language can compute it, and it never
changes for a name.

The engine owns it (its writes are routed and logged by group, and
transactions stay within one); :mod:`rankd.cluster.groups` takes it from
here, since the cluster is built on the engine, never the reverse.  This
module imports nothing of rankd's.
"""

from __future__ import annotations

import zlib

#: The number of board groups: fixed for the life of a cluster.
GROUPS = 1024


def group_of(board: str) -> int:
    """The group of ``board``: ``crc32(utf8(board)) % GROUPS``, of only its
    hash tag if it has one, as Redis Cluster picks a key's slot: the text
    between its first ``{`` and the first ``}`` after it, when not empty.
    So ``{cup}:daily`` and ``{cup}:weekly`` share a group (one node writes
    both).  Names of before had no braces: their groups stay."""
    start = board.find("{")
    if start >= 0:
        end = board.find("}", start + 1)
        if end > start + 1:
            board = board[start + 1:end]
    return zlib.crc32(board.encode()) % GROUPS
