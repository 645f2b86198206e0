#!/bin/sh
# The install steps of the container image, in one script the Dockerfile runs
# and the tests run on a clean directory (no Docker daemon needed to check them).
#
#   deploy/install.sh wheels OUT_DIR          build rankd's wheel (native extensions
#                                             compiled with Cython) and its dependencies'
#   deploy/install.sh install WHEEL_DIR PREFIX  a virtual environment at PREFIX with
#                                             rankd from those wheels only (no network)
#   deploy/install.sh check PREFIX            the installed daemon runs every hot loop
#                                             natively
set -eu

here=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}

case "${1:-}" in
wheels)
    out=$(mkdir -p "$2" && cd "$2" && pwd)
    # From a copy without build leftovers: setuptools would reuse compiled
    # modules from a build/ directory, and would leave one in the sources.
    source=$(mktemp -d)
    trap 'rm -rf "$source"' EXIT
    tar -C "$here" --exclude=./build --exclude=./.venv --exclude=./.git \
        --exclude='*.so' --exclude=node_modules --exclude=test-artifacts -cf - . \
        | tar -C "$source" -xf -
    "$python" -m pip wheel --quiet --wheel-dir "$out" "$source"
    ;;
install)
    wheels=$2
    prefix=$3
    "$python" -m venv "$prefix"
    "$prefix/bin/pip" install --quiet --no-index --find-links "$wheels" rankd
    ;;
check)
    prefix=$2
    "$prefix/bin/python" - <<'PY'
from rankd._native import implementations
parts = implementations()
slow = sorted(part for part, kind in parts.items() if kind != "native")
if slow:
    raise SystemExit(f"not native: {', '.join(slow)}")
print("native:", ", ".join(sorted(parts)))
PY
    ;;
*)
    echo "usage: $0 wheels OUT_DIR | install WHEEL_DIR PREFIX | check PREFIX" >&2
    exit 2
    ;;
esac
