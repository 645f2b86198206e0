"""Which of a cluster primary's records in the local log its groups' logs
may not have yet: the local log keeps them until they are committed or set
aside.

A primary writes each record to its local log, then its group's log in
Postgres commits it (``replication.GroupWriter``).  Under ``--ack local``
it acknowledges a write once the local log holds it, so after a crash the
restarted node finds what it acknowledged and never shipped only in its
local log (``ReplicatedWrites.written_by``), and sets that aside.  A local
snapshot drops the log's segments before it; without this, it dropped them
whether or not the group's log had their records, and a primary killed
after a segment rolled over and two snapshots, all within its unshipped
window, lost what it had acknowledged there.

Each replicated record's local position is noted with its writer and its
last group position; :meth:`UnshippedRecords.lowest` is the least local
position of a record its writer has not seen committed, the bound the
snapshots keep the log from.  A group's notes go when its state is reset
(its uncommitted records set aside or dropped: nothing needs them since).

A restarted cluster node has no notes: until it has compared its local
state with the groups' logs (``ClusterNode._check_local_positions``), any
record of its local log may be one to set aside, so the log keeps them all
(its engine recovers and snapshots before it reaches Postgres).
"""

from __future__ import annotations

from collections import deque

from rankd.engine.replication import GroupWriter


class UnshippedRecords:
    """Local log positions of replicated records not yet known committed."""

    def __init__(self) -> None:
        #: Per group: (writer, last group position, local log position), in order.
        self._held: dict[int, deque[tuple[GroupWriter, int, int]]] = {}
        #: Set on a cluster node until its local positions were checked:
        #: the whole local log is kept meanwhile.
        self.unchecked = False

    def written(self, writer: GroupWriter, last_seq: int, lsn: int) -> None:
        """``writer``'s records up to group position ``last_seq`` are in the
        local log at ``lsn``.  (Notes already committed go first: the notes
        stay as many as the records in flight, not all since a snapshot.)"""
        held = self._held.get(writer.group)
        if held is None:
            held = self._held[writer.group] = deque()
        _drop_committed(held)
        held.append((writer, last_seq, lsn))

    def forget(self, group: int) -> None:
        """The group's state was reset: its uncommitted records are set
        aside or dropped, the local log need not keep them."""
        self._held.pop(group, None)

    def clear(self) -> None:
        """The local log was set aside (a new, empty one follows): its
        positions mean nothing in the new one, and the writers noted are
        given up, so nothing would ever commit their notes."""
        self._held.clear()

    def lowest(self) -> int | None:
        """The least local log position of a record whose group's log may
        not have it (None: every one is committed)."""
        if self.unchecked:
            return 1  # (the first position: what is unchecked may be unshipped)
        lowest = None
        for group, held in list(self._held.items()):
            _drop_committed(held)
            if not held:
                del self._held[group]
            elif lowest is None or held[0][2] < lowest:
                lowest = held[0][2]
        return lowest


def _drop_committed(held: deque[tuple[GroupWriter, int, int]]) -> None:
    while held and held[0][0].committed_seq >= held[0][1]:
        held.popleft()
