"""``python -m fuzz``: run the fuzz targets (see fuzz/README.md).

    python -m fuzz all --minutes 10          every target, 10 minutes each
    python -m fuzz run resp --runs 20000     one target, in this process
    python -m fuzz replay [TARGET ...]       the corpus and regression cases, once
    python -m fuzz list
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from fuzz import harness
from fuzz.targets import TARGETS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fuzz", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = parser.add_subparsers(dest="action", required=True)
    every = actions.add_parser("all", help="fuzz every target in turn, each in its own process")
    every.add_argument("--minutes", type=float, default=0,
                       help="minutes per target (default: until --runs)")
    every.add_argument("--runs", type=int, default=0, help="inputs per target")
    one = actions.add_parser("run", help="fuzz one target in this process")
    one.add_argument("target", choices=sorted(TARGETS))
    one.add_argument("--runs", type=int, default=0, help="inputs to try (0: no limit)")
    one.add_argument("--seconds", type=float, default=0, help="time limit (0: none)")
    one.add_argument("--work", type=Path, help="the corpus grown (default fuzz/.work/TARGET)")
    one.add_argument("--artifacts", type=Path,
                     help="where failing inputs go (default fuzz/corpus/TARGET/regressions)")
    again = actions.add_parser("replay", help="run every corpus input once")
    again.add_argument("targets", nargs="*", metavar="TARGET", help="default: all")
    actions.add_parser("list", help="the targets")
    args = parser.parse_args(argv)

    if args.action == "list":
        for name, module in TARGETS.items():
            print(f"{name:6} fuzz/targets/{module}.py")
        return 0
    if args.action == "replay":
        return harness.replay(args.targets or list(TARGETS))
    if args.action == "run":
        harness.fuzz(args.target, runs=args.runs, seconds=args.seconds, work=args.work,
                     artifacts=args.artifacts)
    if not (args.minutes or args.runs):
        parser.error("all needs --minutes or --runs")
    failed = []
    for name in TARGETS:
        command = [sys.executable, "-m", "fuzz", "run", name, "--runs", str(args.runs),
                   "--seconds", str(args.minutes * 60)]
        print(f"== {name}: {' '.join(command[1:])}", flush=True)
        if subprocess.run(command, cwd=harness.ROOT.parent).returncode != 0:
            failed.append(name)
    if failed:
        print(f"failures in {', '.join(failed)}: the inputs are in "
              "fuzz/corpus/<target>/regressions/ (replay them with python -m fuzz replay)")
        return 1
    print("no failures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
