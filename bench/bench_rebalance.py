"""Rebalance benchmark: how long a cluster takes to spread every board
group over nodes that join it.

Everything runs on this machine on loopback: a throwaway Postgres
(tests/pgcluster.py), ``rankd serve --cluster-dsn`` nodes (tests/daemon.py's
harness via bench_moves.py), and the clients in this process; figures are
end to end on 2 shared cores.

One node ``n0`` (``--replicas 1``) gets one board in each of the 1,024
groups (``--groups``), each with ``--members`` members (default 1,000),
so it is the primary of every group and no group has a follower.  Then
``--join`` nodes (default 2) start and a rebalance is asked for at once
(``POST /v1/cluster/rebalance``; unasked, the planner waits 30 s for the
live nodes to settle).  Sampled every 0.5 s from ``GET /v1/cluster``:

* **followers placed**: when every group has its ``--replicas`` followers
  in the placement (the planner restores R in one round);
* **balanced**: when the primaries (the registers' holders) differ by at
  most one group across the nodes and no move is in progress: the
  rebalance's time, with the moves it made (the groups whose holder
  changed) and moves per second.

Meanwhile ``--writers`` clients (default 4) submit one event at a time to
random boards through every node in turn, retrying a refusal (``503``
during a cut-over) with the same event id: their acknowledgements' p50,
p99 and max over the rebalance, and at the end every acknowledged event is
read back from a node that did not take it (none lost).

    python bench/bench_rebalance.py                    # 1,024 groups, 3 nodes
    python bench/bench_rebalance.py --groups 128 --members 100   # quick
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import aiohttp
import asyncpg

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE.parent / "tests" / "cluster"))

from cluster_nodes import boards_in_distinct_groups  # noqa: E402

from bench_moves import fill, postgres_server, start_nodes, status, stop_nodes  # noqa: E402
from rankd.cluster.load import GroupLoad  # noqa: E402


def settled(body: dict, nodes: list[str], replicas: int) -> tuple[bool, bool, Counter]:
    """(every group has its followers, primaries even and no move left,
    groups held per node) from one ``GET /v1/cluster``."""
    placement = body["placement"]
    groups = placement["groups"]
    followed = all(len(g["followers"]) >= min(replicas, len(nodes) - 1)
                   for g in groups.values())
    holders = Counter(g["primary"] for g in body["groups"] if g["primary"])
    counts = [holders.get(node, 0) for node in nodes]
    even = max(counts) - min(counts) <= 1 and not placement["moves"]
    return followed, even, holders


async def rebalance(root: Path, dsn: str, groups: int, members: int, join: int,
                    writers: int, replicas: int, timeout: float) -> None:
    first = start_nodes(root, dsn, 1, replicas)
    joined: list = []
    try:
        boards = boards_in_distinct_groups("g", groups, tries=200_000)
        async with aiohttp.ClientSession() as session:
            for board in boards:
                code, body = first[0].request("PUT", f"/v1/boards/{board}", {})
                assert code == 201, body
            loaded = time.monotonic()
            for board in boards:
                await fill(session, first, board, members)
            print(f"{len(boards)} boards of {members} members on one node in "
                  f"{time.monotonic() - loaded:.1f} s")
            joined = start_nodes(root, dsn, join, replicas, first=1)
            nodes = first + joined
            names = [f"n{i}" for i in range(len(nodes))]
            started = time.monotonic()
            code, body = first[0].request("POST", "/v1/cluster/rebalance", {})
            assert code == 202, body
            load = Writers(nodes, boards, writers)
            tasks = [asyncio.create_task(load.run(session)) for _ in range(writers)]
            followed_at = even_at = None
            holders_before = {g["group"]: g["primary"] for g in status(first[0])["groups"]}
            weights = GroupLoad(await asyncpg.create_pool(dsn, min_size=1, max_size=1), every=0)
            last_print = 0.0
            while time.monotonic() - started < timeout:
                body = status(first[0])
                followed, even, holders = settled(body, names, replicas)
                if time.monotonic() - last_print > 10:
                    last_print = time.monotonic()
                    weighed = await weights.weights(last_print)
                    by_node: Counter = Counter()
                    for g in body["groups"]:
                        by_node[g["primary"]] += weighed.get(g["group"], 1.0)
                    print(f"{time.monotonic() - started:6.1f} s: primaries "
                          f"{dict(sorted(holders.items()))}, weight "
                          f"{ {k: round(v, 1) for k, v in sorted(by_node.items())} }, "
                          f"moves {len(body['placement']['moves'])}", flush=True)
                now = time.monotonic() - started
                if followed and followed_at is None:
                    followed_at = now
                if even and followed:
                    even_at = now
                    break
                await asyncio.sleep(0.5)
            load.stop = True
            await asyncio.gather(*tasks)
            after = {g["group"]: g["primary"] for g in status(first[0])["groups"]}
            moved = sum(1 for g, p in after.items() if holders_before.get(g) != p)
            print(f"nodes {len(nodes)}, groups {len(boards)}, replicas {replicas}")
            print(f"followers placed after {followed_at} s; "
                  + (f"balanced after {even_at:.1f} s" if even_at is not None
                     else f"NOT balanced after {timeout:.0f} s")
                  + f": {moved} groups changed primary "
                  f"({moved / max(even_at or timeout, 1e-9):.1f} moves/s), "
                  f"primaries per node {dict(sorted(holders.items()))}")
            print(load.report())
            lost = await load.check(session, nodes)
            print(f"acknowledged {len(load.acked)}, lost {lost}")
    finally:
        stop_nodes(joined)
        stop_nodes(first)


class Writers:
    """One event at a time to random boards, through every node in turn."""

    def __init__(self, nodes: list, boards: list[str], count: int) -> None:
        self.nodes, self.boards = nodes, boards
        self.stop = False
        self.latencies: list[float] = []
        self.acked: dict[str, tuple[str, str]] = {}  # event id -> (board, member)
        self._next = 0

    async def run(self, session: aiohttp.ClientSession) -> None:
        rng = random.Random()
        while not self.stop:
            self._next += 1
            event = f"w{self._next}"
            board = rng.choice(self.boards)
            member = f"w{self._next}"
            began = time.monotonic()
            for attempt in range(400):
                node = self.nodes[(self._next + attempt) % len(self.nodes)]
                try:
                    async with session.post(
                            f"{node.url}/v1/boards/{board}/scores",
                            json={"member": member, "score": 1, "event_id": event}) as answer:
                        await answer.read()
                        if answer.status == 200:
                            self.latencies.append(time.monotonic() - began)
                            self.acked[event] = (board, member)
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.02)

    def report(self) -> str:
        if not self.latencies:
            return "no write acknowledged"
        ms = sorted(x * 1000 for x in self.latencies)
        p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
        return (f"writes during the rebalance: {len(ms)}, p50 {statistics.median(ms):.1f} ms, "
                f"p99 {p99:.1f} ms, max {ms[-1]:.1f} ms")

    async def check(self, session: aiohttp.ClientSession, nodes: list) -> int:
        """Acknowledged events not found on the board (read from each node in turn)."""
        lost = 0
        for n, (board, member) in enumerate(self.acked.values()):
            node = nodes[n % len(nodes)]
            async with session.get(f"{node.url}/v1/boards/{board}/members/{member}") as answer:
                if answer.status != 200:
                    lost += 1
        return lost


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=1024)
    parser.add_argument("--members", type=int, default=1000)
    parser.add_argument("--join", type=int, default=2)
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=1800.0)
    args = parser.parse_args()
    with postgres_server() as server, tempfile.TemporaryDirectory() as root:
        asyncio.run(rebalance(Path(root), server.create_database(), args.groups,
                              args.members, args.join, args.writers, args.replicas,
                              args.timeout))
    return 0


if __name__ == "__main__":
    sys.exit(main())
