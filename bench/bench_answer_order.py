"""Answer order side by side: the Python client over many boards on a
cluster, one shared client against one client per submitter, with the
rankd of another checkout (``--base``) and of this one, alternated.

Each round, for each side (base and this checkout): a fresh database on
one throwaway durable Postgres, ``--nodes`` ``rankd serve --cluster-dsn``
nodes run from that side's sources (``--ack log``, ``--replicas 1`` where
N > 1, none on one node, as bench_scale.py), ``--boards`` boards of
``--members`` members; both sides' nodes run at once.  Then three loads of
bench_scale.py's load processes, each against one side and at once the
other (which goes first swapped every round), their client code from the
same side: ``tcp`` (one ``AsyncClient`` per load process, shared by its
submitters), ``tcp-each`` (one ``AsyncClient`` per submitter) and
``redis`` (redis-py's ``RedisCluster``, for reference).  Each row:
acknowledged submits/s, p50/p99 ms, errors, and the CPU of the nodes,
Postgres and the load (bench_scale.py's ``Row``); then per load the
medians of both sides and the median of each pair's ratio.

With ``--slow-ms``, every log append of board ``s0``'s group sleeps that
long in Postgres (a trigger, installed once the boards are filled): one
slow group among the many (a group whose appends are large or contended,
or one being moved), as tests/cluster/test_client_answer_order.py makes.

    python bench/bench_answer_order.py --base /work/wt-base/src --rounds 3
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

from bench_moves import postgres_server, start_nodes  # noqa: E402
from bench_scale import (  # noqa: E402
    HEADER,
    Cpu,
    Row,
    fill,
    load_average,
    postmaster_pid,
    run_load,
)

LOADS = [("tcp", "Python TCP client, shared"), ("tcp-each", "Python TCP client, one each"),
         ("redis", "redis-py RedisCluster")]


def slow_group(dsn: str, board: str, ms: float) -> None:
    """Every log append of ``board``'s group sleeps ``ms`` in Postgres."""
    import asyncpg

    from rankd.cluster.groups import group_of

    async def run() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(
                "CREATE FUNCTION bench_slow_append() RETURNS trigger LANGUAGE plpgsql AS "
                f"$$ BEGIN PERFORM pg_sleep({ms / 1000}); RETURN NEW; END $$")
            await conn.execute(
                "CREATE TRIGGER bench_slow_append BEFORE INSERT ON rankd_log FOR EACH ROW "
                f"WHEN (NEW.group_id = {int(group_of(board))}) "
                "EXECUTE FUNCTION bench_slow_append()")
        finally:
            await conn.close()
    asyncio.run(run())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the other checkout's src directory")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--boards", type=int, default=256)
    parser.add_argument("--members", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--submitters", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--settle", type=float, default=2.0)
    parser.add_argument("--slow-ms", type=float, default=0.0,
                        help="every append of board s0's group sleeps this long in Postgres")
    args = parser.parse_args(argv)
    sides = {"base": str(Path(args.base).resolve()), "this": str(HERE.parent / "src")}
    boards = [f"s{i}" for i in range(args.boards)]
    print(f"# bench_answer_order: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{args.nodes} node(s), {args.boards} boards, {args.submitters} submitters, "
          f"{args.seconds:g} s per load, appends of one group slowed by {args.slow_ms:g} ms, "
          f"load average {load_average()}", flush=True)
    rows: dict[tuple[str, str], list[Row]] = {}
    with tempfile.TemporaryDirectory() as name, postgres_server() as server:
        pg = postmaster_pid(server.cluster.data)
        for round_ in range(args.rounds):
            # Both sides' nodes run side by side; each load runs on one, then
            # at once on the other (the first swapped every round), so the
            # two figures of a pair saw about the same machine.
            order = list(sides) if round_ % 2 == 0 else list(sides)[::-1]
            dsns = {side: server.create_database() for side in order}
            clusters = {side: start_nodes(Path(name) / f"r{round_}-{side}", dsns[side],
                                          args.nodes, min(1, args.nodes - 1),
                                          env={"PYTHONPATH": sides[side]})
                        for side in order}
            try:
                for side, nodes in clusters.items():
                    fill(nodes, boards, args.members)
                    if args.slow_ms:
                        slow_group(dsns[side], boards[0], args.slow_ms)
                time.sleep(args.settle)
                for client, what in LOADS:
                    for side in order:
                        nodes = clusters[side]
                        cpu = Cpu({"servers": [n.process.pid for n in nodes],
                                   "postgres": [pg]})
                        # The load processes import the client of the same side.
                        os.environ["PYTHONPATH"] = sides[side]
                        port = nodes[0].resp_port if client == "redis" else nodes[0].tcp_port
                        row = run_load(client, port, boards, args, cpu,
                                       f"{what}, {side}, round {round_ + 1}")
                        rows.setdefault((client, side), []).append(row)
                        print("| " + " | ".join(row.cells()) + " |", flush=True)
            finally:
                for nodes in clusters.values():
                    for node in nodes:
                        node.stop(timeout=30)
    print("\n| " + " | ".join(HEADER) + " |")
    print("|" + "---|" * len(HEADER))
    for measured in rows.values():
        for row in measured:
            print("| " + " | ".join(row.cells()) + " |")
    print("\nMedians (ops/s, p50 ms, p99 ms, ops/s per server core), this / base:")
    for client, what in LOADS:
        medians = {}
        for side in sides:
            measured = rows[(client, side)]
            medians[side] = [statistics.median(getattr(r, key) for r in measured)
                             for key in ("rate", "p50_ms", "p99_ms")]
            medians[side].append(statistics.median(
                r.rate / r.cores("servers") if r.cores("servers") else 0 for r in measured))
        base, this = medians["base"], medians["this"]
        ratio = statistics.median(
            t.rate / b.rate if b.rate else float("nan")
            for t, b in zip(rows[(client, "this")], rows[(client, "base")], strict=True))
        print(f"- {what}: base {base[0]:,.0f}/s p50 {base[1]:.1f} p99 {base[2]:.1f} "
              f"({base[3]:,.0f}/server core); this {this[0]:,.0f}/s p50 {this[1]:.1f} "
              f"p99 {this[2]:.1f} ({this[3]:,.0f}/server core); "
              f"median of the pairs' rate ratios x{ratio:.2f}")
    print(f"\nload average at the end: {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
