"""A throwaway ``redis-server`` on a free loopback port, the reference the
RESP front-end is tested against.  Never a runtime dependency of rankd.

Without the binary the tests skip, unless ``RANKD_REQUIRE_REDIS`` is set
(CI sets it): then they fail, so they can never silently skip there.
``RANKD_REDIS_SERVER`` names another binary (a Redis 7.2 or 8 built from a
fetched source tree, outside CI).

rankd matches Redis 7.2 (the version it announces); Debian's redis-server
is 7.0, which writes doubles with ``%.17g`` (``49.899999999999999`` where
7.2 writes ``49.9``).  :class:`RedisClient` rewrites exactly those doubles
of a reply from a server older than 7.2 to 7.2's form, through
``rankd.frontends.resp.doubles`` (the pure-Python Grisu2 port, itself held
to Redis 7.2's outputs by ``tests/test_resp_doubles.py``): every other byte
is compared as the server sent it, and against 7.2 nothing is rewritten.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from daemon import Daemon
from ports import free_port
from rankd.frontends.resp.doubles import format_double
from respclient import RawClient


class RedisServer:
    """``redis-server`` without persistence, stopped by :meth:`stop` (its pid)."""

    def __init__(self, *options: str) -> None:
        """``options``: more ``redis-server`` arguments (``--enable-debug-command yes``)."""
        binary = os.environ.get("RANKD_REDIS_SERVER") or shutil.which("redis-server")
        if binary is None:
            if os.environ.get("RANKD_REQUIRE_REDIS", "") not in ("", "0"):
                pytest.fail("redis-server is required (RANKD_REQUIRE_REDIS) but not installed")
            pytest.skip("redis-server is not installed")
        self.port = free_port()
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


#: A double in a reply: a RESP3 double, or a RESP2 bulk string (scores are
#: sent as bulk strings; a member or key that reads as a %.17g number is
#: rewritten only if it is exactly what %.17g writes for it).
_DOUBLE = re.compile(rb"(,|\$\d+\r\n)([-+]?(?:[0-9]+\.?[0-9]*(?:e[-+][0-9]+)?|inf|nan))\r\n")


def as_redis_72(reply: bytes) -> bytes:
    """``reply`` of Redis 7.0 with its doubles as Redis 7.2 writes them."""
    def rewrite(found: re.Match[bytes]) -> bytes:
        prefix, text = found.groups()
        value = float(text)
        if b"%.17g" % value != text:
            return found.group()
        text = format_double(value)
        return (b"," if prefix == b"," else b"$%d\r\n" % len(text)) + text + b"\r\n"
    return _DOUBLE.sub(rewrite, reply)


class RedisClient(RawClient):
    """A :class:`RawClient` of the reference server whose replies are Redis
    7.2's: a 7.0 server's doubles are rewritten (:func:`as_redis_72`)."""

    def __init__(self, port: int, timeout: float = 10.0) -> None:
        super().__init__(port, timeout)
        self.rewrite = False
        info = self.call("INFO", "server")
        version = re.search(rb"redis_version:(\d+)\.(\d+)", info)
        self.rewrite = version is not None and tuple(map(int, version.groups())) < (7, 2)

    def reply(self) -> bytes:
        raw = super().reply()
        return as_redis_72(raw) if self.rewrite else raw


@contextmanager
def paired(data_dir: Path, *daemon_args: str) -> Iterator[tuple[int, int]]:
    """A ``redis-server`` and a rankd daemon (``daemon_args``) side by
    side: their ports ``(redis, rankd's RESP)``, both stopped after."""
    redis = RedisServer()
    daemon = Daemon(data_dir, *daemon_args)
    try:
        daemon.start()
        yield redis.port, daemon.resp_port
    finally:
        daemon.stop()
        redis.stop()
