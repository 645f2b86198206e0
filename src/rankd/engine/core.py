"""What every room of the engine reads: the settings, the clock, the board
state, the current log and the cluster seam.

Owns the references that are replaced while the engine runs (the log and
the snapshot store when a cluster node starts again empty, the cluster's
:class:`rankd.engine.replication.Replication` when a node is set up), so
each room reads the current one rather than keep a copy; and the life
cycle flags (``ready``, ``closed``) and background tasks.  Holds no logic:
the rooms do the work, :class:`rankd.engine.engine.Engine` wires them.

May not touch: anything above it (every room imports it, it imports none).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from rankd.engine.replication import Replication
from rankd.engine.settings import EngineConfig
from rankd.engine.snapshot import SnapshotStore
from rankd.engine.state import BoardState
from rankd.engine.wal import WriteAheadLog


class Core:
    """The engine's shared references (module docstring)."""

    def __init__(self, config: EngineConfig, clock: Callable[[], float],
                 state: BoardState, plain_reads: Any) -> None:
        self.config = config
        self.clock = clock
        self.state = state
        #: Answers packed plain reads (RESP's), natively when built.
        self.plain_reads = plain_reads
        #: The packed path's front door (rankd.engine.intake), once built.
        self.intake: Any = None
        self.wal: WriteAheadLog | None = None
        self.snapshots = SnapshotStore(config.data_dir / "snapshots")
        self.shipper: Any = None
        #: Set once recovery finished and the engine serves.
        self.ready = False
        self.closed = False
        #: Called with a board name after each change (live feed, caches).
        self.listeners: list[Callable[[str], None]] = []
        self.tasks: list[asyncio.Task] = []
        #: Set (before start) on a cluster node, with :meth:`set_replication`:
        #: see rankd.engine.replication.
        self.replication: Replication | None = None

    def set_replication(self, replication: Replication | None) -> None:
        """Make the engine a cluster node's (None: a single node's); the
        intake and the plain reads learn it too."""
        self.replication = replication
        if self.intake is not None:
            self.intake.replicated = replication is not None
        self.plain_reads.replication = replication

    def now_ms(self) -> int:
        """The clock, in ms since the epoch."""
        return round(self.clock() * 1000)
