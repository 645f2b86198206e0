"""Logged records applied again: recovery's replay, a follower's records.

Owns the index states gathered from SUBMIT records and not yet handed to
their indexes (:meth:`Replayer.flush`).  Runs of SUBMIT records go through
:mod:`rankd.engine.replay` (native ``_replay`` when built); every other
record through :meth:`rankd.engine.state.BoardState.apply_record`, as it
went live, as Redis replays its AOF through the normal command path.  A
cluster node's local log wraps each group's records (``REPLICATED``) with
their positions in the group's log; those are unwrapped here.

May not touch: the log (it is handed records, it reads none), commits,
snapshots, the cluster.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rankd.engine import records, settings, staging
from rankd.engine.core import Core
from rankd.engine.groups import group_of
from rankd.engine.replay import gather_submit, replay_submits
from rankd.engine.state import BoardState


class Replayer:
    """Replays logged records into one :class:`BoardState`."""

    def __init__(self, core: Core, state: BoardState) -> None:
        self.core = core
        self.state = state
        #: Replay: (board, window, period) -> states not yet in the index,
        #: packed (:mod:`rankd.index.packed`).
        self.replayed: dict[tuple[str, str, str], bytearray] = {}
        self.replayed_count = 0
        #: A GROUP_LOAD part logged in pieces: ``((group, seq, part), the
        #: pieces read so far)``, until its last piece.
        self.pieces: tuple[tuple[int, int, int], list[bytes]] | None = None

    def clear(self) -> None:
        """Forget the states gathered and pieces read (the state they were
        for is gone)."""
        self.replayed, self.replayed_count = {}, 0
        self.pieces = None

    def replay_local(self, batch: Sequence[tuple[int, bytes]]) -> None:
        """Replay records of the local log: as they are on a single node; a
        cluster node's unwrapped, each run of one group's records at their
        positions in its log (see :mod:`rankd.engine.replication`)."""
        if self.core.replication is None:
            self.replay_records(batch)
            return
        run: list[tuple[int, bytes]] = []
        run_group = None
        for lsn, payload in batch:
            record = records.decode(payload)
            kind = record[0]
            if kind == records.REPLICATED:
                _, group, first, epoch, payloads = record
                if group != run_group and run:
                    self.replay_records(run)
                    run = []
                run_group = group
                run.extend(enumerate(payloads, first))
                self.state.positions[group] = (first + len(payloads) - 1, epoch)
                continue
            if run:
                self.replay_records(run)
                run = []
            if kind == records.GROUP_RESET:
                run_group = None
                self.drop_group(record[1])
            elif kind == records.GROUP_LOAD:
                run_group = None
                self.load_group_part(record)
            else:
                raise RuntimeError(
                    f"{self.core.config.data_dir}: position {lsn} of the log holds a single "
                    "node's record; this data dir was not a cluster node's: start it "
                    "without --cluster-dsn, or the node with an empty data dir")
        if run:
            self.replay_records(run)

    def load_group_part(self, record: Sequence[Any]) -> None:
        _, group, seq, epoch, part, parts, section, *cut = record
        if cut:  # piece ``cut[0]`` of ``cut[1]`` of the part's section
            piece, pieces = cut
            pending, self.pieces = self.pieces, None
            if piece == 0:
                pending = ((group, seq, part), [])
            elif (pending is None or pending[0] != (group, seq, part)
                  or len(pending[1]) != piece):
                return  # the rest of pieces cut short (a crash): never loaded
            pending[1].append(section)
            if piece < pieces - 1:
                self.pieces = pending
                return
            section = b"".join(pending[1])
        if part == 0:
            self.drop_group(group)
        if section is not None:
            self.state.load([section])
        if part == parts - 1:
            self.state.positions[group] = (seq, epoch)

    def drop_group(self, group: int) -> set[str]:
        """Forget a group's boards and its position (replayed anew later)."""
        self.flush()
        state = self.state
        names = {name for name in state.boards if group_of(name) == group}
        for name in names:
            state.forget(name)
        staging.drop_group(state.staged, group)
        state.positions.pop(group, None)
        state.walked.pop(group, None)
        return names

    def replay_records(self, batch: Sequence[tuple[int, bytes]],
                       touched: set[str] | None = None) -> None:
        """Replay logged ``(lsn, payload)`` records in log order (noting
        the boards they change in ``touched``).

        Runs of SUBMIT records go through :mod:`rankd.engine.replay`, which
        gathers their index states; those reach the indexes before any
        other record of their board, and at the end (:meth:`flush`).  Every
        other record goes through ``BoardState.apply_record``, as it did live.
        """
        ttl = self.core.config.dedupe_ttl
        state = self.state
        replayed = self.replayed
        position = 0
        while position < len(batch):
            lsn, payload = batch[position]
            record = records.decode(payload)
            position += 1
            if record[0] in (records.REPLICATED, records.GROUP_RESET, records.GROUP_LOAD):
                raise RuntimeError(
                    f"{self.core.config.data_dir}: position {lsn} of the log holds a cluster "
                    "node's record: start this data dir with the --cluster-dsn it was a "
                    "node of")
            if record[0] == records.TX_SLOT:
                continue  # the TRANSACTION record at the end holds it
            if record[0] == records.TRANSACTION:  # its records, at their positions
                self.replay_records(list(enumerate(record[3], record[2])), touched)
                continue
            if touched is not None:
                touched.add(record[1])
            if record[0] != records.SUBMIT:
                if replayed:
                    self.flush(record[1])
                state.apply_record(lsn, record)
                continue
            board = state.boards.get(record[1])
            if board is None:  # a later record dropped the board
                continue
            gathered = gather_submit(board, lsn, record, ttl, replayed)
            position, more = replay_submits(board, batch, position, ttl, replayed)
            self.replayed_count += gathered + more
            if self.replayed_count >= settings.REPLAY_PENDING_STATES:
                self.flush()

    def flush(self, name: str | None = None) -> None:
        """Hand gathered replay states to their indexes (of one board, or all)."""
        replayed = self.replayed
        for key in [k for k in replayed if name is None or k[0] == name]:
            states = replayed.pop(key)
            index = self.state.boards[key[0]].index_for_write(key[1], key[2])
            self.replayed_count -= index.set_states_packed(states)
