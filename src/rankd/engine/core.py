"""What every room of the engine reads: the settings, the clock, the board
state, the current log and the cluster seam.

Owns the references that are replaced while the engine runs (the log and
the snapshot store when a cluster node starts again empty, the cluster's
:class:`rankd.engine.replication.Replication` when a node is set up), so
each room reads the current one rather than keep a copy; the life-cycle
flags (``ready``, ``closed``), the storage failure the engine stopped
writing after (decided by :mod:`rankd.engine.failure`) and the background
tasks.  The three a pass reads (``wal``, ``ready``, ``failure``) are set
with :meth:`Core.publish`, which copies them into the commit pipeline too:
the native intake reads them there as plain attributes.  Holds no logic:
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
from rankd.engine.unshipped import UnshippedRecords
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
        #: The write-ahead log once recovered, whether the engine serves, and
        #: the storage error that made it read-only: set with :meth:`publish`.
        self.wal: WriteAheadLog | None = None
        self.ready = False
        self.failure: BaseException | None = None
        #: Rooms that keep their own copy of what :meth:`publish` sets: the
        #: pass's (Commits), whose native intake reads them once a pass and
        #: so finds plain attributes.
        self.readers: list[Any] = []
        self.snapshots = SnapshotStore(config.data_dir / "snapshots")
        self.shipper: Any = None
        #: A cluster primary's records in the local log its groups' logs may lack.
        self.unshipped = UnshippedRecords()
        self.closed = False
        #: Called with a board name after each change (live feed, caches).
        self.listeners: list[Callable[[str], None]] = []
        self.tasks: list[asyncio.Task] = []
        #: Set (before start) on a cluster node, with :meth:`set_replication`:
        #: see rankd.engine.replication.
        self.replication: Replication | None = None

    def publish(self, **values: Any) -> None:
        """Set ``wal``, ``ready`` or ``failure``, here and in each of
        :attr:`readers`."""
        for name, value in values.items():
            setattr(self, name, value)
            for reader in self.readers:
                setattr(reader, name, value)

    def set_replication(self, replication: Replication | None) -> None:
        """Make the engine a cluster node's (None: a single node's); the
        intake and the plain reads learn it too."""
        self.replication = replication
        self.unshipped.unchecked = replication is not None
        if self.intake is not None:
            self.intake.replicated = replication is not None
        self.plain_reads.replication = replication

    def now_ms(self) -> int:
        """The clock, in ms since the epoch."""
        return round(self.clock() * 1000)
