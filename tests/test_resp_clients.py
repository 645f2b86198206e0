"""Real Redis clients against rankd's RESP port, each running the same
leaderboard scenario and checking its answers: redis-cli (scripted),
redis-py (sync and asyncio, RESP2 and RESP3) and ioredis under Node.

CI installs them all (``redis-tools`` with ``redis-server``, ``redis`` from
the test extras, ``npm ci`` in tests/clients/node) and sets
``RANKD_REQUIRE_CLIENTS`` so none of these can silently skip there.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import redis
import redis.asyncio

from daemon import Daemon

NODE_DIR = Path(__file__).parent / "clients" / "node"
REQUIRED = os.environ.get("RANKD_REQUIRE_CLIENTS", "") not in ("", "0")


def _unavailable(reason: str) -> None:
    if REQUIRED:
        pytest.fail(f"{reason} (RANKD_REQUIRE_CLIENTS is set)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with Daemon(tmp_path_factory.mktemp("resp-clients") / "data", "--tcp-port", "0") as running:
        yield running


def _check_scenario(key: str, run) -> None:
    """The scenario every client runs; ``run(command, *args)`` calls it."""
    assert run("ZADD", key, 100, "alice", 250, "bob", 175, "carol") == 3
    assert float(run("ZINCRBY", key, 100, "alice")) == 200
    top = run("ZREVRANGE", key, 0, 2, "WITHSCORES")
    assert [(m, float(s)) for m, s in top] == [("bob", 250), ("alice", 200), ("carol", 175)]
    assert run("ZREVRANK", key, "bob") == 0
    assert float(run("ZSCORE", key, "carol")) == 175
    assert run("ZSCORE", key, "nobody") is None
    assert run("ZCARD", key) == 3
    assert run("ZCOUNT", key, 180, "+inf") == 2
    assert run("ZREM", key, "carol") == 1
    assert run("DEL", key) == 1
    assert run("EXISTS", key) == 0


@pytest.mark.parametrize("protocol", [2, 3])
def test_redis_py_sync(daemon, protocol):
    client = redis.Redis(port=daemon.resp_port, protocol=protocol, decode_responses=True)
    try:
        assert client.ping() is True

        def run(name: str, *args):
            if name == "ZREVRANGE":
                return client.zrevrange(args[0], args[1], args[2], withscores=True)
            return client.execute_command(name, *args)
        _check_scenario(f"py{protocol}", run)
        pipe = client.pipeline(transaction=False)
        for i in range(200):
            pipe.zincrby(f"pipe{protocol}", 1, f"p{i % 10}")
        results = pipe.execute()
        assert results[-10:] == [20.0] * 10
        top = client.zrevrange(f"pipe{protocol}", 0, 0, withscores=True)
        assert [tuple(entry) for entry in top] == [("p9", 20.0)]  # RESP3: lists
        assert client.zrank(f"pipe{protocol}", "p0", withscore=True) == [0, 20.0]
        assert client.info()["redis_version"] == "7.2.0"
    finally:
        client.close()


@pytest.mark.parametrize("protocol", [2, 3])
def test_redis_py_asyncio(daemon, protocol):
    async def scenario() -> None:
        client = redis.asyncio.Redis(port=daemon.resp_port, protocol=protocol,
                                     decode_responses=True)
        try:
            key = f"apy{protocol}"
            assert await client.zadd(key, {"alice": 100, "bob": 250, "carol": 175}) == 3
            assert await client.zincrby(key, 100, "alice") == 200.0
            top = await client.zrevrange(key, 0, 2, withscores=True)
            assert [tuple(e) for e in top] == [("bob", 250.0), ("alice", 200.0),
                                               ("carol", 175.0)]
            assert await client.zadd(key, {"alice": 150}, gt=True, ch=True) == 0
            assert await client.zadd(key, {"alice": 300}, gt=True, ch=True) == 1
            popped = await client.zpopmax(key)
            assert popped in ([("alice", 300.0)], ["alice", 300.0])  # RESP2, RESP3
            results = await asyncio.gather(*(client.zincrby(key, 1, "crowd")
                                             for _ in range(50)))
            assert max(results) == 50.0
            assert await client.delete(key) == 1
        finally:
            await client.aclose()
    asyncio.run(scenario())


def test_redis_cli_scripted(daemon):
    cli = shutil.which("redis-cli")
    if cli is None:
        _unavailable("redis-cli is not installed")
    script = "\n".join([
        "ZADD cli 100 alice 250 bob 175 carol", "ZINCRBY cli 100 alice",
        "ZREVRANGE cli 0 2 WITHSCORES", "ZREVRANK cli bob", "ZCARD cli", "DEL cli",
        "EXISTS cli"]) + "\n"
    done = subprocess.run([cli, "-p", str(daemon.resp_port)], input=script,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["3", "200", "bob", "250", "alice", "200", "carol", "175",
                                   "0", "3", "1", "0"]
    # And interactively-minded tooling: INFO and COMMAND DOCS hints parse.
    info = subprocess.run([cli, "-p", str(daemon.resp_port), "INFO", "server"],
                          capture_output=True, text=True, timeout=30)
    assert "redis_version:7.2.0" in info.stdout


@pytest.mark.npm("tests/clients/node")
def test_ioredis(daemon):
    node = shutil.which("node")
    if node is None:
        _unavailable("node is not installed")
    if not (NODE_DIR / "node_modules" / "ioredis").is_dir():
        _unavailable("ioredis is not installed: run `npm ci` in tests/clients/node")
    done = subprocess.run([node, str(NODE_DIR / "leaderboard.mjs"), str(daemon.resp_port),
                           "io"], capture_output=True, text=True, timeout=60, cwd=NODE_DIR)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["added"] == 3 and out["incremented"] == "200"
    assert out["top"] == ["bob", "250", "alice", "200", "carol", "175"]
    assert (out["rankOfBob"], out["scoreOfCarol"], out["card"]) == (0, "175", 3)
    assert (out["countAbove"], out["removed"]) == (2, 1)
    assert out["pipelined"][-10:] == ["10"] * 10
    assert out["byScore"] == ["p0", "p1", "p2"]
    assert (out["deleted"], out["exists"]) == (1, 0)
