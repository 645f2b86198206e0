"""The fault harness's checker properties (properties.py) on hand-made
histories: each property holds on a clean history and counts what a
history made to break it shows.  No cluster is needed."""

from __future__ import annotations

from collections import Counter

from history import History, LiveMessage, Operation, Read
from properties import (
    dirty_reads,
    lost_and_doubled,
    reads_going_back,
    refused_but_applied,
    stale_reads,
    takeovers,
    version_conflicts,
)


def op(event: str, outcome: str, invoked: float, completed: float, *, member: str = "p0",
       number: int | None = None, detail: str = "") -> Operation:
    return Operation(event, "b", member, 0, invoked, completed, outcome, detail, number)


def read(node: int, invoked: float, completed: float, score: float | None, *,
         status: int = 200, version: int | None = None, member: str = "p0",
         incarnation: int = 0) -> Read:
    return Read(node, incarnation, "b", member, invoked, completed, status, score, version)


def live(node: int, received: float, version: int, *top: tuple[str, float]) -> LiveMessage:
    return LiveMessage(node, 0, "b", received, version, tuple(top))


def probe_writes() -> list[Operation]:
    """p0's writes 1..3: the 2nd acknowledged after one unknown attempt."""
    return [op("p0-1", "ok", 0.0, 0.1, number=1),
            op("p0-2", "unknown", 1.0, 6.0, number=2),
            op("p0-2", "ok", 6.1, 6.2, number=2),
            op("p0-3", "ok", 7.0, 7.1, number=3)]


def test_lost_and_doubled() -> None:
    history = History([op("a", "ok", 0, 1), op("b", "ok", 0, 1), op("c", "ok", 3, 4),
                       op("d", "unknown", 0, 1)])
    clean = lost_and_doubled(history, Counter({"a": 1, "b": 1, "c": 1}), set())
    assert clean == {"lost": 0, "lost_not_set_aside": 0, "lost_window_s": 0.0, "doubled": 0,
                     "strangers": 0}
    broken = lost_and_doubled(history, Counter({"a": 2, "x": 1}), {"b"})
    assert broken == {"lost": 2, "lost_not_set_aside": 1, "lost_window_s": 3.0, "doubled": 1,
                      "strangers": 1}


def test_the_lost_window_spans_one_primary_term_of_a_board() -> None:
    """Two primaries of one board, each killed with 0.5 s unshipped, 4 s
    apart: two windows of 0.5 s, not one of 4.5 s; one term's 3 s is 3 s."""
    def acked(event: str, invoked: float, epoch: int | None) -> Operation:
        answer = op(event, "ok", invoked, invoked + 0.01)
        answer.epoch = epoch
        return answer

    two_terms = History([acked("a", 1.0, 3), acked("b", 1.5, 3), acked("c", 5.0, 4),
                         acked("d", 5.5, 4), acked("e", 6.0, 5)])
    assert lost_and_doubled(two_terms, Counter({"e": 1}), {"a", "b", "c", "d"}
                            )["lost_window_s"] == 0.5
    one_term = History([acked("a", 1.0, 3), acked("b", 4.0, 3), acked("c", 5.0, 4)])
    assert lost_and_doubled(one_term, Counter({"c": 1}), {"a", "b"})["lost_window_s"] == 3.0


def test_refused_but_applied() -> None:
    history = History([op("a", "fail", 0, 1), op("b", "fail", 0, 1), op("c", "fail", 0, 1),
                       op("d", "fail", 0, 1), op("d", "ok", 2, 3)])
    # d: refused, then applied by a later attempt that said so: excused.
    assert refused_but_applied(history, {"d"}, set())["refused_but_applied"] == 0
    # e: an attempt of unknown outcome may have applied it before the refusal.
    history.operations += [op("e", "unknown", 0, 5), op("e", "fail", 5, 6),
                           op("e", "ok", 7, 8, detail="duplicate")]
    assert refused_but_applied(history, {"d", "e"}, set())["refused_but_applied"] == 0
    broken = refused_but_applied(history, {"a", "d"}, {"b", "a"})
    assert broken == {"refused_but_applied": 2, "refused_in_log": 1, "refused_set_aside": 2,
                      "refused_examples": ["a:  on node 0", "b:  on node 0"]}
    # A later attempt answered "duplicate" does not excuse: the refused one applied it.
    history.operations[4].detail = "duplicate"
    assert refused_but_applied(history, {"d"}, set())["refused_but_applied"] == 1


def test_dirty_reads() -> None:
    history = History(probe_writes(),
                      reads=[read(0, 0.2, 0.3, 1.0), read(1, 6.3, 6.4, 2.0)],
                      live=[live(0, 7.2, 9, ("p0", 3.0), ("m1", 2.0))])
    committed = Counter({("b", "p0"): 3, ("b", "m1"): 2})
    assert dirty_reads(history, committed) == {"dirty_reads": 0, "dirty_live": 0}
    # Write 2 shown at 3.0, before the attempt that applied it (6.1) was sent:
    # the unknown attempt's application was seen, and the log never took it.
    history.reads.append(read(2, 2.0, 3.0, 2.0))
    # A score above what the log holds: a write that never committed.
    history.reads.append(read(0, 8.0, 8.1, 4.0))
    history.live.append(live(1, 8.0, 10, ("p0", 3.0), ("m1", 3.0)))
    assert dirty_reads(history, committed) == {"dirty_reads": 2, "dirty_live": 1}


def test_reads_going_back() -> None:
    history = History(reads=[read(0, 0.0, 0.1, 2.0), read(0, 0.2, 0.3, 3.0),
                             # overlapping the read of 3.0: may show less
                             read(0, 0.25, 0.5, 2.0),
                             # another node may be behind; another incarnation too
                             read(1, 1.0, 1.1, 1.0), read(0, 1.0, 1.1, 1.0, incarnation=1)],
                      live=[live(0, 1.0, 5, ("p0", 2.0)), live(0, 2.0, 6, ("p0", 3.0))])
    assert reads_going_back(history) == {"reads_going_back": 0, "live_going_back": 0}
    history.reads += [read(0, 1.0, 1.1, 2.0),  # after 3.0 completed
                      read(0, 1.2, 1.3, None, status=404),  # the board gone
                      read(1, 0.5, 0.6, None, status=404)]  # never seen on node 1: fine
    history.live += [live(0, 3.0, 7, ("p0", 2.0)), live(0, 4.0, 8, ("m1", 1.0))]
    assert reads_going_back(history) == {"reads_going_back": 2, "live_going_back": 2}


def test_version_conflicts() -> None:
    history = History(reads=[read(0, 0, 1, 2.0, version=5), read(1, 0, 1, 2.0, version=5),
                             read(0, 0, 1, 3.0, version=6)],
                      live=[live(0, 1.0, 5, ("p0", 2.0), ("m1", 1.0)),
                            live(1, 1.0, 5, ("p0", 2.0), ("m1", 1.0))])
    assert version_conflicts(history) == {"version_conflicts": 0}
    history.reads.append(read(2, 0, 1, 4.0, version=6))  # version 6 with two scores
    history.live.append(live(2, 1.0, 5, ("p0", 2.0), ("m1", 2.0)))  # 5 with two tops
    history.live.append(live(2, 1.0, 7, ("p0", 9.0)))
    history.reads.append(read(2, 0, 1, 8.0, version=7))  # a read and a top disagree
    assert version_conflicts(history) == {"version_conflicts": 3}


def test_stale_reads() -> None:
    history = History(probe_writes(),
                      reads=[read(0, 0.05, 0.3, 0.0, status=404),  # before write 1's ack
                             read(1, 6.15, 6.3, 1.0),  # write 2 not yet acknowledged
                             read(2, 7.5, 7.6, 3.0)])
    assert stale_reads(history)["stale_reads"] == 0
    history.reads += [read(0, 2.0, 2.1, 0.0, status=404),  # write 1 acked at 0.1
                      read(1, 9.1, 9.2, 1.0),  # write 2 acked at 6.2
                      read(1, 7.2, 7.3, 2.0)]  # write 3 acked at 7.1
    figures = stale_reads(history)
    assert figures["stale_reads"] == 3
    assert figures["stale_max_s"] == 2.9
    assert figures["stale_by_node"] == {0: [1, 1.9], 1: [2, 2.9]}


def test_staleness_beyond_the_bound_breaks_the_promise_save_for_local_acks_in_an_outage():
    """A read staler than --max-follow-lag is a violation, except under
    --ack local for a write acknowledged while Postgres itself was out (in
    no follower's copy until shipped), by at most the outage's length."""
    from jepsen import MAX_STALE_SECONDS, violations

    clean = {name: 0 for name in (
        "lost", "doubled", "strangers", "refused_but_applied", "score_mismatches",
        "internal_errors", "unretrieved_exceptions", "dirty_reads", "dirty_live",
        "reads_going_back", "live_going_back", "version_conflicts")}
    clean |= {"converged": True, "acknowledged": 100}
    stale = MAX_STALE_SECONDS + 3
    assert violations(clean | {"stale_max_s": MAX_STALE_SECONDS}, "pause_postgres", "log") == []
    assert violations(clean | {"stale_max_s": stale, "outage_s": 4.0},
                      "pause_postgres", "log") == [f"stale_max_s = {stale}"]
    assert violations(clean | {"stale_max_s": stale, "outage_s": 4.0},
                      "pause_postgres", "local") == []
    assert violations(clean | {"stale_max_s": stale, "outage_s": 2.0},
                      "pause_postgres", "local") == [f"stale_max_s = {stale}"]
    assert violations(clean | {"stale_max_s": stale}, "restart_follower", "local") == [
        f"stale_max_s = {stale}"]


def test_takeovers_are_the_takes_no_move_handed_over() -> None:
    logs = [
        "node n0 took group 342 at epoch 1 (last position 0)\n"
        "node n0 handed group 342 to node n1 at position 2014 (epoch 2), writes refused\n",
        "node n1 took group 342 at epoch 3 (last position 2014)\n"  # the move's take
        "node n1 took group 906 at epoch 2 (last position 2059)\n",  # a failover
        "node n2 took group 342 at epoch 4 (last position 2100)\n",  # n1 lost it
    ]
    assert takeovers(logs) == [("n1", 906, 2), ("n2", 342, 4)]
    assert takeovers(logs[:1] + logs[1].splitlines(keepends=True)[:1]) == []
