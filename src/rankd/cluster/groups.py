"""Board groups in the cluster: the group of a board name, and a lock per group.

Which group a board belongs to (:data:`GROUPS`, :func:`group_of`) is the
engine's (:mod:`rankd.engine.groups`, whose docstring gives the hash); it is
named here too for the cluster's modules, which import the engine, never
the reverse.
"""

from __future__ import annotations

import asyncio

from rankd.engine.groups import GROUPS, group_of

__all__ = ["GROUPS", "GroupLocks", "group_of"]


class GroupLocks:
    """One ``asyncio.Lock`` per group, made on first use."""

    def __init__(self) -> None:
        self._locks: dict[int, asyncio.Lock] = {}

    def __call__(self, group: int) -> asyncio.Lock:
        lock = self._locks.get(group)
        if lock is None:
            lock = self._locks[group] = asyncio.Lock()
        return lock
