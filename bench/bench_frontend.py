"""The TCP front end's and the engine's CPU cost per submission, without sockets.

The daemon benchmark's figures move by 10-40% from run to run on this
machine, more than most changes to the submission path are worth.  This
script runs that path in one process: a real engine (fresh data dir, WAL
``everysec``) and real ``TcpConnection`` protocols fed the bytes the
daemon benchmark's load generator sends, ``--depth`` pipelined submits of
``delta`` 1 per read, for ``--connections`` connections per pass of the
event loop, to ``--members`` members (board ``bench``, policy ``sum``,
a new event id each).  Each round feeds every connection 20 reads and runs
the event loop until every answer was written.

The transport only counts what it is given: socket reads and writes cost
the same whatever the build, and leaving them out is what makes two builds
comparable.  The figure is the CPU time of the event loop's thread per
submission (``time.thread_time``: time the virtual CPU was taken away
does not count), median over the rounds; the part spent in
``data_received`` (splitting reads into runs and handing them to the
engine) is printed beside it.

Meant for comparing builds side by side: run it alternately against each
(``PYTHONPATH`` of a ``git worktree`` with its own build) and compare the
medians.  Run from the project root (the native modules built)::

    python bench/bench_frontend.py
    python bench/bench_frontend.py --depth 1 --seconds 5
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_daemon import BOARD, _pack, submit_parts  # the load generator's frames
from rankd import wire
from rankd.engine.engine import Engine, EngineConfig
from rankd.frontends.service import Service
from rankd.frontends.tcp import FAST_SUBMITS, TcpConnection, TcpServer
from rankd.security import Gate

READS_PER_ROUND = 20


class CountingTransport:
    """Stands in for a socket: counts the frames written to it."""

    def __init__(self) -> None:
        self.writes = 0

    def write(self, data: bytes) -> None:
        self.writes += 1

    def writelines(self, parts: list[bytes]) -> None:
        self.writes += 1

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 0) if name == "peername" else default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass

    def is_closing(self) -> bool:
        return False


def reads(parts: list[bytes], depth: int, count: int, first_event: int,
          rng: random.Random) -> list[bytes]:
    """``count`` reads of ``depth`` submit frames each, event ids from ``first_event``."""
    out = []
    event = first_event
    for _ in range(count):
        frames = []
        for k in range(depth):
            payload = b"".join((b"\x93", _pack(2 + k), parts[rng.randrange(len(parts))],
                                _pack(f"e-{event}")))
            event += 1
            frames.append(len(payload).to_bytes(4, "big") + payload)
        out.append(b"".join(frames))
    return out


async def run(args: argparse.Namespace) -> tuple[list[float], list[float], list[float]]:
    """Per round: (thread CPU, data_received CPU, wall) microseconds per submission."""
    rng = random.Random(1)
    with tempfile.TemporaryDirectory(prefix="rankd-bench-frontend-") as data_dir:
        engine = Engine(EngineConfig(data_dir=Path(data_dir)))
        await engine.start()
        try:
            await engine.put_board(BOARD, {"policy": "sum"})
            server = TcpServer(Service(engine), Gate.open())
            parts = submit_parts([f"player:{i}" for i in range(args.members)])
            hello = wire.request(1, "hello", {"version": wire.VERSION, "client": "bench"})
            connections = []
            for _ in range(args.connections):
                connection = TcpConnection(server)
                connection.connection_made(CountingTransport())
                connection.data_received(hello)
                connections.append(connection)
            while any(c.worker is not None for c in connections):
                await asyncio.sleep(0)
            cpu: list[float] = []
            received: list[float] = []
            wall: list[float] = []
            per_round = args.connections * READS_PER_ROUND * args.depth
            sent = 0
            deadline = time.monotonic() + args.seconds
            while time.monotonic() < deadline:
                batch = reads(parts, args.depth, args.connections * READS_PER_ROUND, sent, rng)
                sent += per_round
                feeding = 0.0
                started_wall, started = time.perf_counter(), time.thread_time()
                position = 0
                for _ in range(READS_PER_ROUND):
                    fed = time.thread_time()
                    for connection in connections:
                        connection.data_received(batch[position])
                        position += 1
                    feeding += time.thread_time() - fed
                    while any(c.answering or c.worker is not None for c in connections):
                        await asyncio.sleep(0)
                cpu.append((time.thread_time() - started) / per_round * 1e6)
                wall.append((time.perf_counter() - started_wall) / per_round * 1e6)
                received.append(feeding / per_round * 1e6)
            if engine.stats["applied"] != sent:
                raise AssertionError(f"{sent} submissions sent, {engine.stats['applied']} applied")
        finally:
            await engine.close(snapshot=False)
    return cpu, received, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=50)
    parser.add_argument("--depth", type=int, default=16, help="submits per read")
    parser.add_argument("--members", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    if not FAST_SUBMITS:
        sys.exit("the native fast path is not built (python setup.py build_ext --inplace)")
    try:
        import uvloop
    except ImportError:
        pass
    else:
        uvloop.install()
    cpu, received, wall = asyncio.run(run(args))
    print(f"{args.connections} connections x {args.depth} submits per read, "
          f"{args.members:,} members, {len(cpu)} rounds of "
          f"{args.connections * READS_PER_ROUND * args.depth:,} submissions")
    print(f"event-loop thread CPU: {statistics.median(cpu):.2f} us/submission "
          f"(data_received {statistics.median(received):.2f}); wall "
          f"{statistics.median(wall):.2f} us/submission")


if __name__ == "__main__":
    main()
