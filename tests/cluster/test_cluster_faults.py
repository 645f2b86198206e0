"""The cluster under faults: every scenario of the Jepsen-style harness
(tests/cluster/jepsen.py) in a short, bounded form.  Each runs three real
rankd nodes and a real Postgres on loopback, loads them, reads them and
watches their live feeds while the nemesis strikes, heals, and has the
checker decide from the history, the log and every node every promise of
docs/cluster.md (``jepsen.violations``): nothing acknowledged lost (under
``--ack local``: only what a failover set aside) or applied twice, no
refused write applied, no read of a write that never commits, no read
going back on a node, one content per board version, no read staler than
``MAX_STALE_SECONDS``.

The scenarios of issue 44 (Postgres paused and stopped under both
acknowledgement modes, a primary cut off from Postgres while clients read
it, a follower whose disk fills up) fail until the daemon keeps those
promises: a failure names each broken one with its figure.

The long form: ``python tests/cluster/jepsen.py --seconds 30 --ack both``.
"""

from __future__ import annotations

import asyncio
import os
import re

import pytest
from jepsen import NEMESES, Lab, make_boards, make_lab, run_scenario, summary, violations

SECONDS = float(os.environ.get("RANKD_CLUSTER_FAULT_SECONDS", "8"))
#: pause_postgres and restart_postgres run combined, as postgres_outages.
CASES = [(name, "log") for name in sorted(NEMESES)
         if name not in ("pause_postgres", "restart_postgres")] + [
    (name, "local") for name in ("kill_primary", "pause_primary", "blackhole_primary_postgres",
                                 "postgres_outages",
                                 "partition_primary_from_postgres_with_reads", "move")]


@pytest.mark.parametrize(("scenario", "ack"), CASES)
def test_scenario_keeps_every_promise(tmp_path, pg_server, scenario: str, ack: str) -> None:
    # pg_server: fails rather than skips where Postgres is required (CI).
    lab = make_lab(tmp_path, scenario, ack)
    try:
        make_boards(lab)
        figures = asyncio.run(run_scenario(lab, scenario, SECONDS))
        wrong = violations(figures, scenario, ack, lab.lease_seconds)
        print(summary(scenario, ack, figures, wrong), figures)
        if wrong:
            print(lab.logs())
    except BaseException:
        print(lab.logs())
        raise
    finally:
        lab.close()
    assert not wrong, summary(scenario, ack, figures, wrong)


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
        # Deposed: a group's epoch moved on (once, or more on a slow machine,
        # where a new primary's lease may lapse in its turn).
        epochs = [int(e) for e in re.findall(r"^group\s+\d+\s+epoch (\d+)", shown, re.M)]
        assert shown.count(" alive") == 3 and max(epochs, default=0) >= 2, shown
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
