"""The HTTP side against the real daemon: join tokens cannot chain and
share their issuer's limits, the cluster's addresses are admin-only,
credentials stay out of URLs, the page's security headers, clients behind
trusted proxies, and the JavaScript client readable from any page."""

from __future__ import annotations

import asyncio
import socket
import time
import urllib.request

import aiohttp
import jwt
import pytest

from daemon import Daemon
from rankd.config import ConfigError, ServerConfig
from rankd.security.auth import AuthConfig, Authenticator, Forbidden, new_api_key
from rankd.security.proxies import UNPARSABLE, TrustedProxies

SECRET = "http-hardening-" + "s" * 30
READER_KEY, READER_ENTRY = new_api_key("rd1", "read")
ADMIN_KEY, ADMIN_ENTRY = new_api_key("ad1", "admin+read+write")


def token(scopes: str, sub: str | None = None) -> str:
    claims: dict = {"scope": scopes, "exp": int(time.time() + 3 * 3600)}
    if sub is not None:
        claims["sub"] = sub
    return jwt.encode(claims, SECRET, algorithm="HS256")


def auth(credential: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {credential}"}


def raw_get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict, bytes]:
    """GET ``url``: status, headers (as a plain dict) and body."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with Daemon(tmp_path_factory.mktemp("http") / "data", "--jwt-secret", SECRET,
                "--api-keys", f"{READER_ENTRY},{ADMIN_ENTRY}") as running:
        running.request("PUT", "/v1/boards/b", {"policy": "sum"}, headers=auth(ADMIN_KEY))
        yield running


# --- 13: a join token mints nothing, and counts as its issuer ---------------------------

def test_a_join_token_cannot_mint_its_successor(daemon):
    status, answer = daemon.request("GET", "/v1/realtime/token", headers=auth(READER_KEY))
    assert status == 200
    join = answer["token"]
    status, answer = daemon.request("GET", "/v1/realtime/token", headers=auth(join))
    assert (status, answer["error"]["code"]) == (403, "forbidden"), answer
    assert "join token cannot mint" in answer["error"]["message"]
    # It still reads, for its 60 seconds.
    assert daemon.request("GET", "/v1/boards/b/top", headers=auth(join))[0] == 200


def test_a_join_token_is_limited_as_the_credential_that_minted_it(tmp_path):
    """Each link of a chain once had a fresh bucket: now a join token takes
    from its issuer's (a bucket of one read, refilled every two seconds)."""
    with Daemon(tmp_path / "data", "--jwt-secret", SECRET, "--api-keys", READER_ENTRY,
                "--rate-credential-reads", "0.5") as daemon:
        status, answer = daemon.request("GET", "/v1/realtime/token", headers=auth(READER_KEY))
        assert status == 200  # the issuer's one read
        join = answer["token"]
        assert daemon.request("GET", "/v1/boards", headers=auth(READER_KEY))[0] == 429
        status, answer = daemon.request("GET", "/v1/boards", headers=auth(join))
        assert status == 429, answer


def test_a_join_tokens_principal_is_its_issuers():
    authenticator = Authenticator(AuthConfig(jwt_secret=SECRET))
    player = authenticator.authenticate(token("read", sub="p1"))
    joined = authenticator.authenticate(authenticator.join_token(player))
    assert (joined.name, joined.subject, joined.joined) == ("jwt:p1", "p1", True)
    with pytest.raises(Forbidden, match="cannot mint"):
        authenticator.join_token(joined)


# --- 19: the cluster's addresses are admin-only --------------------------------------------

def test_the_cluster_status_needs_admin_and_its_summary_read(daemon):
    status, answer = daemon.request("GET", "/v1/cluster", headers=auth(READER_KEY))
    assert (status, answer["error"]["code"]) == (403, "forbidden"), answer
    # Past the gate, a single node answers that it is one.
    assert daemon.request("GET", "/v1/cluster", headers=auth(ADMIN_KEY))[0] == 404
    assert daemon.request("GET", "/v1/cluster/summary", headers=auth(READER_KEY))[0] == 404
    assert daemon.request("GET", "/v1/cluster/summary")[0] == 401


def test_a_cluster_nodes_summary_names_no_address(tmp_path, pg_dsn):
    with Daemon(tmp_path / "data", "--cluster-dsn", pg_dsn, "--node-id", "n0",
                "--jwt-secret", SECRET, "--api-keys", f"{READER_ENTRY},{ADMIN_ENTRY}",
                "--cluster-secret", "cluster-" + "c" * 40, "--lease-seconds", "2") as daemon:
        deadline = time.monotonic() + 15
        while daemon.request("GET", "/v1/ready")[0] != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        status, full = daemon.request("GET", "/v1/cluster", headers=auth(ADMIN_KEY))
        assert status == 200 and full["nodes"][0]["advertise"].endswith(f":{daemon.port}")
        assert daemon.request("GET", "/v1/cluster", headers=auth(READER_KEY))[0] == 403
        status, summary = daemon.request("GET", "/v1/cluster/summary",
                                         headers=auth(READER_KEY))
        assert status == 200, summary
        assert [(n["node"], n["alive"]) for n in summary["nodes"]] == [("n0", True)]
        assert summary["this_node"]["node"] == "n0"
        assert str(daemon.port) not in str(summary) and "advertise" not in str(summary)


# --- 22: credentials stay out of URLs --------------------------------------------------------

def test_only_a_join_token_is_accepted_in_a_url(daemon):
    join = daemon.request("GET", "/v1/realtime/token", headers=auth(READER_KEY))[1]["token"]
    base = f"127.0.0.1:{daemon.port}/v1/boards/b"

    async def scenario():
        answers = {}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            for name, credential in (("key", READER_KEY), ("jwt", token("read"))):
                for feed in ("live", "events"):
                    async with session.get(f"http://{base}/{feed}?token={credential}") as got:
                        answers[name, feed] = (got.status, (await got.json())["error"])
            async with session.ws_connect(f"ws://{base}/live?token={join}") as ws:
                answers["join"] = (await ws.receive_json(timeout=5))["type"]
        return answers

    answers = asyncio.run(scenario())
    assert answers.pop("join") == "leaderboard.updated"
    for key, (status, error) in answers.items():
        assert (status, error["code"]) == (401, "unauthorized"), key
        assert "only a join token" in error["message"] and "Authorization" in error["message"]


# --- 23: the page's security headers --------------------------------------------------------

def test_the_page_and_its_files_carry_security_headers(daemon):
    for path in ("/", "/static/app.js", "/static/rankd.js", "/static/style.css"):
        status, headers, _ = raw_get(daemon.url + path)
        assert status == 200, path
        policy = headers["Content-Security-Policy"]
        assert "frame-ancestors 'none'" in policy and "script-src 'self';" in policy
        assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert headers["Referrer-Policy"] == "no-referrer"
        assert headers["X-Frame-Options"] == "DENY"
    for path in ("/v1/health", "/v1/boards", "/v1/nothing-here"):
        headers = raw_get(daemon.url + path)[1]
        assert headers["X-Content-Type-Options"] == "nosniff", path


@pytest.mark.parametrize("head", [
    b"POST /v1/health HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n",
    b"GET /v1/health HTTP/1.1\r\nHost: a\r\nHost: b\r\n",
    b"GET /v1/health HTTP/1.1\r\nHost: a\r\nX-A: b\r\n folded\r\n"])
def test_requests_aiohttp_cannot_parse_are_answered_with_no_versions(daemon, head):
    """aiohttp answers what it cannot parse itself (duplicate
    ``Content-Length`` or ``Host``, a folded header) before any handler:
    its 400 too names the server without versions."""
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=5) as sock:
        sock.sendall(head + b"\r\n")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    status, _, rest = answer.partition(b"\r\n")
    assert status.split()[1] == b"400", answer
    headers = dict(line.split(b": ", 1) for line in rest.split(b"\r\n\r\n")[0].split(b"\r\n"))
    assert headers[b"Server"] == b"rankd", answer


def test_frame_ancestors_are_configurable(tmp_path):
    with Daemon(tmp_path / "data", "--frame-ancestors",
                "https://Stream.example, http://127.0.0.1:9000") as daemon:
        headers = raw_get(daemon.url + "/")[1]
        assert headers["Content-Security-Policy"].endswith(
            "frame-ancestors http://127.0.0.1:9000 https://stream.example")
        assert "X-Frame-Options" not in headers
    with pytest.raises(ConfigError, match="--frame-ancestors"):
        ServerConfig(frame_ancestors="https://x.example/page").origin_policy(
            ServerConfig().gate())


# --- 25: clients behind trusted proxies ---------------------------------------------------

def test_forwarded_clients_have_their_own_limits_only_behind_trusted_proxies(tmp_path):
    """A proxy on the same host: without --trusted-proxies every client is
    loopback (exempt); with it each forwarded client has its own bucket (one
    read, refilled every two seconds), and a client cannot pose as another
    hop by writing the header itself."""
    def statuses(daemon, forwarded_for: str, times: int = 2) -> list[int]:
        return [daemon.request("GET", "/v1/boards", headers={"X-Forwarded-For": forwarded_for})
                [0] for _ in range(times)]

    with Daemon(tmp_path / "plain", "--rate-address-reads", "0.5") as daemon:
        assert statuses(daemon, "203.0.113.9", 3) == [200, 200, 200]
    with Daemon(tmp_path / "proxied", "--rate-address-reads", "0.5",
                "--trusted-proxies", "127.0.0.0/8, 10.0.0.0/8") as daemon:
        assert statuses(daemon, "203.0.113.9") == [200, 429]
        assert statuses(daemon, "198.51.100.7") == [200, 429]
        # Hops the client wrote to the left of its own address change nothing.
        assert statuses(daemon, "192.0.2.1, 203.0.113.9", 1) == [429]
        # Trusted hops (a second proxy) are skipped from the right.
        assert statuses(daemon, "203.0.113.9, 10.1.2.3", 1) == [429]
        # Without the header the peer is the client: loopback, exempt.
        assert [daemon.request("GET", "/v1/boards")[0] for _ in range(3)] == [200] * 3


def test_the_live_feeds_connections_per_address_follow_forwarded_clients(tmp_path):
    with Daemon(tmp_path / "data", "--trusted-proxies", "127.0.0.1",
                "--live-max-per-address", "1") as daemon:
        daemon.request("PUT", "/v1/boards/b", {})
        url = f"http://127.0.0.1:{daemon.port}/v1/boards/b/events"

        async def scenario():
            async with aiohttp.ClientSession() as session:
                first = await session.get(url, headers={"X-Forwarded-For": "203.0.113.9"})
                second = await session.get(url, headers={"X-Forwarded-For": "203.0.113.9"})
                other = await session.get(url, headers={"X-Forwarded-For": "203.0.113.10"})
                statuses = [first.status, second.status, other.status]
                for response in (first, second, other):
                    response.close()
                return statuses

        assert asyncio.run(scenario()) == [200, 429, 200]


def test_the_client_is_the_rightmost_untrusted_hop():
    proxies = TrustedProxies.parse("127.0.0.1/32, 10.0.0.0/8, ::1")
    client = proxies.client_address
    assert client("203.0.113.5", ["198.51.100.1"]) == "203.0.113.5"  # not from a proxy
    assert client("127.0.0.1", ["198.51.100.1"]) == "198.51.100.1"
    assert client("::1", ["1.1.1.1, 198.51.100.1", "10.0.0.2"]) == "198.51.100.1"
    assert client("127.0.0.1", ["[2001:db8::1]:4711"]) == "2001:db8::1"
    assert client("127.0.0.1", ["198.51.100.1:80"]) == "198.51.100.1"
    assert client("127.0.0.1", ["10.0.0.3, 10.0.0.2"]) == "10.0.0.3"  # all proxies
    assert client("127.0.0.1", ["localhost"]) == UNPARSABLE  # never "loopback"
    assert proxies.trusts("::ffff:10.1.1.1") and not proxies.trusts("11.0.0.1")
    assert proxies.exempt_from_address_caps("10.9.9.9")
    assert not TrustedProxies.parse("").exempt_from_address_caps("10.9.9.9")
    with pytest.raises(ValueError, match=r"'10\.0\.0\.0/33' is not an address or CIDR"):
        TrustedProxies.parse("10.0.0.0/33")
    with pytest.raises(ConfigError, match="--trusted-proxies"):
        ServerConfig(trusted_proxies="proxy.internal").gate()


# --- 27: the JavaScript client is public code ------------------------------------------------

def test_the_javascript_client_is_readable_from_any_page(tmp_path):
    with Daemon(tmp_path / "data") as daemon:
        for origin in ("null", "http://127.0.0.1:9", "https://game.example"):
            status, headers, body = raw_get(daemon.url + "/static/rankd.js",
                                            {"Origin": origin})
            assert status == 200 and b"export class Rankd" in body, origin
            assert headers["Access-Control-Allow-Origin"] == "*"
        # Data stays closed to unlisted pages.
        status, headers, _ = raw_get(daemon.url + "/v1/boards", {"Origin": "null"})
        assert status == 403 and "Access-Control-Allow-Origin" not in headers
