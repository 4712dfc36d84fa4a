#!/usr/bin/env bash
# Instructions per transaction, counted by valgrind (callgrind) instead of
# timed: the same figure on a quiet machine and on a busy one, so that two
# builds can be compared to within a fraction of a percent where timings
# vary by 20% from run to run. Each variant of the claim benchmarks (one_txn,
# duplicate, enqueue: the extension, PL/pgSQL or the plain INSERT, and the
# physical floor; the statements of test/bench/scripts/) runs as prepared
# statements in PostgreSQL's single-user mode, N1 and then N2 times; the
# difference divided by N2 - N1 leaves out the start and the shutdown.
# Prints Markdown on stdout: instructions per transaction and the ratios
# (baseline's instructions / the extension's: above 1, the extension does
# less work).
#
# To compare two builds, run it on each (the counts do not depend on the
# machine's load). Environment: INSTR_N1 (200), INSTR_N2 (1200),
# INSTR_PORT (54438). Run alone: it needs valgrind, which it installs.
set -u
. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/../lib/callgrind.sh"

n1=${INSTR_N1:-200}
n2=${INSTR_N2:-1200}
port=${INSTR_PORT:-54438}
here=$(cd "$(dirname "$0")" && pwd)

callgrind_cluster instructions "$port" || exit 1
cp "$here/baselines.sql" "$here/outbox_baselines.sql" "$dir/" && chmod 644 "$dir"/*.sql
as_pg "$bindir/psql" -h "$dir" -p "$port" -U postgres -d bench -X -q -v ON_ERROR_STOP=1 \
    -c "CREATE EXTENSION idempotency" -f "$dir/baselines.sql" -f "$dir/outbox_baselines.sql" \
    -c "SELECT bench.preload(10000)" -c "VACUUM ANALYZE" >/dev/null || exit 1
as_pg "$bindir/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null || exit 1

# statements SCENARIO VARIANT N: single-user mode input (one command per
# line), the statements of the pgbench scripts as prepared statements.
statements() {
    python3 - "$@" <<'PY'
import sys
scenario, variant, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
result = """'{"status": 200, "order": 42, "ok": true}'"""
payload = """'{"order": 42, "amount": 1999, "currency": "EUR"}'"""
claim = "idempotency.idem_claim($1, NULL, interval '30 seconds')"
prepared = {
    ("one_txn", "extension"): [f"SELECT (idempotency.idem_complete($1, ({claim}).token, {result})).outcome"],
    ("one_txn", "plpgsql"): ["SELECT (bench.plpgsql_complete($1, (bench.plpgsql_claim($1, "
                             f"interval '30 seconds')).token, {result})).outcome"],
    ("one_txn", "floor"): ["INSERT INTO bench.floor_keys (key) VALUES ($1)",
                           f"UPDATE bench.floor_keys SET result = {result} WHERE key = $1"],
    ("duplicate", "extension"): [f"SELECT outcome, result FROM {claim} WHERE outcome = 'completed'"],
    ("duplicate", "plpgsql"): ["SELECT outcome, result FROM bench.plpgsql_claim($1, interval '30 seconds') "
                               "WHERE outcome = 'completed'"],
    ("duplicate", "floor"): ["SELECT status, result FROM bench.idempotency_keys "
                             "WHERE scope = 'default' AND key = $1"],
    ("enqueue", "extension"): [f"SELECT idempotency.outbox_enqueue('orders', {payload}, $1)"],
    ("enqueue", "plain"): ["INSERT INTO bench.outbox (topic, key, payload, enqueued_at, available_at, "
                           f"updated_at, ready_at) VALUES ('orders', $1, {payload}, clock_timestamp(), "
                           "clock_timestamp(), clock_timestamp(), clock_timestamp()) RETURNING id"],
    ("enqueue", "floor"): [f"INSERT INTO bench.floor_outbox (topic, key, payload) VALUES ('orders', $1, {payload}) "
                           "RETURNING id"],
}[(scenario, variant)]
for i, statement in enumerate(prepared):
    print(f"PREPARE p{i}(text) AS {statement}")
for i in range(n):
    if scenario == "one_txn":
        key = f"n{n}-{i}"          # a new key each time
    elif scenario == "duplicate":
        key = str(1 + (i * 7919) % 10000)  # one of the preloaded keys
    else:
        key = str(1 + i % 1000)     # one of 1,000 outbox keys
    if len(prepared) > 1:
        print("BEGIN")
    for p in range(len(prepared)):
        print(f"EXECUTE p{p}('{key}')")
    if len(prepared) > 1:
        print("COMMIT")
PY
}

# instructions SCENARIO VARIANT N: the instructions of a single-user run.
instructions() {
    statements "$@" >"$dir/input.sql" || return 1
    single_user_instructions "$dir/data" "$dir/input.sql" "$dir/single.log" ||
        { echo "instructions: $1/$2 failed" >&2; return 1; }
}

declare -A per
for scenario in one_txn duplicate enqueue; do
    baseline=plpgsql
    [ "$scenario" = enqueue ] && baseline=plain
    for variant in extension "$baseline" floor; do
        log "instructions: $scenario/$variant"
        a=$(instructions "$scenario" "$variant" "$n1") || exit 1
        b=$(instructions "$scenario" "$variant" "$n2") || exit 1
        per[$scenario.$variant]=$(((b - a) / (n2 - n1)))
    done
done

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }
echo "| scenario | extension | PL/pgSQL or plain SQL | physical floor | baseline ÷ extension | floor ÷ extension |"
echo "|---|---:|---:|---:|---:|---:|"
for scenario in one_txn duplicate enqueue; do
    baseline=plpgsql
    [ "$scenario" = enqueue ] && baseline=plain
    e=${per[$scenario.extension]} p=${per[$scenario.$baseline]} f=${per[$scenario.floor]}
    echo "| $scenario | $e | $p ($baseline) | $f | $(ratio "$p" "$e") | $(ratio "$f" "$e") |"
done
echo
echo "Instructions per transaction (valgrind callgrind, single-user mode, $((n2 - n1)) transactions" \
    "counted; PostgreSQL $(as_pg "$bindir/postgres" --version | awk '{ print $3 }'))."
