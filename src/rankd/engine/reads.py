"""The engine's answers to packed plain reads, for a RESP front-end.

A RESP connection's scanner packs runs of plain reads (``ZSCORE``,
``ZRANK``, ``ZREVRANK``, ``ZRANGE``, ``ZREVRANGE``); ``PlainReads.answer``
answers them from the boards' indexes, natively
(``rankd.engine._reads.Reads``).  Its pure-Python stand-in answers none:
the front-end then reads each its general way, with the same replies.
"""

from __future__ import annotations

from typing import Any

from rankd._native import native_or


class UnansweredReads:
    """``rankd.engine._reads.Reads`` without the native module: every read
    is left to the front-end's general way."""

    def __init__(self, boards: dict[str, Any]) -> None:
        self.boards = boards
        #: Set while the engine rolls its state back after a storage failure.
        self.paused = False
        #: A cluster node's ``Replication``, or None.
        self.replication: Any = None
        #: Names of boards about to expire (``Engine.deadlines.expiring``).
        self.expiring: set[str] = set()

    def answer(self, reads: Any, first: int, version: int, max_entries: int,
               max_bytes: int) -> tuple[bytes, int]:
        """``(replies, stopped)``: none answered, ``stopped`` is ``first``."""
        return b"", first


PlainReads, _ = native_or("rankd.engine._reads", "Reads", UnansweredReads)
