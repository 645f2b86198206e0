"""Shared helpers for engine tests: a fake clock and an engine runner."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from rankd.engine.engine import Engine, EngineConfig
from rankd.engine.submission import Submission

T = TypeVar("T")

#: 2026-11-22 00:00:00 UTC, a Sunday: the last day of ISO week 2026-W47.
SUNDAY = 1795305600.0


class FakeClock:
    """A settable clock; engines under test read time only through it."""

    def __init__(self, now: float = SUNDAY + 12 * 3600) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def run(coro: Awaitable[T]) -> T:
    return asyncio.run(coro)


def index_kind() -> str:
    """The index layout the engine suites run on: ``RANKD_INDEX``, else the
    daemon's default (CI runs some suites again with ``RANKD_INDEX=skiplist``)."""
    return os.environ.get("RANKD_INDEX", EngineConfig.index)


def engine_config(data_dir: Path, **overrides: Any) -> EngineConfig:
    settings: dict[str, Any] = {
        "data_dir": data_dir,
        "fsync": "no",
        "snapshot_every_seconds": 3600.0,
        "housekeeping_seconds": 3600.0,
        "index": index_kind(),
    }
    settings.update(overrides)
    return EngineConfig(**settings)


async def with_engine(
    data_dir: Path, clock: FakeClock, body: Callable[[Engine], Awaitable[T]], **overrides: Any
) -> T:
    """Open an engine on ``data_dir``, run ``body``, close it cleanly."""
    engine = await Engine.open(engine_config(data_dir, **overrides), clock=clock)
    try:
        return await body(engine)
    finally:
        await engine.close()


def sub(board: str, member: str, **fields: Any) -> Submission:
    return Submission(board=board, member=member, **fields)
