"""Pipelined pops: ``redis-benchmark`` drives ``ZPOPMIN``/``ZPOPMAX`` against
redis-server and rankd's RESP port, side by side in one run.

    python bench/bench_pops.py                       # 200,000 pops a run, 5 rounds
    python bench/bench_pops.py --requests 50000 --rounds 3              # quick
    python bench/bench_pops.py --base /work/main     # rankd of another tree beside

Servers, all on loopback, one at a time on the machine's cores, as in
``bench_resp.py``: ``redis`` (no persistence), ``redis-aof`` (``appendonly
yes``, ``appendfsync everysec``: like rankd, it logs every pop) and
``rankd`` (``--fsync everysec``), plus, with ``--base TREE``, ``rankd-base``:
the daemon of another source tree (built in place), for a before/after
paired in the same rounds.

A pop consumes what it pops, so before each run the board ``lb`` is
loaded anew (not timed) with exactly what the run pops (``--requests``
times the row's count); each run must leave it empty, which the script
checks.  Each row runs ``redis-benchmark -c 50 -n <requests> -P <depth>``
against each server in turn, ``--rounds`` times, each round beginning with
the next server.  The table gives each server's median requests/s, its
median p50 and p99 latency (redis-benchmark's, milliseconds) and, against
each other server, the median of rankd's per-round ratios (the two ran
back to back; a ratio of medians would mix a slow moment of this shared
machine with a fast one).
"""

from __future__ import annotations

import argparse
import csv
import io
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE.parent / "src"))

import bench_resp  # noqa: E402
from daemon import Daemon  # noqa: E402
from rankd.frontends.resp.protocol import encode_request  # noqa: E402

#: Each row: the command, the members one request pops, the depths it runs at.
ROWS = [
    ("ZPOPMIN lb", 1),
    ("ZPOPMAX lb", 1),
    ("ZPOPMIN lb 2", 2),
]


class Run(NamedTuple):
    """One redis-benchmark run against one server."""

    rate: float  # requests/s
    p50: float  # milliseconds
    p99: float


def benchmark(port: int, command: str, depth: int, requests: int) -> Run:
    """Requests/s and p50/p99 latency redis-benchmark measures."""
    done = subprocess.run(
        ["redis-benchmark", "-p", str(port), "-c", "50", "-n", str(requests), "-P", str(depth),
         "--csv", *command.split()], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(done.stderr or done.stdout)
    header, *rows = csv.reader(io.StringIO(done.stdout))
    row = dict(zip(header, rows[-1], strict=True))
    return Run(float(row["rps"]), float(row["p50_latency_ms"]), float(row["p99_latency_ms"]))


def reload(port: int, members: int) -> None:
    """Board ``lb`` emptied, then loaded with ``members`` members."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(encode_request(["DEL", "lb"]))
        bench_resp._read_replies(sock, 1)
    bench_resp.load(port, members)


def ratios(results: dict[tuple[str, int, str], list[Run]], row: tuple[str, int], name: str,
           other: str) -> list[float]:
    """``name``'s rate over ``other``'s in each round."""
    return [ours.rate / theirs.rate for ours, theirs in zip(
        results[(*row, name)], results[(*row, other)], strict=True)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--depths", default="1,16")
    parser.add_argument("--base", type=Path, help="a source tree whose rankd runs beside")
    args = parser.parse_args()
    if shutil.which("redis-benchmark") is None or shutil.which("redis-server") is None:
        print("redis-server and redis-benchmark are needed (Debian: redis-server, redis-tools)")
        return 1
    depths = [int(d) for d in args.depths.split(",")]
    with tempfile.TemporaryDirectory() as root:
        redis = bench_resp.RedisProcess(Path(root))
        aof_dir = Path(root) / "aof"
        aof_dir.mkdir()
        redis_aof = bench_resp.RedisProcess(aof_dir, "--appendonly", "yes", "--appendfsync",
                                            "everysec")
        daemons = {"rankd": Daemon(Path(root) / "rankd", "--fsync", "everysec").start()}
        if args.base is not None:
            daemons["rankd-base"] = Daemon(
                Path(root) / "base", "--fsync", "everysec",
                env={"PYTHONPATH": str(args.base.resolve() / "src")}).start()
        ports = {"redis": redis.port, "redis-aof": redis_aof.port,
                 **{name: daemon.resp_port for name, daemon in daemons.items()}}
        results: dict[tuple[str, int, str], list[Run]] = {}
        try:
            names = list(ports)
            for round_number in range(args.rounds):
                turn = round_number % len(names)
                order = names[turn:] + names[:turn]
                for depth in depths:
                    for command, count in ROWS:
                        for name in order:
                            reload(ports[name], args.requests * count)
                            results.setdefault((command, depth, name), []).append(
                                benchmark(ports[name], command, depth, args.requests))
                            left = bench_resp.cardinality(ports[name])
                            if left:
                                raise AssertionError(f"{name} left {left} members after "
                                                     f"{command!r}: the pops missed")
                print(f"round {round_number + 1} of {args.rounds} done", flush=True)
        finally:
            for daemon in daemons.values():
                daemon.stop()
            redis.stop()
            redis_aof.stop()
    print(f"\nredis-benchmark -c 50 -n {args.requests}, median of {args.rounds} round(s): "
          "requests/s (p50 / p99 ms)")
    others = [name for name in names if name != "rankd"]
    print("| command | -P | " + " | ".join(names) + " | "
          + " | ".join(f"rankd / {other}" for other in others) + " |")
    print("|---|---:|" + "---:|" * (len(names) + len(others)))
    for depth in depths:
        for command, _ in ROWS:
            cells = []
            for name in names:
                runs = results[(command, depth, name)]
                cells.append(f"{statistics.median(r.rate for r in runs):,.0f} "
                             f"({statistics.median(r.p50 for r in runs):.2f} / "
                             f"{statistics.median(r.p99 for r in runs):.2f})")
            cells += [f"{statistics.median(ratios(results, (command, depth), 'rankd', other)):.2f}x"
                      for other in others]
            print(f"| `{command}` | {depth} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
