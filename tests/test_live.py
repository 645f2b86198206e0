"""The live feed against the real daemon: snapshots, coalescing, follows,
versions, rollover-free windows, slow consumers, malformed messages, SSE."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from daemon import Daemon
from engine_helpers import engine_config
from rankd.client import AsyncClient
from rankd.engine.engine import Engine
from rankd.engine.submission import Submission
from rankd.frontends.live import LiveFeed

INTERVAL = 0.2


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with Daemon(tmp_path_factory.mktemp("live") / "data", "--live-interval", str(INTERVAL),
                "--live-send-timeout", "1.5", "--fsync", "no") as running:
        yield running


def ws_url(daemon: Daemon, board: str, query: str = "") -> str:
    return f"ws://127.0.0.1:{daemon.port}/v1/boards/{board}/live{query}"


async def receive(ws: aiohttp.ClientWebSocketResponse, timeout: float = 3.0) -> dict:
    message = await ws.receive(timeout=timeout)
    assert message.type == aiohttp.WSMsgType.TEXT, message
    return json.loads(message.data)


async def quiet(ws: aiohttp.ClientWebSocketResponse, seconds: float) -> list[dict]:
    """Everything received within ``seconds``."""
    got = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            got.append(await receive(ws, left))
        except TimeoutError:
            break
    return got


async def new_board(client: AsyncClient, name: str, **config) -> None:
    await client.put_board(name, {"policy": "sum", **config})


def run_with_client(daemon: Daemon, scenario):
    async def main():
        async with AsyncClient("127.0.0.1", daemon.tcp_port) as client, \
                aiohttp.ClientSession() as session:
            return await scenario(client, session)

    return asyncio.run(main())


def test_snapshot_on_connect_then_coalesced_pushes(daemon):
    async def scenario(client, session):
        await new_board(client, "coal")
        await client.submit_many([{"member": f"p{i}", "delta": i} for i in range(1, 6)],
                                 board="coal")
        async with session.ws_connect(ws_url(daemon, "coal", "?limit=3&members=p1")) as ws:
            first = await receive(ws)
            follow = await receive(ws)
            # One batch of 50 submissions: one push with the final state.
            await client.submit_many([{"member": f"p{i % 5 + 1}", "delta": 1}
                                      for i in range(50)], board="coal")
            pushes = await quiet(ws, INTERVAL * 4)
            # 20 separate pipelined submissions, all well inside a couple of intervals.
            await asyncio.gather(*(client.submit("coal", "p1", delta=1) for _ in range(20)))
            more = await quiet(ws, INTERVAL * 4)
            final = await client.top("coal", limit=3)
            return first, follow, pushes, more, final

    first, follow, pushes, more, final = run_with_client(daemon, scenario)
    assert first["type"] == "leaderboard.updated"
    assert [e["member"] for e in first["top"]] == ["p5", "p4", "p3"]
    assert (first["board"], first["window"], first["period"]) == ("coal", "all", "all")
    assert follow == {**follow, "type": "user.rank.updated", "member": "p1", "rank": 5,
                      "score": 1.0}
    tops = [m for m in pushes if m["type"] == "leaderboard.updated"]
    assert len(tops) == 1
    assert [e["score"] for e in tops[0]["top"]] == [15.0, 14.0, 13.0]
    member_pushes = [m for m in pushes if m["type"] == "user.rank.updated"]
    assert len(member_pushes) == 1 and member_pushes[0]["score"] == 11.0
    more_tops = [m for m in more if m["type"] == "leaderboard.updated"]
    assert 1 <= len(more_tops) <= 2  # 20 writes may straddle one tick boundary
    assert more_tops[-1]["top"] == final["entries"]
    versions = [m["version"] for m in [first, follow, *pushes, *more]]
    assert versions == sorted(versions)


def test_no_push_when_the_visible_top_did_not_change(daemon):
    async def scenario(client, session):
        await new_board(client, "still")
        await client.submit_many([{"member": f"p{i}", "delta": 100 - i} for i in range(10)],
                                 board="still")
        async with session.ws_connect(ws_url(daemon, "still", "?limit=3")) as ws:
            await receive(ws)
            await client.submit("still", "p9", delta=1)  # rank 10 -> still outside the top 3
            unchanged = await quiet(ws, INTERVAL * 4)
            await client.submit("still", "p9", delta=50)
            changed = await quiet(ws, INTERVAL * 4)
            return unchanged, changed

    unchanged, changed = run_with_client(daemon, scenario)
    assert unchanged == []
    assert len(changed) == 1 and changed[0]["top"][0]["member"] == "p9"


def test_follow_and_unfollow_over_the_socket_and_malformed_messages(daemon):
    async def scenario(client, session):
        await new_board(client, "fol")
        await client.submit("fol", "ann", delta=5)
        async with session.ws_connect(ws_url(daemon, "fol")) as ws:
            await receive(ws)
            await ws.send_str(json.dumps({"action": "follow", "members": ["ann", "bob"]}))
            initial = [await receive(ws), await receive(ws)]
            await ws.send_str("not json")
            bad_json = await receive(ws)
            await ws.send_str(json.dumps({"action": "dance", "members": []}))
            bad_action = await receive(ws)
            await ws.send_bytes(b"\x00\x01")
            bad_type = await receive(ws)
            await ws.send_str(json.dumps({"action": "ping"}))
            pong = await receive(ws)
            await ws.send_str(json.dumps({"action": "ping", "members": []}))
            bad_ping = await receive(ws)
            await ws.send_str(json.dumps({"action": "unfollow", "members": ["ann"]}))
            await asyncio.sleep(0.05)
            await client.submit("fol", "bob", delta=7)
            await client.submit("fol", "ann", delta=1)
            later = await quiet(ws, INTERVAL * 4)
            return initial, bad_json, bad_action, bad_type, pong, bad_ping, later

    initial, bad_json, bad_action, bad_type, pong, bad_ping, later = run_with_client(
        daemon, scenario)
    assert pong == {"type": "pong"}
    assert {(m["member"], m["rank"]) for m in initial} == {("ann", 1), ("bob", None)}
    for error in (bad_json, bad_action, bad_type, bad_ping):
        assert error["type"] == "error" and error["code"] == "invalid" and error["message"]
    member_updates = [(m["member"], m["rank"]) for m in later
                      if m["type"] == "user.rank.updated"]
    # Nothing about ann, unfollowed, and bob's new rank only: not his state
    # again from a tick that finds the board changed since before the follow
    # (ann's first submit, when no tick ran in between).
    assert member_updates == [("bob", 1)]


def test_a_broken_socket_ends_quietly_without_an_error_answer(daemon):
    """A socket that breaks (here a message over the size limit, which
    aiohttp answers by closing with 1009; a heartbeat timeout breaks it the
    same way) ends its handler: no error message is written to the closed
    socket, so no failed request and traceback are logged (the fault suite
    saw them for every subscriber cut off from its node)."""
    async def scenario(client, session):
        await new_board(client, "broken")
        async with session.ws_connect(ws_url(daemon, "broken")) as ws:
            await receive(ws)
            await ws.send_str("x" * (65 * 1024))
            closed = await ws.receive(timeout=3)
            return closed.type, ws.close_code

    before = daemon.log().count("/live failed")
    kind, code = run_with_client(daemon, scenario)
    assert kind in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED), kind
    assert code == aiohttp.WSCloseCode.MESSAGE_TOO_BIG, code
    time.sleep(0.2)
    assert daemon.log().count("/live failed") == before, daemon.log()[-3000:]


def test_a_plain_request_to_the_socket_route_is_refused_and_holds_nothing(tmp_path):
    """A GET without the WebSocket upgrade once registered a subscriber it
    never released: enough of them used up the address's live connections."""
    with Daemon(tmp_path / "data", "--live-max-per-address", "2") as server:
        server.request("PUT", "/v1/boards/plain", {"policy": "sum"})
        for _ in range(5):
            status, body = server.request("GET", "/v1/boards/plain/live")
            assert status == 400 and body["error"]["code"] == "bad_request", body
            assert "WebSocket" in body["error"]["message"]

        async def connect_twice(client, session):
            url = ws_url(server, "plain")
            async with session.ws_connect(url) as one, session.ws_connect(url) as two:
                return [await receive(one), await receive(two)]

        first, second = run_with_client(server, connect_twice)
        assert first["type"] == second["type"] == "leaderboard.updated"


def test_bad_subscriptions_are_refused_before_the_upgrade(daemon):
    async def scenario(client, session):
        await new_board(client, "refuse")
        answers = []
        for query in ("?limit=0", "?limit=x", "?window=hourly", "?color=red"):
            async with session.get(f"http://127.0.0.1:{daemon.port}/v1/boards/refuse/live"
                                   f"{query}") as response:
                answers.append((response.status, (await response.json())["error"]["code"]))
        async with session.get(f"http://127.0.0.1:{daemon.port}/v1/boards/none/live") as r:
            answers.append((r.status, (await r.json())["error"]["code"]))
        return answers

    answers = run_with_client(daemon, scenario)
    assert [status for status, _ in answers] == [422, 400, 422, 400, 404]


def _silent_websocket(port: int, path: str) -> socket.socket:
    """A WebSocket client that upgrades and then never reads."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall((f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                  f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                  "Sec-WebSocket-Version: 13\r\n\r\n").encode())
    return sock


def test_a_slow_subscriber_is_dropped_and_others_keep_receiving(daemon):
    async def scenario(client, session):
        await new_board(client, "slow")
        names = [f"{i:03d}-" + "x" * 200 for i in range(100)]
        await client.submit_many([{"member": n, "delta": 1} for n in names], board="slow")
        silent = _silent_websocket(daemon.port, "/v1/boards/slow/live?limit=100")
        delays = []
        async with session.ws_connect(ws_url(daemon, "slow", "?limit=100")) as ws:
            await receive(ws)
            for round_ in range(40):  # ~8 s of a changing top-100 with 25 KB messages
                sent = time.monotonic()
                await client.submit_many([{"member": n, "delta": 1 + (i + round_) % 7}
                                          for i, n in enumerate(names)], board="slow")
                message = await receive(ws, timeout=5)
                delays.append(time.monotonic() - sent)
                assert message["type"] == "leaderboard.updated"
        silent.settimeout(10)
        closed = False
        try:
            while silent.recv(1 << 20):
                pass
            closed = True  # end of stream: the server hung up on it
        except ConnectionResetError:
            closed = True
        except TimeoutError:
            pass
        silent.close()
        return delays, closed

    delays, closed = run_with_client(daemon, scenario)
    assert max(delays) < 2.0  # the silent one never held the others back
    assert closed
    assert "too slow" in daemon.log()


def test_server_sent_events_carry_the_same_events(daemon):
    async def scenario(client, session):
        await new_board(client, "sse")
        await client.submit("sse", "ann", delta=3)
        url = f"http://127.0.0.1:{daemon.port}/v1/boards/sse/events?limit=5&members=ann"
        async with session.get(url) as response:
            content_type = response.headers["Content-Type"]
            events = []
            await client.submit("sse", "ann", delta=1)
            while len(events) < 4:
                line = (await asyncio.wait_for(response.content.readline(), 5)).decode()
                if line.startswith("data: "):
                    events.append(json.loads(line[6:]))
            return content_type, events

    content_type, events = run_with_client(daemon, scenario)
    assert content_type.startswith("text/event-stream")
    assert [e["type"] for e in events[:2]] == ["leaderboard.updated", "user.rank.updated"]
    assert {e["type"] for e in events[2:]} == {"leaderboard.updated", "user.rank.updated"}
    assert events[2]["top"][0]["score"] == 4.0 or events[3]["top"][0]["score"] == 4.0


def test_the_page_and_its_assets_are_served(daemon):
    async def scenario(client, session):
        answers = {}
        for path in ("/", "/static/app.js", "/static/style.css", "/static/rankd.js",
                     "/static/missing.js", "/static/..%2Fserver.py"):
            async with session.get(f"http://127.0.0.1:{daemon.port}{path}") as response:
                answers[path] = (response.status, response.content_type, await response.text())
        return answers

    answers = run_with_client(daemon, scenario)
    assert answers["/"][:2] == (200, "text/html") and "rankd" in answers["/"][2]
    assert answers["/static/app.js"][:2] == (200, "text/javascript")
    assert answers["/static/style.css"][:2] == (200, "text/css")
    # The page runs on the JavaScript client itself (one implementation of the feed).
    client = Path(__file__).resolve().parent.parent / "clients" / "js" / "src" / "index.js"
    assert answers["/static/rankd.js"] == (200, "text/javascript", client.read_text())
    assert 'from "/static/rankd.js"' in answers["/static/app.js"][2]
    assert answers["/static/missing.js"][0] == 404
    assert answers["/static/..%2Fserver.py"][0] == 404
    assert "http://" not in answers["/"][2] and "https://" not in answers["/"][2]


@pytest.mark.parametrize("size", [0, 125, 126, 65535, 65536, 70000])
def test_prebuilt_frames_are_valid_unmasked_text_frames(size):
    from rankd.frontends.live import websocket_frame

    payload = b"x" * size
    frame = websocket_frame(payload)
    assert frame[0] == 0x81  # FIN, text
    assert frame[1] & 0x80 == 0  # servers never mask
    length, offset = frame[1], 2
    if length == 126:
        length, offset = int.from_bytes(frame[2:4], "big"), 4
    elif length == 127:
        length, offset = int.from_bytes(frame[2:10], "big"), 10
    assert length == size and frame[offset:] == payload
    assert (size < 126) == (offset == 2) and (size >= 65536) == (offset == 10)


def test_each_follower_is_sent_a_members_state_once(tmp_path):
    """A member's state goes to each follower once: not again from a tick
    to one that was sent it when it began following, yet to one still
    behind (the feed's last pushed state is shared by all followers)."""
    def states(subscriber) -> list[tuple[str, float | None]]:
        sent = [json.loads(message) for _, message in subscriber.queue]
        subscriber.queue.clear()
        return [(m["member"], m["score"]) for m in sent if m["type"] == "user.rank.updated"]

    async def body() -> list[Any]:
        engine = await Engine.open(engine_config(tmp_path))
        try:
            await engine.put_board("b", {"policy": "sum"})
            feed = LiveFeed(engine)
            first = feed.subscribe("b", None, 10, ["ann"])
            seen = [states(first)]
            await engine.submit(Submission("b", "ann", delta=1))
            second = feed.subscribe("b", None, 10, ["ann"])  # before a tick: sent ann at 1
            seen.append(states(second))
            await feed.tick()
            seen += [states(first), states(second)]
            await engine.submit(Submission("b", "ann", delta=2))
            await feed.tick()
            seen += [states(first), states(second)]
            return seen
        finally:
            await engine.close(snapshot=False)

    assert asyncio.run(body()) == [[("ann", None)], [("ann", 1.0)], [("ann", 1.0)], [],
                                   [("ann", 3.0)], [("ann", 3.0)]]


def test_a_message_handed_out_over_several_turns_keeps_each_subscribers_order(
        tmp_path, monkeypatch):
    """A tick yields to the loop between turns, also while handing one
    message to many subscribers: one that begins following a member
    meanwhile is handed the tick's message first (what was rendered first
    arrives first, versions never decrease); one that stops following the
    member meanwhile is not sent it; every other follower gets it once."""
    monkeypatch.setattr("rankd.frontends.live.TICK_SLICE", 0.0)  # yield at every chance

    def messages(subscriber) -> list[dict]:
        sent = [json.loads(message) for _, message in subscriber.queue]
        subscriber.queue.clear()
        return sent

    async def body() -> tuple[list[list[dict]], list[dict], list[dict]]:
        engine = await Engine.open(engine_config(tmp_path))
        try:
            await engine.put_board("b", {"policy": "sum"})
            await engine.submit_many([Submission("b", "ann", delta=1),
                                      Submission("b", "bob", delta=5)])
            feed = LiveFeed(engine)
            subscribers = [feed.subscribe("b", None, 1, ["ann"]) for _ in range(300)]
            for subscriber in subscribers:
                messages(subscriber)
            await engine.submit(Submission("b", "ann", delta=1))
            tick = asyncio.get_running_loop().create_task(feed.tick())
            for _ in range(1000):  # until some follower has ann's new state
                await asyncio.sleep(0)
                if any(s.queue for s in subscribers):
                    break
            late, leaving = [s for s in subscribers if not s.queue][:2]  # still waiting
            feed.send_members(late, feed.follow(late, ["bob"]))
            feed.unfollow(leaving, ["ann"])
            await tick
            return ([messages(s) for s in subscribers if s not in (late, leaving)],
                    messages(late), messages(leaving))
        finally:
            await engine.close(snapshot=False)

    others, late, leaving = asyncio.run(body())
    assert [(m["member"], m["score"]) for m in late if m["type"] == "user.rank.updated"] == [
        ("ann", 2.0), ("bob", 5.0)]
    versions = [m["version"] for m in late]
    assert versions == sorted(versions)
    assert [m for m in leaving if m["type"] == "user.rank.updated"] == []
    for sent in others:
        assert [(m["member"], m["score"]) for m in sent
                if m["type"] == "user.rank.updated"] == [("ann", 2.0)]


def test_members_read_before_a_turn_given_up_are_read_anew(tmp_path, monkeypatch):
    """Followed members are read a batch at a time; when the tick gives up
    its turn in the middle of a batch (handing a member's state to many),
    the rest of the batch is read again: a write meanwhile is not pushed
    as the state from before it, after a newer one."""
    monkeypatch.setattr("rankd.frontends.live.TICK_SLICE", 0.0)

    async def body() -> list[dict]:
        engine = await Engine.open(engine_config(tmp_path))
        try:
            await engine.put_board("b", {"policy": "sum"})
            await engine.submit_many([Submission("b", "ann", delta=1),
                                      Submission("b", "bob", delta=5)])
            feed = LiveFeed(engine, max_per_address=3000)
            crowd = [feed.subscribe("b", None, 1, ["ann"]) for _ in range(2000)]
            feed.subscribe("b", None, 1, ["bob"])
            await engine.submit_many([Submission("b", "ann", delta=1),
                                      Submission("b", "bob", delta=1)])
            tick = asyncio.get_running_loop().create_task(feed.tick())
            for _ in range(1000):  # until ann's new state is being handed out
                await asyncio.sleep(0)
                if any(len(s.queue) > 2 for s in crowd):
                    break
            assert feed._fan_out_in_progress is not None
            await engine.submit(Submission("b", "bob", delta=100))
            assert feed._fan_out_in_progress is not None  # still ann's: bob was read before
            newcomer = feed.subscribe("b", None, 1, ["bob"])
            await tick
            return [json.loads(message) for _, message in newcomer.queue]
        finally:
            await engine.close(snapshot=False)

    sent = asyncio.run(body())
    bob = [(m["score"], m["version"]) for m in sent if m["type"] == "user.rank.updated"]
    assert bob == [(106.0, sent[0]["version"])]


def test_a_newer_top_supersedes_a_queued_one_without_overtaking(tmp_path):
    """A subscriber that has not taken its messages yet: a newer top-N
    replaces the one still queued, queued after what was rendered before it
    (it once took the older one's place, ahead of a member's older state,
    and versions went backwards)."""
    async def body() -> list[tuple[str, int]]:
        engine = await Engine.open(engine_config(tmp_path))
        try:
            await engine.put_board("b", {"policy": "sum"})
            await engine.submit(Submission("b", "ann", delta=1))
            feed = LiveFeed(engine)
            subscriber = feed.subscribe("b", None, 10, ["ann"])  # top, ann: not taken
            await engine.submit(Submission("b", "ann", delta=1))
            await feed.tick()
            sent = [json.loads(message) for _, message in subscriber.queue]
            return [(m["type"], m["version"]) for m in sent]
        finally:
            await engine.close(snapshot=False)

    sent = asyncio.run(body())
    assert [kind for kind, _ in sent] == ["user.rank.updated", "leaderboard.updated",
                                          "user.rank.updated"]
    versions = [version for _, version in sent]
    assert versions[0] < versions[1] == versions[2]


def test_a_client_that_resets_during_the_handshake_is_no_server_error(daemon):
    """Upgrade requests whose connection is reset at once (an outside
    attack: any client, no credentials): each was logged as a failed
    request with a traceback and counted as a 500."""
    run_with_client(daemon, lambda client, session: new_board(client, "reset"))
    before = daemon.log().count("/live failed")
    for _ in range(30):
        with socket.create_connection(("127.0.0.1", daemon.port), timeout=5) as raw:
            key = base64.b64encode(os.urandom(16)).decode()
            raw.sendall(f"GET /v1/boards/reset/live?limit=3 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                        f"Upgrade: websocket\r\nConnection: Upgrade\r\n"
                        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
                        .encode())
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        time.sleep(0.01)
    time.sleep(0.5)
    with urllib.request.urlopen(f"http://127.0.0.1:{daemon.port}/metrics", timeout=10) as page:
        metrics = page.read().decode()
    assert 'operation="live_socket",status="500"' not in metrics, metrics
    assert daemon.log().count("/live failed") == before, daemon.log()[-3000:]
