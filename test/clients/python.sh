#!/usr/bin/env bash
# The Python client's tests (clients/python, pytest) against a throwaway
# cluster. First the packaging: clients/python/build-wheel.sh builds the
# wheel with Debian's Python, out of the tree (the folder's files are the
# same before and after, checked), and pip installs the wheel, without a
# package index, into a virtual environment that sees Debian's psycopg,
# FastAPI, Flask, Django, uvicorn and pytest; where another Python 3.11+ is
# on PATH (a pyenv build, say), the wheel is installed into a venv of that
# one too and claims a key. Then pytest runs from the first venv, with the
# burst tests under uvicorn. Exits non-zero on any failure. Needs the
# extension installed (make install).
# Settings: CLIENTS_PYTHON_PORT (54472, names the cluster's socket),
# EXAMPLE_KEEP=1 keeps the cluster's folder when a test fails.
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../../examples/lib/example.sh"
package=$(cd "$here/../../clients/python" && pwd)

manifest() { (cd "$package" && find . -print | LC_ALL=C sort && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha1sum); }

example_start clients-python "${CLIENTS_PYTHON_PORT:-54472}" clients "max_connections = 200"
manifest >"$EXAMPLE_DIR/before.txt"
# A database whose extension is not updated yet (0.6.0, served by this
# library): the client must work there as well (tests/test_old_extension.py).
# (The C++ extension's versions; the SQL edition starts at 0.7.0.)
if [ "$IDEM_EDITION" = cpp ]; then
    example_sql -d postgres -c 'CREATE DATABASE clients_old OWNER app' >/dev/null &&
        example_sql -d clients_old -c "CREATE EXTENSION idempotency VERSION '0.6.0'" \
            -c "SELECT idempotency.grant_application('app')" >/dev/null ||
        example_fail "could not create the database with extension 0.6.0"
    export OLD_DATABASE=clients_old
fi

log "clients/python: build-wheel.sh, out of the tree"
wheel=$(cd "$EXAMPLE_DIR" && "$package/build-wheel.sh" "$EXAMPLE_DIR/dist") || example_fail "build-wheel.sh failed"
manifest >"$EXAMPLE_DIR/built.txt"
if ! diff -u "$EXAMPLE_DIR/before.txt" "$EXAMPLE_DIR/built.txt" >&2; then
    example_fail "building the wheel wrote into clients/python"
fi
echo "ok - the wheel ($(basename "$wheel")) built with nothing written into clients/python"

log "clients/python: pip install of the wheel into a virtual environment"
venv=$EXAMPLE_DIR/venv
/usr/bin/python3 -m venv --system-site-packages "$venv" &&
    "$venv/bin/pip" install --no-index --quiet "$wheel" >"$EXAMPLE_DIR/pip.log" 2>&1 ||
    { cat "$EXAMPLE_DIR/pip.log" >&2; example_fail "pip install of the wheel failed"; }

other=$(command -v python3)
if [ -n "$other" ] && [ "$(readlink -f "$other")" != "$(readlink -f /usr/bin/python3)" ] &&
    "$other" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    log "clients/python: the wheel into a venv of $("$other" --version 2>&1)"
    # That Python gets psycopg from Debian's site-packages (pure Python), as
    # a venv of it would from its own index.
    "$other" -m venv "$EXAMPLE_DIR/venv-other" &&
        site=$("$EXAMPLE_DIR/venv-other/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') &&
        echo /usr/lib/python3/dist-packages >"$site/debian-psycopg.pth" &&
        "$EXAMPLE_DIR/venv-other/bin/python" -m pip install --no-index --quiet "$wheel" >"$EXAMPLE_DIR/pip-other.log" 2>&1 &&
        "$EXAMPLE_DIR/venv-other/bin/python" - <<'PY' || { cat "$EXAMPLE_DIR/pip-other.log" >&2; example_fail "the wheel does not work in $other"; }
import sys, uuid
import psycopg
import pg_idempotency as idem
with psycopg.connect() as conn:
    job = idem.run_once(conn, f"other-python-{uuid.uuid4()}", lambda job: {"python": sys.version.split()[0]})
assert job.outcome == "completed", job.outcome
print(f"ok - the wheel installed and claimed a key under Python {job.result['python']}")
PY
else
    echo "ok - # SKIP no other Python 3.11+ on PATH to install the wheel into"
fi

log "clients/python: pytest"
# From the tests' folder, so that the installed package (not the source) is imported.
(cd "$package/tests" && example_run timeout 400 "$venv/bin/python" -m pytest -q -p no:cacheprovider -rs \
    --rootdir "$package" -c "$package/pyproject.toml" .) || example_fail "clients/python tests failed"
manifest >"$EXAMPLE_DIR/after.txt"
diff -u "$EXAMPLE_DIR/before.txt" "$EXAMPLE_DIR/after.txt" >&2 || example_fail "the tests wrote into clients/python"
