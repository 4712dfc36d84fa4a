#!/usr/bin/env bash
# Stress test: fencing under real lease takeovers.
#
# 16 pgbench clients race on 50 keys per 2-second round with leases of
# 30-80 ms and work of 0-150 ms, so leases run out under live workers and
# other clients take the keys over. Each delivery claims a key (transaction 1),
# works, then writes its side effect and completes in one transaction
# (transaction 2) through stress_complete(), which catches only IK001: a
# fenced late worker's effect rolls back with it. 10% of the deliveries fail
# retryably instead (also fenced), and every successful completion is followed
# by a duplicate delivery that must be replayed.
#
# Afterwards: at most one effect per key; every COMPLETED key has exactly one
# effect, of its completing token; no effect for a key that is not COMPLETED;
# no lease generation granted twice; takeovers and fenced workers really
# happened; no 23505 and no unexpected error anywhere; pgbench had no failed
# transaction and no aborted client. Prints a summary table; exits 0 only when
# every check holds. Run as root after the extension is installed; it builds
# and installs nothing. Settings: STRESS_PORT, STRESS_SECONDS, STRESS_CLIENTS.
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../lib/common.sh"

port=${STRESS_PORT:-54410}
seconds=${STRESS_SECONDS:-20}
clients=${STRESS_CLIENTS:-16}
threads=2
db=stress
started=$SECONDS

dir=$(mktemp -d /tmp/idempotency-stress.XXXXXX) || exit 1
cleanup() {
    stop_cluster "$dir"
    rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

bindir=$(pg_bindir)
psql_stress() {
    as_pg "$bindir/psql" -X -q -h "$dir" -p "$port" -U postgres -d "$db" -v ON_ERROR_STOP=1 "$@"
}

log "stress: cluster in $dir, port $port"
if ! start_cluster "$dir" "$port" \
    "max_connections = 50" \
    "log_line_prefix = '%m [%p] %e '" \
    "log_min_messages = warning" \
    "log_min_error_statement = error"; then
    echo "stress: could not start the cluster" >&2
    cat "$dir/server.log" >&2 2>/dev/null
    exit 1
fi

# Scripts go into the cluster's folder, which the postgres OS user owns.
cp "$here/setup.sql" "$here/worker.pgbench" "$here/check.sql" "$dir/" &&
    chown "$IDEM_OS_USER" "$dir"/*.sql "$dir/worker.pgbench" || exit 1

as_pg "$bindir/createdb" -h "$dir" -p "$port" -U postgres "$db" || exit 1
psql_stress -f "$dir/setup.sql" || { echo "stress: setup failed" >&2; exit 1; }

log "stress: pgbench, $clients clients, $threads threads, ${seconds}s"
bench_start=$SECONDS
as_pg "$bindir/pgbench" -n -h "$dir" -p "$port" -U postgres -c "$clients" -j "$threads" \
    -T "$seconds" -f "$dir/worker.pgbench" "$db" >"$dir/pgbench.out" 2>&1
bench_status=$?
bench_seconds=$((SECONDS - bench_start))

if ! psql_stress -At -F '|' -f "$dir/check.sql" >"$dir/check.out" 2>&1; then
    echo "stress: checks could not run:" >&2
    cat "$dir/check.out" >&2
    echo "'checks ran'|no|FAIL" >"$dir/check.out"
fi

out=$dir/pgbench.out
transactions=$(sed -nE 's/^number of transactions actually processed: ([0-9]+).*/\1/p' "$out")
failed_tx=$(sed -nE 's/^number of failed transactions: ([0-9]+).*/\1/p' "$out")
tps=$(sed -nE 's/^tps = ([0-9.]+).*/\1/p' "$out" | head -n 1)
aborted=$(grep -cE 'client [0-9]+ .*aborted' "$out")
unique_client=$(grep -cE '23505|duplicate key value' "$out")
unique_server=$(grep -cE ' 23505 |duplicate key value' "$dir/server.log")
server_errors=$(grep -cE ' (ERROR|FATAL|PANIC): ' "$dir/server.log")

rows=()
verdict() {  # verdict NAME VALUE CONDITION(ok when true)
    if [ "$3" = true ]; then rows+=("$1|$2|ok"); else rows+=("$1|$2|FAIL"); fi
}
is() { if eval "$1"; then echo true; else echo false; fi; }
verdict "pgbench exit status" "$bench_status" "$(is '[ "$bench_status" -eq 0 ]')"
verdict "pgbench transactions" "${transactions:-?}" "$(is '[ "${transactions:-0}" -gt 0 ]')"
verdict "pgbench failed transactions" "${failed_tx:-?}" "$(is '[ "${failed_tx:-1}" -eq 0 ]')"
verdict "pgbench aborted clients" "$aborted" "$(is '[ "$aborted" -eq 0 ]')"
verdict "23505 seen by clients or in the server log" "$((unique_client + unique_server))" \
    "$(is '[ $((unique_client + unique_server)) -eq 0 ]')"
verdict "unexpected server errors (ERROR/FATAL/PANIC)" "$server_errors" "$(is '[ "$server_errors" -eq 0 ]')"
while IFS= read -r line; do rows+=("$line"); done <"$dir/check.out"
rows+=("tps|${tps:-?}|info" "pgbench seconds|$bench_seconds|info"
    "total seconds|$((SECONDS - started))|info")

failures=0
echo
echo "idempotency stress test: $clients clients, 50 keys per 2 s round, leases 30-80 ms, work 0-150 ms"
printf '%-60s %-26s %s\n' "check / figure" "value" "verdict"
printf '%-60s %-26s %s\n' "--------------" "-----" "-------"
for row in "${rows[@]}"; do
    IFS='|' read -r name value mark <<<"$row"
    printf '%-60s %-26s %s\n' "$name" "$value" "$mark"
    [ "$mark" = FAIL ] && failures=$((failures + 1))
done
echo

if [ "$failures" -ne 0 ]; then
    echo "stress: FAILED ($failures checks)"
    echo "--- pgbench output"
    cat "$out"
    echo "--- server log (errors)"
    grep -E ' (ERROR|FATAL|PANIC): ' -A 3 "$dir/server.log" | head -n 60
    exit 1
fi
echo "stress: passed"
exit 0
