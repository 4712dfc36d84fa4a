#!/usr/bin/env bash
# The chaos test: an at-least-once job pipeline of real processes under
# SIGKILLs, payment and mail API timeouts and an immediate PostgreSQL
# restart, and the proof that every job took effect exactly once, and every
# step of its 3-step jobs too, each takeover resuming after the last
# recorded step (see chaos.py).
#
#   test/chaos/run.sh            short form (25 s of load, 1 restart; ~30-35 s in all)
#   test/chaos/run.sh --long     long form (4.5 min of load, 5 restarts; ~5 min)
#
# Run as root after the extension is installed (make install); it builds and
# installs nothing and uses only paths relative to itself (the step workers
# import the Python client from clients/python/src). It starts a throwaway
# cluster (library preloaded, Unix socket only) and the mock payment and mail
# APIs on 127.0.0.1, and removes every process and the temporary folder on
# exit. Prints each check (ok/FAIL), a summary table and the count of resumed
# takeovers; the exit status is non-zero on any violation.
# Settings: CHAOS_SECONDS (seconds of load; overrides the form), CHAOS_SEED
# (default: random, printed), CHAOS_PORT (54450), CHAOS_KEEP=1 (keep the
# folder with the logs).
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../lib/common.sh"

long=""
for arg in "$@"; do
    case $arg in
        --long) long=1 ;;
        *) echo "usage: $0 [--long]" >&2; exit 2 ;;
    esac
done
if [ -n "$long" ]; then
    seconds=${CHAOS_SECONDS:-270}; restarts=5; drain=90
else
    seconds=${CHAOS_SECONDS:-25}; restarts=1; drain=40
fi
port=${CHAOS_PORT:-54450}
seed=${CHAOS_SEED:-$(( (RANDOM << 15) | RANDOM ))}
python=/usr/bin/python3
bindir=$(pg_bindir)
api_pids=()
chaos_pid=""

# Loopback only: no proxy between the workers and the mock API.
unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY all_proxy ALL_PROXY
# No __pycache__ next to the scripts.
export PYTHONDONTWRITEBYTECODE=1

dir=$(mktemp -d /tmp/idempotency-chaos.XXXXXX) || exit 1
chmod 755 "$dir"
cleanup() {
    local status=$?
    trap - EXIT INT TERM
    if [ -n "$chaos_pid" ] && kill -0 "$chaos_pid" 2>/dev/null; then
        kill -TERM "$chaos_pid" 2>/dev/null   # its workers and producers die with it
        local _
        for _ in $(seq 1 50); do kill -0 "$chaos_pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$chaos_pid" 2>/dev/null
        wait "$chaos_pid" 2>/dev/null
    fi
    local pid
    for pid in "${api_pids[@]}"; do
        kill -KILL "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    done
    stop_cluster "$dir"
    if [ -n "${CHAOS_KEEP:-}" ]; then
        echo "chaos: outputs kept in $dir" >&2
    else
        rm -rf "$dir"
    fi
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

sharedir=$("$(pg_config_path)" --sharedir)
if [ ! -f "$sharedir/extension/idempotency.control" ]; then
    echo "chaos: the extension is not installed (run make install first)" >&2
    exit 1
fi

log "chaos: cluster in $dir, port $port, seed $seed (CHAOS_SEED=$seed to repeat)"
# fsync = off: the test kills processes, not the machine; what a commit wrote
# is in the page cache and survives an immediate shutdown.
if ! start_cluster "$dir" "$port" \
    "max_connections = 60" \
    "fsync = off" \
    "log_line_prefix = '%m [%p] %e '" \
    "log_min_messages = warning" \
    "idempotency.naptime = '200ms'" \
    "idempotency.launcher_naptime = '1s'" \
    "idempotency.max_attempts = 1000" \
    "idempotency.outbox_max_attempts = 1000" \
    "idempotency.retry_base_delay = '100ms'" \
    "idempotency.retry_max_delay = '1s'"; then
    echo "chaos: could not start the cluster; its log:" >&2
    cat "$dir/server.log" >&2 2>/dev/null
    exit 1
fi
as_pg "$bindir/createdb" -h "$dir" -p "$port" -U postgres chaos || exit 1

mkdir -p "$dir/logs"
# start_api RESOURCE TIMEOUT-RATE: a mock provider on a free port of
# 127.0.0.1, written to $dir/RESOURCE.port.
start_api() {
    local resource=$1 timeout_rate=$2 _
    $python "$here/mock_api.py" --resource "$resource" --port-file "$dir/$resource.port" --seed "$seed" \
        --error-rate 0.04 --timeout-rate "$timeout_rate" --timeout-sleep 1.0 2>"$dir/logs/$resource.err" &
    api_pids+=($!)
    for _ in $(seq 1 100); do [ -s "$dir/$resource.port" ] && break; sleep 0.1; done
    if [ ! -s "$dir/$resource.port" ]; then
        echo "chaos: the mock API of $resource did not start" >&2
        cat "$dir/logs/$resource.err" >&2
        return 1
    fi
}
start_api charges 0.05 || exit 1
start_api emails 0.2 || exit 1

# In the background so that a signal reaches this shell's trap at once.
$python "$here/chaos.py" --host "$dir" --port "$port" --dbname chaos \
    --datadir "$dir/data" --server-log "$dir/server.log" --bindir "$bindir" \
    --os-user "$IDEM_OS_USER" --api "http://127.0.0.1:$(cat "$dir/charges.port")" \
    --mail-api "http://127.0.0.1:$(cat "$dir/emails.port")" \
    --logdir "$dir/logs" --seed "$seed" --seconds "$seconds" --restarts "$restarts" \
    --drain-seconds "$drain" &
chaos_pid=$!
wait "$chaos_pid"
status=$?
chaos_pid=""
if [ "$status" -ne 0 ]; then
    echo "-- last lines of the server log --" >&2
    tail -n 30 "$dir/server.log" >&2
fi
exit "$status"
