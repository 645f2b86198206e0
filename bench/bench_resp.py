"""RESP benchmark: ``redis-benchmark`` drives redis-server and rankd's RESP
port, side by side in one run.

    python bench/bench_resp.py                 # 1M members, 5 rounds
    python bench/bench_resp.py --members 100000 --rounds 1 --requests 20000   # quick
    python bench/bench_resp.py --pages ...     # also rankd on the paged index layout
    python bench/bench_resp.py --pages --base-src ../wt-base/src ...  # and before a change

Servers, all on loopback, one at a time on the machine's cores:

* ``redis``: redis-server without persistence (the speed reference);
* ``redis-aof``: redis-server with ``appendonly yes``, ``appendfsync everysec``;
* ``rankd``: ``rankd serve --fsync everysec`` (its WAL, fsynced every second),
  on the default index, or on ``--index skiplist`` with ``--pages``;
* ``rankd-pages``, with ``--pages``: the same on ``--index pages`` (the compact
  paged index, the default); a last table sets it against ``rankd`` on the
  skip list (rates and CPU per request, paired by round);
* ``rankd@base`` (and ``rankd-pages@base``), with ``--base-src DIR``: the same
  daemons run from another checkout's sources (built), in the same rounds,
  so a change's before and after are measured side by side.

Each is loaded with the same ``--members`` members (``ZADD`` in large
pipelined batches, not timed), then every row runs ``redis-benchmark -c
50 -n <requests> -P <depth> -r <members>`` against each server in turn,
``--rounds`` times, each round beginning with the next server; the table
gives each server's median requests/s and, against each Redis, the median
of rankd's ratios in the rounds (the two ran back to back; the ratio of
medians would mix a slow moment of the machine with a fast one).  Below it,
the same ratios between Redis with and without its AOF on the read rows,
which both serve alike: how far two servers doing the same work differ
here, the run's noise.  redis-benchmark writes ``__rand_int__`` as a
12-digit zero-padded number below ``-r``, so the members loaded are
``m:000000000000``.. in that form: every request names a loaded member (reads
hit, writes update), which the run checks at the end (``ZCARD`` unchanged).
The two cores are shared by the server and redis-benchmark (which is
single-threaded) for every server alike.  A second table gives each
server's own CPU time per request (``/proc``, every thread: ``schedstat``'s
nanoseconds where the kernel keeps them, else ``stat``'s ticks) over the same
runs: it moves far less than the rates with whatever else the machine is
doing.  A third gives its user-space part: unpipelined, the kernel's share
(a read and a write per request, the same system calls for every server)
is most of it.  A fourth tells which side limited each rate: the share of a
core that the server (every thread) and redis-benchmark used while it ran.
A side near 100 % was the limit; unpipelined on two cores, that is
redis-benchmark itself, whichever server it drives, and the ratio then
compares the servers only within that client's noise.  A fifth counts how
often each server blocked waiting for requests (voluntary context
switches of its threads, per 1,000 requests): when the client is the
limit, each of those costs the client a wake-up in its next send, and a
server that answers sooner blocks more often.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE.parent / "src"))

from daemon import Daemon, free_port  # noqa: E402
from rankd.frontends.resp.protocol import encode_request  # noqa: E402

#: The commands of COMMANDS that only read.
READS = ("ZREVRANK", "ZREVRANGE", "ZSCORE")

COMMANDS = [
    "ZINCRBY lb 1 m:__rand_int__",
    "ZADD lb __rand_int__ m:__rand_int__",
    "ZREVRANK lb m:__rand_int__",
    "ZREVRANGE lb 0 9 WITHSCORES",
    "ZSCORE lb m:__rand_int__",
]


class Run(NamedTuple):
    """One redis-benchmark run against one server."""

    rate: float  # requests/s, as redis-benchmark measured it
    cpu_us: float  # the server's CPU time per request (every thread)
    user_us: float  # its user-space part
    server_core: float  # % of a core the server used while the run lasted
    client_core: float  # % of a core redis-benchmark used
    sleeps: float  # times per 1,000 requests a server thread blocked (voluntary switches)


class RedisProcess:
    def __init__(self, directory: Path, *extra: str) -> None:
        self.port = free_port()
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--dir", str(directory), *extra], stdout=subprocess.DEVNULL)
        wait_for_port(self.port)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(30)


def wait_for_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def load(port: int, members: int, batch: int = 1000) -> None:
    """``members`` members with scores 0.., in pipelined ZADDs, named as
    redis-benchmark's ``m:__rand_int__`` expands (``m:000000000042``)."""
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        pending = 0
        for start in range(0, members, batch):
            words = ["ZADD", "lb"]
            for i in range(start, min(start + batch, members)):
                words += [str(i), member(i)]
            sock.sendall(encode_request(words))
            pending += 1
            if pending == 50:
                _read_replies(sock, pending)
                pending = 0
        _read_replies(sock, pending)


def member(i: int) -> str:
    """The member redis-benchmark's ``m:__rand_int__`` names for ``i``."""
    return f"m:{i:012d}"


def cardinality(port: int) -> int:
    """``ZCARD lb``."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(encode_request(["ZCARD", "lb"]))
        data = b""
        while not data.endswith(b"\r\n"):
            chunk = sock.recv(1024)
            if not chunk:
                raise ConnectionError("closed while asking ZCARD")
            data += chunk
    return int(data[1:-2])


def _read_replies(sock: socket.socket, count: int) -> None:
    data = b""
    while data.count(b"\r\n") < count:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed while loading")
        data += chunk
    if b"-" in data[:1] or b"\r\n-" in data:
        raise RuntimeError(f"loading failed: {data[:200]!r}")


def cpu_seconds(pid: int) -> tuple[float, float]:
    """``(user, system)`` CPU time (every thread) process ``pid`` has used."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def run_seconds(pid: int) -> float | None:
    """CPU time the threads of process ``pid`` have run so far, to the
    nanosecond (``schedstat``; None without it): ``/proc``'s ticks of 10 ms
    are 0.5 us a request at 20,000 requests, a third of a pipelined read's
    cost.  A thread that ended meanwhile drops out, as in
    :func:`voluntary_switches`."""
    total = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/schedstat") as stat:
                    total += int(stat.read().split()[0])
            except FileNotFoundError:
                continue
    except FileNotFoundError:
        return None
    return total / 1e9


def voluntary_switches(pid: int) -> int:
    """Times the threads of process ``pid`` have blocked so far (a thread
    that ended meanwhile drops out: the servers' threads live for the run)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/status") as status:
                for line in status:
                    if line.startswith("voluntary_ctxt_switches:"):
                        total += int(line.split()[1])
        except FileNotFoundError:
            continue
    return total


def client_cpu_seconds() -> float:
    """User + system CPU time of the finished child processes (redis-benchmark)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measured(port: int, pid: int, command: str, depth: int, requests: int, members: int
             ) -> Run:
    """One run of redis-benchmark against the server ``pid``."""
    user, system = cpu_seconds(pid)
    ran = run_seconds(pid)
    client = client_cpu_seconds()
    switches = voluntary_switches(pid)
    began = time.monotonic()
    rate = benchmark(port, command, depth, requests, members)
    elapsed = time.monotonic() - began
    user_after, system_after = cpu_seconds(pid)
    ran_after = run_seconds(pid)
    client = client_cpu_seconds() - client
    switches = voluntary_switches(pid) - switches
    spent = user_after - user
    server = spent + system_after - system
    if ran is not None and ran_after is not None:
        server = ran_after - ran  # (the same time, to the nanosecond)
    return Run(rate, server / requests * 1e6, spent / requests * 1e6,
               server / elapsed * 100, client / elapsed * 100, switches / requests * 1e3)


def benchmark(port: int, command: str, depth: int, requests: int, members: int) -> float:
    """Requests/s redis-benchmark measures."""
    done = subprocess.run(
        ["redis-benchmark", "-p", str(port), "-c", "50", "-n", str(requests), "-P", str(depth),
         "-r", str(members), "--csv", *command.split()],
        capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(done.stderr or done.stdout)
    rows = list(csv.reader(io.StringIO(done.stdout)))
    return float(rows[-1][1])


def print_table(results: dict[tuple[str, int, str], list[Run]],
                depths: list[int], field: int, rankd_title: str, number: str, *,
                higher_is_better: bool) -> None:
    """A markdown table of one measure (``field``: an index of ``Run``),
    each server's median, and rankd's standing against each Redis as a
    ratio above 1.00 when rankd does better."""
    ratio = "rankd / {}" if higher_is_better else "{} / rankd"
    print(f"| command | -P | redis | redis AOF everysec | {rankd_title} | "
          f"{ratio.format('redis')} | {ratio.format('redis AOF')} |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for depth in depths:
        for command in COMMANDS:
            redis, aof, rankd = (
                statistics.median(run[field] for run in results[(command, depth, name)])
                for name in ("redis", "redis-aof", "rankd"))
            better = [paired_ratio(results, command, depth, "rankd", other, field,
                                   higher_is_better=higher_is_better)
                      for other in ("redis", "redis-aof")]
            print(f"| `{command}` | {depth} | {number.format(redis)} | {number.format(aof)} | "
                  f"{number.format(rankd)} | {better[0]:.2f}x | {better[1]:.2f}x |")


def round_ratios(results: dict[tuple[str, int, str], list[Run]], command: str, depth: int,
                 name: str, other: str, field: int = 0, *,
                 higher_is_better: bool = True) -> list[float]:
    """``name``'s figure over ``other``'s in each round (above 1.00: ``name`` did better).

    The two ran one right after the other in the same round, so a ratio of
    theirs shares the machine's state of that moment; the ratio of two
    medians would mix moments the machine was slow with moments it was not.
    """
    pairs = zip(results[(command, depth, name)], results[(command, depth, other)], strict=True)
    # (A figure of 0, a time below /proc's tick, gives no ratio.)
    return [ours[field] / theirs[field] if higher_is_better else theirs[field] / ours[field]
            for ours, theirs in pairs if ours[field] and theirs[field]] or [math.nan]


def paired_ratio(results: dict[tuple[str, int, str], list[Run]], command: str, depth: int,
                 name: str, other: str, field: int = 0, *, higher_is_better: bool = True
                 ) -> float:
    """The median over the rounds of :func:`round_ratios`."""
    return statistics.median(round_ratios(results, command, depth, name, other, field,
                                          higher_is_better=higher_is_better))


def print_layouts(results: dict[tuple[str, int, str], list[Run]], depths: list[int],
                  suffix: str = "") -> None:
    """rankd on the paged layout against rankd on the skip list: rates and
    CPU per request, medians and the median of the rounds' ratios (of the
    daemons named with ``suffix``: ``@base`` for ``--base-src``)."""
    skiplist, pages = "rankd" + suffix, "rankd-pages" + suffix
    print("| command | -P | rankd req/s | rankd-pages req/s | pages / skiplist rate | "
          "rankd CPU us/req | rankd-pages CPU us/req | pages / skiplist CPU |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for depth in depths:
        for command in COMMANDS:
            rate, paged_rate, cpu, paged_cpu = (
                statistics.median(run[field] for run in results[(command, depth, name)])
                for field, name in ((0, skiplist), (0, pages), (1, skiplist), (1, pages)))
            rates = paired_ratio(results, command, depth, pages, skiplist, 0)
            cpus = 1 / paired_ratio(results, command, depth, pages, skiplist, 1,
                                    higher_is_better=False)
            print(f"| `{command}` | {depth} | {rate:,.0f} | {paged_rate:,.0f} | {rates:.2f}x | "
                  f"{cpu:.1f} | {paged_cpu:.1f} | {cpus:.2f}x |")


def print_noise(results: dict[tuple[str, int, str], list[Run]], depths: list[int]) -> None:
    """How far two identical servers differ here: Redis with and without its
    AOF serve the read rows alike (the AOF logs writes only)."""
    for depth in depths:
        spread = [round_ratios(results, command, depth, "redis-aof", "redis")
                  for command in COMMANDS if command.split()[0] in READS]
        medians = [statistics.median(ratios) for ratios in spread]
        every = [ratio for ratios in spread for ratio in ratios]
        print(f"-P {depth}: redis AOF / redis on the read rows, per round "
              f"{min(every):.2f}x-{max(every):.2f}x, medians {min(medians):.2f}x-"
              f"{max(medians):.2f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--depths", default="1,16")
    parser.add_argument("--pages", action="store_true",
                        help="also rankd on --index pages, set against rankd")
    parser.add_argument("--base-src", type=Path, default=None,
                        help="also the rankd daemons run from this src dir (another "
                             "checkout, built), '@base' in the tables")
    args = parser.parse_args()
    if shutil.which("redis-benchmark") is None or shutil.which("redis-server") is None:
        print("redis-server and redis-benchmark are needed (Debian: redis-server, redis-tools)")
        return 1
    depths = [int(d) for d in args.depths.split(",")]
    with tempfile.TemporaryDirectory() as root:
        redis = RedisProcess(Path(root))
        aof_dir = Path(root) / "aof"
        aof_dir.mkdir()
        redis_aof = RedisProcess(aof_dir, "--appendonly", "yes", "--appendfsync", "everysec")
        # With --pages, "rankd" is the skip list's (the paged index is the default).
        skiplist = ("--index", "skiplist") if args.pages else ()
        daemon = Daemon(Path(root) / "rankd", "--fsync", "everysec", "--tcp-port", "0", *skiplist)
        daemon.start()
        servers = {"redis": (redis.port, redis.process.pid),
                   "redis-aof": (redis_aof.port, redis_aof.process.pid),
                   "rankd": (daemon.resp_port, daemon.process.pid)}
        daemons = [daemon]
        for suffix, src in [("", None)] + ([("@base", args.base_src)] if args.base_src else []):
            env = None if src is None else {"PYTHONPATH": str(src.resolve())}
            kinds = (["rankd"] if src is not None else []) + (["rankd-pages"] if args.pages else [])
            for kind in kinds:
                extra = ("--index", "pages") if kind == "rankd-pages" else skiplist
                started = Daemon(Path(root) / f"{kind}{suffix}", "--fsync", "everysec",
                                 "--tcp-port", "0", *extra, env=env).start()
                daemons.append(started)
                servers[kind + suffix] = (started.resp_port, started.process.pid)
        try:
            for name, (port, _) in servers.items():
                began = time.monotonic()
                load(port, args.members)
                print(f"loaded {args.members} members into {name} in "
                      f"{time.monotonic() - began:.1f} s", flush=True)
            results: dict[tuple[str, int, str], list[Run]] = {}
            names = list(servers)
            for round_number in range(args.rounds):
                # Each round begins with another server: none is always the
                # one that follows (or precedes) a particular other.
                turn = round_number % len(names)
                order = names[turn:] + names[:turn]
                for depth in depths:
                    for command in COMMANDS:
                        for name in order:
                            port, pid = servers[name]
                            results.setdefault((command, depth, name), []).append(measured(
                                port, pid, command, depth, args.requests, args.members))
            for name, (port, _) in servers.items():  # every request named a loaded member
                held = cardinality(port)
                if held != args.members:
                    raise AssertionError(f"{name} holds {held} members, not "
                                         f"{args.members}: the requests missed the load")
        finally:
            for each in daemons:
                each.stop()
            redis.stop()
            redis_aof.stop()
    print(f"\nredis-benchmark -c 50 -n {args.requests} -r {args.members}, {args.members} "
          f"members, median of {args.rounds} round(s), requests/s")
    print_table(results, depths, 0, "rankd (WAL everysec)", "{:,.0f}", higher_is_better=True)
    print("\nrates: each server's median; ratios: the median of the rounds' ratios (each "
          "round runs the servers one right after the other, in a rotating order)")
    print("this machine's noise, between two servers that do the same work:")
    print_noise(results, depths)
    # The rates swing with whatever else shares the machine; each server's
    # own CPU time per request moves far less (one core each is the limit).
    print("\nserver CPU per request (user + system, microseconds), median of the rounds; "
          "redis / rankd above 1.00 means rankd spends less")
    print_table(results, depths, 1, "rankd", "{:.2f}", higher_is_better=False)
    # Unpipelined, most of that is the kernel's (a read and a write per
    # request, the same system calls for both servers); what each server's
    # own code costs is the user-space part.
    print("\nof which user space (microseconds per request), median of the rounds")
    print_table(results, depths, 2, "rankd", "{:.2f}", higher_is_better=False)
    print("\nwho limited the rate: % of a core used by the server / by redis-benchmark, "
          "median of the rounds (near 100 %: the limit)")
    print_by_server(results, depths, lambda runs: (
        f"{statistics.median(run.server_core for run in runs):.0f} / "
        f"{statistics.median(run.client_core for run in runs):.0f}"))
    # Where redis-benchmark is the limit, the server waits for it between
    # requests; every time it blocks, the client's next send pays to wake it.
    print("\nserver sleeps: times its threads blocked per 1,000 requests, median of the rounds")
    print_by_server(results, depths, lambda runs: (
        f"{statistics.median(run.sleeps for run in runs):.0f}"))
    if args.pages:
        print("\nrankd on --index pages against rankd on the skip list (above 1.00: pages "
              "is faster / uses more CPU), median of the rounds' ratios")
        print_layouts(results, depths)
    if args.pages and args.base_src:
        print(f"\nthe same, run from {args.base_src} (@base)")
        print_layouts(results, depths, "@base")
    return 0


def print_by_server(results: dict[tuple[str, int, str], list[Run]], depths: list[int],
                    cell: Callable[[list[Run]], str]) -> None:
    """A markdown table with a cell per server and row: ``cell`` of its runs."""
    names = ("redis", "redis-aof", "rankd")
    print("| command | -P | " + " | ".join(names) + " |")
    print("|---|---:|" + "---:|" * len(names))
    for depth in depths:
        for command in COMMANDS:
            cells = [cell(results[(command, depth, name)]) for name in names]
            print(f"| `{command}` | {depth} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.exit(main())
