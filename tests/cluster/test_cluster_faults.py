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
from jepsen import NEEDS_STANDBY, NEMESES, Lab, make_boards, run_scenario

SECONDS = float(os.environ.get("RANKD_CLUSTER_FAULT_SECONDS", "8"))
CASES = [(name, "log") for name in sorted(NEMESES)] + [
    ("kill_primary", "local"), ("pause_primary", "local"), ("blackhole_primary_postgres", "local")]


@pytest.mark.parametrize(("scenario", "ack"), CASES)
def test_nothing_acknowledged_is_lost_or_applied_twice(tmp_path, pg_server, scenario: str,
                                                       ack: str) -> None:
    # pg_server: fails rather than skips where Postgres is required (CI).
    lab = Lab(tmp_path, ack=ack, standby=scenario in NEEDS_STANDBY)
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


def test_what_a_deposed_primary_set_aside_can_be_resubmitted(tmp_path, pg_server,
                                                             capsys) -> None:
    """Under --ack local a primary cut off from Postgres acknowledges up to
    --max-unshipped-ms of writes that the new primary never sees; once it
    is back and deposed they are in its wal/orphan-* file, and `rankd
    cluster resubmit` brings every one of them back, once."""
    from jepsen import BOARDS, converge, read_log, read_orphans

    from rankd import cli

    lab = Lab(tmp_path, ack="local")
    try:
        make_boards(lab)
        figures = asyncio.run(run_scenario(lab, "blackhole_primary_postgres", SECONDS / 2))
        assert figures["set_aside"] > 0, figures
        orphaned = read_orphans(lab)
        url = f"http://127.0.0.1:{lab.daemons[0].port}"
        capsys.readouterr()
        assert cli.main(["cluster", "--url", url, "status"]) == 0
        shown = capsys.readouterr().out
        assert shown.count(" alive") == 3 and "epoch 2" in shown, shown
        files = sorted(p for d in lab.daemons for p in (d.data_dir / "wal").glob("orphan-*"))
        for path in files:
            assert cli.main(["cluster", "--url", url, "resubmit", str(path)]) == 0
        resubmitted = capsys.readouterr().err
        assert "refused" in resubmitted and " 0 refused" in resubmitted, resubmitted
        asyncio.run(converge(lab))
        logged = [record[5] for entries in asyncio.run(read_log(lab.dsn)).values()
                  for _, _, record in entries if record[0] == 3]
        assert orphaned <= set(logged) and len(logged) == len(set(logged))
        for path in files:  # a second time changes nothing: all duplicates
            assert cli.main(["cluster", "--url", url, "resubmit", str(path)]) == 0
        again = capsys.readouterr().err
        assert " 0 applied" in again and all(f"{b}: 0 applied" in again or b not in again
                                             for b in BOARDS), again
    except BaseException:
        print(lab.logs())
        raise
    finally:
        lab.close()
