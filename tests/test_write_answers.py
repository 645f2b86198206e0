"""What REST and TCP answer a write, beside what reads show.

- A board RESP made keeps a ``-0`` score as Redis does
  (``rankd.engine.zeros``); REST and TCP reads show it as ``0``, and now so
  do a write's own answer (``score``, ``previous``), on every path (REST
  one and batch, TCP general and native).  RESP still keeps the sign.
- An HTTP request announcing ``Expect: 100-continue`` and a body over the
  limit is answered 413 at once, without the ``100 Continue`` that would
  invite the body.
"""

from __future__ import annotations

import json
import math
import socket

import pytest

from daemon import Daemon
from rankd import wire
from rankd.frontends.rest import MAX_BODY_BYTES
from respclient import RawClient


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with Daemon(tmp_path_factory.mktemp("answers") / "data", "--fsync", "no") as running:
        yield running


def _negative(value: float) -> bool:
    return value == 0 and math.copysign(1.0, value) < 0


def _minus_zero_board(daemon: Daemon, name: str) -> None:
    """A RESP board past Redis's listpack size (a skiplist) whose members
    ``z0``..``z3`` hold ``-0``."""
    with RawClient(daemon.resp_port) as client:
        client.call("ZADD", name, *(w for i in range(200) for w in (str(i + 1), f"m{i}")))
        client.call("ZADD", name, *(w for i in range(4) for w in ("-0", f"z{i}")))
        assert client.call("ZSCORE", name, "z0") == b"$2\r\n-0\r\n"


def _tcp(daemon: Daemon, requests: list[bytes]) -> list:
    with socket.create_connection(("127.0.0.1", daemon.tcp_port), timeout=10) as sock:
        sock.sendall(wire.request(1, "hello", {"version": 1}) + b"".join(requests))
        decoder = wire.FrameDecoder()
        answers: list = []
        while len(answers) < len(requests) + 1:
            answers.extend(decoder.feed(sock.recv(1 << 16)))
    return answers[1:]


def test_a_stored_minus_zero_shows_as_zero_in_write_answers(daemon):
    _minus_zero_board(daemon, "zeros")
    # REST, one submission: a 0 leaves the -0 stored (a score equal to it).
    status, answer = daemon.request("POST", "/v1/boards/zeros/scores",
                                    {"member": "z0", "score": 0})
    assert status == 200, answer
    assert answer["score"] == 0 and not _negative(answer["score"]), answer
    assert not _negative(answer["previous"]), answer
    status, body = daemon.request("POST", "/v1/boards/zeros/scores/batch",
                                  {"events": [{"member": "z1", "score": 0}]})
    assert status == 200, body
    (answer,) = body["results"]
    assert not _negative(answer["score"]) and not _negative(answer["previous"]), answer
    # TCP: a plain submit (the native encoder) and one with an event id.
    answers = _tcp(daemon, [
        wire.request(2, "submit", {"board": "zeros", "member": "z2", "score": 0}),
        wire.request(3, "submit", {"board": "zeros", "member": "z3", "score": 0,
                                   "event_id": "e3"})])
    for _, status, body in answers:
        assert status == wire.OK, body
        assert body["score"] == 0 and not _negative(body["score"]), body
        assert not _negative(body["previous"]), body
    # The stored zeros keep their sign: RESP reads them as Redis would.
    with RawClient(daemon.resp_port) as client:
        for member in ("z0", "z1", "z2", "z3"):
            assert client.call("ZSCORE", "zeros", member) == b"$2\r\n-0\r\n"
        # ZINCRBY adds to the previous score's sign, as Redis does.
        assert client.call("ZINCRBY", "zeros", "-0", "z0") == b"$2\r\n-0\r\n"


def _http(daemon: Daemon, head: bytes, timeout: float = 5.0) -> bytes:
    """Send a request head, and read what the server answers before it closes."""
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=timeout) as sock:
        sock.sendall(head)
        chunks = []
        try:
            while chunk := sock.recv(1 << 16):
                chunks.append(chunk)
        except TimeoutError:
            pass
    return b"".join(chunks)


def test_expect_continue_over_the_body_limit_is_refused_without_100(daemon):
    """Refused at once, and the connection closed (the body is never read)."""
    head = (b"POST /v1/boards/expect/scores/batch HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nExpect: 100-continue\r\n"
            b"Content-Length: %d\r\n\r\n" % (MAX_BODY_BYTES + 1))
    answer = _http(daemon, head)
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert b"100 Continue" not in answer
    body = answer.split(b"\r\n\r\n", 1)[1]
    assert json.loads(body)["error"]["code"] == "too_large"
    # Within the limit the client is invited to send the body, as before.
    payload = json.dumps({"member": "a", "score": 1}).encode()
    # (a Host the origin policy accepts: with another, the refusal may follow
    # the 100 at once, in the same read)
    head = (b"POST /v1/boards/expect/scores HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
            b"Content-Type: application/json\r\nExpect: 100-continue\r\n"
            b"Content-Length: %d\r\n\r\n" % (daemon.port, len(payload)))
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=5) as sock:
        sock.sendall(head)
        assert sock.recv(1 << 16) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(payload)
        assert sock.recv(1 << 16).startswith(b"HTTP/1.1 ")
