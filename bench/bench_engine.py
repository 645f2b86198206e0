"""Engine benchmark: ingest rate, group-commit acknowledgements and recovery time.

Measures :class:`rankd.engine.engine.Engine` in-process (no network, no
front-end) and prints one table:

1. **batch ingest** - ``submit_many`` in batches of ``--batch`` (1000) delta
   submissions with event ids on a ``sum`` board, members drawn from
   ``--members`` (100_000) distinct names, ``--events`` (1_000_000) in all.
   Target: >= 300,000 events/s with WAL fsync ``everysec`` and windows
   ``["all"]``.  The same with windows ``["all", "daily", "weekly"]`` and
   with fsync ``always`` is reported for information.
2. **acknowledged submits** - fsync ``always``, ``--concurrency`` (64)
   coroutines each awaiting ``engine.submit`` one at a time for
   ``--seconds`` (10); the engine applies the submissions that arrive in
   one pass of the event loop as one batch, and the WAL's group commit
   shares fsyncs between batches.
   Target: >= 20,000 acknowledged events/s; p50/p99 latency is reported.
3. **recovery** - a data dir holding a snapshot of a ``--recovery-members``
   (1_000_000) member board plus a WAL tail of ``--recovery-events``
   (1_000_000) events; ``Engine.open`` on it is timed.  Target: < 5 s.
   The digest after reopening must equal the digest before closing.
   The split into snapshot read / snapshot load / WAL open+replay comes from
   a subclass that times the recovery room's steps (the engine's
   own log line gives only the total); files are in the page cache (warm).
4. **Postgres shipping** - a backlog of ``--postgres-events`` shipped to an
   empty database (``--postgres-dsn``, default a throwaway local cluster).

Every figure is the median of ``--repeats`` runs (default 3 for 1 and 2,
1 for 3), each run in a fresh ``tempfile.TemporaryDirectory`` under /tmp.
Submission objects are built before timing starts; while timing, the cyclic
GC is set up as the daemon sets it once it serves
(:func:`rankd.engine.collector.settle`: inputs frozen out of the collector's
generations, young collections every 50,000 allocations).
Automatic snapshots and housekeeping are disabled while measuring.  The
exit status is 1 when a target is missed.  Other busy processes on the
machine skew every figure: the load average is printed at start and end.

Run from the project root (the package installed, the native index built)::

    python bench/bench_engine.py                 # full run, a few minutes
    python bench/bench_engine.py --quick         # smoke run with tiny sizes
    python bench/bench_engine.py --only ingest --repeats 1
    python bench/bench_engine.py --profile       # cProfile of one ingest run
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import logging
import os
import pstats
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rankd._native import implementations
from rankd.engine import collector
from rankd.engine.engine import Engine, EngineConfig
from rankd.engine.errors import EngineError
from rankd.engine.submission import Submission
from rankd.engine.tail import MAX_SNAPSHOT_EVERY_BYTES, MAX_SNAPSHOT_EVERY_EVENTS

BOARD = "bench"
FIGURES = ("ingest", "ack", "recovery", "postgres")
NEVER = 1e12  # seconds / events: keeps snapshots and housekeeping out of the way


# --- results ------------------------------------------------------------------------------


@dataclass
class Row:
    """One line of the result table."""

    figure: str
    value: float
    unit: str
    target: float | None = None
    higher_is_better: bool = True
    note: str = ""
    #: Shown instead of the number (yes/no figures); ``value`` still decides.
    text: str | None = None

    def verdict(self) -> str:
        if self.target is None:
            return "info"
        ok = self.value >= self.target if self.higher_is_better else self.value < self.target
        return "PASS" if ok else "MISS"

    def measured(self) -> str:
        return self.text if self.text is not None else f"{_num(self.value)} {self.unit}"

    def wanted(self) -> str:
        if self.target is None:
            return "-"
        if self.text is not None:
            return self.unit
        return f"{'>=' if self.higher_is_better else '<'} {_num(self.target)} {self.unit}"


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, row: Row) -> None:
        self.rows.append(row)
        print(f"  -> {row.figure}: {row.measured()} [{row.verdict()}] {row.note}".rstrip(),
              flush=True)


def _num(value: float) -> str:
    if value >= 1000:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}" if value < 0.1 else f"{value:.2f}"


def load_average() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min)"


def print_table(report: Report) -> None:
    headers = ("figure", "measured", "target", "result", "note")
    lines = [(r.figure, r.measured(), r.wanted(), r.verdict(), r.note) for r in report.rows]
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h)
              for i, h in enumerate(headers)]
    rule = "  ".join("-" * w for w in widths)
    print()
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip())
    print(rule)
    for line in lines:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
    print(rule)
    for note in report.notes:
        print(note)


# --- helpers ------------------------------------------------------------------------------


def engine_config(path: Path, fsync: str) -> EngineConfig:
    # Snapshots by count or bytes as late as allowed (rankd.engine.tail's bounds).
    return EngineConfig(data_dir=path, fsync=fsync,
                        snapshot_every_events=MAX_SNAPSHOT_EVERY_EVENTS,
                        snapshot_every_bytes=MAX_SNAPSHOT_EVERY_BYTES,
                        snapshot_every_seconds=NEVER, housekeeping_seconds=NEVER)


@contextmanager
def data_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="rankd-bench-") as path:
        yield Path(path)


def runs_note(values: Sequence[float], fmt: str = "{:,.0f}") -> str:
    if len(values) < 2:
        return ""
    return "runs " + "/".join(fmt.format(v) for v in values)


def submissions(count: int, members: int, prefix: str, seed: int) -> list[Submission]:
    """Delta submissions with unique event ids on members drawn at random."""
    rng = random.Random(seed)
    pick = rng.randrange
    return [Submission(board=BOARD, member=f"member-{pick(members)}", delta=1 + i % 7,
                       event_id=f"{prefix}{i}") for i in range(count)]


def distinct(count: int, prefix: str) -> list[Submission]:
    """One submission for each of ``count`` distinct members."""
    return [Submission(board=BOARD, member=f"member-{i}", delta=1 + i % 7,
                       event_id=f"{prefix}{i}") for i in range(count)]


def batches(items: list[Submission], size: int) -> list[list[Submission]]:
    return [items[start:start + size] for start in range(0, len(items), size)]


async def open_board(path: Path, fsync: str, windows: Sequence[str]) -> Engine:
    engine = await Engine.open(engine_config(path, fsync))
    await engine.put_board(BOARD, {"policy": "sum", "windows": list(windows)})
    return engine


async def feed(engine: Engine, chunks: Sequence[list[Submission]]) -> int:
    """submit_many every chunk; returns the number of events; fails on any error."""
    done = 0
    for chunk in chunks:
        answers = await engine.submit_many(chunk)
        for answer in answers:
            if isinstance(answer, EngineError):
                raise RuntimeError(f"engine refused a submission: {answer!r}")
        done += len(answers)
    return done


# --- figure 1: batch ingest ----------------------------------------------------------------


@dataclass
class Rate:
    """Events per wall-clock second and per CPU second; share of time in the cyclic GC."""

    wall: float
    cpu: float
    gc_share: float


class GcTimer:
    """Wall time spent in cyclic garbage collections while active."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started = 0.0

    def __enter__(self) -> GcTimer:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started


async def _ingest_once(chunks: Sequence[list[Submission]], fsync: str,
                       windows: Sequence[str]) -> Rate:
    with data_dir() as path:
        engine = await open_board(path, fsync, windows)
        try:
            with GcTimer() as collector:
                cpu = time.process_time()
                started = time.perf_counter()
                done = await feed(engine, chunks)
                elapsed = time.perf_counter() - started
                cpu = time.process_time() - cpu
        finally:
            await engine.close(snapshot=False)
    return Rate(done / elapsed, done / cpu, collector.seconds / elapsed)


def ingest_rate(chunks: Sequence[list[Submission]], fsync: str, windows: Sequence[str]
                ) -> Rate:
    with collector.settled():
        return asyncio.run(_ingest_once(chunks, fsync, windows))


def bench_ingest(args: argparse.Namespace, report: Report) -> None:
    print(f"[1] batch ingest: {args.events:,} events, batches of {args.batch}, "
          f"{args.members:,} members", flush=True)
    chunks = batches(submissions(args.events, args.members, "e", seed=1), args.batch)
    cases = [
        ("ingest everysec, windows all", "everysec", ["all"], 300_000.0),
        ("ingest everysec, all+daily+weekly", "everysec", ["all", "daily", "weekly"], None),
        ("ingest always (batches), windows all", "always", ["all"], None),
    ]
    for name, fsync, windows, target in cases:
        rates = [ingest_rate(chunks, fsync, windows) for _ in range(args.repeats)]
        walls = [rate.wall for rate in rates]
        note = (f"{statistics.median(rate.cpu for rate in rates):,.0f} ev/cpu-s, "
                f"gc {statistics.median(rate.gc_share for rate in rates):.0%} of time")
        if len(rates) > 1:
            note = f"{runs_note(walls)}; {note}"
        report.add(Row(name, statistics.median(walls), "ev/s", target, note=note))


# --- figure 2: acknowledged submits with group commit ---------------------------------------


@dataclass
class AckRun:
    events: int
    seconds: float
    latencies: list[float]
    exhausted: bool


async def _submitter(engine: Engine, pool: list[Submission], deadline: float,
                     latencies: list[float]) -> bool:
    """Submit one at a time until the deadline; True if the pool ran out first."""
    clock = time.perf_counter
    record = latencies.append
    for submission in pool:
        if clock() >= deadline:
            return False
        started = clock()
        await engine.submit(submission)
        record(clock() - started)
    return True


async def _ack_once(pools: list[list[Submission]], warmup: list[list[Submission]],
                    seconds: float) -> AckRun:
    with data_dir() as path:
        engine = await open_board(path, "always", ["all"])
        try:
            await feed(engine, warmup)
            latencies: list[float] = []
            started = time.perf_counter()
            deadline = started + seconds
            exhausted = await asyncio.gather(
                *(_submitter(engine, pool, deadline, latencies) for pool in pools))
            elapsed = time.perf_counter() - started
        finally:
            await engine.close(snapshot=False)
    return AckRun(len(latencies), elapsed, latencies, any(exhausted))


def _percentile(sorted_values: Sequence[float], fraction: float) -> float:
    position = min(len(sorted_values) - 1, round(fraction * (len(sorted_values) - 1)))
    return sorted_values[position]


def bench_ack(args: argparse.Namespace, report: Report) -> None:
    print(f"[2] acknowledged submits: fsync always, {args.concurrency} submitters, "
          f"{args.seconds:g} s", flush=True)
    per_worker = int(args.ack_pool_rate * args.seconds / args.concurrency) + 1
    pools = [submissions(per_worker, args.members, f"a{w}-", seed=100 + w)
             for w in range(args.concurrency)]
    warmup = batches(distinct(args.members, "w"), args.batch)
    runs = []
    for _ in range(args.repeats):
        with collector.settled():
            runs.append(asyncio.run(_ack_once(pools, warmup, args.seconds)))
    rates = [run.events / run.seconds for run in runs]
    chosen = runs[rates.index(statistics.median_low(rates))]
    ordered = sorted(chosen.latencies)
    note = runs_note(rates)
    if any(run.exhausted for run in runs):
        note += " (pool exhausted: raise --ack-pool-rate)"
    report.add(Row("acked submits, fsync always, x64", statistics.median(rates), "ev/s",
                   20_000.0, note=note.strip()))
    report.add(Row("  ack latency p50", _percentile(ordered, 0.50) * 1000, "ms", None))
    report.add(Row("  ack latency p99", _percentile(ordered, 0.99) * 1000, "ms", None))


# --- figure 3: recovery -----------------------------------------------------------------------


class TimedEngine(Engine):
    """An Engine that times its recovery steps (reads private methods only)."""

    phases: dict[str, float]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.phases = {}
        self.snapshots.latest = self._timed("snapshot read", self.snapshots.latest)
        # The recovery room's steps (rankd.engine.recovery, rankd.engine.state).
        self._recovery.recover = self._timed("recover", self._recovery.recover)
        self._state.load = self._timed("snapshot load", self._state.load)

    def _timed(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - started
        return timed


class LogCapture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


async def build_recovery_dir(path: Path, members: int, events: int, batch: int) -> str:
    """Snapshot of ``members`` distinct members plus a WAL tail of ``events``; the digest."""
    first = batches(distinct(members, "s"), batch)
    tail = batches(submissions(events, members, "t", seed=3), batch)
    engine = await open_board(path, "no", ["all"])
    try:
        await feed(engine, first)
        await engine.snapshot()
        await feed(engine, tail)
        digest = engine.digest()
    finally:
        await engine.close(snapshot=False)
    return digest


@dataclass
class RecoveryRun:
    total: float
    phases: dict[str, float]
    matched: bool
    log_line: str


async def _reopen(path: Path) -> tuple[float, TimedEngine]:
    with GcTimer() as collector:
        started = time.perf_counter()
        engine = TimedEngine(engine_config(path, "everysec"))
        await engine.start()  # what Engine.open does
        elapsed = time.perf_counter() - started
    engine.phases["gc"] = collector.seconds
    return elapsed, engine


def recovery_once(args: argparse.Namespace) -> RecoveryRun:
    capture = LogCapture()
    logger = logging.getLogger("rankd.engine.engine")
    with data_dir() as path:
        digest = asyncio.run(build_recovery_dir(path, args.recovery_members,
                                                args.recovery_events, args.batch))
        gc.collect()
        logger.addHandler(capture)
        level, propagate = logger.level, logger.propagate
        logger.setLevel(logging.INFO)
        logger.propagate = False  # keep INFO lines off the console
        try:
            total, engine = asyncio.run(_reopen(path))
        finally:
            logger.removeHandler(capture)
            logger.setLevel(level)
            logger.propagate = propagate
        matched = engine.digest() == digest
        asyncio.run(engine.close(snapshot=False))
    line = next((m for m in capture.messages if m.startswith("recovered")), "")
    return RecoveryRun(total, engine.phases, matched, line)


def bench_recovery(args: argparse.Namespace, report: Report) -> None:
    print(f"[3] recovery: snapshot of {args.recovery_members:,} members + WAL tail of "
          f"{args.recovery_events:,} events", flush=True)
    runs = [recovery_once(args) for _ in range(args.recovery_repeats)]
    totals = [run.total for run in runs]
    chosen = runs[totals.index(statistics.median_low(totals))]
    matched = all(run.matched for run in runs)
    report.add(Row("recovery: Engine.open total", statistics.median(totals), "s", 5.0,
                   higher_is_better=False, note=runs_note(totals, "{:.2f}")))
    phases = chosen.phases
    replay = phases.get("recover", 0.0) - phases.get("snapshot read", 0.0) \
        - phases.get("snapshot load", 0.0)
    for name, value in (("  snapshot read (file+CRC)", phases.get("snapshot read", 0.0)),
                        ("  snapshot load (decode+index)", phases.get("snapshot load", 0.0)),
                        ("  WAL open + replay", replay),
                        ("  (of all these: cyclic GC)", phases.get("gc", 0.0))):
        report.add(Row(name, value, "s", None))
    report.add(Row("recovery: digest after reopen", float(matched), "equal", 1.0,
                   text="matched" if matched else "MISMATCH"))
    report.notes.append(f"engine log: {chosen.log_line or '(no recovery log line seen)'}")
    print(f"  digest after reopen {'matched' if matched else 'DID NOT MATCH'} the digest "
          "before closing", flush=True)


# --- figure 4: Postgres shipping --------------------------------------------------------------


def _throwaway_postgres() -> tuple[str, object]:
    """A private PostgreSQL cluster on a free loopback port (the tests' helper)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from pgcluster import Cluster, _bin_dir

    bin_dir = _bin_dir()
    if bin_dir is None:
        raise RuntimeError("no PostgreSQL server binaries (initdb) and no --postgres-dsn")
    cluster = Cluster(bin_dir)
    cluster.init()
    cluster.start()
    return cluster.admin_dsn, cluster


async def _ship_backlog(path: Path, dsn: str, events: int, batch: int) -> tuple[int, float]:
    """Log ``events`` without Postgres, then time how fast a shipper catches up."""
    engine = await open_board(path, "no", ["all"])
    for chunk in batches(submissions(events, 50_000, "pg", 7), batch):
        await engine.submit_many(chunk)
    last = engine.wal.last_lsn
    await engine.close(snapshot=False)
    config = engine_config(path, "no")
    config.postgres_dsn = dsn
    engine = await Engine.open(config)  # replays the log first: not part of the figure
    try:
        started, already = time.perf_counter(), engine.shipper.shipped_lsn
        await engine.shipper.wait_shipped(last, timeout=600)
        return last - already, time.perf_counter() - started
    finally:
        await engine.close(snapshot=False)


def bench_postgres_shipping(args: argparse.Namespace, report: Report) -> None:
    """Catch-up throughput of the WAL shipper: records copied into Postgres per second.

    Uses ``--postgres-dsn`` (an empty database) or starts a throwaway local
    cluster.  The backlog is written with no Postgres configured; the engine
    is then reopened with the DSN and timed until everything is shipped.
    """
    cluster = None
    dsn = args.postgres_dsn
    try:
        if not dsn:
            dsn, cluster = _throwaway_postgres()
        events = args.postgres_events
        print(f"[4] postgres shipping: backlog of {events:,} events", flush=True)
        with data_dir() as path:
            shipped, seconds = asyncio.run(_ship_backlog(path, dsn, events, args.batch))
        report.add(Row("postgres shipping (catch-up)", shipped / seconds, "rec/s", 50_000,
                       note=f"{shipped:,} records in {seconds:.1f} s"))
    except RuntimeError as exc:
        print(f"[4] postgres shipping: skipped ({exc})", flush=True)
        report.notes.append(f"postgres shipping: skipped ({exc})")
    finally:
        if cluster is not None:
            cluster.destroy()


# --- profiling ---------------------------------------------------------------------------------


def _print_profile(profiler: cProfile.Profile, top: int) -> None:
    pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime").print_stats(top)


def profile_ingest(args: argparse.Namespace, top: int = 15) -> None:
    """One figure-1 run (everysec, windows all) under cProfile; top functions by self time."""
    chunks = batches(submissions(args.events, args.members, "e", seed=1), args.batch)
    profiler = cProfile.Profile()
    with collector.settled():
        profiler.enable()
        rate = asyncio.run(_ingest_once(chunks, "everysec", ["all"]))
        profiler.disable()
    print(f"profiled ingest run: {rate.wall:,.0f} ev/s under cProfile")
    _print_profile(profiler, top)


class ProfiledEngine(Engine):
    """An Engine whose recovery (run in a worker thread) is profiled."""

    profiler: cProfile.Profile | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        recover = self._recovery.recover

        def profiled() -> int:  # (the recovery room's step, in its worker thread)
            self.profiler = cProfile.Profile()
            return self.profiler.runcall(recover)
        self._recovery.recover = profiled


def profile_recovery(args: argparse.Namespace, top: int = 15) -> None:
    """Figure 3's recovery step under cProfile; top functions by self time."""
    with data_dir() as path:
        asyncio.run(build_recovery_dir(path, args.recovery_members, args.recovery_events,
                                       args.batch))
        gc.collect()
        engine = asyncio.run(ProfiledEngine.open(engine_config(path, "everysec")))
        asyncio.run(engine.close(snapshot=False))
    print("profiled recovery (Recovery.recover):")
    _print_profile(engine.profiler, top)


# --- main ----------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    add = parser.add_argument
    add("--events", type=int, default=1_000_000, help="events for figure 1")
    add("--members", type=int, default=100_000, help="distinct members, figures 1-2")
    add("--batch", type=int, default=1000, help="submissions per submit_many")
    add("--seconds", type=float, default=10.0, help="duration of figure 2")
    add("--concurrency", type=int, default=64, help="submitters in figure 2")
    add("--ack-pool-rate", type=float, default=100_000.0,
        help="prebuilt submissions per second of figure 2 (its ceiling)")
    add("--recovery-members", type=int, default=1_000_000)
    add("--recovery-events", type=int, default=1_000_000)
    add("--repeats", type=int, default=None,
        help="runs per figure, median reported (default 3; 1 for recovery)")
    add("--only", choices=FIGURES, action="append", help="run only these figures")
    add("--postgres-dsn", default=None,
        help="an empty database for figure 4 (default: a throwaway local cluster)")
    add("--postgres-events", type=int, default=500_000, help="backlog shipped in figure 4")
    add("--quick", action="store_true", help="smoke run with tiny sizes")
    add("--profile", nargs="?", const="ingest", choices=("ingest", "recovery"),
        help="instead of the table, cProfile one ingest (default) or recovery run "
             "and print the top 15 functions by self time")
    args = parser.parse_args(argv)
    if args.quick:
        args.events, args.members, args.seconds = 20_000, 2_000, 1.0
        args.recovery_members, args.recovery_events = 20_000, 20_000
        args.postgres_events = 20_000
        args.repeats = args.repeats or 1
    args.recovery_repeats = args.repeats or 1
    args.repeats = args.repeats or 3
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    parts = " ".join(f"{part}={kind}" for part, kind in implementations().items())
    print(f"rankd engine benchmark - {parts}, python "
          f"{sys.version.split()[0]}, {os.cpu_count()} CPUs, repeats "
          f"{args.repeats}/{args.recovery_repeats}, {load_average()}", flush=True)
    if args.profile:
        {"ingest": profile_ingest, "recovery": profile_recovery}[args.profile](args)
        return 0
    report = Report()
    steps = {"ingest": bench_ingest, "ack": bench_ack, "recovery": bench_recovery,
             "postgres": bench_postgres_shipping}
    for name in [figure for figure in FIGURES if figure in (args.only or FIGURES)]:
        steps[name](args, report)
    report.notes.append(f"at the end: {load_average()} (other busy processes skew figures)")
    print_table(report)
    return 0 if all(row.verdict() != "MISS" for row in report.rows) else 1


if __name__ == "__main__":
    sys.exit(main())
