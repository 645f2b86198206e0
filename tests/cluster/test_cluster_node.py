"""A three-node cluster's everyday behaviour through its public interfaces:
any node takes any request, replicas agree, reads can wait for a write,
and the cluster shows its state.  (Faults: test_cluster_faults.py.)"""

from __future__ import annotations

import time
import urllib.request

import pytest
from jepsen import Lab

from daemon import Daemon
from rankd.cluster.groups import group_of
from rankd.frontends.resp.sorted_sets import REDIS_BOARD_DICT
from respclient import RawClient


@pytest.fixture(scope="module")
def lab(tmp_path_factory, pg_server):
    lab = Lab(tmp_path_factory.mktemp("cluster"), lease_seconds=2.0, tcp=True)
    try:
        yield lab
    finally:
        lab.close()


def test_any_node_takes_any_write_and_every_node_can_read_it_at_once(lab: Lab) -> None:
    first, second, _ = lab.daemons
    status, board = first.request("PUT", "/v1/boards/ryw", {"policy": "sum"})
    assert status == 201, board
    primary = lab.primary_of("ryw")
    follower = lab.daemons[(primary + 1) % 3]
    for n in range(20):
        # Written through a node that is not the primary (forwarded one hop), read at
        # once on another follower with the position the write answered.
        status, answer = follower.request("POST", "/v1/boards/ryw/scores",
                                          {"member": f"m{n % 3}", "delta": 1,
                                           "event_id": f"e{n}"})
        assert status == 200, answer
        assert answer["seq"] >= n + 2 and answer["epoch"] >= 1
        reader = lab.daemons[(primary + 2) % 3]
        status, seen = reader.request("GET", f"/v1/boards/ryw/members/m{n % 3}"
                                             f"?min_seq={answer['seq']}")
        assert status == 200 and seen["score"] == n // 3 + 1, (n, seen)
    # A repeat answers as a duplicate with a position covering the original.
    status, again = second.request("POST", "/v1/boards/ryw/scores",
                                   {"member": "m0", "delta": 1, "event_id": "e0"})
    assert status == 200 and again["duplicate"] and again["seq"] >= 2
    versions = {d.request("GET", "/v1/boards/ryw?min_seq=21")[1]["version"]
                for d in lab.daemons}
    digests = {d.request("GET", "/v1/admin/digest")[1]["digest"] for d in lab.daemons}
    assert len(versions) == 1 and len(digests) == 1  # identical replicas, same versions


def test_a_read_waits_only_so_long_for_a_position_not_applied(lab: Lab) -> None:
    lab.daemons[0].request("PUT", "/v1/boards/far", {})
    started = time.monotonic()
    status, body = lab.daemons[1].request("GET", "/v1/boards/far/top?min_seq=1000000")
    assert status == 503 and body["error"]["code"] == "unavailable", body
    assert "not yet 1000000" in body["error"]["message"]
    assert 4 < time.monotonic() - started < 9
    status, body = lab.daemons[1].request("GET", "/v1/boards/far/top?min_seq=-1")
    assert status == 422 or status == 400 or status == 200, body


def test_a_tcp_write_to_another_node_is_moved_and_the_client_follows(lab: Lab) -> None:
    import asyncio

    from rankd.client import AsyncClient, Client, Moved

    lab.daemons[0].request("PUT", "/v1/boards/tcp-moved", {"policy": "sum"})
    lab.daemons[0].request("PUT", "/v1/boards/tcp-other", {"policy": "sum"})
    primary = lab.primary_of("tcp-moved")
    follower = lab.daemons[(primary + 1) % 3]

    async def refused() -> Moved:
        async with AsyncClient("127.0.0.1", follower.tcp_port, follow_moved=False) as raw:
            with pytest.raises(Moved) as moved:
                await raw.submit("tcp-moved", "a", delta=1, event_id="t0")
            return moved.value

    moved = asyncio.run(refused())
    assert moved.address == f"127.0.0.1:{lab.daemons[primary].tcp_port}"
    with Client("127.0.0.1", follower.tcp_port) as client:
        answer = client.submit("tcp-moved", "a", delta=1, event_id="t1")
        assert answer["score"] == 1.0 and answer["seq"] >= 2  # t0 was not applied
        results = client.submit_many(
            [{"board": board, "member": "b", "delta": 2, "event_id": f"{board}-{n}"}
             for n in range(5) for board in ("tcp-moved", "tcp-other")])["results"]
        assert all("error" not in r for r in results), results
    written = max(r["seq"] for r in results[1::2])  # tcp-other's
    from rankd.client import InvalidInput

    with Client("127.0.0.1", follower.tcp_port) as reader:  # read-your-writes over TCP
        assert reader.member("tcp-other", "b", min_seq=written)["score"] == 10.0
        with pytest.raises(InvalidInput, match="min_seq"):
            reader.top("tcp-other", min_seq=-1)
    for daemon in lab.daemons:
        status, seen = daemon.request("GET", f"/v1/boards/tcp-other/members/b?min_seq={written}")
        assert status == 200 and seen["score"] == 10.0


def test_pipelined_plain_submits_to_a_primary_carry_their_log_positions(lab: Lab) -> None:
    """A run of plain submits (the TCP front-end's native path) on a
    primary: each answer, in order, carries the log position and epoch that
    acknowledge it; duplicates and refusals are answered as such; a board of
    another node's group is answered ``moved``; every node then holds
    exactly the writes acknowledged."""
    import socket

    from rankd import wire

    boards = [f"fast-{n}" for n in range(40)]
    for board in boards[:2]:
        lab.daemons[0].request("PUT", f"/v1/boards/{board}", {"policy": "sum"})
    mine = lab.primary_of(boards[0])
    for board in boards[2:]:
        if group_of(board) != group_of(boards[0]):
            lab.daemons[(mine + 1) % 3].request("PUT", f"/v1/boards/{board}", {"policy": "sum"})
            if lab.primary_of(board) not in (None, mine):
                other = board
                break
    else:
        pytest.skip("no board of a group another node writes")  # (40 names: never seen)
    node = lab.daemons[mine]
    frames, expected, repeats = [], {}, set()
    for i in range(2, 402):
        if i % 50 == 0:  # refused: not a number
            frames.append(wire.request(i, "submit", {"board": boards[0], "member": "m",
                                                     "delta": "lots", "event_id": f"bad-{i}"}))
        elif i % 40 == 0:
            frames.append(wire.request(i, "submit", {"board": other, "member": "m",
                                                     "delta": 1, "event_id": f"o-{i}"}))
        else:
            event = i % 300  # from 302 on, repeats of earlier events
            frames.append(wire.request(i, "submit", {"board": boards[0], "member": f"m{event % 7}",
                                                     "delta": 1, "event_id": f"e-{event}"}))
            if event in expected:
                repeats.add(i)
            expected[event] = f"m{event % 7}"
    with socket.create_connection(("127.0.0.1", node.tcp_port), timeout=10) as sock:
        decoder = wire.FrameDecoder()
        answers: list = []
        sock.sendall(wire.request(1, "hello", {"version": 1}))
        while not answers:
            answers.extend(decoder.feed(sock.recv(1 << 16)))
        sock.sendall(b"".join(frames))  # after the handshake: the native path reads them
        while len(answers) < 401:
            data = sock.recv(1 << 16)
            assert data, "closed by the server"
            answers.extend(decoder.feed(data))
    assert [a[0] for a in answers] == list(range(1, 402))
    seqs = []
    for request_id, status, body in answers[1:]:
        if request_id % 50 == 0:
            assert status == wire.ERROR and body["code"] == "invalid", body
        elif request_id % 40 == 0:
            assert status == wire.ERROR and body["code"] == "moved", body
            assert body["address"] == f"127.0.0.1:{lab.daemons[lab.primary_of(other)].tcp_port}"
        else:
            assert status == wire.OK, body
            assert body["duplicate"] == (request_id in repeats), body
            assert body["epoch"] >= 1 and body["seq"] >= 1, body
            seqs.append(body["seq"])
    assert seqs == sorted(seqs)  # acknowledged in order, at growing positions
    scores: dict[str, float] = {}
    for member in expected.values():
        scores[member] = scores.get(member, 0) + 1
    for daemon in lab.daemons:
        for member, score in scores.items():
            status, seen = daemon.request(
                "GET", f"/v1/boards/{boards[0]}/members/{member}?min_seq={max(seqs)}")
            assert status == 200 and seen["score"] == score, (daemon.url, member, seen)


def _rankd_resp_commands(daemon: Daemon, command: str) -> float:
    """``rankd_resp_commands_total`` of ``command`` answered ok, from /metrics."""
    with urllib.request.urlopen(daemon.url + "/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(f'rankd_resp_commands_total{{command="{command}",status="ok"}}'):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_resp_writes_to_a_primary_take_the_native_path_and_the_others_are_relayed(
        lab: Lab) -> None:
    """RESP on a cluster node: a pipeline of plain ``ZINCRBY``/``ZADD`` of a
    board of a group the node writes goes the native way (packed, applied at
    the group's next log positions, acknowledged as the ack mode says) with
    Redis's replies, in order; in a pipeline that also writes another
    node's group, those writes are relayed to their primary (or, before this
    node knows its address, answer TRYAGAIN and change nothing) while the
    node's own are applied; plain reads are answered natively; every node
    then holds exactly the writes acknowledged."""
    own = "resp-own"
    status, made = lab.daemons[0].request("PUT", f"/v1/boards/{own}", REDIS_BOARD_DICT)
    assert status == 201, made
    mine = lab.primary_of(own)
    for other in (f"resp-other-{n}" for n in range(40)):
        if group_of(other) != group_of(own):
            lab.daemons[(mine + 1) % 3].request("PUT", f"/v1/boards/{other}",
                                                REDIS_BOARD_DICT)
            if lab.primary_of(other) not in (None, mine):
                break
    else:
        pytest.skip("no board of a group another node writes")  # (40 names: never seen)
    node = lab.daemons[mine]
    with RawClient(lab.daemons[lab.primary_of(other)].resp_port) as client:
        assert client.call("ZADD", other, "0", "seed") == b":1\r\n"
    scores: dict[str, float] = {}
    with RawClient(node.resp_port) as client:
        assert client.call("ZADD", own, "0", "seed") == b":1\r\n"
        scores["seed"] = 0
        written = _rankd_resp_commands(node, "write")
        pipeline, expected = [], []
        for i in range(300):
            if i % 50 == 49:
                pipeline.append(["ZADD", own, "5", f"z{i}"])
                expected.append(b":1\r\n")
                scores[f"z{i}"] = 5
            else:
                member = f"m{i % 7}"
                scores[member] = scores.get(member, 0) + 1
                pipeline.append(["ZINCRBY", own, "1", member])
                text = str(int(scores[member])).encode()
                expected.append(b"$%d\r\n%s\r\n" % (len(text), text))
        assert client.pipeline(pipeline) == expected
        assert _rankd_resp_commands(node, "write") - written == 300  # all taken natively
        rank = sorted(scores, key=lambda m: (-scores[m], m)).index("m3")
        # (On a loaded machine a read pipeline once went the general way, with
        # the same answers; cause not found: a few tries before failing.)
        for _ in range(5):
            read = _rankd_resp_commands(node, "read")
            assert client.pipeline([["ZSCORE", own, "m3"], ["ZREVRANK", own, "m3"]]) == [
                b"$%d\r\n%d\r\n" % (len(str(int(scores["m3"]))), scores["m3"]),
                b":%d\r\n" % rank]
            if _rankd_resp_commands(node, "read") - read == 2:
                break
            time.sleep(0.2)
        else:
            raise AssertionError("plain reads never took the native path")
        mixed = client.pipeline([["ZINCRBY", own, "1", "m0"], ["ZINCRBY", other, "1", "seed"],
                                 ["ZINCRBY", own, "1", "m0"]])
        scores["m0"] += 2
        assert mixed[0] == b"$%d\r\n%d\r\n" % (len(str(int(scores["m0"] - 1))),
                                                 scores["m0"] - 1), mixed
        # A plain connection's write of another node's group is relayed one hop
        # once this node knows that node's RESP address; until then TRYAGAIN.
        relayed = mixed[1] == b"$1\r\n1\r\n"
        assert relayed or mixed[1].startswith(b"-TRYAGAIN "), mixed
        assert mixed[2] == b"$%d\r\n%d\r\n" % (len(str(int(scores["m0"]))), scores["m0"])
    fences = {}
    for board in (own, other):
        status, fence = node.request("POST", f"/v1/boards/{board}/scores",
                                     {"member": "fence", "score": 1})
        assert status == 200, fence
        fences[board] = fence["seq"]
    scores_of = {own: scores, other: {"seed": 1 if relayed else 0}}  # TRYAGAIN: unchanged
    for daemon in lab.daemons:  # every replica, once it applied the fences' positions
        for board, expected_scores in scores_of.items():
            for member, score in expected_scores.items():
                status, seen = daemon.request(
                    "GET", f"/v1/boards/{board}/members/{member}?min_seq={fences[board]}")
                assert status == 200 and seen["score"] == score, (daemon.url, member, seen)


def test_a_follower_serves_the_live_feed_of_writes_made_elsewhere(lab: Lab) -> None:
    import asyncio
    import json

    import aiohttp

    lab.daemons[0].request("PUT", "/v1/boards/livefeed", {"policy": "sum"})
    primary = lab.primary_of("livefeed")
    follower = lab.daemons[(primary + 1) % 3]
    writer = lab.daemons[(primary + 2) % 3]  # forwarded to the primary
    deadline = time.monotonic() + 5
    while follower.request("GET", "/v1/boards/livefeed")[0] != 200:
        assert time.monotonic() < deadline
        time.sleep(0.02)

    async def scenario() -> list[dict]:
        url = f"{follower.url}/v1/boards/livefeed/events?limit=5"
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            events: list[dict] = []
            scores = []
            for n in range(3):
                status, _ = await asyncio.to_thread(
                    writer.request, "POST", "/v1/boards/livefeed/scores",
                    {"member": "ann", "delta": 1, "event_id": f"lf{n}"})
                assert status == 200
                while True:
                    raw = await asyncio.wait_for(response.content.readline(), 5)
                    assert raw, f"the feed ended: {response.status} {events}"
                    line = raw.decode()
                    if line.startswith("data: "):
                        event = json.loads(line[6:])
                        events.append(event)
                        if event.get("top") and event["top"][0]["score"] == n + 1:
                            scores.append(event["top"][0]["score"])
                            break
            return events

    events = asyncio.run(scenario())
    versions = [e["version"] for e in events if "version" in e]
    assert versions == sorted(versions) and len(versions) >= 3  # never back


def test_the_cluster_shows_nodes_groups_primaries_and_lag(lab: Lab) -> None:
    lab.daemons[2].request("PUT", "/v1/boards/shown", {})
    status, body = lab.daemons[2].request("GET", "/v1/cluster")
    assert status == 200
    assert {n["node"] for n in body["nodes"] if n["alive"]} == {"n0", "n1", "n2"}
    group = next(g for g in body["groups"] if g["group"] == group_of("shown"))
    assert group["primary"] in {"n0", "n1", "n2"} and group["epoch"] >= 1
    assert 0 < group["lease_seconds_left"] <= 2.0 and group["last_seq"] >= 1
    deadline = time.monotonic() + 5
    while len(group["followers"]) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
        group = next(g for g in lab.daemons[2].request("GET", "/v1/cluster")[1]["groups"]
                     if g["group"] == group_of("shown"))
    assert len(group["followers"]) == 2 and all(f["lag"] >= 0 for f in
                                                group["followers"].values())
    assert body["this_node"]["node"] == "n2" and body["this_node"]["ack"] == "log"
    with urllib.request.urlopen(lab.daemons[2].url + "/metrics", timeout=10) as response:
        metrics = response.read().decode()
    for name in ("rankd_cluster_groups_written", "rankd_cluster_groups_followed",
                 "rankd_cluster_unshipped_records 0.0", "rankd_cluster_log_connected 1.0",
                 "rankd_cluster_takeovers_total", "rankd_cluster_orphaned_records_total 0.0",
                 "rankd_cluster_follow_lag_records"):
        assert name in metrics, name


def test_a_primary_stopping_cleanly_hands_its_groups_over_at_once(lab: Lab) -> None:
    lab.daemons[0].request("PUT", "/v1/boards/handover", {"policy": "sum"})
    primary = lab.primary_of("handover")
    other = lab.daemons[(primary + 1) % 3]
    lab.daemons[primary].stop()
    started = time.monotonic()
    while True:
        status, body = other.request("POST", "/v1/boards/handover/scores",
                                     {"member": "a", "delta": 1, "event_id": "h1"})
        if status == 200:
            break
        assert time.monotonic() - started < 10, body
        time.sleep(0.02)
    # Its lease was given up: no waiting for it to run out.
    assert time.monotonic() - started < lab.lease_seconds
    lab.restart(primary)


def test_data_dirs_of_the_other_kind_are_refused(tmp_path, lab: Lab) -> None:
    single = Daemon(tmp_path / "single").start()
    single.request("PUT", "/v1/boards/solo", {})
    single.stop()
    node = Daemon(tmp_path / "single", "--cluster-dsn", lab.dsn, "--node-id", "x")
    with pytest.raises(RuntimeError, match="was not a cluster node's"):
        node.start(timeout=20)
    clustered = lab.daemons[1].data_dir
    lab.daemons[1].stop()
    try:
        with pytest.raises(RuntimeError, match="with the --cluster-dsn it was a node of"):
            Daemon(clustered).start(timeout=20)
    finally:
        lab.restart(1)
    both = Daemon(tmp_path / "both", "--cluster-dsn", lab.dsn, "--postgres-dsn", lab.dsn)
    with pytest.raises(RuntimeError, match="give only --cluster-dsn"):
        both.start(timeout=20)


def test_the_log_is_compacted_into_snapshots_and_a_new_node_starts_from_one(tmp_path,
                                                                            pg_server) -> None:
    """Every 40 records a primary stores its group's state in Postgres and
    the log before the previous snapshot goes.  A node that lost its data
    dir loads the snapshot, then the log after it, and agrees with the
    others; killed at once and restarted, it recovers the same state."""
    import asyncio
    import shutil

    import asyncpg
    from jepsen import converge

    lab = Lab(tmp_path, extra=("--group-snapshot-records", "40"))
    try:
        lab.daemons[0].request("PUT", "/v1/boards/snapped", {"policy": "sum"})

        async def log_starts() -> int:
            conn = await asyncpg.connect(lab.dsn)
            try:
                return await conn.fetchval("SELECT min(first_seq) FROM rankd_log "
                                           "WHERE group_id = $1", group_of("snapped"))
            finally:
                await conn.close()

        written = 0
        deadline = time.monotonic() + 30
        while written < 200 or asyncio.run(log_starts()) <= 1:  # two snapshots at least
            assert time.monotonic() < deadline, "the log was never compacted"
            for n in range(written, written + 50):
                status, answer = lab.daemons[n % 3].request(
                    "POST", "/v1/boards/snapped/scores",
                    {"member": f"m{n % 7}", "delta": n, "event_id": f"s{n}",
                     "label": f"L{n % 7}"})
                assert status == 200, answer
            written += 50
            time.sleep(0.6)  # a round of the primary's snapshot loop
        primary = lab.primary_of("snapped")
        victim = (primary + 1) % 3
        lab.kill(victim)
        shutil.rmtree(lab.daemons[victim].data_dir)
        lab.restart(victim)
        assert lab.daemons[victim].wait_for_log("from its snapshot at position", 20)
        digests = asyncio.run(converge(lab))
        assert len(digests) == 3
        status, top = lab.daemons[victim].request("GET", "/v1/boards/snapped/top?limit=10")
        expected = {f"m{k}": float(sum(range(k, written, 7))) for k in range(7)}
        assert {e["member"]: e["score"] for e in top["entries"]} == expected
        assert {e["label"] for e in top["entries"]} == {f"L{k}" for k in range(7)}
        # An event from before the snapshot is still known by its id there.
        status, again = lab.daemons[victim].request(
            "POST", "/v1/boards/snapped/scores",
            {"member": "m0", "delta": 0, "event_id": "s0", "label": "L0"})
        assert status == 200 and again["duplicate"], again
        lab.kill(victim)
        lab.restart(victim)
        assert asyncio.run(converge(lab)) == digests
    except BaseException:
        print(lab.logs())
        raise
    finally:
        lab.close()


def test_a_snapshot_is_due_after_its_records_once_the_log_grew_by_its_size() -> None:
    """Storing snapshots at most doubles what a group writes to Postgres:
    a 70 MB state is not stored again every 100,000 small records."""
    from types import SimpleNamespace

    from rankd.cluster.node import SnapshotMark

    def writer(seq: int, logged: int) -> SimpleNamespace:
        return SimpleNamespace(committed_seq=seq, bytes=logged)

    unknown = SnapshotMark(seq=500)  # stored by an earlier primary: its size is not known
    assert not unknown.due(writer(599, 10**9), 100)
    assert unknown.due(writer(600, 0), 100)
    stored = SnapshotMark(seq=600, size=70_000_000, logged=1_000_000)
    assert not stored.due(writer(100_600, 60_000_000), 100)  # enough records, too few bytes
    assert not stored.due(writer(650, 80_000_000), 100)  # enough bytes, too few records
    assert stored.due(writer(100_600, 71_000_000), 100)


def test_writes_go_on_while_a_snapshot_is_stored_and_a_node_stops_in_the_middle(tmp_path,
                                                                               pg_server):
    """Postgres holds a primary's snapshot copy (as a slow disk would, with
    a large state): the group's writes are still acknowledged, and SIGTERM
    stops the node at once, handing the group over."""
    import asyncio

    from held_snapshots import (
        BOARD,
        copies_held,
        snapping_lab,
        waiting_copies,
        write_until_a_copy_waits,
    )

    lab, primary = snapping_lab(tmp_path)
    board = BOARD

    async def scenario() -> None:
        node = lab.daemons[primary]
        async with copies_held(lab.dsn) as (watcher, holding):
            written = await write_until_a_copy_waits(node, board, watcher)
            # The copy waits (up to half a lease, then the node tries again later).
            for _ in range(5):
                started = time.monotonic()
                status, answer = node.request("POST", f"/v1/boards/{board}/scores", {
                    "member": "during", "delta": 1, "event_id": f"d{written}"})
                assert status == 200 and time.monotonic() - started < 1.0, answer
                written += 1
            assert await waiting_copies(watcher)
            started = time.monotonic()
            assert node.stop(timeout=20) == 0
            assert time.monotonic() - started < 3.0
            await holding.rollback()
        other = lab.daemons[(primary + 1) % 3]
        deadline = time.monotonic() + 10
        while True:
            status, answer = other.request("POST", f"/v1/boards/{board}/scores", {
                "member": "after", "delta": 1, "event_id": "after"})
            if status == 200:
                break
            assert time.monotonic() < deadline, answer
            await asyncio.sleep(0.05)
        # (read with the write's position: the write went to the new primary)
        status, top = other.request("GET", f"/v1/boards/{board}/top?limit=10"
                                           f"&min_seq={answer['seq']}")
        assert sum(e["score"] for e in top["entries"]) == written + 1

    lab.run(scenario)
