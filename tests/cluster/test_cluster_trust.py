"""Who a cluster node trusts (docs/cluster.md, "Trust"): a row in
``rankd_nodes`` that no node with the cluster secret wrote gets neither
forwarded writes nor clients' credentials, and a node accepts a forward
only with a valid node credential."""

from __future__ import annotations

import secrets
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

import pytest
from cluster_nodes import holder, nodes, sql

from daemon import SRC
from rankd.client import Client, RankdError
from rankd.cluster.groups import group_of
from rankd.security.auth import new_api_key

OPEN = "open"
#: A member whose name a forward's path holds percent-encoded (its signature
#: covers the path as each node reads it).
MEMBER = "été ann/1"


class Listener:
    """A TCP listener on loopback posing as a node: it keeps every byte sent
    to it, and answers HTTP requests 200 (as a rogue node would, to look
    like it applied them)."""

    def __init__(self, http: bool) -> None:
        self.http = http
        self.received = bytearray()
        self.connections = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._talk, args=(conn,), daemon=True).start()

    def _talk(self, conn: socket.socket) -> None:
        conn.settimeout(5)
        with conn:
            try:
                while data := conn.recv(65536):
                    self.received += data
                    if self.http and b"\r\n\r\n" in data:
                        body = b'{"score": 1.0, "seq": 1, "epoch": 99}'
                        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            except OSError:
                return

    def close(self) -> None:
        self.sock.close()


def test_a_rogue_row_in_rankd_nodes_gets_no_forwarded_writes_and_no_credentials(
        tmp_path: Path, pg_dsn: str) -> None:
    key, entry = new_api_key("app", "read+write+admin")
    auth = {"Authorization": f"Bearer {key}"}
    rogue_http, rogue_tcp = Listener(http=True), Listener(http=False)
    with nodes(tmp_path, pg_dsn, 2, "--api-keys", entry,
               "--cluster-secret", secrets.token_hex(32)) as (first, second):
        status, _ = first.request("PUT", "/v1/boards/vault", {"policy": "sum"}, headers=auth)
        assert status == 201
        status, _ = first.request("PUT", f"/v1/boards/{OPEN}", {"policy": "sum"}, headers=auth)
        assert status == 201
        group = group_of("vault")
        assert group != group_of(OPEN)
        # The rogue: a node row of its own, alive for an hour, and the group's
        # register pointing at it (anyone who can write these tables can).
        sql(pg_dsn, "INSERT INTO rankd_nodes (node_id, advertise, advertise_tcp, applied, "
                    "seen_at) VALUES ('rogue', $1, $2, '{}', now() + interval '1 hour')",
            rogue_http.address, rogue_tcp.address)
        sql(pg_dsn, "UPDATE rankd_groups SET epoch = epoch + 1, holder = 'rogue', "
                    "lease_until = now() + interval '1 hour' WHERE group_id = $1", group)
        time.sleep(2.0)  # every node has read the registers and the nodes since
        assert holder(pg_dsn, group) == "rogue"
        status, body = second.request("POST", "/v1/boards/vault/scores",
                                      {"member": "ann", "delta": 5}, headers=auth)
        assert status != 200, body
        with Client("127.0.0.1", second.tcp_port, token=key, timeout=3, retries=0) as client, \
                pytest.raises(RankdError):
            client.submit("vault", "bob", delta=5)
        time.sleep(0.3)
        assert key.encode() not in rogue_http.received and not rogue_http.received
        assert key.encode() not in rogue_tcp.received and rogue_tcp.connections == 0
        # A real node's forward still goes through, signed with the node's own
        # credential: the primary of OPEN applies what its follower forwards.
        writer = first if holder(pg_dsn, group_of(OPEN)) == "n0" else second
        other = second if writer is first else first
        for member in ("ann", MEMBER):
            status, body = other.request("POST", f"/v1/boards/{OPEN}/scores",
                                         {"member": member, "delta": 5}, headers=auth)
            assert status == 200, body
        status, seen = writer.request("GET", f"/v1/boards/{OPEN}/members/ann", headers=auth)
        assert status == 200 and seen["score"] == 5.0
        path = f"/v1/boards/{OPEN}/members/{urllib.parse.quote(MEMBER, safe='')}"
        assert other.request("GET", f"{path}?min_seq={body['seq']}", headers=auth)[0] == 200
        status, body = other.request("DELETE", path, headers=auth)
        assert status in (200, 204), body
        assert writer.request("GET", path, headers=auth)[0] == 404
    rogue_http.close()
    rogue_tcp.close()


def test_a_forward_without_a_valid_node_credential_is_refused(tmp_path: Path,
                                                               pg_dsn: str) -> None:
    key, entry = new_api_key("app", "read+write+admin")
    auth = {"Authorization": f"Bearer {key}"}
    with nodes(tmp_path, pg_dsn, 1, "--api-keys", entry,
               "--cluster-secret", secrets.token_hex(32)) as (only,):
        assert only.request("PUT", "/v1/boards/b", {"policy": "sum"}, headers=auth)[0] == 201
        for forged in ({"X-Rankd-Forwarded-By": "n1"},
                       {"X-Rankd-Forwarded-By": "n1", **auth},
                       {"X-Rankd-Forwarded-By": "n1",
                        "X-Rankd-Forward-Auth": "v1 ts=1 nonce=00 principal=e30 sig=00"}):
            status, body = only.request("POST", "/v1/boards/b/scores",
                                        {"member": "eve", "delta": 1}, headers=forged)
            assert status == 401, (forged, body)
        status, body = only.request("GET", "/v1/boards/b/members/eve", headers=auth)
        assert status == 404, body


def test_a_node_with_credentials_needs_a_cluster_secret(tmp_path: Path) -> None:
    _, entry = new_api_key("app", "admin")
    done = subprocess.run(
        [sys.executable, "-m", "rankd.cli", "serve", "--data-dir", str(tmp_path / "d"),
         "--cluster-dsn", "postgresql://nobody@127.0.0.1:1/none", "--api-keys", entry],
        env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
        timeout=60)
    assert done.returncode == 2, done.stderr
    assert "--cluster-secret" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    short = tmp_path / "short"
    short.write_text("too short\n")
    done = subprocess.run(
        [sys.executable, "-m", "rankd.cli", "serve", "--data-dir", str(tmp_path / "d"),
         "--cluster-dsn", "postgresql://nobody@127.0.0.1:1/none", "--api-keys", entry,
         "--cluster-secret-file", str(short)],
        env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
        timeout=60)
    assert done.returncode == 2 and "--cluster-secret" in done.stderr, done.stderr
