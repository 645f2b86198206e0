"""How a node applies a long run of a group's log without holding its loop.

A node that gains a group (placed on it, a move's target) or catches up
from far behind reads up to a hundred log batches at once, each of which
may hold thousands of events (one REST batch is one record).  Applying
them in one callback held the event loop for seconds: every client of the
node, whatever its board, waited.  The node applies such a run in slices
(:func:`apply_slices`), each bounded by records and by bytes, and lets the
loop serve between them; the log's checksums are checked off the loop
(``ClusterLog.read``).  The slice bounds keep one slice to a few ms.
"""

from __future__ import annotations

from collections.abc import Iterator

#: Records a follower applies at a time.
APPLY_SLICE = 1000
#: And bytes of records (one record larger than this is a slice of its own).
APPLY_SLICE_BYTES = 64 << 10

Logged = list[tuple[int, int, bytes]]


def too_long(logged: Logged) -> bool:
    """Whether ``logged`` ``(seq, epoch, payload)`` records are applied in slices."""
    return len(logged) > 1 and (len(logged) > APPLY_SLICE or sum(
        len(payload) for _, _, payload in logged) > APPLY_SLICE_BYTES)


def apply_slices(logged: Logged) -> Iterator[Logged]:
    """``logged`` in slices of at most :data:`APPLY_SLICE` records and
    :data:`APPLY_SLICE_BYTES` bytes (or of one larger record), in order."""
    start, size = 0, 0
    for end, (_, _, payload) in enumerate(logged):
        if end > start and (end - start >= APPLY_SLICE
                            or size + len(payload) > APPLY_SLICE_BYTES):
            yield logged[start:end]
            start, size = end, 0
        size += len(payload)
    if start < len(logged):
        yield logged[start:]
