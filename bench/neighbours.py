"""Other benchmarks running on the machine, for the sharing notes of a report.

Two benchmarks sharing two cores skew each other's figures; each script
lists the ``bench_*.py`` processes that are not its own before and after
measuring, and says so under its table.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path


def other_benchmarks() -> list[str]:
    """``bench_*.py`` processes running now that are not this one, an ancestor,
    one of its workers (``--worker``) or in its process group (its children,
    a ``| tee`` beside it); each as ``pid command`` cut to 120 characters."""
    mine = {os.getpid()}
    pid = os.getppid()
    while pid > 1 and pid not in mine:
        mine.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    listed = subprocess.run(["pgrep", "-fa", "bench_"], capture_output=True, text=True,
                            check=False).stdout.splitlines()
    return [line[:120] for line in listed
            if int(line.split()[0]) not in mine and "--worker" not in line
            and re.search(r"bench_\w+\.py", line) and not _same_group(int(line.split()[0]))]


def _same_group(pid: int) -> bool:
    try:
        return os.getpgid(pid) == os.getpgrp()
    except OSError:
        return False
