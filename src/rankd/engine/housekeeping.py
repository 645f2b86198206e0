"""Housekeeping: what time does to boards.

Owns the two background loops that change boards without a client asking:
housekeeping proper (expired event ids forgotten, periods beyond a board's
``retain`` retired, their final standings archived first, to Postgres or
to JSON files under the data dir), and active expiry (boards deleted as
their deadlines pass, an ``EXPIRED`` record each, written like any board
change).  Both let the event loop run between steps.

May not touch: the log or the commit pipeline directly (deletions go
through :class:`rankd.engine.changes.BoardChanges`), reads, snapshots.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from rankd.engine import expiry, records, settings
from rankd.engine.changes import BoardChanges
from rankd.engine.config import file_name_of
from rankd.engine.core import Core
from rankd.engine.errors import EngineError
from rankd.engine.failure import StorageGuard
from rankd.engine.groups import group_of
from rankd.engine.replicated import ReplicatedWrites

log = logging.getLogger("rankd.engine.engine")


class Housekeeping:
    """Retention, archives and expiry (module docstring)."""

    def __init__(self, core: Core, guard: StorageGuard, changes: BoardChanges,
                 cluster: ReplicatedWrites) -> None:
        self.core = core
        self.state = core.state
        self.guard = guard
        self.changes = changes
        self.cluster = cluster

    # --- retention --------------------------------------------------------------------

    async def loop(self) -> None:
        while True:
            await asyncio.sleep(self.core.config.housekeeping_seconds)
            try:
                await self.housekeeping()
            except Exception:
                log.exception("housekeeping failed")

    async def housekeeping(self, *, expire_ids: bool = True) -> None:
        """Expire dedupe entries (unless not ``expire_ids``) and retire
        periods beyond ``retain``, archiving their final standings first.
        The event loop runs between boards: with tens of thousands of
        boards, one pass is many steps."""
        now = self.core.clock()
        step = settings.HOUSEKEEPING_STEP
        for position, board in enumerate(list(self.state.boards.values())):
            if position % step == step - 1:
                await asyncio.sleep(0)
            await board.writable.wait()  # not while a store reads this board
            if expire_ids:
                board.dedupe.expire(now)
            for window, period in board.expired_periods(now):
                index = board.periods[window].get(period)
                if index is None:
                    continue
                entries = [{"rank": r, "member": m, "score": s + 0.0, "label": board.labels.get(m)}
                           for r, m, s in index.range_by_rank(0, settings.ARCHIVE_DEPTH)]
                await self._archive(board.name, window, period, entries)
                board.periods[window].pop(period, None)
                log.info("retired period %s of %s/%s (%d members)", period, board.name,
                         window, len(index))

    async def _archive(self, board: str, window: str, period: str,
                       entries: list[dict[str, Any]]) -> None:
        config = self.core.config
        if config.postgres_dsn:
            from rankd.engine.postgres import archive_standings

            await archive_standings(config.postgres_dsn, board, window, period, entries)
            return
        path = (config.data_dir / "archive" / file_name_of(board) / window
                / f"{period}.json")
        await asyncio.to_thread(_write_json_atomically, path, {
            "board": board, "window": window, "period": period, "entries": entries})

    # --- expiry (see rankd.engine.expiry) ----------------------------------------------

    async def expiry_loop(self) -> None:
        """Delete boards as their deadlines pass (see :meth:`expire_due`),
        sleeping until the next one otherwise."""
        state = self.state
        # (Not ``while True``: Python 3.11's ``wait_for`` swallows a cancel
        # that comes as the event is set, and ``close`` would wait forever.)
        while not self.core.closed:
            try:
                if await self.expire_due():
                    await asyncio.sleep(0)  # other clients' turn between steps
                    continue
            except Exception:
                log.exception("deleting expired boards failed; trying again shortly")
                await asyncio.sleep(expiry.RETRY_MS / 1000)
                continue
            wake = state.deadlines.next_ms()
            state.deadline_set.clear()
            timeout = 60.0 if wake is None else min(60.0, max(0, wake - state.now_ms()) / 1000)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(state.deadline_set.wait(), timeout)

    async def expire_due(self) -> int:
        """One step of active expiry: delete (a logged ``EXPIRED`` record
        each) up to ``expiry.STEP`` boards whose deadline passed, those
        this node writes; others are looked at again later (a cluster
        follower's come deleted through the group's log).  Returns how
        many were due."""
        state = self.state
        deadlines = state.deadlines
        deadlines.compact(state.deadline_of)
        now_ms = state.now_ms()
        due = deadlines.due(now_ms, state.deadline_of)
        if not due or self.guard.failure is not None or self.guard.rolling_back:
            for name, deadline in due:
                deadlines.retry(name, deadline, now_ms)
            return len(due)
        replicated = self.core.replication is not None
        by_group: dict[int, list[list]] = {}
        for name, deadline in due:
            group = group_of(name) if replicated else 0
            board = state.boards[name]
            if not board.writable.is_set() or (replicated and not self.cluster.writes(group)):
                deadlines.retry(name, deadline, now_ms)
                continue
            by_group.setdefault(group, []).append([records.EXPIRED, name, deadline, now_ms])
        groups = list(by_group.values())
        outcomes = await asyncio.gather(*(self.changes.write(logged) for logged in groups),
                                        return_exceptions=True)
        for logged, outcome in zip(groups, outcomes, strict=True):
            if isinstance(outcome, EngineError):  # refused (e.g. deposed meanwhile)
                for _, name, deadline, _ in logged:
                    deadlines.retry(name, deadline, now_ms)
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                log.info("deleted %d board(s) whose deadline passed: %s", len(logged),
                         ", ".join(record[1] for record in logged[:10]))
        return len(due)


def _write_json_atomically(path: Path, data: Any) -> None:
    from rankd.engine.snapshot import fsync_directory

    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as handle:
        json.dump(data, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fsync_directory(path.parent)
