"""Settings of Python's cyclic garbage collector for a process holding big boards.

Recovered state (indexes are native, but dedupe tables, labels and configs are
Python objects) lives as long as the process, and every submission allocates a
few short-lived containers.  With the default thresholds the collector runs
every 700 allocations and keeps walking the long-lived state: 10-15% of ingest
time.  :func:`settle` moves what exists into the permanent generation and makes
young collections rarer; the daemon calls it once recovery is complete.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

#: allocations between young collections, then young/middle collections per older one
THRESHOLDS = (50_000, 20, 100)


#: Objects allocated with the collector paused beyond which they are frozen.
KEEP_RECOVERED_AFTER = 100_000


def keep_recovered() -> None:
    """Freeze what was allocated while the collector was paused, if it is a lot.

    Everything allocated since the last collection is in the young
    generation, so after a recovery of millions of objects the first young
    collection would walk them all (a second at a million-member board).
    Recovered state holds no cycles and lives as long as the engine, so it
    goes to the permanent generation instead.  A small recovery is left to
    the collector: freezing also keeps whatever else is alive in the
    process (a test session's garbage) out of every later collection.
    """
    if gc.get_count()[0] >= KEEP_RECOVERED_AFTER:
        gc.freeze()


def settle() -> None:
    """Freeze everything alive now and collect the young generation less often."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)


@contextmanager
def settled() -> Iterator[None]:
    """:func:`settle` for the duration of a block (benchmarks, tools), then restore."""
    previous = gc.get_threshold()
    settle()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*previous)
