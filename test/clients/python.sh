#!/usr/bin/env bash
# The Python client's tests (clients/python, pytest) against a throwaway
# cluster: the package is installed with pip into a virtual environment
# that sees Debian's psycopg, FastAPI and pytest (no package index needed),
# then pytest runs from it. Exits non-zero on any failure. Needs the
# extension installed (make install).
# Settings: CLIENTS_PYTHON_PORT (54472, names the cluster's socket),
# EXAMPLE_KEEP=1 keeps the cluster's folder when a test fails.
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../../examples/lib/example.sh"
package=$(cd "$here/../../clients/python" && pwd)

example_start clients-python "${CLIENTS_PYTHON_PORT:-54472}" clients
log "clients/python: pip install into a virtual environment"
python=$(example_python) || example_fail "pip install failed"
log "clients/python: pytest"
# From the tests' folder, so that the installed package (not the source) is imported.
(cd "$package/tests" && example_run timeout 300 "$python" -m pytest -q -p no:cacheprovider \
    --rootdir "$package" -c "$package/pyproject.toml" .) || example_fail "clients/python tests failed"
