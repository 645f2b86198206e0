"""The GIL convoy: how long a node's event loop waits for the GIL while a
worker thread computes, by the interpreter's switch interval.

uvloop runs libuv with the GIL let go and takes it again for every
callback libuv makes (a read's buffer, the read, a timer, ...).  While a
worker thread runs Python code or native code that holds the GIL (a group
load's ``encoded``, ``ClusterLog.read``'s checks, ``asyncio.to_thread``
work), each of those takes waits for the worker to let go: up to the
switch interval (``sys.setswitchinterval``, 5 ms by default), so a loop
pass with tens of ready sockets waits tens of times that.

Here: an echo server on uvloop in this process's main thread, ``--clients``
connections from a child process each sending one small message at a time,
a heartbeat on the loop every 10 ms, and a worker thread running Python
code (a checksum over byte strings, as the log's batches are checked) for
``--seconds`` per round.  Each round runs one switch interval of
``--intervals``, alternated ``--rounds`` times; per interval the clients'
round trips (p50/p99/max), how many per second, the heartbeat's lateness
(p99/max) and how much work the worker did.

Run from the project root::

    python bench/bench_gil_convoy.py
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import sys
import threading
import time
import zlib

PORT_READY_TIMEOUT = 10.0


def worker(stop: threading.Event, done: list[int]) -> None:
    """Python code in a loop, as a worker thread's checks of log records are."""
    pieces = [bytes(range(256)) * 4 for _ in range(64)]
    rounds = 0
    while not stop.is_set():
        total = 0
        for piece in pieces:
            total ^= zlib.crc32(piece)
            for byte in piece[:64]:
                total += byte
        rounds += 1
    done.append(rounds)


def clients(port: int, count: int, seconds: float, out: multiprocessing.Queue) -> None:
    """``count`` connections, each one message at a time: their round trips."""
    async def one(latencies: list[float]) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            sent = time.monotonic()
            writer.write(b"x" * 64)
            await reader.readexactly(64)
            latencies.append(time.monotonic() - sent)
        writer.close()

    async def main() -> list[float]:
        latencies: list[float] = []
        await asyncio.gather(*(one(latencies) for _ in range(count)))
        return latencies

    out.put(asyncio.run(main()))


class Echo(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)  # type: ignore[attr-defined]


async def one_round(interval: float, count: int, seconds: float) -> dict[str, float]:
    sys.setswitchinterval(interval)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    lateness: list[float] = []
    running = True

    async def beat() -> None:
        while running:
            due = time.monotonic() + 0.01
            await asyncio.sleep(0.01)
            lateness.append(max(0.0, time.monotonic() - due))

    out: multiprocessing.Queue = multiprocessing.Queue()
    child = multiprocessing.Process(target=clients, args=(port, count, seconds, out))
    stop, done = threading.Event(), []
    thread = threading.Thread(target=worker, args=(stop, done))
    beating = asyncio.ensure_future(beat())
    child.start()
    thread.start()
    latencies = await asyncio.to_thread(out.get)
    stop.set()
    thread.join()
    running = False
    await beating
    await asyncio.to_thread(child.join)
    server.close()
    sys.setswitchinterval(0.005)
    latencies.sort()
    lateness.sort()
    return {"round_trips_per_s": round(len(latencies) / seconds),
            "p50_ms": round(statistics.median(latencies) * 1000, 2),
            "p99_ms": round(latencies[int(0.99 * len(latencies))] * 1000, 2),
            "max_ms": round(latencies[-1] * 1000, 1),
            "beat_p99_ms": round(lateness[int(0.99 * len(lateness))] * 1000, 1),
            "beat_max_ms": round(lateness[-1] * 1000, 1),
            "worker_rounds": done[0]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--intervals", default="0.005,0.0005",
                        help="switch intervals (seconds), comma-separated")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    try:
        import uvloop
        factory = uvloop.new_event_loop
    except ImportError:  # (the daemon's loop is uvloop's: the figures are for it)
        factory = asyncio.new_event_loop
    for round_ in range(args.rounds):
        for interval in (float(x) for x in args.intervals.split(",")):
            with asyncio.Runner(loop_factory=factory) as runner:
                figures = runner.run(one_round(interval, args.clients, args.seconds))
            print(f"round {round_ + 1}, switch interval {interval * 1000:g} ms: {figures}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
