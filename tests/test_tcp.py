"""The msgpack TCP protocol: wire vectors, the server through raw sockets,
and the Python clients, all against the real daemon."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from pathlib import Path
from typing import Any

import jwt
import msgpack
import pytest

from daemon import Daemon
from rankd import wire
from rankd.client import (
    AsyncClient,
    Client,
    ConnectionLost,
    GuardViolation,
    InvalidInput,
    NotFound,
    ProtocolError,
    TooLarge,
)

VECTORS = json.loads((Path(__file__).parent.parent / "protocol" / "vectors.json").read_text())


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with Daemon(tmp_path_factory.mktemp("tcp") / "data") as running:
        with Client("127.0.0.1", running.tcp_port) as client:
            client.put_board("arena", {"policy": "best"})
            client.put_board("wins", {"policy": "sum", "max_delta": 10})
        yield running


class Raw:
    """A bare socket speaking frames, to test the server without the client."""

    def __init__(self, port: int, hello: bool = True) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.decoder = wire.FrameDecoder()
        self.backlog: list[Any] = []
        if hello:
            self.send(wire.request(1, "hello", {"version": 1}))
            assert self.receive()[1] == wire.OK

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def receive(self) -> Any:
        while not self.backlog:
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("closed by the server")
            self.backlog.extend(self.decoder.feed(data))
        return self.backlog.pop(0)

    def closed_by_server(self) -> bool:
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.sock.close()


# --- the wire format ----------------------------------------------------------------


@pytest.mark.parametrize("vector", VECTORS["frames"], ids=lambda v: v["name"])
def test_frames_encode_and_decode_exactly_as_the_vectors_say(vector):
    data = bytes.fromhex(vector["hex"])
    assert wire.encode(vector["value"]) == data
    assert wire.FrameDecoder().feed(data) == [vector["value"]]


def test_frames_split_anywhere_decode_the_same():
    stream = b"".join(bytes.fromhex(v["hex"]) for v in VECTORS["frames"])
    for step in (1, 2, 3, 7, 64):
        decoder = wire.FrameDecoder()
        messages = []
        for start in range(0, len(stream), step):
            messages.extend(decoder.feed(stream[start:start + step]))
        assert messages == [v["value"] for v in VECTORS["frames"]]
        assert decoder.pending_bytes == 0


@pytest.mark.parametrize("vector", VECTORS["malformed"], ids=lambda v: v["name"])
def test_malformed_frames_are_refused_by_the_decoder(vector):
    with pytest.raises(wire.FrameError) as failure:
        wire.FrameDecoder().feed(bytes.fromhex(vector["hex"]))
    assert failure.value.code == vector["error"]


# --- the server, through raw frames --------------------------------------------------


@pytest.mark.parametrize("vector", VECTORS["malformed"], ids=lambda v: v["name"])
def test_server_answers_a_malformed_frame_with_id_0_and_closes(daemon, vector):
    raw = Raw(daemon.tcp_port)
    raw.send(bytes.fromhex(vector["hex"]))
    request_id, status, body = raw.receive()
    assert (request_id, status, body["code"]) == (0, wire.ERROR, vector["error"])
    assert raw.closed_by_server()
    raw.close()


@pytest.mark.parametrize("vector", VECTORS["bad_requests"], ids=lambda v: v["name"])
def test_server_answers_bad_requests_and_keeps_the_connection(daemon, vector):
    raw = Raw(daemon.tcp_port)
    raw.send(bytes.fromhex(vector["hex"]))
    request_id, status, body = raw.receive()
    expected_id, expected_status, expected_body = vector["response"]
    assert (request_id, status, body["code"]) == (expected_id, expected_status,
                                                  expected_body["code"])
    assert body["message"]
    raw.send(wire.request(99, "health", {}))
    assert raw.receive() == [99, wire.OK, {"status": "ok"}]
    raw.close()


def test_hello_is_required_first_and_versions_are_checked(daemon):
    raw = Raw(daemon.tcp_port, hello=False)
    raw.send(wire.request(5, "top", {"board": "arena"}))
    assert raw.receive()[:2] == [5, wire.ERROR]
    assert raw.closed_by_server()
    raw = Raw(daemon.tcp_port, hello=False)
    raw.send(wire.request(1, "hello", {"version": 99}))
    request_id, status, body = raw.receive()
    assert (request_id, status, body["code"]) == (1, wire.ERROR, "unsupported_version")
    assert raw.closed_by_server()


def test_pipelined_requests_are_answered_in_order_and_submits_batched(daemon):
    raw = Raw(daemon.tcp_port)
    frames = []
    for i in range(2, 3002):
        if i % 3:
            frames.append(wire.request(i, "submit", {"board": "wins", "member": f"w{i % 50}",
                                                     "delta": 1, "event_id": f"pipe-{i}"}))
        else:
            frames.append(wire.request(i, "member", {"board": "wins", "member": "nobody"}))
    raw.send(b"".join(frames))
    answers = [raw.receive() for _ in range(3000)]
    assert [a[0] for a in answers] == list(range(2, 3002))
    for request_id, status, body in answers:
        if request_id % 3:
            assert status == wire.OK and body["event_id"] == f"pipe-{request_id}"
        else:
            assert status == wire.ERROR and body["code"] == "not_found"
    raw.close()


# --- the clients ------------------------------------------------------------------------


def test_blocking_client_covers_every_operation(daemon):
    with Client("127.0.0.1", daemon.tcp_port) as client:
        assert client.server_info["version"] == 1
        assert client.health() == {"status": "ok"}
        created = client.put_board("golf", {"order": "asc", "policy": "best",
                                            "windows": ["all", "weekly"]})
        assert created["created"] is True and created["board"]["config"]["order"] == "asc"
        assert client.put_board("golf", {"order": "asc", "policy": "best",
                                         "windows": ["all", "weekly"]})["created"] is False
        assert "golf" in [b["name"] for b in client.list_boards()["boards"]]
        first = client.submit("golf", "ann", score=72, label="Ann")
        assert (first["rank"], first["score"], first["changed"]) == (1, 72.0, True)
        client.submit("golf", "bo", score=68)
        client.submit("golf", "cy", score=75)
        again = client.submit("golf", "ann", score=80)  # worse in golf: kept 72
        assert (again["score"], again["changed"]) == (72.0, False)
        top = client.top("golf", limit=2)
        assert [(e["rank"], e["member"]) for e in top["entries"]] == [(1, "bo"), (2, "ann")]
        assert top["total"] == 3
        standing = client.member("golf", "ann")
        assert (standing["rank"], standing["label"], standing["percentile"]) == (
            2, "Ann", pytest.approx(200 / 3))
        assert [e["member"] for e in client.around("golf", "ann", above=1, below=1)[
            "entries"]] == ["bo", "ann", "cy"]
        ranks = client.ranks("golf", ["cy", "ann", "zed"])
        assert [(e["member"], e["list_rank"]) for e in ranks["entries"]] == [("ann", 1),
                                                                            ("cy", 2)]
        assert ranks["missing"] == ["zed"]
        assert client.periods("golf", window="weekly")["current"].count("-W") == 1
        results = client.submit_many([{"member": "dee", "score": 70},
                                      {"member": "eve", "score": "x"}], board="golf")
        assert results["results"][0]["rank"] == 2
        assert results["results"][1]["error"]["code"] == "invalid"
        assert client.remove_member("golf", "dee") == {}
        with pytest.raises(NotFound):
            client.remove_member("golf", "dee")
        assert client.get_board("golf")["members"]["all"] == 3
        assert client.delete_board("golf") == {}
        with pytest.raises(NotFound):
            client.top("golf")


def test_client_errors_map_to_exceptions(daemon):
    with Client("127.0.0.1", daemon.tcp_port) as client:
        with pytest.raises(InvalidInput):
            client.submit("wins", "ann", score=3)  # a sum board takes deltas
        with pytest.raises(GuardViolation):
            client.submit("wins", "ann", delta=11)
        with pytest.raises(InvalidInput):
            client.top("wins", limit=0)
        with pytest.raises(TooLarge):
            client.ranks("wins", [f"m{i}" for i in range(1001)])
        with pytest.raises(ProtocolError):
            client._call("flush_all", {}, False)
        with pytest.raises(TooLarge):
            client.submit("wins", "x" * 10, delta=1, label="y" * (2 << 20))
        assert client.health() == {"status": "ok"}  # the connection is still fine


def test_async_client_pipelines_concurrent_calls(daemon):
    async def scenario():
        async with AsyncClient("127.0.0.1", daemon.tcp_port) as client:
            results = await asyncio.gather(*(
                client.submit("wins", f"a{i % 10}", delta=1, event_id=f"async-{i}")
                for i in range(500)))
            top = await client.top("wins", limit=1000)
            return results, top

    results, top = asyncio.run(scenario())
    assert len({r["event_id"] for r in results}) == 500
    scores = {e["member"]: e["score"] for e in top["entries"]}
    assert all(scores[f"a{i}"] >= 50 for i in range(10))


def test_client_reconnects_and_retries_only_idempotent_writes(tmp_path):
    data_dir = tmp_path / "data"
    first = Daemon(data_dir).start()
    port = first.tcp_port
    client = Client("127.0.0.1", port, retries=40, backoff=0.05, max_backoff=0.2)
    try:
        client.put_board("b", {"policy": "sum"})
        client.submit("b", "ann", delta=1, event_id="e1")
        first.stop()
        second = Daemon(data_dir)
        second.tcp_port = port  # same address: the client reconnects to it
        second.start()
        try:
            # Idempotent (event_id): retried over the new connection.
            assert client.submit("b", "ann", delta=1, event_id="e2")["score"] == 2.0
            assert client.submit("b", "ann", delta=1, event_id="e1")["duplicate"] is True
            assert client.top("b")["entries"][0]["score"] == 2.0
        finally:
            second.stop()
        with pytest.raises(ConnectionLost):
            client.submit("b", "ann", delta=1)  # not idempotent, server gone: no retry
    finally:
        client.close()


def test_board_changes_that_lose_data_need_discard_over_tcp_too(daemon):
    from rankd.client import Conflict

    with Client("127.0.0.1", daemon.tcp_port) as client:
        client.put_board("tcp-keep", {"policy": "sum", "windows": ["all", "daily"]})
        client.submit("tcp-keep", "ann", delta=2)
        with pytest.raises(Conflict, match="window 'daily'"):
            client.put_board("tcp-keep", {"policy": "sum"})
        changed = client.patch_board("tcp-keep", {"max_delta": 10})["board"]["config"]
        assert changed["windows"] == ["all", "daily"] and changed["max_delta"] == 10
        dropped = client.patch_board("tcp-keep", {"windows": ["all"]}, discard=True)
        assert dropped["board"]["config"]["windows"] == ["all"]
        assert client.member("tcp-keep", "ann")["score"] == 2


# --- hardening: decoding limits, the handshake's failures, expiry, rate limits ----------

SECRET = "tcp-test-secret-" + "s" * 24


def token(scope: str = "read write admin", expires_in: float = 3600) -> str:
    return jwt.encode({"scope": scope, "exp": int(time.time() + expires_in)}, SECRET,
                      algorithm="HS256")


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """A daemon with credentials (the handshake's path), reads limited to 5/s
    a credential."""
    with Daemon(tmp_path_factory.mktemp("tcp-secured") / "data", "--jwt-secret", SECRET,
                "--rate-credential-reads", "5") as running:
        with Client("127.0.0.1", running.tcp_port, token=token()) as client:
            client.put_board("arena", {"policy": "best"})
        yield running


def answers_until_closed(raw: Raw) -> list[Any]:
    """Every frame the server sends until it closes the connection."""
    answers = []
    with contextlib.suppress(ConnectionError):
        while True:
            answers.append(raw.receive())
    return answers


def test_a_frame_beyond_the_decoding_limits_is_refused_and_changes_nothing(secured):
    # Before auth: 17 maps (a 16 KiB frame of them decoded into a megabyte).
    raw = Raw(secured.tcp_port)
    raw.send(wire.request(2, "health", {"x": [{}] * 16}))
    assert [a[2]["code"] for a in answers_until_closed(raw)] == ["too_large"]
    raw.close()
    # After: an extension type (never used; 30 times its size decoded), in a
    # submit that is answered before and not applied.
    raw = Raw(secured.tcp_port)
    raw.send(wire.request(2, "auth", {"token": token()}))
    assert raw.receive()[1] == wire.OK
    raw.send(wire.request(3, "health", {}) + wire.request(
        4, "submit", {"board": "arena", "member": "ext", "score": 1,
                      "label": msgpack.ExtType(1, b"x")}))
    answers = answers_until_closed(raw)
    assert [(a[0], a[2].get("code")) for a in answers] == [(3, None), (0, "too_large")]
    assert "max_ext_len" in answers[-1][2]["message"]
    with Client("127.0.0.1", secured.tcp_port, token=token()) as client:
        assert client.ranks("arena", ["ext"])["missing"] == ["ext"]


def test_malformed_and_refused_requests_before_auth_count_as_failures(secured):
    raw = Raw(secured.tcp_port)
    raw.send(wire.encode([2]) + wire.encode("x") + wire.request(4, "hello", {"version": 1}))
    answers = answers_until_closed(raw)
    assert [a[2]["code"] for a in answers] == ["bad_request"] * 2 + ["bad_request",
                                                                     "unauthorized"]
    assert answers[-1][0] == 0 and "too many" in answers[-1][2]["message"]
    raw.close()


def test_health_before_auth_is_bounded(secured):
    raw = Raw(secured.tcp_port)  # hello: the first of 8
    raw.send(b"".join(wire.request(i, "health", {}) for i in range(2, 12)))
    answers = answers_until_closed(raw)
    assert [a[0] for a in answers] == [*range(2, 9), 0]
    assert answers[-1][2]["code"] == "unauthorized" and "at most 8" in answers[-1][2]["message"]
    raw.close()
    # Hello, health, auth and what follows are within the bound.
    raw = Raw(secured.tcp_port)
    raw.send(wire.request(2, "health", {}) + wire.request(3, "auth", {"token": token()})
             + b"".join(wire.request(i, "get_board", {"board": "arena"}) for i in range(4, 9)))
    assert all(raw.receive()[1] == wire.OK for _ in range(2, 9))
    raw.close()


def test_a_session_ends_when_its_credential_expires(secured):
    # Expired 3 s ago: accepted within the 5 s leeway, so good for 2 s more.
    short = token("read write", expires_in=-3)
    raw = Raw(secured.tcp_port)
    raw.send(wire.request(2, "auth", {"token": short}))
    assert raw.receive()[1] == wire.OK
    started = time.monotonic()
    raw.send(wire.request(3, "health", {}))
    assert raw.receive()[1] == wire.OK
    time.sleep(max(0.0, 2.5 - (time.monotonic() - started)))
    # A plain submit (the native lane's path) after the expiry is not applied.
    with contextlib.suppress(OSError):
        raw.send(wire.request(4, "submit", {"board": "arena", "member": "late", "score": 1}))
    answers = answers_until_closed(raw)
    assert [(a[0], a[2]["code"]) for a in answers] == [(0, "unauthorized")], answers
    assert "expired" in answers[0][2]["message"]
    with Client("127.0.0.1", secured.tcp_port, token=token()) as client:
        assert client.ranks("arena", ["late"])["missing"] == ["late"]


def test_every_request_is_charged_even_health(secured):
    raw = Raw(secured.tcp_port)
    raw.send(wire.request(2, "auth", {"token": token("read")}))
    assert raw.receive()[1] == wire.OK
    raw.send(b"".join(wire.request(i, "health", {}) for i in range(3, 33)))
    codes = [raw.receive()[2].get("code", "ok") for _ in range(30)]
    assert codes.count("ok") <= 12 and "rate_limited" in codes, codes
    raw.close()


def test_hello_takes_out_of_order_as_a_boolean_granted_only_on_a_cluster_node(daemon):
    raw = Raw(daemon.tcp_port, hello=False)
    raw.send(wire.request(1, "hello", {"version": 1, "out_of_order": True}))
    request_id, status, body = raw.receive()
    assert (request_id, status) == (1, wire.OK) and "out_of_order" not in body, body
    raw.send(wire.request(2, "submit", {"board": "wins", "member": "ooo", "delta": 1}))
    assert raw.receive()[:2] == [2, wire.OK]
    raw.close()
    raw = Raw(daemon.tcp_port, hello=False)
    raw.send(wire.request(1, "hello", {"version": 1, "out_of_order": "yes"}))
    request_id, status, body = raw.receive()
    assert status == wire.ERROR and body["code"] == "invalid", body
    assert raw.closed_by_server()
    raw.close()
