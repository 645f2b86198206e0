"""Pipelined pops: a run of ``ZPOPMIN``/``ZPOPMAX`` on one board applied as
one removal, one commit.

A pop picks what it removes from the board as it is when the command runs,
so it cannot wait, as a ``ZADD`` does, to be applied with the writes
pipelined after it; awaiting each pop's commit before the next cost a turn
of the event loop per pop, and each pop's own work (its command looked up
and admitted, views of the board made, a removal planned, applied and
logged) as much again.  So, on a single node:

* a pop is applied as soon as it runs (``Engine.remove_members_now``: the
  choice and the removal in one step, as ever), and its handler returns an
  :class:`~.sorted_sets.Applied`: its reply, known already, and the future
  of its commit.  The connection awaits the commits only where it would
  await a batch of writes (``RespConnection._flush``): before a read or any
  other command that is not batched, and before writing the replies out.
  The batched writes before a pop are applied before it runs.
* the worker hands a run of consecutive pops on one board, each well
  formed, that the native path (:mod:`.pop_lane`) did not take to
  :func:`answer_run`, which plans them in order (each pops from
  what the ones before it left: the lowest from one end, the highest from
  the other), admits each as it would be alone (where a rate limit applies
  the run ends before the first pop it refuses, which is then refused by
  itself), removes what they pick as one removal, one commit, and answers
  each as its command would.

Either way the pops of a pipeline are applied in order, each seeing the
commands before it; they are logged as the removals they are (replayed,
shipped as ever); they are acknowledged, as any write, only once durable,
and a commit that fails answers each of them the error instead; listeners
(blocked ``BZPOP*`` clients, the live feed) hear of the board once it is
committed, and every removal bumps its version (``WATCH``).  Where a pop
would have to wait to be applied (a cluster node, which writes through its
group's log; a board held by a snapshot), inside ``MULTI`` (its commands are
queued, and ``EXEC``'s writes go to its transaction), or before the
connection is authenticated, pops go one at a time as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rankd.engine.errors import EngineError, NotFound
from rankd.frontends.resp.arguments import CommandError, positive
from rankd.frontends.resp.context import error_text
from rankd.frontends.resp.sorted_sets import (
    MAX_PAIRS,
    Applied,
    Writes,
    _entries,
    _persists,
    _view,
    board_name,
    work_cost,
)
from rankd.watchdog import ACTIVITY

if TYPE_CHECKING:
    from rankd.frontends.resp.context import Context

#: Commands one run may hold: the worker's batch (``QUEUE_LOW_WATER``).
MAX_RUN = 512
_HIGHEST = {b"zpopmin": False, b"ZPOPMIN": False, b"zpopmax": True, b"ZPOPMAX": True}


def highest(words: list[bytes]) -> bool | None:
    """Whether ``words`` is a ZPOPMAX (True) or ZPOPMIN (False) a run may
    take: key, at most a count (None: any other command)."""
    if not 2 <= len(words) <= 3:
        return None
    side = _HIGHEST.get(words[0])
    if side is None and len(words[0]) == 7:  # (no lowercase copy of other names)
        side = _HIGHEST.get(words[0].lower())
    return side


def _count(words: list[bytes]) -> int | None:
    """A pop's count (None: none given); ``CommandError`` as the command answers."""
    return positive(words[2]) if len(words) == 3 else None


def answer_run(conn: Context, first: list[bytes], out: list[bytes],
               pending: list[tuple[int, Writes | Applied]]) -> int:
    """Answer the pop ``first`` (the worker's, taken from its queue) and the
    pops on the same board right behind it in the queue, as one removal:
    their replies into ``out`` (pending their commit); how many it answered,
    ``first`` included (the caller takes the others from the queue).  0,
    with nothing done, where they go one at a time (see the module
    docstring).  ``pending`` must hold no write not applied yet."""
    if conn.principal is None or conn.multi is not None or (conn.deadline and conn.expired):
        return 0
    name = board_name(first[1])
    if name is None or not conn.service.engine.removes_now(name):
        return 0
    view = _view(conn, first[1])
    if view is None:
        return 0
    try:
        run = [(highest(first), _count(first))]
    except CommandError:
        return 0  # answered by the command itself
    queue = conn.queue
    key = first[1]
    size = len(view)
    taken = 0  # members the run pops so far (it stops at MAX_PAIRS)
    while len(run) < MAX_RUN and len(run) < len(queue) + 1:
        words = queue[len(run) - 1]
        if type(words) is not list or words[1:2] != [key] or (side := highest(words)) is None:
            break
        try:
            count = _count(words)
        except CommandError:
            break
        run.append((side, count))
    # Each pop's share, in order: what it asks for of what the ones before
    # left.  Where a limit applies, each is charged its request as it would
    # be alone, and the run ends before the first refused (which is refused
    # by itself) or charged for its work too (charged so by itself).
    charge = conn._charger("remove_member")
    plan: list[tuple[bool, int | None, int]] = []
    for side, count in run:
        wanted = min(1 if count is None else count, size - taken)
        if taken + wanted > MAX_PAIRS:
            break  # (a pop past the bound is refused by itself)
        if charge is not None:
            if work_cost(wanted) > 1:
                break
            try:
                charge(1)
            except EngineError:
                break
        plan.append((side, count, wanted))
        taken += wanted
    if not plan:
        return 0
    ACTIVITY.frontend = "resp"  # who holds the loop, for the loop watchdog
    ACTIVITY.command = "zpopmax" if plan[0][0] else "zpopmin"

    def choose(view: Any) -> list[str]:
        # Each end read once: the pops from it take what it holds in turn.
        ends = {side: iter([m for _, m, _ in view.by_position(
            0, sum(wanted for s, _, wanted in plan if s is side), reverse=side)])
            for side in (False, True)}
        return [next(ends[side]) for side, _, wanted in plan for _ in range(wanted)]

    try:
        now = conn.service.remove_members_now(name, choose, window=conn.window,
                                              period=conn.period,
                                              persist_when_empty=_persists(conn, name))
    except NotFound:  # (not after _view found it: nothing awaited since)
        now = [], None
    except EngineError as exc:  # e.g. read-only: every pop gets the error
        _count_stats(conn, plan, exc.code)
        out.append(conn.replies.error(error_text(exc)) * len(plan))
        return len(plan)
    assert now is not None, "removes_now said it would apply now"
    popped, committed = now
    replies = []
    position = 0
    for _, count, wanted in plan:
        entries = [(0, member, value) for member, value in popped[position:position + wanted]]
        position += wanted
        replies.append(_entries(conn, entries, True, nested=count is not None))
    reply = b"".join(replies)
    _count_stats(conn, plan, "ok")
    if committed is not None:
        pending.append((len(out), Applied(reply, committed, len(plan))))
    out.append(reply)
    return len(plan)


def _count_stats(conn: Context, plan: list[tuple[bool, int | None, int]], outcome: str
                 ) -> None:
    stats = conn.server.stats
    maxes = sum(1 for side, _, _ in plan if side)
    if maxes:
        stats[("zpopmax", outcome)] += maxes
    if len(plan) - maxes:
        stats[("zpopmin", outcome)] += len(plan) - maxes

