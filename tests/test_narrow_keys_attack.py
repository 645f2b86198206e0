"""Attacks on the paged index's narrow (int32) keys and their widening to
f64: each test is named for the defect it found."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import rankd

SRC = Path(rankd.__file__).resolve().parent.parent


#: Defined in each child: a write refused for want of a page number (the
#: page table limited to the numbers in use), then the freed memory reused.
_REFUSED = """
def refused(index, member, score, seq=None):
    for limit in range(len(index._pages()), 10_000):
        try:
            index._limit_pages(limit)  # the page numbers in use, no more
            break
        except ValueError:
            pass
    try:
        index.set(member, score, seq=seq)
    except OverflowError:
        return [bytearray(4096) for _ in range(2000)]
    raise SystemExit("the write was not refused")
"""


def _run(code: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter (a use-after-free may kill it)."""
    script = _REFUSED + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-X", "faulthandler", "-c", script],
                          env={"PYTHONPATH": str(SRC), "PYTHONMALLOC": "debug"},
                          capture_output=True, text=True, timeout=60)


def test_refused_write_that_widened_keys_leaves_iterators_on_freed_pages() -> None:
    """A write refused for want of a page number (OverflowError) once
    widened the pages first and moved none of the index's change count, so an iterator
    or a dump in chunks begun before it walks freed pages (a crash, or
    garbage).  It must go on as if nothing happened, or refuse to
    (RuntimeError) as after any change."""
    done = _run("""
        from rankd._pages import RankIndex
        index = RankIndex("desc", "first", page_size=4)
        for i in range(200):
            index.set(f"m{i}", i)
        expected = list(index)[1:]
        whole = index.dump()
        walk = iter(index)
        next(walk)
        chunks = index.dump_chunks(64)
        pieces = [next(chunks)]
        junk = refused(index, "new", 0.5)
        try:
            print("walk", list(walk) == expected)
        except RuntimeError:
            print("walk refused")
        try:
            pieces.extend(chunks)
            print("chunks", b"".join(pieces) == whole)
        except RuntimeError:
            print("chunks refused")
        """)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "False" not in done.stdout, done.stdout


def test_refused_write_that_widened_seqs_leaves_iterators_on_freed_pages() -> None:
    """The same through the seq widening the key widening shares
    (``_rewiden_seqs`` now): a write with the first seq past 2^32 - 1, refused for
    want of a page number, moved every page under an iterator."""
    done = _run("""
        from rankd._pages import RankIndex
        index = RankIndex("asc", "first", page_size=4)
        for i in range(200):
            index.set(f"m{i}", i)
        expected = list(index)[1:]
        walk = iter(index)
        next(walk)
        junk = refused(index, "new", 7, 2**32)
        try:
            print("walk", list(walk) == expected)
        except RuntimeError:
            print("walk refused")
        """)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "False" not in done.stdout, done.stdout
