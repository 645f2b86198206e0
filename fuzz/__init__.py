"""Coverage-guided fuzzing of rankd's parsers with atheris (libFuzzer).

One target per parser in :mod:`fuzz.targets`; seeds and regression cases in
``fuzz/corpus/<target>/``; ``python -m fuzz`` runs them (see fuzz/README.md).
"""
