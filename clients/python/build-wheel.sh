#!/bin/sh
# Builds the package's wheel into OUTDIR (default: ./dist of the current
# folder) without writing anything into this folder: the sources are copied
# to a temporary folder and built there, by Debian's Python and its
# setuptools (python3-setuptools, python3-wheel, python3-pip) with no
# package index. PYTHON overrides the builder (one with setuptools >= 61).
# Prints the wheel's path. The wheel is pure Python: pip installs it into a
# virtual environment of any Python 3.9+ that has psycopg 3.
#
#   clients/python/build-wheel.sh [OUTDIR]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-dist}
mkdir -p "$out"
out=$(cd "$out" && pwd)
python=${PYTHON:-/usr/bin/python3}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/pg-idempotency-build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# Sources only: no caches, no earlier build products.
(cd "$here" && tar --exclude=__pycache__ --exclude=build --exclude=dist --exclude='*.egg-info' -cf - .) |
    (cd "$tmp" && tar -xf -)
PYTHONDONTWRITEBYTECODE=1 "$python" -m pip wheel --quiet --no-deps --no-build-isolation --no-index \
    --wheel-dir "$tmp/wheel" "$tmp" >"$tmp/pip.log" 2>&1 || { cat "$tmp/pip.log" >&2; exit 1; }
for wheel in "$tmp"/wheel/*.whl; do
    cp "$wheel" "$out/"
    echo "$out/$(basename "$wheel")"
done
