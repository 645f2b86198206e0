"""Restart benchmark: how long ``rankd serve`` takes to serve again after a
clean stop (SIGTERM: its shutdown snapshot) and after a crash (kill -9: the
WAL tail replayed), beside redis-server loading an RDB of the same set.

    python bench/bench_restart.py --members 1000000 --tail 1000000 --rounds 3
    python bench/bench_restart.py --members 10000000 --tail 1000000 --rounds 2
    python bench/bench_restart.py --src /work/wt-base/src --src src ...   # side by side
    python bench/bench_restart.py --build-with A/src --src A/src --src B/src --keep DIR ...

For each source tree (``--src``, repeatable: the daemon runs that tree's
``rankd``), or once with ``--build-with`` a tree for them all (which then
restart from the same files: the oldest tree's formats, which newer ones
read), one data dir is built, not timed: ``--members`` members
named ``player:%012d`` (19 bytes) with random scores, ``ZADD`` in pipelined
batches over the RESP port, stopped with SIGTERM (so a snapshot holds
them); then started again, ``--tail`` ``ZINCRBY`` of random members (one
WAL record each) and killed with SIGKILL: that dir is the *kill -9* case,
a snapshot and a tail of ``--tail`` records.  Started from a copy of it and
stopped with SIGTERM, it becomes the *SIGTERM* case (everything in the
snapshot).  Redis is loaded with the same members and scores and ``SAVE``\\ s
an RDB.

Each round restarts every case from a fresh copy of its dir (copied before
the clock starts; the files are in the page cache for every case alike), in
an order that rotates from round to round, and times from the process's
start to the first answer on the RESP port that shows the data: ``ZCARD``
equal to the members loaded for rankd (its RESP port opens only once
recovery is done), the first ``PONG`` for redis-server (it answers
``-LOADING`` until its RDB is loaded).  The table gives each case's median
and every round's time, and the median of the per-round ratios of kill -9
to SIGTERM; then the same for the CPU time (user + system, every thread)
the server used until it answered, which moves far less than wall time
with whatever else the machine runs.  ``--profile DIR`` also records one kill -9 restart of each
tree under ``py-spy record --native`` (collapsed stacks per tree in DIR,
``*-kill9.txt``, with the share of samples in the functions that took
most printed).  ``--keep DIR`` keeps the data dirs built (``--build-with``'s
and Redis's) in DIR and restarts from them on a later run with the same
arguments, which then builds nothing (10M members take minutes to load).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PYTHON = sys.executable
BOARD = "lb"
#: Members per pipelined ZADD, and commands per pipelined write.
BATCH = 1000
PIPELINE = 50


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far, every thread."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def command(*words: bytes) -> bytes:
    out = [b"*%d\r\n" % len(words)]
    for word in words:
        out.append(b"$%d\r\n%s\r\n" % (len(word), word))
    return b"".join(out)


def name(i: int) -> bytes:
    return b"player:%012d" % i


def read_replies(sock: socket.socket, count: int) -> bytes:
    """``count`` single-line replies (integers, simple strings, bulk lines)."""
    data = b""
    while data.count(b"\r\n") < count:
        chunk = sock.recv(1 << 16)
        if not chunk:
            raise ConnectionError("server closed the connection")
        data += chunk
    if data.startswith(b"-") or b"\r\n-" in data:
        raise RuntimeError(f"server refused: {data[:200]!r}")
    return data


def send_all(port: int, commands: list[bytes], replies_each: int = 1) -> None:
    """Send ``commands`` pipelined, :data:`PIPELINE` at a time."""
    with socket.create_connection(("127.0.0.1", port), timeout=600) as sock:
        for start in range(0, len(commands), PIPELINE):
            chunk = commands[start:start + PIPELINE]
            sock.sendall(b"".join(chunk))
            read_replies(sock, len(chunk) * replies_each)


def zadds(members: int, seed: int) -> list[bytes]:
    """The ZADDs of every member with its random score (same for every server)."""
    rng = random.Random(seed)
    out = []
    for start in range(0, members, BATCH):
        words = [b"ZADD", BOARD.encode()]
        for i in range(start, min(start + BATCH, members)):
            words += [b"%d" % rng.randrange(10**9), name(i)]
        out.append(command(*words))
    return out


def zincrbys(members: int, count: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [command(b"ZINCRBY", BOARD.encode(), b"1", name(rng.randrange(members)))
            for _ in range(count)]


def ask(port: int, request: bytes, timeout: float = 5.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(request)
        return read_line(sock)


def read_line(sock: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\r\n"):
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


class Rankd:
    """``rankd serve`` of one source tree on a data dir."""

    def __init__(self, src: Path, data_dir: Path, *extra: str, wrapper: tuple[str, ...] = ()
                 ) -> None:
        self.resp_port = free_port()
        self.log = open(data_dir.parent / f"{data_dir.name}.log", "ab")  # noqa: SIM115
        env = {**os.environ, "PYTHONPATH": str(src)}
        self.started = time.perf_counter()
        self.process = subprocess.Popen(
            [*wrapper, PYTHON, "-m", "rankd.cli", "serve", "--host", "127.0.0.1",
             "--port", str(free_port()), "--tcp-port", "0", "--resp-port", str(self.resp_port),
             "--data-dir", str(data_dir), "--snapshot-every-events", "2000000",
             "--snapshot-every-seconds", "100000", *extra],
            env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_serving(self, members: int, timeout: float = 600.0) -> float:
        """Seconds from the start until ``ZCARD`` answers ``members`` (and
        the CPU seconds the daemon used until then in ``self.cpu``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"rankd exited with {self.process.returncode}")
            try:
                reply = ask(self.resp_port, command(b"ZCARD", BOARD.encode()))
            except OSError:
                time.sleep(0.005)
                continue
            elapsed = time.perf_counter() - self.started
            self.cpu = cpu_seconds(self.process.pid)
            if reply != b":%d\r\n" % members:
                raise RuntimeError(f"rankd holds {reply!r}, not {members} members")
            return elapsed
        raise TimeoutError("rankd did not serve in time")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        self.process.send_signal(sig)
        code = self.process.wait(600)
        self.log.close()
        if sig == signal.SIGTERM and code != 0:
            raise RuntimeError(f"rankd exited with {code} after SIGTERM")


class Redis:
    def __init__(self, directory: Path) -> None:
        self.port = free_port()
        self.started = time.perf_counter()
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(directory), "--dbfilename", "dump.rdb"],
            stdout=subprocess.DEVNULL)

    def wait_serving(self, timeout: float = 600.0) -> float:
        """Seconds from the start to the first PONG (not -LOADING)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                reply = ask(self.port, command(b"PING"))
            except (OSError, RuntimeError):
                time.sleep(0.005)
                continue
            if reply == b"+PONG\r\n":
                elapsed = time.perf_counter() - self.started
                self.cpu = cpu_seconds(self.process.pid)
                return elapsed
            time.sleep(0.005)
        raise TimeoutError("redis did not serve in time")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(120)


def build_rankd(src: Path, root: Path, members: int, tail: int, seed: int
                ) -> tuple[Path, Path]:
    """(kill -9 dir, SIGTERM dir) of ``members`` members and a ``tail``-record tail."""
    crash = root / "crash"
    crash.mkdir()
    daemon = Rankd(src, crash)
    daemon.wait_serving(0, timeout=60)
    began = time.monotonic()
    send_all(daemon.resp_port, zadds(members, seed))
    daemon.stop()
    loaded = time.monotonic() - began
    daemon = Rankd(src, crash)
    daemon.wait_serving(members)
    send_all(daemon.resp_port, zincrbys(members, tail, seed + 1))
    daemon.stop(signal.SIGKILL)
    clean = root / "clean"
    shutil.copytree(crash, clean)
    daemon = Rankd(src, clean)
    daemon.wait_serving(members)
    daemon.stop()
    print(f"  {src}: {members:,} members loaded in {loaded:.1f} s, tail of {tail:,}",
          flush=True)
    return crash, clean


def build_redis(root: Path, members: int, seed: int) -> Path:
    directory = root / "redis"
    directory.mkdir()
    redis = Redis(directory)
    redis.wait_serving()
    send_all(redis.port, zadds(members, seed))
    ask(redis.port, command(b"SAVE"), timeout=600)
    redis.stop()
    return directory


def fresh_copy(template: Path, root: Path) -> Path:
    target = root / "run"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(template, target)
    return target


def timed_rankd(src: Path, template: Path, root: Path, members: int,
                wrapper: tuple[str, ...] = ()) -> tuple[float, float]:
    """(seconds, CPU seconds) of one restart of rankd."""
    data = fresh_copy(template, root)
    daemon = Rankd(src, data, wrapper=wrapper)
    try:
        return daemon.wait_serving(members), daemon.cpu
    finally:
        if wrapper:  # the profiler's child is the daemon: kill it, let py-spy write
            children = Path(f"/proc/{daemon.process.pid}/task/{daemon.process.pid}/children")
            for pid in children.read_text().split():
                os.kill(int(pid), signal.SIGKILL)
            daemon.process.wait(900)  # py-spy writes a big profile slowly
            daemon.log.close()
        else:
            daemon.stop(signal.SIGKILL)


def timed_redis(template: Path, root: Path) -> tuple[float, float]:
    """(seconds, CPU seconds) of one restart of redis-server."""
    data = fresh_copy(template, root)
    redis = Redis(data)
    try:
        return redis.wait_serving(), redis.cpu
    finally:
        redis.stop()


def print_profile(path: Path, top: int = 25) -> None:
    """The functions most samples were in (self), and under (total)."""
    own: dict[str, int] = {}
    under: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        total += int(count)
        own[frames[-1]] = own.get(frames[-1], 0) + int(count)
        for frame in set(frames):
            under[frame] = under.get(frame, 0) + int(count)
    for title, counts in (("self", own), ("total", under)):
        print(f"    {title}:")
        for frame, count in sorted(counts.items(), key=lambda kv: -kv[1])[:top]:
            print(f"    {100 * count / total:5.1f}%  {frame[:150]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=1_000_000)
    parser.add_argument("--tail", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--src", action="append", type=Path,
                        help="source tree(s) to compare (default: this checkout's src)")
    parser.add_argument("--build-with", type=Path,
                        help="build the data dirs once, with this source tree, for every "
                             "--src (each reads the formats of older versions)")
    parser.add_argument("--keep", type=Path,
                        help="keep the data dirs built in this directory and, when it holds "
                             "them, restart from them instead of building (with --build-with: "
                             "the same members, tail and seed each time)")
    parser.add_argument("--no-redis", action="store_true")
    parser.add_argument("--profile", type=Path, help="py-spy flame graphs of kill -9 here")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    sources = [s.resolve() for s in (args.src or [HERE.parent / "src"])]
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        root = Path(tmp)
        cases: dict[str, tuple[str, Path, Path | None]] = {}
        shared = None
        kept = args.keep.resolve() if args.keep else None
        if kept is not None and (kept / "shared" / "crash").is_dir():
            shared = kept / "shared" / "crash", kept / "shared" / "clean"
            print(f"  restarting from the data dirs kept in {kept}", flush=True)
        elif args.build_with is not None:  # one data dir for every tree
            (root / "shared").mkdir()
            shared = build_rankd(args.build_with.resolve(), root / "shared", args.members,
                                 args.tail, args.seed)
            if kept is not None:
                shutil.copytree(root / "shared", kept / "shared", dirs_exist_ok=True)
        for number, src in enumerate(sources):
            tree = root / f"tree{number}"
            tree.mkdir()
            crash, clean = shared or build_rankd(src, tree, args.members, args.tail, args.seed)
            label = src.parent.name
            cases[f"{label} SIGTERM"] = ("rankd", clean, src)
            cases[f"{label} kill -9"] = ("rankd", crash, src)
        if not args.no_redis:
            if kept is not None and (kept / "redis").is_dir():
                redis_dir = kept / "redis"
            else:
                redis_dir = build_redis(root, args.members, args.seed)
                if kept is not None:
                    shutil.copytree(redis_dir, kept / "redis", dirs_exist_ok=True)
            cases["redis RDB"] = ("redis", redis_dir, None)
        times: dict[str, list[float]] = {case: [] for case in cases}
        cpus: dict[str, list[float]] = {case: [] for case in cases}
        names = list(cases)
        for round_number in range(args.rounds):
            turn = round_number % len(names)
            for case in names[turn:] + names[:turn]:
                kind, template, src = cases[case]
                seconds, cpu = (timed_rankd(src, template, root, args.members)
                                if kind == "rankd" else timed_redis(template, root))
                times[case].append(seconds)
                cpus[case].append(cpu)
                print(f"  round {round_number + 1}: {case}: {seconds:.2f} s, CPU {cpu:.2f} s",
                      flush=True)
        if args.profile:
            args.profile.mkdir(parents=True, exist_ok=True)
            py_spy = str(Path(PYTHON).parent / "py-spy")
            for case, (_kind, template, src) in cases.items():
                if case.endswith("kill -9"):
                    out = args.profile / f"{case.split()[0]}-kill9.txt"
                    timed_rankd(src, template, root, args.members, wrapper=(
                        py_spy, "record", "--native", "--rate", "250", "--format", "raw",
                        "-o", str(out), "--"))
                    print(f"  profile of {case}: {out}")
                    print_profile(out)
    if not args.rounds:
        return 0
    print(f"\nrestart to first answer with the data, {args.members:,} members, "
          f"kill -9 tail {args.tail:,} records, {args.rounds} round(s), seconds")
    for title, table in (("wall clock", times), ("CPU (user + system, every thread)", cpus)):
        print(f"\n{title}\n{'case':<24} {'median':>8}   rounds")
        for case in names:
            print(f"{case:<24} {statistics.median(table[case]):>8.2f}   "
                  + " ".join(f"{t:.2f}" for t in table[case]))
        for src in sources:
            label = src.parent.name
            ratios = [k / s for k, s in zip(table[f"{label} kill -9"],
                                            table[f"{label} SIGTERM"], strict=True)]
            print(f"{label}: kill -9 / SIGTERM, median of the rounds' ratios: "
                  f"{statistics.median(ratios):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
