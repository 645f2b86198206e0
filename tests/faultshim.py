"""Tools of the daemon-level storage fault tests: the LD_PRELOAD shim
(``fault_shim.c``, compiled here with the system C compiler), a load
generator that records every submission's outcome, a power-loss
simulation that cuts files back to what was fsynced, and the checker.

The history is Jepsen's: each operation is invoked, then ``ok`` (the
daemon acknowledged it), ``fail`` (it refused it: it must never appear) or
``unknown`` (the connection broke first: either is fine, once).
"""

from __future__ import annotations

import http.client
import json
import os
import random
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

SHIM_SOURCE = Path(__file__).with_name("fault_shim.c")


def build_shim(directory: Path) -> Path:
    """Compile the shim into ``directory``; skip (or fail in CI) without a compiler."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        if os.environ.get("CI"):
            pytest.fail("the storage fault tests need a C compiler")
        pytest.skip("no C compiler for the fault shim")
    library = directory / "libfaultshim.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o",
                    str(library), str(SHIM_SOURCE), "-ldl"], check=True)
    return library


@dataclass
class History:
    """Every submission: member -> outcome (ok, fail or unknown)."""

    outcomes: dict[str, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def note(self, member: str, outcome: str) -> None:
        with self.lock:
            self.outcomes[member] = outcome

    def with_outcome(self, outcome: str) -> set[str]:
        return {m for m, o in self.outcomes.items() if o == outcome}


def submit_load(port: int, board: str, history: History, prefix: str, *, threads: int = 4,
                seconds: float = 1.5, limit: int = 20_000,
                stop: threading.Event | None = None) -> None:
    """Submit new members (delta 1, event id = member) from ``threads``
    keep-alive connections until ``seconds`` pass, ``limit`` are sent, the
    daemon goes away or ``stop`` is set; every outcome goes to ``history``."""
    deadline = time.monotonic() + seconds
    stop = stop or threading.Event()
    counter = iter(range(limit))
    counter_lock = threading.Lock()

    def worker() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        while time.monotonic() < deadline and not stop.is_set():
            with counter_lock:
                number = next(counter, None)
            if number is None:
                return
            member = f"{prefix}-{number:06d}"
            body = json.dumps({"member": member, "delta": 1, "event_id": member})
            try:
                connection.request("POST", f"/v1/boards/{board}/scores", body,
                                   {"Content-Type": "application/json"})
                response = connection.getresponse()
                response.read()
            except (OSError, http.client.HTTPException):
                history.note(member, "unknown")
                return  # the daemon is gone (killed), or going
            history.note(member, "ok" if response.status == 200 else "fail")
            if response.status not in (200, 503):
                raise AssertionError(f"unexpected answer {response.status} to {member}")

    workers = [threading.Thread(target=worker) for _ in range(threads)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join(seconds + 30)


def durable_sizes(fault_log: Path) -> dict[str, int]:
    """The shim's record: file -> size known durable (the newest fsync's)."""
    sizes: dict[str, int] = {}
    if fault_log.exists():
        for line in fault_log.read_text().splitlines():
            path, size, kind = line.split("\t")
            if kind == "f":
                sizes[path] = int(size)
    return sizes


def cut_to_durable(data_dir: Path, fault_log: Path, rng: random.Random, variant: str
                   ) -> dict[str, int]:
    """Simulate a power loss after the daemon was killed: each WAL segment
    keeps what its last fsync made durable, and of the rest ``exact``
    nothing, ``less`` a random part, ``zeros`` its length but zeroes (pages
    never written back).  A segment never fsynced is gone or empty.
    Returns the bytes dropped per segment."""
    durable = durable_sizes(fault_log)
    dropped = {}
    for segment in sorted((data_dir / "wal").glob("*.log")):
        size = segment.stat().st_size
        keep = durable.get(os.path.realpath(segment))
        if keep is None:
            if rng.random() < 0.5:
                segment.unlink()
            else:
                os.truncate(segment, 0)
            dropped[segment.name] = size
            continue
        if keep >= size:
            continue
        dropped[segment.name] = size - keep
        if variant == "exact":
            os.truncate(segment, keep)
        elif variant == "less":
            os.truncate(segment, rng.randint(keep, size))
        else:
            with open(segment, "r+b") as handle:
                handle.seek(keep)
                handle.write(bytes(size - keep))
    for unfinished in (data_dir / "snapshots").glob("*.tmp"):
        unfinished.unlink()
    fault_log.unlink(missing_ok=True)
    return dropped


@dataclass
class Verdict:
    acknowledged: int
    lost: set[str]
    doubled: dict[str, float]
    refused_but_present: set[str]
    unknown_present: int

    @property
    def ok(self) -> bool:
        return not (self.lost or self.doubled or self.refused_but_present)


def check(scores: dict[str, float], history: History) -> Verdict:
    """Every acknowledged submission present exactly once, none refused present."""
    acknowledged = history.with_outcome("ok")
    return Verdict(
        acknowledged=len(acknowledged),
        lost=acknowledged - set(scores),
        doubled={m: s for m, s in scores.items() if s != 1},
        refused_but_present=history.with_outcome("fail") & set(scores),
        unknown_present=len(history.with_outcome("unknown") & set(scores)),
    )


def all_scores(daemon, board: str) -> dict[str, float]:
    """Every member of ``board`` and its score, through REST."""
    scores: dict[str, float] = {}
    offset = 0
    while True:
        status, page = daemon.request("GET", f"/v1/boards/{board}/top?limit=1000&offset={offset}")
        assert status == 200, page
        for entry in page["entries"]:
            scores[entry["member"]] = entry["score"]
        offset += len(page["entries"])
        if not page["entries"] or offset >= page["total"]:
            return scores
