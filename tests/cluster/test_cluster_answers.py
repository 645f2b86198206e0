"""Every answer of a cluster node is true, under the faults that once made
some of them false: each test runs real nodes and a real Postgres on
loopback with a proxy on each node's link to Postgres (tests/cluster/
jepsen.py's ``Lab``), strikes, and checks the answers against the
cluster's log.

* A coalesced batch spanning several groups answers each submission with
  its own group's outcome: a group refused (``--ack local``'s unshipped
  window, Postgres out of reach) changes nothing of the others'.
* Postgres out of reach is a 503 (nothing applied) or a forward, never a
  500; ``/v1/cluster`` answers what it last knew, marked stale.
* A primary cut off from Postgres shows no write its log has not committed
  (``--ack log``), and once deposed sets nothing aside: nothing it holds
  was acknowledged, and what it refused stays refused.
* An outage of Postgres itself (every node's link cut at once), or a short
  partition that leaves the primary's open connections hanging, deposes no
  live primary: under ``--ack local`` nothing acknowledged is set aside.
"""

from __future__ import annotations

import asyncio
import threading
import time

import aiohttp
from cluster_nodes import nodes
from jepsen import Lab, read_log, read_orphans

from rankd.client import AsyncClient, Client
from rankd.cluster.groups import group_of
from respclient import RawClient

# Boards of four different groups.
A, B, C, D = "alpha", "beta", "gamma", "delta"


def put(lab: Lab, node: int, board: str) -> None:
    status, body = lab.daemons[node].request("PUT", f"/v1/boards/{board}", {"policy": "sum"})
    assert status in (200, 201), body


def submit(lab: Lab, node: int, board: str, member: str, event_id: str,
           timeout: float = 30) -> tuple[int, dict]:
    return lab.daemons[node].request("POST", f"/v1/boards/{board}/scores",
                                     {"member": member, "delta": 1, "event_id": event_id},
                                     timeout=timeout)


def cut(lab: Lab, node: int) -> None:
    lab.pg_proxies[node].set_mode("blackhole")


def heal(lab: Lab, node: int) -> None:
    lab.pg_proxies[node].set_mode("reset")
    time.sleep(0.2)
    lab.pg_proxies[node].set_mode("pass")


def logged_events(lab: Lab) -> dict[str, int]:
    """Event id -> how many times the cluster's log holds it."""
    counts: dict[str, int] = {}
    for entries in asyncio.run(read_log(lab.dsn)).values():
        for _, _, record in entries:
            if record[0] == 3:  # SUBMIT
                counts[record[5]] = counts.get(record[5], 0) + 1
    return counts


def epochs(lab: Lab) -> dict[int, tuple[int, str]]:
    return {g["group"]: (g["epoch"], g["primary"]) for g in lab.status()["groups"]}


def test_each_submission_of_a_batch_gets_its_own_groups_answer(tmp_path, pg_server):
    """--ack local: node 0 writes A and B and is cut off from Postgres;
    B's unshipped window runs out first.  One TCP batch of A, B and C (C
    written by node 1): A is acknowledged (and commits once the link is
    back), B refused, C sent to node 1 — where every submission was once
    answered B's "nothing was applied"."""
    lab = Lab(tmp_path, nodes=2, ack="local", lease_seconds=4.0,
              extra=("--max-unshipped-ms", "300"))
    try:
        assert len({group_of(b) for b in (A, B, C, D)}) == 4
        for board in (A, B):
            put(lab, 0, board)
        put(lab, 1, C)
        time.sleep(1.5)  # (node 0 follows C)
        for board in (A, B):
            assert submit(lab, 0, board, "warm", f"warm-{board}")[0] == 200
        # --ack local answers before the log commits: A's group must have
        # nothing unshipped when the link is cut, or it is refused too.
        deadline = time.monotonic() + 10
        while not {"warm-alpha", "warm-beta"} <= set(logged_events(lab)):
            assert time.monotonic() < deadline, "the warm writes never reached the log"
            time.sleep(0.05)
        cut(lab, 0)
        status, body = submit(lab, 0, B, "b", "b-1")  # acknowledged by the local log
        assert status == 200, body
        time.sleep(0.6)  # B's oldest unshipped write is now past --max-unshipped-ms

        async def batch() -> list:
            client = AsyncClient("127.0.0.1", lab.daemons[0].tcp_port, retries=0, timeout=20)
            async with client:
                return (await client.submit_many([
                    {"board": A, "member": "a", "delta": 1, "event_id": "a-1"},
                    {"board": B, "member": "b", "delta": 1, "event_id": "b-2"},
                    {"board": C, "member": "c", "delta": 1, "event_id": "c-1"}]))["results"]

        answers = asyncio.run(batch())
        a, b, c = answers
        assert "error" not in a, answers  # A's own outcome: applied, acknowledged
        assert b["error"]["code"] == "unavailable", answers
        assert "error" not in c or c["error"]["code"] in ("not_primary", "moved"), answers
        # A write of a board this node lacks, whose group it cannot look up: 503.
        status, body = submit(lab, 0, D, "d", "d-1")
        assert status == 503 and body["error"]["code"] == "unavailable", (status, body)
        # What the node knows of the cluster, said to be stale.
        started = time.monotonic()
        status, shown = lab.daemons[0].request("GET", "/v1/cluster", timeout=30)
        assert status == 200 and shown["stale"] is True, shown
        assert time.monotonic() - started < 8
        assert {g["group"] for g in shown["groups"]} >= {group_of(A), group_of(B)}
        # Once what it knew of C's lease ran out: sent to C's primary, not a 500.
        time.sleep(4)
        status, body = submit(lab, 0, C, "c", "c-2")
        assert status == 200, (status, body)
        heal(lab, 0)
        # Node 0 was cut off for longer than its lease: node 1 took A and B,
        # and what node 0 acknowledged alone is set aside (--ack local's
        # promise), never dropped; what it refused is nowhere.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            logged, aside = logged_events(lab), read_orphans(lab)
            if {"a-1", "b-1"} <= set(logged) | aside:
                break
            time.sleep(0.2)
        assert {"a-1", "b-1"} <= set(logged) | aside, (logged, aside)
        assert logged.get("c-2") == 1, logged
        assert not {"b-2", "d-1"} & (set(logged) | aside)
    except BaseException:
        print(lab.logs())
        raise
    finally:
        lab.close()


def test_a_primary_cut_off_from_postgres_shows_and_keeps_nothing_uncommitted(tmp_path,
                                                                            pg_server):
    """--ack log: node 0 writes A, then loses Postgres while clients still
    reach it.  Its reads never show the write it applied and could not
    commit (once served at 200), it is deposed, and it sets nothing aside
    (once: the writes it had answered not_primary, in an orphan file that
    `rankd cluster resubmit` applied)."""
    lab = Lab(tmp_path, nodes=2, ack="log", lease_seconds=1.5, ack_timeout=2.0)
    try:
        put(lab, 0, A)
        assert submit(lab, 0, A, "known", "known-1")[0] == 200
        before = epochs(lab)[group_of(A)]
        cut(lab, 0)
        seen: list[tuple[int, object]] = []

        async def write_and_read() -> tuple[int, dict]:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as session:
                url = lab.daemons[0].url

                async def read_loop() -> None:
                    end = time.monotonic() + 5
                    while time.monotonic() < end:
                        async with session.get(f"{url}/v1/boards/{A}/members/ghost") as r:
                            body = await r.json()
                            seen.append((r.status, body.get("score")))
                        await asyncio.sleep(0.05)

                reads = asyncio.ensure_future(read_loop())
                async with session.post(f"{url}/v1/boards/{A}/scores", json={
                        "member": "ghost", "delta": 1, "event_id": "ghost-1"}) as answer:
                    written = answer.status, await answer.json()
                await reads
                return written

        status, body = asyncio.run(write_and_read())
        assert status == 503 and body["error"]["code"] in ("unacknowledged", "not_primary"), body
        shown = [score for code, score in seen if code == 200]
        assert not any(shown), f"a write that never committed was read: {seen}"
        assert any(code == 503 for code, _ in seen) or not seen, seen
        deadline = time.monotonic() + 20  # node 1 takes the group over
        while epochs(lab)[group_of(A)][1] != "n1" and time.monotonic() < deadline:
            time.sleep(0.1)
        heal(lab, 0)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # node 0 gives the group up and follows it
            status, body = lab.daemons[0].request("GET", f"/v1/boards/{A}/members/known")
            if status == 200 and epochs(lab)[group_of(A)][0] > before[0]:
                break
            time.sleep(0.1)
        assert lab.daemons[0].wait_for_log("no longer writes group", timeout=10)
        assert "ghost-1" not in logged_events(lab)
        assert read_orphans(lab) == set(), "--ack log set aside writes it never acknowledged"
        assert not list((lab.daemons[0].data_dir / "wal").glob("orphan-*"))
        status, body = lab.daemons[0].request("GET", f"/v1/boards/{A}/members/ghost")
        assert status == 404, body  # nowhere, for good
        assert "never retrieved" not in lab.daemons[0].log()
    except BaseException:
        print(lab.logs())
        raise
    finally:
        lab.close()


def keeps_its_groups_through(tmp_path, strike) -> None:
    """--ack local, ten groups written by node 0 under load while ``strike(lab)``
    runs (two seconds in): afterwards no group changed primary, nothing was
    set aside, and every acknowledged write is in the cluster's log."""
    lab = Lab(tmp_path, nodes=3, ack="local", lease_seconds=1.5)
    boards = tuple(f"board-{i}" for i in range(10))
    assert len({group_of(b) for b in boards}) == len(boards)
    try:
        for board in boards:
            put(lab, 0, board)
        before = epochs(lab)
        acknowledged: list[str] = []
        stop = time.monotonic() + 9

        async def writers() -> None:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
                async def writer(board: str) -> None:
                    n = 0
                    while time.monotonic() < stop:
                        n += 1
                        event = f"{board}-{n}"
                        try:
                            async with session.post(
                                    f"{lab.daemons[0].url}/v1/boards/{board}/scores",
                                    json={"member": "m", "delta": 1, "event_id": event}) as r:
                                if r.status == 200:
                                    acknowledged.append(event)
                        except (aiohttp.ClientError, TimeoutError):
                            pass
                        await asyncio.sleep(0.02)

                async def nemesis() -> None:
                    await asyncio.sleep(2)
                    await asyncio.to_thread(strike, lab)

                await asyncio.gather(nemesis(), *(writer(b) for b in boards))

        asyncio.run(writers())
        # What was acknowledged reaches the log once the primary ships it
        # (after an append left hanging times out, at most 10 s).
        deadline = time.monotonic() + 15
        while True:
            logged = logged_events(lab)
            lost = [e for e in acknowledged if e not in logged]
            if not lost or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        after = epochs(lab)
        assert {g: after[g] for g in before} == before, (before, after)
        assert read_orphans(lab) == set()
        assert not lost, f"acknowledged and lost: {lost[:10]} of {len(acknowledged)}"
        assert len(acknowledged) > 30
    except BaseException:
        print(lab.logs())
        raise
    finally:
        lab.close()


def test_an_outage_of_postgres_itself_deposes_no_live_primary(tmp_path, pg_server):
    """Postgres stops (``-m immediate``) for two leases and starts again.
    When it is back every lease has run out and every heartbeat is stale;
    the live primary keeps its groups, and no write it acknowledged
    meanwhile is set aside."""
    def outage(lab: Lab) -> None:
        lab.pg.stop("immediate")
        time.sleep(2 * lab.lease_seconds)
        lab.pg.start()

    keeps_its_groups_through(tmp_path, outage)


def test_connections_left_hanging_by_a_short_partition_depose_no_primary(tmp_path, pg_server):
    """The primary's link to Postgres drops every packet for a third of a
    lease, then carries them again: the connections open meanwhile never
    hear back (what they sent is gone) and no reset tells them so.  Its
    renewals go out on fresh connections in time, so it keeps its groups
    (it once waited on the dead ones for the pool's ten-second command
    timeout and lost every group, with what it had acknowledged)."""
    def short_partition(lab: Lab) -> None:
        lab.pg_proxies[0].set_mode("blackhole")
        time.sleep(lab.lease_seconds / 3)
        lab.pg_proxies[0].set_mode("pass")

    keeps_its_groups_through(tmp_path, short_partition)


def test_reads_of_a_busy_primary_wait_for_its_commits_and_never_fail(tmp_path, pg_dsn):
    """--ack log, one node writing a board as fast as four clients can
    while REST, TCP and RESP clients read it: a read meets writes applied
    and not yet committed almost every time, waits for them (the group's
    writes held meanwhile) and is answered; on each connection scores never
    go back, and none exceeds the writes sent so far."""
    with nodes(tmp_path, pg_dsn, 1) as (only,):
        status, body = only.request("PUT", f"/v1/boards/{A}", {"policy": "sum"})
        assert status in (200, 201), body
        sent = [0]
        stop = time.monotonic() + 4
        failures: list[object] = []

        def writer(number: int) -> None:
            n = 0
            while time.monotonic() < stop:
                n += 1
                sent[0] += 1
                status, body = only.request("POST", f"/v1/boards/{A}/scores", {
                    "member": "m", "delta": 1, "event_id": f"w{number}-{n}"})
                if status != 200:
                    failures.append(("write", status, body))

        def reader(read) -> None:
            last = 0.0
            reads = 0
            while time.monotonic() < stop:
                try:
                    score = read()
                except Exception as exc:  # every failure is one
                    failures.append((read.__name__, repr(exc)))
                    continue
                reads += 1
                if score < last or score > sent[0]:
                    failures.append((read.__name__, score, last, sent[0]))
                last = score
            assert reads > 10, (read.__name__, reads)

        def rest() -> float:
            status, body = only.request("GET", f"/v1/boards/{A}/members/m")
            if status == 404:
                return 0.0
            assert status == 200, body
            return body["score"]

        tcp_client = Client("127.0.0.1", only.tcp_port, retries=0)

        def tcp() -> float:
            try:
                return tcp_client.member(A, "m")["score"]
            except Exception as exc:
                if type(exc).__name__ == "NotFound":
                    return 0.0
                raise

        resp_client = RawClient(only.resp_port)

        def resp() -> float:
            replies = resp_client.pipeline([["ZSCORE", A, "m"]] * 8)
            scores = [float(r.split(b"\r\n")[1]) if r.startswith(b"$") and r != b"$-1\r\n"
                      else (0.0 if r == b"$-1\r\n" else -1.0) for r in replies]
            assert min(scores) >= 0, replies
            assert scores == sorted(scores), replies
            return scores[-1]

        threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
        threads += [threading.Thread(target=reader, args=(read,)) for read in (rest, tcp, resp)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        tcp_client.close()
        resp_client.close()
        assert not failures, failures[:10]
        status, body = only.request("GET", f"/v1/boards/{A}/members/m")
        assert status == 200 and body["score"] == sent[0], (body, sent[0])
