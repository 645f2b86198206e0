"""CPU time of one TCP read of one plain submit on the native lane
(``TcpLane.data_received``: split, admission, hand-over), this checkout
against another's sources, alternated in fresh processes.

The engine is a stand-in that takes every run and commits none (the runs
handed over are dropped after each 1,000 reads, under the connection's
bound on runs in flight), so what is timed is the front-end's own path.

    python bench/bench_tcp_lane_read.py --base /path/to/other/src --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

HERE = Path(__file__).resolve().parent
READS = 200_000


class Taker:
    """A service whose engine takes every packed run (and never answers)."""

    engine = SimpleNamespace(replication=object())

    def takes_packed(self, packed: Any, existing: bool = False) -> bool:
        return True

    def submit_packed_then(self, packed: Any, then: Any, token: Any) -> None:
        pass


class Transport:
    """Keeps nothing: the timed reads write nothing."""

    def write(self, data: bytes) -> None:
        pass

    writelines = write

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def pause_reading(self) -> None:
        pass

    resume_reading = close = abort = pause_reading


async def measure() -> float:
    """The best of 7 of ns of CPU per read, in this process's sources."""
    from rankd import wire
    from rankd.frontends.tcp import TcpServer
    server = TcpServer(Taker())  # type: ignore[arg-type]
    conn = server._connection()
    conn.connection_made(Transport())
    conn.data_received(wire.request(1, "hello", {"version": 1}))
    await asyncio.sleep(0.01)
    frames = [wire.request(100 + n, "submit", {"board": "b", "member": f"m{n}", "score": n})
              for n in range(1000)]
    read, answering = conn.data_received, conn.answering
    best = []
    for _ in range(7):
        started = time.process_time()
        for _ in range(READS // len(frames)):
            for frame in frames:
                read(frame)
            answering.clear()
        best.append((time.process_time() - started) / READS * 1e9)
    return min(best)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the other checkout's src directory")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        sys.path.insert(0, args.worker)
        print(asyncio.run(measure()))
        return
    sides = {"base": args.base, "this": str(HERE.parent / "src")}
    found: dict[str, list[float]] = {name: [] for name in sides}
    for round_ in range(args.rounds):
        for name in (("base", "this") if round_ % 2 == 0 else ("this", "base")):
            done = subprocess.run([sys.executable, __file__, "--base", args.base,
                                   "--worker", sides[name]], capture_output=True, text=True,
                                  check=True)
            found[name].append(float(done.stdout))
    for name, values in found.items():
        print(f"{name}: median {statistics.median(values):.0f} ns CPU per read "
              f"({', '.join(f'{v:.0f}' for v in values)})")
    ratios = [t / b for b, t in zip(found["base"], found["this"], strict=True)]
    print(f"this/base: median {statistics.median(ratios):.3f} "
          f"({', '.join(f'{r:.3f}' for r in ratios)})")


if __name__ == "__main__":
    main()
