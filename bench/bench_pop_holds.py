"""Pipelined pops on the general path: how long they hold the event loop,
at two source trees side by side.

    python bench/bench_pop_holds.py --base /path/to/other/tree [--rounds 3]

A REST-made board of two windows (``all``, ``daily``) and member labels
(pops there skip the native lane, ``resp/pop_lane.py``) is filled with
``--members`` members, the daemon restarted (the state recovered is frozen
out of the garbage collector's walks), then a RESP client pipelines
``--pops`` ``ZPOPMIN``s while another client sends ``GET /v1/health`` one
at a time (``--no-health``: none, for the CPU time of the pops alone).
Each round runs both trees back to back, the first of them alternating;
per tree the medians over rounds of: the pipeline's time,
the daemon's CPU time (user+sys, from /proc) for it, the worst health
request and the longest loop hold (the watchdog's histogram bucket that
holds every heartbeat of the run).
"""

from __future__ import annotations

import argparse
import http.client
import os
import select
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

from daemon import Daemon  # noqa: E402
from rankd.frontends.resp.protocol import encode_request  # noqa: E402
from respclient import RawClient  # noqa: E402
from test_resp_large_stores import _longest, _stalls  # noqa: E402


def _cpu(pid: int) -> float:
    """User+sys CPU seconds of process ``pid``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(tree: Path, members: int, pops: int, health_checks: bool = True
        ) -> tuple[float, float, float, float]:
    """One run at ``tree``: (seconds, CPU seconds, worst health request, longest hold)."""
    with tempfile.TemporaryDirectory() as directory, Daemon(
            Path(directory) / "data", "--fsync", "no",
            env={"PYTHONPATH": str(tree / "src")}) as daemon:
        daemon.request("PUT", "/v1/boards/wl", {"windows": ["all", "daily"]})
        for first in range(0, members, 10_000):
            status, body = daemon.request("POST", "/v1/boards/wl/scores/batch", {"events": [
                {"member": f"m{i}", "score": i, "label": f"Player {i}"}
                for i in range(first, min(first + 10_000, members))]})
            assert status == 200, body
        daemon.stop()
        daemon.start()
        health = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=10)
        with RawClient(daemon.resp_port) as client:
            time.sleep(0.2)
            before, cpu = _stalls(daemon), _cpu(daemon.process.pid)
            started = time.monotonic()
            client.send(encode_request(["ZPOPMIN", "wl"]) * pops)
            answered, worst = 0, 0.0
            while answered < pops:
                if health_checks:
                    asked = time.monotonic()
                    health.request("GET", "/v1/health")
                    health.getresponse().read()
                    worst = max(worst, time.monotonic() - asked)
                while answered < pops and (client.buffer or select.select(
                        [client.sock], [], [], 0 if health_checks else 1)[0]):
                    client.reply()
                    answered += 1
            elapsed = time.monotonic() - started
            cpu = _cpu(daemon.process.pid) - cpu
            time.sleep(0.05)
            held = _longest(before, _stalls(daemon))
        health.close()
    return elapsed, cpu, worst, held


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="a source tree built in place")
    parser.add_argument("--members", type=int, default=60_000)
    parser.add_argument("--pops", type=int, default=15_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-health", action="store_true",
                        help="no health requests meanwhile (their own CPU is then not counted)")
    args = parser.parse_args()
    trees = {"base": args.base.resolve(), "current": ROOT}
    results: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name in trees}
    for round_ in range(args.rounds):
        order = list(trees) if round_ % 2 == 0 else list(reversed(trees))
        for name in order:
            results[name].append(run(trees[name], args.members, args.pops,
                                     not args.no_health))
            print(name, "round", round_, results[name][-1], flush=True)
    print(f"\n{args.pops} pipelined ZPOPMIN on a board of {args.members} members, two windows "
          f"and labels; median of {args.rounds} round(s)")
    print("| tree | pops/s | daemon CPU µs per pop | worst health request (ms) "
          "| longest loop hold (bucket, ms) |")
    print("|---|---:|---:|---:|---:|")
    for name, runs in results.items():
        columns = zip(*runs, strict=True)
        elapsed, cpu, worst, held = (statistics.median(column) for column in columns)
        print(f"| {name} | {args.pops / elapsed:,.0f} | {cpu / args.pops * 1e6:.1f} "
              f"| {worst * 1000:.0f} | {held * 1000:g} |")


if __name__ == "__main__":
    main()
