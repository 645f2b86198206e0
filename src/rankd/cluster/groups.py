"""Which board group a board belongs to.

A cluster splits boards into :data:`GROUPS` groups by a hash of the board
name; each group has its own log and at most one primary at a time, so a
group can later move, or live on any subset of the nodes, without touching
the others.  The hash is CRC-32 (zlib's, IEEE 802.3) of the name's UTF-8
bytes, modulo :data:`GROUPS`: any language can compute it, and it never
changes for a name.
"""

from __future__ import annotations

import asyncio
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


class GroupLocks:
    """One ``asyncio.Lock`` per group, made on first use."""

    def __init__(self) -> None:
        self._locks: dict[int, asyncio.Lock] = {}

    def __call__(self, group: int) -> asyncio.Lock:
        lock = self._locks.get(group)
        if lock is None:
            lock = self._locks[group] = asyncio.Lock()
        return lock
