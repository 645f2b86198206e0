"""The Python client routes by group on a cluster: ``moved`` answers name
the group, the node and the topology epoch; the client keeps them as its
map, sends the next requests of that group to its node directly, splits a
``submit_many`` by node up front and answers it in the events' order."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

from cluster_nodes import holder, nodes

from rankd.client import Client
from rankd.cluster.groups import group_of

BOARDS = [f"route-{n}" for n in range(24)]


def test_the_client_learns_the_map_and_goes_direct(tmp_path: Path, pg_dsn: str) -> None:
    with nodes(tmp_path, pg_dsn, 3) as daemons:
        # Each board's group is taken by the node its first write reached.
        for n, board in enumerate(BOARDS):
            writer = daemons[n % 3]
            assert writer.request("PUT", f"/v1/boards/{quote(board)}", {"policy": "sum"}
                                  )[0] == 201
            status, body = writer.request("POST", f"/v1/boards/{quote(board)}/scores",
                                          {"member": "seed", "delta": 1})
            assert status == 200, body
        owners = {board: holder(pg_dsn, group_of(board)) for board in BOARDS}
        elsewhere = [board for board in BOARDS if owners[board] != "n0"]
        assert len(elsewhere) >= 8
        tcp_of = {f"n{i}": f"127.0.0.1:{d.tcp_port}" for i, d in enumerate(daemons)}
        with Client("127.0.0.1", daemons[0].tcp_port) as client:
            for board in BOARDS:
                assert client.submit(board, "a", delta=2)["score"] == 2
            routes = client._async.routes
            assert {group: address for group, (_, address) in routes.items()} == {
                group_of(board): tcp_of[owners[board]] for board in elsewhere}
            assert all(epoch >= 1 for epoch, _ in routes.values())
            # Known groups go direct: none of these goes through node n0.
            through_n0: list[list[str]] = []
            own = client._async._own_attempts

            async def counted(op, args, idempotent):
                through_n0.append([op, args.get("board")])
                return await own(op, args, idempotent)
            client._async._own_attempts = counted
            for board in elsewhere:
                assert client.submit(board, "b", delta=3)["score"] == 3
                assert client.member(board, "b")["score"] == 3
            assert through_n0 == []
            # One batch over every node, answered in order.
            events = [{"board": board, "member": "c", "delta": n + 1}
                      for n, board in enumerate(BOARDS * 2)]
            answer = client.submit_many(events)
            assert [r["score"] for r in answer["results"]] == [
                n + 1 if n < len(BOARDS) else (n - len(BOARDS) + 1) + (n + 1)
                for n in range(2 * len(BOARDS))]
            assert through_n0 == [["submit_many", None]]  # (n0's own events only)
            for n, board in enumerate(BOARDS):
                assert client.member(board, "c")["score"] == (n + 1) + (n + 1 + len(BOARDS))
