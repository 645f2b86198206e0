"""Attacks on the name arena a board's paged indexes share (rankd._pages.Names).

Each test is named for the defect it found.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap

from rankd._pages import Names, RankIndex

import rankd

#: The sources this test imported (the child runs the same build).
SRC = os.path.dirname(os.path.dirname(os.path.abspath(rankd.__file__)))


def _run(code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (a crash must not take pytest down)."""
    env = dict(os.environ, PYTHONPATH=SRC, PYTHONMALLOC="debug")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=60)


def test_index_freed_by_the_garbage_collector_leaves_the_arena() -> None:
    # An index only a reference cycle kept (a frame held by a traceback, a
    # list holding itself) is freed by the collector, whose tp_clear of the
    # index used to drop its arena before __dealloc__ could leave it: the
    # arena kept listing freed memory as one of its indexes.
    arena = Names()
    kept = RankIndex(names=arena)
    kept.set("a", 1.0)
    gone = RankIndex(names=arena)
    gone.set("a", 2.0)
    cycle: list = [gone]
    cycle.append(cycle)
    del gone, cycle
    gc.collect()
    assert arena.indexes == 1
    assert list(kept) == [("a", 1.0)]


def test_writes_after_an_index_freed_by_the_garbage_collector_do_not_crash() -> None:
    # The sibling's writes look members up in every index of the arena,
    # the freed one included: a read of freed memory (a segfault).
    result = _run("""
        import gc
        from rankd._pages import Names, RankIndex
        arena = Names()
        kept = RankIndex(names=arena, page_size=4)
        for i in range(100):
            kept.set(f"m{i}", i)
        gone = RankIndex(names=arena, page_size=4)
        for i in range(50):
            gone.set(f"m{i}", i)
        cycle = [gone]
        cycle.append(cycle)
        del gone, cycle
        gc.collect()
        junk = [bytes(200) for _ in range(10000)]
        for i in range(100, 300):
            kept.set(f"m{i}", i)
        for i in range(0, 300, 2):
            kept.remove(f"m{i}")
        kept._check()
        assert [m for m, _ in kept] == [f"m{i}" for i in range(299, 0, -2)]
        print("ok")
    """)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "ok"


def _churn(index: RankIndex, writes: int) -> None:
    """Writes to ``index`` (each a compaction step, if one is under way)."""
    for t in range(writes):
        index.set("churn", float(t))
        index.remove("churn")


def test_records_of_a_cleared_index_are_reclaimed_in_a_small_arena() -> None:
    # A cleared (or retired) index leaves its records to the compaction,
    # which an arena below 32 KiB never started: 3000 records no index
    # lists stayed stored (and counted by live_names()) forever, however
    # many writes followed; a small board kept up to 32 KiB of names of
    # members gone.
    arena = Names()
    retired = RankIndex(names=arena)
    kept = RankIndex(names=arena)
    for i in range(3000):
        retired.set(f"a{i}", float(i))
    kept.set("k", 1.0)
    retired.clear()
    _churn(kept, 20000)
    kept._check()
    assert arena._state()[0] == 1  # "k"'s record only
    assert list(kept) == [("k", 1.0)]


def test_records_of_a_freed_index_are_reclaimed_in_a_small_arena() -> None:
    arena = Names()
    kept = RankIndex(names=arena, page_size=4)
    kept.set("k", 1.0)
    for r in range(50):  # periods opened and retired
        period = RankIndex(names=arena, page_size=4)
        for i in range(40):
            period.set(f"r{r}-{i}", float(i))
        kept.set(f"r{r}-0", 0.0)  # one member of each stays listed
        del period
    _churn(kept, 20000)
    kept._check()
    assert arena._state()[0] == len(kept) == 51
    assert sorted(m for m, _ in kept) == sorted(["k"] + [f"r{r}-0" for r in range(50)])
