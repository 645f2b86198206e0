"""The paged index out of memory: a write that finds no memory raises
MemoryError and leaves the index as it was (or, where it cannot, in a
state ``_check()`` accepts), and the index goes on working once memory is
back.

Each case runs in a child process, since the ways to make allocations fail
(an address-space limit, an ``LD_PRELOAD`` shim that fails one chosen
``realloc``) would fail the test runner's own allocations too.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import native

pytestmark = pytest.mark.usefixtures("paged_module")


@pytest.fixture(scope="module")
def paged_module():
    return native("rankd._pages", "RankIndex")


def run_child(script: str, env: dict[str, str] | None = None) -> str:
    """Run ``script`` in a fresh interpreter; its stdout (it must exit 0)."""
    result = subprocess.run([sys.executable, "-X", "dev", "-c", textwrap.dedent(script)],
                            capture_output=True, text=True, timeout=300,
                            env={**os.environ, **(env or {})})
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return result.stdout


def test_an_update_that_finds_no_memory_leaves_the_member_as_it_was() -> None:
    # An update takes the member's entry out and puts a new one in; the
    # new one can need a page (a split).  Under an address-space limit the
    # board is filled until a write fails, then members are moved until
    # one update fails: it must keep its old score, and the board must
    # stay whole (its map slot was left pending, the member lost, and a
    # later removal walking over the slot read far past the page table).
    out = run_child("""
        import random, resource
        from rankd._pages import RankIndex
        rnd = random.Random(1)
        def address_space():
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("VmSize"):
                        return int(line.split()[1]) * 1024
        ix = RankIndex("desc", "first", page_size=4)
        members = [f"p{i}" for i in range(40000)]
        for m in members:
            ix.set(m, rnd.randrange(10**6))
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (address_space() + 2**20, hard))
        n = refused = 0
        while refused < 3:  # (the first refusal may be the interpreter's own)
            try:
                ix.set(f"new{n}", rnd.randrange(10**6))
                n += 1
            except MemoryError:
                refused += 1
        while ix._map_state()[1]:
            ix.set("new0", ix.score("new0"))
        failed = 0
        for k in range(200000):
            m = rnd.choice(members)
            before, length = ix.score(m), len(ix)
            try:
                ix.set(m, rnd.randrange(10**6))
            except MemoryError:
                assert ix.score(m) == before and len(ix) == length, (m, ix.score(m), before)
                failed += 1
                if failed == 20:
                    break
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        ix._check()
        for i in range(3000):
            m = rnd.choice(members)
            if rnd.random() < 0.3:
                ix.remove(m)
            else:
                ix.set(m, rnd.randrange(10**6))
        ix._check()
        print("failed updates", failed)
    """)
    assert int(out.split()[-1]) >= 1, out


FAIL_SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stddef.h>
static void *(*real_realloc)(void *, size_t);
static size_t fail_size;
static int fail_nth;
/* After arm(size, nth), the nth realloc(NULL, size) from then on fails. */
void arm(size_t size, int nth) { fail_size = size; fail_nth = nth; }
void *realloc(void *p, size_t n) {
    if (!real_realloc) real_realloc = (void *(*)(void *, size_t))dlsym(RTLD_NEXT, "realloc");
    if (fail_nth > 0 && p == NULL && n == fail_size && --fail_nth == 0) {
        errno = ENOMEM;
        return NULL;
    }
    return real_realloc(p, n);
}
"""


@pytest.fixture(scope="module")
def fail_shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the allocation-failure shim")
    folder = tmp_path_factory.mktemp("shim")
    (folder / "failshim.c").write_text(FAIL_SHIM)
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", str(folder / "failshim.so"),
                    str(folder / "failshim.c"), "-ldl"], check=True, timeout=120)
    return folder / "failshim.so"


@pytest.mark.parametrize(("size", "nth"), [(128, 1), (64, 1), (128, 2)],
                         ids=["first keys", "free numbers", "pages"])
def test_a_clear_whose_page_table_finds_no_memory_leaves_a_working_index(
        fail_shim: Path, size: int, nth: int) -> None:
    # clear() makes a fresh page table of 16 numbers (first keys 128
    # bytes, free numbers 64, pages 128); any of them failing left a table
    # of no room that the next pages were written past.
    out = run_child(f"""
        import ctypes
        from rankd._pages import RankIndex
        shim = ctypes.CDLL({str(fail_shim)!r})
        ix = RankIndex("desc", "first", page_size=4)
        for i in range(100):
            ix.set(f"a{{i}}", i)
        shim.arm(ctypes.c_size_t({size}), {nth})
        ix.clear()
        shim.arm(ctypes.c_size_t(0), 0)
        assert len(ix) == 0
        for i in range(5000):
            ix.set(f"b{{i}}", i % 700)
        for i in range(0, 5000, 2):
            ix.remove(f"b{{i}}")
        ix._check()
        assert len(ix) == 2500 and len(ix._pages()) > 500
        print("ok")
    """, env={"LD_PRELOAD": str(fail_shim)})
    assert out.strip() == "ok"
