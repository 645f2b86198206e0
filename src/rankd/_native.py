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


def pure_python_forced() -> bool:
    """Whether ``RANKD_PURE_PYTHON`` asks for the pure-Python implementations."""
    return os.environ.get("RANKD_PURE_PYTHON", "") not in ("", "0")


def native_or(module: str, name: str, fallback: T) -> tuple[T, str]:
    """``(module.name, "native")`` if that extension imports and the pure-Python
    implementations are not forced, else ``(fallback, "python")``.  Both have
    the same API, so the fallback's type stands for either."""
    if not pure_python_forced():
        try:
            return getattr(importlib.import_module(module), name), "native"
        except ImportError:
            pass
    return fallback, "python"
