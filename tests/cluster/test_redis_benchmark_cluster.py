"""``redis-benchmark --cluster`` (the cluster-aware benchmark Redis ships)
against three rankd nodes: it reads the topology from ``CLUSTER NODES``,
binds each of its clients to a master, writes many boards in one slot of
each master (the hash tag it puts for ``{tag}``), and every write it
counted is applied once on the node that writes its slot
(bench/bench_scale.py runs the same load for figures)."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest
from cluster_nodes import nodes
from redis.cluster import RedisCluster

from respclient import RawClient

REQUESTS = 600


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, pg_server):
    with nodes(tmp_path_factory.mktemp("bench-cluster"), pg_server.create_database(), 3,
               "--replicas", "1") as ds:
        deadline = time.monotonic() + 15  # until every node saw every other
        while any(RawClient(d.resp_port).call("CLUSTER", "NODES").count(b"connected") != 3
                  for d in ds):
            assert time.monotonic() < deadline, "the nodes never all saw each other"
            time.sleep(0.2)
        yield ds


def test_redis_benchmark_cluster_writes_every_slot_once(cluster) -> None:
    if shutil.which("redis-benchmark") is None:
        pytest.skip("redis-benchmark is not installed")
    # One member, so each board's score counts the writes it was sent.
    done = subprocess.run(
        ["redis-benchmark", "--cluster", "-h", "127.0.0.1", "-p", str(cluster[0].resp_port),
         "-c", "6", "-n", str(REQUESTS), "-r", "1000", "--csv", "ZINCRBY",
         "rb:{tag}:__rand_int__", "1", "m"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Cluster has 3 master nodes" in done.stdout, done.stdout
    assert "Error" not in done.stdout + done.stderr, done.stdout + done.stderr
    rows = [line.replace('"', "").split(",") for line in done.stdout.splitlines()
            if line.startswith('"')]
    assert rows[0][:2] == ["test", "rps"] and float(rows[-1][1]) > 0, rows
    client = RedisCluster(host="127.0.0.1", port=cluster[1].resp_port, decode_responses=True)
    try:
        boards = set()
        for node in cluster:  # (a cluster client's KEYS lists the node's own slots)
            aware = RawClient(node.resp_port)
            aware.call("CLUSTER", "SHARDS")
            boards |= {name.decode() for name in aware.call("KEYS", "rb:*").split(b"\r\n")
                       if name.startswith(b"rb:")}
        assert len(boards) > 100
        # One slot of each master (redis-benchmark's hash tag), each on its own node.
        slots = {client.keyslot(board) for board in boards}
        assert len(slots) == 3 and {client.get_node_from_key(board).port for board in boards} \
            == {node.resp_port for node in cluster}
        assert sum(float(client.zscore(board, "m")) for board in boards) == REQUESTS
    finally:
        client.close()
