"""How a node applies a long run of a group's log without holding its loop.

A node that gains a group (placed on it, a move's target) or catches up
from far behind reads up to a hundred log batches at once, each of which
may hold thousands of events (one REST batch is one record).  Applying
them in one callback held the event loop for seconds: every client of the
node, whatever its board, waited.  The node applies such a run in slices
(:func:`apply_slices`), each bounded by records and by bytes, and lets the
loop serve between them; the log's checksums are checked off the loop
(``ClusterLog.read``).

What a record costs to apply depends on the board it changes (a
1,000,000-member index: tens of microseconds of the loop's CPU each, on
this machine under load), so a fixed count of records is no bound on a
slice's time: slices of 1,000 held a move's target for 40-50 ms of CPU
each, stretched to 0.3-0.8 s when the cores were busy.  :class:`SliceSize`
times each slice (the loop thread's CPU, which waiting for a core does not
inflate) and sizes the next one to about :data:`SLICE_CPU_SECONDS`.

Between two slices the loop runs one pass of everything else that is
ready, so a request through the node (a write relayed to its group's
primary takes four or five passes) waits for a slice at each pass: with
slices of 4 ms a move's target relayed writes with a p99 of 90-115 ms
while it caught up, and with slices of 1 ms 64-67 ms (bench/README.md,
"The first move's target").  The catch-up takes about as long either way.
"""

from __future__ import annotations

from collections.abc import Iterator

#: The most records a follower applies at a time.
APPLY_SLICE = 1000
#: And bytes of records (one record larger than this is a slice of its own).
APPLY_SLICE_BYTES = 64 << 10
#: The loop thread's CPU a slice aims at.
SLICE_CPU_SECONDS = 0.001
#: Records of a run's first slice (none timed yet), and the fewest a slice takes.
FIRST_SLICE = 32
MIN_SLICE = 10

Logged = list[tuple[int, int, bytes]]


class SliceSize:
    """How many records the next slice of a run takes: as many as the cost
    per record of the slice before fits in :data:`SLICE_CPU_SECONDS`
    (growing at most twofold a slice, within :data:`MIN_SLICE` and
    :data:`APPLY_SLICE`)."""

    def __init__(self) -> None:
        self.records = FIRST_SLICE

    def timed(self, records: int, cpu_seconds: float) -> None:
        """A slice of ``records`` took ``cpu_seconds`` of the loop thread's CPU."""
        if records <= 0:
            return
        fits = (int(SLICE_CPU_SECONDS * records / cpu_seconds) if cpu_seconds > 0
                else APPLY_SLICE)
        self.records = max(MIN_SLICE, min(APPLY_SLICE, 2 * self.records, fits))


def too_long(logged: Logged) -> bool:
    """Whether ``logged`` ``(seq, epoch, payload)`` records are applied in slices."""
    return len(logged) > 1 and (len(logged) > FIRST_SLICE or sum(
        len(payload) for _, _, payload in logged) > APPLY_SLICE_BYTES)


def apply_slices(logged: Logged, sizes: SliceSize | None = None) -> Iterator[Logged]:
    """``logged`` in slices of at most ``sizes.records`` (read as each slice
    begins; :data:`APPLY_SLICE` without ``sizes``) records and
    :data:`APPLY_SLICE_BYTES` bytes (or of one larger record), in order."""
    start, size = 0, 0
    limit = APPLY_SLICE if sizes is None else sizes.records
    for end, (_, _, payload) in enumerate(logged):
        if end > start and (end - start >= limit
                            or size + len(payload) > APPLY_SLICE_BYTES):
            yield logged[start:end]
            start, size = end, 0
            limit = APPLY_SLICE if sizes is None else sizes.records
        size += len(payload)
    if start < len(logged):
        yield logged[start:]
