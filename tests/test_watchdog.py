"""The loop watchdog: a held event loop is measured (``rankd_loop_stall_seconds``),
logged with the front-end and command that held it, and reported while it is
still held; the heartbeat itself does little work."""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from daemon import SRC, Daemon
from rankd.watchdog import ACTIVITY, CPU_EVERY, LoopWatchdog

try:
    import uvloop
except ImportError:  # the daemon falls back to asyncio's loop, so do the tests
    uvloop = None


def run_on_loop(coroutine_function) -> None:
    """Run a coroutine on the loop the daemon uses."""
    if uvloop is not None:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(coroutine_function())
    else:
        asyncio.run(coroutine_function())


def held(seconds: float, frontend: str | None, command: str | None) -> None:
    """A callback that holds the loop, as a front-end's request would."""
    ACTIVITY.frontend, ACTIVITY.command = frontend, command
    time.sleep(seconds)


def test_a_held_loop_is_measured_and_logged_with_who_held_it(caplog):
    watchdog = LoopWatchdog()

    async def scenario() -> None:
        watchdog.start()
        try:
            await asyncio.sleep(0.05)
            asyncio.get_running_loop().call_soon(held, 0.3, "resp", "keys")
            await asyncio.sleep(0.1)
        finally:
            watchdog.stop()

    with caplog.at_level(logging.WARNING, logger="rankd.watchdog"):
        run_on_loop(scenario)
    warnings = [r.getMessage() for r in caplog.records if "event loop held" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "front-end resp, command keys" in warnings[0]
    assert watchdog.stalls == 1
    buckets = dict(watchdog.histogram.buckets())
    assert buckets["0.5"] - buckets["0.1"] == 1  # the one stall, of 0.3 s
    assert buckets["+Inf"] == watchdog.histogram.count >= 3  # the beats before it


def test_an_unmarked_stall_is_named_by_the_stack_and_never_by_an_old_marker(caplog):
    watchdog = LoopWatchdog()

    async def scenario() -> None:
        watchdog.start()
        try:
            ACTIVITY.frontend, ACTIVITY.command = "tcp", "top"  # an earlier request's
            await asyncio.sleep(0.05)  # heartbeats meanwhile clear it
            asyncio.get_running_loop().call_soon(time.sleep, 0.25)
            await asyncio.sleep(0.1)
        finally:
            watchdog.stop()

    with caplog.at_level(logging.WARNING, logger="rankd.watchdog"):
        run_on_loop(scenario)
    warnings = [r.getMessage() for r in caplog.records if "event loop held" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "front-end unknown, command unknown" in warnings[0]


def test_a_loop_held_for_good_is_reported_while_it_is_held(caplog):
    watchdog = LoopWatchdog(stuck_seconds=0.3)
    reported_while_held: list[bool] = []

    def stuck() -> None:
        ACTIVITY.frontend, ACTIVITY.command = "resp", None
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:  # pure Python: the watcher gets the GIL
            pass
        reported_while_held.append(any("still held" in r.getMessage() for r in caplog.records))

    async def scenario() -> None:
        watchdog.start()
        try:
            await asyncio.sleep(0.05)
            asyncio.get_running_loop().call_soon(stuck)
            await asyncio.sleep(0.1)
        finally:
            watchdog.stop()

    with caplog.at_level(logging.WARNING, logger="rankd.watchdog"):
        run_on_loop(scenario)
    assert reported_while_held == [True]
    still = [r.getMessage() for r in caplog.records if "still held" in r.getMessage()]
    assert "front-end resp" in still[0]
    assert "test_watchdog" not in still[0]  # only rankd's own frames are shown


def test_the_heartbeat_does_little_work_and_few_system_calls():
    """Each heartbeat's own work, counted, not timed (its CPU and an idle
    daemon's are measured by bench/bench_watchdog.py): a beat on time runs
    a handful of the watchdog's functions, logs nothing, and reads the
    CPU clocks (system calls) only every ``CPU_EVERY`` beats."""
    watchdog = LoopWatchdog()
    beats = 1_000
    calls: collections.Counter[str] = collections.Counter()
    watchdog_file = sys.modules[LoopWatchdog.__module__].__file__

    def counted(frame, event: str, arg) -> None:
        if event == "call" and frame.f_code.co_filename == watchdog_file:
            calls[frame.f_code.co_qualname] += 1
        elif event == "c_call" and arg.__name__ in ("getrusage", "process_time",
                                                    "thread_time", "clock_gettime"):
            calls["system: " + arg.__name__] += 1

    async def scenario() -> None:
        watchdog._loop = asyncio.get_running_loop()
        watchdog._schedule()
        watchdog._handle.cancel()
        sys.setprofile(counted)
        try:
            for _ in range(beats):
                watchdog._due = time.monotonic()  # (on time)
                watchdog._beat()
                watchdog._handle.cancel()
        finally:
            sys.setprofile(None)

    run_on_loop(scenario)
    own = sum(n for name, n in calls.items() if not name.startswith("system: "))
    system = sum(n for name, n in calls.items() if name.startswith("system: "))
    assert watchdog.stalls == 0
    assert calls["LoopWatchdog._beat"] == beats
    assert own <= 6 * beats, calls  # _beat, observe, clear, _schedule, and CpuSplit's share
    assert 0 < system <= 3 * beats // CPU_EVERY, calls


STALL_HOOK = """\
    # Test-only: ``ECHO stall:<seconds>`` holds the event loop, as a slow
    # command would.  Loaded by the daemon under test as sitecustomize.
    import dataclasses
    import time

    from rankd.frontends.resp import commands

    _echo = commands.COMMANDS[b"echo"]


    def _stalling_echo(conn, args):
        if args[1].startswith(b"stall:"):
            time.sleep(float(args[1][6:]))
        return _echo.handler(conn, args)


    commands.COMMANDS[b"echo"] = dataclasses.replace(_echo, handler=_stalling_echo)
"""


def stall_count(daemon: Daemon) -> dict[str, float]:
    with urllib.request.urlopen(daemon.url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    return {line.split("{le=")[1].split("}")[0].strip('"'): float(line.split()[-1])
            for line in text.splitlines()
            if line.startswith("rankd_loop_stall_seconds_bucket")}


@pytest.fixture
def stalling_daemon(tmp_path: Path):
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(textwrap.dedent(STALL_HOOK))
    with Daemon(tmp_path / "data", env={"PYTHONPATH": f"{hook}:{SRC}"}) as daemon:
        yield daemon


def test_the_daemon_logs_and_counts_a_stall_naming_the_resp_command(stalling_daemon):
    daemon = stalling_daemon
    deadline = time.monotonic() + 5
    while not (before := stall_count(daemon)) or before["+Inf"] == 0:  # it starts last
        assert time.monotonic() < deadline, "the heartbeat does not run"
        time.sleep(0.05)
    with socket.create_connection(("127.0.0.1", daemon.resp_port), timeout=5) as client:
        client.sendall(b"*2\r\n$4\r\nECHO\r\n$9\r\nstall:0.3\r\n")
        assert client.recv(100) == b"$9\r\nstall:0.3\r\n"
    assert daemon.wait_for_log("event loop held for 0.")
    line = next(line for line in daemon.log().splitlines() if "event loop held" in line)
    assert "front-end resp, command echo" in line
    assert "frontends/resp/connection.py" in line  # the sampled stack
    after = stall_count(daemon)
    assert after["+Inf"] - after["0.1"] >= 1 + before["+Inf"] - before["0.1"]
