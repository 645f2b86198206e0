"""The checker's properties, each decided from a :class:`~history.History`
and what the cluster's log holds, each returning counts (0: it holds).

Writes are ``delta: 1`` events with distinct ids, so a member's score is
the number of its events applied.  A *probe member* is written by one
sequential client only (its n-th write has ``Operation.number == n`` and
is retried with the same event id until it resolves), so a read of a
probe member's score ``v`` means exactly "its writes 1..v".

Times are the harness's monotonic clock: a read or live message shows a
state that existed at some moment between its invocation and its
completion.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping

from history import History, LiveMessage, Operation, Read

#: (board, member)
Key = tuple[str, str]


def lost_and_doubled(history: History, logged: Mapping[str, int],
                     orphaned: Collection[str]) -> dict:
    """Acknowledged events (by the clients or the checker's resubmissions)
    the final log lacks (``lost``; those not set aside
    by any node: ``lost_not_set_aside``), events it holds more than once
    (``doubled``), events nobody submitted (``strangers``), and the widest
    span of the invocation times of the lost events one primary term of a
    board acknowledged (``lost_window_s``: what a failover under ``--ack
    local`` may lose is at most the unshipped window).  A term is the group
    epoch the acknowledgement named: two primaries of one board killed a
    few seconds apart are two windows, not one span across both."""
    acknowledged: dict[str, Operation] = {}
    for op in (*history.operations, *history.resubmissions):
        if op.outcome == "ok":
            acknowledged.setdefault(op.event_id, op)
    lost = [acknowledged[e] for e in acknowledged if logged.get(e, 0) == 0]
    submitted = {op.event_id for op in history.operations}
    times: dict[tuple[str, int | None], list[float]] = defaultdict(list)
    for op in lost:
        # When sent: an answer a paused primary gave just before SIGSTOP
        # leaves after SIGCONT, and its completion spans the pause.
        times[op.board, op.epoch].append(op.invoked)
    return {
        "lost": len(lost),
        "lost_not_set_aside": sum(op.event_id not in orphaned for op in lost),
        "lost_window_s": round(max((max(t) - min(t) for t in times.values()), default=0.0), 3),
        "doubled": sum(count > 1 for count in logged.values()),
        "strangers": sum(e not in submitted for e in logged),
    }


def refused_but_applied(history: History, logged_before: Collection[str],
                        orphaned: Collection[str]) -> dict:
    """Events answered with a definite refusal that were applied anyway: in
    the log before the checker resubmitted anything (``refused_in_log``), or
    set aside by a node, for ``rankd cluster resubmit`` to apply later
    (``refused_set_aside``).  An event some other attempt of may have
    applied (one answered as applied, not as a duplicate, or one whose
    outcome is unknown) is excused: only an event whose every attempt was
    refused or answered as a duplicate proves a refusal false."""
    refused = {op.event_id for op in history.operations if op.outcome == "fail"}
    may_have_applied = {op.event_id for op in history.operations
                        if op.applied_here or op.outcome == "unknown"}
    suspects = refused - may_have_applied
    in_log = {e for e in suspects if e in logged_before}
    set_aside = {e for e in suspects if e in orphaned}
    examples = sorted({f"{op.event_id}: {op.detail} on node {op.node}"
                       for op in history.operations
                       if op.outcome == "fail" and op.event_id in in_log | set_aside})
    return {"refused_but_applied": len(in_log | set_aside), "refused_in_log": len(in_log),
            "refused_set_aside": len(set_aside), "refused_examples": examples[:5]}


def _applied_at(history: History) -> dict[Key, dict[int, float]]:
    """Probe writes: (board, member) -> {n: invocation of the attempt that
    applied write n (answered ok, not as a duplicate)}."""
    found: dict[Key, dict[int, float]] = defaultdict(dict)
    for op in (*history.operations, *history.resubmissions):
        if op.number is not None and op.applied_here:
            found[(op.board, op.member)][op.number] = op.invoked
    return found


def dirty_reads(history: History, committed: Mapping[Key, int]) -> dict:
    """Reads (``dirty_reads``) and live messages (``dirty_live``) showing a
    write that never committed on its own: a member's score above the
    number of its events in the log before the checker resubmitted
    anything (``committed``); or a probe member's score ``v`` seen before
    the attempt that applied write ``v`` was even sent (what was seen was
    an earlier application that the log never took)."""
    applied_at = _applied_at(history)

    def dirty(board: str, member: str, score: float, seen: float) -> bool:
        value = round(score)
        if value > committed.get((board, member), 0):
            return True
        return applied_at.get((board, member), {}).get(value, float("-inf")) > seen

    reads = sum(1 for r in history.reads if r.status == 200 and r.score is not None
                and dirty(r.board, r.member, r.score, r.completed))
    live = sum(1 for m in history.live
               if any(dirty(m.board, member, score, m.received) for member, score in m.top))
    return {"dirty_reads": reads, "dirty_live": live}


def _going_back(reads: list[Read]) -> int:
    """Of one node's reads of one board: how many, invoked after another
    completed, show less than it did (a smaller score, or no board)."""
    done = sorted(reads, key=lambda r: r.completed)
    best: dict[str, float] = {}
    board_seen = False
    position = 0
    back = 0
    for read in sorted(reads, key=lambda r: r.invoked):
        while position < len(done) and done[position].completed < read.invoked:
            earlier = done[position]
            if earlier.score is not None:
                board_seen = True
                best[earlier.member] = max(best.get(earlier.member, 0.0), earlier.score)
            position += 1
        if read.board_missing:
            back += board_seen
        elif read.score is not None and read.score < best.get(read.member, 0.0):
            back += 1
    return back


def _live_going_back(messages: Iterable[LiveMessage]) -> int:
    """Of one node's live messages of one board, in order: how many show a
    member lower than an earlier one did, or drop it from the top."""
    best: dict[str, float] = {}
    back = 0
    for message in sorted(messages, key=lambda m: m.received):
        shown = dict(message.top)
        back += any(shown.get(member, float("-inf")) < score for member, score in best.items())
        for member, score in shown.items():
            best[member] = max(best.get(member, score), score)
    return back


def reads_going_back(history: History) -> dict:
    """On one node (one incarnation of it: a restart starts afresh), reads
    invoked after an earlier one completed that show less than it
    (``reads_going_back``), and live messages showing less than an earlier
    one (``live_going_back``).  The live top must hold every member (its
    limit above the members' count)."""
    reads: dict[tuple, list[Read]] = defaultdict(list)
    for read in history.reads:
        reads[(read.node, read.incarnation, read.board)].append(read)
    live: dict[tuple, list[LiveMessage]] = defaultdict(list)
    for message in history.live:
        live[(message.node, message.incarnation, message.board)].append(message)
    return {"reads_going_back": sum(_going_back(r) for r in reads.values()),
            "live_going_back": sum(_live_going_back(m) for m in live.values())}


def version_conflicts(history: History) -> dict:
    """Board versions shown with two contents, on any nodes: two live tops
    of one ``(board, version)`` that differ, or a member shown with two
    scores at one ``(board, version)`` (by reads or live tops).  Counts
    the ``(board, version)`` pairs in conflict."""
    tops: dict[tuple[str, int], set] = defaultdict(set)
    scores: dict[tuple[str, int, str], set[float]] = defaultdict(set)
    for message in history.live:
        tops[(message.board, message.version)].add(message.top)
        for member, score in message.top:
            scores[(message.board, message.version, member)].add(score)
    for read in history.reads:
        if read.score is not None and read.version is not None:
            scores[(read.board, read.version, read.member)].add(read.score)
    conflicted = {key for key, seen in tops.items() if len(seen) > 1}
    conflicted |= {(board, version) for (board, version, _), seen in scores.items()
                   if len(seen) > 1}
    return {"version_conflicts": len(conflicted)}


def stale_reads(history: History) -> dict:
    """Probe reads invoked at ``t`` showing ``v`` when write ``v + 1`` had been
    acknowledged at ``a < t``: stale by ``t - a``.  Their count, the largest
    age, and both per node (``stale_by_node``: node -> [count, max age])."""
    acknowledged: dict[tuple[str, str, int], float] = {}
    for op in history.operations:
        if op.number is not None and op.outcome == "ok":
            key = (op.board, op.member, op.number)
            acknowledged[key] = min(acknowledged.get(key, op.completed), op.completed)
    by_node: dict[int, list] = {}
    for read in history.reads:
        if read.score is None:
            continue
        at = acknowledged.get((read.board, read.member, round(read.score) + 1))
        if at is not None and at < read.invoked:
            entry = by_node.setdefault(read.node, [0, 0.0])
            entry[0] += 1
            entry[1] = max(entry[1], round(read.invoked - at, 3))
    return {"stale_reads": sum(c for c, _ in by_node.values()),
            "stale_max_s": max((age for _, age in by_node.values()), default=0.0),
            "stale_by_node": by_node}


_TOOK = re.compile(r"node (\S+) took group (\d+) at epoch (\d+)")
_HANDED = re.compile(r"handed group (\d+) to node (\S+) at position \d+ \(epoch (\d+)\)")


def takeovers(logs: Iterable[str]) -> list[tuple[str, int, int]]:
    """``(node, group, epoch)`` of every group a node took without a
    hand-over (a failover), from the nodes' logs: a move gives the register
    to its target at one epoch (``handed group``) and the target takes it at
    the next, and a group's first take, at epoch 1, creates it."""
    took: list[tuple[str, int, int]] = []
    handed: set[tuple[str, int, int]] = set()
    for text in logs:
        took += [(node, int(group), int(epoch)) for node, group, epoch in _TOOK.findall(text)]
        handed |= {(node, int(group), int(epoch))
                   for group, node, epoch in _HANDED.findall(text)}
    return [(node, group, epoch) for node, group, epoch in took
            if epoch > 1 and (node, group, epoch - 1) not in handed]
