"""Run the real daemon as a subprocess on free loopback ports, for
integration tests that use only its public interfaces."""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import rankd
from ports import free_port

#: Where the ``rankd`` package this process imports lives: the daemon runs
#: the same one.  (Putting the source tree first once made a non-editable
#: install's daemon import the uncompiled sources and run pure Python.)
SRC = Path(rankd.__file__).resolve().parent.parent


class Daemon:
    """``rankd serve`` in a child process; stopped by :meth:`stop` or ``with``."""

    def __init__(self, data_dir: Path, *args: str, env: dict[str, str] | None = None,
                 ssl_context: ssl.SSLContext | None = None,
                 wrapper: tuple[str, ...] = ()) -> None:
        self.ssl_context = ssl_context
        #: A command the daemon runs under (e.g. valgrind's), before Python's.
        self.wrapper = wrapper
        self.data_dir = Path(data_dir)
        self.port = free_port()
        self.tcp_port = free_port()
        self.resp_port = free_port()
        self.args = args
        self.env = {**os.environ, "PYTHONPATH": str(SRC), **(env or {})}
        self.process: subprocess.Popen | None = None
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}-daemon.log"

    @property
    def url(self) -> str:
        scheme = "https" if self.ssl_context is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> Daemon:
        command = [*self.wrapper, sys.executable, "-m", "rankd.cli", "serve",
                   "--host", "127.0.0.1",
                   "--port", str(self.port), "--tcp-port", str(self.tcp_port),
                   "--resp-port", str(self.resp_port),
                   "--data-dir", str(self.data_dir), *self.args]
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(command, env=self.env, stdout=self._log,
                                        stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"rankd exited with {self.process.returncode}:\n"
                                   f"{self.log()}")
            try:
                status, _ = self.request("GET", "/v1/health")
                if status == 200 and self._listening():
                    return self
            except OSError:
                pass
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"rankd did not become healthy in {timeout}s:\n{self.log()}")

    def _listening(self) -> bool:
        """Whether the TCP and RESP listeners accept (they open after the
        engine recovered, so after health first answers 200)."""
        for flag, port in (("--tcp-port", self.tcp_port), ("--resp-port", self.resp_port)):
            if flag in self.args:  # another port, or none, asked for
                continue
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
            except OSError:
                return False
        return True

    def request(self, method: str, path: str, body: Any = None, *, raw: bytes | None = None,
                headers: dict[str, str] | None = None, timeout: float = 10.0
                ) -> tuple[int, Any]:
        """One HTTP request; returns (status, decoded JSON body or None)."""
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json",
                                                  **(headers or {})})
        try:
            with urllib.request.urlopen(request, timeout=timeout,
                                        context=self.ssl_context) as response:
                payload = response.read()
                status = response.status
        except urllib.error.HTTPError as error:
            payload = error.read()
            status = error.code
        return status, (json.loads(payload) if payload else None)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Signal the daemon and wait; returns its exit code."""
        if self.process is None:
            return 0
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            code = self.process.wait(timeout)
        finally:
            self._log.close()
        return code

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def implementations(self) -> dict[str, str]:
        """What the daemon runs for each hot loop (``rankd_build_info``)."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=10,
                                    context=self.ssl_context) as response:
            for line in response.read().decode().splitlines():
                if line.startswith("rankd_build_info{"):
                    labels = line[line.index("{") + 1:line.index("}")]
                    pairs = dict(part.split("=", 1) for part in labels.split(","))
                    return {k: v.strip('"') for k, v in pairs.items() if k != "version"}
        raise RuntimeError("the daemon reports no rankd_build_info")

    def wait_for_log(self, text: str, timeout: float = 10.0) -> bool:
        """Whether ``text`` appears in the log within ``timeout`` (health
        turns 200 before the start-up lines are all written)."""
        deadline = time.monotonic() + timeout
        while text not in self.log():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def __enter__(self) -> Daemon:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.stop()
