"""Answers in any order: a TCP connection's submits answered as each
board group commits (protocol/PROTOCOL.md, "Answer order").

Owns what a connection that asked for it in its hello (``out_of_order``)
does differently from one that did not: runs of plain submits handed to
the engine are answered as each is committed, not in request order, and
on a cluster node a run spanning several board groups is cut into one run
per group, each handed over on its own.  A connection that did not ask
is answered exactly as before, in order.

Why: a cluster node commits each group on its own (its own log append),
so a run over many groups is done only once its slowest group is, and an
in-order connection holds every later answer behind the slowest group of
every earlier run.  One client connection pipelining the writes of many
callers over many boards then went at the pace of the slowest group of
each batch (bench/README.md, "Cluster scale benchmark").

Design: the cut is made from the run's own request bytes (each
submission's ``source``), framed again and split by the native scanner
into one packed run per group, so each part is exactly what the fast path
would have read had those requests come alone; the parts keep the order of
their requests within each group, and the engine applies each group's runs
in the order they are handed over.  Only runs the engine takes (a group
this node writes, boards that take unsigned submissions) are handed over;
the other parts go the general way, request by request, behind the runs in
flight (the connection's worker waits for them first), as before.  The
parts count against ``MAX_RUNS_IN_FLIGHT`` like any run: those that find
no room wait at the head of the queue, as runs, and go over as the runs in
flight are answered (so a run of more groups than the bound goes over in
turns, never stalls).  Nothing else changes order: every request that is
not a plain submit still waits for the runs before it to be answered.  A
run's answers are written by the native lane's completion
(``_lanes.Lane._applied``) when it is the only run in flight, as on any
connection; with ``any_order`` set, one committed while others are in
flight is written at once by :meth:`AnyOrder._applied_any_order` instead
of waiting its turn.

May not touch: the engine's order of writes (it keeps it), the general
path's requests, a connection that did not ask.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from rankd.engine.errors import EngineError
from rankd.engine.groups import group_of
from rankd.frontends.connections import PipelinedConnection

_LENGTH = struct.Struct(">I")

#: ``rankd.frontends._submits.split``: bytes into frames and packed runs.
Splitter = Callable[[bytes, int, bool], tuple[list[Any], int, int]]


def runs_by_group(packed: Any, max_frame: int, split: Splitter) -> list[Any] | None:
    """``packed``'s submissions as one packed run per board group, in the
    order each group first appears (each group's submissions in their
    order); None when they are all of one group (or a part does not scan
    as one run, which a run's own requests always do)."""
    names = packed.board_names()
    groups: dict[str, int] = {name: group_of(name) for name in names}
    if len(set(groups.values())) < 2:
        return None
    parts: dict[int, list[bytes]] = {}
    for index, source in enumerate(packed.sources()):
        chunks = parts.setdefault(groups[packed.submission(index).board], [])
        chunks.append(_LENGTH.pack(len(source)))
        chunks.append(source)
    runs = []
    for chunks in parts.values():
        data = b"".join(chunks)
        items, position, bad_length = split(data, max_frame, True)
        if len(items) != 1 or type(items[0]) is tuple or position != len(data) \
                or bad_length >= 0:
            return None
        runs.append(items[0])
    return runs


class AnyOrder:
    """The part of a TCP connection that answers in any order (mixed into
    ``TcpConnection``; see the module docstring).  It reads the
    connection's ``answering`` and ``service``."""

    answering: Any
    service: Any

    any_order = False

    def _answer_in_any_order(self) -> None:
        """From now on, write each handed-over run's answers once it is
        committed (the native lane's ``_applied`` reads ``any_order``)."""
        self.out_of_order = self.any_order = True

    def _applied(self, entry: list[Any], error: BaseException | None) -> None:
        """``PipelinedConnection._applied``, or in any order (where the
        native lane is not built: it decides so itself)."""
        if self.any_order:
            self._applied_any_order(entry, error)
        else:
            PipelinedConnection._applied(self, entry, error)  # type: ignore[arg-type]

    def _applied_any_order(self, entry: list[Any], error: BaseException | None) -> None:
        """``PipelinedConnection._applied`` without the order: this run's
        answers are written now, whatever is still in flight before it."""
        answering = self.answering
        try:
            answering.remove(entry)
        except ValueError:  # the connection was released meanwhile
            return
        # At the head, the in-order writer answers it (and only it: every
        # run done before it was answered and removed at once).
        answering.appendleft(entry)
        PipelinedConnection._applied(self, entry, error)  # type: ignore[arg-type]

    def _hand_over_by_group(self, packed: Any, max_frame: int, split: Splitter,
                            charge: Callable[[int], None] | None,
                            room: int) -> tuple[list[Any], list[Any]] | None:
        """Hand over each group's part of ``packed`` the engine takes, at
        most ``room`` of them (what the connection's bound on runs in
        flight leaves), charged to ``charge`` as one run.  Returns the parts
        it does not take (for the general way) and the parts taken but not
        handed over for want of room (to wait their turn, as runs, at the
        head of the queue).  None, with nothing handed over, when the run
        is of one group or the caller may not submit that much now."""
        runs = runs_by_group(packed, max_frame, split)
        if runs is None:
            return None
        takes = self.service.takes_packed
        taken, rest = [], []
        for run in runs:
            (taken if takes(run) else rest).append(run)
        if not taken:
            return None
        # Never past the bound, however many groups the run spans; a run of
        # more groups than that goes over as room comes back.
        room = max(room, 0)
        now, later = taken[:room], taken[room:]
        if charge is not None and now:
            try:
                charge(sum(len(run) for run in now))  # (the later ones: when taken)
            except EngineError:
                return None  # each submit is admitted (or refused) alone
        for run in now:
            self._hand_over(run)  # type: ignore[attr-defined]
        return rest, later
