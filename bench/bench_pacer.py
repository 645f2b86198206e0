"""The loop pacer, on and off, paired (issue 48, item 2).

Two daemons of this tree run at once on loopback (``--fsync everysec``),
one with ``--pacing-us <on>`` (10 by default, the pacer's old default) and
one with ``--pacing-us 0``, each board ``lb`` loaded with ``--members``
members.  Every cell of the grid is measured on both, back to back, the
first of the two alternating from round to round:

* RESP writes and reads: ``redis-benchmark -c <clients> -P <depth>`` of
  ``ZINCRBY lb 1 m:__rand_int__`` and ``ZSCORE lb m:__rand_int__``
  (``-r <members>``: every request names an existing member);
* TCP writes: ``bench_daemon.py``'s msgpack load generator (its own
  process), ``<clients>`` connections keeping ``<depth>`` plain submits in
  flight each.  (The generator has no read requests: TCP reads take the same
  lanes and the same pacer as RESP's.)

over clients 1, 16 and 64 and depths 1 and 16.  A row gives each side's
median rate and p50 / p99 latency (ms), and the median of the rounds'
on/off rate ratios with their spread: above 1, the pacer helped.

    python bench/bench_pacer.py                  # 3 rounds, every cell (about 10 minutes)
    python bench/bench_pacer.py --rounds 5 --clients 16,64 --depths 1
    python bench/bench_pacer.py --quick          # 1 round, small runs
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests"))

import bench_daemon  # noqa: E402
import bench_resp  # noqa: E402
from daemon import Daemon  # noqa: E402

COMMANDS = {"RESP write": ["ZINCRBY", "lb", "1", "m:__rand_int__"],
            "RESP read": ["ZSCORE", "lb", "m:__rand_int__"]}


@dataclass
class Cell:
    """One row: every round's (rate, p50 ms, p99 ms) of each side."""

    name: str
    runs: dict[str, list[tuple[float, float | None, float | None]]] = field(
        default_factory=lambda: {"on": [], "off": []})
    ratios: list[float] = field(default_factory=list)


def redis_benchmark(port: int, command: list[str], clients: int, depth: int,
                    requests: int, members: int) -> tuple[float, float | None, float | None]:
    done = subprocess.run(["redis-benchmark", "-p", str(port), "-c", str(clients), "-P",
                           str(depth), "-n", str(requests), "-r", str(members), "--csv",
                           *command], capture_output=True, text=True, check=True,
                          timeout=600)
    line = [row for row in done.stdout.splitlines() if row.startswith('"')][-1]
    cells = [cell.strip('"') for cell in line.split(",")]
    # "test","rps","avg","min","p50","p95","p99","max"
    return float(cells[1]), float(cells[4]), float(cells[6])


def tcp_writes(daemon: Daemon, clients: int, depth: int, seconds: float
               ) -> tuple[float, float | None, float | None]:
    spec = bench_daemon.socket_spec("rankd", daemon.tcp_port, depth, daemon.process.pid,
                                    seconds, kind="plain")
    spec["connections"] = clients
    result = bench_daemon.run_worker(spec)
    return result.rate, result.p50_ms, result.p99_ms


def requests_for(clients: int, depth: int, seconds: float) -> int:
    """redis-benchmark requests for about ``seconds`` of a run here."""
    rate = {1: 12_000, 16: 60_000, 64: 70_000}[clients] * (4 if depth > 1 else 1)
    return max(2_000, int(rate * seconds))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0, help="about, per run")
    parser.add_argument("--members", type=int, default=100_000)
    parser.add_argument("--clients", default="1,16,64")
    parser.add_argument("--depths", default="1,16")
    parser.add_argument("--pacing-us", type=float, default=10.0, help="the pacer's pause, on")
    parser.add_argument("--only", default="", help="rows whose name has this text")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.seconds, args.members = 1, 0.5, 10_000
    clients = [int(c) for c in args.clients.split(",")]
    depths = [int(d) for d in args.depths.split(",")]
    cells: list[Cell] = []
    with tempfile.TemporaryDirectory(prefix="bench-pacer-") as tmp:
        daemons: dict[str, Daemon] = {}
        try:
            for side, pause in (("on", args.pacing_us), ("off", 0.0)):
                daemons[side] = Daemon(Path(tmp) / side, "--fsync", "everysec",
                                       "--pacing-us", f"{pause:g}").start()
                bench_resp.load(daemons[side].resp_port, args.members)
            plan = [(kind, c, d) for kind in (*COMMANDS, "TCP write")
                    for c in clients for d in depths
                    if args.only in f"{kind} -c{c} -P{d}"]
            for kind, c, d in plan:
                cells.append(Cell(f"{kind} -c{c} -P{d}"))
            for round_ in range(args.rounds):
                for cell, (kind, c, d) in zip(cells, plan, strict=True):
                    order = ("on", "off") if round_ % 2 == 0 else ("off", "on")
                    taken: dict[str, Any] = {}
                    for side in order:
                        daemon = daemons[side]
                        if kind in COMMANDS:
                            taken[side] = redis_benchmark(
                                daemon.resp_port, COMMANDS[kind], c, d,
                                requests_for(c, d, args.seconds), args.members)
                        else:
                            taken[side] = tcp_writes(daemon, c, d, args.seconds)
                        cell.runs[side].append(taken[side])
                    cell.ratios.append(taken["on"][0] / taken["off"][0])
                    print(f"  round {round_ + 1} {cell.name:<24} on {taken['on'][0]:>10,.0f}/s "
                          f"off {taken['off'][0]:>10,.0f}/s  {cell.ratios[-1]:.2f}x",
                          file=sys.stderr, flush=True)
        finally:
            for daemon in daemons.values():
                daemon.stop()
    print_table(cells, args)
    return 0


def print_table(cells: list[Cell], args: argparse.Namespace) -> None:
    def latency(runs: list[tuple[float, float | None, float | None]]) -> str:
        p50 = [r[1] for r in runs if r[1] is not None]
        p99 = [r[2] for r in runs if r[2] is not None]
        if not p50:
            return "-"
        return f"{statistics.median(p50):.2f} / {statistics.median(p99):.2f}"

    print(f"bench_pacer.py: --pacing-us {args.pacing_us:g} (on) against 0 (off), "
          f"{args.rounds} rounds, ~{args.seconds:g} s a run, {args.members:,} members")
    print()
    print("| row | on /s | off /s | on / off (rounds) | p50 / p99 ms on | p50 / p99 ms off |")
    print("|---|---:|---:|---:|---:|---:|")
    for cell in cells:
        on, off = (statistics.median(r[0] for r in cell.runs[s]) for s in ("on", "off"))
        spread = ", ".join(f"{r:.2f}" for r in cell.ratios)
        print(f"| {cell.name} | {on:,.0f} | {off:,.0f} | {statistics.median(cell.ratios):.3f}x "
              f"({spread}) | {latency(cell.runs['on'])} | {latency(cell.runs['off'])} |")


if __name__ == "__main__":
    sys.exit(main())
