"""What a transaction and a board built in steps need of the engine.

:class:`rankd.engine.transaction.Transaction` and
:class:`rankd.engine.staging.Staging` apply records and commit them as the
engine's own writes do, in steps a front-end drives; :class:`WriteHost`
names exactly what they use (``rankd.engine.changes.BoardChanges`` is the
one implementation), so neither imports the engine's rooms, nor the rooms
them for their types.

May not touch: anything; it is only a protocol.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from rankd.engine.board import Board
from rankd.engine.ingest import Ingested
from rankd.engine.replication import GroupWriter, Replication
from rankd.engine.settings import EngineConfig
from rankd.engine.settling import ReadGates
from rankd.engine.wal import WriteAheadLog


class WriteHost(Protocol):
    """The write path as a transaction or a staged store sees it."""

    boards: dict[str, Board]
    #: Boards whose writes wait for a snapshot.
    held: set[str]
    #: Boards being built in steps, and whose turn each name is
    #: (``rankd.engine.staging``).
    staged: dict[str, Any]
    staging_turns: dict[str, asyncio.Future[None]]
    replication: Replication | None
    read_gates: ReadGates
    wal: WriteAheadLog
    config: EngineConfig
    clock: Callable[[], float]

    def now_ms(self) -> int: ...

    def check_writable(self) -> None:
        """``ReadOnly`` unless the engine may write now."""

    def fail(self, exc: BaseException) -> None:
        """Refuse writes from now on (a bug met mid-write)."""

    def apply_record(self, lsn: int, record: Any) -> None:
        """Apply a board change or removal at position ``lsn``."""

    def purge_now(self, names: Iterable[object], first: int) -> list[bytes]:
        """Delete the boards of ``names`` past their deadline, from ``first`` on."""

    def count(self, done: Ingested) -> None:
        """Count a batch's outcomes."""

    def commit_soon(self, payloads: list[bytes], boards: set[str],
                    events: int | None = None) -> asyncio.Future[None]:
        """Append applied records to the local log; done once durable."""

    def replicate(self, writer: GroupWriter, payloads: list[bytes],
                  boards: set[str]) -> asyncio.Future:
        """Send applied records to their group's log and the local log."""

    async def writer_of(self, group: int) -> GroupWriter:
        """This node's writer of ``group``, once it may write it."""

    async def route(self, name: object) -> None:
        """``NotPrimary`` if another node writes board ``name``'s group."""

    def resolve(self, name: str, window: str | None, period: str | None, *,
                reading: bool = True) -> tuple[Board, str, str, Any]:
        """``(board, window, period, index)`` of a window of a board."""

    def live_board(self, name: str) -> Board | None:
        """Board ``name``, unless there is none or its deadline passed."""
