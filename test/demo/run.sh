#!/usr/bin/env bash
# `make demo`: at-least-once delivery made to happen once in effect.
#
# Installs what is missing, builds and installs the extension, starts a
# throwaway cluster (library preloaded, Unix socket only) in a temporary
# folder, runs the scenario in test/demo/demo.py against it, and removes
# everything on exit: on success, on failure and on Ctrl-C.
# The exit status is the scenario's: non-zero when its proof fails.
#   DEMO_PORT          port of the throwaway cluster (default: one no other
#                      cluster of this machine uses; it names the socket file)
#   DEMO_SEED          seed of the simulated broker's faults (default fixed)
#   DEMO_VERBOSE=1     print every delivery, not only the interesting ones
set -u
. "$(dirname "$0")/../lib/common.sh"

# A port nothing listens on now, TCP or Unix socket under the usual folders.
free_port() {
    local candidate
    for candidate in $(shuf -i 20000-60000 -n 50); do
        [ -e "/var/run/postgresql/.s.PGSQL.$candidate" ] && continue
        [ -e "/tmp/.s.PGSQL.$candidate" ] && continue
        (exec 3<>"/dev/tcp/127.0.0.1/$candidate") 2>/dev/null && continue
        echo "$candidate"
        return 0
    done
    return 1
}
port=${DEMO_PORT:-$(free_port)} || { echo "no free port found" >&2; exit 1; }
dir=""
demo_pid=""

cleanup() {
    local status=$?
    trap - EXIT INT TERM
    if [ -n "$demo_pid" ] && kill -0 "$demo_pid" 2>/dev/null; then
        kill -TERM "$demo_pid" 2>/dev/null  # it stops its workers, then exits
        wait "$demo_pid" 2>/dev/null
    fi
    if [ -n "$dir" ]; then
        stop_cluster "$dir"
        rm -rf "$dir"
    fi
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# IDEM_SKIP_BUILD=1: use what is installed (the repeated runs of test/demo/repeat.sh).
if [ -z "${IDEM_SKIP_BUILD:-}" ]; then
    ensure_packages || exit 1
    build_and_install || exit 1
fi

dir=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-demo.XXXXXX")
log "starting a throwaway cluster in $dir (port $port)"
if ! start_cluster "$dir" "$port" \
    "max_connections = 40" \
    "fsync = off" \
    "idempotency.naptime = 200ms" \
    "idempotency.launcher_naptime = 1s"; then
    echo "could not start the demo cluster; its log:" >&2
    cat "$dir/server.log" >&2 2>/dev/null
    exit 1
fi
as_pg "$(pg_bindir)/createdb" -h "$dir" -p "$port" -U postgres shop || exit 1

# In the background so that Ctrl-C reaches this shell's trap at once.
/usr/bin/python3 "$IDEM_ROOT/test/demo/demo.py" --host "$dir" --port "$port" --dbname shop \
    ${DEMO_SEED:+--seed "$DEMO_SEED"} ${DEMO_VERBOSE:+--verbose} &
demo_pid=$!
wait "$demo_pid"
status=$?
demo_pid=""
if [ "$status" -ne 0 ] && [ "$status" -ne 130 ]; then
    echo "-- last lines of the server log --" >&2
    tail -n 20 "$dir/server.log" >&2
fi
exit "$status"
