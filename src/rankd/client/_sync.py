"""The blocking client: the asyncio client driven from a private loop thread.

Sharing :class:`AsyncClient`'s connection handling keeps one implementation
of framing, pipelining, timeouts and reconnects.  Calls from several
threads are safe and are pipelined over the one connection.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from rankd.client._async import AsyncClient
from rankd.client._operations import Operations


class Client(Operations):
    """Blocking client for rankd's TCP protocol; same arguments as
    :class:`AsyncClient` (see :mod:`rankd.client`)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 7701, **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rankd-client",
                                        daemon=True)
        self._thread.start()
        self._async = AsyncClient(host, port, **options)
        self._closed = False

    def __enter__(self) -> Client:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def server_info(self) -> dict[str, Any] | None:
        return self._async.server_info

    @property
    def positions(self) -> dict[str, tuple[int, int]]:
        """Board -> ``(epoch, seq)`` of this client's last write to it (see
        :class:`AsyncClient`'s ``read_your_writes``)."""
        return self._async.positions

    def _run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def connect(self) -> None:
        self._run(self._async.connect())

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._run(self._async.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def _call(self, op: str, args: dict[str, Any], idempotent: bool) -> Any:
        return self._run(self._async._call(op, args, idempotent))
