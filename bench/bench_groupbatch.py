"""Writes over many boards on a cluster, side by side: this checkout's nodes
against another revision's (``--base``), alternated, to compare the cost of
the groups' log appends (issue 49: several groups' appends in one Postgres
round trip, ``rankd.cluster.appends``).

What it owns: the side-by-side runs and their table; everything else is
bench_scale.py's (the loads, their processes, CPU from ``/proc``) and
bench_moves.py's (Postgres, the nodes).  Design: one throwaway durable
Postgres (fsync on) for the whole run; for each round and each variant, in
alternated order (A B, then B A, ...), a fresh database, ``--nodes`` nodes
(``--replicas 1`` where more than one) whose ``PYTHONPATH`` is the variant's
``src``, ``--boards`` boards of ``--members`` members, then the loads of
bench_scale.py section 1 over all the boards (the Python TCP client and
redis-py's ``RedisCluster``, ``--submitters`` one write in flight each).
Each row: acknowledged writes/s, p50/p99, the cores the nodes and Postgres
used over the window, the nodes' CPU per write, and Postgres's **write
transactions/s** (transaction ids assigned over the window, read as
``pg_snapshot_xmax(pg_current_snapshot())``: exact, every append, renewal
and notification transaction counts) and WAL bytes/s.  Medians per variant
and their ratio close the table.  The load processes run this checkout's
client for both variants.  **This machine has 2 cores shared by the nodes,
Postgres, the load and other work**: compare the rounds side by side, not
with figures of other runs.

Run from the project root::

    python bench/bench_groupbatch.py --base /work/wt-base/src --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

import asyncpg  # noqa: E402

from bench_moves import postgres_server, start_nodes, stop_nodes  # noqa: E402
from bench_scale import Cpu, fill, load_average, postmaster_pid, run_load  # noqa: E402

SRC = HERE.parent / "src"
LOADS = [("tcp", "Python TCP client"), ("redis", "redis-py RedisCluster")]


class PgCpu(Cpu):
    """CPU seconds as bench_scale's, plus Postgres's transaction ids and WAL
    position, sampled at the same instants."""

    dsn: str = ""

    def sample(self) -> dict[str, float]:
        found = super().sample()

        async def counters() -> tuple[int, int]:
            conn = await asyncpg.connect(self.dsn)
            try:
                row = await conn.fetchrow(
                    "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS xid, "
                    "pg_current_wal_lsn() - '0/0'::pg_lsn AS wal")
                return int(row["xid"]), int(row["wal"])
            finally:
                await conn.close()

        found["xids"], found["wal"] = asyncio.run(counters())
        return found


def one_variant(args: argparse.Namespace, server: Any, root: Path, name: str, src: str,
                round_no: int) -> list[dict[str, Any]]:
    """Start ``args.nodes`` nodes of ``src``, fill the boards, run the loads."""
    dsn = server.create_database()
    nodes = start_nodes(root / f"{name}{round_no}", dsn, args.nodes, min(1, args.nodes - 1),
                        env={"PYTHONPATH": src})
    out = []
    try:
        boards = [f"s{i}" for i in range(args.boards)]
        fill(nodes, boards, args.members)
        time.sleep(args.settle)
        cpu = PgCpu({"servers": [node.process.pid for node in nodes],
                     "postgres": [postmaster_pid(server.cluster.data)]})
        cpu.dsn = dsn
        for client, what in LOADS:
            port = nodes[0].tcp_port if client == "tcp" else nodes[0].resp_port
            row = run_load(client, port, boards, args, cpu, what)
            result = {"variant": name, "round": round_no, "load": what, "rate": row.rate,
                      "p50": row.p50_ms, "p99": row.p99_ms, "errors": row.errors,
                      "servers": row.cores("servers"), "postgres": row.cores("postgres"),
                      "machine": row.cores("machine"),
                      "xacts": row.cpu["xids"] / row.seconds, "wal": row.cpu["wal"] / row.seconds}
            result["us_per_write"] = (row.cpu["servers"] / (row.rate * row.seconds) * 1e6
                                      if row.rate else 0.0)
            result["writes_per_xact"] = row.rate / result["xacts"] if result["xacts"] else 0.0
            out.append(result)
            print(f"# round {round_no} {name:>5} {what}: {row.rate:,.0f}/s, "
                  f"{result['xacts']:,.0f} xacts/s", flush=True)
    finally:
        stop_nodes(nodes)
    return out


COLUMNS = [("rate", "writes/s", "{:,.0f}"), ("p50", "p50 ms", "{:.1f}"),
           ("p99", "p99 ms", "{:.1f}"), ("errors", "errors", "{:d}"),
           ("servers", "node cores", "{:.2f}"), ("postgres", "Postgres cores", "{:.2f}"),
           ("us_per_write", "node CPU us/write", "{:,.0f}"),
           ("xacts", "Postgres write xacts/s", "{:,.0f}"),
           ("writes_per_xact", "writes per xact", "{:.2f}"),
           ("wal", "WAL KiB/s", "{:,.0f}")]


def print_table(results: list[dict[str, Any]], names: list[str]) -> None:
    print("| load | variant | round | " + " | ".join(c[1] for c in COLUMNS) + " |")
    print("|" + "---|" * (3 + len(COLUMNS)))
    for r in sorted(results, key=lambda r: (r["load"], r["variant"] != names[0], r["round"])):
        cells = [fmt.format(r[key] / 1024 if key == "wal" else r[key])
                 for key, _, fmt in COLUMNS]
        print(f"| {r['load']} | {r['variant']} | {r['round']} | " + " | ".join(cells) + " |")
    print("\nMedians (and this/base ratio):")
    for _, what in LOADS:
        medians = {}
        for name in names:
            chosen = [r for r in results if r["load"] == what and r["variant"] == name]
            medians[name] = {key: statistics.median(r[key] for r in chosen)
                             for key, _, _ in COLUMNS}
        parts = []
        for key, label, fmt in COLUMNS:
            if key == "errors":
                continue
            base, this = medians[names[0]][key], medians[names[1]][key]
            scale = 1024 if key == "wal" else 1
            ratio = f" (x{this / base:.2f})" if base else ""
            parts.append(f"{label} {fmt.format(base / scale)} -> {fmt.format(this / scale)}"
                         f"{ratio}")
        print(f"- {what}: " + "; ".join(parts))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the other revision's src directory")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--boards", type=int, default=256)
    parser.add_argument("--members", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--submitters", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--settle", type=float, default=3.0)
    args = parser.parse_args(argv)
    names = ["base", "this"]
    srcs = {"base": args.base, "this": str(SRC)}
    print(f"# bench_groupbatch: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{args.nodes} node(s), {args.boards} boards, load average {load_average()}",
          flush=True)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp, postgres_server() as server:
        for round_no in range(1, args.rounds + 1):
            order = names if round_no % 2 else names[::-1]
            for name in order:
                results.extend(one_variant(args, server, Path(tmp), name, srcs[name],
                                           round_no))
    print_table(results, names)
    print(f"\nload average at the end: {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
