"""Cluster scale benchmark: acknowledged submits/s of 1, 2 and 3 rankd nodes
over many boards through the routing clients, per busy core, and
``redis-benchmark --cluster`` against rankd and against a Redis Cluster.

Everything runs on this machine on loopback: one throwaway durable Postgres
(tests/pgcluster.py, fsync on), a fresh database per cluster size, ``rankd
serve --cluster-dsn`` nodes (bench_moves.py's ``start_nodes``: free ports,
temporary data dirs, ``--ack log``, ``--replicas 1`` where N > 1, none on one
node), and every load generator in a process of its own.  **This machine has
2 cores shared by the nodes, Postgres and the load generators** (and by
whatever else runs on it: the table says how busy the machine was): the raw
rates do not extrapolate, the rates per busy core do.

1. **Acknowledged submits/s, N = 1, 2, 3.**  ``--boards`` boards (default
   256, names ``s0``..., spread over the slots and so over about as many
   groups), each filled with ``--members`` members (default 2,000, REST
   batches through the nodes in turn).  Then, for ``--seconds`` after a
   warm-up, ``--submitters`` concurrent submitters (default 64, split over
   ``--workers`` load processes, default 2), one write in flight each, a
   random board and member (of 10,000), ``delta`` 1:

   * ``tcp``: the Python TCP client (``rankd.client.AsyncClient``, one per
     load process, connected to node 0): it learns each group's node from
     ``moved`` answers and sends each request to its primary, pipelined over
     one connection per node; every submit carries a unique ``event_id``;
   * ``redis-py``: ``redis.asyncio.cluster.RedisCluster`` (slot map from
     ``CLUSTER SLOTS``), ``ZINCRBY board 1 member``.

   Each row: acknowledged submits/s of the writes both sent and answered
   within the window, their p50/p99 latency (a write straddling the end of
   the window is left out, so p99 may read a little low), errors,
   and CPU seconds over the window (user + sys from ``/proc/PID/stat``) of
   the rankd nodes (with their children), Postgres (the postmaster and its
   backends) and the load processes; **per busy core** is submits/s divided
   by the cores those used (their CPU seconds / the window), **per server
   core** by the cores the nodes alone used.  Then each node's resident
   memory (VmRSS) against the same node before its boards, and the groups it
   leads and follows: each holds about (1 + R) / N of the data.
2. **redis-benchmark --cluster.**  Debian's ``redis-benchmark`` (7.0) with
   ``--cluster -c 50``: ``ZADD``, ``ZINCRBY`` (``-P 1`` and ``-P 16``) and
   ``ZSCORE`` of key ``rb:{tag}:__rand_int__`` and member ``m:__rand_int__``
   (``-r 16384``).  redis-benchmark puts in place of ``{tag}`` the hash tag
   of one slot of each master (the same slot for all its requests, unless
   ``-MOVED`` says otherwise), and counts a ``-MOVED`` as an error, so keys
   cannot spread over more slots than there are masters: the load is many
   boards in one slot, one group, per master.  Against the three rankd
   nodes (after the loads of 1), against one rankd node (the one-node
   cluster, same ``--ack log``; redis-benchmark refuses ``--cluster`` with a
   single master, so the same load without it, key
   ``rb:{one}:__rand_int__``), and against a three-node Redis Cluster of
   ``redis-server`` processes (``--cluster-enabled yes``, no persistence,
   created with ``redis-cli --cluster create``) for reference.  The CPU
   seconds of redis-benchmark and of the servers are measured likewise.

Run from the project root::

    python bench/bench_scale.py                 # about 8 minutes on a busy 2-core machine
    python bench/bench_scale.py --quick         # 32 boards, 2 s loads: a smoke test
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

from bench_daemon import children_cpu_seconds, machine_busy_seconds  # noqa: E402

#: Members drawn for each submit (per board).
MEMBERS = 10_000
#: Members sent per REST batch while filling a board.
FILL_BATCH = 2_000
#: redis-benchmark's connections and key space (members).
BENCH_CLIENTS = 50
BENCH_RANDOM = 16_384
#: How long a load process may take beyond its window before it is given up.
WORKER_SLACK = 60.0
TICK = os.sysconf("SC_CLK_TCK")


# --- CPU and memory from /proc -----------------------------------------------------------

def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + sys) of ``pid``, its reaped children and its live
    children (one level: a rankd node's or the postmaster's processes)."""
    fields = _stat(pid)
    if fields is None:
        return 0.0
    total = sum(int(fields[i]) for i in (11, 12, 13, 14))
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            child = _stat(int(entry.name))
            if child is not None and child[1] == str(pid):
                total += int(child[11]) + int(child[12])
    return total / TICK


def postmaster_pid(data_dir: Path) -> int:
    return int((data_dir / "postmaster.pid").read_text().split("\n", 1)[0])


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


# --- load processes ----------------------------------------------------------------------

async def _tcp_load(spec: dict[str, Any]) -> dict[str, Any]:
    from rankd.client import AsyncClient

    client = AsyncClient("127.0.0.1", spec["port"], retries=2)
    await client.connect()
    return await _drive(spec, lambda board, member, event_id: client.submit(
        board, member, delta=1, event_id=event_id), client.close)


async def _tcp_each_load(spec: dict[str, Any]) -> dict[str, Any]:
    """``_tcp_load`` with one ``AsyncClient`` (one connection per node) per submitter."""
    from rankd.client import AsyncClient

    clients = [AsyncClient("127.0.0.1", spec["port"], retries=2)
               for _ in range(spec["submitters"])]
    for client in clients:
        await client.connect()

    async def close() -> None:
        for client in clients:
            await client.close()
    # The submitter's index is the middle of the event id ``_drive`` makes.
    return await _drive(spec, lambda board, member, event_id: clients[
        int(event_id.rsplit("-", 2)[1])].submit(board, member, delta=1, event_id=event_id),
        close)


async def _redis_load(spec: dict[str, Any]) -> dict[str, Any]:
    from redis.asyncio.cluster import RedisCluster

    client = RedisCluster(host="127.0.0.1", port=spec["port"])
    await client.initialize()
    return await _drive(spec, lambda board, member, event_id: client.zincrby(
        board, 1, member), client.aclose)


async def _drive(spec: dict[str, Any], submit: Any, close: Any) -> dict[str, Any]:
    """``spec["submitters"]`` loops of one submit at a time until the
    window (wall clock ``start``, ``seconds`` long) ends; what they did in it."""
    boards, start = spec["boards"], spec["start"]
    end = start + spec["seconds"]
    latencies: list[float] = []
    errors: list[str] = []
    done = 0
    tag = f"{spec['tag']}-{os.getpid()}"

    async def submitter(index: int) -> None:
        nonlocal done
        rng = random.Random(f"{tag}-{index}")
        for n in range(10**9):  # bounded by the window
            now = time.time()
            if now >= end:
                return
            board = boards[rng.randrange(len(boards))]
            began = time.perf_counter()
            try:
                await submit(board, f"m{rng.randrange(MEMBERS)}", f"{tag}-{index}-{n}")
            except Exception as exc:  # counted, not raised: the run goes on
                if now >= start:
                    errors.append(f"{type(exc).__name__}: {exc}"[:200])
                await asyncio.sleep(0.01)
                continue
            if now >= start and time.time() <= end:
                done += 1
                latencies.append(time.perf_counter() - began)

    tasks = [asyncio.ensure_future(submitter(i)) for i in range(spec["submitters"])]
    await asyncio.sleep(max(0.0, start - time.time()))
    cpu_before = sum(os.times()[:2])
    await asyncio.sleep(max(0.0, end - time.time()))
    cpu = sum(os.times()[:2]) - cpu_before
    await asyncio.wait_for(asyncio.gather(*tasks), WORKER_SLACK)
    await close()
    latencies.sort()
    return {"done": done, "cpu": cpu, "errors": len(errors), "first_error": errors[:1],
            "latencies": latencies[::max(1, len(latencies) // 20_000)]}


def worker_main(spec: dict[str, Any]) -> dict[str, Any]:
    coroutine = {"tcp": _tcp_load, "tcp-each": _tcp_each_load}.get(
        spec["client"], _redis_load)(spec)
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coroutine)


# --- orchestration -----------------------------------------------------------------------

@dataclasses.dataclass
class Cpu:
    """Processes whose CPU seconds are measured over a window."""

    groups: dict[str, list[int]]

    def sample(self) -> dict[str, float]:
        found = {name: sum(tree_cpu(pid) for pid in pids) for name, pids in self.groups.items()}
        found["machine"] = machine_busy_seconds()
        return found


def percentile(ordered: list[float], share: float) -> float:
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else 0.0


@dataclasses.dataclass
class Row:
    """One measured load: rate, latency and the CPU seconds it cost."""

    what: str
    rate: float
    p50_ms: float
    p99_ms: float
    errors: int
    #: CPU seconds over the window: "servers" (rankd nodes or redis-servers),
    #: "postgres", "load" (the load generators), "machine" (every process).
    cpu: dict[str, float]
    seconds: float
    note: str = ""

    def cores(self, *names: str) -> float:
        return sum(self.cpu.get(name, 0.0) for name in names) / self.seconds

    def cells(self) -> list[str]:
        busy = self.cores("servers", "postgres", "load")
        rankd = self.cores("servers")
        other = max(0.0, self.cores("machine") - busy)
        return [self.what, f"{self.rate:,.0f}", f"{self.p50_ms:.1f} / {self.p99_ms:.1f}",
                str(self.errors),
                f"{rankd:.2f} / {self.cores('postgres'):.2f} / {self.cores('load'):.2f}",
                f"{other:.2f}",
                f"{self.rate / busy:,.0f}" if busy else "-",
                f"{self.rate / rankd:,.0f}" if rankd else "-"]


HEADER = ["load", "ops/s", "p50 / p99 ms", "errors",
          "cores used: servers / Postgres / load", "other processes' cores",
          "ops/s per busy core", "ops/s per server core"]


def run_load(client: str, port: int, boards: list[str], args: argparse.Namespace,
             cpu: Cpu, what: str) -> Row:
    """``args.workers`` load processes of ``client`` against ``port``."""
    start = time.time() + args.warmup + 1.0  # (each process connects within that)
    per = [args.submitters // args.workers + (i < args.submitters % args.workers)
           for i in range(args.workers)]
    processes = []
    for i, submitters in enumerate(per):
        spec = {"client": client, "port": port, "boards": boards, "start": start,
                "seconds": args.seconds, "submitters": submitters,
                "tag": f"{client}{time.monotonic_ns()}-{i}"}
        processes.append(subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)],
            stdout=subprocess.PIPE, text=True))
    time.sleep(max(0.0, start - time.time()))
    before = cpu.sample()
    time.sleep(max(0.0, start + args.seconds - time.time()))
    after = cpu.sample()
    results = []
    for process in processes:
        out, _ = process.communicate(timeout=args.seconds + args.warmup + WORKER_SLACK * 2)
        if process.returncode != 0:
            raise RuntimeError(f"load process failed ({process.returncode})")
        results.append(json.loads(out))
    used = {name: after[name] - before[name] for name in after}
    used["load"] = sum(r["cpu"] for r in results)
    latencies = sorted(x for r in results for x in r["latencies"])
    first = next((r["first_error"][0] for r in results if r["first_error"]), "")
    return Row(what, sum(r["done"] for r in results) / args.seconds,
               percentile(latencies, 0.5) * 1000, percentile(latencies, 0.99) * 1000,
               sum(r["errors"] for r in results), used, args.seconds,
               f"first error: {first}" if first else "")


def fill(nodes: list[Any], boards: list[str], members: int) -> None:
    """Create ``boards`` (policy sum) and give each ``members`` members,
    through the nodes in turn (REST; a node forwards what it does not write)."""
    for i, board in enumerate(boards):
        node = nodes[i % len(nodes)]
        code, body = node.request("PUT", f"/v1/boards/{board}", {"policy": "sum"})
        assert code in (200, 201), body
        for first in range(0, members, FILL_BATCH):
            events = [{"member": f"m{n}", "delta": 1, "event_id": f"fill-{board}-{n}"}
                      for n in range(first, min(members, first + FILL_BATCH))]
            for attempt in range(50):  # a group being placed answers 503 a moment
                code, body = nodes[(i + attempt) % len(nodes)].request(
                    "POST", f"/v1/boards/{board}/scores/batch", {"events": events})
                if code == 200:
                    break
                time.sleep(0.1)
            else:
                raise RuntimeError(f"filling {board} failed: {code} {body}")


def memory_rows(nodes: list[Any], empty: list[float]) -> list[str]:
    from bench_moves import rss_mib, status

    rows = []
    for node, before in zip(nodes, empty, strict=True):
        counts = status(node)["placement"]["per_node"].get(node.data_dir.name, {})
        now = rss_mib(node)
        rows.append(f"{node.data_dir.name} {now:.0f} MiB (+{now - before:.0f} over empty; "
                    f"leads {counts.get('primary', 0)}, follows {counts.get('follower', 0)} "
                    "groups)")
    return rows


def redis_benchmark(port: int, requests: int, pipeline: int, command: list[str],
                    cpu: Cpu, what: str, cluster: bool) -> Row:
    """One ``redis-benchmark`` run; its rate and latency from ``--csv``."""
    argv = ["redis-benchmark", *(["--cluster"] if cluster else []), "-h", "127.0.0.1",
            "-p", str(port), "-c",
            str(BENCH_CLIENTS), "-P", str(pipeline), "-n", str(requests), "-r",
            str(BENCH_RANDOM), "--csv", *command]
    children = children_cpu_seconds()
    before = cpu.sample()
    began = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = process.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    elapsed = time.perf_counter() - began
    after = cpu.sample()
    if process.returncode != 0 or "rps" not in out:
        raise RuntimeError(f"{' '.join(argv)} failed ({process.returncode}): {out}\n{err}")
    lines = [line.replace('"', "").split(",") for line in out.splitlines() if "," in line]
    data = dict(zip(lines[0], lines[-1], strict=True))
    used = {name: after[name] - before[name] for name in after}
    used["load"] = children_cpu_seconds() - children  # redis-benchmark, reaped just now
    errors = len(re.findall(r"Error from server", err))
    return Row(what, float(data["rps"]), float(data["p50_latency_ms"]),
               float(data["p99_latency_ms"]), errors, used, elapsed,
               (err.strip().splitlines() or [""])[0][:160] if errors else "")


#: (what, pipeline depth, command); KEY is the board.  redis-benchmark
#: ``--cluster`` (7.0) swaps ``{tag}`` for the hash tag of ONE slot per master
#: (the slot changes only on ``-MOVED``) and a key without ``{tag}`` is
#: answered ``-MOVED`` by two masters of three, which it counts as an error:
#: so ``rb:{tag}:__rand_int__``, many boards in one slot (one group) per
#: master.  On one node (redis-benchmark refuses ``--cluster`` with a
#: single master) the same load without ``--cluster``: ``rb:{one}:__rand_int__``,
#: many boards in one slot.
BENCH_LOADS = [("ZADD, -P 16", 16, ["ZADD", "KEY", "__rand_int__", "m:__rand_int__"]),
               ("ZINCRBY, -P 1", 1, ["ZINCRBY", "KEY", "1", "m:__rand_int__"]),
               ("ZINCRBY, -P 16", 16, ["ZINCRBY", "KEY", "1", "m:__rand_int__"]),
               ("ZSCORE, -P 16", 16, ["ZSCORE", "KEY", "m:__rand_int__"])]


def bench_against(port: int, cpu: Cpu, label: str, requests: dict[int, int],
                  cluster: bool) -> list[Row]:
    """Every load of :data:`BENCH_LOADS` against ``port``, one after another."""
    key = "rb:{tag}:__rand_int__" if cluster else "rb:{one}:__rand_int__"
    return [redis_benchmark(port, requests[pipeline], pipeline,
                            [key if word == "KEY" else word for word in command], cpu,
                            f"redis-benchmark{' --cluster' if cluster else ''} {what}, "
                            f"{label}", cluster)
            for what, pipeline, command in BENCH_LOADS]


def redis_call(port: int, *words: str) -> str:
    return subprocess.run(["redis-cli", "-p", str(port), *words], capture_output=True,
                          text=True, timeout=10, check=True).stdout


@contextlib.contextmanager
def redis_cluster(root: Path, count: int = 3) -> Iterator[tuple[int, list[int]]]:
    """``count`` ``redis-server --cluster-enabled yes`` processes (no
    persistence) made one cluster: (a port, their pids); stopped by pid."""
    from daemon import free_port

    processes, ports = [], []
    try:
        for i in range(count):
            port = free_port()
            directory = root / f"redis{i}"
            directory.mkdir()
            processes.append(subprocess.Popen(
                ["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                 "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                 "--save", "", "--appendonly", "no", "--dir", str(directory)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            ports.append(port)
        for port in ports:
            for _ in range(100):
                with contextlib.suppress(subprocess.CalledProcessError):
                    if "PONG" in redis_call(port, "PING"):
                        break
                time.sleep(0.05)
        subprocess.run(["redis-cli", "--cluster", "create",
                        *(f"127.0.0.1:{port}" for port in ports), "--cluster-yes"],
                       capture_output=True, text=True, timeout=60, check=True)
        for _ in range(200):
            if all("cluster_state:ok" in redis_call(port, "CLUSTER", "INFO")
                   for port in ports):
                break
            time.sleep(0.1)
        else:
            raise RuntimeError("the Redis Cluster never reached cluster_state:ok")
        yield ports[0], [process.pid for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait(timeout=10)


def print_table(rows: list[Row]) -> None:
    print("| " + " | ".join(HEADER) + " |")
    print("|" + "---|" * len(HEADER))
    for row in rows:
        print("| " + " | ".join(row.cells()) + " |")
    notes = [f"{row.what}: {row.note}" for row in rows if row.note]
    for note in notes:
        print(f"- {note}")


def scale(args: argparse.Namespace, root: Path, rows: list[Row], memory: list[str]) -> None:
    """Section 1, and section 2's runs against rankd (on the 1- and 3-node clusters)."""
    from bench_moves import postgres_server, rss_mib, start_nodes, stop_nodes

    boards = [f"s{i}" for i in range(args.boards)]
    requests = {1: args.bench_requests, 16: args.bench_requests * 4}
    with postgres_server() as server:
        pg = postmaster_pid(server.cluster.data)
        for count in args.nodes:
            nodes = start_nodes(root / f"scale{count}", server.create_database(), count,
                                min(1, count - 1))
            try:
                empty = [rss_mib(node) for node in nodes]
                began = time.monotonic()
                fill(nodes, boards, args.members)
                print(f"# {count} node(s): {args.boards} boards x {args.members:,} members "
                      f"filled in {time.monotonic() - began:.1f} s", flush=True)
                time.sleep(args.settle)  # placed, then dropped where not placed
                cpu = Cpu({"servers": [node.process.pid for node in nodes], "postgres": [pg]})
                before = cpu.sample()
                time.sleep(args.idle)
                idle = {name: (value - before[name]) / args.idle
                        for name, value in cpu.sample().items()}
                label = f"{count} node{'s' if count > 1 else ''}"
                loads = [("tcp", "Python TCP client", boards),
                         ("redis", "redis-py RedisCluster", boards),
                         ("tcp", "Python TCP client, ONE board", boards[:1])]
                for client, name, chosen in loads:
                    port = nodes[0].tcp_port if client == "tcp" else nodes[0].resp_port
                    rows.append(run_load(client, port, chosen, args, cpu, f"{name}, {label}"))
                    print(f"#   {rows[-1].what}: {rows[-1].rate:,.0f}/s", flush=True)
                memory.append(f"{label}, idle (no load, {args.idle:g} s): rankd nodes "
                              f"{idle['servers']:.2f} cores, Postgres {idle['postgres']:.2f}")
                memory.append(f"{label}, --replicas {min(1, count - 1)}: "
                              + "; ".join(memory_rows(nodes, empty)))
                if count in (1, 3) and not args.skip_redis_benchmark:
                    rows.extend(bench_against(nodes[0].resp_port, cpu, f"rankd, {label}",
                                              requests, cluster=count > 1))
            finally:
                stop_nodes(nodes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--boards", type=int, default=256)
    parser.add_argument("--members", type=int, default=2_000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--submitters", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--settle", type=float, default=4.0)
    parser.add_argument("--idle", type=float, default=3.0,
                        help="seconds the idle CPU of the nodes and Postgres is measured")
    parser.add_argument("--nodes", type=lambda text: [int(n) for n in text.split(",")],
                        default=[1, 2, 3], help="cluster sizes, e.g. 1,3")
    parser.add_argument("--bench-requests", type=int, default=20_000,
                        help="redis-benchmark -n at -P 1 against rankd (4x at -P 16; "
                             "Redis Cluster gets 10x)")
    parser.add_argument("--skip-redis-benchmark", action="store_true")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if args.worker:
        json.dump(worker_main(json.loads(args.worker)), sys.stdout)
        return 0
    if args.quick:
        args.boards, args.members, args.seconds, args.warmup = 32, 200, 2.0, 1.0
        args.bench_requests, args.settle, args.idle = 2_000, 2.0, 1.0
    if shutil.which("redis-benchmark") is None:
        args.skip_redis_benchmark = True
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"# bench_scale: {stamp}, {os.cpu_count()} cores (shared by the nodes, Postgres "
          f"and the load generators), load average {load_average()} at start", flush=True)
    rows: list[Row] = []
    memory: list[str] = []
    with tempfile.TemporaryDirectory() as name:
        root = Path(name)
        scale(args, root, rows, memory)
        if not args.skip_redis_benchmark and shutil.which("redis-server"):
            with redis_cluster(root) as (port, pids):
                cpu = Cpu({"servers": pids})
                requests = {1: args.bench_requests * 10, 16: args.bench_requests * 40}
                for row in bench_against(port, cpu, "Redis Cluster, 3 redis-server", requests,
                                         cluster=True):
                    rows.append(row)
    print_table(rows)
    print("\nPer cluster size: idle CPU, and memory per node (VmRSS) after the loads "
          "against the same node before its boards:")
    for line in memory:
        print(f"- {line}")
    print(f"\nload average at the end: {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
