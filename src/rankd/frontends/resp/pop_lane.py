"""Pipelined pops on the native path: a run of ``ZPOPMIN``/``ZPOPMAX`` the
scanner packed (``_pops.PackedPops``) applied, logged and answered without
Python work per pop.

The worker hands each packed run to :func:`answer` where it would have run
its pops (after the writes batched before them are applied: each pop sees
every command before it).  For each stretch of the run on one board,
:func:`._pops.remove_run` picks, removes and answers the pops in order
(each from what the ones before left) and writes their ``REMOVE`` records;
here they are appended to the log as one commit, the board's version is
bumped once per member removed (``WATCH``), and the replies wait in
``pending`` for that commit like any write's (``RespConnection._flush``):
acknowledged once durable, each answered the error if it fails.  Listeners
(blocked ``BZPOP*`` clients, the live feed) hear of the board with the
commit.  Admission is the general path's: a pop the caller's rate limit
refuses, or charges for more than its request, and a pop that would take
a stretch past :data:`~.sorted_sets.MAX_PAIRS` members, are left to it.
A run that removed that many members already waits for the worker's next
batch (it lets the loop run others between batches), the rest of it first
in the queue.

What the native path does not take goes the general way (:mod:`.pop_runs`,
then each pop by itself), from the first pop it leaves on: a board with a
deadline or labels, or missing; another window (``RANKD.WINDOW``); a
cluster node or a board a snapshot holds (``Engine.removes_now``); an
index not native; a monitor attached.
"""

from __future__ import annotations

from typing import Any

from rankd._native import native_or
from rankd.engine.errors import EngineError
from rankd.engine.periods import period_of
from rankd.frontends.resp.context import Applied, Context, Writes, error_text
from rankd.frontends.resp.limits import ENTRIES_PER_REQUEST, MAX_PAIRS
from rankd.frontends.resp.protocol import RequestReader
from rankd.watchdog import ACTIVITY

PackedPops, _ = native_or("rankd.frontends.resp._pops", "PackedPops", None)
_remove_run, _ = native_or("rankd.frontends.resp._pops", "remove_run", None)
_RankIndex, _ = native_or("rankd._skiplist", "RankIndex", None)
_PagedIndex, _ = native_or("rankd._pages", "RankIndex", None)
#: Pops the general path is given back at once, as commands (a batch's worth).
UNPACKED_AT_ONCE = 512


def answer(conn: Context, pops: Any, out: list[bytes],
           pending: list[tuple[int, Writes | Applied]]) -> list[list[bytes]]:
    """Answer the pops of ``pops`` natively, in order, as far as the native
    path takes them: their replies into ``out`` (pending their commit in
    ``pending``, which must hold no write not applied yet).  Returns what
    is left for the worker's queue: the pops left, as commands, for the
    general path, or ``pops`` itself, to go on with in its next batch."""
    first = pops.answered
    removed = 0
    if (conn.principal is not None and conn.multi is None and conn.window is None
            and conn.period is None and not conn.server.monitors
            and not (conn.deadline and conn.expired)):
        try:
            while first < len(pops):
                if removed >= MAX_PAIRS:
                    pops.answered = first
                    return [pops]
                stopped, members = _board_run(conn, pops, first, out, pending)
                if stopped == first:
                    break
                first = stopped
                removed += members
        except EngineError as exc:  # e.g. read-only: every pop left gets the error
            _count(conn, pops, first, len(pops), exc.code)
            out.append(conn.replies.error(error_text(exc)) * (len(pops) - first))
            return []
    # The rest as commands, a batch's worth at a time (unpacking thousands
    # at once held the loop): what is beyond goes on as ``pops``.
    end = min(len(pops), first + UNPACKED_AT_ONCE)
    reader = RequestReader(max_bulk=conn.server.max_bulk)
    rest: list[Any] = [words for i in range(first, end) for words in reader.feed(pops.source(i))]
    if end < len(pops):
        pops.answered = end
        rest.append(pops)
    return rest


def _board_run(conn: Context, pops: Any, first: int, out: list[bytes],
               pending: list[tuple[int, Writes | Applied]]) -> tuple[int, int]:
    """Apply the pops on one board from ``first`` on: where they stopped,
    and how many members they removed."""
    engine = conn.service.engine
    name = pops.board(first)
    board = engine.boards.get(name)
    if (board is None or board.expires_at is not None or board.labels
            or not engine.removes_now(name)):
        return first, 0
    window = board.config.primary_window
    index = board.index(window, period_of(window, engine.clock()))
    indexes = [each for periods in board.periods.values() for each in periods.values()]
    # Either native kind (rankd.index.kinds), the same for all the board's indexes.
    kind = type(index)
    if (kind is not _RankIndex and kind is not _PagedIndex) or any(
            type(each) is not kind for each in indexes):
        return first, 0
    engine.check_writable()
    ACTIVITY.frontend = "resp"  # who holds the loop, for the loop watchdog
    ACTIVITY.command = "zpopmax" if pops.highest(first) else "zpopmin"
    now_ms = engine.now_ms()
    stopped, reply, payloads, maxes = _remove_run(
        pops, first, pops.board_end(first), index, indexes, board.config.order == "asc",
        now_ms, conn.replies.version, MAX_PAIRS, ENTRIES_PER_REQUEST,
        conn._charger("remove_member"))
    if stopped == first:
        return first, 0
    if payloads:
        board.version += len(payloads)  # (one per member removed, as each REMOVE does)
        board.updated_at = now_ms / 1000
        pending.append((len(out), Applied(reply, engine.commit_soon(payloads, {name}),
                                          stopped - first)))
    out.append(reply)
    stats = conn.server.stats
    if maxes:
        stats[("zpopmax", "ok")] += maxes
    if stopped - first - maxes:
        stats[("zpopmin", "ok")] += stopped - first - maxes
    return stopped, len(payloads)


def _count(conn: Context, pops: Any, first: int, end: int, outcome: str) -> None:
    """Count pops ``first`` to ``end`` under their commands' series."""
    for i in range(first, end):
        conn.server.stats[("zpopmax" if pops.highest(i) else "zpopmin", outcome)] += 1
