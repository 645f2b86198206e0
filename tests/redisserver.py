"""A throwaway ``redis-server`` on a free loopback port, the reference the
RESP front-end is tested against.  Never a runtime dependency of rankd.

Without the binary the tests skip, unless ``RANKD_REQUIRE_REDIS`` is set
(CI sets it): then they fail, so they can never silently skip there.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RedisServer:
    """``redis-server`` without persistence, stopped by :meth:`stop` (its pid)."""

    def __init__(self, *options: str) -> None:
        """``options``: more ``redis-server`` arguments (``--enable-debug-command yes``)."""
        binary = shutil.which("redis-server")
        if binary is None:
            if os.environ.get("RANKD_REQUIRE_REDIS", "") not in ("", "0"):
                pytest.fail("redis-server is required (RANKD_REQUIRE_REDIS) but not installed")
            pytest.skip("redis-server is not installed")
        self.port = _free_port()
        self.directory = Path(tempfile.mkdtemp(prefix="rankd-redis-"))
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.directory), *options],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    self.stop()
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.02)

    def exchange(self, payload: bytes, timeout: float = 5.0) -> bytes:
        """Send ``payload`` on a new connection, return all it answers
        before the server closes it (the payload should end with QUIT)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as sock:
            sock.sendall(payload)
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)
        shutil.rmtree(self.directory, ignore_errors=True)
