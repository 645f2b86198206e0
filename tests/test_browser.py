"""The live page in a real headless Chromium, against the real daemon.

Needs Debian's ``chromium`` and the ``playwright`` package (its driver only:
the system browser is used).  Skipped when either is missing, except under
``RANKD_REQUIRE_BROWSER=1`` (CI sets it), where that is a failure.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from daemon import Daemon

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
CLIENT_MODULE = Path(__file__).resolve().parent.parent / "clients" / "js" / "src" / "index.js"
CHROMIUM_FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]


def _browser_or_skip() -> tuple[object, str]:
    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    if executable is None or sync_playwright is None:
        reason = "needs Debian's chromium and the playwright package"
        if os.environ.get("RANKD_REQUIRE_BROWSER", "") not in ("", "0"):
            pytest.fail(f"browser tests are required: {reason}")
        pytest.skip(reason)
    return sync_playwright, executable


def test_live_page_shows_scores_changing_and_a_followed_member(tmp_path):
    sync_playwright, executable = _browser_or_skip()
    with Daemon(tmp_path / "data", "--live-interval", "0.1") as daemon:
        daemon.request("PUT", "/v1/boards/arena", {"policy": "sum", "windows": ["all", "daily"]})
        daemon.request("POST", "/v1/boards/arena/scores/batch", {"events": [
            {"member": f"player{i}", "delta": 10 * i, "label": f"Player {i}"}
            for i in range(1, 13)]})
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=executable,
                                                 args=CHROMIUM_FLAGS)
            try:
                page = browser.new_page(viewport={"width": 390, "height": 844})  # a phone
                page.goto(f"{daemon.url}/?board=arena")
                page.wait_for_selector("#state.live", timeout=15_000)
                page.wait_for_function(
                    "document.querySelectorAll('#top tbody tr').length === 10")
                first = page.inner_text("#top tbody tr:first-child td.member")
                assert first == "Player 12"

                # A submission over REST moves player3 from 10th to first on the page.
                daemon.request("POST", "/v1/boards/arena/scores",
                               {"member": "player3", "delta": 500})
                page.wait_for_function(
                    "document.querySelector('#top tbody tr td.member').textContent"
                    " === 'Player 3'", timeout=10_000)
                assert page.inner_text("#top tbody tr:first-child td.move") == "▲9"

                # Follow a member: their rank shows, and moves live.
                page.fill("#follow-name", "player5")
                page.click("#follow-form button")
                page.wait_for_function(
                    "document.querySelector('#followed').textContent.includes('rank 9')",
                    timeout=10_000)
                daemon.request("POST", "/v1/boards/arena/scores",
                               {"member": "player5", "delta": 1000})
                page.wait_for_function(
                    "document.querySelector('#followed').textContent.includes('rank 1')",
                    timeout=10_000)
                page.wait_for_selector("#around tr.me", timeout=10_000)
                ARTIFACTS.mkdir(exist_ok=True)
                page.screenshot(path=str(ARTIFACTS / "live-page.png"), full_page=True)
                # Readable at phone width: nothing wider than the viewport.
                assert page.evaluate("document.documentElement.scrollWidth") <= 390
            finally:
                browser.close()
    assert (ARTIFACTS / "live-page.png").stat().st_size > 10_000


CALLER_PAGE = """<!doctype html><title>waiting</title><script>
fetch(%(rankd)s + "/v1/boards/arena/scores", {method: "POST",
      headers: {"Content-Type": "application/json"},
      body: JSON.stringify({member: %(member)s, delta: 1})})
  .then(async (r) => { document.title = "status " + r.status + " " + (await r.json()).score; })
  .catch(() => { document.title = "blocked"; });
</script>"""


def _page_server():
    """A static page on its own loopback port, so its own origin; the page
    is what ``server.html`` holds when asked."""
    import http.server
    import threading

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/rankd.js":  # the JavaScript client, as a web game would ship it
                body, kind = CLIENT_MODULE.read_bytes(), "text/javascript"
            else:
                body, kind = self.server.html.encode(), "text/html"
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    server.html = ""
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_game_on_another_origin_calls_rankd_only_when_listed(tmp_path):
    """CORS in a real browser: a page of a listed origin submits (its
    preflight is answered); a page of another origin is stopped at the
    preflight, and nothing it sent is applied."""
    import json

    sync_playwright, executable = _browser_or_skip()
    allowed, other = _page_server(), _page_server()
    try:
        allowed_origin = f"http://127.0.0.1:{allowed.server_address[1]}"
        with Daemon(tmp_path / "data", "--cors-origins", allowed_origin) as daemon:
            daemon.request("PUT", "/v1/boards/arena", {"policy": "sum"})
            titles = {}
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=executable,
                                                     args=CHROMIUM_FLAGS)
                try:
                    for server, member in ((allowed, "from-allowed"), (other, "from-other")):
                        server.html = CALLER_PAGE % {"rankd": json.dumps(daemon.url),
                                                     "member": json.dumps(member)}
                        page = browser.new_page()
                        page.goto(f"http://127.0.0.1:{server.server_address[1]}/")
                        page.wait_for_function("document.title !== 'waiting'", timeout=10_000)
                        titles[member] = page.title()
                finally:
                    browser.close()
            assert titles == {"from-allowed": "status 200 1", "from-other": "blocked"}
            assert daemon.request("GET", "/v1/boards/arena/members/from-other")[0] == 404
            status, standing = daemon.request("GET", "/v1/boards/arena/members/from-allowed")
            assert status == 200 and standing["score"] == 1
    finally:
        allowed.shutdown()
        other.shutdown()


GAME_PAGE = """<!doctype html><title>game</title><script type="module">
import { Rankd } from "./rankd.js";
const rankd = new Rankd({ url: %(rankd)s });
const board = rankd.board("arena");
window.seen = { websocket: [], sse: [], errors: [] };
window.states = {};
for (const transport of ["websocket", "sse"]) {
  const feed = board.live({ limit: 3, follow: ["ann"], transport });
  feed.on("state", (state) => { window.states[transport] = state; });
  feed.on("top", (m) => window.seen[transport].push(m.top.map((e) => e.member).join(",")));
  feed.on("member", (m) => window.seen[transport].push(m.member + "#" + m.rank));
  feed.on("error", (e) => window.seen.errors.push(transport + ":" + e.code));
}
window.submit = (member, delta) => board.submit({ member, delta })
  .then((r) => r.score, (e) => e.name + " " + e.code);
document.title = "ready";
</script>"""


def test_the_javascript_client_in_a_page_of_another_origin(tmp_path):
    """The client as a web game uses it: imported by a page of its own origin,
    reading the live feed (WebSocket and Server-Sent Events) and submitting
    over CORS; a page of an origin rankd does not list gets nothing."""
    import json

    sync_playwright, executable = _browser_or_skip()
    allowed, other = _page_server(), _page_server()
    try:
        allowed_origin = f"http://127.0.0.1:{allowed.server_address[1]}"
        with Daemon(tmp_path / "data", "--cors-origins", allowed_origin,
                    "--live-interval", "0.05") as daemon, sync_playwright() as playwright:
            daemon.request("PUT", "/v1/boards/arena", {"policy": "sum"})
            daemon.request("POST", "/v1/boards/arena/scores/batch", {"events": [
                {"member": name, "delta": score} for name, score in
                (("bob", 30), ("cy", 20), ("ann", 10), ("dee", 5))]})
            browser = playwright.chromium.launch(executable_path=executable,
                                                 args=CHROMIUM_FLAGS)
            try:
                for server in (allowed, other):
                    server.html = GAME_PAGE % {"rankd": json.dumps(daemon.url)}
                page = browser.new_page()
                page.goto(f"{allowed_origin}/")
                page.wait_for_function("window.states && window.states.websocket === 'live'"
                                       " && window.states.sse === 'live'", timeout=15_000)
                assert page.evaluate("submit('ann', 100)") == 110
                for transport in ("websocket", "sse"):
                    page.wait_for_function(
                        f"window.seen.{transport}.includes('ann,bob,cy')"
                        f" && window.seen.{transport}.includes('ann#1')", timeout=10_000)
                seen = page.evaluate("window.seen")
                assert seen["websocket"][:2] == ["bob,cy,ann", "ann#3"] or \
                    seen["websocket"][:2] == ["ann#3", "bob,cy,ann"], seen
                assert seen["errors"] == [], seen

                stranger = browser.new_page()
                stranger.goto(f"http://127.0.0.1:{other.server_address[1]}/")
                stranger.wait_for_function("document.title === 'ready'")
                assert stranger.evaluate("submit('eve', 1)") == "ConnectionFailed connection"
                stranger.wait_for_function("window.seen.errors.length >= 2", timeout=15_000)
                states = stranger.evaluate("window.states")
                assert "live" not in states.values(), states
                assert stranger.evaluate("window.seen.websocket.concat(window.seen.sse)") == []
            finally:
                browser.close()
            assert daemon.request("GET", "/v1/boards/arena/members/eve")[0] == 404
    finally:
        allowed.shutdown()
        other.shutdown()


def test_the_page_returns_to_live_after_a_restart_and_keeps_its_view_in_the_url(tmp_path):
    """It once stayed on REST polling for good after a daemon restart, showed
    another board for /?board=nosuch, forgot the window and rows on reload,
    and could not follow a member by the name it shows."""
    sync_playwright, executable = _browser_or_skip()
    data = tmp_path / "data"
    daemon = Daemon(data, "--live-interval", "0.1").start()
    port, tcp_port = daemon.port, daemon.tcp_port
    try:
        daemon.request("PUT", "/v1/boards/arena", {"policy": "sum", "windows": ["all", "daily"]})
        daemon.request("POST", "/v1/boards/arena/scores/batch", {"events": [
            {"member": f"p{i}", "delta": 10 * i, "label": f"Player {i}"} for i in range(1, 13)]})
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=executable,
                                                 args=CHROMIUM_FLAGS)
            try:
                page = browser.new_page()
                page.goto(f"{daemon.url}/?board=nosuch")
                page.wait_for_function("!document.querySelector('#notice').hidden")
                assert "no board named “nosuch”" in page.inner_text("#notice")
                assert page.query_selector_all("#top tbody tr") == []

                page.goto(f"{daemon.url}/?board=arena&window=daily&limit=25")
                page.wait_for_selector("#state.live", timeout=15_000)
                assert page.input_value("#window") == "daily"
                assert page.input_value("#limit") == "25"
                page.wait_for_function(
                    "document.querySelectorAll('#top tbody tr').length === 12")
                # Follow by the label the page shows, and by a click on a row.
                page.fill("#follow-name", "Player 5")
                page.click("#follow-form button")
                page.wait_for_function(
                    "document.querySelector('#followed').textContent.startsWith('p5: rank')",
                    timeout=10_000)
                assert "follow=p5" in page.url and "window=daily" in page.url
                page.click("#top tbody tr:nth-child(2)")
                page.wait_for_function(
                    "document.querySelector('#followed').textContent.startsWith('p11')",
                    timeout=10_000)

                # The daemon goes away; the page notices, then comes back live.
                daemon.stop()
                page.wait_for_function(
                    "!document.querySelector('#state').classList.contains('live')",
                    timeout=15_000)
                daemon = Daemon(data, "--live-interval", "0.1")
                daemon.port, daemon.tcp_port = port, tcp_port
                daemon.start()
                page.wait_for_selector("#state.live", timeout=45_000)
                daemon.request("POST", "/v1/boards/arena/scores",
                               {"member": "p1", "delta": 1000})
                page.wait_for_function(
                    "document.querySelector('#top tbody tr td.member').textContent"
                    " === 'Player 1'", timeout=10_000)
                page.reload()
                page.wait_for_selector("#state.live", timeout=15_000)
                assert page.input_value("#window") == "daily"
                page.wait_for_function(
                    "document.querySelector('#followed').textContent.startsWith('p11')",
                    timeout=10_000)
            finally:
                browser.close()
    finally:
        daemon.stop()


def test_the_page_asks_for_a_token_on_a_server_with_credentials(tmp_path):
    sync_playwright, executable = _browser_or_skip()
    secret = "page-secret-" + "z" * 30
    with Daemon(tmp_path / "data", "--jwt-secret", secret) as daemon, \
            sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page()
            page.goto(daemon.url + "/")
            page.wait_for_selector("#token-form:not([hidden])", timeout=10_000)
            assert "needs a read token" in page.inner_text("#notice")
            assert "no boards yet" not in page.inner_text("#state")
        finally:
            browser.close()
