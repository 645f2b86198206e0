"""Build the native rank index.

All metadata lives in pyproject.toml; this file only declares the Cython
extension.  ``RANKD_DEBUG=1`` builds it with assertions and line tracing.
"""

import os

from Cython.Build import cythonize
from setuptools import Extension, setup

debug = os.environ.get("RANKD_DEBUG") == "1"

extension = Extension(
    "rankd._skiplist",
    sources=["src/rankd/_skiplist.pyx"],
    extra_compile_args=["-O0", "-g"] if debug else ["-O3"],
    define_macros=[("CYTHON_TRACE", "1")] if debug else [("NDEBUG", "1")],
)

# The WAL frame scanner checksums with zlib's crc32 (zlib.h comes with
# Python's own development headers on Debian: libpython3-dev needs zlib1g-dev).
frames = Extension(
    "rankd.engine._frames",
    sources=["src/rankd/engine/_frames.pyx"],
    libraries=["z"],
    extra_compile_args=extension.extra_compile_args,
    define_macros=extension.define_macros,
)

# Recovery's replay of SUBMIT records (see rankd.engine.replay).
replay = Extension(
    "rankd.engine._replay",
    sources=["src/rankd/engine/_replay.pyx"],
    extra_compile_args=extension.extra_compile_args,
    define_macros=extension.define_macros,
)

# The engine's ingest loop (see rankd.engine.ingest); it cimports the index
# (_skiplist.pxd), hence the include path.
ingest = Extension(
    "rankd.engine._ingest",
    sources=["src/rankd/engine/_ingest.pyx"],
    extra_compile_args=extension.extra_compile_args,
    define_macros=extension.define_macros,
)

# Submissions in packed form, filled by the TCP front-end's scanner.
packed = Extension(
    "rankd.engine._packed",
    sources=["src/rankd/engine/_packed.pyx"],
    extra_compile_args=extension.extra_compile_args,
    define_macros=extension.define_macros,
)

# The TCP protocol's fast path for plain submit requests.
submits = Extension(
    "rankd.frontends._submits",
    sources=["src/rankd/frontends/_submits.pyx"],
    extra_compile_args=extension.extra_compile_args,
    define_macros=extension.define_macros,
)

setup(
    ext_modules=cythonize(
        [extension, frames, replay, ingest, packed, submits],
        include_path=["src"],
        language_level="3",
        compiler_directives={
            "embedsignature": True,
            "linetrace": debug,
            "profile": False,
        },
    ),
)
