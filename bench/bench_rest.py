"""REST at the HTTP stack's limit: rankd's REST routes beside a bare aiohttp
handler, driven by ``wrk`` (issue 48, item 1).

Servers, each a process of its own, started once and kept for the run:

* ``bare``: an aiohttp application on the event loop the daemon uses
  (uvloop when installed), access log off like the daemon's, one ``POST``
  route that reads the JSON body with orjson (as rankd does) and answers a
  JSON object of the size of rankd's submit answer, and one ``GET`` route
  answering bytes of the size of rankd's top-10 page.  That is the limit:
  aiohttp's own cost for a request of that shape.
* ``framed`` (``--framed``): the same handler behind one pass-through
  middleware and a response-prepare signal that sets rankd's two extra
  headers: what those aiohttp features cost by themselves.
* ``rankd``: ``rankd serve`` of this tree (``--fsync everysec``), its board
  ``bench`` (policy ``sum``) loaded with ``--members`` members first.
* ``base`` (``--base TREE``): ``rankd serve`` of another source tree, for a
  before/after in the same rounds.

Rows (``wrk -t1 -c<N>``, one Lua script each, bodies built per request):

* ``submit``: ``POST /v1/boards/bench/scores`` ``{"member", "delta": 1}``;
* ``submit+id``: the same with a unique ``event_id``;
* ``top 10``: ``GET /v1/boards/bench/top?limit=10``;
* ``member``: ``GET /v1/boards/bench/members/<random member>``;
* ``bare POST`` / ``bare GET``: the bare handler, the reference of the
  writes and of the reads.

Each round runs every row once, in an order that alternates from round to
round; a row's figures are the median of its rounds, its ratio to the bare
handler the median of the rounds' ratios (each against the bare run of the
same round).  Server CPU per request is the server process's user+system
CPU time over the run divided by the requests wrk counted; ``/ bare (CPU)``
is the bare handler's CPU per request over the row's (median of the
rounds), the rate ratio two servers would reach each with a core of its own,
which a busy shared machine moves much less than the rates.  ``--resp`` adds
``redis-benchmark -c <N> ZINCRBY`` against rankd's RESP port, the same
increments over the other protocol.

Run from the project root::

    python bench/bench_rest.py                         # 3 rounds, 5 s a row, -c64 and -c16
    python bench/bench_rest.py --base /work/wt-base    # before/after
    python bench/bench_rest.py --quick                 # 1 round, 1 s a row
    python bench/bench_rest.py --base /work/wt-base --callgrind   # instructions per request

With ``--callgrind`` every server runs under valgrind's callgrind, counting
only while a row runs (``callgrind_control -i on/off``), and a row's CPU
column is the server's user-space instructions per request (thousands),
less what it runs idle in as long (its timers, counted first over 5 s;
under callgrind a request takes ~50 times as long, so an idle timer's work
would weigh 50 times what it does).  Instruction counts are what this
machine's noise does not move; the rates under callgrind mean nothing.
    python bench/bench_rest.py --bare-serve PORT       # only the bare server (used by the run)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BOARD = "bench"
#: rankd's answer to a plain submit, for the bare handler's answer size.
SUBMIT_ANSWER = {"member": "m12345", "score": 17.0, "rank": 4242, "previous": 16.0,
                 "changed": True, "duplicate": False, "event_id": None}

LUA_DONE = r"""
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('WRKJSON {"requests":%d,"duration_us":%d,"connect":%d,"read":%d,'
    .. '"write":%d,"status":%d,"timeout":%d,"p50_us":%d,"p99_us":%d}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(99)))
end
"""

LUA_POST = r"""
counter = 0
function init(args)
  math.randomseed(os.time() + os.clock() * 1e6)
  prefix = string.format("%d-%d", os.time(), math.random(0, 1e9))
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
end
function request()
  counter = counter + 1
  local body
  if IDS then
    body = string.format('{"member":"m%d","delta":1,"event_id":"r%s-%d"}',
                         math.random(0, MEMBERS - 1), prefix, counter)
  else
    body = string.format('{"member":"m%d","delta":1}', math.random(0, MEMBERS - 1))
  end
  return wrk.format(nil, nil, nil, body)
end
"""

LUA_MEMBER = r"""
function init(args)
  math.randomseed(os.time() + os.clock() * 1e6)
end
function request()
  return wrk.format("GET", string.format("/v1/boards/bench/members/m%d",
                                         math.random(0, MEMBERS - 1)))
end
"""

LUA_GET = ""  # the URL's path and query as given


@dataclass
class Run:
    """One wrk run's figures (``cpu_us``: under callgrind, thousands of
    instructions per request)."""

    rate: float
    p50_ms: float
    p99_ms: float
    cpu_us: float
    errors: int


# --- callgrind ---------------------------------------------------------------------------

#: valgrind's command line for a server counted only while a row runs.
CALLGRIND = ("valgrind", "--tool=callgrind", "--instr-atstart=no")
#: How long each server's idle instructions are counted (see the docstring).
IDLE_SECONDS = 5.0


def callgrind_wrapper(out: Path) -> tuple[str, ...]:
    return (*CALLGRIND, f"--callgrind-out-file={out}.%p")


def instrument(pid: int, on: bool) -> None:
    subprocess.run(["callgrind_control", "-i", "on" if on else "off", str(pid)],
                   check=True, capture_output=True)


def counted_instructions(pid: int, out: Path) -> int:
    """The instructions callgrind counted in ``pid`` since its last dump
    (``out``: the ``--callgrind-out-file`` prefix); the dump zeroes them."""
    pattern = f"{out.name}.{pid}*"
    before = set(out.parent.glob(pattern))
    subprocess.run(["callgrind_control", "--dump", str(pid)], check=True, capture_output=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for path in set(out.parent.glob(pattern)) - before:
            totals = [line for line in path.read_text().splitlines()
                      if line.startswith("totals:")]
            if totals:
                path.unlink()
                return int(totals[0].split()[1])
        time.sleep(0.2)
    raise RuntimeError("callgrind wrote no dump")


class Counting:
    """Instructions per request of servers run under callgrind (by pid)."""

    def __init__(self) -> None:
        self.outs: dict[int, Path] = {}
        self.idle: dict[int, float] = {}

    def add(self, pid: int, out: Path) -> None:
        """Count server ``pid`` (dumping to ``out``), its idle rate first."""
        self.outs[pid] = out
        instrument(pid, True)
        time.sleep(IDLE_SECONDS)
        instrument(pid, False)
        self.idle[pid] = counted_instructions(pid, out) / IDLE_SECONDS

    def per_request(self, pid: int, seconds: float, requests: int) -> float:
        """Thousands of instructions per request since counting began."""
        total = counted_instructions(pid, self.outs[pid]) - self.idle[pid] * seconds
        return total / max(1, requests) / 1e3


@dataclass
class Row:
    name: str
    server: str
    runs: list[Run] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)
    #: The bare handler's server CPU per request over this row's, by round:
    #: the rate ratio two servers would have, each with a core of its own.
    cpu_ratios: list[float] = field(default_factory=list)


# --- the bare server -------------------------------------------------------------------

def bare_serve(port: int) -> None:
    """The bare aiohttp application, on the daemon's loop (uvloop if installed)."""
    import asyncio

    import orjson
    from aiohttp import web

    answer = orjson.dumps(SUBMIT_ANSWER)
    page = b"x" * int(os.environ.get("BARE_GET_BYTES", "900"))

    async def post(request: web.Request) -> web.Response:
        data = orjson.loads(await request.read())
        if not isinstance(data, dict) or "member" not in data:
            return web.Response(status=422)
        return web.Response(body=answer, content_type="application/json")

    async def get(request: web.Request) -> web.Response:
        return web.Response(body=page, content_type="application/json")

    @web.middleware
    async def through(request: web.Request, handler: Any) -> web.StreamResponse:
        return await handler(request)

    async def headers(request: web.Request, response: web.StreamResponse) -> None:
        response.headers["Server"] = "rankd"
        response.headers["X-Content-Type-Options"] = "nosniff"

    async def main() -> None:
        # With BARE_FRAMED=1: one pass-through middleware and a response-prepare
        # signal setting rankd's two headers, the aiohttp features rankd uses.
        framed = os.environ.get("BARE_FRAMED") == "1"
        app = web.Application(middlewares=[through] if framed else [])
        if framed:
            app.on_response_prepare.append(headers)
        app.router.add_post("/bare", post)
        app.router.add_get("/bare", get)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.Event().wait()

    try:
        import uvloop
    except ImportError:
        asyncio.run(main())
    else:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(main())


# --- measuring --------------------------------------------------------------------------

def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wrk(url: str, script: str, connections: int, seconds: float, pid: int,
        workdir: Path, counting: Counting | None = None) -> Run:
    path = workdir / f"s{abs(hash(script))}.lua"
    path.write_text(script + LUA_DONE)
    command = ["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s",
               "--timeout", "5s", "-s", str(path), url]
    if counting is not None:
        instrument(pid, True)
    before, started = cpu_seconds(pid), time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, check=True,
                          timeout=seconds + 60)
    cpu, elapsed = cpu_seconds(pid) - before, time.monotonic() - started
    if counting is not None:
        instrument(pid, False)
    match = re.search(r"^WRKJSON (.*)$", done.stdout, re.MULTILINE)
    if match is None:
        raise RuntimeError(f"unexpected wrk output:\n{done.stdout}\n{done.stderr}")
    data = json.loads(match.group(1))
    requests = max(1, data["requests"])
    errors = sum(data[k] for k in ("connect", "read", "write", "status", "timeout"))
    per_request = (cpu / requests * 1e6 if counting is None
                   else counting.per_request(pid, elapsed, data["requests"]))
    return Run(data["requests"] / (data["duration_us"] / 1e6), data["p50_us"] / 1e3,
               data["p99_us"] / 1e3, per_request, errors)


def redis_benchmark(port: int, connections: int, seconds: float, pid: int,
                    members: int) -> Run:
    requests = int(seconds * 40_000)
    command = ["redis-benchmark", "-p", str(port), "-c", str(connections), "-n",
               str(requests), "-r", str(members), "--csv", "ZINCRBY", "respbench", "1",
               "m__rand_int__"]
    before = cpu_seconds(pid)
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=True,
                          timeout=seconds * 20 + 60)
    elapsed = time.perf_counter() - started
    cpu = cpu_seconds(pid) - before
    lines = [line for line in done.stdout.splitlines() if line.startswith('"ZINCRBY')]
    cells = [c.strip('"') for c in lines[-1].split(",")]
    # "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95","p99","max"
    return Run(float(cells[1]), float(cells[4]), float(cells[6]),
               cpu / requests * 1e6 if elapsed else 0.0, 0)


# --- servers ---------------------------------------------------------------------------

def free_port() -> int:
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_http(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer in {timeout} s")


def start_rankd(tree: Path, data_dir: Path, members: int, extra: list[str],
                wrapper: tuple[str, ...] = ()) -> Any:
    sys.path.insert(0, str(ROOT / "tests"))
    from daemon import Daemon

    daemon = Daemon(data_dir, "--fsync", "everysec", *extra, env={"PYTHONPATH": str(tree / "src")},
                    wrapper=wrapper).start(timeout=600 if wrapper else 30)
    status, body = daemon.request("PUT", f"/v1/boards/{BOARD}", {"policy": "sum"})
    if status not in (200, 201):
        raise RuntimeError(f"PUT /v1/boards/{BOARD} answered {status}: {body}")
    for start in range(0, members, 10_000):
        events = [{"member": f"m{i}", "delta": i % 977}
                  for i in range(start, min(members, start + 10_000))]
        status, body = daemon.request("POST", f"/v1/boards/{BOARD}/scores/batch",
                                      {"events": events})
        if status != 200:
            raise RuntimeError(f"loading answered {status}: {body}")
    return daemon


def scenarios(members: int) -> list[tuple[str, str, str, str]]:
    """(row, server kind, path, Lua script) for every row."""
    post = f"MEMBERS = {members}\n" + LUA_POST
    return [("bare POST", "bare", "/bare", "IDS = false\n" + post),
            ("submit", "rankd", f"/v1/boards/{BOARD}/scores", "IDS = false\n" + post),
            ("submit+id", "rankd", f"/v1/boards/{BOARD}/scores", "IDS = true\n" + post),
            ("bare GET", "bare", "/bare", LUA_GET),
            ("top 10", "rankd", f"/v1/boards/{BOARD}/top?limit=10", LUA_GET),
            ("member", "rankd", "/",
             f"MEMBERS = {members}\n" + LUA_MEMBER)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--connections", default="64,16")
    parser.add_argument("--members", type=int, default=100_000)
    parser.add_argument("--base", type=Path, help="another source tree to run beside")
    parser.add_argument("--resp", action="store_true", help="add a RESP ZINCRBY row")
    parser.add_argument("--only", default="", help="comma-separated row names to run")
    parser.add_argument("--framed", action="store_true",
                        help="add the bare handler behind a pass-through middleware and a "
                             "response-prepare signal (server 'framed')")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--callgrind", action="store_true",
                        help="count instructions per request under callgrind (see above)")
    parser.add_argument("--bare-serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--rankd-arg", action="append", default=[],
                        help="an extra argument for every rankd serve")
    args = parser.parse_args(argv)
    if args.bare_serve:
        bare_serve(args.bare_serve)
        return
    if args.quick:
        args.rounds, args.seconds, args.members = 1, 1.0, 10_000
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed (Debian: apt-get install wrk)")
    if args.callgrind and (args.resp or shutil.which("valgrind") is None):
        sys.exit("--callgrind needs valgrind, and counts no --resp row")
    connection_counts = [int(c) for c in args.connections.split(",")]
    only = {name.strip() for name in args.only.split(",") if name.strip()}

    workdir = Path(tempfile.mkdtemp(prefix="bench_rest."))
    port, framed_port = free_port(), free_port()
    counting = Counting() if args.callgrind else None

    def wrapper(name: str) -> tuple[str, ...]:
        return callgrind_wrapper(workdir / f"{name}-callgrind") if counting else ()

    bare = subprocess.Popen([*wrapper("bare"), sys.executable, __file__, "--bare-serve",
                             str(port)])
    framed = subprocess.Popen([*wrapper("framed"), sys.executable, __file__, "--bare-serve",
                               str(framed_port)],
                              env={**os.environ, "BARE_FRAMED": "1"}) if args.framed else None
    daemons: dict[str, Any] = {}
    try:
        wait = 600 if counting else 30
        wait_http(f"http://127.0.0.1:{port}/bare", wait)
        servers = {"bare": (f"http://127.0.0.1:{port}", bare.pid)}
        if framed is not None:
            wait_http(f"http://127.0.0.1:{framed_port}/bare", wait)
            servers["framed"] = (f"http://127.0.0.1:{framed_port}", framed.pid)
        trees = {"rankd": ROOT, **({"base": args.base.resolve()} if args.base else {})}
        for name, tree in trees.items():
            daemons[name] = start_rankd(tree, workdir / name, args.members, args.rankd_arg,
                                        wrapper(name))
            servers[name] = (daemons[name].url, daemons[name].process.pid)
        if counting is not None:
            for name, (_, pid) in servers.items():
                counting.add(pid, workdir / f"{name}-callgrind")
        rows = run_rounds(args, servers, daemons, connection_counts, only, workdir, counting)
        print_table(rows, args, trees)
    finally:
        for daemon in daemons.values():
            daemon.stop()
        for process in (bare, framed):
            if process is not None:
                process.terminate()
                process.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


def run_rounds(args: argparse.Namespace, servers: dict[str, tuple[str, int]],
               daemons: dict[str, Any], connection_counts: list[int], only: set[str],
               workdir: Path, counting: Counting | None = None) -> list[Row]:
    rows: dict[tuple[str, str, int], Row] = {}
    plan = []
    for connections in connection_counts:
        for name, kind, path, script in scenarios(args.members):
            if only and name not in only and kind != "bare":
                continue
            targets = ([s for s in servers if s in ("bare", "framed")] if kind == "bare"
                       else [s for s in servers if s not in ("bare", "framed")])
            plan.extend((connections, name, target, path, script) for target in targets)
        if args.resp:
            plan.extend((connections, "RESP ZINCRBY", target, "", "")
                        for target in daemons)
    for round_ in range(args.rounds):
        order = plan if round_ % 2 == 0 else list(reversed(plan))
        bare_of: dict[tuple[int, str], Run] = {}
        done: list[tuple[Row, Run, str]] = []
        for connections, name, target, path, script in order:
            url, pid = servers[target]
            if name == "RESP ZINCRBY":
                run = redis_benchmark(daemons[target].resp_port, connections, args.seconds,
                                      pid, args.members)
            else:
                run = wrk(url + path, script, connections, args.seconds, pid, workdir,
                          counting)
            row = rows.setdefault((name, target, connections),
                                  Row(f"{name} -c{connections}", target))
            row.runs.append(run)
            if target == "bare":
                bare_of[(connections, name)] = run
            done.append((row, run, name))
            print(f"  round {round_ + 1} {row.name:<22} {target:<5} {run.rate:>9,.0f}/s "
                  f"p50 {run.p50_ms:.2f} p99 {run.p99_ms:.2f} ms {run.cpu_us:.0f} "
                  + ("k instr/req" if counting else "us/req")
                  + (f" ERRORS {run.errors}" if run.errors else ""), file=sys.stderr,
                  flush=True)
        for row, run, name in done:
            reference = "bare GET" if name in ("top 10", "member") else "bare POST"
            connections = int(row.name.rsplit("-c", 1)[1])
            if row.server != "bare" and (connections, reference) in bare_of:
                bare = bare_of[(connections, reference)]
                row.ratios.append(run.rate / bare.rate)
                row.cpu_ratios.append(bare.cpu_us / run.cpu_us)
    return list(rows.values())


def print_table(rows: list[Row], args: argparse.Namespace, trees: dict[str, Path]) -> None:
    print(f"bench_rest.py: {args.rounds} rounds of {args.seconds:g} s, {args.members:,} "
          f"members, wrk -t1; medians of the rounds; "
          + ", ".join(f"{k}={v}" for k, v in trees.items()))
    print()
    cost = "server k instructions/req" if args.callgrind else "server CPU us/req"
    print(f"| row | server | req/s | p50 ms | p99 ms | {cost} | / bare (rate) | "
          "/ bare (CPU) | errors |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        med = statistics.median
        ratio = f"{med(row.ratios):.2f}x" if row.ratios else "-"
        cpu_ratio = f"{med(row.cpu_ratios):.2f}x" if row.cpu_ratios else "-"
        print(f"| {row.name} | {row.server} | {med(r.rate for r in row.runs):,.0f} | "
              f"{med(r.p50_ms for r in row.runs):.2f} | {med(r.p99_ms for r in row.runs):.2f} | "
              f"{med(r.cpu_us for r in row.runs):.1f} | {ratio} | {cpu_ratio} | "
              f"{sum(r.errors for r in row.runs)} |")


if __name__ == "__main__":
    main()
