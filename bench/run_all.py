"""Run every benchmark of the project in sequence; write bench/RESULTS.md and plots.

    python bench/run_all.py            # the full report (about 40 minutes on 2 cores)
    python bench/run_all.py --quick    # every script with tiny sizes, to check the pipeline

Each benchmark is a separate script that prints its own table (see
bench/README.md); this runner records the machine, the date, each exact
command and its output in RESULTS.md, then draws PNG plots (matplotlib)
from the figures it parses out of those tables:

* ``throughput.png``: submissions/s and p99 latency of rankd (TCP without and
  with event ids, and REST for reference) and Redis (``ZINCRBY``, and the
  idempotent script beside event ids) against pipelining depth (1, 4, 16, 64),
* ``memory.png``: bytes per member, native index vs Redis, at 100K/1M/5M,
* ``recovery.png``: recovery time against WAL length,
* ``live.png``: live-feed delivery latency against subscriber count.

A figure whose numbers cannot be parsed (a script failed) is reported as
missing rather than drawn from made-up data.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


@dataclass
class Run:
    name: str
    command: list[str]
    output: str = ""
    seconds: float = 0.0
    status: int = 0

    @property
    def shell_command(self) -> str:
        """The command as typed in the project root."""
        script = Path(self.command[1]).relative_to(ROOT).as_posix()
        return " ".join(["python", script, *self.command[2:]])


@dataclass
class Plan:
    runs: list[Run] = field(default_factory=list)

    def add(self, name: str, script: str, *args: object) -> Run:
        run = Run(name, [sys.executable, str(HERE / script), *map(str, args)])
        self.runs.append(run)
        return run


def machine() -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{model}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
            f"{platform.system()} {platform.release()}")


def execute(run: Run) -> None:
    print(f"== {run.name}: {' '.join(run.command[1:])}", file=sys.stderr, flush=True)
    started = time.monotonic()
    result = subprocess.run(run.command, capture_output=True, text=True, cwd=ROOT)
    run.seconds = time.monotonic() - started
    # Exit 1 is a missed target (the table says which), unless the script
    # died of an exception, which also exits 1: keep its traceback then.
    failed = result.returncode not in (0, 1) or "Traceback (most recent call last)" in result.stderr
    run.output = result.stdout + (f"\n[stderr tail]\n{result.stderr[-2000:]}" if failed else "")
    run.status = result.returncode


# --- parsing the scripts' tables -----------------------------------------------------------------

_NUMBER = re.compile(r"(-?[\d,]+(?:\.\d+)?)\s*([kM]?)")


def number(text: str) -> float | None:
    match = _NUMBER.search(text)
    if match is None:
        return None
    value = float(match.group(1).replace(",", ""))
    return value * {"": 1, "k": 1e3, "M": 1e6}[match.group(2)]


def sweep_rows(runs: dict[int, Run], *labels: str, cells: int = 2
               ) -> list[tuple[int, list[list[str]]]]:
    """For each run of a sweep, in order of its size: the cells of its rows
    starting with each of ``labels``; runs missing one (or with fewer than
    ``cells`` cells in it) are left out."""
    found = []
    for size, run in sorted(runs.items()):
        rows = [row_cells(run.output, label) for label in labels]
        if all(row is not None and len(row) >= cells for row in rows):
            found.append((size, rows))
    return found


def row_cells(output: str, label: str) -> list[str] | None:
    """The cells (split on 2+ spaces) of the first table row starting with ``label``."""
    for line in output.splitlines():
        if line.strip().startswith(label):
            return re.split(r"\s{2,}", line.strip())
    return None


# --- plots ---------------------------------------------------------------------------------------


#: Printed under every plot: the machine, the date and the commands behind it.
CAPTION = {"machine": "", "date": ""}


def _caption(figure, runs: list[Run]) -> None:
    commands = "; ".join(run.shell_command for run in runs)
    figure.text(0.01, 0.01, f"{CAPTION['machine']}, {CAPTION['date']}\n{commands}",
                fontsize=6, color="dimgrey", va="bottom", wrap=True)
    figure.subplots_adjust(bottom=0.28)


def _finish(figure, axes, title: str, xlabel: str, ylabel: str, path: Path, *,
            save: bool = True, runs: list[Run] | None = None) -> str:
    """Label the axes; unless ``save`` is false, caption, save and close the figure.

    Returns the file name.
    """
    axes.set_title(title)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.legend(fontsize=8)
    axes.grid(alpha=0.3)
    if not save:
        return path.name
    figure.tight_layout()
    _caption(figure, runs or [])
    figure.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(figure)
    return path.name


def plot_memory(index_runs: dict[int, Run], out: Path) -> str:
    found = sweep_rows(index_runs, "memory per member", cells=5)
    sizes = [members for members, _ in found]
    native = [number(cells[2]) for _, (cells,) in found]
    redis = [number(cells[4]) if cells[4] != "-" else None for _, (cells,) in found]
    if not sizes:
        return "memory plot: no figures parsed"
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4))
    axes.plot(sizes, native, "o-", label="rankd native index (RSS growth)")
    if any(value is not None for value in redis):
        axes.plot(sizes, redis, "s--", label="Redis sorted set (used_memory)")
    axes.set_xscale("log")
    return _finish(figure, axes, "Memory per member", "members", "bytes per member",
                   out / "memory.png", runs=[run for _, run in sorted(index_runs.items())])


def plot_recovery(recovery_runs: dict[int, Run], out: Path) -> str:
    found = sweep_rows(recovery_runs, "recovery: Engine.open total")
    lengths = [events for events, _ in found]
    seconds = [number(cells[1]) for _, (cells,) in found]
    if not lengths:
        return "recovery plot: no figures parsed"
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4))
    axes.plot(lengths, seconds, "o-", label="snapshot of the same size + WAL tail")
    axes.axhline(5, color="grey", linestyle=":", label="target for 1M + 1M: 5 s")
    return _finish(figure, axes, "Recovery time against WAL length",
                   "WAL records replayed (and members in the snapshot)", "seconds to recover",
                   out / "recovery.png",
                   runs=[run for _, run in sorted(recovery_runs.items())])


def _pair(cell: str) -> tuple[float | None, float | None]:
    """``"2.57 / 0.79"`` -> (2.57, 0.79); a single figure -> (figure, None)."""
    parts = [number(part) for part in cell.split("/")]
    return parts[0], parts[1] if len(parts) > 1 else None


def plot_throughput(daemon_run: Run | None, out: Path) -> str:
    """Submissions/s and p99 latency against pipelining depth, rankd and Redis."""
    if daemon_run is None:
        return "throughput plot: not run"
    tcp: dict[int, list[str]] = {}
    with_ids: dict[int, list[str]] = {}
    benchmark: dict[int, list[str]] = {}
    rest = None
    aof: tuple[int, list[str]] | None = None
    for line in daemon_run.output.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) < 6:
            continue
        if match := re.fullmatch(r"TCP \d+ conns depth (\d+)( \(pipelined\))?", cells[0]):
            tcp[int(match.group(1))] = cells
        elif match := re.fullmatch(r"TCP \d+ conns depth (\d+)( \(pipelined\))?, event ids",
                                   cells[0]):
            with_ids[int(match.group(1))] = cells
        elif match := re.fullmatch(r"TCP \d+ conns depth (\d+)( \(pipelined\))?, redis AOF.*",
                                   cells[0]):
            aof = (int(match.group(1)), cells)
        elif match := re.match(r"redis-benchmark .*-P (\d+)", cells[0]):
            benchmark[int(match.group(1))] = cells
        elif cells[0].startswith("REST"):
            rest = cells
    if not tcp and not with_ids:
        return "throughput plot: no figures parsed"
    import matplotlib.pyplot as plt

    depths = sorted(set(tcp) | set(with_ids))
    figure, (rate_axes, latency_axes) = plt.subplots(1, 2, figsize=(10, 4))
    for rows, rankd_label, redis_label, styles in (
            (tcp, "rankd TCP", "Redis ZINCRBY, same generator", ("o-", "s--")),
            (with_ids, "rankd TCP, event ids", "Redis idempotent script, same generator",
             ("o-", "s-."))):
        kind_depths = sorted(rows)
        if not kind_depths:
            continue
        rate_axes.plot(kind_depths, [number(rows[d][1]) for d in kind_depths], styles[0],
                       label=rankd_label)
        latency_axes.plot(kind_depths, [_pair(rows[d][5])[0] for d in kind_depths], styles[0],
                          label=rankd_label)
        redis_depths = [d for d in kind_depths if rows[d][2] != "-"]
        if redis_depths:
            rate_axes.plot(redis_depths, [number(rows[d][2]) for d in redis_depths], styles[1],
                           label=redis_label)
            latency_axes.plot(redis_depths, [_pair(rows[d][5])[1] for d in redis_depths],
                              styles[1], label=redis_label)
    if benchmark:
        marks = sorted(benchmark)
        rate_axes.plot(marks, [number(benchmark[d][2]) for d in marks], "^:",
                       label="redis-benchmark ZINCRBY")
        latency_axes.plot(marks, [number(benchmark[d][5]) for d in marks], "^:",
                          label="redis-benchmark ZINCRBY")
    if aof is not None:
        rate_axes.plot([aof[0]], [number(aof[1][2])], "v", label="Redis with AOF everysec")
        latency_axes.plot([aof[0]], [_pair(aof[1][5])[1]], "v", label="Redis with AOF everysec")
    if rest is not None:
        rate_axes.plot([1], [number(rest[1])], "D", label="rankd REST (wrk, 64 conns)")
        latency_axes.plot([1], [number(rest[5])], "D", label="rankd REST (wrk, 64 conns)")
    for axes in (rate_axes, latency_axes):
        axes.set_xscale("log", base=2)
        axes.set_xticks(depths, [str(d) for d in depths])
    _finish(figure, latency_axes, "p99 latency", "requests in flight per connection",
            "ms", out / "throughput.png", save=False)
    return _finish(figure, rate_axes, "Submissions/s, 50 connections",
                   "requests in flight per connection", "submissions/s",
                   out / "throughput.png", runs=[daemon_run])


def plot_live(live_runs: dict[int, Run], out: Path) -> str:
    found = sweep_rows(live_runs, "delivery latency p50", "delivery latency p99")
    counts = [subscribers for subscribers, _ in found]
    p50 = [number(cells50[1]) for _, (cells50, _) in found]
    p99 = [number(cells99[1]) for _, (_, cells99) in found]
    if not counts:
        return "live plot: no figures parsed"
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4))
    axes.plot(counts, p50, "o-", label="p50")
    axes.plot(counts, p99, "s-", label="p99")
    axes.axhline(500, color="grey", linestyle=":", label="target p99: 500 ms")
    return _finish(figure, axes, "Live-feed delivery latency", "WebSocket subscribers",
                   "ms from acknowledgement to receipt", out / "live.png",
                   runs=[run for _, run in sorted(live_runs.items())])


# --- the report ----------------------------------------------------------------------------------


def plan(quick: bool) -> tuple[Plan, dict[str, dict[int, Run]]]:
    work = Plan()
    sweeps: dict[str, dict[int, Run]] = {"index": {}, "recovery": {}, "live": {}, "daemon": {}}
    if quick:
        sweeps["index"][20_000] = work.add("index, 20K members", "bench_index.py", "--quick")
        for size in (5_000, 20_000):
            sweeps["recovery"][size] = work.add(
                f"engine recovery, {size:,}", "bench_engine.py", "--only", "recovery",
                "--recovery-members", size, "--recovery-events", size)
        work.add("engine", "bench_engine.py", "--quick")
        work.add("snapshot stall", "bench_snapshot.py", "--members", 50_000, "--repeats", 1)
        work.add("restart after a crash", "bench_restart.py", "--members", 50_000, "--tail",
                 50_000, "--rounds", 1)
        work.add("dedupe stores", "bench_dedupe.py", "--sizes", 100_000, "--ops", 20_000,
                 "--repeats", 1)
        work.add("daemon memory", "bench_memory.py", "--members", 100_000, "--churn-seconds", 5)
        sweeps["daemon"][0] = work.add("daemon", "bench_daemon.py", "--quick", "--depths",
                                       "1,16")
        sweeps["live"][500] = work.add("live feed", "bench_live.py", "--quick")
        work.add("cluster", "bench_cluster.py", "--quick")
        work.add("redis protocol", "bench_resp.py", "--members", 100_000, "--rounds", 1,
                 "--requests", 20_000)
        work.add("rest against a bare aiohttp handler", "bench_rest.py", "--quick")
        work.add("loop pacer on and off", "bench_pacer.py", "--quick")
        return work, sweeps
    sweeps["index"][1_000_000] = work.add("index, 1M members", "bench_index.py")
    for members in (100_000, 5_000_000):
        sweeps["index"][members] = work.add(
            f"index memory, {members:,} members", "bench_index.py", "--members", members,
            "--ops", 50_000, "--repeats", 1, "--no-fallback")
    work.add("engine", "bench_engine.py", "--only", "ingest", "--only", "ack", "--only",
             "postgres")
    for size in (100_000, 300_000, 1_000_000):
        sweeps["recovery"][size] = work.add(
            f"engine recovery, {size:,}", "bench_engine.py", "--only", "recovery",
            "--recovery-members", size, "--recovery-events", size)
    work.add("snapshot stall", "bench_snapshot.py")
    work.add("restart after a crash", "bench_restart.py", "--members", 1_000_000, "--tail",
             1_000_000, "--rounds", 3)
    work.add("dedupe stores", "bench_dedupe.py")
    work.add("daemon memory", "bench_memory.py", "--churn-seconds", 60)
    sweeps["daemon"][0] = work.add("daemon", "bench_daemon.py", "--depths", "1,4,16,64")
    for subscribers in (1_000, 5_000, 10_000):
        sweeps["live"][subscribers] = work.add(
            f"live feed, {subscribers:,} subscribers", "bench_live.py", "--subscribers",
            subscribers)
    work.add("cluster log", "bench_cluster_log.py")
    work.add("cluster", "bench_cluster.py")
    work.add("redis protocol", "bench_resp.py")
    work.add("rest against a bare aiohttp handler", "bench_rest.py", "--resp")
    work.add("loop pacer on and off", "bench_pacer.py", "--rounds", 5, "--seconds", 1.5)
    return work, sweeps


def write_report(work: Plan, plots: list[str], started: datetime.datetime,
                 path: Path) -> None:
    lines = ["# Benchmark results\n\n",
             f"Machine: {machine()}  \n",
             f"Date: {started:%Y-%m-%d %H:%M} UTC; total {sum(r.seconds for r in work.runs):.0f} s"
             "  \n",
             "Produced by `python bench/run_all.py`; every figure below is the output of the "
             "command above it, unedited.  The machine is shared and noisy: compare figures "
             "within one run (side by side) rather than across runs.\n\n",
             "## Plots\n\n"]
    for plot in plots:
        lines.append(f"![{plot}]({plot})\n\n" if plot.endswith(".png") else f"- {plot}\n")
    for run in work.runs:
        lines.append(f"\n## {run.name}\n\n`{run.shell_command}` "
                     f"({run.seconds:.0f} s, exit {run.status})\n\n```\n{run.output.strip()}\n"
                     "```\n")
    path.write_text("".join(lines))


_SECTION = re.compile(r"^## (?P<name>[^\n]+)\n\n`python (?P<command>[^`]+)` \((?P<seconds>\d+) s, "
                      r"exit (?P<status>-?\d+)\)\n\n```\n(?P<output>.*?)\n```$",
                      re.MULTILINE | re.DOTALL)


def read_report(path: Path, work: Plan) -> datetime.datetime:
    """Fill ``work``'s runs from an earlier RESULTS.md (to redraw its plots)."""
    text = path.read_text()
    by_name = {match["name"]: match for match in _SECTION.finditer(text)}
    for run in work.runs:
        match = by_name.get(run.name)
        if match is None:
            raise SystemExit(f"{path} has no section {run.name!r}")
        run.output, run.seconds, run.status = (match["output"], float(match["seconds"]),
                                               int(match["status"]))
    date = re.search(r"^Date: (\d{4}-\d\d-\d\d \d\d:\d\d) UTC", text, re.MULTILINE)
    if date is None:
        raise SystemExit(f"{path} has no date line")
    return datetime.datetime.strptime(date[1], "%Y-%m-%d %H:%M").replace(tzinfo=datetime.UTC)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, to check the runner")
    parser.add_argument("--output", type=Path, default=HERE,
                        help="where RESULTS.md and the plots go (default: bench/)")
    parser.add_argument("--replot", action="store_true",
                        help="run nothing: redraw the plots (and rewrite RESULTS.md) from the "
                             "figures of the RESULTS.md already in --output")
    options = parser.parse_args(argv)
    try:  # before tens of minutes of benchmarks, not after them
        import matplotlib  # noqa: F401
    except ImportError:
        parser.error("the plots need matplotlib: pip install -e '.[bench]'")
    work, sweeps = plan(options.quick)
    if options.replot:
        started = read_report(options.output / "RESULTS.md", work)
    else:
        started = datetime.datetime.now(datetime.UTC)
        for run in work.runs:
            execute(run)
    CAPTION.update(machine=machine(), date=f"{started:%Y-%m-%d} UTC")
    options.output.mkdir(parents=True, exist_ok=True)
    daemon = next(iter(sweeps["daemon"].values()), None)
    plots = [plot_throughput(daemon, options.output),
             plot_memory(sweeps["index"], options.output),
             plot_recovery(sweeps["recovery"], options.output),
             plot_live(sweeps["live"], options.output)]
    write_report(work, plots, started, options.output / "RESULTS.md")
    print(f"wrote {options.output / 'RESULTS.md'} and {sum(p.endswith('.png') for p in plots)} "
          "plots", file=sys.stderr)
    return 0 if all(run.status in (0, 1) for run in work.runs) else 2


if __name__ == "__main__":
    sys.exit(main())
