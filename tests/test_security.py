"""Authentication, scopes, join tokens, signed submissions, rate limits,
audit lines, secure defaults and TLS, against the real daemon."""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import ipaddress
import json
import os
import socket
import ssl
import time
import urllib.request

import aiohttp
import jwt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daemon import Daemon
from rankd import wire
from rankd.client import Client, Forbidden, Unauthorized
from rankd.config import ConfigError, ServerConfig
from rankd.security import Gate
from rankd.security.auth import AuthConfig, Authenticator, Principal, new_api_key
from rankd.security.auth import Unauthorized as Refused
from rankd.security.limits import LimitsConfig, RateLimiter, TokenBuckets
from rankd.security.signing import sign

SECRET = "test-secret-" + "x" * 20
SIGNING = "signing-secret-" + "y" * 20
WRITER_KEY, WRITER_ENTRY = new_api_key("gs1", "write")
READER_KEY, READER_ENTRY = new_api_key("rd1", "read")


def token(scopes: str = "", *, sub: str | None = None, secret: str = SECRET,
          expires_in: float = 3 * 3600, not_before: float | None = None) -> str:
    now = time.time()
    claims: dict = {"scope": scopes, "exp": int(now + expires_in)}
    if sub is not None:
        claims["sub"] = sub
    if not_before is not None:
        claims["nbf"] = int(now + not_before)
    return jwt.encode(claims, secret, algorithm="HS256")


# Made at import: valid for hours, since a full test run can take many minutes.
ADMIN = token("admin")
WRITER = token("write")
READER = token("read")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with Daemon(tmp_path_factory.mktemp("sec") / "data", "--jwt-secret", SECRET,
                "--api-keys", f"{WRITER_ENTRY},{READER_ENTRY}", "--signing-secret", SIGNING,
                "--rate-credential-writes", "20") as running:
        auth = {"Authorization": f"Bearer {ADMIN}"}
        running.request("PUT", "/v1/boards/b", {"policy": "sum"}, headers=auth)
        running.request("PUT", "/v1/boards/signed", {"policy": "sum", "signed": True},
                        headers=auth)
        running.request("POST", "/v1/boards/b/scores", {"member": "ann", "delta": 5},
                        headers={"Authorization": f"Bearer {token('write', sub='x1')}"})
        yield running


def post_as(daemon, path: str, body: bytes, credential: str) -> tuple[int, dict]:
    """POST ``body`` as JSON with ``credential``: (status, response headers)."""
    request = urllib.request.Request(
        f"{daemon.url}{path}", data=body, method="POST",
        headers={"Authorization": f"Bearer {credential}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers)


def call(daemon, method, path, body=None, credential=None):
    headers = {"Authorization": f"Bearer {credential}"} if credential else {}
    return daemon.request(method, path, body, headers=headers)


# (method, path, body, scope)
ENDPOINTS = [
    ("GET", "/v1/boards", None, "read"),
    ("GET", "/v1/boards/b", None, "read"),
    ("GET", "/v1/boards/b/top", None, "read"),
    ("GET", "/v1/boards/b/members/ann", None, "read"),
    ("GET", "/v1/boards/b/members/ann/around", None, "read"),
    ("POST", "/v1/boards/b/ranks", {"members": ["ann"]}, "read"),
    ("GET", "/v1/boards/b/periods", None, "read"),
    ("GET", "/v1/realtime/token", None, "read"),
    ("POST", "/v1/boards/b/scores", {"member": "zed", "delta": 1}, "write"),
    ("POST", "/v1/boards/b/scores/batch", {"events": [{"member": "zed", "delta": 1}]},
     "write"),
    ("DELETE", "/v1/boards/b/members/nobody", None, "write"),
    ("PUT", "/v1/boards/made", {}, "admin"),
    ("DELETE", "/v1/boards/made", None, "admin"),
    ("GET", "/v1/admin/digest", None, "admin"),
]
RIGHT = {"read": READER, "write": WRITER, "admin": ADMIN}
WRONG = {"read": WRITER, "write": READER, "admin": WRITER}


@pytest.mark.parametrize("method, path, body, scope", ENDPOINTS,
                         ids=[f"{m} {p}" for m, p, _, _ in ENDPOINTS])
def test_every_endpoint_checks_credentials_and_scope(daemon, method, path, body, scope):
    for credential, reason in ((None, "credential is required"),
                               (token(scope, expires_in=-60), "expired"),
                               (token(scope, secret="another-secret-" + "z" * 20),
                                "invalid token"),
                               (token(scope, not_before=120), "not valid yet"),
                               ("garbage", "malformed")):
        status, answer = call(daemon, method, path, body, credential)
        assert (status, answer["error"]["code"]) == (401, "unauthorized"), (credential, answer)
        assert reason in answer["error"]["message"]
    status, answer = call(daemon, method, path, body, WRONG[scope])
    assert (status, answer["error"]["code"]) == (403, "forbidden")
    status, _ = call(daemon, method, path, body, RIGHT[scope])
    assert status in (200, 201, 204, 404), (method, path, status)


def test_open_endpoints_need_no_credential(daemon):
    for path in ("/v1/health", "/v1/openapi.json", "/", "/static/app.js"):
        with urllib.request.urlopen(daemon.url + path, timeout=5) as response:
            assert response.status == 200, path


def test_a_player_token_reads_only_its_own_standing(daemon):
    player = token("", sub="ann")
    status, mine = call(daemon, "GET", "/v1/me/b", credential=player)
    assert status == 200 and (mine["member"], mine["score"]) == ("ann", 5.0)
    assert call(daemon, "GET", "/v1/boards/b/members/ann", credential=player)[0] == 403
    assert call(daemon, "GET", "/v1/me/b", credential=token("", sub="nobody"))[0] == 404
    assert call(daemon, "GET", "/v1/me/b", credential=READER)[0] == 403  # no subject


def test_api_keys(daemon):
    status, result = call(daemon, "POST", "/v1/boards/b/scores", {"member": "kay", "delta": 2},
                          WRITER_KEY)
    assert status == 200 and result["score"] == 2.0
    assert call(daemon, "GET", "/v1/boards/b/top", credential=WRITER_KEY)[0] == 403
    assert call(daemon, "GET", "/v1/boards/b/top", credential=READER_KEY)[0] == 200
    forged = WRITER_KEY[:-4] + "AAAA"
    assert call(daemon, "GET", "/v1/boards/b/top", credential=forged)[0] == 401
    status, answer = daemon.request("GET", "/v1/boards/b/top",
                                    headers={"Authorization": f"Basic {WRITER_KEY}"})
    assert status == 401 and "Bearer" in answer["error"]["message"]


def test_join_tokens_open_the_live_feed_for_browsers(daemon):
    join = call(daemon, "GET", "/v1/realtime/token", credential=READER)[1]["token"]
    base = f"127.0.0.1:{daemon.port}/v1/boards/b"

    async def scenario():
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(f"ws://{base}/live?token={join}") as ws:
                first = json.loads((await ws.receive(timeout=5)).data)
            refused = []
            for query in ("", "?token=nope", f"?token={WRITER}"):
                async with session.get(f"http://{base}/live{query}") as response:
                    refused.append(response.status)
            async with session.get(f"http://{base}/events?token={join}") as response:
                line = b""
                while not line.startswith(b"data: "):
                    line = await asyncio.wait_for(response.content.readline(), 5)
            return first, refused, json.loads(line[6:])

    first, refused, event = asyncio.run(scenario())
    assert first["type"] == "leaderboard.updated" and first["board"] == "b"
    assert refused == [401, 401, 401]  # a JWT is no join token: not in a URL
    assert event["type"] == "leaderboard.updated"
    # A join token is good for the live feed's reads only.
    assert call(daemon, "POST", "/v1/boards/b/scores", {"member": "j", "delta": 1}, join)[0] \
        == 403


def test_tcp_requires_auth_first_and_closes_after_repeated_failures(daemon):
    with Client("127.0.0.1", daemon.tcp_port, token=WRITER) as writer:
        assert writer.submit("b", "tcp", delta=1)["score"] == 1.0
        with pytest.raises(Forbidden):
            writer.top("b")
    with pytest.raises(Unauthorized):
        Client("127.0.0.1", daemon.tcp_port, token="bad", retries=0).connect()
    sock = socket.create_connection(("127.0.0.1", daemon.tcp_port), timeout=5)
    decoder = wire.FrameDecoder()
    sock.sendall(wire.request(1, "hello", {"version": 1}))
    answers = []
    while len(answers) < 1:
        answers += decoder.feed(sock.recv(65536))
    assert answers[0][1] == wire.OK
    sock.sendall(b"".join(wire.request(i, "top", {"board": "b"}) for i in range(2, 6)))
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    answers = decoder.feed(received)
    assert [a[2]["code"] for a in answers[:3]] == ["unauthorized"] * 3
    assert answers[-1][0] == 0  # then the connection was closed
    sock.close()


def signed(member, delta, event_id, ts, board="signed", **extra):
    event = {"member": member, "delta": delta, "event_id": event_id, "ts": ts, **extra}
    return {**event, "signature": sign(SIGNING, board, event)}


def test_signed_submissions(daemon):
    now = time.time()
    good = signed("sam", 3, "s1", now)
    status, result = call(daemon, "POST", "/v1/boards/signed/scores", good, WRITER)
    assert status == 200 and result["score"] == 3.0
    tampered = {**signed("sam", 3, "s2", now), "delta": 30}
    assert call(daemon, "POST", "/v1/boards/signed/scores", tampered, WRITER)[0] == 401
    stale = signed("sam", 3, "s3", now - 120)
    status, answer = call(daemon, "POST", "/v1/boards/signed/scores", stale, WRITER)
    assert status == 401 and "away from the server clock" in answer["error"]["message"]
    unsigned = {"member": "sam", "delta": 3, "event_id": "s4", "ts": now}
    assert call(daemon, "POST", "/v1/boards/signed/scores", unsigned, WRITER)[0] == 401
    status, replay = call(daemon, "POST", "/v1/boards/signed/scores", good, WRITER)
    assert status == 200 and replay["duplicate"] is True
    assert call(daemon, "GET", "/v1/boards/signed/members/sam", credential=READER)[1][
        "score"] == 3.0


def test_a_signature_covers_each_field_on_its_own(daemon):
    """Version 1 signed ``board|member|value|event_id|ts``: a '|' could move
    between fields, and the label was not signed at all."""
    now = time.time()
    genuine = signed("dave", 3, "7|z", now)
    moved = {"member": "dave|3", "delta": 7, "event_id": "z", "ts": now,
             "signature": genuine["signature"]}
    status, answer = call(daemon, "POST", "/v1/boards/signed/scores", moved, WRITER)
    assert status == 401, answer
    labelled = signed("erin", 1, "l1", now, label="Erin")
    forged = {**labelled, "label": "Admin"}
    assert call(daemon, "POST", "/v1/boards/signed/scores", forged, WRITER)[0] == 401
    assert call(daemon, "POST", "/v1/boards/signed/scores", labelled, WRITER)[0] == 200
    assert call(daemon, "GET", "/v1/boards/signed/members/erin", credential=READER)[1][
        "label"] == "Erin"
    as_score = {**signed("finn", 5, "sc1", now), "score": 5}
    del as_score["delta"]  # the same number, signed as a delta, sent as a score
    assert call(daemon, "POST", "/v1/boards/signed/scores", as_score, WRITER)[0] == 401


@pytest.mark.parametrize("signature", [
    "0" * 64,                              # version 1: bare hex
    "v2=" + "Z" * 64,                      # not hex
    "v2=" + "é" * 64,                      # not ASCII (once a 500)
    "v3=" + "0" * 64,                      # an unknown version
    42, ["v2=" + "0" * 64],                # not text
])
def test_malformed_signatures_are_refused_clearly(daemon, signature):
    event = {"member": "gil", "delta": 1, "event_id": "m1", "ts": time.time(),
             "signature": signature}
    status, answer = call(daemon, "POST", "/v1/boards/signed/scores", event, WRITER)
    assert status == 422 and "v2=" in answer["error"]["message"], answer


def _reference_canonical(board: str, event: dict) -> bytes:
    """The format of docs/security.md, written again from the text alone."""
    import struct

    kind = "score" if "score" in event else "delta"
    fields = [board, event["member"], kind, f"{float(event[kind]):.17g}", event["event_id"],
              f"{float(event['ts']):.17g}", event.get("label")]
    out = b"rankd-signed-submission/v2\x00"
    for field in fields:
        out += (struct.pack(">I", 0xFFFFFFFF) if field is None
                else struct.pack(">I", len(field.encode())) + field.encode())
    return out


def test_signing_vectors_match_an_independent_reading_of_the_format():
    import hmac
    from pathlib import Path

    from rankd.client import sign as client_sign
    from rankd.security.signing import canonical

    vectors = json.loads((Path(__file__).parent.parent / "protocol" /
                          "signing-vectors.json").read_text())
    secret = vectors["secret"]
    signatures = set()
    for vector in vectors["vectors"]:
        board, event = vector["board"], vector["event"]
        expected = _reference_canonical(board, event)
        assert canonical(board, event).hex() == expected.hex() == vector["canonical_hex"]
        digest = hmac.new(secret.encode(), expected, hashlib.sha256).hexdigest()
        assert client_sign(secret, board, event) == "v2=" + digest == vector["signature"]
        signatures.add(vector["signature"])
    assert len(signatures) == len(vectors["vectors"])  # no two cases sign the same bytes


def test_rate_limits_are_hit_and_recover(daemon):
    limited = token("write", sub="burst")
    statuses, retry_after = [], None
    for _ in range(60):
        status, headers = post_as(daemon, "/v1/boards/b/scores",
                                  b'{"member": "rl", "delta": 1}', limited)
        statuses.append(status)
        # Read from the refusal itself: the bucket may refill before a later request.
        if status == 429 and retry_after is None:
            retry_after = headers.get("Retry-After")
    assert statuses.count(200) >= 40 and 429 in statuses
    assert retry_after is not None and int(retry_after) >= 1
    time.sleep(1.2)
    assert call(daemon, "POST", "/v1/boards/b/scores", {"member": "rl", "delta": 1},
                limited)[0] == 200


def test_audit_log_has_rejections_and_admin_actions_without_secrets(daemon):
    call(daemon, "PUT", "/v1/boards/audited", {}, ADMIN)
    call(daemon, "GET", "/v1/boards", credential="wrong")
    log = daemon.log()
    assert "admin_action operation=put_board principal=jwt:? " in log
    assert "auth_rejected operation=list_boards" in log
    for secret in (SECRET, SIGNING, WRITER_KEY, READER_KEY, ADMIN, WRITER):
        assert secret not in log


def test_token_buckets_and_address_limits_with_a_fake_clock():
    now = [0.0]
    buckets = TokenBuckets(rate=10, burst=20, clock=lambda: now[0])
    assert all(buckets.take("a") == 0 for _ in range(20))
    assert buckets.take("a") == pytest.approx(0.1)
    assert buckets.take("b") == 0  # separate keys
    now[0] += 0.5
    assert all(buckets.take("a") == 0 for _ in range(5))
    limiter = RateLimiter(LimitsConfig(address_writes=1, address_reads=100))
    limiter.check("write", "203.0.113.9", "anonymous")
    limiter.check("write", "203.0.113.9", "anonymous")
    with pytest.raises(Exception, match="too many writes"):
        limiter.check("write", "203.0.113.9", "anonymous")
    for _ in range(100):
        limiter.check("write", "127.0.0.1", "anonymous")  # loopback is exempt


def test_secure_by_default_exposure_rules():
    open_gate = Gate.open()
    ServerConfig(host="127.0.0.1").check_exposure(open_gate)
    ServerConfig(host="::1").check_exposure(open_gate)
    with pytest.raises(ConfigError, match=r"refusing to listen on 0\.0\.0\.0 without auth"):
        ServerConfig(host="0.0.0.0").check_exposure(open_gate)
    ServerConfig(host="0.0.0.0", insecure_no_auth=True).check_exposure(open_gate)
    secured = Gate(Authenticator(AuthConfig(jwt_secret=SECRET)), open_gate.limiter)
    ServerConfig(host="0.0.0.0").check_exposure(secured)
    # What the listeners really bound decides, not the string: a host name
    # may resolve anywhere.
    ServerConfig(host="localhost").check_exposure(open_gate, ["127.0.0.1", "::1"])
    with pytest.raises(ConfigError, match=r"refusing to listen on 192\.0\.2\.7 without"):
        ServerConfig(host="game-host").check_exposure(open_gate, ["127.0.0.1", "192.0.2.7"])
    with pytest.raises(ConfigError, match=r"refusing to listen on  without"):
        ServerConfig(host="").check_exposure(open_gate)


@pytest.mark.parametrize("how", ["flag", "env", "toml"])
def test_an_empty_host_is_refused_before_anything_listens(tmp_path, how):
    import subprocess
    import sys

    from daemon import SRC, free_port

    port = free_port()
    command = [sys.executable, "-m", "rankd.cli", "serve", "--port", str(port),
               "--tcp-port", "0", "--resp-port", "0", "--data-dir", str(tmp_path / "data")]
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    if how == "flag":
        command += ["--host", ""]
    elif how == "env":
        env["RANKD_HOST"] = ""
    else:
        (tmp_path / "rankd.toml").write_text('host = ""\n')
        command += ["--config", str(tmp_path / "rankd.toml")]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "empty; name the address to listen on" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1  # one line, no traceback
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0


def test_api_key_entries_hold_only_hashes():
    key, entry = new_api_key("ops", "admin+read")
    assert key not in entry
    assert entry.split(":")[1] == hashlib.sha256(key.encode()).hexdigest()
    assert entry.endswith(":admin+read")


def _self_signed(tmp_path):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def test_tls_for_http_and_tcp(tmp_path):
    cert, key = _self_signed(tmp_path)
    context = ssl.create_default_context(cafile=str(cert))
    with Daemon(tmp_path / "data", "--tls-cert", str(cert), "--tls-key", str(key),
                ssl_context=context) as daemon:
        assert daemon.request("GET", "/v1/health")[0] == 200
        assert daemon.wait_for_log("tls=on")
        with Client("127.0.0.1", daemon.tcp_port, ssl=context) as client:
            assert client.health() == {"status": "ok"}
        with pytest.raises(OSError):  # plain HTTP is not served on the TLS port
            urllib.request.urlopen(f"http://127.0.0.1:{daemon.port}/v1/health", timeout=2)


# (op, args, scope) of every TCP operation that needs a credential
TCP_OPS = [
    ("list_boards", {}, "read"),
    ("get_board", {"board": "b"}, "read"),
    ("top", {"board": "b"}, "read"),
    ("member", {"board": "b", "member": "ann"}, "read"),
    ("around", {"board": "b", "member": "ann"}, "read"),
    ("ranks", {"board": "b", "members": ["ann"]}, "read"),
    ("periods", {"board": "b"}, "read"),
    ("submit", {"board": "b", "member": "t", "delta": 1}, "write"),
    ("submit_many", {"events": [{"board": "b", "member": "t", "delta": 1}]}, "write"),
    ("remove_member", {"board": "b", "member": "nobody"}, "write"),
    ("put_board", {"board": "tcpmade", "config": {}}, "admin"),
    ("delete_board", {"board": "tcpmade"}, "admin"),
]


def _tcp(port: int, *frames: bytes) -> list:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(wire.request(1, "hello", {"version": 1}) + b"".join(frames))
        decoder = wire.FrameDecoder()
        answers: list = []
        while len(answers) < 1 + len(frames):
            chunk = sock.recv(65536)
            if not chunk:
                break
            answers += decoder.feed(chunk)
        return answers[1:]


@pytest.mark.parametrize("op, args, scope", TCP_OPS, ids=[op for op, _, _ in TCP_OPS])
def test_every_tcp_operation_checks_credentials_and_scope(daemon, op, args, scope):
    (unauthenticated,) = _tcp(daemon.tcp_port, wire.request(2, op, args))
    assert unauthenticated[1:] == [wire.ERROR, unauthenticated[2]]
    assert unauthenticated[2]["code"] == "unauthorized"
    expired = _tcp(daemon.tcp_port, wire.request(2, "auth", {"token": token(scope,
                                                                           expires_in=-60)}))
    assert expired[0][2]["code"] == "unauthorized"
    wrong = _tcp(daemon.tcp_port, wire.request(2, "auth", {"token": WRONG[scope]}),
                 wire.request(3, op, args))
    assert wrong[0][1] == wire.OK and wrong[1][2]["code"] == "forbidden"
    right = _tcp(daemon.tcp_port, wire.request(2, "auth", {"token": RIGHT[scope]}),
                 wire.request(3, op, args))
    assert right[1][1] == wire.OK or right[1][2]["code"] == "not_found", right


def _public_key_pair(kind: str) -> tuple[object, bytes]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    if kind == "RS256":
        private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    else:
        private = ec.generate_private_key(ec.SECP256R1())
    public = private.public_key().public_bytes(serialization.Encoding.PEM,
                                               serialization.PublicFormat.SubjectPublicKeyInfo)
    return private, public


@pytest.mark.parametrize("algorithm", ["RS256", "ES256"])
def test_public_key_tokens(tmp_path, algorithm):
    private, public = _public_key_pair(algorithm)
    key_file = tmp_path / "public.pem"
    key_file.write_bytes(public)
    other, _ = _public_key_pair(algorithm)
    claims = {"scope": "admin read", "exp": int(time.time()) + 600}
    good = jwt.encode(claims, private, algorithm=algorithm)
    forged = jwt.encode(claims, other, algorithm=algorithm)
    hs256 = token("admin read")  # no HS256 secret configured on this server
    with Daemon(tmp_path / "data", "--jwt-public-key", str(key_file)) as daemon:
        assert call(daemon, "PUT", "/v1/boards/pk", {}, good)[0] == 201
        assert call(daemon, "GET", "/v1/boards/pk", credential=good)[0] == 200
        for bad in (forged, hs256):
            status, answer = call(daemon, "GET", "/v1/boards/pk", credential=bad)
            assert (status, answer["error"]["code"]) == (401, "unauthorized")


def test_tcp_rate_limit_answers_error_frames(daemon):
    limited = token("write", sub="tcp-burst")
    frames = [wire.request(2, "auth", {"token": limited})]
    frames += [wire.request(3 + i, "submit", {"board": "b", "member": "tb", "delta": 1})
               for i in range(100)]
    # The first run passes whole (a full bucket, left in debt), the next is refused.
    answers = _tcp(daemon.tcp_port, *frames)[1:] + _tcp(daemon.tcp_port, *frames)[1:]
    codes = [answer[2]["code"] if answer[1] == wire.ERROR else "ok" for answer in answers]
    assert codes.count("ok") >= 20 and "rate_limited" in codes
    limited_answer = next(a for a in answers if a[1] == wire.ERROR)
    assert "retry in" in limited_answer[2]["message"]


def test_websocket_messages_are_rate_limited_with_a_close_code(tmp_path):
    reader = token("read", sub="chatty")
    with Daemon(tmp_path / "data", "--jwt-secret", SECRET, "--rate-credential-reads", "5"
                ) as daemon:
        call(daemon, "PUT", "/v1/boards/ws", {}, ADMIN)

        async def scenario():
            async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {reader}"}
                                             ) as session:
                url = f"ws://127.0.0.1:{daemon.port}/v1/boards/ws/live"
                async with session.ws_connect(url) as ws:
                    await ws.receive(timeout=5)
                    for _ in range(30):
                        await ws.send_str(json.dumps({"action": "follow", "members": ["x"]}))
                    while True:
                        message = await ws.receive(timeout=5)
                        if message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED):
                            return ws.close_code

        assert asyncio.run(scenario()) == 4029


def test_a_batch_larger_than_the_burst_is_charged_in_full(daemon):
    """The credential limit is 20 writes/s with a burst of 40: a batch of 50
    once passed every time (it cost more than the burst, so nothing was
    taken).  Now it passes on a full bucket, leaves a debt, and the
    Retry-After of the next one is when it really passes."""
    limited = token("write", sub="big-batches")
    batch = {"events": [{"member": f"bb{i}", "delta": 1} for i in range(50)]}
    statuses, retry_after = [], None
    for _ in range(10):
        status, headers = post_as(daemon, "/v1/boards/b/scores/batch",
                                  json.dumps(batch).encode(), limited)
        statuses.append(status)
        if status == 429 and retry_after is None:  # the first: later ones had time pass
            retry_after = int(headers["Retry-After"])
    assert statuses == [200] + [429] * 9
    assert retry_after == 3  # (40 + 10 of debt) / 20 per second, rounded up
    time.sleep(retry_after)
    assert call(daemon, "POST", "/v1/boards/b/scores/batch", batch, limited)[0] == 200


def test_token_buckets_charge_large_costs_in_full():
    now = [0.0]
    buckets = TokenBuckets(rate=10, burst=20, clock=lambda: now[0])
    assert buckets.take("a", 50) == 0  # a full bucket: passes, 30 in debt
    wait = buckets.take("a", 50)
    assert wait == pytest.approx(5.0)  # back to a full bucket
    now[0] += wait
    assert buckets.take("a", 50) == 0  # Retry-After kept its word
    assert buckets.take("a", 1) == pytest.approx(3.1)  # the new debt is paid first


def test_bad_credentials_are_rate_limited_by_address_before_they_are_checked():
    """Requests with invalid credentials were never rate limited: a client
    could try tokens as fast as it liked."""
    gate = Gate(Authenticator(AuthConfig(jwt_secret=SECRET)),
                RateLimiter(LimitsConfig(address_writes=5, address_reads=5)))
    outcomes = []
    for _ in range(30):
        try:
            gate.admitted("not-a-token", "top", "203.0.113.5")
        except Exception as exc:  # the type is what is checked
            outcomes.append(type(exc).__name__)
    assert outcomes[:10] == ["Unauthorized"] * 10  # the burst (2 x 5/s)
    assert set(outcomes[10:]) == {"RateLimited"}
    # A valid credential from that address waits like everyone else...
    with pytest.raises(Exception, match="too many reads from this address"):
        gate.admitted(READER, "top", "203.0.113.5")
    # ...and another address is not affected.
    assert gate.admitted(READER, "top", "198.51.100.7").name.startswith("jwt")


def test_oversized_credentials_are_refused_before_parsing(daemon):
    # Over HTTP a header line is held to 8 KiB by the parser already...
    started = time.monotonic()
    request = urllib.request.Request(f"{daemon.url}/v1/boards",
                                     headers={"Authorization": "Bearer " + "x" * (1 << 20)})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code in (400, 431) and time.monotonic() - started < 2
    assert call(daemon, "GET", "/v1/boards", credential=READER)[0] == 200
    # ...and a long malformed token just under it is refused (over TCP, where frames
    # allow more, the 8192-character cap refuses longer ones unparsed).
    status, answer = call(daemon, "GET", "/v1/boards", credential="x" * 8100)
    assert status == 401, answer
    with pytest.raises(Unauthorized, match="at most 8192"):
        Client("127.0.0.1", daemon.tcp_port, token="y" * 10_000).__enter__()


def test_a_flood_of_audit_lines_is_cut_short_and_counted(caplog):
    from rankd.security import AUDIT_BURST, audit

    with caplog.at_level("INFO", logger="rankd.audit"):
        for _ in range(AUDIT_BURST + 50):
            audit("auth_rejected", operation="top", address="192.0.2.99", reason="bad")
        audit("auth_rejected", operation="top", address="192.0.2.100", reason="bad")
    lines = [r.getMessage() for r in caplog.records if "192.0.2.99" in r.getMessage()]
    assert len(lines) == AUDIT_BURST
    assert any("192.0.2.100" in r.getMessage() for r in caplog.records)


def test_weak_or_wrong_keys_are_refused_at_start(tmp_path):
    """A public-key option given a private key once made every request 500."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    private = ec.generate_private_key(ec.SECP256R1())
    private_pem = tmp_path / "private.pem"
    private_pem.write_bytes(private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    junk = tmp_path / "junk.pem"
    junk.write_text("not a key\n")
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET + "\n")
    for config, message in (
            (ServerConfig(jwt_public_key=private_pem), "holds a private key"),
            (ServerConfig(jwt_public_key=junk), "is not a PEM public key"),
            (ServerConfig(jwt_secret="short"), "at least 32"),
            (ServerConfig(signing_secret="short"), "at least 32"),
            (ServerConfig(signing_secret=SIGNING, dedupe_ttl=60), "replayed"),
            (ServerConfig(jwt_secret=SECRET, jwt_secret_file=secret_file), "both given"),
            (ServerConfig(jwt_secret_file=tmp_path / "missing"), "jwt-secret-file")):
        with pytest.raises(ConfigError, match=message):
            config.gate()
    # A secret from a file stays out of the command line (and `ps`).
    gate = ServerConfig(jwt_secret_file=secret_file).gate()
    assert gate.authenticator.authenticate(token("read")).scopes == frozenset({"read"})


def test_issuer_audience_and_lifetime_of_tokens(tmp_path):
    config = AuthConfig(jwt_secret=SECRET, jwt_issuer="https://auth.example",
                        jwt_audience="rankd", jwt_max_lifetime=3600)
    authenticator = Authenticator(config)
    now = int(time.time())

    def signed(**claims):
        return jwt.encode({"scope": "read", "exp": now + 600, **claims}, SECRET,
                          algorithm="HS256")

    good = signed(iss="https://auth.example", aud=["rankd", "other"])
    assert authenticator.authenticate(good).scopes == frozenset({"read"})
    for bad, reason in ((signed(aud="rankd"), "iss"),
                        (signed(iss="https://evil.example", aud="rankd"), "issuer"),
                        (signed(iss="https://auth.example"), "aud"),
                        (signed(iss="https://auth.example", aud="else"), "Audience"),
                        (signed(iss="https://auth.example", aud="rankd",
                                exp=now + 30 * 86400), "longer than"),
                        (signed(iss="https://auth.example", aud="rankd", iat=now - 7200,
                                exp=now + 600), "longer than")):
        with pytest.raises(Refused, match=reason):
            authenticator.authenticate(bad)


def test_join_tokens_count_against_the_credential_that_minted_them():
    """They once shared one bucket whatever credential minted them, then
    had one of their own: they take from the bucket of their issuer."""
    authenticator = Authenticator(AuthConfig(jwt_secret=SECRET))
    player = authenticator.authenticate(token("read", sub="player-1"))
    joined = authenticator.authenticate(authenticator.join_token(player))
    assert joined.name == "jwt:player-1" and joined.subject == "player-1" and joined.joined
    server = Principal("key:gs1", frozenset({"read"}))
    assert authenticator.authenticate(authenticator.join_token(server)).name == "key:gs1"


@settings(max_examples=300, deadline=None)
@given(
    limits=st.tuples(*[st.sampled_from([0.0, 1.0, 3.0])] * 4),
    exempt=st.booleans(),
    scopes=st.sets(st.sampled_from(["read", "write", "admin"])),
    name=st.sampled_from(["anonymous", "key:k1"]),
    operation=st.sampled_from(["submit", "top", "standing", "put_board", "health"]),
    address=st.sampled_from(["127.0.0.1", "203.0.113.9", "::1"]),
    steps=st.lists(st.tuples(st.integers(0, 4), st.floats(0, 2)), max_size=12),
)
def test_a_connections_charger_admits_and_refuses_exactly_as_admit(
        limits, exempt, scopes, name, operation, address, steps):
    """``Gate.charger`` (worked out once per connection, None when nothing
    can refuse) against ``Gate.admit``: the same refusals (type and text) for
    the same costs at the same times, and None only where admit never refuses."""
    now = [0.0]

    def gate() -> Gate:
        config = LimitsConfig(*limits, exempt_loopback=exempt)
        made = Gate(Authenticator(AuthConfig()), RateLimiter(config))
        for buckets in made.limiter._buckets.values():
            buckets.clock = lambda: now[0]
        return made

    principal = Principal(name, frozenset(scopes))
    admitting, charging = gate(), gate()
    charge = charging.charger(principal, operation, address)
    for cost, wait in steps:
        now[0] += wait
        outcomes = []
        for admit in (lambda c: admitting.admit(principal, operation, address, c),
                      charge or (lambda c: None)):
            try:
                admit(cost)
                outcomes.append(None)
            except Exception as exc:  # the type and the text are compared
                outcomes.append((type(exc).__name__, str(exc)))
        assert outcomes[0] == outcomes[1]
