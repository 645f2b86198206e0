"""The cluster under faults: every scenario of the Jepsen-style harness
(tests/cluster/jepsen.py) in a short, bounded form.  Each runs three real
rankd nodes and a real Postgres on loopback, loads them while the nemesis
strikes, heals, and has the checker prove from the history, the log and
every node that nothing acknowledged was lost or applied twice.

The long form: ``python tests/cluster/jepsen.py --seconds 60``.
"""

from __future__ import annotations

import asyncio
import os

import pytest
from jepsen import NEMESES, Lab, make_boards, run_scenario

SECONDS = float(os.environ.get("RANKD_CLUSTER_FAULT_SECONDS", "8"))


@pytest.fixture
def lab(tmp_path, pg_server):  # pg_server: fails rather than skips when Postgres is required
    lab = Lab(tmp_path)
    try:
        make_boards(lab)
        yield lab
    except BaseException:
        print(lab.logs())
        raise
    finally:
        lab.close()


@pytest.mark.parametrize("scenario", sorted(NEMESES))
def test_nothing_acknowledged_is_lost_or_applied_twice(lab: Lab, scenario: str) -> None:
    try:
        figures = asyncio.run(run_scenario(lab, scenario, SECONDS))
    except BaseException:
        print(lab.logs())
        raise
    print(scenario, figures)
    assert figures["acknowledged"] > 20, figures  # the load got through around the fault
    assert figures["nodes_agreeing"] >= 2
    if "failover_s" in figures:
        assert figures["failover_s"] < lab.lease_seconds + 5
