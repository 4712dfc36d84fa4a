# Shared by the examples' check.sh scripts (sourced, bash): a throwaway
# PostgreSQL cluster with the extension, an application role and database,
# background processes that are stopped on exit, and the cluster removed.
#
# The cluster listens only on a Unix socket in its own temporary folder and
# runs as the unprivileged `postgres` OS user (PostgreSQL refuses root). The
# extension must already be installed (make install); nothing is built here.
#
#   example_start NAME PORT DB [postgresql.conf line ...]
#       starts the cluster and creates role `app` (LOGIN, with the rights of
#       grant_application and grant_relay only) and database DB owned by it, with the extension;
#       exports PGHOST, PGPORT, PGDATABASE and PGUSER=app for the clients.
#       With IDEM_EDITION=sql, the SQL edition instead (docs/managed-postgres.md):
#       no library preloaded, CREATE EXTENSION idempotency_sql.
#   example_extension        the extension of the edition: idempotency or idempotency_sql
#   example_psql ARGS...     psql as the application role on DB
#   example_sql ARGS...      psql as the superuser on DB (for setup and checks)
#   example_bg LOG CMD...    runs CMD in the background, output in LOG; its pid
#                            is stopped (TERM, then KILL) on exit
#   example_run CMD...       runs CMD and waits for it; its status. (In the
#                            background, so that a signal reaches the trap at once.)
#   example_stop PID [SECS]  TERM, wait up to SECS (5), then KILL; its status
#   example_wait_for SECS CMD...  polls CMD every 0.1 s until it succeeds
#   example_fail MSG         prints MSG and the logs, exits 1
#   example_python           prints the python of a virtual environment (made
#                            once per cluster) that sees Debian's packages and
#                            has the Python client (clients/python) installed
#                            by pip, without a package index

EXAMPLE_LIB=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$EXAMPLE_LIB/../../test/lib/common.sh"

EXAMPLE_PSQL="$(pg_bindir)/psql"
EXAMPLE_DIR=""
EXAMPLE_PIDS=()
EXAMPLE_LOGS=()

example_cleanup() {
    local status=$? pid
    trap - EXIT INT TERM
    for pid in "${EXAMPLE_PIDS[@]}"; do
        kill -0 "$pid" 2>/dev/null && example_stop "$pid" 5 >/dev/null 2>&1
    done
    if [ -n "$EXAMPLE_DIR" ]; then
        stop_cluster "$EXAMPLE_DIR"
        if [ "$status" -ne 0 ] && [ -n "${EXAMPLE_KEEP:-}" ]; then
            echo "outputs kept in $EXAMPLE_DIR" >&2
        else
            rm -rf "$EXAMPLE_DIR"
        fi
    fi
    exit "$status"
}
trap example_cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

IDEM_EDITION=${IDEM_EDITION:-cpp}
example_extension() { if [ "$IDEM_EDITION" = sql ]; then echo idempotency_sql; else echo idempotency; fi; }

example_start() {
    local name=$1 port=$2 db=$3; shift 3
    [ "$IDEM_EDITION" = sql ] && set -- "$@" "shared_preload_libraries = ''"
    export IDEM_EDITION
    # Clients talk to the cluster over its socket, other services over
    # loopback: no proxy in between.
    unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY all_proxy ALL_PROXY
    export PYTHONDONTWRITEBYTECODE=1     # leave no __pycache__ beside the examples
    EXAMPLE_DIR=$(mktemp -d "/tmp/idempotency-example-$name.XXXXXX") || exit 1
    log "$name: cluster in $EXAMPLE_DIR (port $port)"
    if ! start_cluster "$EXAMPLE_DIR" "$port" "fsync = off" "log_min_messages = warning" "$@"; then
        cat "$EXAMPLE_DIR/server.log" >&2 2>/dev/null
        example_fail "could not start the cluster"
    fi
    export PGHOST=$EXAMPLE_DIR PGPORT=$port PGDATABASE=$db PGUSER=app
    EXAMPLE_LOGS+=("$EXAMPLE_DIR/server.log")
    "$EXAMPLE_PSQL" -X -q -v ON_ERROR_STOP=1 -U postgres -d postgres >/dev/null <<SQL || example_fail "setup failed"
CREATE ROLE app LOGIN;
CREATE DATABASE $db OWNER app;
\c $db
CREATE EXTENSION $(example_extension);
-- The functions, not the tables: keys, inbox, locks and enqueue, and the
-- outbox's claim, ack and nack for the workers that consume it as a queue.
SELECT idempotency.grant_application('app');
SELECT idempotency.grant_relay('app');
SQL
}

example_psql() { "$EXAMPLE_PSQL" -X -q -v ON_ERROR_STOP=1 "$@"; }
example_sql() { "$EXAMPLE_PSQL" -X -q -At -v ON_ERROR_STOP=1 -U postgres "$@"; }

example_bg() {
    local out=$1; shift
    "$@" >"$out" 2>&1 &
    EXAMPLE_PIDS+=($!)
    EXAMPLE_LOGS+=("$out")
}

example_run() {
    "$@" &
    EXAMPLE_PIDS+=($!)
    wait "$!"
}

example_stop() {
    local pid=$1 limit=${2:-5}
    kill -TERM "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null; return; }
    local deadline=$((SECONDS + limit))
    while kill -0 "$pid" 2>/dev/null; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            kill -KILL "$pid" 2>/dev/null
            wait "$pid" 2>/dev/null
            return 124
        fi
        sleep 0.1
    done
    wait "$pid"
}

example_wait_for() {
    local limit=$1; shift
    local deadline=$((SECONDS + limit))
    until "$@"; do
        [ "$SECONDS" -ge "$deadline" ] && return 1
        sleep 0.1
    done
}

example_python() {
    local venv=$EXAMPLE_DIR/venv
    if [ ! -x "$venv/bin/python" ]; then
        # A copy, so that the build leaves nothing beside the sources.
        /usr/bin/python3 -m venv --system-site-packages "$venv" &&
            cp -r "$EXAMPLE_LIB/../../clients/python" "$EXAMPLE_DIR/pg-idempotency" &&
            "$venv/bin/pip" install --no-index --no-build-isolation --quiet "$EXAMPLE_DIR/pg-idempotency" \
                >"$EXAMPLE_DIR/pip.log" 2>&1 || { cat "$EXAMPLE_DIR/pip.log" >&2; return 1; }
    fi
    echo "$venv/bin/python"
}

example_fail() {
    local file
    echo "FAILED: $*" >&2
    for file in "${EXAMPLE_LOGS[@]}"; do
        [ -s "$file" ] || continue
        echo "--- last lines of $file" >&2
        tail -n 25 "$file" >&2
    done
    exit 1
}
