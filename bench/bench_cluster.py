"""Cluster benchmark: a three-node rankd cluster on one Postgres, end to end.

Everything runs on this machine on loopback: a throwaway Postgres (its own
fsync on, as in production, unless ``--pg-fsync-off``), three ``rankd serve
--cluster-dsn`` nodes (tests/daemon.py's harness, free ports, temporary data
dirs, WAL ``--fsync everysec``), and the load generators of
``bench_daemon.py`` in processes of their own.

1. **Acknowledged submits/s.**  64 TCP connections, one submit in flight
   each (64 concurrent submitters), ``delta`` 1 with a unique ``event_id``,
   sent to the primary of board ``bench``: ``--ack log`` (answered once the
   Postgres transaction holding the event committed; group commit puts many
   submitters' events in one) with the primary alone, then with two
   followers (all on this machine's 2 cores with Postgres and the load
   generator), then ``--ack local`` (answered once the primary's WAL holds
   it; shipped in the background), and ``--ack local`` with 4 submits in
   flight per connection (a rate above 20,000 events/s, for the lag).
   Target for ``log``: >= 20,000/s with p99 <= 20 ms.
2. **Follower lag** while each three-node load runs: every 20 ms a probe
   submits to the primary over REST and times how long after its answer a
   follower serves a read with ``min_seq`` = the answer's ``seq`` (the
   follower answers as soon as it applied it; a REST round trip is
   included).  Target: p99 <= 250 ms at 20,000 events/s (the rate is what
   the load reaches; it is printed with each figure).
3. **Failover.**  ``--rounds`` times: ``kill -9`` the primary of ``bench``,
   then submit through the other nodes until one is acknowledged; the time
   from the kill to that answer, against the lease (``--lease-seconds``,
   default 4 s, rankd's default).  The killed node is restarted between
   rounds.

The single-node figures (no ``--cluster-dsn``) are ``bench_daemon.py``'s.

Run from the project root (the package installed)::

    python bench/bench_cluster.py                # about 1.5 minutes
    python bench/bench_cluster.py --quick        # 3 s per load, 2 failovers
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

from bench_daemon import BOARD, run_worker  # noqa: E402
from daemon import Daemon  # noqa: E402
from pgcluster import Cluster, _bin_dir  # noqa: E402


def start_cluster(root: Path, dsn: str, ack: str, lease: float, count: int = 3
                  ) -> list[Daemon]:
    nodes = [Daemon(root / f"node{i}", "--cluster-dsn", dsn, "--node-id", f"n{i}",
                    "--ack", ack, "--lease-seconds", str(lease), "--log-format", "text",
                    "--rate-address-writes", "0")
             for i in range(count)]
    for node in nodes:
        node.start()
        while node.request("GET", "/v1/ready")[0] != 200:
            time.sleep(0.05)
    return nodes


def primary_of(nodes: list[Daemon], board: str) -> int:
    from rankd.cluster.groups import group_of

    for node in nodes:
        if node.process is None or node.process.poll() is not None:
            continue
        status, body = node.request("GET", "/v1/cluster")
        if status == 200:
            for group in body["groups"]:
                if group["group"] == group_of(board) and group["primary"]:
                    return int(group["primary"][1:])
    raise RuntimeError(f"no primary for {board}")


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


async def probe_lag(primary: Daemon, follower: Daemon, stop: asyncio.Event
                    ) -> dict[str, list[float]]:
    """Seconds from a write's answer to a follower serving it (see module
    doc), for reads with ``min_seq`` and for plain reads, alternately."""
    lags: dict[str, list[float]] = {"min_seq": [], "plain": []}
    count = 0
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            count += 1
            async with session.post(f"{primary.url}/v1/boards/{BOARD}/scores",
                                    json={"member": "probe", "delta": 1,
                                          "event_id": f"probe-{count}"}) as answer:
                body = await answer.json()
            acknowledged = time.perf_counter()
            if answer.status != 200:
                await asyncio.sleep(0.02)
                continue
            member = f"{follower.url}/v1/boards/{BOARD}/members/probe"
            if count % 2:
                async with session.get(f"{member}?min_seq={body['seq']}") as seen:
                    await seen.read()
                if seen.status == 200:
                    lags["min_seq"].append(time.perf_counter() - acknowledged)
            else:
                while not stop.is_set():
                    async with session.get(member) as seen:
                        score = (await seen.json()).get("score") if seen.status == 200 else 0
                    if score is not None and score >= body["score"]:
                        lags["plain"].append(time.perf_counter() - acknowledged)
                        break
                    await asyncio.sleep(0.01)
            await asyncio.sleep(0.02)
    return lags


def load(nodes: list[Daemon], seconds: float, *, lag: bool, depth: int = 1
         ) -> tuple[dict, dict[str, list[float]]]:
    primary = primary_of(nodes, BOARD)
    node = nodes[primary]
    spec = {"protocol": "rankd", "port": node.tcp_port, "connections": 64, "depth": depth,
            "seconds": seconds, "warmup": min(1.0, seconds / 4),
            "server_pid": node.process.pid, "tag": f"c{time.monotonic_ns()}", "kind": "ids"}

    async def run() -> tuple[object, list[float]]:
        stop = asyncio.Event()
        prober = asyncio.create_task(probe_lag(node, nodes[(primary + 1) % len(nodes)],
                                               stop)) if lag else None
        result = await asyncio.to_thread(run_worker, spec)
        stop.set()
        return result, (await prober if prober else {})

    result, lags = asyncio.run(run())
    return {"rate": result.rate, "p50_ms": result.p50_ms, "p99_ms": result.p99_ms,
            "errors": result.errors, "notes": result.notes}, lags


def failover(nodes: list[Daemon], rounds: int) -> list[float]:
    times = []
    for round_number in range(rounds):
        victim = primary_of(nodes, BOARD)
        others = [n for i, n in enumerate(nodes) if i != victim]
        killed = time.monotonic()
        nodes[victim].kill()
        probe = 0
        while True:
            node = others[probe % 2]
            probe += 1
            try:
                status, _ = node.request("POST", f"/v1/boards/{BOARD}/scores",
                                         {"member": "f", "delta": 1,
                                          "event_id": f"f{round_number}-{probe}"}, timeout=2)
            except OSError:
                status = 0
            if status == 200:
                break
            if time.monotonic() - killed > 60:
                raise RuntimeError("no failover within 60 s")
            time.sleep(0.01)
        times.append(time.monotonic() - killed)
        nodes[victim].start()
        time.sleep(1.0)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--lease-seconds", type=float, default=4.0)
    parser.add_argument("--pg-fsync-off", action="store_true")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.rounds = 3.0, 2
    bin_dir = _bin_dir()
    if bin_dir is None:
        print("no PostgreSQL server binaries (initdb): cannot run", file=sys.stderr)
        return 1
    durability = "fsync off" if args.pg_fsync_off else "fsync on"
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"# bench_cluster: 3 nodes + Postgres ({durability}) on this machine "
          f"({os.cpu_count()} cores), {stamp}")
    print("| figure | value | target |\n|---|---|---|")
    for ack, count, depth in (("log", 1, 1), ("log", 3, 1), ("local", 3, 1), ("local", 3, 4)):
        pg = Cluster(bin_dir)
        pg.init()
        pg.start(durable=not args.pg_fsync_off)
        nodes: list[Daemon] = []
        try:
            with tempfile.TemporaryDirectory() as root:
                nodes = start_cluster(Path(root), pg.admin_dsn, ack, args.lease_seconds,
                                      count)
                nodes[0].request("PUT", f"/v1/boards/{BOARD}", {"policy": "sum"})
                figures, lags = load(nodes, args.seconds, lag=count > 1, depth=depth)
                target = ">= 20,000/s, p99 <= 20 ms" if ack == "log" else "-"
                shape = "the primary alone" if count == 1 else f"{count} nodes"
                submitters = "64 submitters" if depth == 1 else f"64 connections x {depth}"
                print(f"| `--ack {ack}` acknowledged submits/s, {submitters}, {shape} | "
                      f"{figures['rate']:,.0f}/s, p50 {figures['p50_ms']:.1f} ms, "
                      f"p99 {figures['p99_ms']:.1f} ms | {target} |")
                for note in figures["notes"]:
                    print(f"|   ({note}) | | |")
                for kind, seen in lags.items():
                    if not seen:
                        continue
                    what = ("a read with min_seq on a follower" if kind == "min_seq"
                            else "follower lag (plain reads until the write shows)")
                    print(f"| {what} at {figures['rate']:,.0f} events/s, --ack {ack} "
                          f"({len(seen)} probes) | p50 {percentile(seen, .5) * 1000:.1f} ms, "
                          f"p99 {percentile(seen, .99) * 1000:.1f} ms | p99 <= 250 ms "
                          "at 20,000/s |")
                if ack == "log" and count > 1:
                    times = failover(nodes, args.rounds)
                    print(f"| failover, kill -9 of the primary to the first acknowledged "
                          f"write ({len(times)} rounds, lease {args.lease_seconds:g} s) | "
                          f"median {statistics.median(times):.2f} s, max {max(times):.2f} s "
                          f"| <= 5 s |")
        finally:
            for node in nodes:
                if node.process is not None and node.process.poll() is None:
                    node.stop()
            pg.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
