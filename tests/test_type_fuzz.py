"""Every field of every REST route, TCP operation and live-feed message,
given values of every other type: each must be refused with a 4xx answer or
an error frame, the connection must stay usable, the daemon must keep
serving, and its state digest must not change.  (Once a list as a board
name aborted the TCP connection, nested members closed the WebSocket with
1006, and ``/static/%00.js`` answered 500.)"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import urllib.parse

import aiohttp
import msgpack
import pytest

from daemon import Daemon
from rankd import wire
from rankd.frontends.tcp import OPERATIONS

#: One value of each JSON/msgpack type, and some of their edge cases.
VALUES = [None, True, False, 0, -1, 1.5, "x", "", [], ["x"], [[1]], {}, {"a": 1}]

NUMBER, TEXT, ANY_TEXT, INT, BOOL, DICT, LIST, TEXT_LIST = (
    "number", "text", "any text", "int", "bool", "dict", "list", "text list")
FIELD_TYPES = {"board": TEXT, "member": TEXT, "members": TEXT_LIST, "config": DICT,
               "limit": INT, "offset": INT, "above": INT, "below": INT, "window": TEXT,
               "period": TEXT, "events": LIST, "discard": BOOL, "score": NUMBER,
               "delta": NUMBER, "event_id": TEXT, "ts": NUMBER, "label": ANY_TEXT}
#: Valid arguments of each operation (never sent as they are).
BASE = {
    "health": {}, "list_boards": {}, "get_board": {"board": "fz"},
    "put_board": {"board": "fz-new", "config": {}},
    "patch_board": {"board": "fz", "config": {}},
    "delete_board": {"board": "fz"},
    "submit_many": {"events": [{"board": "fz", "member": "m", "delta": 1}]},
    "top": {"board": "fz"}, "member": {"board": "fz", "member": "m0"},
    "around": {"board": "fz", "member": "m0"}, "ranks": {"board": "fz", "members": ["m0"]},
    "remove_member": {"board": "fz", "member": "m0"}, "periods": {"board": "fz"},
    "submit": {"board": "fz", "member": "m0", "delta": 1},
}
WRITES = {"put_board", "patch_board", "delete_board", "submit_many", "remove_member", "submit"}


def wrong_values(kind: str, required: bool) -> list:
    """Values not of ``kind``; no ``None`` for an optional field (it means absent)."""
    def fits(value) -> bool:
        if value is None:
            return not required
        if kind == NUMBER:
            return type(value) in (int, float)
        if kind == INT:
            return type(value) is int
        if kind == BOOL:
            return type(value) is bool
        if kind == TEXT:
            return type(value) is str and value != ""  # "" is wrong for every name
        if kind == ANY_TEXT:
            return type(value) is str  # a label may be empty
        if kind == DICT:
            return type(value) is dict
        if kind == LIST:
            return type(value) is list and value == []  # [] is a valid empty batch
        return type(value) is list and all(type(v) is str for v in value)
    return [v for v in VALUES if not fits(v)]


def cases() -> list[tuple[str, str, object]]:
    found = []
    for op, (required, optional, _) in {**OPERATIONS, "submit": (
            {"board", "member"}, {"score", "delta", "event_id", "ts", "label"}, None)}.items():
        for name in sorted(required | optional):
            if name in FIELD_TYPES:
                found.extend((op, name, value)
                             for value in wrong_values(FIELD_TYPES[name], name in required))
    return found


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with Daemon(tmp_path_factory.mktemp("typefuzz") / "data") as running:
        running.request("PUT", "/v1/boards/fz", {"policy": "sum", "windows": ["all", "daily"]})
        running.request("POST", "/v1/boards/fz/scores/batch", {"events": [
            {"member": f"m{i}", "delta": i, "event_id": f"e{i}"} for i in range(20)]})
        yield running


def digest(daemon: Daemon) -> str:
    return daemon.request("GET", "/v1/admin/digest")[1]["digest"]


def test_every_tcp_operation_refuses_every_wrong_type(daemon):
    before = digest(daemon)
    requests = cases()
    assert len(requests) > 300
    sock = socket.create_connection(("127.0.0.1", daemon.tcp_port), timeout=30)
    decoder = wire.FrameDecoder()

    def call(request_id: int, op: str, args: dict):
        payload = msgpack.packb([request_id, op, args])
        sock.sendall(struct.pack(">I", len(payload)) + payload)
        while True:
            data = sock.recv(1 << 16)
            assert data, f"the server closed the connection on {op} {args}"
            answers = decoder.feed(data)
            if answers:
                assert len(answers) == 1
                return answers[0]

    assert call(1, "hello", {"version": wire.VERSION})[1] == 0
    accepted = []
    for request_id, (op, name, value) in enumerate(requests, 2):
        answer = call(request_id, op, {**BASE[op], name: value})
        assert answer[0] == request_id, (op, name, value, answer)
        if op == "submit_many" and answer[1] == 0:  # refused event by event
            assert all("error" in result for result in answer[2]["results"]), answer
        elif answer[1] == 0:
            accepted.append((op, name, value))
        else:
            assert answer[2]["code"] not in ("internal",), (op, name, value, answer)
    # Only reads may take an odd value (an optional view field left as a
    # default); a write never does.
    assert not [case for case in accepted if case[0] in WRITES], accepted
    assert call(10**6, "health", {})[1] == 0  # the same connection still serves
    sock.close()
    assert digest(daemon) == before


def rest_cases() -> list[tuple[str, str, object]]:
    """(method, path, body) with one wrong-typed field each."""
    board_fields = {"order": TEXT, "policy": TEXT, "tie_break": TEXT, "windows": TEXT_LIST,
                    "retain": INT, "min_score": NUMBER, "max_score": NUMBER,
                    "max_delta": NUMBER, "signed": BOOL}
    submit_fields = {"member": TEXT, "delta": NUMBER, "event_id": TEXT, "ts": NUMBER,
                     "label": ANY_TEXT, "score": NUMBER}
    found = []
    for method in ("PUT", "PATCH"):
        for name, kind in board_fields.items():
            found += [(method, "/v1/boards/fz", {name: v})
                      for v in wrong_values(kind, True) if v is not None]
    for name, kind in submit_fields.items():
        base = {"member": "m1", "delta": 1}
        for value in wrong_values(kind, name == "member"):
            found.append(("POST", "/v1/boards/fz/scores", {**base, name: value}))
    for value in wrong_values(LIST, True):
        found.append(("POST", "/v1/boards/fz/scores/batch", {"events": value}))
        found.append(("POST", "/v1/boards/fz/scores/batch", {"events": [value]}))
    for value in wrong_values(TEXT_LIST, True):
        found.append(("POST", "/v1/boards/fz/ranks", {"members": value}))
    for value in VALUES:  # a body of each type where an object is expected
        if not isinstance(value, dict) or value:
            found += [("PUT", "/v1/boards/fz", value), ("POST", "/v1/boards/fz/scores", value)]
    return found


QUERIES = ["/v1/boards/fz/top?limit=x", "/v1/boards/fz/top?limit=1.5",
           "/v1/boards/fz/top?offset=-3", "/v1/boards/fz/top?window=nosuch",
           "/v1/boards/fz/top?period=", "/v1/boards/fz/top?period=x",
           "/v1/boards/fz/members/m1/around?above=x", "/v1/boards/fz/members/%00",
           "/v1/boards/%00/top", "/v1/boards/..", "/static/%00.js", "/static/..%2F..%2Fetc",
           "/v1/boards/fz/top?limit=1&limit=2", "/v1/boards/" + "x" * 300]


def test_every_rest_route_refuses_every_wrong_type(daemon):
    before = digest(daemon)
    requests = rest_cases()
    assert len(requests) > 100
    for method, path, body in requests:
        status, answer = daemon.request(method, path, body)
        if path.endswith("/batch") and status == 200:
            assert all("error" in r for r in answer["results"]), (body, answer)
            continue
        assert 400 <= status < 500 and "error" in answer, (method, path, body, status, answer)
    for path in QUERIES:
        status, _ = daemon.request("GET", path)
        assert 400 <= status < 500, (path, status)
    assert daemon.request("GET", "/v1/health")[0] == 200
    assert digest(daemon) == before


def test_every_live_feed_message_of_a_wrong_shape_is_an_error_message(daemon):
    url = f"ws://127.0.0.1:{daemon.port}/v1/boards/fz/live"
    messages = ["not json", "[]", "1", json.dumps({"action": "follow"}),
                json.dumps({"action": "dance", "members": ["m1"]})]
    for action in ("follow", "unfollow"):
        messages += [json.dumps({"action": action, "members": value})
                     for value in wrong_values(TEXT_LIST, True)]
        messages += [json.dumps({"action": action, "members": ["m1", bad]})
                     for bad in ("", "x\x00y", "z" * 300)]
        messages.append(json.dumps({"action": action, "members": ["m"] * 101}))
    messages += [json.dumps({"action": value, "members": ["m1"]}) for value in VALUES]

    async def scenario() -> list:
        errors = []
        async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
            await ws.receive_json(timeout=10)  # the first push
            for message in messages:
                await ws.send_str(message)
                while True:
                    answer = await ws.receive_json(timeout=10)
                    if answer.get("type") == "error":
                        errors.append(answer)
                        break
            await ws.send_bytes(b"\x00\x01")
            errors.append(await ws.receive_json(timeout=10))
            # Still open and following.
            await ws.send_str(json.dumps({"action": "follow", "members": ["m3"]}))
            followed = await ws.receive_json(timeout=10)
            return errors, followed, ws.closed

    errors, followed, closed = asyncio.run(scenario())
    assert len(errors) == len(messages) + 1
    assert all(e["code"] == "invalid" for e in errors), errors
    assert followed.get("member") == "m3" and not closed


def test_paths_and_names_are_quoted_in_errors(daemon):
    name = urllib.parse.quote("<script>", safe="")
    status, answer = daemon.request("GET", f"/v1/boards/{name}/top")
    assert status in (404, 422) and "<script>" in answer["error"]["message"]
