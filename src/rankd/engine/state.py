"""The boards, and how a logged record changes them.

Owns the board table (``boards``, by name) and what is kept beside it: the
boards' deadlines (:class:`rankd.engine.expiry.Deadlines`), the holds that
make a board's writers wait (a snapshot copying it, a store reading it),
the boards being built in steps (:mod:`rankd.engine.staging`) and a
cluster node's place in each group's log (``positions``).  Every change to
a board other than a submission's (which :mod:`rankd.engine.ingest` applies)
goes through :meth:`BoardState.apply_record`, live and in replay alike, and
a snapshot's sections through :meth:`BoardState.load`.

May not touch: the log, commits, the cluster, front-ends.  It neither
writes nor waits: the write path logs what it applied here, and recovery
replays into it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from rankd.engine import records, settings, staging
from rankd.engine.board import Board
from rankd.engine.config import BoardConfig
from rankd.engine.expiry import Deadlines
from rankd.engine.sections import index_dump, index_head
from rankd.engine.snapshot import LargeSection, SnapshotSections

#: Names of dropped boards kept for :meth:`BoardState.dropped_since`.
MAX_DROPS_KEPT = 10_000


class BoardState:
    """Every board, by name, and what goes with them (module docstring)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        #: Every board, by name: replaced whole with :meth:`replace`.
        self.boards: dict[str, Board] = {}
        #: Boards dropped (deleted, or gone in a :meth:`replace`), counted,
        #: and the count at each name's last drop: a board made and dropped
        #: between two looks leaves no other trace (Redis's ``WATCH``).
        #: At most ``MAX_DROPS_KEPT`` names; ``drops_forgotten`` is the count
        #: when the names were last let go.
        self.drops = 0
        self.dropped: dict[str, int] = {}
        self.drops_forgotten = 0
        #: Objects holding the table too (the intake, the plain reads): a
        #: ``boards`` attribute :meth:`replace` keeps current.
        self.mirrors: list[Any] = []
        #: Boards' deadlines (see rankd.engine.expiry); the native paths
        #: hold its set of boards about to expire, and leave those alone.
        self.deadlines = Deadlines()
        #: Set when a deadline is set, for the expiry task to look again.
        self.deadline_set = asyncio.Event()
        #: Boards whose writes wait for a store (``Board.writable`` clear).
        self.held: set[str] = set()
        #: How many holds each held board has (a snapshot's, a store's), by name.
        self.holds: dict[str, int] = {}
        #: Boards being built in steps, by name, and the building whose turn
        #: it is for each name (see rankd.engine.staging).
        self.staged: dict[str, staging.Staged] = {}
        self.staging_turns: dict[str, asyncio.Future[None]] = {}
        #: A cluster node's place in each group's log: group -> (seq, epoch)
        #: of the last record it applied.
        self.positions: dict[int, tuple[int, int]] = {}
        #: A cluster node's groups loaded from a snapshot walked under writes
        #: (``Snapshotter.group_snapshot``): group -> the position up to which
        #: its state may show records; until its log is applied that far, an
        #: older record applied again shows an older state than the snapshot did.
        self.walked: dict[int, int] = {}

    def replace(self, boards: dict[str, Board]) -> None:
        """Put ``boards`` in place of the table (a roll-back, a fresh start)."""
        for name in self.boards:
            if name not in boards:
                self._dropped(name)
        self.boards = boards
        for mirror in self.mirrors:
            mirror.boards = boards

    def now_ms(self) -> int:
        """The clock, in ms since the epoch."""
        return round(self.clock() * 1000)

    # --- records --------------------------------------------------------------------

    def apply_record(self, lsn: int, record: Any) -> None:
        """Apply a board change or a removal (live, and in replay)."""
        boards = self.boards
        kind = record[0]
        if kind == records.BOARD_PUT:
            _, name, config, ts_ms = record
            config = BoardConfig.from_dict(dict(config))
            board = boards.get(name)
            if board is None:
                board = boards[name] = Board(name, config)
                # Versions continue from the log position, so a board deleted
                # and created again never repeats a version readers cached.
                board.version = lsn - 1
            else:
                board.reconfigure(config)
            board.version += 1
            board.updated_at = ts_ms / 1000
        elif kind == records.BOARD_DROP:
            self.forget(record[1])
        elif kind == records.EXPIRED:
            # Only the deadline it names: a board made again meanwhile stays.
            board = boards.get(record[1])
            if board is not None and board.expires_at == record[2]:
                self.forget(record[1])
        elif kind == records.EXPIRE:
            _, name, deadline, ts_ms = record
            board = boards.get(name)
            if board is None:
                return
            self.set_deadline(board, deadline)
            board.version += 1
            board.updated_at = ts_ms / 1000
        elif kind == records.REMOVE:
            _, name, member, ts_ms = record
            board = boards.get(name)
            if board is None:
                return
            for periods in board.periods.values():
                for index in periods.values():
                    index.remove(member)
            board.labels.pop(member, None)
            board.version += 1
            board.updated_at = ts_ms / 1000
        elif kind in staging.KINDS:
            built = staging.apply(self.staged, lsn, record)
            if built is not None:  # the store's end: the built board in place of the old
                self.forget(record[1])
                boards[record[1]] = built
                if record[1] in self.held:  # (a snapshot copies the old one: it waits too)
                    built.writable.clear()
        else:
            raise RuntimeError(f"unknown WAL record kind {kind!r} at position {lsn}")

    def load(self, sections: Iterable[bytes]) -> None:
        """Apply a snapshot's sections (a local one, or a group's), in one pass."""
        from rankd.index import kinds

        index_class = kinds.current()  # (either kind reads the other's dumps)
        boards = self.boards
        if isinstance(sections, SnapshotSections):  # (big index sections read in pieces)
            sections = sections.stream(settings.SNAPSHOT_INDEX_BYTES)
        for payload in sections:
            if isinstance(payload, LargeSection):
                if self._load_index_pieces(payload, index_class):
                    continue
                payload = payload.read()
            in_place = index_dump(payload)  # (an index's dump is read where it is)
            if in_place is not None:
                name, window, period, dump = in_place
                boards[name].load_index(window, period, index_class, dump)
                continue
            section = records.decode(payload)
            kind = section[0]
            if kind == "board":
                _, name, config, version, updated_at = section
                self.forget(name)
                board = boards[name] = Board(name, BoardConfig.from_dict(dict(config)))
                board.version, board.updated_at = version, updated_at
            elif kind == "expiry":
                self.set_deadline(boards[section[1]], section[2])
            elif kind == "index":
                _, name, window, period, dump = section
                boards[name].load_index(window, period, index_class, dump)
            elif kind == "label_columns":
                boards[section[1]].labels.update(zip(section[2], section[3], strict=True))
            elif kind == staging.SECTION:
                self.apply_record(section[1], records.decode(section[2]))
            elif kind == "walked":
                _, group, covers = section
                self.walked[group] = max(covers, self.walked.get(group, 0))
            elif kind == "positions":
                self.positions = {group: (seq, epoch) for group, (seq, epoch)
                                  in section[1].items()}
            elif kind == "event_id_store":
                boards[section[1]].dedupe.load_store(section[2])
            elif kind == "event_id_log":  # ids and packed entries until 2026-11-29
                boards[section[1]].dedupe.load_log(section[2])
            elif kind == "event_id_columns":  # written as columns until 2026-11-24
                boards[section[1]].dedupe.load_packed(section[2], section[3])
            elif kind == "labels":  # written as maps until 2026-11
                boards[section[1]].labels.update(section[2])
            elif kind == "event_ids":  # likewise
                entries = section[2]
                boards[section[1]].dedupe.load_packed(tuple(entries), tuple(entries.values()))
            elif kind == "dedupe":  # written before event ids were stored packed
                boards[section[1]].dedupe.load(section[2])
            else:
                raise RuntimeError(f"unknown snapshot section {kind!r} (written by a newer "
                                   "rankd?)")

    def _load_index_pieces(self, section: LargeSection, index_class: type) -> bool:
        """Load an ``index`` section from its file in pieces (``load_chunks``:
        the restart holds a piece of the dump, never all of it); False, with
        nothing read for good, if ``section`` is of another kind."""
        pieces = section.pieces(settings.SNAPSHOT_INDEX_BYTES)
        first = [next(pieces)]
        head = index_head(first[0], section.size)
        if head is None:
            return False
        name, window, period, start = head

        def dump() -> Iterator[bytes | memoryview]:
            yield memoryview(first.pop())[start:]  # (not kept once read)
            yield from pieces

        self.boards[name].load_index(window, period, index_class, dump(),
                                     section.size - start, chunks=True)
        return True

    # --- deadlines (see rankd.engine.expiry) ------------------------------------------

    def set_deadline(self, board: Board, deadline: int | None) -> None:
        before, board.expires_at = board.expires_at, deadline
        self.deadlines.set(board.name, deadline, before, self.now_ms())
        if deadline is not None:
            self.deadline_set.set()

    def forget(self, name: str) -> None:
        """Drop board ``name`` (and its deadline) from the table."""
        board = self.boards.pop(name, None)
        if board is not None:
            self.deadlines.forget(name, board.expires_at)
            self._dropped(name)

    def _dropped(self, name: str) -> None:
        self.drops += 1
        self.dropped[name] = self.drops
        if len(self.dropped) > MAX_DROPS_KEPT:
            self.dropped.clear()
            self.drops_forgotten = self.drops

    def dropped_since(self, name: str, drops: int) -> bool:
        """Whether board ``name`` may have been dropped since :attr:`drops`
        was ``drops`` (True also once the names kept were let go since)."""
        return drops < self.drops_forgotten or self.dropped.get(name, 0) > drops

    def deadline_of(self, name: str) -> int | None:
        board = self.boards.get(name)
        return None if board is None else board.expires_at

    def expired(self, board: Board) -> bool:
        """Whether ``board``'s deadline passed: it is shown nowhere."""
        return board.expires_at is not None and board.expires_at <= self.now_ms()

    def live_board(self, name: str) -> Board | None:
        """Board ``name``, unless there is none or its deadline passed."""
        board = self.boards.get(name)
        if board is None or (board.expires_at is not None and self.expired(board)):
            return None
        return board

    def live_names(self) -> list[str]:
        """The names of the boards shown (not past their deadline), sorted."""
        if not self.deadlines.live:
            return sorted(self.boards)
        now_ms = self.now_ms()
        return sorted(name for name, board in self.boards.items()
                      if board.expires_at is None or board.expires_at > now_ms)

    def purge_now(self, names: Iterable[object], first: int) -> list[bytes]:
        """Delete the boards of ``names`` whose deadline passed, at log
        positions from ``first`` on, before a write to them (which then
        finds them gone, as Redis finds an expired key): their records,
        encoded, to log before the write's."""
        if not self.deadlines.live:
            return []
        now_ms = self.now_ms()
        logged: list[bytes] = []
        for name in {name for name in names if type(name) is str}:
            board = self.boards.get(name)
            if board is None or board.expires_at is None or board.expires_at > now_ms:
                continue
            record = [records.EXPIRED, name, board.expires_at, now_ms]
            self.apply_record(first + len(logged), record)
            logged.append(records.encode(record))
        return logged

    # --- holds -----------------------------------------------------------------------

    def hold(self, board: Board) -> None:
        """Make ``board``'s writers wait (a store is reading its inputs)
        until every hold is released.  A board swapped in
        for it meanwhile (a store's) is held with it."""
        board.writable.clear()
        self.held.add(board.name)
        self.holds[board.name] = self.holds.get(board.name, 0) + 1

    def release(self, board: Board) -> None:
        """Release one hold of ``board`` (see :meth:`hold`)."""
        left = self.holds.pop(board.name, 1) - 1
        if left:
            self.holds[board.name] = left
            return
        board.writable.set()
        current = self.boards.get(board.name)
        if current is not None:
            current.writable.set()
        self.held.discard(board.name)
