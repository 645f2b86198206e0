"""What a change costs on the hot paths: rankd at two source trees, side by
side in one run, paired.

    python bench/bench_change.py --base-rev 5621225          # builds the base itself
    python bench/bench_change.py --base /path/to/other/tree  # a tree already built
    python bench/bench_change.py --base-rev HEAD~3 --quick   # 2 s per run, 3 rounds
    python bench/bench_change.py --base-rev 5621225 --callgrind   # instructions per request

Two daemons run at once on loopback, ``--fsync everysec``: the *base* (a
``git worktree`` of ``--base-rev`` with its native modules built in place,
or the tree ``--base`` names) and the *current* tree, this checkout.  Each
row is measured ``--rounds`` times, each round running the two back to
back, the first of them alternating; a row gives each side's median and
the median of the rounds' current/base ratios (the two ran in the same
minute of this noisy, shared machine, so their ratio is worth more than the
ratio of two medians).  Below the table, the spread of those ratios.

Rows, the same as the two benchmarks whose hot paths a change may touch:

* RESP (``bench_resp.py``'s): ``redis-benchmark -c 50`` of ZINCRBY, ZADD,
  ZREVRANK, ZREVRANGE and ZSCORE at ``-P 1`` and ``-P 16`` on a board of
  ``--members`` members;
* TCP (``bench_daemon.py``'s): 50 connections of msgpack submits at depth
  1 and 16, plain and with event ids, with p50/p99 latency;
* REST (``bench_daemon.py``'s): 64 keep-alive connections POSTing
  submissions with event ids, with p50/p99 latency.

With ``--callgrind`` both daemons run under valgrind's callgrind, counting
only while a row is measured: each row gives the daemon's user-space
instructions per request on each side, which this machine's noise does
not move (the rates under callgrind mean nothing; 10,000 members and one
round by default).  What a daemon runs idle in the same time (its timers,
counted first over 5 s) is taken off: under callgrind a request takes ~50
times as long, and a timer's work would weigh 50 times what it does.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests"))

import bench_daemon  # noqa: E402
import bench_resp  # noqa: E402
from daemon import Daemon  # noqa: E402

SIDES = ("base", "current")
#: Where callgrind writes its counts (``%p``: the daemon's pid).
CALLGRIND_OUT = "callgrind.%p"


@contextlib.contextmanager
def base_tree(rev: str) -> Iterator[Path]:
    """A worktree of ``rev`` with its native modules built, removed after."""
    directory = Path(tempfile.mkdtemp(prefix="rankd-base-"))
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(directory), rev],
                   check=True, capture_output=True)
    try:
        print(f"building the base ({rev}) in {directory}...", flush=True)
        subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace", "-j", "2"],
                       cwd=directory, check=True, capture_output=True,
                       env={**os.environ, "RANKD_REQUIRE_NATIVE": "1"})
        yield directory
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                        str(directory)], check=False, capture_output=True)


def start(tree: Path, data_dir: Path, callgrind: bool) -> Daemon:
    """``rankd serve`` from ``tree``'s sources, with the benchmarks' boards."""
    wrapper = ("valgrind", "--tool=callgrind", "--instr-atstart=no",
               f"--callgrind-out-file={data_dir.parent / data_dir.name}-{CALLGRIND_OUT}"
               ) if callgrind else ()
    daemon = Daemon(data_dir, "--fsync", "everysec", env={"PYTHONPATH": str(tree / "src")},
                    wrapper=wrapper).start(timeout=600 if callgrind else 30)
    parts = daemon.implementations()
    if any(kind != "native" for kind in parts.values()):
        raise RuntimeError(f"{tree} does not run natively: {parts}")
    status, body = daemon.request("PUT", f"/v1/boards/{bench_daemon.BOARD}", {"policy": "sum"})
    if status not in (200, 201):
        raise RuntimeError(f"PUT /v1/boards/{bench_daemon.BOARD} answered {status}: {body}")
    return daemon


class Sample:
    """One measured run: requests/s and, where measured, latency; under
    callgrind the instructions the daemon ran per request."""

    def __init__(self, rate: float, p50: float | None = None, p99: float | None = None,
                 instructions: float | None = None) -> None:
        self.rate, self.p50, self.p99 = rate, p50, p99
        self.instructions = instructions


#: Instructions per second each daemon runs while idle (its timers: the loop
#: watchdog's heartbeat, the sweepers), by pid: taken off what a row counts.
IDLE: dict[int, float] = {}
IDLE_SECONDS = 5.0


def idle_rate(daemon: Daemon) -> float:
    """Count ``daemon``'s instructions over :data:`IDLE_SECONDS` of no load."""
    bench_daemon.instrument(daemon.process.pid, True)
    time.sleep(IDLE_SECONDS)
    bench_daemon.instrument(daemon.process.pid, False)
    IDLE[daemon.process.pid] = counted(daemon, 1.0, 0.0) / IDLE_SECONDS
    return IDLE[daemon.process.pid]


def counted(daemon: Daemon, requests: float, seconds: float) -> float:
    """The instructions callgrind counted in ``daemon`` since its last dump
    (the dump zeroes them), less what it runs idle in ``seconds``, per request."""
    pid = daemon.process.pid
    before = set(daemon.data_dir.parent.glob(f"{daemon.data_dir.name}-callgrind.{pid}.*"))
    subprocess.run(["callgrind_control", "--dump", str(pid)], check=True, capture_output=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        new = set(daemon.data_dir.parent.glob(
            f"{daemon.data_dir.name}-callgrind.{pid}.*")) - before
        for path in new:
            totals = [line for line in path.read_text().splitlines()
                      if line.startswith("totals:")]
            if totals:
                total = int(totals[0].split()[1]) - IDLE.get(pid, 0.0) * seconds
                return total / requests
        time.sleep(0.2)
    raise RuntimeError("callgrind wrote no dump")


def rows(args: argparse.Namespace, daemons: dict[str, Daemon]
         ) -> Iterator[tuple[str, Callable[[Daemon], Sample]]]:
    """Each row's name and how to measure one side of it."""
    def sample(daemon: Daemon, result: bench_daemon.Result) -> Sample:
        """A load generator's result (its replies in the window counted, under callgrind)."""
        instructions = (counted(daemon, max(1.0, result.rate * args.seconds), args.seconds)
                        if args.callgrind else None)
        return Sample(result.rate, result.p50_ms, result.p99_ms, instructions)

    for depth in args.depths:
        for command in bench_resp.COMMANDS:
            def resp(daemon: Daemon, command: str = command, depth: int = depth) -> Sample:
                if args.callgrind:
                    bench_daemon.instrument(daemon.process.pid, True)
                run = bench_resp.measured(daemon.resp_port, daemon.process.pid, command, depth,
                                          args.requests, args.members)
                if args.callgrind:
                    bench_daemon.instrument(daemon.process.pid, False)
                    return Sample(run.rate, instructions=counted(
                        daemon, args.requests, args.requests / run.rate))
                return Sample(run.rate)
            yield f"RESP `{command.split()[0]}` -P {depth}", resp
    for depth in args.depths:
        for kind in bench_daemon.KINDS:
            def tcp(daemon: Daemon, depth: int = depth, kind: str = kind) -> Sample:
                bench_daemon.wait_idle(daemon.process.pid)
                result = bench_daemon.run_worker({**bench_daemon.socket_spec(
                    "rankd", daemon.tcp_port, depth, daemon.process.pid, args.seconds,
                    tag=f"tcp{depth}-{time.time_ns()}", kind=kind), "callgrind": args.callgrind})
                return sample(daemon, result)
            yield f"TCP {bench_daemon.tcp_name(depth, kind)}", tcp

    def rest(daemon: Daemon) -> Sample:
        bench_daemon.wait_idle(daemon.process.pid)
        spec = {**bench_daemon.socket_spec("rest", daemon.port, 1, daemon.process.pid,
                                           args.seconds, tag=f"rest-{time.time_ns()}"),
                "connections": bench_daemon.REST_CONNECTIONS, "callgrind": args.callgrind}
        return sample(daemon, bench_daemon.run_worker(spec))
    yield f"REST {bench_daemon.REST_CONNECTIONS} conns", rest


def latency(samples: list[Sample]) -> str:
    p50s = [s.p50 for s in samples if s.p50 is not None]
    p99s = [s.p99 for s in samples if s.p99 is not None]
    if not p50s:
        return "-"
    return f"{statistics.median(p50s):.2f} / {statistics.median(p99s):.2f}"


def print_instructions(results: list[tuple[str, dict[str, list[Sample]], list[float]]]
                       ) -> None:
    print("| row | base instructions / request | current | base / current |")
    print("|---|---:|---:|---:|")
    for name, samples, ratios in results:
        base, current = (statistics.median(s.instructions for s in samples[side])
                         for side in SIDES)
        print(f"| {name} | {base:,.0f} | {current:,.0f} | {statistics.median(ratios):.3f}x |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--base-rev", help="a git revision: built in a worktree of its own")
    where.add_argument("--base", type=Path, help="a source tree already built in place")
    parser.add_argument("--members", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--seconds", type=float, default=5.0, help="per TCP or REST run")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--depths", type=bench_daemon.depth_list, default=[1, 16])
    parser.add_argument("--only", default="", help="run only rows whose name has this text")
    parser.add_argument("--quick", action="store_true",
                        help="100,000 members, 50,000 requests, 2 s runs, 3 rounds")
    parser.add_argument("--callgrind", action="store_true",
                        help="count instructions per request under callgrind (10,000 "
                             "members, 5,000 requests, 10 s runs, one round)")
    args = parser.parse_args()
    if args.quick:
        args.members, args.requests, args.seconds, args.rounds = 100_000, 50_000, 2.0, 3
    if args.callgrind:
        if shutil.which("valgrind") is None:
            print("valgrind is needed for --callgrind (Debian: valgrind)")
            return 1
        args.members, args.requests, args.seconds, args.rounds = 10_000, 5_000, 10.0, 1
    if shutil.which("redis-benchmark") is None:
        print("redis-benchmark is needed for the RESP rows (Debian: redis-tools)")
        return 1
    with contextlib.ExitStack() as stack:
        base = args.base or stack.enter_context(base_tree(args.base_rev))
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rankd-change-")))
        daemons: dict[str, Daemon] = {}
        for side, tree in zip(SIDES, (base, ROOT), strict=True):
            daemons[side] = start(tree, workdir / side, args.callgrind)
            stack.callback(daemons[side].stop)
            bench_resp.load(daemons[side].resp_port, args.members)
            if args.callgrind:
                print(f"{side}: {idle_rate(daemons[side]):,.0f} instructions/s idle", flush=True)
        mode = "callgrind, " if args.callgrind else ""
        print(f"base {base}, current {ROOT}; {args.rounds} rounds, {mode}load average "
              f"{os.getloadavg()[0]:.2f}", flush=True)
        results: list[tuple[str, dict[str, list[Sample]], list[float]]] = []
        for name, measure in rows(args, daemons):
            if args.only not in name:
                continue
            samples: dict[str, list[Sample]] = {side: [] for side in SIDES}
            ratios = []
            for round_ in range(args.rounds):
                order = SIDES if round_ % 2 == 0 else SIDES[::-1]
                taken = {side: measure(daemons[side]) for side in order}
                for side in SIDES:
                    samples[side].append(taken[side])
                if args.callgrind:  # fewer instructions is better
                    ratios.append(taken["base"].instructions / taken["current"].instructions)
                else:
                    ratios.append(taken["current"].rate / taken["base"].rate)
            results.append((name, samples, ratios))
            print(f"  {name}: {statistics.median(ratios):.3f}x "
                  f"(rounds {', '.join(f'{r:.2f}' for r in ratios)})", flush=True)
    print()
    if args.callgrind:
        print_instructions(results)
        return 0
    print("| row | base /s | current /s | current / base | p50 / p99 ms base | "
          "p50 / p99 ms current |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, samples, ratios in results:
        base_rate, current_rate = (statistics.median(s.rate for s in samples[side])
                                   for side in SIDES)
        print(f"| {name} | {base_rate:,.0f} | {current_rate:,.0f} | "
              f"{statistics.median(ratios):.3f}x | {latency(samples['base'])} | "
              f"{latency(samples['current'])} |")
    every = [r for _, _, ratios in results for r in ratios]
    if every:
        print(f"\nper-round ratios {min(every):.2f}x-{max(every):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
