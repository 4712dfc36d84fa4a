# Sourced by test/bench/run.sh (its helpers and cluster): sessions waiting
# in idem_claim(key, wait => ...) (docs/waiting.md).
#
# crowd  one key, BENCH_CROWD (100) sessions waiting for it: the holder's
#        autocommit idem_complete with the crowd waiting against the same
#        call with nobody waiting (BENCH_CROWD_ROUNDS rounds of each,
#        interleaved; median), and the delay from the holder's completed_at
#        (its clock reading before its commit) to each waiter's
#        clock_timestamp() right after its answer (median, p99 and max over
#        all rounds). Then clients working on other keys (one_txn, 4 clients,
#        BENCH_SECONDS) while BENCH_IDLE_WAITERS (200) sessions wait for keys
#        nobody completes, against the same run with none waiting: their tps,
#        and the CPU the waiting sessions spent meanwhile.
#        Targets: the holder's complete with the crowd <= 2x without; the
#        waiters' p99 <= 20 ms; the other clients' tps with the idle waiters
#        >= 0.95x without.

crowd=${BENCH_CROWD:-100}
crowd_rounds=${BENCH_CROWD_ROUNDS:-5}
idle_waiters=${BENCH_IDLE_WAITERS:-200}
crowd_holder_target=2.0
crowd_p99_target=20
crowd_idle_target=0.95

# The waiters' pgbench script: one claim with wait, its answer time kept in
# bench.crowd_answers (unlogged: the waiters write no WAL), then a pause so
# that the sessions are still there while the others answer.
crowd_scripts() {
    cat >"$dir/scripts/crowd_wait.sql" <<'EOF'
INSERT INTO bench.crowd_answers
SELECT :key, clock_timestamp(), outcome FROM idempotency.idem_claim(:key, wait => interval '60 seconds');
\sleep 2 s
EOF
    cat >"$dir/scripts/crowd_idle_wait.sql" <<'EOF'
SELECT outcome FROM idempotency.idem_claim('idle-' || :client_id::text, wait => interval '10 minutes');
EOF
    chown "$IDEM_OS_USER" "$dir/scripts/crowd_wait.sql" "$dir/scripts/crowd_idle_wait.sql"
    psql_bench -c "CREATE UNLOGGED TABLE IF NOT EXISTS bench.crowd_answers
                       (key text, answered_at timestamptz, outcome text)"
}

# waiting_sessions: client sessions asleep in an idempotency wait.
waiting_sessions() {
    psql_bench -c "SELECT count(*) FROM pg_stat_activity
                    WHERE backend_type = 'client backend' AND wait_event_type = 'Extension'"
}

# wait_for_sleepers N: until N sessions wait (at most 60 s); false otherwise.
wait_for_sleepers() {
    local i
    for ((i = 0; i < 600; i++)); do
        [ "$(waiting_sessions)" -ge "$1" ] && return 0
        sleep 0.1
    done
    return 1
}

# holder_complete KEY TOKEN: the milliseconds of an autocommit idem_complete,
# as psql times the statement.
holder_complete() {
    psql_bench -c '\timing on' \
        -c "SELECT 1 FROM idempotency.idem_complete('$1', $2, '{\"done\": true}')" |
        sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p'
}

# crowd_round ROUND WAITERS: prints the holder's complete in ms; with
# waiters, their answers are in bench.crowd_answers under the round's key.
crowd_round() {
    local key="crowd-$1-$2" waiters=$2 token ms pgb=""
    token=$(psql_bench -c "SELECT token FROM idempotency.idem_claim('$key', lease => '5 min')") ||
        { echo failed; return; }
    if [ "$waiters" -gt 0 ]; then
        as_pg "$bindir/pgbench" -h "$dir" -p "$port" -U postgres -n -M prepared -c "$waiters" -j 2 \
            -t 1 -D key="$key" -f "$dir/scripts/crowd_wait.sql" bench >"$dir/crowd.$1.log" 2>&1 &
        pgb=$!
        if ! wait_for_sleepers "$waiters"; then
            kill "$pgb" 2>/dev/null
            echo failed
            return
        fi
    fi
    ms=$(holder_complete "$key" "$token")
    [ -n "$pgb" ] && wait "$pgb"
    echo "${ms:-failed}"
}

# waiters_cpu_ticks: CPU ticks the sessions now waiting have spent so far.
waiters_cpu_ticks() {
    psql_bench -c "SELECT pid FROM pg_stat_activity
                    WHERE backend_type = 'client backend' AND wait_event_type = 'Extension'" |
        while read -r pid; do sed 's/^.*) //' "/proc/$pid/stat" 2>/dev/null; done |
        awk '{ t += $12 + $13 } END { print t + 0 }'
}

# idle_waiters_run WITH: one_txn (4 clients) for $seconds, with or without
# $idle_waiters sessions waiting for keys nobody completes; prints
# "tps|waiters' % of one core".
idle_waiters_run() {
    local with=$1 tps pgb="" before=0 after=0 tokens
    reset_tables || { echo "failed|-"; return; }
    if [ "$with" = with ]; then
        tokens=$(psql_bench -c "SELECT string_agg(token::text, ',' ORDER BY i)
            FROM generate_series(0, $idle_waiters - 1) AS i,
                 LATERAL idempotency.idem_claim('idle-' || i, lease => '10 min')") ||
            { echo "failed|-"; return; }
        as_pg "$bindir/pgbench" -h "$dir" -p "$port" -U postgres -n -M prepared -c "$idle_waiters" \
            -j 2 -t 1 -f "$dir/scripts/crowd_idle_wait.sql" bench >"$dir/crowd.idle.log" 2>&1 &
        pgb=$!
        wait_for_sleepers "$idle_waiters" || { kill "$pgb"; echo "failed|-"; return; }
        before=$(waiters_cpu_ticks)
    fi
    tps=$(pgbench_run "crowd idle/$with" "$dir/crowd.one_txn.$with.log" 4 "$seconds" \
        one_txn_extension -D n=0)
    if [ -n "$pgb" ]; then
        after=$(waiters_cpu_ticks)
        # The waiters answer once their keys complete.
        psql_bench -c "SELECT count(idempotency.idem_complete('idle-' || i - 1, t))
            FROM unnest('{$tokens}'::bigint[]) WITH ORDINALITY AS u(t, i)" >/dev/null
        wait "$pgb"
    fi
    echo "$tps|$(awk -v a="$before" -v b="$after" -v hz="$(getconf CLK_TCK)" -v s="$seconds" \
        'BEGIN { printf "%.1f", (b - a) * 100 / hz / s }')"
}

if want crowd; then
    crowd_scripts >/dev/null || failures=$((failures + 1))
    psql_bench -c "TRUNCATE bench.crowd_answers" >/dev/null
    alone_runs=""
    crowd_runs=""
    for ((round = 1; round <= crowd_rounds; round++)); do
        log "crowd: round $round/$crowd_rounds, the holder's complete alone and with $crowd waiting"
        result=$(crowd_round "$round" 0)
        [ "$result" = failed ] && failures=$((failures + 1))
        alone_runs="$alone_runs $result"
        result=$(crowd_round "$round" "$crowd")
        [ "$result" = failed ] && failures=$((failures + 1))
        crowd_runs="$crowd_runs $result"
    done
    # shellcheck disable=SC2086
    alone_ms=$(printf '%s\n' $alone_runs | sort -n | awk '{ v[NR] = $1 } END { print (NR ? v[int((NR + 1) / 2)] : "failed") }')
    # shellcheck disable=SC2086
    crowd_ms=$(printf '%s\n' $crowd_runs | sort -n | awk '{ v[NR] = $1 } END { print (NR ? v[int((NR + 1) / 2)] : "failed") }')
    IFS='|' read -r answers p50 p99 worst <<<"$(psql_bench -F '|' -c "
        SELECT count(*) FILTER (WHERE a.outcome = 'completed') || '/' || count(*),
               round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 1),
               round(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)::numeric, 1),
               round(max(ms)::numeric, 1)
          FROM (SELECT a.outcome, extract(epoch FROM a.answered_at - k.completed_at) * 1000 AS ms
                  FROM bench.crowd_answers a
                  JOIN idempotency.idempotency_keys k ON k.scope = 'default' AND k.key = a.key) a")"
    holder_ratio=$(awk -v c="$crowd_ms" -v a="$alone_ms" 'BEGIN { if (a > 0) printf "%.2f", c / a; else print "-" }')
    holder_verdict=$(awk -v r="$holder_ratio" -v t="$crowd_holder_target" 'BEGIN { if (r == "-") print "-"; else print (r <= t ? "met" : "MISSED") }')
    p99_verdict=$(awk -v p="$p99" -v t="$crowd_p99_target" 'BEGIN { if (p == "") print "-"; else print (p <= t ? "met" : "MISSED") }')

    log "crowd: one_txn at 4 clients without and with $idle_waiters sessions waiting for other keys"
    IFS='|' read -r tps_without _ <<<"$(idle_waiters_run without)"
    IFS='|' read -r tps_with waiters_cpu <<<"$(idle_waiters_run with)"
    idle_ratio=$(ratio "$tps_with" "$tps_without")

    rows=("holder's autocommit idem_complete, median of $crowd_rounds|$alone_ms ms alone, $crowd_ms ms with $crowd waiting: $holder_ratio x|$holder_verdict (<= $crowd_holder_target x)"
        "waiters' answers after the holder's completed_at ($answers completed)|median $p50 ms, p99 $p99 ms, max $worst ms|$p99_verdict (p99 <= $crowd_p99_target ms)"
        "one_txn at 4 clients, $idle_waiters sessions waiting for other keys|$tps_with tps with, $tps_without tps without: $idle_ratio x; the waiters spent $waiters_cpu% of a core|$(verdict "$idle_ratio" "$crowd_idle_target") (>= $crowd_idle_target x)")
    header="case|result|target"
    echo
    echo "waiting crowd: $crowd sessions waiting for one key, $crowd_rounds rounds; $idle_waiters sessions waiting for other keys:"
    table_rows "$header" "${rows[@]}"
    {
        echo
        echo "## Waiting sessions"
        echo
        echo "\`test/bench/crowd.sh\`: $crowd sessions block in \`idem_claim(key, wait => '60s')\` on a key" \
            "another session holds, which then completes it in an autocommit \`idem_complete\` (timed by" \
            "psql), against the same complete with nobody waiting: $crowd_rounds rounds of each," \
            "interleaved, medians. Each waiter records \`clock_timestamp()\` right after its answer;" \
            "its delay is counted from the holder's \`completed_at\` (read before its commit, so the" \
            "commit's WAL flush is included). Then \`one_txn\` (extension) at 4 clients for ${seconds}s" \
            "while $idle_waiters sessions wait for keys nobody completes, against the same run with" \
            "none waiting, and the CPU those sessions spent meanwhile (from \`/proc\`)." \
            "See [waiting.md](waiting.md) for how waiters are woken."
        echo
        markdown_rows "$header" "${rows[@]}"
    } >>"$out"
fi
