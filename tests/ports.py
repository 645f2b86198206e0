"""Free loopback ports for the servers the tests start (daemons, Postgres,
redis-server).

Ports are drawn below Linux's ephemeral range (32768 and up by default),
where the kernel picks the local ports of outgoing connections: a port
found free there could be taken by some client's connection before the
server bound it (seen in CI as "address already in use" on a restart).
Each port is handed out once per test process, and each parallel test
worker (pytest-xdist's ``PYTEST_XDIST_WORKER``) draws from its own slice of
the range, so that two workers never hand out the same port between one's
check and its server's bind.
"""

from __future__ import annotations

import os
import random
import socket

PORTS = range(20_000, 32_000)
_handed_out: set[int] = set()


def _slice() -> range:
    """This process's share of :data:`PORTS`."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if not worker.startswith("gw") or count <= 1:
        return PORTS
    index = int(worker[2:]) % count
    size = len(PORTS) // count
    return PORTS[index * size:(index + 1) * size]


def free_port() -> int:
    """A loopback port free now, outside the ephemeral range, in this
    worker's slice, not handed out before by this process (the kernel's
    choice if none is found)."""
    ports = _slice()
    for _ in range(200):
        port = random.choice(ports)
        if port in _handed_out:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
