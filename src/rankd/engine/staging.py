"""Boards built off to the side, a step at a time, and swapped in at once.

A store of any size (RESP's ``ZUNIONSTORE`` and the other store commands)
replaces its destination without holding the event loop and without ever
showing half of it.  The front-end opens a :class:`Staging` with
``Engine.stage(name, config)``, awaits :meth:`Staging.begin`, hands it the
new members a chunk at a time (:meth:`Staging.add`, other clients served in
between), and ends with :meth:`Staging.commit`, or :meth:`Staging.close`
without committing to abandon it.

Each chunk is applied to a board nobody sees (``BoardState.staged``, by name)
and logged as one record at the next log position; the commit is one more
record, which swaps the built board in place of any board of that name (its
members, windows, deadline) in O(1).  Replay (and a cluster's followers,
which read the same records from the group's log) applies the same records
the same way, so chunks without their commit change nothing visible: after
a crash the destination is the old board, or the new one whole.

===========  ===============================================================
kind         items after the kind
===========  ===============================================================
STORE_PART   board, store, config, members, scores, ts_ms: members of the
             board being built (``store``: the position of its first
             record), each at this record's position as arrival sequence
STORE_DONE   board, store, config, parts, ts_ms: the board built from the
             ``parts`` STORE_PART records of ``store`` replaces board
             ``board`` (made empty if ``parts`` is 0)
STORE_DROP   board, store, ts_ms: that building is abandoned
===========  ===============================================================

One board is built into a name at a time (a second store into it waits);
a STORE_PART of another ``store`` replaces a building left without its
end (a cluster primary that stopped mid-way).  A snapshot holds the parts
of the buildings under way at its position (``("store_part", position,
record)`` sections, the record encoded), so a commit after it finds them.  Staged boards have
the ``all`` window only (every RESP-made board).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import repeat
from typing import TYPE_CHECKING, Any

from rankd._tasks import outcome_seen
from rankd.engine import records
from rankd.engine.board import Board
from rankd.engine.config import BoardConfig, check_board_name
from rankd.engine.errors import InvalidInput, Unavailable
from rankd.engine.groups import group_of

if TYPE_CHECKING:
    from rankd.engine.host import WriteHost
    from rankd.engine.replication import GroupWriter

log = logging.getLogger(__name__)

STORE_PART, STORE_DONE, STORE_DROP = records.STORE_PART, records.STORE_DONE, records.STORE_DROP
KINDS = (STORE_PART, STORE_DONE, STORE_DROP)
#: The snapshot section of a staged part.
SECTION = "store_part"


@dataclass(slots=True)
class Staged:
    """A board being built: its records so far (for snapshots)."""

    store: int
    board: Board
    parts: list[tuple[int, bytes]] = field(default_factory=list)


def apply(staged: dict[str, Staged], lsn: int, record: Any) -> Board | None:
    """Apply a staging record at position ``lsn`` to the buildings under
    way (live and in replay); for a STORE_DONE, the board to swap in (its
    version the commit's position)."""
    kind, name, store = record[0], record[1], record[2]
    building = staged.get(name)
    if kind == STORE_PART:
        _, _, _, config, members, scores, _ = record
        if building is None or building.store != store:
            building = staged[name] = Staged(store, _new_board(name, config))
        building.board.index_for_write("all", "all").set_states(
            zip(members, scores, repeat(lsn)))
        # Encoded: a large store's parts are few objects to keep, and to free.
        building.parts.append((lsn, records.encode(list(record))))
        return None
    if kind == STORE_DROP:
        if building is not None and building.store == store:
            del staged[name]
        return None
    _, _, _, config, parts, ts_ms = record
    if parts == 0:
        board = _new_board(name, config)
    elif building is None or building.store != store or len(building.parts) != parts:
        raise RuntimeError(f"position {lsn} of the log ends a store into board {name!r} "
                           f"whose {parts} parts (from position {store}) it does not hold")
    else:
        board = staged.pop(name).board
    board.version = lsn
    board.updated_at = ts_ms / 1000
    return board


def _new_board(name: str, config: Any) -> Board:
    return Board(name, BoardConfig.from_dict(dict(config)))


def parts_of(staged: dict[str, Staged], group: int | None = None) -> list[tuple[int, bytes]]:
    """The parts of the buildings under way (of one cluster group's boards,
    if given), ``(position, encoded record)``: take them at a snapshot's position,
    before any await, so they are exactly the parts logged up to it."""
    return [part for name, building in list(staged.items())
            if group is None or group_of(name) == group for part in building.parts]


def section(part: tuple[int, bytes]) -> bytes:
    """A part as a snapshot section (encoded)."""
    return records.encode([SECTION, part[0], part[1]])


def drop_group(staged: dict[str, Staged], group: int) -> None:
    """Forget the buildings of a cluster group's boards (its log is
    replayed anew, or its snapshot loaded)."""
    for name in [name for name in staged if group_of(name) == group]:
        del staged[name]


class Staging:
    """One board built off to the side and swapped in (module docstring)."""

    def __init__(self, engine: WriteHost, name: str, config: object) -> None:
        check_board_name(name)
        parsed = BoardConfig.from_dict(config)
        if parsed.windows != ("all",):
            raise InvalidInput("a board built in steps has the all window only")
        self.engine = engine
        self.name = name
        self.config = parsed.to_dict()
        #: The position of its first record (0: none logged yet).
        self.store = 0
        self.parts = 0
        self.members = 0
        self._writer: GroupWriter | None = None
        self._turn: asyncio.Future[None] | None = None
        self._done = False

    async def begin(self) -> None:
        """Wait for this board's turn (one building per name), and on a
        cluster node until this node writes its group (``NotPrimary``...
        if another does)."""
        engine = self.engine
        while (earlier := engine.staging_turns.get(self.name)) is not None:
            await asyncio.shield(earlier)
        self._turn = engine.staging_turns[self.name] = (
            asyncio.get_running_loop().create_future())
        if engine.replication is not None:
            await engine.route(self.name)
            self._writer = await engine.writer_of(group_of(self.name))
        else:
            engine.check_writable()

    def _position(self) -> int:
        """The next log position, once sure this building may go on there."""
        engine = self.engine
        engine.check_writable()
        if self._writer is None:
            return engine.wal.last_lsn + 1
        if engine.replication.writer(self._writer.group) is not self._writer:
            raise Unavailable(f"this node stopped writing board {self.name!r}'s group "
                              "while storing into it; nothing was stored: try again")
        return self._writer.next_seq

    def _log(self, record: list, boards: set[str], events: int) -> asyncio.Future:
        """Apply ``record`` at the next position and log it; the future is
        done once it is durable (by the fsync policy, or the ack mode)."""
        engine = self.engine
        position = self._position()
        if not self.store:
            self.store = record[2] = position
        engine.apply_record(position, record)
        payload = records.encode(record)
        if self._writer is not None:
            return engine.replicate(self._writer, [payload], boards)
        return engine.commit_soon([payload], boards, events)

    def add(self, entries: Iterable[tuple[str, float]]) -> None:
        """Add ``(member, score)`` pairs (valid members, finite scores: a
        chunk small enough to apply in one step) to the board being built."""
        members, scores = [], []
        for member, score in entries:
            members.append(member)
            scores.append(score)
        if not members:
            return
        self._log([STORE_PART, self.name, self.store, self.config, members, scores,
                   self.engine.now_ms()], set(), len(members)).add_done_callback(
            outcome_seen)  # (the commit's outcome tells)
        self.parts += 1
        self.members += len(members)

    async def commit(self, current: Callable[[], bool],
                     before: Callable[[], None] | None = None) -> int | None:
        """Swap the built board in, unless ``current()`` (called right
        before, in the same step) is false: then None, nothing swapped (the
        building stays, to :meth:`close`).  ``before`` is called in that
        step too, before the swap.  Returns how many members the board holds
        once durable."""
        engine = self.engine
        # (Not waiting for a hold of the board it replaces, which is left as
        # it is, and passes to the new one: a store holding its inputs may
        # wait for this one's.)
        if self._writer is not None and (
                await engine.writer_of(self._writer.group) is not self._writer):
            raise Unavailable(f"this node stopped writing board {self.name!r}'s group "
                              "while storing into it; nothing was stored: try again")
        # Nothing is awaited from here until the board is swapped in.
        if not current():
            return None
        if before is not None:
            before()
        done = self._log([STORE_DONE, self.name, self.store, self.config, self.parts,
                          engine.now_ms()], {self.name}, 1)
        self._done = True
        await asyncio.shield(done)
        return self.members

    def reset(self) -> None:
        """Abandon what was built, unless committed (logged, so followers
        forget it too, if the log may still be written), to build anew."""
        engine = self.engine
        building = engine.staged.get(self.name)
        if not self._done and building is not None and building.store == self.store:
            with contextlib.suppress(Exception):  # (read-only, deposed: replay drops it)
                self._log([STORE_DROP, self.name, self.store, engine.now_ms()], set(),
                          0).add_done_callback(outcome_seen)
            engine.staged.pop(self.name, None)
        self.store = self.parts = self.members = 0

    def close(self) -> None:
        """:meth:`reset`, and let the next store into this name go on."""
        self.reset()
        self._done = True
        engine = self.engine
        if self._turn is not None and engine.staging_turns.get(self.name) is self._turn:
            del engine.staging_turns[self.name]
            self._turn.set_result(None)

