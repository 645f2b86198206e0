"""The C heap under the daemon: glibc malloc's mmap threshold, and giving
freed heap pages back to the kernel.

What it owns: how the daemon's process asks glibc's malloc to hand back the
memory of big, short-lived blocks (:func:`tune`, called once at start-up),
and :func:`release`, which returns the free pages inside the heap (after
recovery, before the daemon serves).  Nothing here changes what any
allocation holds.

**Why.**  glibc serves a block of ``M_MMAP_THRESHOLD`` bytes or more (128 KiB
at first) with its own mapping, unmapped when it is freed.  But by default
the threshold is *dynamic*: freeing such a mapped block raises the
threshold to its size (up to 32 MiB), so from then on blocks of that size
come from the heap, where freed memory stays resident unless it happens to
sit at the heap's top.  A daemon's snapshot writes its remembered event ids
in 4 MiB chunks and its index dumps whole, and ingest allocates batch
buffers of hundreds of KiB: after the first snapshot every later chunk
landed in the heap, and a daemon remembering 1M event ids held 35 MiB of
heap with 13 MiB in use (39 to 51 B per remembered id by RSS, where the
store itself takes 29.7).  Setting the threshold explicitly turns the
dynamic adjustment off (glibc's ``mallopt``): blocks of 1 MiB and more are
always mapped and given back when freed, blocks below it (requests,
batches, WAL appends) stay in the heap, which the usual trimming keeps
small.  :func:`release` (``malloc_trim(0)``) gives back whole free pages
in the middle of the heap too, which trimming from the top cannot; it
holds malloc's lock while it works (7 ms of CPU to give back 64 MiB, and
far longer in wall time on a loaded machine), so it runs only where nothing
is served yet: after recovery.  After a snapshot it gained about 1 B per
remembered id once the threshold was fixed: not worth a stall.

The environment wins: with ``MALLOC_MMAP_THRESHOLD_`` or a
``glibc.malloc.mmap_threshold`` tunable set, :func:`tune` leaves glibc's
setting alone.  On a C library other than glibc both are no-ops.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import threading

log = logging.getLogger("rankd.engine.heap")

#: Blocks of this many bytes or more get a mapping of their own.
MMAP_THRESHOLD = 1 << 20
#: glibc's ``mallopt`` parameter number for the mmap threshold.
_M_MMAP_THRESHOLD = -3

_lock = threading.Lock()
_libc: ctypes.CDLL | None = None
_looked_up = False


def _glibc() -> ctypes.CDLL | None:
    """glibc, or None on another C library."""
    global _libc, _looked_up
    with _lock:
        if not _looked_up:
            _looked_up = True
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                libc.gnu_get_libc_version  # noqa: B018  (glibc only)
                libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
                libc.malloc_trim.argtypes = [ctypes.c_size_t]
                _libc = libc
            except (OSError, AttributeError):
                _libc = None
        return _libc


def set_by_environment(environ: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """Whether the environment chose glibc's mmap threshold itself."""
    return ("MALLOC_MMAP_THRESHOLD_" in environ
            or "glibc.malloc.mmap_threshold" in environ.get("GLIBC_TUNABLES", ""))


def tune(threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at ``threshold`` bytes (module docstring),
    unless the environment set it.  Returns whether it was set."""
    libc = _glibc()
    if libc is None or set_by_environment():
        return False
    if not libc.mallopt(_M_MMAP_THRESHOLD, threshold):
        log.warning("mallopt(M_MMAP_THRESHOLD, %d) refused", threshold)
        return False
    return True


def release() -> None:
    """Give the heap's free pages back to the kernel (``malloc_trim(0)``).
    It locks malloc's arenas while it walks their free blocks and gives
    pages back (module docstring): call it only while nothing is served."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


__all__ = ["MMAP_THRESHOLD", "release", "set_by_environment", "tune"]
