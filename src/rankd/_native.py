"""Choosing a native extension or its pure-Python twin, at import.

Each hot loop with a Cython implementation (the rank index, the WAL frame
scanner, recovery's replay) has a pure-Python one with the same behaviour.
The native one is used when it was compiled; ``RANKD_PURE_PYTHON=1`` forces
the pure-Python ones everywhere (CI runs the engine's tests both ways).
"""

from __future__ import annotations

import importlib
import os
from typing import TypeVar

T = TypeVar("T")

#: Native module -> "native" or "python": what this process chose for each.
CHOSEN: dict[str, str] = {}
#: The names the daemon reports them by (metrics, the start-up line).
PARTS = {"rankd._skiplist": "index", "rankd.engine._ingest": "ingest",
         "rankd.engine._frames": "wal_frames", "rankd.engine._idstore": "dedupe",
         "rankd.engine._replay": "replay", "rankd.frontends._submits": "tcp_scanner",
         "rankd.frontends.resp._scanner": "resp_scanner", "rankd.engine._reads": "resp_reads",
         "rankd.frontends._lanes": "lanes", "rankd.engine._intake": "intake",
         "rankd.frontends._rest": "rest_ingest", "rankd.frontends._rest_reads": "rest_reads"}


def pure_python_forced() -> bool:
    """Whether ``RANKD_PURE_PYTHON`` asks for the pure-Python implementations."""
    return os.environ.get("RANKD_PURE_PYTHON", "") not in ("", "0")


def native_or(module: str, name: str, fallback: T) -> tuple[T, str]:
    """``(module.name, "native")`` if that extension imports and the pure-Python
    implementations are not forced, else ``(fallback, "python")``.  Both have
    the same API, so the fallback's type stands for either."""
    if not pure_python_forced():
        try:
            found = getattr(importlib.import_module(module), name)
        except ImportError:
            pass
        else:
            CHOSEN.setdefault(module, "native")
            return found, "native"
    CHOSEN[module] = "python"
    return fallback, "python"


def implementations() -> dict[str, str]:
    """Which implementation each hot loop runs, by part (see :data:`PARTS`);
    importing the modules that choose them first."""
    for module in ("rankd.index", "rankd.engine.ingest", "rankd.engine.frames",
                   "rankd.engine.dedupe", "rankd.engine.replay", "rankd.frontends.tcp",
                   "rankd.frontends.resp.protocol", "rankd.frontends.resp.connection",
                   "rankd.engine.engine", "rankd.frontends.service"):
        importlib.import_module(module)
    return {part: CHOSEN.get(module, "python") for module, part in PARTS.items()}
