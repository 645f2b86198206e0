"""Build rankd's native modules.

All metadata lives in pyproject.toml; this file only declares the Cython
extensions.  ``RANKD_DEBUG=1`` builds them with assertions and line tracing.
Each has a pure-Python twin chosen when it is not built (see rankd._native),
so, as msgpack and aiohttp do, a machine without a C compiler still
installs rankd: the build warns and goes on without the native modules.
``RANKD_REQUIRE_NATIVE=1`` (CI) makes a failed build an error instead.
"""

import os
import sys

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, CompileError, ExecError, PlatformError

debug = os.environ.get("RANKD_DEBUG") == "1"
require_native = os.environ.get("RANKD_REQUIRE_NATIVE", "") not in ("", "0")
BUILD_ERRORS = (CCompilerError, CompileError, ExecError, PlatformError, OSError)


#: Modules compiled at once (Cython's translation and the C compiler's), so
#: an install (``pip install``, the image's wheel build) uses every core.
JOBS = os.cpu_count() or 1


class OptionalBuildExt(build_ext):
    """``build_ext`` that leaves a module out, with a warning, when it cannot
    be compiled (no compiler, no Python headers), and that compiles the
    modules in parallel unless told otherwise (``--parallel``)."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if not self.parallel:
            self.parallel = JOBS

    def run(self) -> None:
        try:
            super().run()
        except BUILD_ERRORS as exc:
            self._without(exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except BUILD_ERRORS as exc:
            self._without(exc, ext.name)

    @staticmethod
    def _without(exc: Exception, name: str = "the native modules") -> None:
        if require_native:
            raise exc
        print(f"WARNING: rankd: cannot build {name} ({exc}); installing without it: the "
              "pure-Python fallback is used, several times slower.  Install a C compiler "
              "and Python's headers (Debian: build-essential python3-dev) and reinstall "
              "for the native speed.", file=sys.stderr)


def native(name: str, **options: object) -> Extension:
    """The extension ``rankd.<name>``, from ``src/rankd/<name as a path>.pyx``."""
    return Extension(
        f"rankd.{name}",
        sources=[f"src/rankd/{name.replace('.', '/')}.pyx"],
        # _doubles.h (Redis 7.2's d2string) and the fpconv it includes.
        include_dirs=["src/rankd/engine"],
        extra_compile_args=["-O0", "-g"] if debug else ["-O3"],
        define_macros=[("CYTHON_TRACE", "1")] if debug else [("NDEBUG", "1")],
        **options,
    )


extensions = [
    # The rank index (its C declarations in _skiplist.pxd, for other modules).
    native("_skiplist"),
    # The compact paged rank index (issue 47); tests and bench_index.py --pages use it,
    # the daemon's default (rankd.index.kinds).
    native("_pages"),
    # The WAL's framing and frame scanner; they checksum with zlib's crc32
    # (zlib.h comes with Python's development headers on Debian).
    native("engine._frames", libraries=["z"]),
    # The dedupe table's store, compact: fingerprints, 24-byte records (see
    # rankd.engine.idstore); it cimports the index's SipHash.
    native("engine._idstore"),
    # Recovery's replay of SUBMIT records (see rankd.engine.replay).
    native("engine._replay"),
    # The ingest loop (see rankd.engine.ingest); it cimports the index.
    native("engine._ingest"),
    # Submissions in packed form, filled by the TCP front-end's scanner.
    native("engine._packed"),
    # Plain sorted-set reads answered natively (for the RESP front-end).
    native("engine._reads"),
    # The packed path's intake: its checks and this pass's runs.
    native("engine._intake"),
    # The TCP protocol's fast path for plain submit requests.
    native("frontends._submits"),
    # The RESP front-end's request scanner and fast path for plain writes.
    native("frontends.resp._scanner"),
    # Pipelined pops in packed form, removed, logged and answered natively.
    native("frontends.resp._pops"),
    # The TCP and RESP connections' hot paths (their first bases).
    native("frontends._lanes"),
    # The REST hot route's native ingest of a plain submission's JSON body.
    native("frontends._rest"),
    # The REST hot route's native member reads (answers as JSON bytes).
    native("frontends._rest_reads"),
    # MONITOR's quoting of a command's words (Redis's sdscatrepr).
    native("frontends.resp._monitor"),
]

setup(
    cmdclass={"build_ext": OptionalBuildExt},
    ext_modules=cythonize(
        extensions,
        include_path=["src"],  # for cimports between the modules
        nthreads=JOBS,
        language_level="3",
        compiler_directives={
            "embedsignature": True,
            "linetrace": debug,
            "profile": False,
        },
    ),
)
