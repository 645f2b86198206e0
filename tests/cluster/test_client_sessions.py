"""Read-your-writes in the clients on a cluster: a client connected to a
follower writes (the write goes to the primary) and its next read on the
follower sees it, because the client sends its last write's position as
``min_seq``; the opt-out sends none."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cluster_nodes import holder, nodes

from daemon import SRC
from rankd.client import Client
from rankd.cluster.groups import group_of

CLIENT = Path(__file__).resolve().parents[2] / "clients" / "js"


def primary_and_follower(dsn: str, daemons: list, board: str) -> tuple[Any, Any]:
    primary = daemons[int(holder(dsn, group_of(board))[1:])]
    return primary, daemons[1 - daemons.index(primary)]


def test_the_python_client_reads_its_writes_on_a_follower(tmp_path: Path, pg_dsn: str) -> None:
    with nodes(tmp_path, pg_dsn, 2) as daemons:
        assert daemons[0].request("PUT", "/v1/boards/ryw", {"policy": "sum"})[0] == 201
        _, follower = primary_and_follower(pg_dsn, daemons, "ryw")
        with Client("127.0.0.1", follower.tcp_port) as client:
            for n in range(30):  # the README's snippet, against a follower
                written = client.submit("ryw", f"m{n}", delta=n + 1, event_id=f"e{n}")
                assert client.member("ryw", f"m{n}")["score"] == n + 1
                assert client.top("ryw", limit=100)["total"] == n + 1
                assert written["seq"] == client.positions["ryw"][1]
            results = client.submit_many([{"board": "ryw", "member": f"b{n}", "delta": 1}
                                          for n in range(10)])["results"]
            assert client.positions["ryw"][1] == max(r["seq"] for r in results)
            assert client.ranks("ryw", [f"b{n}" for n in range(10)])["missing"] == []
        # The opt-out sends no position: what a read sends is what the caller gave.
        with Client("127.0.0.1", follower.tcp_port, read_your_writes=False) as client:
            client.submit("ryw", "late", delta=1)
            sent: list[dict] = []
            inner = client._async._send

            async def spy(connection: Any, op: str, args: dict) -> Any:
                sent.append(args)
                return await inner(connection, op, args)

            client._async._send = spy
            client._async.routes.clear()  # (reads through this node, whose sends are spied)
            client.top("ryw", min_seq=1)
            client.get_board("ryw")
            assert sent[0]["min_seq"] == 1 and "min_seq" not in sent[1]


def test_the_js_client_reads_its_writes_on_a_follower(tmp_path: Path, pg_dsn: str) -> None:
    node = shutil.which("node")
    if node is None:
        if os.environ.get("RANKD_REQUIRE_CLIENTS", "") not in ("", "0"):
            pytest.fail("node is not installed (RANKD_REQUIRE_CLIENTS is set)")
        pytest.skip("node is not installed")
    with nodes(tmp_path, pg_dsn, 2) as daemons:
        assert daemons[0].request("PUT", "/v1/boards/js-ryw", {"policy": "sum"})[0] == 201
        primary, follower = primary_and_follower(pg_dsn, daemons, "js-ryw")
        env = {**os.environ, "RANKD_PYTHON": sys.executable, "PYTHONPATH": str(SRC),
               "RANKD_CLUSTER_FOLLOWER": follower.url, "RANKD_CLUSTER_PRIMARY": primary.url}
        done = subprocess.run([node, "--test", "--test-reporter=tap",
                               "test/cluster-session.test.js"], cwd=CLIENT, env=env,
                              capture_output=True, text=True, timeout=300)
    report = done.stdout + done.stderr
    assert done.returncode == 0, report[-6000:]
    passed = re.search(r"^# pass (\d+)", report, re.M)
    assert passed and int(passed.group(1)) >= 2, report[-3000:]
