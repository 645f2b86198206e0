"""The planner with real nodes (rankd.cluster.capacity, rankd.cluster.drift):
a node whose local log fails (every write under its data dir ENOSPC, by
the fault shim) is given no group and emptied; a node short of disk (its
data dir on a tiny tmpfs) is given no group; the primaries of a cluster
where one node took every write are spread without a command; a board
with ``replicas: all`` is held by every node, a joining one included."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cluster_nodes import boards_in_distinct_groups, node, sql
from jepsen import wait_ready

from daemon import Daemon
from faultshim import build_shim
from rankd.cluster.groups import group_of


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> float:
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.1)
    return time.monotonic() - started


def placements(dsn: str) -> dict[int, tuple[str, list[str]]]:
    return {r["group_id"]: (r["primary_node"], list(r["followers"]))
            for r in sql(dsn, "SELECT group_id, primary_node, followers FROM rankd_placement")}


def follows(daemon: Daemon) -> dict[str, int]:
    status, body = daemon.request("GET", "/v1/cluster")
    assert status == 200, body
    return body["this_node"]["follows"]


def write(daemon: Daemon, board: str, event: str) -> None:
    status, body = daemon.request("POST", f"/v1/boards/{board}/scores",
                                  {"member": "a", "delta": 1, "event_id": event})
    assert status == 200, body


def create(daemon: Daemon, boards: list[str]) -> None:
    """Make each of ``boards`` on ``daemon`` with one event: ``daemon`` leads its group."""
    for board in boards:
        assert daemon.request("PUT", f"/v1/boards/{board}", {"policy": "sum"})[0] == 201
        write(daemon, board, "e0")


@contextlib.contextmanager
def started(daemons: list[Daemon]) -> Iterator[list[Daemon]]:
    try:
        for daemon in daemons:
            if daemon.process is None:
                daemon.start()
                wait_ready(daemon)
        yield daemons
    except BaseException:
        for daemon in daemons:
            print(f"--- {daemon.data_dir.name} ---\n{daemon.log()[-5000:]}")
        raise
    finally:
        for daemon in daemons:
            if daemon.process is not None and daemon.process.poll() is None:
                daemon.stop(timeout=20)


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> Path:
    return build_shim(tmp_path_factory.mktemp("shim"))


def test_a_node_whose_log_fails_is_given_no_group_and_emptied(
        tmp_path: Path, pg_dsn: str, shim: Path) -> None:
    args = ("--replicas", "1", "--auto-rebalance", "0")
    daemons = [node(tmp_path, pg_dsn, f"n{i}", *args) for i in range(3)]
    trigger = tmp_path / "n2-disk-full"
    full = daemons[2]
    full.env.update(LD_PRELOAD=str(shim), RANKD_FAULT_TRIGGER=str(trigger),
                    RANKD_FAULT_WRITE_FAIL=f"{os.path.realpath(full.data_dir)}/:{errno.ENOSPC}")
    first_boards = boards_in_distinct_groups("early", 6, 300)
    taken = {group_of(b) for b in first_boards}
    led_boards = [b for b in boards_in_distinct_groups("led", 8, 300)
                  if group_of(b) not in taken][:2]
    taken |= {group_of(b) for b in led_boards}
    later_boards = [b for b in boards_in_distinct_groups("late", 12, 300)
                    if group_of(b) not in taken][:6]
    with started(daemons) as (n0, n1, n2):
        # n0 names followers among the nodes whose heartbeats it has read: all
        # three, a placement round or two after the last one joined.
        wait_until(lambda: len(sql(pg_dsn, "SELECT node_id FROM rankd_nodes")) == 3, 15,
                   "a node never joined")
        time.sleep(3)
        create(n0, first_boards)
        create(n2, led_boards)  # n2 leads these
        # The followers went to the least loaded nodes: n2 follows some groups.
        wait_until(lambda: len(placements(pg_dsn)) == len(taken), 15, "placed")
        assert {placements(pg_dsn)[group_of(b)][0] for b in led_boards} == {"n2"}
        on_n2 = [g for g, (_, f) in placements(pg_dsn).items() if "n2" in f]
        assert on_n2, placements(pg_dsn)
        wait_until(lambda: all(str(g) in follows(n2) for g in on_n2), 15, "n2 follows")

        trigger.touch()  # n2's disk is full: its next applied record fails its log
        for board in first_boards:
            write(n0, board, "e1")
        wait_until(lambda: sql(pg_dsn, "SELECT planning FROM rankd_nodes WHERE node_id = "
                                       "'n2'")[0]["planning"].find('"log_failed": true') >= 0,
                   20, "n2 never reported its log failed")
        # The planner moves n2's primaries away and replaces its copies (it
        # cannot log them)...
        wait_until(lambda: all("n2" not in f and p != "n2"
                               for p, f in placements(pg_dsn).values()), 20,
                   "n2 still named a holder of a group")
        for board in led_boards:  # (written where they went)
            write(n0, board, "e1")
        # ...and a new group's first primary names no follower there either:
        # n2 holds the least, so it would be the one chosen otherwise.
        create(n1, later_boards)
        wait_until(lambda: len(placements(pg_dsn)) == len(taken) + len(later_boards),
                   15, "the later groups were never placed")
        for _ in range(20):  # (several planner rounds)
            assert all("n2" not in f and p != "n2"
                       for p, f in placements(pg_dsn).values()), placements(pg_dsn)
            time.sleep(0.2)
        shown = subprocess.run(
            [sys.executable, "-m", "rankd.cli", "cluster", "status", "--url", n0.url],
            capture_output=True, text=True, timeout=60, check=True).stdout
        assert "local log FAILED" in shown, shown
        # An operator's move there is refused, changing nothing.
        group = group_of(first_boards[0])
        status, body = n0.request("POST", "/v1/cluster/moves", {"group": group, "node": "n2"})
        assert status == 422 and "local log fails" in body["error"]["message"], body
        assert not sql(pg_dsn, "SELECT 1 FROM rankd_moves")
        # Every write is still there, read anywhere.
        for board in first_boards + led_boards:
            wait_until(lambda b=board: n1.request("GET", f"/v1/boards/{b}/members/a")[1]
                       .get("score") == 2, 10, f"{board} lost a write")
    trigger.unlink(missing_ok=True)


def mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, check=False)
    return done.returncode == 0


def test_a_node_short_of_disk_is_given_no_group(tmp_path: Path, pg_dsn: str) -> None:
    """n2's data dir is a 48 MiB tmpfs, under ``--min-free-disk`` 64 MiB: it
    takes writes (its log works) but the planner gives it nothing, even when
    another node dies and R must be restored."""
    if not mount_tmpfs(tmp_path / "n2", "48m"):
        pytest.skip("cannot mount a tmpfs here (not root)")
    try:
        args = ("--replicas", "1", "--auto-rebalance", "0", "--min-free-disk", str(64 << 20))
        daemons = [node(tmp_path, pg_dsn, f"n{i}", *args) for i in range(3)]
        boards = boards_in_distinct_groups("tiny", 6, 300)
        with started(daemons) as (n0, n1, n2):
            create(n0, boards)
            wait_until(lambda: len(placements(pg_dsn)) == len(boards), 15, "placed")
            assert all(f == ["n1"] for _, f in placements(pg_dsn).values()), \
                placements(pg_dsn)
            # n1 dies: the planner restores no follower on n2 (R stays short).
            n1.stop(timeout=20)
            time.sleep(8)
            assert all("n2" not in f for _, f in placements(pg_dsn).values()), \
                placements(pg_dsn)
            assert not follows(n2)
            # A rebalance asked for moves nothing to n2 either.
            assert n0.request("POST", "/v1/cluster/rebalance", {})[0] == 202
            time.sleep(3)
            assert all(p == "n0" for p, _ in placements(pg_dsn).values()), placements(pg_dsn)
    finally:
        subprocess.run(["umount", "-l", str(tmp_path / "n2")], check=False)


def metric(daemon: Daemon, name: str) -> float:
    with urllib.request.urlopen(daemon.url + "/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"no {name} in /metrics")


def primaries(dsn: str, groups: set[int]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for g, (p, _) in placements(dsn).items():
        if g in groups:
            counts[p] = counts.get(p, 0) + 1
    return counts


def test_one_node_taking_every_write_is_rebalanced_without_a_command(
        tmp_path: Path, pg_dsn: str) -> None:
    """Every write goes to n0, which so leads every group: with
    ``--auto-rebalance 2`` the planner spreads the primaries by itself,
    well before the 30 s after which a change of live nodes would."""
    boards = boards_in_distinct_groups("drift", 6, 300)
    groups = {group_of(b) for b in boards}
    daemons = [node(tmp_path, pg_dsn, f"n{i}", "--replicas", "1", "--auto-rebalance", "2")
               for i in range(3)]
    with started(daemons) as (n0, _, _):
        create(n0, boards)
        wait_until(lambda: primaries(pg_dsn, groups) == {"n0": 6}, 15, "n0 leads all")
        took = wait_until(lambda: primaries(pg_dsn, groups) == {"n0": 2, "n1": 2, "n2": 2},
                          25, "the primaries were never spread")
        assert "rebalancing (--auto-rebalance)" in "".join(d.log() for d in daemons)
        assert sum(metric(d, "rankd_cluster_drift_rebalances_total") for d in daemons) >= 1
        for board in boards:  # every write still there, and writable where it went
            write(n0, board, "e1")
            wait_until(lambda b=board: n0.request("GET", f"/v1/boards/{b}/members/a")[1]
                       .get("score") == 2, 10, f"{board} lost a write")
        time.sleep(4)  # balanced now: nothing moves again
        assert primaries(pg_dsn, groups) == {"n0": 2, "n1": 2, "n2": 2}
        print(f"spread without a command {took:.1f} s after n0 led every group")


def test_auto_rebalance_0_moves_nothing_by_itself(tmp_path: Path, pg_dsn: str) -> None:
    boards = boards_in_distinct_groups("still", 6, 300)
    groups = {group_of(b) for b in boards}
    daemons = [node(tmp_path, pg_dsn, f"n{i}", "--replicas", "1", "--auto-rebalance", "0")
               for i in range(2)]
    with started(daemons) as (n0, _):
        create(n0, boards)
        time.sleep(8)
        assert primaries(pg_dsn, groups) == {"n0": 6}


def test_a_board_with_replicas_all_is_held_by_every_node(tmp_path: Path, pg_dsn: str) -> None:
    """On three nodes with ``--replicas 1``, a ``replicas: all`` board's
    group is followed by both other nodes; a fourth that joins gets it too,
    while an ordinary board keeps one follower."""
    hot, cold = boards_in_distinct_groups("hot", 2, 300)
    hot_group = group_of(hot)
    args = ("--replicas", "1", "--auto-rebalance", "0")
    daemons = [node(tmp_path, pg_dsn, f"n{i}", *args) for i in range(4)]
    with started(daemons[:3]) as (n0, n1, n2):
        status, body = n0.request("PUT", f"/v1/boards/{hot}",
                                  {"policy": "sum", "replicas": "all"})
        assert status == 201 and body["config"]["replicas"] == "all", body
        status, body = n0.request("PUT", f"/v1/boards/{cold}", {"policy": "sum"})
        assert status == 201 and "replicas" not in body["config"], body
        assert n0.request("PUT", "/v1/boards/bad", {"replicas": 2})[0] == 422
        write(n0, hot, "e0")
        write(n0, cold, "e0")

        def held_by(names: set[str]) -> bool:
            placed = placements(pg_dsn).get(hot_group)
            return placed is not None and {placed[0], *placed[1]} == names

        wait_until(lambda: held_by({"n0", "n1", "n2"}), 15, "the hot group is not on all 3")
        wait_until(lambda: str(hot_group) in follows(n1) and str(hot_group) in follows(n2),
                   15, "a node does not follow the hot group")
        # The cold group is placed by a planner round of its own, maybe later.
        wait_until(lambda: group_of(cold) in placements(pg_dsn), 15, "the cold group unplaced")
        assert len(placements(pg_dsn)[group_of(cold)][1]) == 1
        shown = subprocess.run(
            [sys.executable, "-m", "rankd.cli", "cluster", "status", "--url", n1.url],
            capture_output=True, text=True, timeout=60, check=True).stdout
        assert f"replicas all (on every node): groups {hot_group}" in shown, shown
        # A move leaves --replicas followers for a round: the node left out
        # keeps its copy (nothing to load again) and is placed back.
        left_out = n2 if placements(pg_dsn)[hot_group][0] != "n2" else n1
        target = next(d for d in (n1, n2) if d is not left_out)
        status, body = n0.request("POST", "/v1/cluster/moves",
                                  {"group": hot_group, "node": target.data_dir.name})
        assert status == 202, body
        wait_until(lambda: placements(pg_dsn)[hot_group][0] == target.data_dir.name, 20,
                   "the hot group never moved")
        wait_until(lambda: held_by({"n0", "n1", "n2"}), 15, "the hot group is not on all 3")
        assert f"no longer holds group {hot_group}" not in left_out.log()
        assert str(hot_group) in follows(left_out)

        n3 = daemons[3]
        with started([n3]):
            given = wait_until(lambda: held_by({"n0", "n1", "n2", "n3"}), 20,
                               "the joining node was not given the hot group")
            loaded = wait_until(lambda: str(hot_group) in follows(n3), 20,
                                "the joining node does not follow the hot group")
            print(f"replicas all: a joining node was placed {given:.1f} s after it was "
                  f"ready and followed the group {loaded:.1f} s later")
            write(n0, hot, "e1")
            wait_until(lambda: n3.request("GET", f"/v1/boards/{hot}/members/a")[1]
                       .get("score") == 2, 10, "the joining node's copy is not current")
            assert str(hot_group) in follows(n3)  # served from its own copy
            assert len(placements(pg_dsn)[group_of(cold)][1]) == 1
