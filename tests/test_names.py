"""What names may hold: members, labels and event ids refuse control and
invisible formatting characters on every path (REST, the TCP protocol's
native fast path and its general one), board names refuse them too, and
``.`` and ``..``, and what is allowed (accents, emoji sequences) still
works."""

from __future__ import annotations

import time

import pytest

from daemon import Daemon
from rankd.client import Client, InvalidInput

REFUSED = ["\x00", "\x01", "\n", "\x1f", "\x7f", "\x85", "\x9f", "\u200b", "\u2028", "\u2029",
           "\u202a", "\u202e", "\u2060", "\u2064", "\u2066", "\u2069", "\ufeff"]
ALLOWED = ["é", "Zoë", "名前", "👨\u200d👩\u200d👧", "\u200c", "\u200e", " "]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with Daemon(tmp_path_factory.mktemp("names") / "data") as running:
        for board, policy in (("n", "sum"), ("l", "latest")):
            status, _ = running.request("PUT", f"/v1/boards/{board}", {"policy": policy})
            assert status == 201
        yield running


def count(daemon) -> int:
    return daemon.request("GET", "/v1/boards/n/top?limit=1")[1]["total"]


@pytest.mark.parametrize("char", REFUSED, ids=[f"U+{ord(c):04X}" for c in REFUSED])
@pytest.mark.parametrize("field", ["member", "label", "event_id"])
def test_refused_characters_are_refused_over_rest_and_tcp(daemon, char, field):
    before = count(daemon)
    event = {"member": "plain", "delta": 1, field: f"x{char}y"}
    status, answer = daemon.request("POST", "/v1/boards/n/scores", event)
    assert status == 422 and f"U+{ord(char):04X}" in answer["error"]["message"], answer
    status, answer = daemon.request("POST", "/v1/boards/n/scores/batch", {"events": [event]})
    assert status == 200 and answer["results"][0]["error"]["code"] == "invalid"
    with Client("127.0.0.1", daemon.tcp_port) as client:
        # With and without a ts: the native kernel takes only the second.
        for extra in ({}, {"ts": time.time()}):
            with pytest.raises(InvalidInput, match=f"U\\+{ord(char):04X}"):
                client.submit("n", **{**event, **extra})
    assert count(daemon) == before


@pytest.mark.parametrize("text", ALLOWED)
def test_accents_scripts_and_emoji_sequences_are_names(daemon, text):
    status, answer = daemon.request("POST", "/v1/boards/l/scores",
                                    {"member": f"m{text}", "score": 1, "label": text,
                                     "event_id": f"e{text}"})
    assert status == 200 and answer["member"] == f"m{text}", answer
    with Client("127.0.0.1", daemon.tcp_port) as client:
        assert client.submit("l", f"t{text}", score=2, label=text)["member"] == f"t{text}"


@pytest.mark.parametrize("name", [".", "..", "board\n", "", "a\x00b", "a\u202eb",
                                  "x" * 513, "é" * 257])
def test_board_names_that_are_dot_segments_lines_or_too_long_are_refused(daemon, name):
    from urllib.parse import quote

    status, answer = daemon.request("PUT", f"/v1/boards/{quote(name, safe='')}", {})
    assert status in (404, 422), answer
    with Client("127.0.0.1", daemon.tcp_port) as client, pytest.raises(InvalidInput):
        client.put_board(name, {})
