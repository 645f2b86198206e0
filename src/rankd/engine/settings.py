"""The engine's settings and the tunables its rooms read.

Owns :class:`EngineConfig` (what an operator sets) and the module-level
limits the rooms look up at each use (so a test may change one with
``monkeypatch``).  Imports nothing of the engine: every room may read it,
and it may touch none of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rankd.engine.tail import (
    DEFAULT_SNAPSHOT_EVERY_BYTES,
    DEFAULT_SNAPSHOT_EVERY_EVENTS,
    check_tail_options,
)
from rankd.index.kinds import INDEX_KINDS

#: How long a read of a cluster primary's group waits for the writes it
#: would show to commit (see rankd.engine.settling).
SETTLE_SECONDS = 5.0
#: Reads made again after waiting so, at most, before ``Unsettled`` is the answer.
SETTLE_TRIES = 3

FSYNC_POLICIES = ("always", "everysec", "no")
ARCHIVE_DEPTH = 1000
REPLAY_BATCH = 10_000

#: Replayed index states held before they are applied: enough for a large
#: index to take them in one re-threading pass, few enough to bound memory.
REPLAY_PENDING_STATES = 1_000_000
#: Labels copied and encoded per step of a snapshot, on the event loop
#: (about a millisecond; encoded in a worker thread, the encoding held the
#: interpreter's lock from the loop as long).
SNAPSHOT_CHUNK = 5_000
#: Boards housekeeping looks at before it lets the event loop run.
HOUSEKEEPING_STEP = 64
#: Remembered event ids are copied for a snapshot in chunks of about this
#: many bytes (their portable log form: see rankd.engine.dedupe).
SNAPSHOT_LOG_BYTES = 4 << 20
#: A board's index is written to a snapshot (a quarter of this at a time),
#: and read back at a restart, in pieces of about this many bytes
#: (``dump_walk``/``load_chunks``), never as one dump: a whole dump was a
#: second copy of the index at those peaks.
SNAPSHOT_INDEX_BYTES = 4 << 20
#: A walked index (``dump_walk``: a snapshot that never holds a board's
#: writes) is made in pieces of about this many bytes, each on the event
#: loop: a few thousand records, well under a millisecond.
SNAPSHOT_WALK_BYTES = 128 << 10


@dataclass
class EngineConfig:
    """Engine settings; the defaults work with no configuration at all."""

    data_dir: Path = Path("rankd-data")
    #: ``always``: acknowledge after fsync (group commit); ``everysec``:
    #: fsync once a second (a machine crash may lose the last second; a
    #: process crash loses nothing); ``no``: leave it to the OS.
    fsync: str = "everysec"
    segment_bytes: int = 64 << 20
    #: A snapshot is wanted after this many WAL records or bytes since the
    #: last one, whichever first (bounded: see rankd.engine.tail).
    snapshot_every_events: int = DEFAULT_SNAPSHOT_EVERY_EVENTS
    snapshot_every_bytes: int = DEFAULT_SNAPSHOT_EVERY_BYTES
    snapshot_every_seconds: float = 300.0
    dedupe_ttl: float = 86_400.0
    #: How far an event's timestamp may be from the engine clock, seconds.
    ts_tolerance: float = 300.0
    housekeeping_seconds: float = 30.0
    postgres_dsn: str | None = None
    #: Truncate the WAL at a mid-log corruption (keeping the rest aside)
    #: instead of refusing to start.
    repair: bool = False
    #: The rank index every board is built with (rankd.index.kinds):
    #: ``pages`` (compact) or ``skiplist``.
    index: str = "pages"

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir)
        if self.fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync must be one of {', '.join(FSYNC_POLICIES)}, "
                             f"got {self.fsync!r}")
        check_tail_options(self.snapshot_every_events, self.snapshot_every_bytes)
        if self.index not in INDEX_KINDS:
            raise ValueError(f"index must be one of {', '.join(INDEX_KINDS)}, "
                             f"got {self.index!r}")
