"""The TCP port finishes what a client sent before its EOF: a client that
pipelines requests and half-closes gets every answer, in order; one that
closes at once gets them applied (read back from another connection)."""

from __future__ import annotations

import socket
import time
from typing import Any

import pytest

from daemon import Daemon
from rankd import wire
from rankd.client import Client, NotFound


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with Daemon(tmp_path_factory.mktemp("tcp-eof") / "data") as running:
        yield running


def _frames(board: str, count: int) -> tuple[bytes, dict[str, int]]:
    """Hello, then ``count`` requests: plain submits (the native lane),
    submits with event ids and reads (the general path), interleaved so the
    worker takes several turns; and the totals they leave."""
    frames = [wire.request(1, "hello", {"version": 1}),
              wire.request(2, "put_board", {"board": board, "config": {"policy": "sum"}})]
    totals: dict[str, int] = {}
    for i in range(3, count + 3):
        member = f"m{i % 40}"
        if i % 5 == 0:
            frames.append(wire.request(i, "member", {"board": board, "member": member}))
            continue
        args: dict[str, Any] = {"board": board, "member": member, "delta": 1}
        if i % 7 == 0:
            args["event_id"] = f"e{i}"
        frames.append(wire.request(i, "submit", args))
        totals[member] = totals.get(member, 0) + 1
    return b"".join(frames), totals


def _scores(port: int, board: str) -> dict[str, float]:
    with Client("127.0.0.1", port) as client:
        try:
            page = client.top(board, limit=1000)
        except NotFound:  # not made yet
            return {}
    return {entry["member"]: entry["score"] for entry in page["entries"]}


def test_half_closed_client_gets_every_answer(daemon):
    payload, totals = _frames("half", 3000)
    with socket.create_connection(("127.0.0.1", daemon.tcp_port), timeout=20) as sock:
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        decoder = wire.FrameDecoder()
        answers = []
        while chunk := sock.recv(1 << 16):
            answers.extend(decoder.feed(chunk))
    assert [answer[0] for answer in answers] == list(range(1, 3003))
    for request_id, status, body in answers:  # (a read may come before its member's submit)
        assert status == wire.OK or (request_id % 5 == 0 and body["code"] == "not_found")
    assert _scores(daemon.tcp_port, "half") == totals


def test_closed_client_has_its_requests_applied(daemon):
    payload, totals = _frames("full", 400)
    with socket.create_connection(("127.0.0.1", daemon.tcp_port), timeout=10) as sock:
        sock.sendall(payload)
    deadline = time.monotonic() + 10
    while (scores := _scores(daemon.tcp_port, "full")) != totals and time.monotonic() < deadline:
        time.sleep(0.05)
    assert scores == totals
