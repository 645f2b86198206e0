"""Fuzzing: random and mutated frames at the TCP decoder and server, random
requests at REST.  Every input must get an error or a valid answer, never a
crash or a hang, and rejected input must leave the state unchanged (checked
with the engine's digest before and after)."""

from __future__ import annotations

import itertools
import json
import random
import socket
import urllib.parse
from pathlib import Path

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daemon import Daemon
from rankd import wire

VECTORS = json.loads((Path(__file__).parent.parent / "protocol" / "vectors.json").read_text())
FUZZ = settings(max_examples=300, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])

msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**64), 2**64 - 1) | st.floats()
    | st.text(max_size=40) | st.binary(max_size=40),
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=20)


@FUZZ
@given(st.binary(max_size=2048))
def test_decoder_turns_any_bytes_into_messages_or_a_frame_error(data):
    try:
        wire.FrameDecoder().feed(data)
    except wire.FrameError as exc:
        assert exc.code in ("bad_frame", "too_large")


@FUZZ
@given(msgpack_values)
def test_any_msgpack_value_round_trips_through_a_frame(value):
    try:
        frame = wire.encode(value)
    except (ValueError, OverflowError):
        return  # e.g. an integer msgpack cannot carry
    decoded = wire.FrameDecoder().feed(frame)
    assert len(decoded) == 1
    assert msgpack.packb(decoded[0]) == msgpack.packb(msgpack.unpackb(
        msgpack.packb(value, use_bin_type=True), raw=False))


@FUZZ
@given(st.lists(st.lists(st.integers(0, 2**32) | st.text(max_size=30), max_size=4),
                min_size=1, max_size=8),
       st.lists(st.integers(0, 400), max_size=10))
def test_a_stream_cut_anywhere_decodes_to_the_same_messages(messages, cuts):
    stream = b"".join(wire.encode(message) for message in messages)
    bounds = sorted({0, len(stream), *(cut % (len(stream) + 1) for cut in cuts)})
    decoder = wire.FrameDecoder()
    decoded = []
    for start, stop in itertools.pairwise(bounds):
        decoded += decoder.feed(stream[start:stop])
    assert decoded == messages
    assert decoder.pending_bytes == 0


@FUZZ
@given(msgpack_values)
def test_parse_request_accepts_or_refuses_cleanly(value):
    try:
        request_id, op, args = wire.parse_request(value)
    except wire.RequestShapeError as exc:
        assert 0 <= exc.request_id <= wire.MAX_ID
        return
    assert 1 <= request_id <= wire.MAX_ID and isinstance(op, str) and isinstance(args, dict)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with Daemon(tmp_path_factory.mktemp("fuzz") / "data") as running:
        running.request("PUT", "/v1/boards/fz", {"policy": "sum", "windows": ["all", "daily"]})
        running.request("POST", "/v1/boards/fz/scores/batch", {
            "events": [{"member": f"m{i}", "delta": i} for i in range(50)]})
        yield running


def digest(daemon: Daemon) -> str:
    return daemon.request("GET", "/v1/admin/digest")[1]["digest"]


def mutate(data: bytes, rng: random.Random) -> bytes:
    data = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        choice = rng.random()
        if choice < 0.4 and data:
            data[rng.randrange(len(data))] = rng.randrange(256)
        elif choice < 0.6 and data:
            del data[rng.randrange(len(data))]
        elif choice < 0.8:
            data.insert(rng.randrange(len(data) + 1), rng.randrange(256))
        else:
            data += rng.randbytes(rng.randint(1, 16))
    return bytes(data)


READ_ONLY_REQUESTS = [
    wire.request(7, "top", {"board": "fz", "limit": 5}),
    wire.request(8, "member", {"board": "fz", "member": "m3"}),
    wire.request(9, "around", {"board": "fz", "member": "m3", "above": 2}),
    wire.request(10, "ranks", {"board": "fz", "members": ["m1", "m2"]}),
    wire.request(11, "periods", {"board": "fz", "window": "daily"}),
    *(bytes.fromhex(v["hex"]) for v in VECTORS["malformed"]),
]


#: The id of the ``health`` request sent after each payload: once it is
#: answered, everything before it was (no wait for the server to go quiet).
LAST_ID = 2**31 - 1


def exchange(port: int, payload: bytes) -> list:
    """Say hello, send ``payload`` and a ``health``, read until that is
    answered, the server closes, or it goes quiet (a payload cut short
    swallows the health request)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(wire.request(1, "hello", {"version": 1}) + payload
                     + wire.request(LAST_ID, "health", {}))
        sock.settimeout(0.3)
        decoder = wire.FrameDecoder()
        answers = []
        try:
            while chunk := sock.recv(65536):
                answers += decoder.feed(chunk)
                if answers and wire.parse_response(answers[-1])[0] == LAST_ID:
                    break
        except TimeoutError:
            pass
        return answers


def test_mutated_frames_never_crash_the_server_or_change_state(daemon):
    rng = random.Random(2026)
    before = digest(daemon)
    cases = 0
    for _ in range(400):
        payload = mutate(rng.choice(READ_ONLY_REQUESTS), rng)
        if rng.random() < 0.2:
            payload = rng.randbytes(rng.randint(1, 300))
        answers = exchange(daemon.tcp_port, payload)
        assert answers and answers[0][1] == wire.OK  # hello always answered
        for answer in answers[1:]:
            _, ok, body = wire.parse_response(answer)
            assert ok or (isinstance(body["code"], str) and body["message"])
        cases += 1
    assert digest(daemon) == before
    assert daemon.process.poll() is None
    assert daemon.request("GET", "/v1/health")[0] == 200
    print(f"{cases} mutated TCP exchanges")


paths = st.sampled_from([
    "/v1/boards/fz", "/v1/boards/fz/top", "/v1/boards/fz/members/m1",
    "/v1/boards/fz/members/m1/around", "/v1/boards/fz/ranks", "/v1/boards/fz/periods",
    "/v1/boards/fz/scores", "/v1/boards/fz/scores/batch", "/v1/boards", "/v1/health",
    "/v1/boards/%00", "/v1/boards/fz/members/%FF%FE", "/v1/" + "a" * 3000, "/v1/boards/fz//top",
])
queries = st.dictionaries(st.sampled_from(["limit", "offset", "window", "period", "above",
                                           "below", "x", "members"]),
                          st.text(max_size=12), max_size=3)
bodies = st.one_of(st.none(), st.binary(max_size=200),
                   st.recursive(st.none() | st.booleans() | st.floats() | st.integers()
                                | st.text(max_size=20),
                                lambda c: st.lists(c, max_size=4)
                                | st.dictionaries(st.sampled_from(
                                    ["member", "score", "delta", "event_id", "ts", "label",
                                     "events", "members", "order", "policy", "x"]),
                                    c, max_size=4), max_leaves=12).map(
                       lambda v: json.dumps(v).encode()))


@settings(max_examples=250, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH"]), path=paths,
       query=queries, body=bodies)
def test_random_rest_requests_get_an_answer_and_rejections_change_nothing(
        daemon, method, path, query, body):
    before = digest(daemon)
    target = path + ("?" + urllib.parse.urlencode(query) if query else "")
    try:
        status, answer = daemon.request(method, target, raw=body)
    except json.JSONDecodeError:
        pytest.fail(f"{method} {target} answered something that is not JSON")
    assert 200 <= status < 500, (method, target, status, answer)
    if status >= 400:
        assert set(answer) == {"error"} and answer["error"]["message"]
        assert digest(daemon) == before, (method, target, body)
    assert daemon.process.poll() is None
