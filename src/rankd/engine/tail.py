"""The bound on the WAL tail: when the log written since the last snapshot
makes the next one due.

A restart after a crash replays every record after the newest snapshot
(the *tail*); a clean stop snapshots on the way out and replays nothing.
A snapshot is wanted once the tail holds ``snapshot_every_events`` records
(or, if more, as many as the last snapshot wrote entries: a snapshot
rewrites the whole state, and a big one rewritten every million events
would cost many entries written per event) or ``snapshot_every_bytes``
bytes of frames, whichever comes first (and ``snapshot_every_seconds``
after the last one, when anything was logged).  The record count never
exceeds :data:`MAX_SNAPSHOT_EVERY_EVENTS` however big the state, and
neither setting may exceed its maximum, so no configuration and no state
makes a crash leave a longer tail than :data:`MAX_SNAPSHOT_EVERY_EVENTS`
records or :data:`MAX_SNAPSHOT_EVERY_BYTES` bytes, plus the records
written while one snapshot is being taken (its position is fixed when it
starts).

The engine keeps the counts (its commits room): records since the snapshot
(as before), bytes as the WAL's running ``stats.bytes`` against a mark
held here; checking costs one more comparison a pass of the event loop.
"""

from __future__ import annotations

#: Defaults: a million records of a typical submission are about 100 MB.
DEFAULT_SNAPSHOT_EVERY_EVENTS = 1_000_000
DEFAULT_SNAPSHOT_EVERY_BYTES = 256 << 20
#: The most either trigger may be set to: the documented bound.
MAX_SNAPSHOT_EVERY_EVENTS = 4_000_000
MAX_SNAPSHOT_EVERY_BYTES = 1 << 30


def check_tail_options(every_events: int, every_bytes: int) -> None:
    """``ValueError`` unless both triggers are positive and within the bound."""
    if not 1 <= every_events <= MAX_SNAPSHOT_EVERY_EVENTS:
        raise ValueError(f"snapshot_every_events must be from 1 to "
                         f"{MAX_SNAPSHOT_EVERY_EVENTS:,}, got {every_events!r}")
    if not 4096 <= every_bytes <= MAX_SNAPSHOT_EVERY_BYTES:
        raise ValueError(f"snapshot_every_bytes must be from 4096 to "
                         f"{MAX_SNAPSHOT_EVERY_BYTES:,}, got {every_bytes!r}")


class TailBytes:
    """Bytes of WAL frames logged since the last snapshot's position, read
    off the log's running byte count (``stats.bytes``): the write path
    compares that count with :attr:`due_at`, one comparison a pass."""

    __slots__ = ("due_at", "every", "mark")

    def __init__(self, every: int) -> None:
        self.every = every
        #: ``stats.bytes`` at the last snapshot's position (negative after a
        #: recovery: the replayed tail was written by the previous run).
        self.mark = 0
        #: ``stats.bytes`` from which a snapshot is due.
        self.due_at = every

    def set_mark(self, logged: int) -> None:
        """The last snapshot holds what was logged up to ``logged`` bytes."""
        self.mark = logged
        self.due_at = logged + self.every

    def recovered(self, tail_bytes: int) -> None:
        """A restart replayed ``tail_bytes`` bytes of frames (the count starts at 0)."""
        self.set_mark(-tail_bytes)

    def since(self, logged: int) -> int:
        return logged - self.mark
