"""Replaying SUBMIT records: gather their index states, apply the rest.

Recovery replays a long run of SUBMIT records, most of them for one board.
It does not write the indexes record by record: it gathers each record's
absolute states ``(member, score, lsn)`` per ``(board, window, period)``
into ``pending`` packed runs (:mod:`rankd.index.packed`, one ``bytearray``
each), which the engine hands to ``RankIndex.set_states_packed`` in bulk;
labels, event ids and the board version are noted as live ingest notes
them (:func:`rankd.engine.ingest.note_submit`).

:func:`replay_submits` walks a run of one board's records from a batch of
``(lsn, payload)``.  It is the hot loop of recovery (a million records in a
few seconds), so it has a native implementation in
``rankd.engine._replay``, chosen at import like the frame scanner
(``RANKD_PURE_PYTHON=1`` forces :func:`replay_submits_python`).  The native
one reads payloads in the layout :mod:`rankd.engine.records` writes and
stops at the first record it does not recognise (another kind, another
board, an unexpected encoding), which the caller then decodes and replays
with :func:`gather_submit`; both leave exactly the same state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rankd._native import native_or
from rankd.engine import records
from rankd.engine.ingest import note_submit
from rankd.index.packed import pack_state

if TYPE_CHECKING:
    from rankd.engine.board import Board

#: ``(board, window, period) -> packed (member, score, lsn) states``
Pending = dict[tuple[str, str, str], bytearray]


def gather_submit(board: Board, lsn: int, record: Sequence[Any], dedupe_ttl: float,
                  pending: Pending) -> int:
    """Replay one decoded SUBMIT record of ``board``; return the states gathered."""
    member = record[2]
    windows = board.periods
    gathered = 0
    for window, period, score in record[9]:
        if window in windows:  # else removed by a later config change
            key = (board.name, window, period)
            states = pending.get(key)
            if states is None:
                states = pending[key] = bytearray()
            pack_state(states, member, score, lsn)
            gathered += 1
    note_submit(board, record, dedupe_ttl)
    return gathered


def replay_submits_python(board: Board, batch: Sequence[tuple[int, bytes]], start: int,
                          dedupe_ttl: float, pending: Pending) -> tuple[int, int]:
    """Replay the SUBMIT records of ``board`` from ``batch[start]`` on, up to
    the first record that is not one; return ``(stop, gathered)``: that
    record's position in ``batch`` (or its length) and the states gathered."""
    gathered = 0
    stop = start
    decode = records.decode
    while stop < len(batch):
        lsn, payload = batch[stop]
        record = decode(payload)
        if record[0] != records.SUBMIT or record[1] != board.name:
            break
        gathered += gather_submit(board, lsn, record, dedupe_ttl, pending)
        stop += 1
    return stop, gathered


replay_submits, IMPLEMENTATION = native_or("rankd.engine._replay", "replay_submits",
                                           replay_submits_python)
