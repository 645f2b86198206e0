"""The rank index: one per leaderboard (and per time window).

``RankIndex`` is the native skip list from ``rankd._skiplist`` when it was
compiled, else the pure-Python fallback on ``sortedcontainers``.  Setting
``RANKD_PURE_PYTHON=1`` forces the fallback.  ``IMPLEMENTATION`` says which
one was loaded: ``"native"`` or ``"python"``.  The contract both honour is
documented in :mod:`rankd.index._contract`.
"""

from rankd._native import native_or
from rankd.index._contract import (
    MAX_EXACT_INT,
    MAX_MEMBER_BYTES,
    MAX_SEQ,
    ORDERS,
    TIE_BREAKS,
    BatchResult,
    Entry,
    Op,
    RankIndexAPI,
    When,
    WriteResult,
)
from rankd.index._fallback import RankIndex as _PurePythonIndex

RankIndex, IMPLEMENTATION = native_or("rankd._skiplist", "RankIndex", _PurePythonIndex)

__all__ = [
    "IMPLEMENTATION",
    "MAX_EXACT_INT",
    "MAX_MEMBER_BYTES",
    "MAX_SEQ",
    "ORDERS",
    "TIE_BREAKS",
    "BatchResult",
    "Entry",
    "Op",
    "RankIndex",
    "RankIndexAPI",
    "When",
    "WriteResult",
]
