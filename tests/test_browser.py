"""The live page in a real headless Chromium, against the real daemon.

Needs Debian's ``chromium`` and the ``playwright`` package (its driver only:
the system browser is used).  Skipped when either is missing, except under
``RANKD_REQUIRE_BROWSER=1`` (CI sets it), where that is a failure.
"""

from __future__ import annotations

import contextlib
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


AXE = Path(__file__).resolve().parent.parent / "clients" / "js" / "node_modules" / "axe-core" / \
    "axe.min.js"


def _serious_accessibility_violations(page) -> list[str]:
    """axe-core's serious and critical findings on the page as it is now."""
    if not AXE.exists():
        pytest.fail("axe-core is not installed: run `npm ci` in clients/js")
    # Evaluated, not added as a <script>: the page's policy refuses inline scripts.
    page.evaluate(AXE.read_text())
    found = page.evaluate("""async () => (await axe.run(document)).violations
        .filter((v) => v.impact === "serious" || v.impact === "critical")
        .map((v) => v.id + ": " + v.nodes.map((n) => n.target.join(" ")).join(", "))""")
    return found


def _text(page, selector: str) -> str:
    return page.inner_text(selector).strip()


@pytest.mark.npm("clients/js", required="RANKD_REQUIRE_BROWSER")  # axe-core
def test_live_page_shows_scores_changing_and_a_followed_member(tmp_path):
    """The page on a phone, in light and dark: the top moves live with rank
    movement since the page opened, "me" is followed with its neighbours,
    rank changes are announced, and axe-core finds nothing serious."""
    sync_playwright, executable = _browser_or_skip()
    ARTIFACTS.mkdir(exist_ok=True)
    with Daemon(tmp_path / "data", "--live-interval", "0.1") as daemon:
        daemon.request("PUT", "/v1/boards/arena", {"policy": "sum", "windows": ["all", "daily"]})
        daemon.request("POST", "/v1/boards/arena/scores/batch", {"events": [
            {"member": f"player{i}", "delta": 1000 * i, "label": f"Player {i}"}
            for i in range(1, 13)]})
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=executable,
                                                 args=CHROMIUM_FLAGS)
            try:
                context = browser.new_context(viewport={"width": 390, "height": 844},
                                              locale="en-US")
                page = context.new_page()
                page.goto(f"{daemon.url}/?board=arena")
                page.wait_for_selector("#state.live", timeout=15_000)
                page.wait_for_function(
                    "() => document.querySelectorAll('#top tbody tr').length === 10")
                assert _text(page, "#top tbody tr:first-child td.member") == "Player 12"
                assert _text(page, "#top tbody tr:first-child td.score") == "12,000"
                assert _text(page, "#page-info") == "Page 1 of 2"

                # A submission over REST moves player3 from 10th to first on the page.
                daemon.request("POST", "/v1/boards/arena/scores",
                               {"member": "player3", "delta": 50_000})
                page.wait_for_function(
                    "() => document.querySelector('#top tbody tr td.member').textContent"
                    " === 'Player 3'", timeout=10_000)
                assert _text(page, "#top tbody tr:first-child td.move") == "▲9"
                page.wait_for_function(
                    "() => document.querySelector('#announcer').textContent"
                    ".includes('takes the lead')")

                # "Me", by the name the page shows: around me, my rank, live.
                page.fill("#me-name", "Player 5")
                page.click("#me-form button")
                page.wait_for_function(
                    "() => document.querySelector('#me-card').textContent.includes('rank 9')",
                    timeout=10_000)
                assert "scope=around" in page.url and "me=player5" in page.url
                page.wait_for_selector("#top tr.me", timeout=10_000)
                daemon.request("POST", "/v1/boards/arena/scores",
                               {"member": "player5", "delta": 100_000})
                page.wait_for_function(
                    "() => document.querySelector('#me-card').textContent.includes('rank 1 ')",
                    timeout=10_000)
                page.wait_for_function(
                    "() => document.querySelector('#announcer').textContent"
                    " === 'player5 is now rank 1, up 8.'", timeout=10_000)
                assert page.get_attribute("#announcer", "aria-live") == "polite"
                page.wait_for_function(  # the neighbours, re-read after the change
                    "() => document.querySelector('#top tr.me td.rank')?.textContent === '1'",
                    timeout=10_000)
                # Readable at phone width: nothing wider than the viewport.
                assert page.evaluate("document.documentElement.scrollWidth") <= 390
                page.screenshot(path=str(ARTIFACTS / "live-page.png"), full_page=True)
                assert _serious_accessibility_violations(page) == []

                dark = browser.new_context(viewport={"width": 390, "height": 844},
                                           color_scheme="dark", locale="de-DE")
                night = dark.new_page()
                night.goto(f"{daemon.url}/?board=arena")
                night.wait_for_selector("#state.live", timeout=15_000)
                night.wait_for_function(
                    "() => document.querySelectorAll('#top tbody tr').length === 10")
                background = night.evaluate("getComputedStyle(document.body).backgroundColor")
                assert background == "rgb(17, 20, 26)", background  # dark, from the system
                # Locale-aware numbers: German groups thousands with a dot.
                assert _text(night, "#top tbody tr:first-child td.score") == "105.000"
                night.screenshot(path=str(ARTIFACTS / "live-page-dark.png"), full_page=True)
                assert _serious_accessibility_violations(night) == []
            finally:
                browser.close()
    assert (ARTIFACTS / "live-page.png").stat().st_size > 10_000
    assert (ARTIFACTS / "live-page-dark.png").stat().st_size > 10_000


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
                        page.wait_for_function("() => document.title !== 'waiting'", timeout=10_000)
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
import { Rankd } from %(module)s;
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
                # The allowed page imports the client from rankd (as docs/web.md
                # shows); the other from its own origin, as a bundled game would.
                allowed.html = GAME_PAGE % {"rankd": json.dumps(daemon.url),
                                            "module": json.dumps(daemon.url + "/static/rankd.js")}
                other.html = GAME_PAGE % {"rankd": json.dumps(daemon.url),
                                          "module": json.dumps("./rankd.js")}
                page = browser.new_page()
                page.goto(f"{allowed_origin}/")
                page.wait_for_function("() => window.states && window.states.websocket === 'live'"
                                       " && window.states.sse === 'live'", timeout=15_000)
                assert page.evaluate("submit('ann', 100)") == 110
                for transport in ("websocket", "sse"):
                    page.wait_for_function(
                        f"() => window.seen.{transport}.includes('ann,bob,cy')"
                        f" && window.seen.{transport}.includes('ann#1')", timeout=10_000)
                seen = page.evaluate("window.seen")
                assert seen["websocket"][:2] == ["bob,cy,ann", "ann#3"] or \
                    seen["websocket"][:2] == ["ann#3", "bob,cy,ann"], seen
                assert seen["errors"] == [], seen

                stranger = browser.new_page()
                stranger.goto(f"http://127.0.0.1:{other.server_address[1]}/")
                stranger.wait_for_function("() => document.title === 'ready'")
                assert stranger.evaluate("submit('eve', 1)") == "ConnectionFailed connection"
                stranger.wait_for_function("() => window.seen.errors.length >= 2", timeout=15_000)
                states = stranger.evaluate("window.states")
                assert "live" not in states.values(), states
                assert stranger.evaluate("window.seen.websocket.concat(window.seen.sse)") == []
            finally:
                browser.close()
            assert daemon.request("GET", "/v1/boards/arena/members/eve")[0] == 404
    finally:
        allowed.shutdown()
        other.shutdown()


@pytest.mark.npm("clients/js", required="RANKD_REQUIRE_BROWSER")  # axe-core
def test_the_page_keeps_every_view_in_the_url_and_returns_to_live_after_a_restart(tmp_path):
    """Pages beyond the first, a closed period, search by the name shown,
    friends from the URL, long names cut short; the view survives a reload
    and the page comes back live after the daemon restarts.  (The first
    page stayed on REST polling for good after a restart, showed another
    board for /?board=nosuch, and forgot its view on reload.)"""
    import time

    sync_playwright, executable = _browser_or_skip()
    data = tmp_path / "data"
    args = ("--live-interval", "0.1", "--ts-tolerance", str(3 * 86_400))
    daemon = Daemon(data, *args).start()
    port, tcp_port = daemon.port, daemon.tcp_port
    long_name = "a-member-with-a-very-long-name-" + "x" * 150
    try:
        daemon.request("PUT", "/v1/boards/arena", {"policy": "sum", "windows": ["all", "daily"]})
        daemon.request("POST", "/v1/boards/arena/scores/batch", {"events": [
            {"member": f"p{i}", "delta": 10 * i, "label": f"Player {i}"} for i in range(1, 31)]
            + [{"member": long_name, "delta": 1}]})
        yesterday = time.time() - 86_400
        daemon.request("POST", "/v1/boards/arena/scores/batch", {"events": [
            {"member": "early", "delta": 7, "ts": yesterday}]})
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=executable,
                                                 args=CHROMIUM_FLAGS)
            try:
                page = browser.new_page(locale="en-US")
                page.goto(f"{daemon.url}/?board=nosuch")
                page.wait_for_function("() => !document.querySelector('#notice').hidden")
                assert "no board named “nosuch”" in page.inner_text("#notice")
                assert page.query_selector_all("#top tbody tr") == []

                # Page 2 of the daily window, from the URL; then the next page.
                page.goto(f"{daemon.url}/?board=arena&window=daily&limit=10&page=2")
                page.wait_for_selector("#state.live", timeout=15_000)
                page.wait_for_function(
                    "() => document.querySelector('#top tbody tr td.rank')?.textContent === '11'")
                assert _text(page, "#page-info") == "Page 2 of 4"
                assert page.get_attribute("#windows [data-window=daily]", "aria-pressed") == "true"
                page.click("#next")
                page.wait_for_function(
                    "() => document.querySelector('#top tbody tr td.rank')?.textContent === '21'")
                assert "page=3" in page.url and "window=daily" in page.url
                # A page beyond the first follows changes too (re-read): p15 falls
                # from rank 16 (page 2) to 26.  (It raised p5, already on this
                # page, out of it: the check passed only if it came before the
                # re-read.)
                daemon.request("POST", "/v1/boards/arena/scores", {"member": "p15", "delta": -105})
                page.wait_for_function(
                    "() => [...document.querySelectorAll('#top td.member')].some("
                    "(td) => td.textContent === 'Player 15')", timeout=10_000)

                # The long name: one line, cut, whole in its title.
                page.click("#next")
                page.wait_for_selector(f"#top td.member[title='{long_name}']")
                cut = page.evaluate("(() => { const td = document.querySelector("
                                    "'#top td.member[title^=a-member]');"
                                    " return [td.scrollWidth, td.clientWidth]; })()")
                assert cut[0] > cut[1], cut

                # Find by the name shown: the page that holds it, highlighted.
                page.fill("#search", "Player 25")
                page.click("#search-form button")
                page.wait_for_selector("#top tr.found[data-member=p25]", timeout=10_000)
                assert "rank 6 of 31" in page.inner_text("#found")
                assert "page=1" not in page.url and "page=" not in page.url  # page 1

                # Yesterday is a closed period of the daily window.
                page.select_option("#period", index=1)
                page.wait_for_selector("#state.closed", timeout=10_000)
                page.wait_for_function(
                    "() => document.querySelector('#top tbody td.member')?.textContent === 'early'")
                assert "period=" in page.url
                page.select_option("#period", "")
                page.wait_for_selector("#state.live", timeout=15_000)

                # Friends, from the URL (as a shared link would give them).
                page.goto(f"{daemon.url}/?board=arena&scope=friends&friends=p1,p2,nobody")
                page.wait_for_function(
                    "() => document.querySelectorAll('#top tbody tr').length === 2")
                assert [_text(page, f"#top tbody tr:nth-child({n}) td.member")
                        for n in (1, 2)] == ["Player 2", "Player 1"]
                assert "nobody" in page.inner_text("#found")

                # Me and the window stay across a reload, and across a restart.
                page.goto(f"{daemon.url}/?board=arena&window=daily&me=p11&scope=around")
                page.wait_for_selector("#state.live", timeout=15_000)
                page.wait_for_function(
                    "() => document.querySelector('#me-card').textContent.startsWith('p11: rank')")
                daemon.stop()
                page.wait_for_function(
                    "() => !document.querySelector('#state').classList.contains('live')",
                    timeout=15_000)
                daemon = Daemon(data, *args)
                daemon.port, daemon.tcp_port = port, tcp_port
                daemon.start()
                page.wait_for_selector("#state.live", timeout=45_000)
                daemon.request("POST", "/v1/boards/arena/scores", {"member": "p11", "delta": 1000})
                page.wait_for_function(
                    "() => document.querySelector('#me-card').textContent"
                    ".startsWith('p11: rank 1 ')",
                    timeout=15_000)
                page.reload()
                page.wait_for_selector("#state.live", timeout=15_000)
                assert page.get_attribute("#windows [data-window=daily]", "aria-pressed") == "true"
                page.wait_for_function(
                    "() => document.querySelector('#me-card').textContent"
                    ".startsWith('p11: rank 1')",
                    timeout=10_000)
                assert _serious_accessibility_violations(page) == []
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


VIOLATIONS = """window.violations = [];
document.addEventListener("securitypolicyviolation",
  (e) => window.violations.push(e.violatedDirective + " " + e.blockedURI));"""


def test_the_page_runs_under_its_policy_and_no_other_site_frames_it(tmp_path):
    """The page's Content-Security-Policy holds: the live page works with no
    violation reported; a page of another origin cannot show it in a frame
    unless --frame-ancestors lists it."""
    sync_playwright, executable = _browser_or_skip()
    embedder = _page_server()
    embedder_origin = f"http://127.0.0.1:{embedder.server_address[1]}"
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=executable,
                                                 args=CHROMIUM_FLAGS)
            try:
                with Daemon(tmp_path / "data", "--live-interval", "0.05") as daemon:
                    daemon.request("PUT", "/v1/boards/arena", {"policy": "sum"})
                    daemon.request("POST", "/v1/boards/arena/scores",
                                   {"member": "ann", "delta": 3})
                    page = browser.new_page()
                    console: list[str] = []
                    page.on("console", lambda message: console.append(message.text))
                    page.add_init_script(VIOLATIONS)
                    page.goto(f"{daemon.url}/?board=arena")
                    page.wait_for_selector("#state.live", timeout=15_000)
                    daemon.request("POST", "/v1/boards/arena/scores",
                                   {"member": "bob", "delta": 5})
                    page.wait_for_function(  # a push over the WebSocket, under connect-src
                        "() => document.querySelector('#top tbody td.member')?.textContent"
                        " === 'bob'", timeout=10_000)
                    page.click("#scopes button[data-scope=friends]")  # more of the page's code
                    page.wait_for_selector("#friends-form:not([hidden])")
                    assert page.evaluate("window.violations") == []
                    assert not [text for text in console if "Content Security Policy" in text]

                    embedder.html = f'<!doctype html><title>e</title><iframe src="{daemon.url}/">'
                    framing = browser.new_page()
                    refused: list[str] = []
                    framing.on("console", lambda message: refused.append(message.text))
                    framing.goto(f"{embedder_origin}/")
                    for _ in range(100):  # the refusal is reported once the frame loads
                        if any("frame-ancestors" in text for text in refused):
                            break
                        framing.wait_for_timeout(100)
                    assert any("has been blocked" in text for text in refused), refused
                    assert framing.frames[1].query_selector("#state") is None
                with Daemon(tmp_path / "framed", "--frame-ancestors", embedder_origin) as daemon:
                    embedder.html = f'<!doctype html><title>e</title><iframe src="{daemon.url}/">'
                    framing = browser.new_page()
                    framing.goto(f"{embedder_origin}/")
                    framing.frames[1].wait_for_selector("#state", timeout=10_000)
            finally:
                browser.close()
    finally:
        embedder.shutdown()


def test_a_credential_never_stays_in_the_address(tmp_path):
    """A key given in the address (an old link) is read once, dropped from the
    address bar at once and kept in memory only: no later request carries it
    in a URL (the live feed gets a join token).  The token form works the
    same way; a reload asks again."""
    from rankd.security.auth import new_api_key

    sync_playwright, executable = _browser_or_skip()
    reader, reader_entry = new_api_key("page", "read")
    admin, admin_entry = new_api_key("boss", "admin+write")
    with Daemon(tmp_path / "data", "--api-keys", f"{reader_entry},{admin_entry}",
                "--live-interval", "0.05") as daemon, sync_playwright() as playwright:
        auth = {"Authorization": f"Bearer {admin}"}
        daemon.request("PUT", "/v1/boards/arena", {"policy": "sum"}, headers=auth)
        daemon.request("POST", "/v1/boards/arena/scores", {"member": "ann", "delta": 3},
                       headers=auth)
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page()
            urls: list[str] = []
            page.on("request", lambda request: urls.append(request.url))
            page.on("websocket", lambda socket: urls.append(socket.url))
            page.goto(f"{daemon.url}/?board=arena&token={reader}")
            page.wait_for_selector("#state.live", timeout=15_000)
            page.wait_for_selector("#top tbody td.member")
            assert page.url == f"{daemon.url}/?board=arena&window=all"
            assert urls[0].endswith(reader)  # the address typed in, and nothing after it
            assert not [url for url in urls[1:] if reader in url], urls
            feeds = [url for url in urls if "/live?" in url]
            assert feeds and all("token=" in url and "token=rk_" not in url for url in feeds)

            page.reload()
            page.wait_for_selector("#token-form:not([hidden])", timeout=10_000)
            page.fill("#token", reader)
            page.click("#token-form button")
            page.wait_for_selector("#state.live", timeout=15_000)
            assert reader not in page.url and "token" not in page.url
            assert page.input_value("#token") == ""
            assert not [url for url in urls[1:] if reader in url], urls
        finally:
            browser.close()


def _readme_snippet() -> tuple[str, str]:
    """README.md's JavaScript snippet, and the flag it says lets a page read data."""
    import re

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    snippet = re.search(r"```html\n(.*?)```", readme, re.S).group(1)
    flag = re.search(r"start rankd with\s+`(--cors-origins http://127\.0\.0\.1:8000)`",
                     readme).group(1)
    return snippet, flag


def test_the_readmes_snippet_loads_the_client_from_a_file_or_another_port(tmp_path):
    """README.md's snippet as printed (rankd's address aside): opened from a
    file, or served from another loopback port, it loads the client (its live
    feed then asks rankd); rankd answers its data once the page's origin is
    given with the flag the README names."""
    sync_playwright, executable = _browser_or_skip()
    snippet, flag = _readme_snippet()
    server = _page_server()
    origin = f"http://127.0.0.1:{server.server_address[1]}"

    def open_snippet(browser, url: str) -> tuple[list[str], list]:
        page = browser.new_page()
        console: list[str] = []
        logged: list = []
        page.on("console", lambda message: console.append(message.text))
        page.on("console", lambda message: logged.extend(
            argument.json_value() for argument in message.args
            if message.type == "log"))
        with page.expect_websocket(timeout=10_000) as opened:  # the client ran
            page.goto(url)
        socket = opened.value
        if not socket.is_closed():
            # Refused, it closes; let in, it stays open (and the wait times out).
            with contextlib.suppress(Exception):
                socket.wait_for_event("close", timeout=3_000)
        page.wait_for_timeout(300)
        return console, logged

    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=executable,
                                                 args=CHROMIUM_FLAGS)
            try:
                documented = flag.replace(":8000", f":{server.server_address[1]}").split()
                for args in ((), tuple(documented)):
                    with Daemon(tmp_path / f"data{len(args)}", *args) as daemon:
                        daemon.request("PUT", "/v1/boards/arena", {"policy": "sum"})
                        daemon.request("POST", "/v1/boards/arena/scores",
                                       {"member": "ann", "delta": 3})
                        html = snippet.replace("http://127.0.0.1:7700", daemon.url)
                        page_file = tmp_path / "snippet.html"
                        page_file.write_text(html)
                        server.html = html
                        for url in (page_file.as_uri(), f"{origin}/"):
                            console, logged = open_snippet(browser, url)
                            assert not [text for text in console
                                        if "rankd.js" in text or "module" in text], console
                            # Data only for the served page, with the flag.
                            reads = bool(args) and url.startswith("http")
                            tops = [entries[0]["member"] for entries in logged
                                    if isinstance(entries, list) and entries]
                            assert (tops[:1] == ["ann"]) == reads, (args, url, logged, console)
            finally:
                browser.close()
    finally:
        server.shutdown()
