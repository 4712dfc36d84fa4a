#!/usr/bin/env bash
# The differential test of the direct table access (docs/table-access.md,
# "The differential test"): one throwaway cluster (wal_level = logical,
# prepared transactions, the library preloaded, the background workers off
# so that nothing but the sequence changes the tables) with a streaming
# standby made by pg_basebackup, and databases that get the same seeded
# random sequence of calls and are compared after every step (driver.py
# says what and how): `direct` and its references, `viasql`
# (idempotency.direct_table_access off) and, when DIFF_REFERENCES names it,
# `sqled` (the SQL edition). The primary is stopped with -m immediate and started again in
# the middle of the first seed's sequence; at the end the standby's copy of
# `direct` is compared with the primary's.
#
# Run as root after the extension is installed (make test does both); it
# builds and installs nothing. Settings: DIFF_PORT (54710; the standby takes
# the next port), DIFF_STEPS (10000, in total over the seeds), DIFF_SEEDS
# (1,2,3,4), DIFF_SECONDS (non-zero: random seeds until that much time has
# passed, DIFF_STEPS steps each; make fuzz), DIFF_INCLUDE_KNOWN (names of
# KNOWN_FIXED_ON_MAIN in driver.py to run too, comma-separated, or all),
# DIFF_CRASH (0: no stop -m immediate in the first seed), DIFF_REFERENCES
# (viasql; or sqled, or both comma-separated), DIFF_KEEP (non-empty: keep
# the cluster and its folder).
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../lib/common.sh"

port=${DIFF_PORT:-54710}
standby_port=$((port + 1))
steps=${DIFF_STEPS:-10000}
seeds=${DIFF_SEEDS:-1,2,3,4}
seconds=${DIFF_SECONDS:-0}
keep=${DIFF_KEEP:-}
bindir=$(pg_bindir)

dir=$(mktemp -d /tmp/idempotency-differential.XXXXXX) || exit 1
chown "$IDEM_OS_USER" "$dir"
cleanup() {
    if [ -n "$keep" ]; then
        echo "differential: kept $dir (ports $port, $standby_port)" >&2
        return
    fi
    [ -d "$dir/standby" ] && as_pg "$bindir/pg_ctl" -D "$dir/standby" -m immediate -w stop \
        >/dev/null 2>&1
    stop_cluster "$dir"
    rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log "differential: cluster in $dir, port $port (standby $standby_port)"
if ! start_cluster "$dir" "$port" \
    "wal_level = logical" \
    "max_prepared_transactions = 10" \
    "max_wal_senders = 4" \
    "max_replication_slots = 8" \
    "idempotency.worker_enabled = off" \
    "synchronous_standby_names = '*'" \
    "fsync = off" \
    "checkpoint_timeout = 1d" \
    "max_wal_size = 4GB" \
    "log_min_messages = warning" \
    "log_min_error_statement = panic"; then
    cat "$dir/server.log" >&2
    exit 1
fi
if ! as_pg "$bindir/pg_basebackup" -h "$dir" -p "$port" -U postgres -D "$dir/standby" -R \
    -X stream -c fast >/dev/null; then
    echo "differential: pg_basebackup failed" >&2
    exit 1
fi
printf "port = %s\nwal_retrieve_retry_interval = 100ms\n" "$standby_port" >>"$dir/standby/postgresql.conf"
if ! as_pg "$bindir/pg_ctl" -D "$dir/standby" -l "$dir/standby.log" -w start >/dev/null; then
    cat "$dir/standby.log" >&2
    exit 1
fi

# The driver runs from the cluster's folder: the OS user may not read the checkout.
cp "$here/driver.py" "$dir/driver.py" && chown "$IDEM_OS_USER" "$dir/driver.py"
args=(--host "$dir" --port "$port" --standby-port "$standby_port" --bindir "$bindir"
    --datadir "$dir/data" --logfile "$dir/server.log" --steps "$steps")
[ "${DIFF_CRASH:-1}" != 0 ] && args+=(--crash)
if [ "$seconds" != 0 ]; then
    args+=(--seconds "$seconds")
else
    args+=(--seeds "$seeds")
fi
[ -n "${DIFF_REFERENCES:-}" ] && args+=(--references "$DIFF_REFERENCES")
[ -n "${DIFF_INCLUDE_KNOWN:-}" ] && args+=(--include-known "$DIFF_INCLUDE_KNOWN")
(cd "$dir" && as_pg /usr/bin/python3 "$dir/driver.py" "${args[@]}" 2>&1) | tee "$dir/driver.out"
status=${PIPESTATUS[0]}
if [ "$status" -ne 0 ]; then
    echo "differential: the server's log ends with:" >&2
    tail -n 15 "$dir/server.log" >&2
    # What diverged again, last: it is what a reader of the end looks for.
    echo "differential: what failed:" >&2
    grep -A 8 -E 'DIVERGENCE|not reached|Traceback' "$dir/driver.out" | tail -n 40 >&2
fi
exit "$status"
