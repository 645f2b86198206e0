"""Pages of other sites and DNS rebinding: rankd answers browsers only from
its own origin and the origins it lists (CORS), and, without credentials,
only requests addressed to loopback.  Through raw HTTP against the daemon;
tests/test_browser.py drives the same rules from a real Chromium."""

from __future__ import annotations

import base64
import json
import os
import socket

import pytest

from daemon import Daemon
from rankd.frontends.origins import OriginPolicy, host_name, is_loopback_name, normalize_origin


def raw(daemon: Daemon, method: str, path: str, headers: dict[str, str],
        body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 exchange with exactly these headers (Host included)."""
    extra = [] if "Connection" in headers else ["Connection: close"]
    lines = [f"{method} {path} HTTP/1.1", *(f"{k}: {v}" for k, v in headers.items()),
             f"Content-Length: {len(body)}", *extra, "", ""]
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=10) as sock:
        sock.sendall("\r\n".join(lines).encode() + body)
        data = b""
        # A switched protocol (WebSocket) stays open: its head is the answer.
        while (chunk := sock.recv(65536)) and not (extra == [] and b"\r\n\r\n" in data + chunk):
            data += chunk
        data += chunk
    head, _, payload = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode().split("\r\n")
    answer = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        answer[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), answer, payload


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with Daemon(tmp_path_factory.mktemp("origins") / "data",
                "--cors-origins", "http://game.test:8080, https://play.example") as running:
        running.request("PUT", "/v1/boards/b", {"policy": "sum"})
        yield running


def own(daemon: Daemon) -> dict[str, str]:
    return {"Host": f"127.0.0.1:{daemon.port}", "Content-Type": "application/json"}


SUBMIT = json.dumps({"member": "x", "delta": 1}).encode()


def members(daemon: Daemon) -> int:
    return daemon.request("GET", "/v1/boards/b/top")[1]["total"]


def test_a_page_of_another_site_cannot_write_or_read(daemon):
    before = members(daemon)
    for origin in ("http://evil.example", "null", "http://127.0.0.1:1"):
        status, _, body = raw(daemon, "POST", "/v1/boards/b/scores",
                              {**own(daemon), "Origin": origin}, SUBMIT)
        assert status == 403 and b"--cors-origins" in body, (origin, body)
        status, _, _ = raw(daemon, "GET", "/v1/boards/b/top", {**own(daemon), "Origin": origin})
        assert status == 403
    assert members(daemon) == before


def test_the_live_feed_refuses_a_websocket_or_sse_from_another_site(daemon):
    key = base64.b64encode(os.urandom(16)).decode()
    upgrade = {**own(daemon), "Upgrade": "websocket", "Connection": "Upgrade",
               "Sec-WebSocket-Key": key, "Sec-WebSocket-Version": "13"}
    status, _, _ = raw(daemon, "GET", "/v1/boards/b/live", {**upgrade, "Origin": "http://evil.example"})
    assert status == 403
    status, _, _ = raw(daemon, "GET", "/v1/boards/b/events",
                       {**own(daemon), "Origin": "http://evil.example"})
    assert status == 403
    # rankd's own page may.
    status, _, _ = raw(daemon, "GET", "/v1/boards/b/live",
                       {**upgrade, "Origin": f"http://127.0.0.1:{daemon.port}"})
    assert status == 101


def test_requests_addressed_to_another_name_are_refused_without_credentials(daemon):
    """DNS rebinding: evil.example made to resolve to 127.0.0.1."""
    for host in (f"evil.example:{daemon.port}", "evil.example", "10.0.0.1", "[::2]:80"):
        status, _, body = raw(daemon, "GET", "/v1/boards/b/top", {"Host": host})
        assert status == 421 and b"DNS rebinding" in body, host
    for host in ("localhost", f"localhost:{daemon.port}", "127.0.0.1", "127.1.2.3:9",
                 "[::1]:7700", "app.localhost"):
        status, _, _ = raw(daemon, "GET", "/v1/boards/b/top", {"Host": host})
        assert status == 200, host


def test_listed_origins_get_cors_answers_and_preflights(daemon):
    preflight = {**own(daemon), "Origin": "http://game.test:8080",
                 "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "content-type, authorization"}
    status, headers, _ = raw(daemon, "OPTIONS", "/v1/boards/b/scores", preflight)
    assert status == 204
    assert headers["access-control-allow-origin"] == "http://game.test:8080"
    assert "POST" in headers["access-control-allow-methods"]
    assert "Authorization" in headers["access-control-allow-headers"]
    status, headers, _ = raw(daemon, "POST", "/v1/boards/b/scores",
                             {**own(daemon), "Origin": "https://play.example:443"}, SUBMIT)
    assert status == 200 and headers["access-control-allow-origin"] == "https://play.example:443"
    assert headers["vary"] == "Origin"
    # Errors carry the headers too, so the page can read them.
    status, headers, _ = raw(daemon, "GET", "/v1/boards/nosuch/top",
                             {**own(daemon), "Origin": "http://game.test:8080"})
    assert status == 404 and "access-control-allow-origin" in headers
    # No CORS headers for requests without an origin, nor preflights of others.
    status, headers, _ = raw(daemon, "GET", "/v1/boards/b/top", own(daemon))
    assert status == 200 and "access-control-allow-origin" not in headers
    status, _, _ = raw(daemon, "OPTIONS", "/v1/boards/b/scores",
                       {**preflight, "Origin": "http://other.test"})
    assert status == 403


def test_origin_rules():
    assert normalize_origin("HTTPS://Play.Example:443/") == "https://play.example"
    assert normalize_origin("http://[::1]:80") == "http://[::1]"
    for bad in ("play.example", "http://x/path", "ftp://x", "http://", "http://u@x"):
        with pytest.raises(ValueError):
            normalize_origin(bad)
    assert [host_name(h) for h in ("a:1", "[::1]:7", "::1", "B")] == ["a", "::1", "::1", "b"]
    assert is_loopback_name("127.9.9.9") and is_loopback_name("x.localhost")
    assert not is_loopback_name("localhost.evil.example") and not is_loopback_name("")
    policy = OriginPolicy.parse(["http://a.test"], loopback_only=True)
    assert policy.origin_refused("http://a.test:80", "http", "x") is None
    assert policy.origin_refused(None, "http", "x") is None
    assert policy.origin_refused("http://b.test", "http", "b.test:80") is None  # same origin
    assert policy.origin_refused("http://b.test", "https", "b.test") is not None


def test_a_bad_cors_origin_is_refused_at_start(tmp_path):
    import subprocess
    import sys

    from daemon import SRC

    done = subprocess.run([sys.executable, "-m", "rankd.cli", "serve", "--cors-origins",
                           "game.test/path", "--data-dir", str(tmp_path / "d")],
                          env={**os.environ, "PYTHONPATH": str(SRC)}, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "--cors-origins" in done.stderr
