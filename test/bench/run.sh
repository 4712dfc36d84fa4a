#!/usr/bin/env bash
# `make bench`: the extension against what a user would write by hand,
# measured side by side in one run on one throwaway cluster with durable
# commits.
#
# claim (test/bench/baselines.sql): the claim/complete path against
# hand-written plain SQL and PL/pgSQL, and against the physical floor (the
# same storage work with no logic: an INSERT then an UPDATE of one row of a
# table with a text primary key and a jsonb column; for a duplicate, a bare
# SELECT by primary key). Scenarios (each script execution is one pgbench
# "transaction"):
#   one_txn    BEGIN; claim a new key; complete it; COMMIT
#   two_txn    claim a new key (commits), then complete it (commits)
#   duplicate  claim of one of 10000 preloaded COMPLETED keys -> completed + result
# wal         WAL bytes per one_txn and duplicate transaction of each variant
#             at one client
# crowd       test/bench/crowd.sh: the holder's complete with 100 sessions
#             waiting for its key against with none, the waiters' answer
#             delays, and other clients' throughput while 200 sessions wait
#             for other keys
#
# The outbox (test/bench/outbox_baselines.sql):
#   enqueue    outbox_enqueue(topic, payload, key), by default and with
#              idempotency.outbox_notify = off, against an INSERT of the same
#              row into bench.outbox (the same columns and indexes as
#              idempotency.outbox), into bench.outbox_pk (primary key only)
#              and into bench.floor_outbox (the physical floor: an event with
#              its primary key and one partial index on unpublished ids)
#   relay      events delivered per second by relays that claim 100 events and
#              ack them in one transaction per batch, while producers enqueue,
#              with a pre-filled backlog: outbox_claim + outbox_ack against a
#              hand-written SKIP LOCKED loop on bench.outbox
#   queue      blocked heads, other topics' backlogs, dead index entries and
#              100,000 keys: claim latency and relay throughput (queue.sh)
#   producers  deadlocks of crossing and disjoint key orders, producers
#              beside an open bulk transaction, enqueue at 30 and 10,000
#              topics with notifications on and off (queue.sh)
#   size       cost growth with table size: one_txn, two_txn and duplicate
#              (extension) at 16 clients on idempotency_keys holding only the
#              10000 preloaded keys, then the same with BENCH_SIZE_KEYS
#              (5000000) more COMPLETED keys that never expire
#   churn      sizes of idempotency.outbox and its indexes, dead tuples and
#              HOT updates at the start, middle and end of an
#              enqueue/claim/ack run, and of idempotency.idempotency_keys
#              under claim/complete, with the background workers purging
#              (idempotency.naptime and purge_naptime 1s, outbox_retention and retention BENCH_CHURN_RETENTION,
#              autovacuum_naptime BENCH_CHURN_AUTOVACUUM_NAPTIME), the sizes
#              sampled every second against a fresh copy of the live rows;
#              beside them the keys' churn written by hand in plain SQL
#              (scripts/churn_plain.sql, purged by scripts/purge_plain.sql)
#   idle       test/bench/idle.sh: the CPU an idle cluster spends with 1, 10
#              and 100 databases that have the extension, with the library
#              preloaded and without it, and the workers started per minute
#   heartbeat  test/bench/heartbeat.sh: 16 clients heartbeating 200 keys for
#              30 s, 0.5.0's keys layout beside the current one: HOT updates
#              and the table's size
#   views      test/bench/views.sh: idem_stuck, idem_stats and outbox_lag
#              with 1000000 and 10000000 finished keys and 1000000 delivered
#              events, their plans, and the 0.5.0 definitions (slow to load)
#   purge      test/bench/purge.sh: the worker's purge of 10000000 expired
#              keys, with claim + complete latency before, during and after
#   topic_lists test/bench/topic_lists.sh: outbox_claim over 1, 1,000 and
#              100,000 listed topics against topics => NULL
#   tombstones test/bench/tombstones.sh: bytes per finished key as a full
#              row and as a tombstone, a million keys
#   steps      test/bench/steps.sh: a job of three steps (claim, three
#              idem_step, complete) against the same job in PL/pgSQL with a
#              table of steps: jobs per second side by side, and bytes per job
#   sql_edition test/bench/sql_edition.sh: the SQL edition beside the C++
#              extension and the PL/pgSQL baseline (one_txn, two_txn and
#              duplicate, the same scripts against both editions), as ratios
#   growth     test/bench/growth.sh: the keys table grown to 20,000,000
#              uniformly random finished keys: bytes per key, duplicates,
#              new keys and the WAL of each, as ratios to 10,000 keys
#   views_traffic test/bench/views_traffic.sh: the views read every 5 s
#              under 2,000 claim + complete/s (5-minute leases) over
#              10,000,000 finished keys, workers and autovacuum on
#
# Environment: BENCH_SECONDS (10) per pgbench run, BENCH_CLIENTS ("1 4 16"),
# BENCH_ROUNDS (1): with more, the variants are run that many times,
# interleaved in rotating order, and the median is reported (on a shared
# or noisy machine single runs vary by 20% and more); BENCH_OUTBOX_ROUNDS
# (BENCH_ROUNDS) the same for the enqueue and relay comparisons; BENCH_OUT
# (docs/benchmarks.md, see below) for the Markdown tables,
# BENCH_PORT (54430), BENCH_SECTIONS ("claim wal crowd enqueue relay queue producers size
# churn idem_relay idle heartbeat views purge topic_lists views_traffic tombstones steps sql_edition growth"), BENCH_QUEUE_CLAIMS (200) timed claims per queue case,
# BENCH_QUEUE_RELAYS (2) relays per queue case,
# BENCH_RELAYS ("1 2 4") relay clients, BENCH_PRODUCERS (4) enqueuing
# clients beside them, BENCH_PRODUCER_RATE (500) events/s those producers
# enqueue in all (the same load for both variants; 0: as fast as they can),
# BENCH_BACKLOG (60000 per second of a run, at least 300000) pending events
# before each relay run (relays must not run dry: that would measure the
# backlog, not them),
# BENCH_CHURN_SECONDS (300) per churn run, BENCH_CHURN_TABLES ("outbox keys plain") the tables it churns, BENCH_CHURN_AUTOVACUUM_NAPTIME (10s) during
# it, BENCH_CHURN_RETENTION (5s) of delivered events and completed keys,
# BENCH_SIZE_KEYS (5000000), BENCH_WAL_TRANSACTIONS (5000) per WAL measurement,
# BENCH_CROWD (100) waiters on one key, BENCH_CROWD_ROUNDS (5), BENCH_IDLE_WAITERS
# (200) sessions waiting for other keys.
# BENCH_OUT defaults to docs/benchmarks.md of the source tree; the raw
# numbers (TSV) and the plots (PNG, drawn by gnuplot) go to BENCH_DIR
# (docs/bench/ of the source tree). BENCH_NOTE: a sentence added to the
# document (e.g. about the load on the machine). Benchmarks never fail a
# build: the exit status is non-zero only when something could not run.
set -u
. "$(dirname "$0")/../lib/common.sh"

here=$(cd "$(dirname "$0")" && pwd)
seconds=${BENCH_SECONDS:-10}
clients_list=${BENCH_CLIENTS:-"1 4 16"}
rounds=${BENCH_ROUNDS:-1}
outbox_rounds=${BENCH_OUTBOX_ROUNDS:-$rounds}
port=${BENCH_PORT:-54430}
out=${BENCH_OUT:-$IDEM_ROOT/docs/benchmarks.md}
case "$out" in /*) ;; *) out="$PWD/$out" ;; esac
bench_dir=${BENCH_DIR:-$IDEM_ROOT/docs/bench}
case "$bench_dir" in /*) ;; *) bench_dir="$PWD/$bench_dir" ;; esac
mkdir -p "$(dirname "$out")" "$bench_dir" || exit 1
# The plots as the document links them: relative to the document's folder.
plot_link=$(realpath -m --relative-to="$(dirname "$out")" "$bench_dir")
sections=${BENCH_SECTIONS:-"claim wal crowd enqueue relay queue producers size churn idem_relay idle heartbeat views purge topic_lists views_traffic tombstones steps sql_edition growth"}
size_keys=${BENCH_SIZE_KEYS:-5000000}
size_clients=16
bench_note=${BENCH_NOTE:-}
relays_list=${BENCH_RELAYS:-"1 2 4"}
producers=${BENCH_PRODUCERS:-4}
producer_rate=${BENCH_PRODUCER_RATE:-500}
default_backlog=$((seconds * 60000 > 300000 ? seconds * 60000 : 300000))
backlog=${BENCH_BACKLOG:-$default_backlog}
churn_seconds=${BENCH_CHURN_SECONDS:-300}
churn_tables=${BENCH_CHURN_TABLES:-outbox keys plain}
churn_autovacuum_naptime=${BENCH_CHURN_AUTOVACUUM_NAPTIME:-10s}
churn_retention=${BENCH_CHURN_RETENTION:-5s}
churn_size_target=1.5  # table and indexes at most 1.5 x a fresh copy of the live rows
churn_growth_target=1.10  # and flat: the last third at most 10% above the middle third
wal_transactions=${BENCH_WAL_TRANSACTIONS:-5000}
churn_relays=2
preload=10000
scenarios="one_txn two_txn duplicate"
variants="extension plain plpgsql floor"
enqueue_variants="extension plain pk_only floor"
relay_variants="extension plain"
size_target=0.90  # at most a 10% drop with $size_keys keys
wal_target=1.00  # WAL per claim + complete at most PL/pgSQL's
enqueue_target=0.85  # enqueue within 15% of the plain INSERT
enqueue_floor_target=0.90  # and at least 0.9 of the physical floor
relay_target=1.00    # relays deliver at least as fast as the hand-written loop

for section in $sections; do
    case "$section" in
    claim | wal | crowd | enqueue | relay | queue | producers | size | churn | idem_relay | idle | heartbeat | views | purge | topic_lists | views_traffic | tombstones | steps | sql_edition | growth) ;;
    *) echo "bench: unknown section '$section' in BENCH_SECTIONS" >&2; exit 1 ;;
    esac
done
want() { case " $sections " in *" $1 "*) return 0 ;; esac; return 1; }

ensure_packages || exit 1
build_and_install || exit 1
bindir=$(pg_bindir)

dir=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-bench.XXXXXX")
cleanup() {
    kill "${load_sampler:-}" 2>/dev/null
    stop_cluster "$dir"
    rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The machine's load over the run, sampled every minute (other work on a
# shared machine moves single figures; the document says how much there was).
(
    while :; do
        cut -d' ' -f1 /proc/loadavg
        sleep 60
    done
) >"$dir/load.log" &
load_sampler=$!

log "starting a throwaway cluster on port $port"
if ! start_cluster "$dir" "$port" \
    "shared_buffers = 256MB" \
    "synchronous_commit = on" \
    "max_wal_size = 4GB" \
    "max_connections = 250"; then
    echo "bench: could not start the cluster" >&2
    cat "$dir/server.log" >&2 2>/dev/null
    exit 1
fi

# The scripts must be readable by the OS user that runs pgbench.
mkdir -p "$dir/scripts"
cp "$here"/scripts/*.sql "$here/baselines.sql" "$here/outbox_baselines.sql" "$here/queue.sql" \
    "$dir/scripts/"
chown -R "$IDEM_OS_USER" "$dir/scripts"

psql_bench() {
    as_pg "$bindir/psql" -h "$dir" -p "$port" -U postgres -d bench -X -q -A -t \
        -v ON_ERROR_STOP=1 "$@"
}

as_pg "$bindir/createdb" -h "$dir" -p "$port" -U postgres bench || exit 1
psql_bench -c "CREATE EXTENSION idempotency" || exit 1
psql_bench -f "$dir/scripts/baselines.sql" || exit 1
psql_bench -f "$dir/scripts/outbox_baselines.sql" || exit 1
psql_bench -f "$dir/scripts/queue.sql" || exit 1
version=$(psql_bench -c "SHOW server_version")

# pgbench_run LABEL LOGFILE CLIENTS SECONDS SCRIPT [pgbench options]: prints
# the tps, or "failed". Its sessions get the settings in $pgbench_pgoptions
# (PGOPTIONS syntax), when set. SECONDS 0: the options say when to stop (-t).
pgbench_run() {
    local label=$1 logf=$2 clients=$3 secs=$4 script=$5 jobs status tps duration=()
    shift 5
    jobs=$((clients < 2 ? clients : 2))
    [ "$secs" -gt 0 ] && duration=(-T "$secs")
    as_pg env PGOPTIONS="${pgbench_pgoptions:-}" "$bindir/pgbench" -h "$dir" -p "$port" \
        -U postgres -n "${duration[@]}" -c "$clients" -j "$jobs" -M prepared "$@" \
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

# The claim targets: against the physical floor and against PL/pgSQL.
one_txn_floor_target=0.95
one_txn_plpgsql_target=1.20
duplicate_floor_target=0.90
duplicate_plpgsql_target=1.30
claim_verdict() {  # claim_verdict SCENARIO EXT/FLOOR EXT/PLPGSQL
    case "$1" in
    one_txn) echo "floor $(verdict "$2" $one_txn_floor_target), PL/pgSQL $(verdict "$3" $one_txn_plpgsql_target)" ;;
    duplicate) echo "floor $(verdict "$2" $duplicate_floor_target), PL/pgSQL $(verdict "$3" $duplicate_plpgsql_target)" ;;
    *) echo "-" ;;
    esac
}

failures=0

# ------------------------------------------------------------------ claim

# Every run starts from the same state: both tables truncated, the same
# preloaded COMPLETED keys, fresh statistics, and a checkpoint.
reset_tables() {
    psql_bench -c "TRUNCATE idempotency.idempotency_keys, bench.idempotency_keys, bench.floor_keys" \
        -c "SELECT bench.preload($preload)" \
        -c "VACUUM ANALYZE idempotency.idempotency_keys" \
        -c "VACUUM ANALYZE bench.idempotency_keys" \
        -c "VACUUM ANALYZE bench.floor_keys" \
        -c "CHECKPOINT" >/dev/null
}

# run_one SCENARIO VARIANT CLIENTS: prints the tps, or "failed".
run_one() {
    local scenario=$1 variant=$2 clients=$3
    if ! reset_tables; then echo failed; return; fi
    pgbench_run "$scenario/$variant" "$dir/$scenario.$variant.c$clients.log" "$clients" \
        "$seconds" "${scenario}_${variant}" -D n=0
}

# write_tsv FILE HEADER ROWS...: the rows (fields split by |) as tab-separated
# values under HEADER (tab-separated); cells that are not numbers (a failed
# run, a missing variant) become NaN, which gnuplot skips.
write_tsv() {
    local f=$1 header=$2
    shift 2
    {
        printf '%s\n' "$header"
        printf '%s\n' "$@" | awk -F'|' -v OFS='\t' '{
            for (i = 1; i <= NF; i++) if (i > 1 && $i !~ /^-?[0-9]+(\.[0-9]+)?$/) $i = "NaN"
            $1 = $1; print }'
    } >"$f"
}

# plot NAME: draws $bench_dir/NAME.png with gnuplot from the script on stdin
# (terminal and output set here); prints the Markdown image link, or nothing
# when gnuplot is missing or failed.
plot() {
    local name=$1 png="$bench_dir/$1.png"
    if ! command -v gnuplot >/dev/null 2>&1; then
        log "gnuplot not found: no $name.png"
        cat >/dev/null
        return
    fi
    rm -f "$png"
    { echo "set terminal pngcairo size ${plot_size:-1000,450} noenhanced font 'Sans,10'"
      echo "set output '$png'"
      echo "set datafile separator tab"
      echo "set datafile columnheaders"
      echo "set style fill solid 0.85 border -1"
      echo "set grid ytics"
      echo "set yrange [0:*]"
      cat; } | gnuplot 2>"$dir/gnuplot.$name.log"
    if [ -s "$png" ]; then
        echo
        echo "![$name]($plot_link/$name.png)"
    else
        rm -f "$png"
        log "gnuplot could not draw $name.png:"
        cat "$dir/gnuplot.$name.log" >&2
    fi
}

# The command that reproduces this run: the BENCH_* settings it was given.
repro="make bench"
for var in $(compgen -e | grep '^BENCH_' | sort -r); do
    case "$var" in BENCH_OUT | BENCH_DIR | BENCH_PORT | BENCH_NOTE) continue ;; esac
    val=${!var}
    case "$val" in *[!A-Za-z0-9._/:-]*) val="'$val'" ;; esac
    repro="$var=$val $repro"
done
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
mem=$(awk '/^MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)
{
    echo "# idempotency benchmark"
    echo
    echo "Generated by \`test/bench/run.sh\` (\`make bench\`) on $(date -u '+%Y-%m-%d %H:%M UTC')."
    echo "Reproduce with (from the source tree, as root):"
    echo
    echo '<!-- illustrative -->'
    echo '```sh'
    echo "$repro"
    echo '```'
    echo
    echo "- machine: ${cpu:-unknown CPU}, $(nproc) cores, $mem RAM, $(uname -sr)"
    echo "- PostgreSQL $version (throwaway cluster: synchronous_commit = on, shared_buffers = 256MB," \
        "max_wal_size = 4GB, library preloaded, background workers on)"
    echo "- sections: $sections; ${seconds}s per pgbench run, median of $rounds round(s)"
    echo "- raw numbers (TSV) and plots: [\`$plot_link/\`]($plot_link/)"
    echo
    echo "Single runs on a shared machine vary by 20% and more: compare the ratios within" \
        "one run, not absolute figures across runs; \`BENCH_ROUNDS=3\` takes medians."
    [ -n "$bench_note" ] && { echo; echo "**Note:** $bench_note"; }
    echo
    echo
    cat "$IDEM_ROOT/test/bench/notes.md"
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
            e=${tps[extension]}
            r_floor=$(ratio "$e" "${tps[floor]}")
            r_plpgsql=$(ratio "$e" "${tps[plpgsql]}")
            rows+=("$scenario|$clients|$e|${tps[plain]}|${tps[plpgsql]}|${tps[floor]}|$(ratio "$e" "${tps[plain]}")|$r_plpgsql|$r_floor|$(claim_verdict "$scenario" "$r_floor" "$r_plpgsql")")
            unset runs tps
        done
    done

    write_tsv "$bench_dir/claim.tsv" \
        "$(printf 'scenario\tclients\textension_tps\tplain_tps\tplpgsql_tps\tfloor_tps\text_over_plain\text_over_plpgsql\text_over_floor')" \
        $(for row in "${rows[@]}"; do cut -d'|' -f1-9 <<<"$row"; done)
    for scenario in $scenarios; do
        awk -F'\t' -v s="$scenario" 'NR == 1 || $1 == s' "$bench_dir/claim.tsv" >"$dir/claim.$scenario.dat"
    done
    claim_plot=$(plot_size=1200,420 plot claim <<EOF
set style data histograms
set style histogram clustered gap 1
set key below horizontal
set xlabel 'clients'
set ylabel 'transactions/s'
set multiplot layout 1,3 title 'claim + complete: tps by clients (pgbench, higher is better)'
set title 'one_txn (claim + complete, one transaction)'
plot '$dir/claim.one_txn.dat' using 3:xtic(2) title 'extension', '' using 4 title 'plain SQL', '' using 5 title 'PL/pgSQL', '' using 6 title 'physical floor'
set title 'two_txn (claim, then complete)'
plot '$dir/claim.two_txn.dat' using 3:xtic(2) title 'extension', '' using 4 title 'plain SQL', '' using 5 title 'PL/pgSQL', '' using 6 title 'physical floor'
set title 'duplicate (claim of a completed key)'
plot '$dir/claim.duplicate.dat' using 3:xtic(2) title 'extension', '' using 4 title 'plain SQL', '' using 5 title 'PL/pgSQL', '' using 6 title 'physical floor'
unset multiplot
EOF
)
    dup16=""
    for row in "${rows[@]}"; do
        IFS='|' read -r sc cl ext _ <<<"$row"
        [ "$sc" = duplicate ] && [ "$cl" = 16 ] && dup16=$ext
    done

    hot=$(psql_bench -F ' ' -c "SELECT relid::regclass, n_tup_upd, n_tup_hot_upd
        FROM pg_stat_user_tables WHERE relname = 'idempotency_keys' ORDER BY 1")

    header="scenario|clients|extension tps|plain SQL tps|PL/pgSQL tps|floor tps|ext/plain|ext/plpgsql|ext/floor|target"
    echo
    echo "idempotency benchmark: PostgreSQL $version, $(nproc) cores, ${seconds}s per run," \
        "$rounds round(s) (median), pgbench -M prepared, synchronous_commit = on, shared_buffers = 256MB"
    {
        echo "$header"
        printf '%s\n' "${rows[@]}"
    } | awk -F'|' '{ printf "%-10s %7s %14s %14s %13s %10s %10s %12s %10s  %s\n", $1, $2, $3, $4, $5, $6, $7, $8, $9, $10 }'
    echo
    echo "updates over all runs (HOT share):"
    echo "$hot" | awk '{ printf "  %-34s %10d updates, %5.1f%% HOT\n", $1, $2, ($2 ? 100 * $3 / $2 : 0) }'

    {
        echo "## Claim and complete"
        echo
        echo "$(date -u '+%Y-%m-%d %H:%M UTC'), PostgreSQL $version, $(nproc) cores;" \
            "pgbench -n -M prepared -T $seconds, -j min(clients, 2); median of $rounds round(s);" \
            "synchronous_commit = on, shared_buffers = 256MB;" \
            "tables truncated, $preload completed keys preloaded and a checkpoint before every run."
        echo
        echo "- one_txn: BEGIN; claim a new key; complete it; COMMIT"
        echo "- two_txn: claim a new key (commit), then complete it (commit)"
        echo "- duplicate: claim of a completed key, answered \`completed\` with the stored result"
        echo
        echo "*plain SQL* and *PL/pgSQL* are the same logic written by hand on \`bench.idempotency_keys\`" \
            "(the extension's columns, primary key and fillfactor; \`test/bench/baselines.sql\`)." \
            "The *physical floor* is what the storage costs with no logic: for one_txn and two_txn an" \
            "INSERT then an UPDATE of one row of \`bench.floor_keys\` (a text primary key and a jsonb" \
            "column), for duplicate a bare SELECT by primary key of a row of \`bench.idempotency_keys\`." \
            "Targets: one_txn >= $one_txn_floor_target x the floor and >= $one_txn_plpgsql_target x PL/pgSQL;" \
            "duplicate >= $duplicate_floor_target x the floor and >= $duplicate_plpgsql_target x PL/pgSQL."
        echo
        echo "| ${header//|/ | } |"
        echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        for row in "${rows[@]}"; do echo "| ${row//|/ | } |"; done
        [ -n "$dup16" ] && { echo; echo "**Duplicate hits at 16 clients:** $dup16 claims/s answered" \
            "\`completed\` with the stored result (extension, the *duplicate* row above)."; }
        echo "$claim_plot"
    } >>"$out"
fi

# ------------------------------------------------------------------ wal

# wal_run SCENARIO VARIANT: WAL bytes per transaction of the script at one
# client: $wal_transactions transactions after as many to warm the tables,
# the plans and the pages (the checkpoint of reset_tables is before both),
# measured from pg_current_wal_insert_lsn(). Prints the bytes, or "failed".
wal_run() {
    local scenario=$1 variant=$2 start end
    reset_tables || { echo failed; return; }
    [ "$(pgbench_run "wal warm-up $scenario/$variant" "$dir/wal.$scenario.$variant.warm.log" 1 0 \
        "${scenario}_${variant}" -t "$wal_transactions" -D n=0)" = failed ] && { echo failed; return; }
    start=$(psql_bench -c "SELECT pg_current_wal_insert_lsn()") || { echo failed; return; }
    [ "$(pgbench_run "wal $scenario/$variant" "$dir/wal.$scenario.$variant.log" 1 0 \
        "${scenario}_${variant}" -t "$wal_transactions" -D n="$wal_transactions")" = failed ] &&
        { echo failed; return; }
    end=$(psql_bench -c "SELECT pg_current_wal_insert_lsn()") || { echo failed; return; }
    psql_bench -c "SELECT round(pg_wal_lsn_diff('$end', '$start') / $wal_transactions.0)"
}

if want wal; then
    rows=()
    for scenario in one_txn duplicate; do
        declare -A wal=()
        for variant in $variants; do
            log "wal: $scenario, $variant ($wal_transactions transactions, 1 client)"
            wal[$variant]=$(wal_run "$scenario" "$variant")
            [ "${wal[$variant]}" = failed ] && failures=$((failures + 1))
        done
        r=$(ratio "${wal[extension]}" "${wal[plpgsql]}")
        if [ "$scenario" = one_txn ]; then
            target=$(awk -v r="$r" -v t="$wal_target" 'BEGIN { if (r == "-") print "-"; else print (r <= t ? "met" : "MISSED") }')
        else
            target="-"
        fi
        rows+=("$scenario|${wal[extension]}|${wal[plain]}|${wal[plpgsql]}|${wal[floor]}|$r|$(ratio "${wal[extension]}" "${wal[floor]}")|$target")
        unset wal
    done
    header="scenario|extension bytes|plain SQL bytes|PL/pgSQL bytes|floor bytes|ext/plpgsql|ext/floor|target ext/plpgsql <= $wal_target"
    echo
    echo "WAL bytes per transaction (one client, $wal_transactions transactions after as many to warm up):"
    table_rows "$header" "${rows[@]}"
    write_tsv "$bench_dir/wal.tsv" \
        "$(printf 'scenario\textension_bytes\tplain_bytes\tplpgsql_bytes\tfloor_bytes')" \
        $(for row in "${rows[@]}"; do cut -d'|' -f1-5 <<<"$row"; done)
    {
        echo
        echo "## WAL per transaction"
        echo
        echo "WAL bytes written per pgbench transaction at one client (\`pg_current_wal_insert_lsn()\`" \
            "before and after $wal_transactions transactions, run after as many to warm the tables and" \
            "the pages; the same scripts as above). one_txn is a claim + complete of a new key," \
            "duplicate a claim answered \`completed\` (a read: no WAL). Target: one_txn at most" \
            "PL/pgSQL's."
        echo
        markdown_rows "$header" "${rows[@]}"
    } >>"$out"
fi

# ------------------------------------------------------------------ crowd
. "$here/crowd.sh"

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
        baseline_note="warning: the indexes of bench.outbox differ from idempotency.outbox's"
        baseline_note+=" (update test/bench/outbox_baselines.sql): the comparison is not like for like"
        log "$baseline_note"
        printf '  %s\n' "$shape_diff" >&2
    fi
fi

# Empty outbox tables, fresh statistics, a checkpoint.
reset_outbox() {
    psql_bench -c "TRUNCATE idempotency.outbox, bench.outbox, bench.outbox_pk, bench.floor_outbox" \
        -c "VACUUM ANALYZE idempotency.outbox" \
        -c "VACUUM ANALYZE bench.outbox" \
        -c "VACUUM ANALYZE bench.outbox_pk" \
        -c "VACUUM ANALYZE bench.floor_outbox" \
        -c "CHECKPOINT" >/dev/null
}

if want enqueue; then
    rows=()
    # With idempotency.outbox_notify (where the installed version has it),
    # also enqueue without the NOTIFY that serialises committing producers.
    quiet=$(psql_bench -c "SELECT 1 FROM pg_settings WHERE name = 'idempotency.outbox_notify'")
    [ -n "$quiet" ] && enqueue_variants="extension extension_quiet plain pk_only floor"
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
        rf=$(ratio "${tps[extension]}" "${tps[floor]}")
        rows+=("$clients|${tps[extension]}|${tps[extension_quiet]:--}|${tps[plain]}|${tps[pk_only]}|${tps[floor]}|$r|$rq|$(ratio "${tps[extension]}" "${tps[pk_only]}")|$rf|$(verdict "$r" "$enqueue_target") / $(verdict "$rq" "$enqueue_target") / floor $(verdict "$rf" "$enqueue_floor_target")")
        unset runs tps
    done
    write_tsv "$bench_dir/enqueue.tsv" \
        "$(printf 'clients\textension_tps\textension_notify_off_tps\tplain_insert_tps\tpk_only_insert_tps\tfloor_insert_tps')" \
        $(for row in "${rows[@]}"; do cut -d'|' -f1-6 <<<"$row"; done)
    enqueue_plot=$(plot enqueue <<EOF
set style data histograms
set style histogram clustered gap 1
set key below horizontal
set xlabel 'clients'
set ylabel 'events enqueued/s'
set title 'outbox enqueue: tps by clients (one event per transaction, higher is better)'
plot '$bench_dir/enqueue.tsv' using 2:xtic(1) title 'outbox_enqueue', '' using 3 title 'outbox_enqueue, outbox_notify = off', '' using 4 title 'plain INSERT (same indexes)', '' using 5 title 'INSERT, PK only', '' using 6 title 'physical floor'
EOF
)
    header="clients|outbox_enqueue tps|outbox_enqueue, outbox_notify = off tps|plain INSERT tps|INSERT, PK only tps|floor INSERT tps|ext/plain|ext (notify off)/plain|ext/PK only|ext/floor|target ext/plain >= $enqueue_target (default / notify off), ext/floor >= $enqueue_floor_target"
    echo
    echo "outbox enqueue: outbox_enqueue('orders', payload, key) against an INSERT of the same row" \
        "(keys from 1000 values, small jsonb payload, one event per transaction);" \
        "${seconds}s per run, $outbox_rounds round(s) (median), pgbench -M prepared"
    echo "  plain INSERT: bench.outbox, the same columns, storage parameters and indexes as idempotency.outbox"
    echo "  INSERT, PK only: bench.outbox_pk, the same columns, only the primary key (not usable by a relay)"
    echo "  floor INSERT: bench.floor_outbox, an event with its primary key and one partial index on unpublished ids"
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
            "storage parameters (fillfactor, autovacuum) and indexes as \`idempotency.outbox\`. *INSERT, PK only*: \`bench.outbox_pk\`," \
            "the same columns with only the primary key (the floor of an INSERT, not an outbox a" \
            "relay could work from). *floor INSERT*: \`bench.floor_outbox\`, the physical floor of an" \
            "outbox: topic, key and payload with a primary key and one partial index on the ids not yet" \
            "published. *outbox_notify = off*: \`outbox_enqueue\` in sessions started" \
            "with \`idempotency.outbox_notify = off\` (no NOTIFY at commit; relays poll)." \
            "Targets: enqueue within 15% of the plain INSERT, and at least $enqueue_floor_target of the floor INSERT."
        [ -n "$baseline_note" ] && { echo; echo "**$baseline_note**"; }
        echo
        markdown_rows "$header" "${rows[@]}"
        echo "$enqueue_plot"
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
    tsv_rows=()
    for row in "${rows[@]}"; do
        IFS='|' read -r f1 f2 f3 _ f5 f6 _ <<<"$row"
        tsv_rows+=("$f1|$f2|$f3|$f5|$f6")
    done
    write_tsv "$bench_dir/relay.tsv" \
        "$(printf 'relays\textension_delivered_per_s\tplain_delivered_per_s\textension_enqueued_per_s\tplain_enqueued_per_s')" \
        "${tsv_rows[@]}"
    relay_plot=$(plot relay <<EOF
set style data histograms
set style histogram clustered gap 1
set key below horizontal
set xlabel 'relay clients'
set ylabel 'events delivered/s'
set title 'outbox relay: events delivered/s by relays, batches of 100, producers enqueuing (higher is better)'
plot '$bench_dir/relay.tsv' using 2:xtic(1) title 'outbox_claim + outbox_ack', '' using 3 title 'hand-written SKIP LOCKED loop'
EOF
)
    header="relays|outbox_claim+ack delivered/s|hand-written loop delivered/s|ext/plain|ext enqueued/s|plain enqueued/s|target ext/plain >= $relay_target"
    echo
    echo "outbox relay: events delivered per second (counted in the table), each relay claiming 100" \
        "and acking them in one transaction per batch, while $producing;" \
        "$backlog pending events before every run; ${seconds}s per run, $outbox_rounds round(s) (median)"
    echo "  extension: outbox_claim('bench-relay', 100) + outbox_ack(ids), per-key order and leases"
    echo "  hand-written: SELECT ... WHERE ready_at <= now ORDER BY ready_at, id LIMIT 100 FOR UPDATE SKIP LOCKED," \
        "UPDATE to in_flight, UPDATE to delivered (every event ready: no per-key order) on bench.outbox"
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
        echo "- hand-written: \`WITH c AS (SELECT id FROM bench.outbox WHERE ready_at <= now() ORDER BY ready_at, id" \
            "LIMIT 100 FOR UPDATE SKIP LOCKED) UPDATE ... SET state = 'in_flight' ... RETURNING\`, then" \
            "\`UPDATE ... SET state = 'delivered' WHERE id = ANY (ids)\`; every event is ready, so no per-key order;" \
            "producers INSERT into \`bench.outbox\`"
        echo
        echo "Target: relay throughput at least that of the hand-written loop."
        [ -n "$baseline_note" ] && { echo; echo "**$baseline_note**"; }
        [ -n "$starved" ] && { echo; echo "**warning: the backlog ran low (raise BENCH_BACKLOG):$starved**"; }
        echo
        markdown_rows "$header" "${rows[@]}"
        echo "$relay_plot"
    } >>"$out"
fi

# ------------------------------------------------------------------ queue, producers
. "$here/queue.sh"

# ------------------------------------------------------------------ size

# size_run STATE SCRIPT: tps of SCRIPT (extension) at $size_clients clients.
# empty: the table truncated and the $preload duplicate keys preloaded;
# loaded: the keys a previous run added are deleted (the $size_keys bulk keys
# and the preloaded ones stay). Both: VACUUM ANALYZE and a checkpoint first.
size_run() {
    local state=$1 script=$2
    if [ "$state" = empty ]; then
        psql_bench -c "TRUNCATE idempotency.idempotency_keys, bench.idempotency_keys, bench.floor_keys" -c "SELECT bench.preload($preload)" \
            >/dev/null || { echo failed; return; }
    else
        psql_bench -c "DELETE FROM idempotency.idempotency_keys
                        WHERE key NOT LIKE 'bulk-%' AND length(key) > 5" >/dev/null ||
            { echo failed; return; }
    fi
    psql_bench -c "VACUUM ANALYZE idempotency.idempotency_keys" -c "CHECKPOINT" >/dev/null ||
        { echo failed; return; }
    pgbench_run "size $state/$script" "$dir/size.$state.$script.log" "$size_clients" \
        "$seconds" "${script}_extension" -D n=0
}

if want size; then
    size_scripts="one_txn two_txn duplicate"
    declare -A size_runs=()
    size_mb=()
    for state in empty loaded; do
        if [ "$state" = loaded ]; then
            log "size: loading $size_keys COMPLETED keys that never expire (a minute per 5 million)"
            if ! psql_bench -c "TRUNCATE idempotency.idempotency_keys, bench.idempotency_keys, bench.floor_keys" \
                -c "SELECT bench.preload($preload)" \
                -c "INSERT INTO idempotency.idempotency_keys
                           (scope, key, status, token, attempts, result, created_at, updated_at,
                            completed_at, expires_at, claimed_at)
                    SELECT 'default', 'bulk-' || i, 'COMPLETED', nextval('idempotency.token_seq'), 1,
                           jsonb_build_object('order', i, 'ok', true), now(), now(), now(),
                           now() + interval '100 years', now()
                      FROM generate_series(1, $size_keys) AS i" \
                -c "VACUUM ANALYZE idempotency.idempotency_keys" -c "CHECKPOINT" >/dev/null; then
                log "size: could not load the keys"
                failures=$((failures + 1))
            fi
        fi
        read -ra order <<<"$size_scripts"
        for ((round = 1; round <= rounds; round++)); do
            for script in "${order[@]}"; do
                log "size: $script, $state, $size_clients clients (${seconds}s, round $round/$rounds)"
                result=$(size_run "$state" "$script")
                [ "$result" = failed ] && failures=$((failures + 1))
                size_runs[$state.$script]="${size_runs[$state.$script]:-} $result"
            done
            order=("${order[@]:1}" "${order[0]}")
        done
        size_mb+=("$(psql_bench -c "SELECT count(*) || ' keys, ' ||
            pg_size_pretty(pg_total_relation_size('idempotency.idempotency_keys'))
            || ' with indexes' FROM idempotency.idempotency_keys")")
    done
    rows=()
    for script in $size_scripts; do
        # shellcheck disable=SC2086
        e=$(median ${size_runs[empty.$script]}) l=$(median ${size_runs[loaded.$script]})
        rows+=("$script|$size_clients|$e|$l|$(ratio "$l" "$e")|$(verdict "$(ratio "$l" "$e")" "$size_target")")
    done
    unset size_runs
    header="scenario|clients|empty table tps|with $size_keys keys tps|with keys/empty|target >= $size_target"
    echo
    echo "cost growth with table size: extension scripts at $size_clients clients;" \
        "empty: ${size_mb[0]:-?} (after the runs); loaded: ${size_mb[1]:-?} (after the runs)"
    table_rows "$header" "${rows[@]}"
    write_tsv "$bench_dir/size.tsv" \
        "$(printf 'scenario\tclients\tempty_tps\tloaded_tps\tloaded_over_empty')" \
        $(for row in "${rows[@]}"; do cut -d'|' -f1-5 <<<"$row"; done)
    size_plot=$(plot size <<EOF
set style data histograms
set style histogram clustered gap 1
set key below horizontal
set ylabel 'transactions/s'
set title 'cost growth with table size: extension, $size_clients clients (higher is better)'
plot '$bench_dir/size.tsv' using 3:xtic(1) title 'only the $preload preloaded keys', '' using 4 title '+ $size_keys COMPLETED keys'
EOF
)
    {
        echo
        echo "## Cost growth with table size"
        echo
        echo "The extension's scripts at $size_clients clients on \`idempotency.idempotency_keys\`" \
            "holding only the $preload keys the *duplicate* script reads, then holding $size_keys more" \
            "COMPLETED keys (inserted with \`generate_series\`, expiring in 100 years so nothing" \
            "purges them), in the same run. VACUUM ANALYZE and a checkpoint before every run;" \
            "pgbench -n -M prepared -T $seconds, median of $rounds round(s)." \
            "Table at the end of each state: empty: ${size_mb[0]:-?}; loaded: ${size_mb[1]:-?}." \
            "Target: at most a 10% drop (with keys/empty >= $size_target)."
        echo
        markdown_rows "$header" "${rows[@]}"
        echo "$size_plot"
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
            UNION ALL
            SELECT 30 + v.n, '', v.label, v.value
              FROM (SELECT bench.fresh_size('$table') AS bytes) f,
                   LATERAL (VALUES
                       (1, 'fresh copy of the live rows with indexes, kB', (f.bytes / 1024)::text),
                       (2, 'total / fresh copy',
                        round(pg_total_relation_size('$table')::numeric / nullif(f.bytes, 0), 2)::text))
                       AS v(n, label, value)
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
    local name=$1 table=$2 extra=$3 load i=0 pids=() load_tps=() clients script opts sampler
    shift 3
    psql_bench -c "VACUUM $table" \
        -c "SELECT pg_stat_reset_single_table_counters('$table'::regclass)" \
        -c "CHECKPOINT" >/dev/null || return 1
    sleep 1
    storage_sample "$table" "$extra" >"$dir/churn.$name.0" || return 1
    # The sizes every second, from the start of the load to its end, as
    # "seconds<TAB>total kB<TAB>heap kB<TAB>n_live_tup<TAB>n_dead_tup<TAB>
    # fresh kB<TAB>total/fresh", the size of a fresh copy of the live rows
    # (bench.fresh_size) every 15th second (NaN in between).
    printf 'seconds\ttotal_kB\theap_kB\tn_live_tup\tn_dead_tup\tfresh_kB\ttotal_over_fresh\n' \
        >"$bench_dir/churn_$name.tsv"
    (
        start=$(date +%s.%N)
        tick=0
        while :; do
            fresh="'NaN'::float8"
            [ $((tick % 15)) -eq 14 ] && fresh="bench.fresh_size('$table') / 1024.0"
            psql_bench -F $'\t' -c "SELECT round(extract(epoch FROM clock_timestamp()) - $start, 1),
                    t.total, pg_relation_size('$table') / 1024, n_live_tup, n_dead_tup,
                    round(f.kb::numeric, 0), round((t.total / nullif(f.kb, 0))::numeric, 2)
                  FROM pg_stat_user_tables,
                       LATERAL (SELECT pg_total_relation_size('$table') / 1024 AS total) t,
                       LATERAL (SELECT ($fresh)::float8 AS kb) f
                 WHERE relid = '$table'::regclass" 2>/dev/null
            tick=$((tick + 1))
            sleep 1
        done >>"$bench_dir/churn_$name.tsv"
    ) &
    sampler=$!
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
    kill "$sampler" 2>/dev/null
    wait "$sampler" 2>/dev/null
    storage_sample "$table" "$extra" >"$dir/churn.$name.2" || return 1
    churn_rows "$dir/churn.$name.0" "$dir/churn.$name.1" "$dir/churn.$name.2"
    churn_verdict "$bench_dir/churn_$name.tsv"
    for ((i = 1; i <= $#; i++)); do load_tps+=("$(cat "$dir/churn.$name.$i.tps")"); done
    (IFS='|'; echo "tps|${load_tps[*]}")
}

# key_states TABLE: the churn samples' extra rows for a keys table, its
# PROCESSING keys and the COMPLETED ones kept.
key_states() {
    echo "SELECT 'PROCESSING keys', count(*) FILTER (WHERE status = 'PROCESSING')::text FROM $1
          UNION ALL
          SELECT 'COMPLETED keys kept (retention $churn_retention)',
                 count(*) FILTER (WHERE status = 'COMPLETED')::text FROM $1"
}

# churns TABLE: whether BENCH_CHURN_TABLES names it (outbox, keys, plain:
# the keys' churn written by hand in plain SQL, on bench.idempotency_keys).
churns() { [[ " $churn_tables " == *" $1 "* ]]; }

# churn_verdict TSV: rows "label|value|value|target" from the samples: the
# largest total/fresh ratio after the first minute, and the growth of the
# mean total size from the middle third of the run to the last third.
churn_verdict() {
    awk -F'\t' -v size="$churn_size_target" -v growth="$churn_growth_target" '
        NR > 1 { n++; t[n] = $1; total[n] = $2; r[n] = $7 }
        END {
            worst = 0; last = "-"
            for (i = 1; i <= n; i++) if (r[i] != "NaN" && r[i] != "") {
                last = r[i]; if (t[i] >= 60 && r[i] + 0 > worst) worst = r[i] + 0 }
            for (i = 1; i <= n; i++) {
                if (i > n / 3 && i <= 2 * n / 3) { m += total[i]; mn++ }
                if (i > 2 * n / 3) { l += total[i]; ln++ } }
            g = (mn && ln && m > 0) ? (l / ln) / (m / mn) : 0
            printf "table and indexes / fresh copy of the live rows (largest after 1 min, last)|%.2f|%s|%s\n", \
                worst, last, (worst > 0 ? (worst <= size ? "met" : "MISSED") : "-") " (<= " size ")"
            printf "mean size, last third / middle third of the run|%.2f|-|%s\n", \
                g, (g > 0 ? (g <= growth ? "flat" : "GROWING") : "-") " (<= " growth ")" }' "$1" |
        sed 's/^/verdict|/'
}

if want churn; then
    log "churn: retention of delivered events and completed keys $churn_retention, the background workers purge (naptime and purge_naptime 1s)"
    psql_bench -c "ALTER SYSTEM SET idempotency.outbox_retention = '$churn_retention'" \
        -c "ALTER SYSTEM SET idempotency.retention = '$churn_retention'" \
        -c "ALTER SYSTEM SET idempotency.naptime = '1s'" \
        -c "ALTER SYSTEM SET idempotency.purge_naptime = '1s'" \
        -c "ALTER SYSTEM SET autovacuum_naptime = '$churn_autovacuum_naptime'" \
        -c "SELECT pg_reload_conf()" >/dev/null || failures=$((failures + 1))
    psql_bench -c "TRUNCATE idempotency.outbox, idempotency.idempotency_keys" >/dev/null

    outbox_result='' keys_result='' plain_result=''
    if churns outbox; then
        log "churn: idempotency.outbox, $producers producers + $churn_relays relays (${churn_seconds}s)"
        outbox_result=$(churn_run outbox idempotency.outbox "
            SELECT 'pending events', count(*) FILTER (WHERE state = 'pending')::text
              FROM idempotency.outbox
            UNION ALL
            SELECT 'delivered events kept (retention $churn_retention)', count(*) FILTER (WHERE state = 'delivered')::text
              FROM idempotency.outbox" \
            "$producers enqueue_extension" "$churn_relays relay_extension")
        [ -n "$outbox_result" ] || failures=$((failures + 1))
    fi

    if churns keys; then
        log "churn: idempotency.idempotency_keys, $producers workers claim + complete (${churn_seconds}s)"
        keys_result=$(churn_run keys idempotency.idempotency_keys "$(key_states idempotency.idempotency_keys)" \
            "$producers two_txn_extension -D n=0")
        [ -n "$keys_result" ] || failures=$((failures + 1))
    fi

    if churns plain; then
        # What a user would write: the same claims and completes in plain SQL
        # (two_txn_plain.sql, expiring after the same retention), a purge
        # by an index on the expiry once a second, the same autovacuum.
        log "churn: bench.idempotency_keys (plain SQL), $producers clients claim + complete, one purges (${churn_seconds}s)"
        retention_seconds=$(psql_bench -c "SELECT extract(epoch FROM interval '$churn_retention')")
        psql_bench -c "TRUNCATE bench.idempotency_keys" \
            -c "CREATE INDEX bench_keys_expiry ON bench.idempotency_keys (expires_at) WHERE expires_at IS NOT NULL" \
            >/dev/null || failures=$((failures + 1))
        plain_result=$(churn_run plain bench.idempotency_keys "$(key_states bench.idempotency_keys)" \
            "$producers churn_plain -D n=0 -D retention=$retention_seconds" "1 purge_plain")
        [ -n "$plain_result" ] || failures=$((failures + 1))
        psql_bench -c "DROP INDEX bench.bench_keys_expiry" -c "TRUNCATE bench.idempotency_keys" >/dev/null
    fi

    psql_bench -c "ALTER SYSTEM RESET idempotency.outbox_retention" \
        -c "ALTER SYSTEM RESET idempotency.retention" -c "ALTER SYSTEM RESET idempotency.naptime" \
        -c "ALTER SYSTEM RESET idempotency.purge_naptime" \
        -c "ALTER SYSTEM RESET autovacuum_naptime" \
        -c "SELECT pg_reload_conf()" >/dev/null

    # Each table run: its name, title and load, and its result.
    names=() titles=() loads=() results=()
    if churns outbox; then
        IFS='|' read -r enq_tps relay_tps _ < <(sed -n 's/^tps|//p' <<<"$outbox_result")
        names+=(outbox) titles+=(idempotency.outbox) results+=("$outbox_result")
        loads+=("$producers clients enqueuing (${enq_tps:-?} events/s), $churn_relays relays claiming + acking 100 per transaction (${relay_tps:-?} batches/s), the background worker purging")
    fi
    if churns keys; then
        IFS='|' read -r keys_tps _ < <(sed -n 's/^tps|//p' <<<"$keys_result")
        names+=(keys) titles+=(idempotency.idempotency_keys) results+=("$keys_result")
        loads+=("$producers clients claiming a new key and completing it in two transactions (${keys_tps:-?} keys/s), the background worker purging")
    fi
    if churns plain; then
        IFS='|' read -r plain_tps _ < <(sed -n 's/^tps|//p' <<<"$plain_result")
        names+=(plain) titles+=("bench.idempotency_keys, written by hand in plain SQL") results+=("$plain_result")
        loads+=("$producers clients claiming a new key and completing it in two transactions in plain SQL (${plain_tps:-?} keys/s, \`test/bench/scripts/churn_plain.sql\`), one client deleting the expired keys once a second by an index on their expiry (\`test/bench/scripts/purge_plain.sql\`)")
    fi

    plots=()
    for ((t = 0; t < ${#names[@]}; t++)); do
        plots+=("set title '${titles[t]}'")
        plots+=("plot '$bench_dir/churn_${names[t]}.tsv' using 1:2 with lines lw 2 title 'total with indexes, kB', '' using 1:3 with lines lw 2 title 'heap, kB', '' using 1:6 with points pt 7 title 'fresh copy of the live rows, kB', '' using 1:5 axes x1y2 with lines dt 2 title 'n_dead_tup (right)'")
    done
    churn_plot=$(plot_size=$((600 * ${#names[@]})),420 plot churn <<EOF
set key top left
set xlabel 'seconds'
set ylabel 'kB'
set y2label 'dead tuples'
set y2tics
set y2range [0:*]
set ytics nomirror
set multiplot layout 1,${#names[@]} title 'size under steady churn, purged after a retention of $churn_retention'
$(printf '%s\n' "${plots[@]}")
unset multiplot
EOF
)
    header="metric|start|middle|end"
    verdict_header="over the run|value|last sample|target"
    echo
    echo "storage under churn: ${churn_seconds}s per table, samples at the start, middle and end;" \
        "idempotency.outbox_retention = idempotency.retention = $churn_retention, idempotency.naptime = idempotency.purge_naptime = 1s," \
        "autovacuum_naptime = $churn_autovacuum_naptime (ALTER SYSTEM);" \
        "the background workers purge (no idem_maintenance() calls)"
    for ((t = 0; t < ${#names[@]}; t++)); do
        mapfile -t rows < <(grep -v '^tps|\|^verdict|' <<<"${results[t]}")
        mapfile -t verdicts < <(sed -n 's/^verdict|//p' <<<"${results[t]}")
        echo "${titles[t]}: ${loads[t]}"
        if [ ${#rows[@]} -gt 0 ]; then
            table_rows "$header" "${rows[@]}"
            table_rows "$verdict_header" "${verdicts[@]}"
        else echo "  (could not run)"; fi
    done
    {
        echo
        echo "## Storage under churn"
        echo
        echo "${churn_seconds}s per table, sampled at the start, middle and end;" \
            "\`idempotency.outbox_retention\` and \`idempotency.retention\` set to $churn_retention with ALTER SYSTEM," \
            "\`idempotency.naptime\` and \`idempotency.purge_naptime\` 1s: the background workers expire and purge (the benchmark" \
            "calls no \`idem_maintenance()\`); the plain SQL keys expire after the same retention," \
            "\`autovacuum_naptime\` $churn_autovacuum_naptime (ALTER SYSTEM; a queue table needs its dead rows" \
            "vacuumed more often than once a minute), autovacuum's other settings default." \
            "Counters from \`pg_stat_user_tables\`, reset at the start. The live rows' size is that of a" \
            "fresh copy of them (\`bench.fresh_size\`: the same columns, indexes and fillfactor, the rows" \
            "written anew). Targets: table and indexes at most $churn_size_target x the fresh copy after" \
            "the first minute, and flat (the mean size of the last third of the run at most" \
            "$churn_growth_target x that of the middle third)."
        for ((t = 0; t < ${#names[@]}; t++)); do
            mapfile -t rows < <(grep -v '^tps|\|^verdict|' <<<"${results[t]}")
            mapfile -t verdicts < <(sed -n 's/^verdict|//p' <<<"${results[t]}")
            echo
            echo "### ${titles[t]}"
            echo
            echo "${loads[t]}."
            echo
            if [ ${#rows[@]} -gt 0 ]; then
                markdown_rows "$header" "${rows[@]}"
                echo
                markdown_rows "$verdict_header" "${verdicts[@]}"
            else echo "(could not run)"; fi
        done
        echo
        echo "### Size over time"
        echo
        echo "Sampled every second (\`$plot_link/churn_<table>.tsv\`;" \
            "the fresh copy every 15 s): the purge shows as \`n_tup_del\` and a steady" \
            "\`n_live_tup\`; the space of the purged rows becomes reusable only once (auto)vacuum has" \
            "run on the table: the heap stays flat after each autovacuum (the drop in dead tuples) and" \
            "grows again until the next one, so the steady-state size shows only in runs spanning" \
            "several autovacuum cycles."
        echo "$churn_plot"
    } >>"$out"
fi

# idem-relay end to end (issue figures of the relay): its own benchmark,
# on its own cluster, appended as it prints them.
if want idem_relay; then
    log "idem-relay: throughput and commit-to-delivery delay"
    relay_report=$(bash "$IDEM_ROOT/test/relay/bench.sh" 2>&1) || failures=$((failures + 1))
    echo "$relay_report"
    {
        echo
        echo "## idem-relay end to end"
        echo
        echo "\`test/relay/bench.sh\`: one backlog of 100,000 events (--batch 100), without a key"
        echo "and then over 1,000 keys, drained by the hand-written FOR UPDATE SKIP LOCKED loop"
        echo "(test/bench/hand_loop.cpp; over keys also in the form that keeps per-key order, the"
        echo "baseline of the same semantics), by the extension's claim + ack in SQL, and by idem-relay"
        echo "to stdout, NATS JetStream and RabbitMQ (servers of its own on loopback), with the CPU of"
        echo "the relay, PostgreSQL and the broker; scaling with --parallel and several relays; the"
        echo "delay from the enqueuing commit to arrival at a steady 1,000 events/s."
        echo
        echo '```'
        echo "$relay_report" | grep -v '^== '
        echo '```'
    } >>"$out"
fi

# The background workers: what an idle cluster costs, and a large purge.
# Each runs on its own cluster; its report is appended under TITLE after
# the introduction lines.
worker_section() {  # worker_section SCRIPT TITLE INTRO...
    local script=$1 title=$2 report
    shift 2
    report=$(IDEM_BENCH_BUILT=1 bash "$here/$script") || failures=$((failures + 1))
    echo "$report"
    {
        echo
        echo "## $title"
        echo
        printf '%s\n' "$@"
        echo
        echo "$report"
    } >>"$out"
}
if want idle; then
    log "idle: the CPU of an idle cluster with 1, 10 and 100 databases"
    worker_section idle.sh "Idle cluster" \
        "\`test/bench/idle.sh\`: the CPU of the postmaster and all its children (from \`/proc\`)" \
        "over 60 s of a cluster whose databases all have the extension and where nothing happens," \
        "with the library preloaded and without it, and the idempotency workers started per minute."
fi
if want heartbeat; then
    log "heartbeat: 16 clients heartbeat 200 PROCESSING keys, 0.5.0's layout and the current one"
    worker_section heartbeat.sh "Heartbeat storm" \
        "\`test/bench/heartbeat.sh\`: 16 clients heartbeat 200 PROCESSING keys for 30 s, with the" \
        "background workers and autovacuum on; the HOT updates among them (\`pg_stat_user_tables\`)" \
        "and the keys table's heap and indexes before and after."
fi
if want views; then
    log "views: the monitoring views with 1000000 and 10000000 finished keys"
    worker_section views.sh "Monitoring views" \
        "\`test/bench/views.sh\`: each view read with its finished rows loaded directly (then" \
        "recounted), beside keys and events made through the functions; medians, the 0.5.0" \
        "definitions on the same rows, and the current plans with their buffers."
fi
if want purge; then
    log "purge: the worker purges ${BENCH_PURGE_KEYS:-10000000} expired keys under load"
    worker_section purge.sh "Retention purge" \
        "\`test/bench/purge.sh\`: the background worker purges expired keys (loaded with the" \
        "workers off, then analyzed, so that the statistics call every row due) while clients" \
        "claim and complete new keys; latencies of one claim + complete transaction, from" \
        "pgbench's per-transaction log."
fi
if want topic_lists; then
    log "topic_lists: claims over 1, 1000 and ${BENCH_TOPICS:-100000} listed topics"
    worker_section topic_lists.sh "Claims over long topic lists" \
        "\`test/bench/topic_lists.sh\`: ${BENCH_TOPICS:-100000} topics with one pending event each;" \
        "outbox_claim of 100 over a list of 1, 1,000 and all of them against the claim over every" \
        "topic, each claim rolled back; and what reading the list alone costs."
fi
if want views_traffic; then
    log "views_traffic: the views under steady claim + complete traffic"
    worker_section views_traffic.sh "Monitoring views under traffic" \
        "\`test/bench/views_traffic.sh\`: ${BENCH_TRAFFIC_KEYS:-10000000} finished keys, then claim +" \
        "complete of new keys with 5-minute leases at ${BENCH_TRAFFIC_RATE:-2000}/s, workers and autovacuum" \
        "on; each view read every ${BENCH_TRAFFIC_SCRAPE:-5} s; and the most finished keys waiting to be settled."
fi
if want tombstones; then
    log "tombstones: bytes per finished key, full row and tombstone"
    worker_section tombstones.sh "Tombstones: bytes per finished key" \
        "\`test/bench/tombstones.sh\`: ${BENCH_TOMBSTONE_KEYS:-1000000} uniformly random finished keys" \
        "loaded directly, measured as full rows, then moved into tombstones by the purge and measured again."
fi
if want steps; then
    log "steps: a three-step job, the extension against PL/pgSQL with a steps table"
    worker_section steps.sh "Multi-step work: a job of three steps" \
        "\`test/bench/steps.sh\`: a claim, three steps recorded with \`idem_step\` and a complete" \
        "(five transactions), against the same job written by hand in PL/pgSQL with a table of steps" \
        "(\`test/bench/steps_baseline.sql\`), side by side on one cluster; then bytes per finished job."
fi
if want sql_edition; then
    log "sql_edition: the SQL edition beside the C++ extension and PL/pgSQL"
    worker_section sql_edition.sh "The SQL edition beside the C++ extension" \
        "\`test/bench/sql_edition.sh\`: the claim section's scenarios, the same pgbench scripts against" \
        "the C++ extension and the SQL edition (docs/managed-postgres.md) in two databases of one cluster," \
        "and the hand-written PL/pgSQL baseline (\`test/bench/baselines.sql\`), side by side."
fi
if want growth; then
    log "growth: the keys table grown to ${BENCH_GROWTH_STEPS:-20000000} finished keys"
    worker_section growth.sh "Growth to 20 million keys" \
        "\`test/bench/growth.sh\`: uniformly random finished keys loaded directly in steps, on" \
        "PostgreSQL's default memory and checkpoint settings; at each step bytes per key, duplicates" \
        "and new keys per second, and the WAL per new key, as ratios to the first step."
fi

load_summary=$(sort -n "$dir/load.log" | awk '{ v[NR] = $1 } END {
    if (NR) printf "median %s, min %s, max %s (%d samples)", v[int((NR + 1) / 2)], v[1], v[NR], NR }')
if [ -n "$load_summary" ]; then
    echo "load average (1 min) over the run, sampled every minute: $load_summary; $(nproc) cores"
    { echo; echo "Load average (1 min) of the machine over the run, sampled every minute:" \
        "$load_summary, on $(nproc) cores."; } >>"$out"
fi
log "results written to $out"

if [ "$failures" -gt 0 ]; then
    echo "bench: $failures run(s) failed" >&2
    exit 1
fi
exit 0
