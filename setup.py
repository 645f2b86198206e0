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

setup(
    ext_modules=cythonize(
        [extension],
        language_level="3",
        compiler_directives={
            "embedsignature": True,
            "linetrace": debug,
            "profile": False,
        },
    ),
)
