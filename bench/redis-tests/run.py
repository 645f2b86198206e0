"""Run Redis's own test files against a rankd daemon, in external mode.

One command (from the repository root)::

    python bench/redis-tests/run.py --redis-git /work/.mirror/redis+redis/repo [--tag 7.0.15]

or ``--tree DIR`` for an already extracted tree (``runtest`` and
``tests/``).  It extracts ``tests`` and ``runtest`` of the tag from the
git directory, applies ``patch.py`` (harness calls rankd refuses wrapped
in ``catch``; tests that need refused-by-design behaviour skipped by name),
starts ``rankd serve`` on free loopback ports with a throwaway data
directory (the ``rankd`` this interpreter imports), runs each unit with::

    ./runtest --host 127.0.0.1 --port P --singledb --ignore-encoding
      --ignore-digest --durable --tags -needs:debug --tags -needs:repl
      --tags -needs:config-maxmemory --skipfile rankd-skip.txt --baseport B
      --single UNIT

and prints per unit the tests passed, failed and skipped, then every
failed test's name (``--verbose``: its message too).  ``--durable`` makes
an error inside a test (an unknown command) a failure of that test rather
than the end of the file, so every test is counted.  Needs ``tclsh``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
UNITS = ["unit/type/zset", "unit/multi", "unit/expire", "unit/keyspace", "unit/scan",
         "unit/info-command"]
ANSI = re.compile(r"\x1b\[[0-9;]*m")
RESULT = re.compile(r"^\[(ok|err|exception|skip|ignore)\]:\s*(.*)$")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def free_base_port() -> int:
    """A ``--baseport`` for ``runtest``, drawn at random: its test server
    listens at the first free port of the 32 below it (and checks the one
    10,000 above), which from the fixed default (21111) two runs at once
    on a machine would share, the second failing to start."""
    rng = random.Random()
    while True:
        base = rng.randrange(20_000, 55_000)
        try:
            with socket.socket() as low, socket.socket() as high:
                low.bind(("127.0.0.1", base - 32))
                high.bind(("127.0.0.1", base - 32 + 10_000))
        except OSError:
            continue
        return base


def extract(git_dir: str, tag: str, into: Path) -> None:
    """``git archive TAG tests runtest | tar -x`` into ``into``."""
    archive = subprocess.run(["git", "-C", git_dir, "archive", tag, "tests", "runtest"],
                             check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="fully_trusted")


def start_rankd(data_dir: Path) -> tuple[subprocess.Popen, int]:
    """``rankd serve`` on free ports; returns it and its RESP port once it answers."""
    resp_port = free_port()
    command = [sys.executable, "-m", "rankd.cli", "serve", "--host", "127.0.0.1",
               "--port", str(free_port()), "--tcp-port", str(free_port()),
               "--resp-port", str(resp_port), "--data-dir", str(data_dir)]
    log = open(data_dir.parent / "rankd.log", "ab")  # noqa: SIM115 - the child's
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"rankd exited with {process.returncode}; see {log.name}")
        try:
            with socket.create_connection(("127.0.0.1", resp_port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                if sock.recv(16).startswith(b"+PONG"):
                    return process, resp_port
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise SystemExit("rankd did not answer PING within 60 s")


def run_unit(tree: Path, port: int, unit: str, timeout: float) -> dict:
    """Run one unit; its counts and failed tests' names and messages."""
    command = ["./runtest", "--host", "127.0.0.1", "--port", str(port), "--singledb",
               "--ignore-encoding", "--ignore-digest", "--durable", "--tags", "-needs:debug",
               "--tags", "-needs:repl", "--tags", "-needs:config-maxmemory",
               "--skipfile", "rankd-skip.txt", "--baseport", str(free_base_port()),
               "--single", unit]
    # A session of its own: at a timeout the harness and the test server it
    # forked are stopped together, by process group (its fixed client port
    # would otherwise stay taken, and every later unit fail to start).
    process = subprocess.Popen(command, cwd=tree, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, errors="replace",
                               start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        timed_out = True
    counts = {"ok": 0, "err": 0, "exception": 0, "skip": 0, "ignore": 0}
    failed: list[str] = []
    lines = ANSI.sub("", output).splitlines()
    for number, line in enumerate(lines):
        found = RESULT.match(line.strip())
        if found is None:
            continue
        kind, text = found.groups()
        counts[kind] += 1
        if kind in ("err", "exception"):
            failed.append("\n".join([text, *lines[number + 1:number + 4]]))
    return {"unit": unit, "passed": counts["ok"], "failed": counts["err"] + counts["exception"],
            "skipped": counts["skip"], "ignored": counts["ignore"], "timed_out": timed_out,
            "failures": failed, "output_tail": "\n".join(lines[-15:])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--redis-git", help="a git directory of redis/redis")
    source.add_argument("--tree", type=Path, help="an extracted tree (runtest, tests/)")
    parser.add_argument("--tag", default="7.0.15", help="the tag to extract (default 7.0.15)")
    parser.add_argument("--unit", action="append", help="a unit to run (repeatable; "
                        "default: the six of docs/redis.md)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per unit")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--verbose", action="store_true", help="print failures' messages")
    args = parser.parse_args()
    if shutil.which("tclsh") is None:
        raise SystemExit("tclsh is needed (apt-get install tcl)")
    work = Path(tempfile.mkdtemp(prefix="rankd-redis-tests-"))
    tree = args.tree
    if tree is None:
        tree = work / "redis"
        extract(args.redis_git, args.tag, tree)
    subprocess.run([sys.executable, str(HERE / "patch.py"), str(tree)], check=True)
    process, port = start_rankd(work / "data")
    results = []
    try:
        for unit in args.unit or UNITS:
            result = run_unit(tree, port, unit, args.timeout)
            results.append(result)
            flag = " (timed out)" if result["timed_out"] else ""
            print(f"{unit}: {result['passed']} passed, {result['failed']} failed, "
                  f"{result['skipped']} skipped{flag}", flush=True)
    finally:
        process.terminate()
        process.wait(30)
    for result in results:
        if result["failures"]:
            print(f"\n== {result['unit']}: failed")
            for failure in result["failures"]:
                print("  " + (failure if args.verbose else failure.splitlines()[0]))
        if result["passed"] + result["failed"] == 0:
            print(f"\n== {result['unit']}: nothing ran; output ends:\n{result['output_tail']}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    shutil.rmtree(work / "data", ignore_errors=True)
    os.environ.get("KEEP") or shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
