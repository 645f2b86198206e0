"""Build rankd's native modules.

All metadata lives in pyproject.toml; this file only declares the Cython
extensions.  ``RANKD_DEBUG=1`` builds them with assertions and line tracing.
Each has a pure-Python twin chosen when it is not built (see rankd._native).
"""

import os

from Cython.Build import cythonize
from setuptools import Extension, setup

debug = os.environ.get("RANKD_DEBUG") == "1"


def native(name: str, **options: object) -> Extension:
    """The extension ``rankd.<name>``, from ``src/rankd/<name as a path>.pyx``."""
    return Extension(
        f"rankd.{name}",
        sources=[f"src/rankd/{name.replace('.', '/')}.pyx"],
        extra_compile_args=["-O0", "-g"] if debug else ["-O3"],
        define_macros=[("CYTHON_TRACE", "1")] if debug else [("NDEBUG", "1")],
        **options,
    )


extensions = [
    # The rank index (its C declarations in _skiplist.pxd, for other modules).
    native("_skiplist"),
    # The WAL's framing and frame scanner; they checksum with zlib's crc32
    # (zlib.h comes with Python's development headers on Debian).
    native("engine._frames", libraries=["z"]),
    # The dedupe table's store (see rankd.engine.dedupe); it cimports the
    # index's SipHash.
    native("engine._dedupe"),
    # Recovery's replay of SUBMIT records (see rankd.engine.replay).
    native("engine._replay"),
    # The ingest loop (see rankd.engine.ingest); it cimports the index.
    native("engine._ingest"),
    # Submissions in packed form, filled by the TCP front-end's scanner.
    native("engine._packed"),
    # The TCP protocol's fast path for plain submit requests.
    native("frontends._submits"),
]

setup(
    ext_modules=cythonize(
        extensions,
        include_path=["src"],  # for cimports between the modules
        language_level="3",
        compiler_directives={
            "embedsignature": True,
            "linetrace": debug,
            "profile": False,
        },
    ),
)
