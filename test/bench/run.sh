#!/usr/bin/env bash
# `make bench`: the extension against what a user would write by hand,
# measured side by side in one run on one throwaway cluster with durable
# commits.
#
# claim (test/bench/baselines.sql): the claim/complete path against
# hand-written plain SQL and PL/pgSQL. Scenarios (each script execution is
# one pgbench "transaction"):
#   one_txn    BEGIN; claim a new key; complete it; COMMIT
#   two_txn    claim a new key (commits), then complete it (commits)
#   duplicate  claim of one of 10000 preloaded COMPLETED keys -> completed + result
#
# The outbox (test/bench/outbox_baselines.sql):
#   enqueue    outbox_enqueue(topic, payload, key), by default and with
#              idempotency.outbox_notify = off, against an INSERT of the same
#              row into bench.outbox (the same columns and indexes as
#              idempotency.outbox) and into bench.outbox_pk (primary key only)
#   relay      events delivered per second by relays that claim 100 events and
#              ack them in one transaction per batch, while producers enqueue,
#              with a pre-filled backlog: outbox_claim + outbox_ack against a
#              hand-written SKIP LOCKED loop on bench.outbox
#   churn      sizes of idempotency.outbox and its indexes, dead tuples and
#              HOT updates at the start, middle and end of an
#              enqueue/claim/ack/purge run, and of idempotency.idempotency_keys
#              under claim/complete/purge (idem_maintenance() every second,
#              outbox_retention and retention 5s)
#
# Environment: BENCH_SECONDS (10) per pgbench run, BENCH_CLIENTS ("1 4 16"),
# BENCH_ROUNDS (1): with more, the variants are run that many times,
# interleaved in rotating order, and the median is reported (on a shared
# or noisy machine single runs vary by 20% and more); BENCH_OUTBOX_ROUNDS
# (BENCH_ROUNDS) the same for the enqueue and relay comparisons; BENCH_OUT
# (bench-results.md in the current directory) for the Markdown tables,
# BENCH_PORT (54430), BENCH_SECTIONS ("claim enqueue relay churn"),
# BENCH_RELAYS ("1 2 4") relay clients, BENCH_PRODUCERS (4) enqueuing
# clients beside them, BENCH_PRODUCER_RATE (500) events/s those producers
# enqueue in all (the same load for both variants; 0: as fast as they can),
# BENCH_BACKLOG (200000) pending events before each relay run,
# BENCH_CHURN_SECONDS (60) per churn run. Benchmarks never fail a
# build: the exit status is non-zero only when something could not run.
set -u
. "$(dirname "$0")/../lib/common.sh"

here=$(cd "$(dirname "$0")" && pwd)
seconds=${BENCH_SECONDS:-10}
clients_list=${BENCH_CLIENTS:-"1 4 16"}
rounds=${BENCH_ROUNDS:-1}
outbox_rounds=${BENCH_OUTBOX_ROUNDS:-$rounds}
port=${BENCH_PORT:-54430}
out=${BENCH_OUT:-bench-results.md}
case "$out" in /*) ;; *) out="$PWD/$out" ;; esac
sections=${BENCH_SECTIONS:-"claim enqueue relay churn"}
relays_list=${BENCH_RELAYS:-"1 2 4"}
producers=${BENCH_PRODUCERS:-4}
producer_rate=${BENCH_PRODUCER_RATE:-500}
backlog=${BENCH_BACKLOG:-200000}
churn_seconds=${BENCH_CHURN_SECONDS:-60}
churn_relays=2
preload=10000
scenarios="one_txn two_txn duplicate"
variants="extension plain plpgsql"
enqueue_variants="extension plain pk_only"
relay_variants="extension plain"
enqueue_target=0.85  # enqueue within 15% of the plain INSERT
relay_target=1.00    # relays deliver at least as fast as the hand-written loop

for section in $sections; do
    case "$section" in
    claim | enqueue | relay | churn) ;;
    *) echo "bench: unknown section '$section' in BENCH_SECTIONS" >&2; exit 1 ;;
    esac
done
want() { case " $sections " in *" $1 "*) return 0 ;; esac; return 1; }

ensure_packages || exit 1
build_and_install || exit 1
bindir=$(pg_bindir)

dir=$(mktemp -d /tmp/idempotency-bench.XXXXXX)
cleanup() { stop_cluster "$dir"; rm -rf "$dir"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

log "starting a throwaway cluster on port $port"
if ! start_cluster "$dir" "$port" \
    "shared_buffers = 256MB" \
    "synchronous_commit = on" \
    "max_wal_size = 4GB" \
    "max_connections = 100"; then
    echo "bench: could not start the cluster" >&2
    cat "$dir/server.log" >&2 2>/dev/null
    exit 1
fi

# The scripts must be readable by the OS user that runs pgbench.
mkdir -p "$dir/scripts"
cp "$here"/scripts/*.sql "$here/baselines.sql" "$here/outbox_baselines.sql" "$dir/scripts/"
chown -R "$IDEM_OS_USER" "$dir/scripts"

psql_bench() {
    as_pg "$bindir/psql" -h "$dir" -p "$port" -U postgres -d bench -X -q -A -t \
        -v ON_ERROR_STOP=1 "$@"
}

as_pg "$bindir/createdb" -h "$dir" -p "$port" -U postgres bench || exit 1
psql_bench -c "CREATE EXTENSION idempotency" || exit 1
psql_bench -f "$dir/scripts/baselines.sql" || exit 1
psql_bench -f "$dir/scripts/outbox_baselines.sql" || exit 1
version=$(psql_bench -c "SHOW server_version")

# pgbench_run LABEL LOGFILE CLIENTS SECONDS SCRIPT [pgbench options]: prints
# the tps, or "failed". Its sessions get the settings in $pgbench_pgoptions
# (PGOPTIONS syntax), when set.
pgbench_run() {
    local label=$1 logf=$2 clients=$3 secs=$4 script=$5 jobs status tps
    shift 5
    jobs=$((clients < 2 ? clients : 2))
    as_pg env PGOPTIONS="${pgbench_pgoptions:-}" "$bindir/pgbench" -h "$dir" -p "$port" \
        -U postgres -n -T "$secs" -c "$clients" -j "$jobs" -M prepared "$@" \
        -f "$dir/scripts/$script.sql" bench >"$logf" 2>&1
    status=$?
    tps=$(sed -nE 's/^tps = ([0-9.]+) \(without initial connection time\).*/\1/p' "$logf")
    if [ "$status" -ne 0 ] || [ -z "$tps" ] || grep -q 'aborted' "$logf"; then
        echo "bench: $label with $clients clients failed:" >&2
        tail -n 20 "$logf" >&2
        echo failed
        return
    fi
    printf '%.0f\n' "$tps"
}

median() {  # median of the arguments; "failed" when any run failed
    case " $* " in *" failed "*) echo failed; return ;; esac
    printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END {
        if (NR % 2) print v[(NR + 1) / 2]; else printf "%.0f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

ratio() {  # ratio A B: A/B with two decimals, or "-"
    case "$1$2" in *failed*) echo "-"; return ;; esac
    awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f\n", a / b; else print "-" }'
}

verdict() {  # verdict RATIO TARGET: "met" when RATIO >= TARGET
    case "$1" in -) echo "-"; return ;; esac
    awk -v r="$1" -v t="$2" 'BEGIN { print (r >= t ? "met" : "MISSED") }'
}

failures=0

# ------------------------------------------------------------------ claim

# Every run starts from the same state: both tables truncated, the same
# preloaded COMPLETED keys, fresh statistics, and a checkpoint.
reset_tables() {
    psql_bench -c "TRUNCATE idempotency.idempotency_keys, bench.idempotency_keys" \
        -c "SELECT bench.preload($preload)" \
        -c "VACUUM ANALYZE idempotency.idempotency_keys" \
        -c "VACUUM ANALYZE bench.idempotency_keys" \
        -c "CHECKPOINT" >/dev/null
}

# run_one SCENARIO VARIANT CLIENTS: prints the tps, or "failed".
run_one() {
    local scenario=$1 variant=$2 clients=$3
    if ! reset_tables; then echo failed; return; fi
    pgbench_run "$scenario/$variant" "$dir/$scenario.$variant.c$clients.log" "$clients" \
        "$seconds" "${scenario}_${variant}" -D n=0
}

{
    echo "# idempotency benchmark"
    echo
} >"$out"

if want claim; then
    rows=()
    for scenario in $scenarios; do
        for clients in $clients_list; do
            declare -A runs=() tps=()
            read -ra order <<<"$variants"
            for ((round = 1; round <= rounds; round++)); do
                for variant in "${order[@]}"; do
                    log "$scenario, $clients clients, $variant (${seconds}s, round $round/$rounds)"
                    result=$(run_one "$scenario" "$variant" "$clients")
                    [ "$result" = failed ] && failures=$((failures + 1))
                    runs[$variant]="${runs[$variant]:-} $result"
                done
                order=("${order[@]:1}" "${order[0]}")  # rotate, so no variant always goes first
            done
            for variant in $variants; do
                # shellcheck disable=SC2086
                tps[$variant]=$(median ${runs[$variant]})
                [ "$rounds" -gt 1 ] && log "$scenario, $clients clients, $variant: tps per round${runs[$variant]}"
            done
            rows+=("$scenario|$clients|${tps[extension]}|${tps[plain]}|${tps[plpgsql]}|$(ratio "${tps[extension]}" "${tps[plain]}")|$(ratio "${tps[extension]}" "${tps[plpgsql]}")")
            unset runs tps
        done
    done

    hot=$(psql_bench -F ' ' -c "SELECT relid::regclass, n_tup_upd, n_tup_hot_upd
        FROM pg_stat_user_tables WHERE relname = 'idempotency_keys' ORDER BY 1")

    header="scenario|clients|extension tps|plain SQL tps|PL/pgSQL tps|ext/plain|ext/plpgsql"
    echo
    echo "idempotency benchmark: PostgreSQL $version, $(nproc) cores, ${seconds}s per run," \
        "$rounds round(s) (median), pgbench -M prepared, synchronous_commit = on, shared_buffers = 256MB"
    {
        echo "$header"
        printf '%s\n' "${rows[@]}"
    } | awk -F'|' '{ printf "%-10s %7s %14s %14s %13s %10s %12s\n", $1, $2, $3, $4, $5, $6, $7 }'
    echo
    echo "updates over all runs (HOT share):"
    echo "$hot" | awk '{ printf "  %-34s %10d updates, %5.1f%% HOT\n", $1, $2, ($2 ? 100 * $3 / $2 : 0) }'

    {
        echo "$(date -u '+%Y-%m-%d %H:%M UTC'), PostgreSQL $version, $(nproc) cores;" \
            "pgbench -n -M prepared -T $seconds, -j min(clients, 2); median of $rounds round(s);" \
            "synchronous_commit = on, shared_buffers = 256MB;" \
            "tables truncated, $preload completed keys preloaded and a checkpoint before every run."
        echo
        echo "- one_txn: BEGIN; claim a new key; complete it; COMMIT"
        echo "- two_txn: claim a new key (commit), then complete it (commit)"
        echo "- duplicate: claim of a completed key, answered \`completed\` with the stored result"
        echo
        echo "| ${header//|/ | } |"
        echo "|---|---:|---:|---:|---:|---:|---:|"
        for row in "${rows[@]}"; do echo "| ${row//|/ | } |"; done
    } >>"$out"
else
    echo "$(date -u '+%Y-%m-%d %H:%M UTC'), PostgreSQL $version, $(nproc) cores;" \
        "synchronous_commit = on, shared_buffers = 256MB." >>"$out"
fi

# ------------------------------------------------------------------ outbox

# The hand-written outbox must stay what a relay needs: the same indexes as
# the extension's table (names, columns, predicates).
baseline_note=""
if want enqueue || want relay; then
    shape_diff=$(psql_bench -c "
        (SELECT * FROM bench.index_shape('idempotency.outbox')
         EXCEPT ALL SELECT * FROM bench.index_shape('bench.outbox'))
        UNION ALL
        (SELECT * FROM bench.index_shape('bench.outbox')
         EXCEPT ALL SELECT * FROM bench.index_shape('idempotency.outbox'))")
    if [ -n "$shape_diff" ]; then
        baseline_note="warning: the indexes of bench.outbox differ from idempotency.outbox's" \
            "(update test/bench/outbox_baselines.sql): the comparison is not like for like"
        log "$baseline_note"
        printf '  %s\n' "$shape_diff" >&2
    fi
fi

# Empty outbox tables, fresh statistics, a checkpoint.
reset_outbox() {
    psql_bench -c "TRUNCATE idempotency.outbox, bench.outbox, bench.outbox_pk" \
        -c "VACUUM ANALYZE idempotency.outbox" \
        -c "VACUUM ANALYZE bench.outbox" \
        -c "VACUUM ANALYZE bench.outbox_pk" \
        -c "CHECKPOINT" >/dev/null
}

# table_rows HEADER ROWS...: the rows (fields split by |) as aligned columns,
# the first column left-aligned.
table_rows() {
    printf '%s\n' "$@" | awk -F'|' '
        { for (i = 1; i <= NF; i++) { cell[NR, i] = $i; if (length($i) > w[i]) w[i] = length($i) }
          if (NF > nf) nf = NF }
        END { for (r = 1; r <= NR; r++) { line = "  "
                for (i = 1; i <= nf; i++)
                    line = line sprintf(i == 1 ? "%-" w[i] "s" : "  %" w[i] "s", cell[r, i])
                print line } }'
}

markdown_rows() {  # markdown_rows HEADER ROWS...: a Markdown table, numbers right-aligned
    local header=$1 sep="|---" n i
    shift
    n=$(awk -F'|' '{ print NF }' <<<"$header")
    for ((i = 2; i <= n; i++)); do sep="$sep|---:"; done
    echo "| ${header//|/ | } |"
    echo "$sep|"
    for row in "$@"; do
        row=${row#"${row%%[! ]*}"}  # Markdown trims the indentation anyway
        echo "| ${row//|/ | } |"
    done
}

if want enqueue; then
    rows=()
    # With idempotency.outbox_notify (where the installed version has it),
    # also enqueue without the NOTIFY that serialises committing producers.
    quiet=$(psql_bench -c "SELECT 1 FROM pg_settings WHERE name = 'idempotency.outbox_notify'")
    [ -n "$quiet" ] && enqueue_variants="extension extension_quiet plain pk_only"
    for clients in $clients_list; do
        declare -A runs=() tps=()
        read -ra order <<<"$enqueue_variants"
        for ((round = 1; round <= outbox_rounds; round++)); do
            for variant in "${order[@]}"; do
                log "enqueue, $clients clients, $variant (${seconds}s, round $round/$outbox_rounds)"
                if ! reset_outbox; then
                    result=failed
                elif [ "$variant" = extension_quiet ]; then
                    result=$(pgbench_pgoptions="-c idempotency.outbox_notify=off" \
                        pgbench_run "enqueue/$variant" "$dir/enqueue.$variant.c$clients.log" \
                        "$clients" "$seconds" enqueue_extension)
                else
                    result=$(pgbench_run "enqueue/$variant" "$dir/enqueue.$variant.c$clients.log" \
                        "$clients" "$seconds" "enqueue_$variant")
                fi
                [ "$result" = failed ] && failures=$((failures + 1))
                runs[$variant]="${runs[$variant]:-} $result"
            done
            order=("${order[@]:1}" "${order[0]}")
        done
        for variant in $enqueue_variants; do
            # shellcheck disable=SC2086
            tps[$variant]=$(median ${runs[$variant]})
            [ "$outbox_rounds" -gt 1 ] && log "enqueue, $clients clients, $variant: tps per round${runs[$variant]}"
        done
        r=$(ratio "${tps[extension]}" "${tps[plain]}")
        rq=$(ratio "${tps[extension_quiet]:-failed}" "${tps[plain]}")
        rows+=("$clients|${tps[extension]}|${tps[extension_quiet]:--}|${tps[plain]}|${tps[pk_only]}|$r|$rq|$(ratio "${tps[extension]}" "${tps[pk_only]}")|$(verdict "$r" "$enqueue_target") / $(verdict "$rq" "$enqueue_target")")
        unset runs tps
    done
    header="clients|outbox_enqueue tps|outbox_enqueue, outbox_notify = off tps|plain INSERT tps|INSERT, PK only tps|ext/plain|ext (notify off)/plain|ext/PK only|target ext/plain >= $enqueue_target (default / notify off)"
    echo
    echo "outbox enqueue: outbox_enqueue('orders', payload, key) against an INSERT of the same row" \
        "(keys from 1000 values, small jsonb payload, one event per transaction);" \
        "${seconds}s per run, $outbox_rounds round(s) (median), pgbench -M prepared"
    echo "  plain INSERT: bench.outbox, the same columns, fillfactor and 6 indexes as idempotency.outbox"
    echo "  INSERT, PK only: bench.outbox_pk, the same columns, only the primary key (not usable by a relay)"
    echo "  outbox_notify = off: the producers' sessions skip the NOTIFY on commit (relays then poll)"
    [ -z "$quiet" ] && echo "  (this version has no idempotency.outbox_notify: no notify-off column)"
    [ -n "$baseline_note" ] && echo "  $baseline_note"
    table_rows "$header" "${rows[@]}"
    {
        echo
        echo "## Outbox: enqueue"
        echo
        echo "\`SELECT idempotency.outbox_enqueue('orders', payload, key)\` against a plain \`INSERT\`" \
            "of the same row (keys from 1000 values, small jsonb payload), one event per transaction;" \
            "pgbench -n -M prepared -T $seconds, median of $outbox_rounds round(s), tables truncated" \
            "and a checkpoint before every run. *plain INSERT*: \`bench.outbox\`, the same columns," \
            "fillfactor and indexes as \`idempotency.outbox\`. *INSERT, PK only*: \`bench.outbox_pk\`," \
            "the same columns with only the primary key (the floor of an INSERT, not an outbox a" \
            "relay could work from). *outbox_notify = off*: \`outbox_enqueue\` in sessions started" \
            "with \`idempotency.outbox_notify = off\` (no NOTIFY at commit; relays poll)." \
            "Target: enqueue within 15% of the plain INSERT."
        [ -n "$baseline_note" ] && { echo; echo "**$baseline_note**"; }
        echo
        markdown_rows "$header" "${rows[@]}"
    } >>"$out"
fi

# relay_run VARIANT RELAYS: a backlog of $backlog pending events, then
# $producers clients enqueuing ($producer_rate events/s in all) and RELAYS
# clients claiming + acking batches of 100, for $seconds. Prints "delivered/s|enqueued/s|batches/s|pending
# left", or "failed". Delivered events are counted in the table (rows
# delivered over the span of their delivered_at), not from pgbench's tps.
relay_run() {
    local variant=$1 relays=$2 table prod cons counts
    case "$variant" in extension) table=idempotency.outbox ;; *) table=bench.outbox ;; esac
    psql_bench -c "TRUNCATE idempotency.outbox, bench.outbox, bench.outbox_pk" \
        -c "SELECT bench.outbox_prefill($backlog, '$variant')" \
        -c "VACUUM ANALYZE $table" -c "CHECKPOINT" >/dev/null || { echo failed; return; }
    # shellcheck disable=SC2046
    pgbench_run "relay producers/$variant" "$dir/relay.$variant.r$relays.producers.log" \
        "$producers" "$seconds" "enqueue_$variant" \
        $([ "$producer_rate" -gt 0 ] && echo "-R $producer_rate") >"$dir/producers.tps" &
    pgbench_run "relay/$variant" "$dir/relay.$variant.r$relays.log" \
        "$relays" "$seconds" "relay_$variant" >"$dir/relays.tps" &
    wait
    prod=$(cat "$dir/producers.tps")
    cons=$(cat "$dir/relays.tps")
    counts=$(psql_bench -F '|' -c "
        SELECT count(*) FILTER (WHERE state = 'delivered'),
               coalesce(extract(epoch FROM max(delivered_at) - min(delivered_at)), 0),
               count(*) FILTER (WHERE state = 'pending')
          FROM $table") || { echo failed; return; }
    if [ "$prod" = failed ] || [ "$cons" = failed ]; then echo failed; return; fi
    awk -F'|' -v prod="$prod" -v cons="$cons" '{
        rate = ($2 > 0) ? $1 / $2 : 0
        printf "%.0f|%s|%s|%d\n", rate, prod, cons, $3 }' <<<"$counts"
}

if want relay; then
    rows=()
    starved=""
    if [ "$producer_rate" -gt 0 ]; then
        producing="$producers producers enqueue $producer_rate events/s in all (pgbench -R)"
    else
        producing="$producers producers enqueue as fast as they can"
    fi
    for relays in $relays_list; do
        declare -A delivered=() enqueued=() left=()
        read -ra order <<<"$relay_variants"
        for ((round = 1; round <= outbox_rounds; round++)); do
            for variant in "${order[@]}"; do
                log "relay, $producers producers + $relays relays, $variant (${seconds}s, round $round/$outbox_rounds)"
                result=$(relay_run "$variant" "$relays")
                if [ "$result" = failed ]; then
                    failures=$((failures + 1))
                    delivered[$variant]="${delivered[$variant]:-} failed"
                    enqueued[$variant]="${enqueued[$variant]:-} failed"
                    continue
                fi
                IFS='|' read -r rate prod _ pending <<<"$result"
                delivered[$variant]="${delivered[$variant]:-} $rate"
                enqueued[$variant]="${enqueued[$variant]:-} $prod"
                left[$variant]="${left[$variant]:-} $pending"
                # Fewer pending events than one batch per relay: it may have run dry.
                [ "$pending" -lt $((100 * relays)) ] &&
                    starved="$starved $variant/$relays relays (round $round: $pending pending left)"
            done
            order=("${order[@]:1}" "${order[0]}")
        done
        for variant in $relay_variants; do
            log "relay, $relays relays, $variant: delivered/s per round${delivered[$variant]}," \
                "enqueued/s${enqueued[$variant]}, pending left${left[$variant]:-}"
        done
        # shellcheck disable=SC2086
        ext=$(median ${delivered[extension]}) plain=$(median ${delivered[plain]})
        r=$(ratio "$ext" "$plain")
        # shellcheck disable=SC2086
        rows+=("$relays|$ext|$plain|$r|$(median ${enqueued[extension]})|$(median ${enqueued[plain]})|$(verdict "$r" "$relay_target")")
        unset delivered enqueued left
    done
    header="relays|outbox_claim+ack delivered/s|hand-written loop delivered/s|ext/plain|ext enqueued/s|plain enqueued/s|target ext/plain >= $relay_target"
    echo
    echo "outbox relay: events delivered per second (counted in the table), each relay claiming 100" \
        "and acking them in one transaction per batch, while $producing;" \
        "$backlog pending events before every run; ${seconds}s per run, $outbox_rounds round(s) (median)"
    echo "  extension: outbox_claim('bench-relay', 100) + outbox_ack(ids), per-key order and leases"
    echo "  hand-written: SELECT ... WHERE state = 'pending' ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED," \
        "UPDATE to in_flight, UPDATE to delivered (no per-key order) on bench.outbox"
    [ -n "$baseline_note" ] && echo "  $baseline_note"
    [ -n "$starved" ] && echo "  warning: the backlog ran low (raise BENCH_BACKLOG):$starved"
    table_rows "$header" "${rows[@]}"
    {
        echo
        echo "## Outbox: relay"
        echo
        echo "Events delivered per second, counted in the table (delivered rows over the span of" \
            "their \`delivered_at\`), with ${relays_list// /, } relay clients each claiming up to 100 events" \
            "and acking them in one transaction per batch, while $producing" \
            "into the same table; $backlog pending events (keys from 1000 values) before every run," \
            "sized so that relays do not run dry (a warning follows when they did). pgbench -n -M prepared -T $seconds, median of $outbox_rounds round(s)."
        echo
        echo "- extension: \`outbox_claim('bench-relay', 100)\` + \`outbox_ack(ids)\`: per-key order," \
            "leases, attempts; producers call \`outbox_enqueue\`"
        echo "- hand-written: \`WITH c AS (SELECT id FROM bench.outbox WHERE state = 'pending' ORDER BY id" \
            "LIMIT 100 FOR UPDATE SKIP LOCKED) UPDATE ... SET state = 'in_flight' ... RETURNING\`, then" \
            "\`UPDATE ... SET state = 'delivered' WHERE id = ANY (ids)\`; no per-key order;" \
            "producers INSERT into \`bench.outbox\`"
        echo
        echo "Target: relay throughput at least that of the hand-written loop."
        [ -n "$baseline_note" ] && { echo; echo "**$baseline_note**"; }
        [ -n "$starved" ] && { echo; echo "**warning: the backlog ran low (raise BENCH_BACKLOG):$starved**"; }
        echo
        markdown_rows "$header" "${rows[@]}"
    } >>"$out"
fi

# ------------------------------------------------------------------ churn

# storage_sample TABLE EXTRA_SQL: "label|value" lines: the table's size, each
# index's size, its row counters from pg_stat_user_tables, and EXTRA_SQL
# (rows of label, value).
storage_sample() {
    local table=$1 extra=$2
    psql_bench -F '|' -c "
        SELECT label, value FROM (
            SELECT 1 AS o, '' AS k, 'table (heap), kB' AS label,
                   (pg_relation_size('$table') / 1024)::text AS value
            UNION ALL
            SELECT 2, c.relname, '  index ' || c.relname || ', kB',
                   (pg_relation_size(i.indexrelid) / 1024)::text
              FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
             WHERE i.indrelid = '$table'::regclass
            UNION ALL
            SELECT 3, '', 'total with indexes and TOAST, kB',
                   (pg_total_relation_size('$table') / 1024)::text
            UNION ALL
            SELECT 4 + v.n, '', v.label, v.value
              FROM pg_stat_user_tables s,
                   LATERAL (VALUES
                       (1, 'n_live_tup', s.n_live_tup::text),
                       (2, 'n_dead_tup', s.n_dead_tup::text),
                       (3, 'n_tup_ins', s.n_tup_ins::text),
                       (4, 'n_tup_upd', s.n_tup_upd::text),
                       (5, 'n_tup_hot_upd', s.n_tup_hot_upd::text),
                       (6, 'HOT share of updates, %',
                        CASE WHEN s.n_tup_upd > 0
                             THEN round(100.0 * s.n_tup_hot_upd / s.n_tup_upd, 1)::text
                             ELSE '-' END),
                       (7, 'n_tup_del', s.n_tup_del::text),
                       (8, 'vacuums (auto + manual)',
                        (s.autovacuum_count + s.vacuum_count)::text)) AS v(n, label, value)
             WHERE s.relid = '$table'::regclass
            UNION ALL
            SELECT 20, '', x.label, x.value FROM ($extra) AS x(label, value)
        ) s ORDER BY o, k"
}

# churn_rows START MIDDLE END: the three samples' files side by side, as rows
# "label|start|middle|end".
churn_rows() {
    awk -F'|' '
        FNR == 1 { f++ }
        { if (!(($1) in seen)) { seen[$1] = 1; order[++n] = $1 }; v[f, $1] = $2 }
        END { for (i = 1; i <= n; i++) {
                  l = order[i]
                  printf "%s|%s|%s|%s\n", l, ((1, l) in v) ? v[1, l] : "-",
                         ((2, l) in v) ? v[2, l] : "-", ((3, l) in v) ? v[3, l] : "-" } }' "$@"
}

# churn_run NAME TABLE EXTRA_SQL LOAD...: resets the table's statistics,
# samples it, runs each LOAD ("clients script [pgbench options]") for
# $churn_seconds in parallel, samples it in the middle and at the end.
# Prints the rows "label|start|middle|end", then "tps|load1 tps|load2 tps...".
churn_run() {
    local name=$1 table=$2 extra=$3 load i=0 pids=() load_tps=() clients script opts
    shift 3
    psql_bench -c "VACUUM $table" \
        -c "SELECT pg_stat_reset_single_table_counters('$table'::regclass)" \
        -c "CHECKPOINT" >/dev/null || return 1
    sleep 1
    storage_sample "$table" "$extra" >"$dir/churn.$name.0" || return 1
    for load in "$@"; do
        i=$((i + 1))
        read -r clients script opts <<<"$load"
        # shellcheck disable=SC2086
        pgbench_run "churn $name/$script" "$dir/churn.$name.$i.log" "$clients" "$churn_seconds" \
            "$script" ${opts:-} >"$dir/churn.$name.$i.tps" &
        pids+=($!)
    done
    sleep $((churn_seconds / 2))
    storage_sample "$table" "$extra" >"$dir/churn.$name.1" || true
    wait "${pids[@]}"
    sleep 1  # the clients' last statistics reach the shared counters at exit
    storage_sample "$table" "$extra" >"$dir/churn.$name.2" || return 1
    churn_rows "$dir/churn.$name.0" "$dir/churn.$name.1" "$dir/churn.$name.2"
    for ((i = 1; i <= $#; i++)); do load_tps+=("$(cat "$dir/churn.$name.$i.tps")"); done
    (IFS='|'; echo "tps|${load_tps[*]}")
}

if want churn; then
    log "churn: retention of delivered events and completed keys 5s, idem_maintenance() every second"
    psql_bench -c "ALTER SYSTEM SET idempotency.outbox_retention = '5s'" \
        -c "ALTER SYSTEM SET idempotency.retention = '5s'" \
        -c "SELECT pg_reload_conf()" >/dev/null || failures=$((failures + 1))
    psql_bench -c "TRUNCATE idempotency.outbox, idempotency.idempotency_keys" >/dev/null

    log "churn: idempotency.outbox, $producers producers + $churn_relays relays (${churn_seconds}s)"
    outbox_result=$(churn_run outbox idempotency.outbox "
        SELECT 'pending events', count(*) FILTER (WHERE state = 'pending')::text
          FROM idempotency.outbox
        UNION ALL
        SELECT 'delivered events kept (retention 5s)', count(*) FILTER (WHERE state = 'delivered')::text
          FROM idempotency.outbox" \
        "$producers enqueue_extension" "$churn_relays relay_extension" "1 maintenance")
    [ -n "$outbox_result" ] || failures=$((failures + 1))

    log "churn: idempotency.idempotency_keys, $producers workers claim + complete (${churn_seconds}s)"
    keys_result=$(churn_run keys idempotency.idempotency_keys "
        SELECT 'PROCESSING keys', count(*) FILTER (WHERE status = 'PROCESSING')::text
          FROM idempotency.idempotency_keys
        UNION ALL
        SELECT 'COMPLETED keys kept (retention 5s)', count(*) FILTER (WHERE status = 'COMPLETED')::text
          FROM idempotency.idempotency_keys" \
        "$producers two_txn_extension -D n=0" "1 maintenance")
    [ -n "$keys_result" ] || failures=$((failures + 1))

    psql_bench -c "ALTER SYSTEM RESET idempotency.outbox_retention" \
        -c "ALTER SYSTEM RESET idempotency.retention" -c "SELECT pg_reload_conf()" >/dev/null

    header="metric|start|middle|end"
    outbox_tps=$(sed -n 's/^tps|//p' <<<"$outbox_result")
    keys_tps=$(sed -n 's/^tps|//p' <<<"$keys_result")
    IFS="|" read -r enq_tps relay_tps _ <<<"$outbox_tps"
    IFS='|' read -r keys_tps_1 _ <<<"$keys_tps"
    mapfile -t outbox_rows < <(grep -v '^tps|' <<<"$outbox_result")
    mapfile -t keys_rows < <(grep -v '^tps|' <<<"$keys_result")
    outbox_load="$producers clients enqueuing (${enq_tps:-?} events/s), $churn_relays relays"
    outbox_load+=" claiming + acking 100 per transaction (${relay_tps:-?} batches/s),"
    outbox_load+=" idem_maintenance() every second"
    keys_load="$producers clients claiming a new key and completing it in two transactions"
    keys_load+=" (${keys_tps_1:-?} keys/s), idem_maintenance() every second"
    echo
    echo "storage under churn: ${churn_seconds}s per table, samples at the start, middle and end;" \
        "idempotency.outbox_retention = idempotency.retention = 5s (ALTER SYSTEM), background worker on"
    echo "idempotency.outbox: $outbox_load"
    if [ ${#outbox_rows[@]} -gt 0 ]; then table_rows "$header" "${outbox_rows[@]}"; else echo "  (could not run)"; fi
    echo "idempotency.idempotency_keys: $keys_load"
    if [ ${#keys_rows[@]} -gt 0 ]; then table_rows "$header" "${keys_rows[@]}"; else echo "  (could not run)"; fi
    {
        echo
        echo "## Storage under churn"
        echo
        echo "${churn_seconds}s per table, sampled at the start, middle and end;" \
            "\`idempotency.outbox_retention\` and \`idempotency.retention\` set to 5s with ALTER SYSTEM," \
            "\`idem_maintenance()\` called every second (the background worker runs as well)," \
            "autovacuum with its default settings. Counters from \`pg_stat_user_tables\`, reset at the start."
        echo
        echo "### idempotency.outbox"
        echo
        echo "$outbox_load."
        echo
        if [ ${#outbox_rows[@]} -gt 0 ]; then markdown_rows "$header" "${outbox_rows[@]}"; else echo "(could not run)"; fi
        echo
        echo "### idempotency.idempotency_keys"
        echo
        echo "$keys_load."
        echo
        if [ ${#keys_rows[@]} -gt 0 ]; then markdown_rows "$header" "${keys_rows[@]}"; else echo "(could not run)"; fi
    } >>"$out"
fi

log "results written to $out"

if [ "$failures" -gt 0 ]; then
    echo "bench: $failures run(s) failed" >&2
    exit 1
fi
exit 0
