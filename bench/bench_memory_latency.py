#!/usr/bin/env python3
"""What one dependent cache miss costs on this machine, by working-set size.

Why
---
A lookup on a big board is a chain of dependent misses (map slot, page,
name, then the towers of the walk to the rank): each load's address comes
from the one before, so no prefetch or out-of-order execution overlaps
them, and the chain's length times this figure is the floor under
``rank``'s latency (``bench_huge.py``).  This benchmark measures the figure
itself, with nothing of rankd in it.

How
---
A small C program (compiled here with ``cc``, skipped with a reason if
there is none) fills a buffer of ``--sizes`` MiB with one cycle of pointers
through every 64-byte line in a random order, and times a walk of
``--steps`` loads along it (each load's address is the one before's
value).  Each size runs twice: on 4 KiB pages (``MADV_NOHUGEPAGE``) and
on 2 MiB pages where the kernel grants them (``MADV_HUGEPAGE``; the
index's map, arena, towers and page heap ask for them on a big board),
since on a big working set a miss in the TLB adds a page walk to the
cache miss.  Output: nanoseconds per load, then, on 2 MiB pages, the p50
and p99 of chains of 1 to 8 dependent loads each timed alone (with
``clock_gettime``, whose own cost, some 20 ns, is in each figure): the
latency a lookup made of such a chain cannot beat on this machine.

::

    python bench/bench_memory_latency.py
    python bench/bench_memory_latency.py --sizes 1 8 64 512 4096
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

CHASE_C = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static uint64_t next(uint64_t *s) {  /* xorshift64 */
    *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17;
    return *s;
}

int main(int argc, char **argv) {
    size_t bytes = strtoull(argv[1], NULL, 10) << 20;
    int huge = atoi(argv[2]);
    long steps = atol(argv[3]);
    size_t lines = bytes / 64, i;
    uint64_t seed = 47;
    char *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    size_t *order = malloc(lines * sizeof(size_t));
    if (m == MAP_FAILED || order == NULL) return 1;
    madvise(m, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    for (i = 0; i < lines; i++) order[i] = i;
    for (i = lines - 1; i > 0; i--) {  /* Fisher-Yates */
        size_t j = next(&seed) % (i + 1), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    for (i = 0; i < lines; i++)
        *(char **)(m + order[i] * 64) = m + order[(i + 1) % lines] * 64;
    free(order);
    char *p = m;
    for (i = 0; i < lines && i < 1000000; i++) p = *(char **)p;  /* warm */
    double t0 = now_ns();
    for (long k = 0; k < steps; k++) p = *(char **)p;
    double t1 = now_ns();
    printf("%.1f %d\n", (t1 - t0) / steps, p == NULL);
    /* Chains of 1..8 dependent loads, each chain timed alone: the
       distribution a lookup that is such a chain cannot beat. */
    long samples = steps / 20;
    double *took = malloc(samples * sizeof(double));
    if (took == NULL) return 1;
    for (int len = 1; len <= 8; len++) {
        for (long s = 0; s < samples; s++) {
            double a = now_ns();
            for (int k = 0; k < len; k++) p = *(char **)p;
            took[s] = now_ns() - a;
        }
        qsort(took, samples, sizeof(double), cmp_double);
        printf("%d %.1f %.1f %d\n", len, took[samples / 2], took[samples * 99 / 100], p == NULL);
    }
    return 0;
}
"""


def compile_chase(directory: Path) -> Path | None:
    """The chase program built in ``directory``, or None without a compiler."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    source = directory / "chase.c"
    source.write_text(CHASE_C)
    binary = directory / "chase"
    subprocess.run([cc, "-O2", "-o", str(binary), str(source)], check=True)
    return binary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 8, 64, 512, 4096],
                        help="working sets, MiB")
    parser.add_argument("--steps", type=int, default=5_000_000, help="timed loads per run")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_memory_latency-") as tmp:
        binary = compile_chase(Path(tmp))
        if binary is None:
            print("skipped: no C compiler (cc or gcc) on PATH")
            return
        rows = []
        for size in args.sizes:
            row = {"mib": size}
            for label, huge in (("4k_ns", 0), ("2m_ns", 1)):
                done = subprocess.run([str(binary), str(size), str(huge), str(args.steps)],
                                      stdout=subprocess.PIPE, text=True, check=True)
                lines = done.stdout.splitlines()
                row[label] = float(lines[0].split()[0])
                row[label.replace("_ns", "_chains")] = {
                    int(length): {"p50_ns": float(p50), "p99_ns": float(p99)}
                    for length, p50, p99, _ in (line.split() for line in lines[1:])}
            rows.append(row)
            if not args.json:
                print(f"{size:>6} MiB: {row['4k_ns']:6.1f} ns a load on 4 KiB pages, "
                      f"{row['2m_ns']:6.1f} ns on 2 MiB pages", flush=True)
                for length, got in row["2m_chains"].items():
                    print(f"          chain of {length} on 2 MiB pages, timed alone: "
                          f"p50 {got['p50_ns']:6.0f} ns, p99 {got['p99_ns']:6.0f} ns", flush=True)
        if args.json:
            print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
