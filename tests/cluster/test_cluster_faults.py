"""The cluster under faults: every scenario of the Jepsen-style harness
(tests/cluster/jepsen.py) in a short, bounded form.  Each runs three real
rankd nodes and a real Postgres on loopback, loads them while the nemesis
strikes, heals, and has the checker prove from the history, the log and
every node that nothing acknowledged was lost or applied twice (under
``--ack local``: that what a failover lost was set aside, never dropped).

The long form: ``python tests/cluster/jepsen.py --seconds 60``.
"""

from __future__ import annotations

import asyncio
import os

import pytest
from jepsen import NEMESES, Lab, make_boards, run_scenario

SECONDS = float(os.environ.get("RANKD_CLUSTER_FAULT_SECONDS", "8"))
CASES = [(name, "log") for name in sorted(NEMESES)] + [
    ("kill_primary", "local"), ("pause_primary", "local"), ("blackhole_primary_postgres", "local")]


@pytest.mark.parametrize(("scenario", "ack"), CASES)
def test_nothing_acknowledged_is_lost_or_applied_twice(tmp_path, pg_server, scenario: str,
                                                       ack: str) -> None:
    # pg_server: fails rather than skips where Postgres is required (CI).
    lab = Lab(tmp_path, ack=ack)
    try:
        make_boards(lab)
        figures = asyncio.run(run_scenario(lab, scenario, SECONDS))
    except BaseException:
        print(lab.logs())
        raise
    finally:
        lab.close()
    print(scenario, ack, figures)
    assert figures["acknowledged"] > 20, figures  # the load got through around the fault
    assert figures["nodes_agreeing"] >= 2
    if ack == "log":
        assert figures["lost_acknowledged"] == 0
    if "failover_s" in figures:
        assert figures["failover_s"] < lab.lease_seconds + 5
