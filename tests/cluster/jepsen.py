"""A Jepsen-style fault harness for a rankd cluster, on loopback.

:class:`Lab` runs a throwaway Postgres and ``nodes`` real rankd processes
(``rankd serve --cluster-dsn ...``).  Each node reaches Postgres through
its own :class:`~nemesis.Proxy` and clients reach each node through
another, so a scenario can delay, blackhole or reset any one link.

:func:`load` is the load generator: concurrent clients submit ``delta: 1``
events, each with its own event id, to random members of a few ``sum``
boards through random nodes, and record every operation's invocation and
outcome in a :class:`History`: ``ok`` (acknowledged), ``fail`` (refused:
certainly not applied) or ``unknown`` (a timeout, a broken connection, an
``unacknowledged`` answer).  Most clients use REST (the engine's general
path); when the nodes listen for the TCP protocol, one in four uses it, its
plain submits taking the primary's native path (runs applied packed at the
group's next positions), following ``moved`` answers to the primary.

:func:`check` is the checker.  It first resolves every unknown operation by
submitting the same event id again until a node answers it (a committed
event answers as a duplicate), then proves from the history, the cluster's
log in Postgres and every node's state:

* every acknowledged event is in the log exactly once (nothing
  acknowledged lost, nothing applied twice), and no refused one is;
* each member's score on every node is the number of its events in the
  log (acknowledged ones plus the unknowns that committed);
* every node reaches the same digest at the same log positions;
* epochs never go back along each group's log, and positions are
  contiguous.

Run from the command line for the long form, which prints figures::

    python tests/cluster/jepsen.py --seconds 60 [scenario ...]
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import asyncpg

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from daemon import Daemon  # noqa: E402
from nemesis import Proxy  # noqa: E402
from pgcluster import Cluster, _bin_dir  # noqa: E402
from rankd.engine import records  # noqa: E402
from rankd.engine.frames import scan  # noqa: E402

BOARDS = ("arena", "weekly-cup", "sprint")
MEMBERS = tuple(f"m{i}" for i in range(6))
#: The nodes' --max-unshipped-ms (its default), in seconds.
MAX_UNSHIPPED_SECONDS = 1.0
#: Answers that mean "not applied", whatever happened before.
REFUSED_CODES = {"not_primary", "unavailable", "read_only", "invalid", "guard", "not_found",
                 "rate_limited"}


@dataclass
class Operation:
    event_id: str
    board: str
    member: str
    node: int
    invoked: float
    completed: float = 0.0
    #: ok, fail or unknown
    outcome: str = "unknown"
    detail: str = ""


@dataclass
class History:
    operations: list[Operation] = field(default_factory=list)
    #: (time, what the nemesis did)
    faults: list[tuple[float, str]] = field(default_factory=list)

    def outcomes(self) -> Counter:
        return Counter(op.outcome for op in self.operations)

    def latencies(self) -> list[float]:
        return sorted(op.completed - op.invoked for op in self.operations if op.outcome == "ok")


def wait_ready(daemon: Daemon, timeout: float = 30.0) -> None:
    """Until the node joined its cluster and every listener is up."""
    deadline = time.monotonic() + timeout
    while daemon.request("GET", "/v1/ready")[0] != 200:
        if time.monotonic() > deadline:
            raise RuntimeError(f"node not ready in {timeout} s:\n{daemon.log()[-3000:]}")
        time.sleep(0.05)


class Lab:
    """Postgres and ``nodes`` rankd nodes, every link through a proxy.

    With ``standby`` Postgres has a streaming standby that every commit
    waits for (synchronous replication), and the nodes reach the two with
    one multi-host DSN (``target_session_attrs=read-write``), as with a
    Postgres made highly available by its own tooling (not through proxies).
    """

    def __init__(self, root: Path, *, nodes: int = 3, lease_seconds: float = 1.5,
                 ack: str = "log", ack_timeout: float = 3.0, tcp: bool = True,
                 extra: tuple[str, ...] = (), standby: bool = False) -> None:
        self.root = root
        bin_dir = _bin_dir()
        if bin_dir is None:
            raise RuntimeError("no PostgreSQL server binaries (initdb)")
        self.pg = Cluster(bin_dir)
        self.pg.init()
        self.standby: Cluster | None = None
        if standby:
            self.pg.start(settings={"wal_level": "replica", "max_wal_senders": "4",
                                    "synchronous_standby_names": "standby1"})
            self.standby = Cluster(bin_dir)
            self.standby.make_standby_of(self.pg, "standby1")
            self.standby.start()
        else:
            self.pg.start()
        self.lease_seconds = lease_seconds
        self.ack = ack
        parts = urlsplit(self.pg.admin_dsn)
        self.pg_proxies = [Proxy(parts.port) for _ in range(nodes)]
        self.daemons: list[Daemon] = []
        self.client_proxies: list[Proxy] = []
        #: The TCP protocol's client links, when the nodes listen for it.
        self.tcp_proxies: list[Proxy] = []
        self.tcp = tcp
        for i in range(nodes):
            dsn = urlunsplit(parts._replace(
                netloc=f"{parts.username}@127.0.0.1:{self.pg_proxies[i].port}"))
            if self.standby is not None:
                dsn = self.dsn
            daemon = Daemon(root / f"node{i}", "--cluster-dsn", dsn, "--node-id", f"n{i}",
                            "--lease-seconds", str(lease_seconds), "--ack", ack,
                            "--ack-timeout", str(ack_timeout), "--log-format", "text",
                            "--fsync", "always", *(() if tcp else ("--tcp-port", "0")),
                            *extra)
            self.daemons.append(daemon)
            daemon.start()
            wait_ready(daemon)
            # Only now: a proxy made before would take any free port, the one the
            # daemon had picked (and not yet bound) among them.
            self.client_proxies.append(Proxy(daemon.port))
            if tcp:
                self.tcp_proxies.append(Proxy(daemon.tcp_port))
        self.paused: set[int] = set()

    @property
    def dsn(self) -> str:
        if self.standby is None:
            return self.pg.admin_dsn
        return (f"postgresql://postgres@127.0.0.1:{self.pg.port},127.0.0.1:{self.standby.port}"
                "/postgres?target_session_attrs=read-write")

    def url(self, node: int) -> str:
        return f"http://127.0.0.1:{self.client_proxies[node].port}"

    def alive(self, node: int) -> bool:
        process = self.daemons[node].process
        return process is not None and process.poll() is None

    def kill(self, node: int) -> None:
        self.daemons[node].kill()

    def restart(self, node: int) -> None:
        self.daemons[node].start()
        wait_ready(self.daemons[node])

    def pause(self, node: int) -> None:
        os.kill(self.daemons[node].process.pid, signal.SIGSTOP)
        self.paused.add(node)

    def resume(self, node: int) -> None:
        os.kill(self.daemons[node].process.pid, signal.SIGCONT)
        self.paused.discard(node)

    def status(self, avoid: int | None = None) -> dict:
        for node in range(len(self.daemons)):
            if self.alive(node) and node not in self.paused and node != avoid:
                try:
                    status, body = self.daemons[node].request("GET", "/v1/cluster", timeout=5)
                except OSError:
                    continue
                if status == 200:
                    return body
        raise RuntimeError("no node answers /v1/cluster")

    def primary_of(self, board: str, avoid: int | None = None) -> int | None:
        from rankd.cluster.groups import group_of

        for group in self.status(avoid)["groups"]:
            if group["group"] == group_of(board) and group["primary"]:
                return int(group["primary"][1:])
        return None

    def close(self) -> None:
        for node in list(self.paused):
            self.resume(node)
        for daemon in self.daemons:
            if daemon.process is not None and daemon.process.poll() is None:
                try:
                    daemon.stop(timeout=20)
                except Exception:
                    daemon.kill()
        for proxy in self.pg_proxies + self.client_proxies + self.tcp_proxies:
            proxy.close()
        self.pg.destroy()
        if self.standby is not None:
            self.standby.destroy()

    def logs(self) -> str:
        return "\n".join(f"--- node {i} ---\n{d.log()[-6000:]}"
                         for i, d in enumerate(self.daemons))


# --- load -------------------------------------------------------------------------------------

async def load(lab: Lab, history: History, seconds: float, *, clients: int = 8,
               timeout: float = 5.0, seed: int = 0) -> None:
    """Submit events from ``clients`` concurrent clients for ``seconds``
    (every fourth over TCP when the nodes listen for it)."""
    rng = random.Random(seed)
    deadline = time.monotonic() + seconds
    counter = iter(range(10**9))
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:

        async def client(number: int) -> None:
            tcp = TcpSubmitter(lab, timeout) if lab.tcp and number % 4 == 3 else None
            try:
                while time.monotonic() < deadline:
                    node = rng.randrange(len(lab.daemons))
                    op = Operation(f"c{number}-{next(counter)}", rng.choice(BOARDS),
                                   rng.choice(MEMBERS), node, time.monotonic())
                    history.operations.append(op)
                    if tcp is None:
                        await submit(session, lab.url(node), op)
                    else:
                        await tcp.submit(op)
                    op.completed = time.monotonic()
                    if op.outcome != "ok":
                        await asyncio.sleep(0.02)
            finally:
                if tcp is not None:
                    await tcp.close()

        await asyncio.gather(*(client(n) for n in range(clients)))


async def submit(session: aiohttp.ClientSession, url: str, op: Operation) -> None:
    body = {"member": op.member, "delta": 1, "event_id": op.event_id}
    try:
        async with session.post(f"{url}/v1/boards/{op.board}/scores", json=body) as answer:
            payload = await answer.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as exc:
        op.outcome, op.detail = "unknown", type(exc).__name__
        return
    if answer.status == 200:
        op.outcome, op.detail = "ok", "duplicate" if payload.get("duplicate") else ""
        return
    code = (payload or {}).get("error", {}).get("code", str(answer.status))
    op.outcome = "fail" if code in REFUSED_CODES else "unknown"
    op.detail = code


class TcpSubmitter:
    """One load client's TCP connections, a node each (through its proxy),
    opened when first needed and dropped when broken; the client follows a
    ``moved`` answer to the primary, once, over a connection of its own."""

    def __init__(self, lab: Lab, timeout: float) -> None:
        self.lab = lab
        self.timeout = timeout
        self.clients: dict[int, Any] = {}

    async def submit(self, op: Operation) -> None:
        from rankd.client import AsyncClient, RankdError

        client = self.clients.get(op.node)
        try:
            if client is None:
                client = AsyncClient("127.0.0.1", self.lab.tcp_proxies[op.node].port,
                                     timeout=self.timeout, connect_timeout=self.timeout,
                                     retries=0)
                self.clients[op.node] = client
                await client.connect()
            answer = await client.submit(op.board, op.member, delta=1, event_id=op.event_id)
        except RankdError as exc:
            op.outcome = "fail" if exc.code in REFUSED_CODES | {"moved"} else "unknown"
            op.detail = f"tcp {exc.code}"
            if op.outcome == "unknown":
                await self._drop(op.node)
            return
        except (OSError, TimeoutError) as exc:
            op.outcome, op.detail = "unknown", f"tcp {type(exc).__name__}"
            await self._drop(op.node)
            return
        op.outcome, op.detail = "ok", "tcp duplicate" if answer.get("duplicate") else "tcp"

    async def _drop(self, node: int) -> None:
        client = self.clients.pop(node, None)
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close()

    async def close(self) -> None:
        for node in list(self.clients):
            await self._drop(node)


# --- the checker ----------------------------------------------------------------------------

async def resolve_unknowns(lab: Lab, history: History, timeout: float = 60.0) -> int:
    """Submit each unknown (and refused) operation's event id again until
    some node answers it; returns how many were resolved.  After this,
    every event of the history is acknowledged exactly once or refused
    for good (never)."""
    deadline = time.monotonic() + timeout
    pending = [op for op in history.operations if op.outcome != "ok"]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        for op in pending:
            retry = Operation(op.event_id, op.board, op.member, op.node, time.monotonic())
            while True:
                node = random.randrange(len(lab.daemons))
                if not lab.alive(node) or node in lab.paused:
                    continue
                await submit(session, lab.url(node), retry)
                if retry.outcome == "ok":
                    op.detail += f" -> resubmitted: {retry.detail or 'applied'}"
                    op.outcome = "ok" if op.outcome == "unknown" else "fail-then-ok"
                    break
                if time.monotonic() > deadline:
                    raise AssertionError(f"event {op.event_id} cannot be resubmitted: "
                                         f"{retry.outcome} {retry.detail}")
                await asyncio.sleep(0.1)
    return len(pending)


async def read_log(dsn: str) -> dict[int, list[tuple[int, int, tuple]]]:
    """Every group's log in Postgres: ``(seq, epoch, record)`` in order."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT group_id, first_seq, last_seq, epoch, records "
                                "FROM rankd_log ORDER BY group_id, first_seq")
        registers = {r["group_id"]: r["last_seq"] for r in
                     await conn.fetch("SELECT group_id, last_seq FROM rankd_groups")}
    finally:
        await conn.close()
    logs: dict[int, list[tuple[int, int, tuple]]] = {}
    for row in rows:
        found = scan(bytes(row["records"]), row["first_seq"])
        assert found.bad is None and found.next_lsn == row["last_seq"] + 1, row["group_id"]
        logs.setdefault(row["group_id"], []).extend(
            (seq, row["epoch"], records.decode(payload)) for seq, payload in found.records)
    for group, entries in logs.items():
        assert [seq for seq, _, _ in entries] == list(range(1, len(entries) + 1)), \
            f"group {group}: positions are not contiguous"
        assert entries[-1][0] == registers[group], f"group {group}: register disagrees"
        epochs = [epoch for _, epoch, _ in entries]
        assert epochs == sorted(epochs), f"group {group}: an epoch went back"
    return logs


def read_orphans(lab: Lab) -> set[str]:
    """Event ids of the records nodes set aside (``wal/orphan-*``)."""
    found = set()
    for daemon in lab.daemons:
        for path in (daemon.data_dir / "wal").glob("orphan-*"):
            data = path.read_bytes()
            first = int.from_bytes(data[8:16], "little") if len(data) >= 16 else 1
            scanned = scan(data, first)
            assert scanned.bad is None, path
            for _, payload in scanned.records:
                record = records.decode(payload)
                if record[0] == records.SUBMIT:
                    found.add(record[5])
    return found


async def converge(lab: Lab, timeout: float = 30.0) -> dict[int, str]:
    """Wait until every live node has applied every group's last position
    and all answer the same digest; returns the digests."""
    deadline = time.monotonic() + timeout
    digests: dict[int, str] = {}
    while time.monotonic() < deadline:
        digests = {}
        for node in range(len(lab.daemons)):
            if lab.alive(node) and node not in lab.paused:
                try:
                    status, body = lab.daemons[node].request("GET", "/v1/admin/digest")
                except OSError:
                    break
                if status == 200:
                    digests[node] = body["digest"]
        live = sum(1 for n in range(len(lab.daemons)) if lab.alive(n) and n not in lab.paused)
        if len(digests) == live and len(set(digests.values())) == 1:
            await asyncio.sleep(0.3)  # and still so a moment later (nothing in flight)
            again = {n: lab.daemons[n].request("GET", "/v1/admin/digest")[1]["digest"]
                     for n in digests}
            if again == digests:
                return digests
        await asyncio.sleep(0.2)
    positions = {}
    for node in digests:
        with contextlib.suppress(OSError):
            positions[node] = lab.daemons[node].request("GET", "/v1/cluster")[1]
    raise AssertionError(f"nodes did not converge: {digests}; their cluster status: "
                         f"{positions}")


async def check(lab: Lab, history: History) -> dict:
    """Resolve unknowns, then check the history against the log and every
    node (see the module docstring); returns figures."""
    outcomes = history.outcomes()
    over_tcp = sum(op.outcome == "ok" and op.detail.startswith("tcp")
                   for op in history.operations)
    resolved = await resolve_unknowns(lab, history)
    await converge(lab)
    logs = await read_log(lab.dsn)
    logged: Counter = Counter()
    per_member: Counter = Counter()
    for entries in logs.values():
        for _, _, record in entries:
            if record[0] == records.SUBMIT:
                logged[record[5]] += 1
                per_member[(record[1], record[2])] += record[3]
    twice = [event for event, count in logged.items() if count > 1]
    assert not twice, f"applied more than once: {twice[:10]}"
    ours = {op.event_id: op for op in history.operations}
    lost = [e for e, op in ours.items() if op.outcome == "ok" and e not in logged]
    orphaned = read_orphans(lab)
    if lab.ack == "log":
        assert not lost, f"acknowledged and lost: {[ours[e] for e in lost[:5]]}"
    else:  # lost only what a deposed primary had not shipped, and set it aside
        unaccounted = [e for e in lost if e not in orphaned]
        assert not unaccounted, f"acknowledged, lost, not set aside: {unaccounted[:5]}"
        for board in BOARDS:  # and only what was acknowledged within the window
            times = [ours[e].invoked for e in lost if ours[e].board == board]
            if times:
                window = max(times) - min(times)
                assert window <= MAX_UNSHIPPED_SECONDS + 0.5, (board, window)
    strangers = [e for e in logged if e not in ours]
    assert not strangers, f"events nobody submitted: {strangers[:5]}"
    digests = await converge(lab)
    for node in digests:
        for board in BOARDS:
            status, top = lab.daemons[node].request("GET", f"/v1/boards/{board}/top?limit=100")
            assert status == 200, top
            scores = {entry["member"]: entry["score"] for entry in top["entries"]}
            expected = {member: float(total) for (b, member), total in per_member.items()
                        if b == board}
            assert scores == expected, (node, board, scores, expected)
    return {"operations": len(history.operations), "acknowledged": outcomes["ok"],
            "acknowledged_over_tcp": over_tcp, "refused": outcomes["fail"],
            "unknown": outcomes["unknown"],
            "resubmitted": resolved, "logged": len(logged), "lost_acknowledged": len(lost),
            "set_aside": len(orphaned), "nodes_agreeing": len(digests),
            "epochs": {g: entries[-1][1] for g, entries in logs.items()}}


def make_boards(lab: Lab) -> None:
    for board in BOARDS:
        for _ in range(100):
            status, body = lab.daemons[0].request("PUT", f"/v1/boards/{board}",
                                                  {"policy": "sum"})
            if status in (200, 201):
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"cannot create {board}: {body}")


# --- scenarios ---------------------------------------------------------------------------------

async def run_scenario(lab: Lab, name: str, seconds: float) -> dict:
    """Load for ``seconds`` with the named fault in the middle of it, heal,
    check; returns the checker's figures and the scenario's own."""
    history = History()
    started = time.monotonic()
    loader = asyncio.create_task(load(lab, history, seconds))
    figures = await NEMESES[name](lab, history, seconds)
    await loader
    history.faults.append((time.monotonic() - started, "load done"))
    return {**await check(lab, history), **figures,
            "p50_ms": round(percentile(history.latencies(), 0.5) * 1000, 1),
            "p99_ms": round(percentile(history.latencies(), 0.99) * 1000, 1)}


def percentile(values: list[float], share: float) -> float:
    return values[min(len(values) - 1, int(share * len(values)))] if values else float("nan")


async def first_ok_after(lab: Lab, history: History, board: str, since: float,
                         nodes: list[int], timeout: float = 30.0) -> float:
    """Seconds from ``since`` until a write of ``board`` through ``nodes``
    is acknowledged (the probes are part of the history)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1)) as session:
        deadline = time.monotonic() + timeout
        probe = 0
        while time.monotonic() < deadline:
            for node in nodes:
                op = Operation(f"probe-{since}-{probe}", board, "probe", node, time.monotonic())
                history.operations.append(op)
                probe += 1
                await submit(session, lab.url(node), op)
                if op.outcome == "ok":
                    return time.monotonic() - since
            await asyncio.sleep(0.02)
    raise AssertionError(f"no write of {board} acknowledged {timeout} s after the fault")


async def strike_primary(lab: Lab, history: History, wait: float, what: str,
                         fault: Callable[[int], None]) -> tuple[int, float, float]:
    """After ``wait``, ``fault`` the primary of the first board; returns it,
    when, and how long until a write of that board is acknowledged again."""
    await asyncio.sleep(wait)
    victim = await asyncio.to_thread(lab.primary_of, BOARDS[0])
    struck = time.monotonic()
    fault(victim)
    history.faults.append((struck, f"{what} node {victim}"))
    others = [n for n in range(len(lab.daemons)) if n != victim]
    return victim, struck, await first_ok_after(lab, history, BOARDS[0], struck, others)


async def kill_primary(lab: Lab, history: History, seconds: float) -> dict:
    victim, _, failover = await strike_primary(lab, history, seconds / 3, "kill -9", lab.kill)
    await asyncio.sleep(seconds / 3)
    await restart(lab, history, victim)
    return {"failover_s": round(failover, 2)}


async def pause_primary(lab: Lab, history: History, seconds: float) -> dict:
    victim, _, failover = await strike_primary(lab, history, seconds / 4, "SIGSTOP",
                                               lab.pause)
    await asyncio.sleep(lab.lease_seconds)
    lab.resume(victim)
    history.faults.append((time.monotonic(), f"SIGCONT node {victim}"))
    return {"failover_s": round(failover, 2)}


async def blackhole_primary_postgres(lab: Lab, history: History, seconds: float) -> dict:
    victim, cut, failover = await strike_primary(
        lab, history, seconds / 4, "blackhole Postgres from",
        lambda node: lab.pg_proxies[node].set_mode("blackhole"))
    # Under --ack local the victim acknowledged alone for a while: wait for the takeover.
    while await asyncio.to_thread(lab.primary_of, BOARDS[0], victim) == victim:
        await asyncio.sleep(0.05)
    taken = time.monotonic() - cut
    await asyncio.sleep(seconds / 4)
    lab.pg_proxies[victim].set_mode("reset")
    await asyncio.sleep(0.2)
    lab.pg_proxies[victim].set_mode("pass")
    history.faults.append((time.monotonic(), f"heal node {victim} -> Postgres"))
    return {"failover_s": round(failover, 2), "taken_over_s": round(taken, 2)}


async def partition_clients_from_primary(lab: Lab, history: History, seconds: float) -> dict:
    await asyncio.sleep(seconds / 4)
    victim = await asyncio.to_thread(lab.primary_of, BOARDS[0])
    before = {g["group"]: g["epoch"] for g in (await asyncio.to_thread(lab.status))["groups"]}
    links = [lab.client_proxies[victim], *lab.tcp_proxies[victim:victim + 1]]
    for link in links:
        link.set_mode("blackhole")
    history.faults.append((time.monotonic(), f"blackhole clients -> node {victim}"))
    await asyncio.sleep(seconds / 2)
    after = {g["group"]: g["epoch"]
             for g in (await asyncio.to_thread(lab.status, victim))["groups"]}
    for link in links:
        link.set_mode("reset")
    await asyncio.sleep(0.2)
    for link in links:
        link.set_mode("pass")
    history.faults.append((time.monotonic(), f"heal clients -> node {victim}"))
    assert {g: after[g] for g in before} == before, f"a failover happened: {before} {after}"
    return {"epochs_unchanged": True}


async def restart_postgres(lab: Lab, history: History, seconds: float) -> dict:
    await asyncio.sleep(seconds / 3)
    history.faults.append((time.monotonic(), "pg_ctl stop -m immediate"))
    await asyncio.to_thread(lab.pg.stop, "immediate")
    await asyncio.sleep(1.0)
    await asyncio.to_thread(lab.pg.start)
    history.faults.append((time.monotonic(), "Postgres started"))
    return {}


async def kill_follower(lab: Lab, history: History, wait: float) -> int:
    """After ``wait``, ``kill -9`` a node that is not the first board's primary."""
    await asyncio.sleep(wait)
    primary = await asyncio.to_thread(lab.primary_of, BOARDS[0])
    victim = (primary + 1) % len(lab.daemons)
    lab.kill(victim)
    history.faults.append((time.monotonic(), f"kill -9 follower {victim}"))
    return victim


async def restart(lab: Lab, history: History, node: int) -> None:
    await asyncio.to_thread(lab.restart, node)  # the load goes on meanwhile
    history.faults.append((time.monotonic(), f"restarted node {node}"))


async def restart_follower(lab: Lab, history: History, seconds: float) -> dict:
    victim = await kill_follower(lab, history, seconds / 3)
    await asyncio.sleep(seconds / 4)
    await restart(lab, history, victim)
    return {}


async def corrupt_follower(lab: Lab, history: History, seconds: float) -> dict:
    victim = await kill_follower(lab, history, seconds / 3)
    segments = sorted((lab.daemons[victim].data_dir / "wal").glob("*.log"))
    damaged = segments[0]
    data = bytearray(damaged.read_bytes())
    for offset in range(64, min(len(data), 4096), 97):
        data[offset] ^= 0xFF
    damaged.write_bytes(bytes(data))
    history.faults.append((time.monotonic(), f"corrupted follower {victim}'s log"))
    await restart(lab, history, victim)
    assert lab.daemons[victim].wait_for_log("replaying every group from the cluster's log",
                                            timeout=10), lab.daemons[victim].log()[-3000:]
    return {}


async def promote_standby(lab: Lab, history: History, seconds: float) -> dict:
    """The Postgres primary dies (``-m immediate``) and its synchronous
    standby is promoted, as Postgres's HA tooling would; the nodes find the
    new primary through their multi-host DSN."""
    await asyncio.sleep(seconds / 3)
    stopped = time.monotonic()
    history.faults.append((stopped, "Postgres primary: pg_ctl stop -m immediate"))
    await asyncio.to_thread(lab.pg.stop, "immediate")
    await asyncio.sleep(0.5)
    await asyncio.to_thread(lab.standby.promote)
    history.faults.append((time.monotonic(), "standby promoted"))
    back = await first_ok_after(lab, history, BOARDS[0], stopped,
                                list(range(len(lab.daemons))))
    return {"writes_back_s": round(back, 2)}


#: Scenarios that need ``Lab(standby=True)``.
NEEDS_STANDBY = {"promote_standby"}

NEMESES = {
    "kill_primary": kill_primary,
    "pause_primary": pause_primary,
    "blackhole_primary_postgres": blackhole_primary_postgres,
    "partition_clients_from_primary": partition_clients_from_primary,
    "restart_postgres": restart_postgres,
    "restart_follower": restart_follower,
    "corrupt_follower": corrupt_follower,
    "promote_standby": promote_standby,
}


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="*", default=list(NEMESES))
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--ack", default="log", choices=("log", "local"))
    args = parser.parse_args()
    failed = 0
    for name in args.scenarios:
        with tempfile.TemporaryDirectory() as root:
            lab = Lab(Path(root), ack=args.ack, standby=name in NEEDS_STANDBY)
            try:
                make_boards(lab)
                figures = asyncio.run(run_scenario(lab, name, args.seconds))
                print(f"{name}: PASS {json.dumps(figures)}", flush=True)
            except AssertionError as exc:
                failed += 1
                print(f"{name}: FAIL {exc}\n{lab.logs()}", flush=True)
            finally:
                lab.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
