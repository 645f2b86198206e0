"""Which groups a node holds: only those it writes (never for a write that
cannot apply), given up once idle; and one process per node id."""

from __future__ import annotations

import time
from pathlib import Path

from cluster_nodes import boards_in_distinct_groups, node, nodes, sql, wait_ready

from rankd.client import Client, NotFound
from rankd.cluster.groups import group_of


def held_groups(dsn: str) -> list[int]:
    return [row["group_id"] for row in sql(
        dsn, "SELECT group_id FROM rankd_groups WHERE holder IS NOT NULL "
             "AND lease_until > now() ORDER BY group_id")]


def commits_per_second(dsn: str, seconds: float = 3.0) -> float:
    """Transactions Postgres committed per second in the database, over
    ``seconds`` (its statistics, flushed by each backend about every second)."""
    query = "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
    before = sql(dsn, query)[0]["xact_commit"]
    time.sleep(seconds)
    return (sql(dsn, query)[0]["xact_commit"] - before) / seconds


def test_writes_to_missing_boards_take_no_group(tmp_path: Path, pg_dsn: str) -> None:
    with nodes(tmp_path, pg_dsn, 1) as (only,):
        for n in range(48):
            status, body = only.request("POST", f"/v1/boards/missing-{n}/scores",
                                        {"member": "a", "delta": 1})
            assert status == 404 and body["error"]["code"] == "not_found", body
        with Client("127.0.0.1", only.tcp_port) as client:
            for n in range(48, 96):
                try:
                    client.submit(f"missing-{n}", "a", delta=1)
                except NotFound:
                    pass
                else:
                    raise AssertionError("a write to a missing board was applied")
            answer = client.submit_many([{"board": f"missing-{n}", "member": "a", "delta": 1}
                                         for n in range(96, 128)])
            assert all(r["error"]["code"] == "not_found" for r in answer["results"]), answer
        assert held_groups(pg_dsn) == []
        # A board that exists takes its group as before.
        assert only.request("PUT", "/v1/boards/there", {"policy": "sum"})[0] == 201
        assert only.request("POST", "/v1/boards/there/scores", {"member": "a", "delta": 1}
                            )[0] == 200
        assert held_groups(pg_dsn) == [group_of("there")]


def test_an_idle_group_is_released_and_postgres_commits_fall_back(tmp_path: Path,
                                                                   pg_dsn: str) -> None:
    boards = boards_in_distinct_groups("idle", 24)
    groups = {group_of(board) for board in boards}
    with nodes(tmp_path, pg_dsn, 2, "--group-idle-seconds", "3") as (first, second):
        for board in boards:
            assert first.request("PUT", f"/v1/boards/{board}", {"policy": "sum"})[0] == 201
            status, body = first.request("POST", f"/v1/boards/{board}/scores",
                                         {"member": "a", "delta": 1, "event_id": "e1"})
            assert status == 200, body
        assert sorted(held_groups(pg_dsn)) == sorted(groups)
        busy = commits_per_second(pg_dsn, 2.0)  # 24 leases renewed every 0.5 s
        deadline = time.monotonic() + 15
        while held_groups(pg_dsn):
            assert time.monotonic() < deadline, held_groups(pg_dsn)
            time.sleep(0.2)
        assert "gives up group" in first.log()
        time.sleep(1.5)  # the statistics of the last renewals are flushed
        idle = commits_per_second(pg_dsn, 3.0)
        assert idle < busy / 2, (busy, idle)
        assert held_groups(pg_dsn) == []  # nobody took them back meanwhile
        # Nothing acknowledged was lost: the other node takes the groups on
        # the next writes, with every earlier write.
        for board in boards:
            status, body = second.request("POST", f"/v1/boards/{board}/scores",
                                          {"member": "a", "delta": 1, "event_id": "e2"})
            assert status == 200 and body["score"] == 2.0, body
        assert {row["holder"] for row in sql(
            pg_dsn, "SELECT holder FROM rankd_groups WHERE lease_until > now()")} == {"n1"}


def test_a_second_process_with_the_same_node_id_is_refused(tmp_path: Path,
                                                           pg_dsn: str) -> None:
    with nodes(tmp_path, pg_dsn, 1) as (first,):
        (tmp_path / "twin").mkdir()
        twin = node(tmp_path / "twin", pg_dsn, "n0")  # the same --node-id, another data dir
        try:
            twin.start()
        except RuntimeError:
            pass
        else:
            twin.stop()
            raise AssertionError("a second process with node id n0 started")
        lines = [line for line in twin.log().splitlines() if line.strip()]
        assert "Traceback" not in twin.log(), twin.log()
        assert "'n0'" in lines[-1] and "--node-id" in lines[-1], lines[-1]
        assert first.request("GET", "/v1/ready")[0] == 200
    # Once the first one stopped, the id is free again.
    again = node(tmp_path, pg_dsn, "n0")
    again.start()
    try:
        wait_ready(again)
    finally:
        again.stop()
