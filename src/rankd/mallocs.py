"""glibc malloc settings the daemon applies to itself.

Owns one setting: a fixed mmap threshold for daemons on the compact paged
index (``--index pages``).  glibc serves a block above the threshold
(128 KiB at first) with its own mapping, given back on ``free``, but raises
the threshold to the size of every such block freed, up to 32 MiB.  After
the first snapshot, a board's dump (the copy a snapshot writes, about a
third of a paged index's size) then comes from the heap, whose pages stay
resident once it is freed: at 1M members a paged daemon kept one dump
resident for good, about half again the index's own memory (bench/README.md,
"Daemon memory").  A fixed threshold stops the adapting, so large
transient buffers always go back.  On the skip list the same copies land
in memory its relayouts freed, and the setting measured no difference,
so it is applied only with the paged layout.  An operator's own
``MALLOC_MMAP_THRESHOLD_`` wins; on a C library without ``mallopt`` (or
other than glibc) nothing is done.
"""

from __future__ import annotations

import ctypes
import os

#: glibc's ``M_MMAP_THRESHOLD`` parameter of ``mallopt``.
M_MMAP_THRESHOLD = -3
#: Blocks from this size up get their own mapping (and go back when freed).
MMAP_THRESHOLD = 1 << 20


def fix_mmap_threshold(size: int = MMAP_THRESHOLD) -> bool:
    """Set glibc's mmap threshold to ``size`` bytes, fixed (see the module
    docstring); False if not done (set in the environment, or no glibc)."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return False
    if not hasattr(libc, "gnu_get_libc_version"):  # (not glibc: its own parameters)
        return False
    mallopt = libc.mallopt
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return mallopt(M_MMAP_THRESHOLD, size) == 1
