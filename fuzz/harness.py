"""Running a fuzz target under atheris, and replaying its corpus without it.

A failure is an exception from the target (a crash, or a property that does
not hold), an input that takes more than :data:`HANG_SECONDS`, or memory
past :data:`RSS_LIMIT_MB`.  libFuzzer saves each failing input as
``crash-*``, ``timeout-*`` or ``oom-*`` in the artifacts folder; the corpus
keeps them under ``regressions/`` and :func:`replay` runs them all again.
"""

from __future__ import annotations

import contextlib
import faulthandler
import importlib
import math
import resource
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import NoReturn

from fuzz.targets import TARGETS

#: An input that takes longer is a hang.
HANG_SECONDS = 1.0
#: The most memory a target's process may use.
RSS_LIMIT_MB = 1024
ROOT = Path(__file__).resolve().parent
CORPUS = ROOT / "corpus"
#: Where long runs keep the corpus libFuzzer grows (not in the repository).
WORK = ROOT / ".work"


class Hang(Exception):
    """An input ran past :data:`HANG_SECONDS`."""


def target(name: str) -> ModuleType:
    if name not in TARGETS:
        raise SystemExit(f"unknown fuzz target {name!r}; targets: {', '.join(TARGETS)}")
    return importlib.import_module(f"fuzz.targets.{TARGETS[name]}")


def seeds(name: str) -> Path:
    return CORPUS / name


def regressions(name: str) -> Path:
    return CORPUS / name / "regressions"


def fuzz(name: str, *, runs: int = 0, seconds: float = 0, work: Path | None = None,
         artifacts: Path | None = None) -> NoReturn:
    """Fuzz ``name`` in this process (libFuzzer exits it): ``runs`` inputs
    and/or ``seconds`` (0: no limit), growing the corpus in ``work``."""
    import atheris

    module = target(name)
    with atheris.instrument_imports(include=module.INSTRUMENT):
        test_one = module.load()
    work = work or WORK / name
    artifacts = artifacts or regressions(name)
    work.mkdir(parents=True, exist_ok=True)
    artifacts.mkdir(parents=True, exist_ok=True)
    args = [sys.argv[0], str(work), str(seeds(name)),
            f"-timeout={math.ceil(HANG_SECONDS)}", f"-rss_limit_mb={RSS_LIMIT_MB}",
            f"-max_len={module.MAX_LEN}", f"-artifact_prefix={artifacts}/",
            "-print_final_stats=1"]
    if runs:
        args.append(f"-runs={runs}")
    if seconds:
        args.append(f"-max_total_time={max(1, int(seconds))}")
    atheris.Setup(args, test_one)
    atheris.Fuzz()
    raise SystemExit(0)  # not reached: libFuzzer exits


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise :class:`Hang` in Python code running past ``seconds``; a hang in
    native code (no Python to interrupt) dumps the stacks and exits."""

    def expired(signum: int, frame: object) -> None:
        raise Hang(f"over {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    faulthandler.dump_traceback_later(seconds * 5, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def corpus_files(name: str) -> list[Path]:
    return sorted(path for path in seeds(name).rglob("*")
                  if path.is_file() and not path.name.startswith("."))


def replay(names: list[str]) -> int:
    """Run every seed and regression case of ``names`` once, each under the
    hang limit; print each failure; 1 if any failed, else 0."""
    failed = 0
    for name in names:
        test_one: Callable[[bytes], None] = target(name).load()
        files = corpus_files(name)
        began = time.monotonic()
        for path in files:
            rss_before = _max_rss_mb()
            try:
                with deadline(HANG_SECONDS):
                    test_one(path.read_bytes())
            except Exception:
                failed += 1
                print(f"FAIL {name}: {path.relative_to(ROOT.parent)}", file=sys.stderr)
                traceback.print_exc()
                continue
            if _max_rss_mb() - rss_before > RSS_LIMIT_MB:
                failed += 1
                print(f"FAIL {name}: {path.relative_to(ROOT.parent)} grew memory past "
                      f"{RSS_LIMIT_MB} MiB", file=sys.stderr)
        print(f"{name}: replayed {len(files)} inputs in {time.monotonic() - began:.2f} s")
    return 1 if failed else 0


def _max_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
