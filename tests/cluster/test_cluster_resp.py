"""Redis Cluster's protocol on a three-node rankd cluster: the CLUSTER
commands answer in the shapes a real three-node Redis Cluster answers (ids
aside), every slot is always covered, a cluster client is redirected with
``-MOVED`` while a plain client is served by any node (its commands relayed
one hop), CROSSSLOT is per slot, and real cluster clients (redis-cli -c,
redis-py RedisCluster, ioredis Cluster, node-redis createCluster) run a
leaderboard over many slots with their answers checked."""

from __future__ import annotations

import json
import re
import secrets
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import redis
from cluster_nodes import holder, nodes
from redis.cluster import RedisCluster

from daemon import free_port
from rankd.engine.groups import group_of, slot_of
from rankd.security.auth import new_api_key
from redisserver import RedisServer
from respclient import RawClient

NODE_DIR = Path(__file__).parents[1] / "clients" / "node"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, pg_server):
    with nodes(tmp_path_factory.mktemp("resp-cluster"), pg_server.create_database(), 3) as ds:
        # Until every node saw every other's heartbeat (a round of a second).
        deadline = time.monotonic() + 15
        while any(set(slot_map(d.resp_port).values()) != {n.resp_port for n in ds} for d in ds):
            assert time.monotonic() < deadline, "the nodes never all saw each other"
            time.sleep(0.2)
        yield ds


@pytest.fixture(scope="module")
def real_redis():
    """A three-node Redis Cluster on loopback (the reference for shapes)."""
    servers = [RedisServer("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                           "--cluster-port", str(free_port())) for _ in range(3)]
    try:
        done = subprocess.run(
            ["redis-cli", "--cluster", "create", *(f"127.0.0.1:{s.port}" for s in servers),
             "--cluster-replicas", "0", "--cluster-yes"], capture_output=True, text=True,
            timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        for _ in range(100):
            if b"cluster_state:ok" in RawClient(servers[0].port).call("CLUSTER", "INFO"):
                break
            subprocess.run(["sleep", "0.1"], check=True)
        yield servers
    finally:
        for server in servers:
            server.stop()


def parse(data: bytes) -> object:
    """One RESP2/RESP3 reply as Python values (maps as dicts, errors as
    ``('error', text)``)."""
    value, _ = _parse(data, 0)
    return value


def _parse(data: bytes, at: int) -> tuple[object, int]:
    end = data.index(b"\r\n", at)
    kind, body, at = data[at:at + 1], data[at + 1:end], end + 2
    if kind in b"+":
        return body.decode(), at
    if kind == b"-":
        return ("error", body.decode()), at
    if kind == b":":
        return int(body), at
    if kind == b"_":
        return None, at
    if kind == b"$":
        size = int(body)
        return (None, at) if size < 0 else (data[at:at + size].decode(), at + size + 2)
    if kind in b"*%":
        items = []
        for _ in range(int(body) * (2 if kind == b"%" else 1)):
            item, at = _parse(data, at)
            items.append(item)
        return (dict(zip(items[::2], items[1::2], strict=True)) if kind == b"%" else items), at
    raise AssertionError(f"unexpected reply {data[at - 20:at + 20]!r}")


def shape(value: object) -> object:
    """What a reply is made of, without its values."""
    if isinstance(value, list):
        return [shape(item) for item in value]
    if isinstance(value, dict):
        return {key: shape(item) for key, item in value.items()}
    return type(value).__name__


def slot_map(port: int) -> dict[int, int]:
    """slot -> RESP port of the node that writes it, from CLUSTER SLOTS."""
    found = {}
    for first, last, (_, node_port, *_rest), *_replicas in parse(
            RawClient(port).call("CLUSTER", "SLOTS")):
        for slot in range(first, last + 1):
            found[slot] = node_port
    return found


def test_cluster_commands_answer_as_a_real_redis_cluster(cluster, real_redis) -> None:
    for protocol in (2, 3):
        ours, theirs = RawClient(cluster[0].resp_port), RawClient(real_redis[0].port)
        if protocol == 3:
            ours.call("HELLO", "3")
            theirs.call("HELLO", "3")
        for words in (["CLUSTER", "SLOTS"], ["CLUSTER", "SHARDS"]):
            mine, reference = parse(ours.call(*words)), parse(theirs.call(*words))
            assert len(mine) >= 1
            assert {repr(shape(entry)) for entry in mine} == {repr(shape(reference[0]))}, words
        for words in (["CLUSTER", "MYID"], ["CLUSTER", "KEYSLOT", "{cup}:daily"],
                      ["CLUSTER", "COUNTKEYSINSLOT", "2816"],
                      ["CLUSTER", "GETKEYSINSLOT", "2816", "0"],
                      ["CLUSTER", "KEYSLOT"], ["CLUSTER", "COUNTKEYSINSLOT", "16384"],
                      ["CLUSTER", "COUNTKEYSINSLOT", "x"], ["CLUSTER", "GETKEYSINSLOT", "1", "-1"],
                      ["CLUSTER", "NOSUCH"], ["READONLY"], ["READWRITE"], ["ASKING"],
                      ["COMMAND", "GETKEYS", "ZUNIONSTORE", "d", "2", "a", "b"],
                      ["COMMAND", "GETKEYS", "ZMPOP", "2", "a", "b", "MIN"],
                      ["COMMAND", "GETKEYS", "PING", "x"], ["COMMAND", "GETKEYS", "NOSUCH"],
                      ["COMMAND", "GETKEYS", "NOSUCH", "x"], ["COMMAND", "GETKEYS", "PING"],
                      ["COMMAND", "GETKEYS", "ZADD", "k"]):
            mine, reference = ours.call(*words), theirs.call(*words)
            if words[1:2] == ["MYID"]:
                assert shape(parse(mine)) == shape(parse(reference))
                assert re.fullmatch(rb"\$40\r\n[0-9a-f]{40}\r\n", mine)
            else:
                assert mine == reference, words
    # INFO and NODES: the same fields (values are the cluster's own).
    info = parse(RawClient(cluster[1].resp_port).call("CLUSTER", "INFO"))
    reference = parse(RawClient(real_redis[1].port).call("CLUSTER", "INFO"))
    assert set(dict(line.split(":") for line in info.split("\r\n") if line)) <= set(
        dict(line.split(":") for line in reference.split("\r\n") if line))
    assert "cluster_state:ok\r\ncluster_slots_assigned:16384\r\n" in info
    lines = parse(RawClient(cluster[2].resp_port).call("CLUSTER", "NODES")).splitlines()
    reference = parse(RawClient(real_redis[2].port).call("CLUSTER", "NODES")).splitlines()
    assert len(lines) == len(reference) == 3
    assert sum("myself,master" in line for line in lines) == 1
    for line in lines:
        fields = line.split(" ")
        assert re.fullmatch(r"[0-9a-f]{40}", fields[0]) and fields[3] == "-"
        assert fields[7] == "connected" and len(fields) >= 8


def test_every_slot_is_always_covered_and_nodes_agree(cluster) -> None:
    maps = [slot_map(node.resp_port) for node in cluster]
    assert all(sorted(found) == list(range(16384)) for found in maps)
    assert maps[0] == maps[1] == maps[2]
    assert set(maps[0].values()) == {node.resp_port for node in cluster}
    # A group is a range of 16 slots on one node.
    for group in range(1024):
        assert len({maps[0][slot] for slot in range(16 * group, 16 * group + 16)}) == 1
    for words in (["CLUSTER", "KEYSLOT", "arena"], ["CLUSTER", "KEYSLOT", "123456789"]):
        assert RawClient(cluster[0].resp_port).call(*words) == b":%d\r\n" % slot_of(words[2])


def _key_written_elsewhere(cluster, prefix: str) -> tuple[str, int, int]:
    """A key, the RESP port of the node that writes its slot, and another node's."""
    found = slot_map(cluster[0].resp_port)
    for n in range(1000):
        key = f"{prefix}:{n}"
        owner = found[slot_of(key)]
        if owner != cluster[0].resp_port:
            return key, owner, cluster[0].resp_port
    raise AssertionError("no key of another node")


def test_a_cluster_client_is_moved_and_a_plain_one_relayed(cluster) -> None:
    key, owner, other = _key_written_elsewhere(cluster, "routed")
    plain = RawClient(other)
    # A plain client is served by any node: its write relayed one hop, its reads too.
    assert plain.call("ZADD", key, "5", "alice") == b":1\r\n"
    for _ in range(20):
        assert plain.call("ZINCRBY", key, "1", "alice") is not None
        assert plain.call("ZSCORE", key, "alice") != b"$-1\r\n"
    assert plain.call("ZSCORE", key, "alice") == b"$2\r\n25\r\n"
    assert plain.pipeline([["ZINCRBY", key, "1", "alice"], ["ZSCORE", key, "alice"]]) == [
        b"$2\r\n26\r\n", b"$2\r\n26\r\n"]
    # A client that asked for the topology is sent where the slot is written.
    aware = RawClient(other)
    parse(aware.call("CLUSTER", "SLOTS"))
    moved = f"-MOVED {slot_of(key)} 127.0.0.1:{owner}\r\n".encode()
    assert aware.call("ZADD", key, "1", "bob") == moved
    assert aware.call("ZSCORE", key, "alice") == moved
    assert aware.pipeline([["ZSCORE", key, "alice"], ["ZCARD", key]]) == [moved, moved]
    # READONLY: this node's copy answers (a follower, fresh within its bound).
    assert aware.call("READONLY") == b"+OK\r\n"
    assert aware.call("ZADD", key, "1", "bob") == moved  # (writes still move)
    deadline = time.monotonic() + 10
    while (read := aware.call("ZSCORE", key, "alice")) != b"$2\r\n26\r\n":
        # A follower may lag, or not yet vouch for its copy (a retry, never a wrong answer).
        assert not read.startswith(b"-") or read.startswith(b"-TRYAGAIN "), read
        assert time.monotonic() < deadline, "the follower never showed the write"
        time.sleep(0.05)
    assert aware.call("READWRITE") == b"+OK\r\n"
    assert aware.call("ZSCORE", key, "alice") == moved
    # At the node that writes the slot, nothing moves.
    direct = RawClient(owner)
    parse(direct.call("CLUSTER", "SHARDS"))
    assert direct.call("ZSCORE", key, "alice") == b"$2\r\n26\r\n"


def test_crossslot_is_per_slot(cluster) -> None:
    # Two keys of one group (so of one node) but of two slots.
    base = "xs"
    other = next(f"xs{n}" for n in range(100_000)
                 if group_of(f"xs{n}") == group_of(base) and slot_of(f"xs{n}") != slot_of(base))
    owner = slot_map(cluster[0].resp_port)[slot_of(base)]
    client = RawClient(owner)
    assert client.call("ZADD", base, "1", "a") == b":1\r\n"
    assert client.call("ZADD", other, "1", "a") == b":1\r\n"
    crossslot = b"-CROSSSLOT Keys in request don't hash to the same slot\r\n"
    assert client.call("DEL", base, other) == crossslot
    assert client.call("ZUNIONSTORE", base, "2", base, other) == crossslot
    assert client.pipeline([["MULTI"], ["ZADD", base, "2", "b"], ["ZADD", other, "2", "b"],
                            ["EXEC"], ["ZCARD", base]]) == [
        b"+OK\r\n", b"+QUEUED\r\n", b"+QUEUED\r\n", crossslot, b":1\r\n"]
    # One hash tag, one slot: allowed.
    assert client.call("DEL", "{t}a", "{t}b") == b":0\r\n"
    assert client.call("DEL", base) == b":1\r\n" and client.call("DEL", other) == b":1\r\n"


KEYS = [f"lb:{n}" for n in range(120)]


def _leaderboard(run, prefix: str) -> None:
    for n, key in enumerate(KEYS):
        key = f"{prefix}{key}"
        assert run("ZADD", key, n, "alice", n + 1, "bob") == 2
        assert float(run("ZINCRBY", key, 10, "alice")) == n + 10
    for n, key in enumerate(KEYS):
        key = f"{prefix}{key}"
        assert float(run("ZSCORE", key, "alice")) == n + 10
        assert run("ZREVRANK", key, "bob") == 1
        assert run("ZCARD", key) == 2


def test_redis_py_cluster_client(cluster) -> None:
    client = RedisCluster(host="127.0.0.1", port=cluster[1].resp_port, decode_responses=True)
    try:
        assert len(client.get_primaries()) == 3
        _leaderboard(client.execute_command, "py:")
        assert client.zunionstore("{s}:all", ["{s}:a", "{s}:b"]) == 0
        assert len({client.keyslot(f"py:{key}") for key in KEYS}) > 100
    finally:
        client.close()
    # To a connection that asked for the topology, each node lists the keys
    # of its own slots (as each Redis Cluster node does): each key once.
    listed = []
    for node in cluster:
        aware = RawClient(node.resp_port)
        aware.call("CLUSTER", "SHARDS")
        listed += parse(aware.call("KEYS", "py:*"))
        scanned = parse(aware.call("SCAN", "0", "MATCH", "py:*", "COUNT", "1000"))[1]
        assert sorted(scanned) == sorted(parse(aware.call("KEYS", "py:*")))
    assert sorted(listed) == sorted(f"py:{key}" for key in KEYS)
    # A plain connection lists every key, as one Redis (every node holds
    # every group here), from this node's copies: once they caught up.
    plain, deadline = RawClient(cluster[1].resp_port), time.monotonic() + 10
    while len(parse(plain.call("KEYS", "py:*"))) != len(KEYS):
        assert time.monotonic() < deadline, parse(plain.call("KEYS", "py:*"))
        time.sleep(0.05)


def test_redis_cli_follows_moved(cluster) -> None:
    cli = shutil.which("redis-cli")
    if cli is None:
        pytest.skip("redis-cli is not installed")
    script = "".join(f"ZADD cli:{key} {n} alice\nZSCORE cli:{key} alice\n"
                     for n, key in enumerate(KEYS[:40]))
    done = subprocess.run([cli, "-c", "-p", str(cluster[2].resp_port)], input=script,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [word for n in range(40) for word in ("1", str(n))]


@pytest.mark.parametrize("which", ["io", "node"])
@pytest.mark.npm("tests/clients/node")
def test_node_cluster_clients(cluster, which) -> None:
    node = shutil.which("node")
    if node is None or not (NODE_DIR / "node_modules" / "ioredis").is_dir():
        pytest.skip("node and tests/clients/node's packages are needed")
    done = subprocess.run([node, str(NODE_DIR / "cluster.mjs"), which,
                           str(cluster[0].resp_port), "80"], capture_output=True, text=True,
                          timeout=120, cwd=NODE_DIR)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["added"] == [2] * 80
    assert [float(score) for score in out["scores"]] == [n + 10 for n in range(80)]
    assert out["tops"] == [["alice"]] * 80
    assert out["tagged"] == 1 and out["nodes"] == 3
    if which == "io":
        assert out["pipelined"][-4:] == ["5"] * 4


def test_a_plain_redis_py_client_works_against_any_node(cluster) -> None:
    for node in cluster:
        client = redis.Redis(port=node.resp_port, decode_responses=True)
        _leaderboard(client.execute_command, f"plain{node.resp_port}:")
        client.close()


def test_a_relayed_reply_follows_the_clients_protocol_as_it_changes(cluster) -> None:
    """A plain client's relayed commands are answered in the protocol it
    speaks now: its link to the far node was greeted in the version (and
    credential) of the client's first relayed command and kept, so after
    ``HELLO 3`` a relayed ``ZSCORE`` came back as RESP2's bulk string, and
    after ``HELLO 2`` a relayed one as RESP3's double."""
    key, _, other = _key_written_elsewhere(cluster, "protocol")
    plain = RawClient(other)
    assert plain.call("ZADD", key, "1.5", "alice") == b":1\r\n"
    assert plain.call("ZSCORE", key, "alice") == b"$3\r\n1.5\r\n"
    assert plain.call("HELLO", "3").startswith(b"%")
    assert plain.call("ZSCORE", key, "alice") == b",1.5\r\n"
    assert plain.call("ZRANGE", key, "0", "0", "WITHSCORES") == (
        b"*1\r\n*2\r\n$5\r\nalice\r\n,1.5\r\n")
    assert plain.call("HELLO", "2").startswith(b"*")
    assert plain.call("ZSCORE", key, "alice") == b"$3\r\n1.5\r\n"
    plain.close()


def test_a_relayed_command_runs_as_the_caller_the_client_authenticated_as_last(
        tmp_path: Path, pg_server) -> None:
    """A client that authenticates again (here from a read credential to a
    write one) has its relayed commands run as the new caller: its link to
    the far node was authenticated once, with the first credential, so a
    relayed write the node admitted was refused there (``NOPERM``)."""
    reader, reader_entry = new_api_key("reader", "read")
    writer, writer_entry = new_api_key("writer", "read+write+admin")
    dsn = pg_server.create_database()
    with nodes(tmp_path, dsn, 2, "--api-keys",
               f"{reader_entry},{writer_entry}",
               "--cluster-secret", secrets.token_hex(32)) as (first, second):
        auth = {"Authorization": f"Bearer {writer}"}
        assert first.request("PUT", "/v1/boards/relayed", {}, headers=auth)[0] == 201
        deadline = time.monotonic() + 20
        while (moved := first.request("POST", "/v1/cluster/moves",
                                      {"group": group_of("relayed"), "node": "n1"},
                                      headers=auth))[0] != 202:
            assert time.monotonic() < deadline, moved  # (until each node saw the other)
            time.sleep(0.2)
        while holder(dsn, group_of("relayed")) != "n1":
            assert time.monotonic() < deadline, "the group never moved"
            time.sleep(0.2)
        while second.request("POST", "/v1/boards/relayed/scores", {"member": "bob", "score": 2},
                             headers=auth)[0] != 200:
            assert time.monotonic() < deadline, "the group's new primary never wrote"
            time.sleep(0.2)
        # A read of it is relayed now, on a link authenticated as the reader.
        plain = RawClient(first.resp_port)
        assert plain.call("AUTH", reader) == b"+OK\r\n"
        assert plain.call("ZADD", "relayed", "1", "ann").startswith(b"-NOPERM")
        assert plain.call("ZSCORE", "relayed", "bob") == b"$1\r\n2\r\n"
        assert plain.call("AUTH", writer) == b"+OK\r\n"
        assert plain.call("ZADD", "relayed", "3", "ann") == b":1\r\n"
        assert plain.call("ZSCORE", "relayed", "ann") == b"$1\r\n3\r\n"
        plain.close()
