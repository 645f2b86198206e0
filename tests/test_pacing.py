"""Pacing the event loop (``--pacing-us``): while many clients' requests
flow, passes end with a short sleep instead of blocking in the poll; one
client at a time, or an idle daemon, never see it."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
import urllib.request
from types import SimpleNamespace

import pytest

from daemon import Daemon
from rankd.frontends.pacing import BUSY_REQUESTS, MIN_CONNECTIONS, LoopPacer


def _counts() -> SimpleNamespace:
    """What a ``LaneCounts`` shows the pacer."""
    return SimpleNamespace(write_ok=0, read_ok=0, submit_ok=0, armed=False, wake=None)


def test_the_pacer_pauses_only_after_passes_answering_a_small_share_of_many_clients():
    async def scenario():
        loop = asyncio.get_running_loop()
        slept: list[float] = []
        pacer = LoopPacer(20e-6)
        counts = _counts()
        pacer.attach(counts)
        server = object()
        committed: list[int] = []

        async def a_pass(answered: int) -> None:
            """A pass of the loop: its first request wakes the pacer after the
            engine queued the pass's commit; the others are counted."""
            if answered:
                loop.call_soon(committed.append, pacer.pauses)  # the commit of the pass
                counts.read_ok += answered
                if counts.armed:
                    counts.wake()
            await asyncio.sleep(0)  # the pass's callbacks run

        assert counts.wake == pacer.wake and not counts.armed  # no connections yet
        pacer.set_active(server, MIN_CONNECTIONS - 1)
        assert not counts.armed  # too few clients to gain from pauses
        pacer.set_active(server, 40)
        assert counts.armed

        original_sleep = time.sleep
        time.sleep = slept.append  # the pacer's pause, recorded rather than slept
        try:
            await a_pass(10)  # 10 of 40 clients: pause, after the pass's commit
            assert slept == [20e-6] and pacer.pauses == 1 and committed == [0]
            assert counts.armed  # for the next pass
            await a_pass(1)  # one request: no pause
            await a_pass(30)  # most clients wait for this server: no pause
            assert pacer.pauses == 1
            pacer.set_active(server, 400)
            await a_pass(BUSY_REQUESTS)  # the loop has work enough: no pause
            await a_pass(BUSY_REQUESTS - 1)
            assert pacer.pauses == 2
            await a_pass(0)  # a pass without lane requests is not watched
            assert pacer.pauses == 2 and counts.armed and not loop._ready  # nothing spins
            pacer.set_active(server, 2)
            assert not counts.armed
            counts.read_ok += 500  # answered while unwatched: not one pass
            pacer.set_active(server, 40)
            await a_pass(5)
            assert pacer.pauses == 3
        finally:
            time.sleep = original_sleep
        with pytest.raises(ValueError):
            LoopPacer(0)

    asyncio.run(scenario())


def _benchmark(port: int, clients: int, requests: int, *command: str) -> None:
    subprocess.run(["redis-benchmark", "-p", str(port), "-c", str(clients), "-n", str(requests),
                    "-r", "1000", "-q", *(command or ("ZSCORE", "lb", "m:__rand_int__"))],
                   check=True, capture_output=True, timeout=120)


def _metrics(daemon: Daemon) -> str:
    with urllib.request.urlopen(daemon.url + "/metrics", timeout=10) as response:
        return response.read().decode()


def _pauses(daemon: Daemon) -> float:
    for line in _metrics(daemon).splitlines():
        if line.startswith("rankd_loop_pauses_total "):
            return float(line.split()[1])
    raise AssertionError("no rankd_loop_pauses_total in /metrics")


@pytest.fixture
def benchmark_tool():
    if shutil.which("redis-benchmark") is None:
        if os.environ.get("RANKD_REQUIRE_CLIENTS", "") not in ("", "0"):
            pytest.fail("redis-benchmark is required (RANKD_REQUIRE_CLIENTS) but not installed")
        pytest.skip("redis-benchmark is not installed")


def test_a_daemon_paces_many_clients_not_one_and_rests_when_idle(tmp_path, benchmark_tool):
    with Daemon(tmp_path / "paced", "--tcp-port", "0", "--pacing-us", "10") as daemon:
        if daemon.implementations()["lanes"] != "native":
            pytest.skip("the pacer serves the native lanes")
        _benchmark(daemon.resp_port, 1, 3000, "ZADD", "lb", "__rand_int__", "m:__rand_int__")
        _benchmark(daemon.resp_port, 1, 3000)
        time.sleep(1.2)  # a sweep of the connections
        assert _pauses(daemon) == 0  # one client: never paced
        # Many clients: paced once a sweep (every SWEEP_SECONDS) counted them
        # active, which a quick run may end before; so runs until one did.
        for _ in range(5):
            _benchmark(daemon.resp_port, 50, 60_000)
            paused = _pauses(daemon)
            if paused > 0:
                break
        assert paused > 0
        # Idle again: no pauses, and the loop sleeps in its poll.
        time.sleep(0.2)
        cpu = _cpu_seconds(daemon.process.pid)
        time.sleep(1.0)
        assert _pauses(daemon) == paused
        assert _cpu_seconds(daemon.process.pid) - cpu < 0.1
    # Off unless asked for (bench/bench_pacer.py found no gain here).
    with Daemon(tmp_path / "unpaced", "--tcp-port", "0") as daemon:
        _benchmark(daemon.resp_port, 50, 20_000, "ZADD", "lb", "__rand_int__", "m:__rand_int__")
        assert "rankd_loop_pauses_total" not in _metrics(daemon)


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
