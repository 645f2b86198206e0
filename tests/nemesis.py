"""A TCP proxy on loopback that a fault test can turn against a link.

``Proxy(target_port)`` listens on a free 127.0.0.1 port and forwards every
connection to ``127.0.0.1:target_port``, in a thread of its own, until
``close()``.  Its ``mode`` decides what happens to the bytes, in both
directions, from the moment it is set:

``pass``       forwarded as they come;
``delay``      forwarded after ``delay_seconds``;
``blackhole``  swallowed: nothing arrives, nothing is refused (a partition);
``reset``      every open connection is reset, and new ones are refused.

It only ever connects to loopback, so fault tests send no traffic anywhere
else.

:func:`process_tree` and :func:`signal_all` pause and resume a whole
server (a Postgres postmaster and its backends) by pid, never by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
import subprocess
import threading
from pathlib import Path

MODES = ("pass", "delay", "blackhole", "reset")


class Proxy:
    def __init__(self, target_port: int, *, delay_seconds: float = 0.2) -> None:
        self.target_port = target_port
        self.delay_seconds = delay_seconds
        self.mode = "pass"
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        self._ready.wait(10)

    def set_mode(self, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        self.mode = mode
        if mode == "reset":
            self._loop.call_soon_threadsafe(self._reset_all)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._connected, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        self._loop.close()

    async def _shutdown(self) -> None:
        self._server.close()
        self._reset_all()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _reset_all(self) -> None:
        for writer in list(self._writers):
            sock = writer.get_extra_info("socket")
            if sock is not None:  # an RST, not a FIN
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                    struct.pack("ii", 1, 0))
            writer.close()
        self._writers.clear()

    async def _connected(self, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> None:
        if self.mode == "reset":
            self._writers.add(writer)
            self._reset_all()
            return
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(
                "127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, upstream_writer))
        with contextlib.suppress(asyncio.CancelledError):  # the proxy closing
            await asyncio.gather(self._pump(reader, upstream_writer),
                                 self._pump(upstream_reader, writer), return_exceptions=True)
        for end in (writer, upstream_writer):
            self._writers.discard(end)
            end.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                data = await reader.read(65536)
            except OSError:
                # Reset on this side (a server killed with unread input sends
                # an RST, not a FIN): reset the other side too, as a direct
                # connection would have been, instead of leaving it open.
                writer.transport.abort()
                return
            if not data:
                break
            if self.mode == "blackhole":
                continue
            if self.mode == "delay":
                await asyncio.sleep(self.delay_seconds)
            if self.mode == "reset":
                break
            writer.write(data)
            await writer.drain()
        with contextlib.suppress(OSError):
            writer.write_eof()


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (from ``/proc``, else ``pgrep -P``)."""
    tasks = Path(f"/proc/{pid}/task")
    found: list[int] = []
    try:
        for task in tasks.iterdir():
            found += [int(child) for child in (task / "children").read_text().split()]
        return found
    except OSError:  # no /proc/.../children on this kernel
        listed = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
        return [int(child) for child in listed.stdout.split()]


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process descended from it, parents first."""
    tree = [pid]
    for parent in tree:  # grows as it goes
        tree += [child for child in children(parent) if child not in tree]
    return tree


def signal_all(pids: list[int], sig: int) -> None:
    """Send ``sig`` to each of ``pids`` that still runs."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
