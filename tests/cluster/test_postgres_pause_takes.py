"""A Postgres paused past the lease: every primary keeps its groups.

docs/cluster.md promises that when Postgres is back "every primary keeps
its groups (no node takes one before a lease in touch with Postgres) and
ships what it acknowledged".  A write reaching another node while Postgres
is paused, once that node's view of the lease has run out, used to decide a
take there and then: the take waited in the paused Postgres and ran the
moment it resumed, when every lease had run out by the pause and before
the primary could renew its own.  A group with an append of its primary
waiting in Postgres won that race; one without (an idle group, or under
batched appends one whose append waited for a round trip) lost it whenever
the primary's renewal came a moment late, and under ``--ack local`` what
its primary had acknowledged alone was set aside.
"""

from __future__ import annotations

import os
import signal
import threading
import time

from cluster_nodes import boards_in_distinct_groups, sql
from jepsen import Lab, read_log

from nemesis import process_tree, signal_all
from rankd.cluster.groups import group_of

#: How long Postgres stays paused: well past the lease (1.5 s).
PAUSE_SECONDS = 4.0
#: How long after the resume node 0's link to Postgres stays silent.
LINK_LATE_SECONDS = 0.3


def _registers(lab: Lab) -> dict[int, tuple[int, str]]:
    return {row["group_id"]: (row["epoch"], row["holder"])
            for row in sql(lab.dsn, "SELECT group_id, epoch, holder FROM rankd_groups")}


def _logged_events(lab: Lab) -> set[str]:
    import asyncio

    return {record[5] for entries in asyncio.run(read_log(lab.dsn)).values()
            for _, _, record in entries if record[0] == 3}


def _write(daemon, board: str, event: str, timeout: float) -> int:
    try:
        status, _ = daemon.request("POST", f"/v1/boards/{board}/scores",
                                   {"member": "m", "delta": 1, "event_id": event},
                                   timeout=timeout)
    except OSError:
        return 0
    return status


def test_no_node_takes_a_group_when_a_paused_postgres_resumes(tmp_path, pg_server) -> None:
    lab = Lab(tmp_path, ack="local", tcp=False)
    try:
        boards = boards_in_distinct_groups("paused", 4)
        busy, idle = boards[:3], boards[3]
        primary = lab.daemons[0]
        for n, board in enumerate(boards):
            assert primary.request("PUT", f"/v1/boards/{board}", {"policy": "sum"})[0] == 201
            assert _write(primary, board, f"before-{n}", 10) == 200  # node 0 takes its group
        time.sleep(2 * lab.lease_seconds)  # every node read the registers in touch
        before = _registers(lab)
        assert all(before[group_of(b)][1] == "n0" for b in boards), before

        postmaster = int((lab.pg.data / "postmaster.pid").read_text().split()[0])
        os.kill(postmaster, signal.SIGSTOP)
        pids = process_tree(postmaster)
        signal_all(pids, signal.SIGSTOP)
        paused = time.monotonic()
        statuses: list[int] = []
        try:
            # Acknowledged by node 0 alone (--ack local), not yet in the log.
            acknowledged = [f"during-{n}" for n, board in enumerate(busy)
                            if _write(primary, board, f"during-{n}", 1) == 200]
            # Node 0's own link answers a moment after Postgres resumes (a
            # loaded machine): it still has most of a lease to renew in.
            lab.pg_proxies[0].set_mode("blackhole")
            # Once the other nodes' view of the leases ran out, writes reach
            # them: each would make its node take the group, idle one included.
            time.sleep(lab.lease_seconds + 0.5)
            writers = [threading.Thread(target=lambda d=d, b=b, n=n: statuses.append(
                _write(d, b, f"elsewhere-{n}", 15)))
                for n, (d, b) in enumerate((d, b) for d in lab.daemons[1:] for b in boards)]
            for thread in writers:
                thread.start()
            time.sleep(max(0.0, paused + PAUSE_SECONDS - time.monotonic()))
        finally:
            signal_all(pids[::-1], signal.SIGCONT)
            time.sleep(LINK_LATE_SECONDS)
            lab.pg_proxies[0].set_mode("reset")
            time.sleep(0.1)
            lab.pg_proxies[0].set_mode("pass")
        for thread in writers:
            thread.join(30)
        assert acknowledged, "node 0 acknowledged nothing at the start of the pause"

        # Node 0 renews its leases and ships what it acknowledged.
        deadline = time.monotonic() + 15
        while not set(acknowledged) <= _logged_events(lab) and time.monotonic() < deadline:
            time.sleep(0.2)
        after = _registers(lab)
        for board in boards:
            group = group_of(board)
            assert after[group] == before[group], (board, before[group], after[group], statuses)
        assert set(acknowledged) <= _logged_events(lab), "acknowledged writes lost"
        assert group_of(idle) in after
    except BaseException:
        print(lab.logs())
        raise
    finally:
        lab.close()
