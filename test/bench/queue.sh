# Sourced by test/bench/run.sh (its helpers and cluster): the outbox's
# queue and producer cases.
#
# queue      claim latency (median and p99 of outbox_claim(relay, 100, topics
#            => '{bench}') alone, each batch acked in its claim's
#            transaction; the first claim of the session apart) and relay
#            throughput (BENCH_QUEUE_RELAYS relays claiming and acking 100 per
#            transaction for BENCH_SECONDS) with a backlog of BENCH_BACKLOG
#            events of topic bench (keys from 1000 values), and besides it:
#              blocked-0, -100k, -1m  one key whose head is in flight at another
#                                     relay (1 hour lease) with 0, 100,000 and
#                                     1,000,000 events waiting behind it
#              keys-100k              the backlog spread over 100,000 keys
#              other-topic            300,000 pending events of another topic
#              dead-1m                1,000,000 events acked and not vacuumed
#                                     (autovacuum off for the run)
#            Targets: latency with the blocked chain <= 2x blocked-0, relay
#            throughput >= 0.8x blocked-0.
# producers  two transactions enqueueing the same 200 keys in opposite
#            orders, and disjoint sorted sets of 200 and 1,000 keys (20
#            transactions each, pgbench -c 2): failed (deadlocked)
#            transactions; enqueue latency of 4 producers (p50, p99) while a
#            transaction that enqueued 100 or 10,000 keyed events stays
#            open, against none open; enqueue throughput of 16 producers over
#            30 and 10,000 topics, notifications on and off.

queue_claims=${BENCH_QUEUE_CLAIMS:-200}
queue_relays=${BENCH_QUEUE_RELAYS:-2}
queue_latency_target=2.0
queue_throughput_target=0.8
notify_target=0.90

# queue_case LABEL KEYS SQL...: a fresh outbox, the case's setup, the
# backlog (keys from KEYS values); prints
# median_ms|p99_ms|first_ms|pages|delivered_per_s, or "failed".
queue_case() {
    local label=$1 keys=$2 since delivered
    shift 2
    local setup=()
    for sql in "$@"; do setup+=(-c "$sql"); done
    psql_bench -c "TRUNCATE idempotency.outbox" -c "ALTER TABLE idempotency.outbox RESET (autovacuum_enabled)" \
        -c "DELETE FROM bench.claim_times WHERE label = '$label'" >/dev/null || { echo failed; return; }
    if [ ${#setup[@]} -gt 0 ]; then psql_bench "${setup[@]}" >/dev/null || { echo failed; return; }; fi
    # A vacuum (not for the dead entries' case), so that autovacuum does not
    # run during the measurement.
    local tidy="VACUUM ANALYZE idempotency.outbox"
    case "$label" in dead-*) tidy="ANALYZE idempotency.outbox" ;; esac
    psql_bench -c "SELECT bench.queue_fill($backlog, 'bench', $keys)" -c "$tidy" \
        -c "CHECKPOINT" >/dev/null || { echo failed; return; }
    psql_bench -c "CALL bench.claim_loop('$label', '{bench}', $queue_claims)" >/dev/null ||
        { echo failed; return; }
    since=$(psql_bench -c "SELECT clock_timestamp()")
    pgbench_run "queue/$label" "$dir/queue.$label.log" "$queue_relays" "$seconds" relay_queue >/dev/null
    delivered=$(psql_bench -c "
        SELECT coalesce(round(count(*) / nullif(extract(epoch FROM max(delivered_at) - min(delivered_at)), 0)), 0)
          FROM idempotency.outbox WHERE state = 'delivered' AND delivered_at >= '$since'") ||
        { echo failed; return; }
    psql_bench -F '|' -c "SELECT round(median_ms::numeric, 2), round(p99_ms::numeric, 2),
                                 round(first_ms::numeric, 1), round(pages::numeric), $delivered
                            FROM bench.claim_summary('$label')" || echo failed
}

if want queue; then
    rows=()
    declare -A q_median=() q_p99=() q_rate=()
    cases="blocked-0 blocked-100k blocked-1m keys-100k other-topic dead-1m"
    for label in $cases; do
        case "$label" in
        blocked-0) what="blocked head, 0 behind"; sql=("CALL bench.queue_block('bench', 0)") ;;
        blocked-100k) what="blocked head, 100,000 behind"; sql=("CALL bench.queue_block('bench', 100000)") ;;
        blocked-1m) what="blocked head, 1,000,000 behind"; sql=("CALL bench.queue_block('bench', 1000000)") ;;
        keys-100k) what="backlog over 100,000 keys"; sql=() ;;
        other-topic) what="300,000 pending of another topic"; sql=("SELECT bench.queue_fill(300000, 'analytics', 0)") ;;
        dead-1m) what="1,000,000 acked, not vacuumed"
            sql=("ALTER TABLE idempotency.outbox SET (autovacuum_enabled = off)" "CALL bench.queue_dead('bench', 1000000)") ;;
        esac
        log "queue: $what (claims, then ${queue_relays} relays for ${seconds}s)"
        keys=1000
        [ "$label" = keys-100k ] && keys=100000
        result=$(queue_case "$label" "$keys" "${sql[@]}")
        if [ "$result" = failed ]; then failures=$((failures + 1)); continue; fi
        IFS='|' read -r med p99 first pages rate <<<"$result"
        q_median[$label]=$med q_p99[$label]=$p99 q_rate[$label]=$rate
        rows+=("$label|$what|$med|$p99|$first|$pages|$rate")
    done
    psql_bench -c "ALTER TABLE idempotency.outbox RESET (autovacuum_enabled)" >/dev/null
    base_med=${q_median[blocked-0]:-} base_rate=${q_rate[blocked-0]:-}
    out_rows=()
    for row in "${rows[@]}"; do
        IFS='|' read -r label what med p99 first pages rate <<<"$row"
        lr=$(ratio "$med" "$base_med") tr=$(ratio "$rate" "$base_rate")
        case "$label" in
        blocked-0) target="baseline" ;;
        *) lv=$(awk -v r="$lr" -v t="$queue_latency_target" 'BEGIN { print (r != "-" && r <= t) ? "met" : "MISSED" }')
           target="latency $lv / throughput $(verdict "$tr" "$queue_throughput_target")" ;;
        esac
        out_rows+=("$what|$med|$p99|$first|$pages|$rate|$lr|$tr|$target")
    done
    header="case|claim median ms|claim p99 ms|first claim ms|index pages per claim|relay delivered/s|latency vs blocked-0|throughput vs blocked-0|target (latency <= ${queue_latency_target}x, throughput >= ${queue_throughput_target}x)"
    echo
    echo "outbox queue: claims of 100 (topic bench) and relay throughput ($queue_relays relays), with a backlog of $backlog events besides each case"
    table_rows "$header" "${out_rows[@]}"
    {
        echo
        echo "## Outbox: blocked keys, other topics, dead entries"
        echo
        echo "Each case starts from an empty outbox, adds what it names, then a backlog of $backlog" \
            "pending events of topic \`bench\` (keys from 1000 values; written as \`outbox_enqueue\`" \
            "writes them, one INSERT ... SELECT for speed). *Claim*: $queue_claims calls of" \
            "\`outbox_claim('bench-relay', 100, '1 min', '{bench}')\` in one session, each acked in" \
            "its transaction, timed around the claim alone (median and p99; the session's first claim" \
            "apart), with the index pages it read. *Relay*: $queue_relays pgbench clients claiming" \
            "and acking 100 per transaction for ${seconds}s; delivered events over the span of" \
            "their \`delivered_at\`."
        echo
        echo "- blocked head: one key whose head another relay holds in flight (a lease of 1 hour)," \
            "with 0, 100,000 or 1,000,000 events of that key waiting behind it"
        echo "- backlog over 100,000 keys: the same backlog, keys from 100,000 values"
        echo "- another topic: 300,000 pending events of topic \`analytics\`, which the claims do not ask for"
        echo "- acked, not vacuumed: 1,000,000 events made pending and then delivered (as acks do) with" \
            "autovacuum off: their dead index entries stay"
        echo
        echo "Targets: with the blocked chain, claim latency at most ${queue_latency_target} x and" \
            "relay throughput at least ${queue_throughput_target} x those of the blocked head with nothing behind it."
        echo
        markdown_rows "$header" "${out_rows[@]}"
    } >>"$out"
    unset q_median q_p99 q_rate
fi

# pgbench_failed LOGFILE: failed transactions pgbench reported.
pgbench_failed() {
    sed -nE 's/^number of failed transactions: ([0-9]+).*/\1/p' "$1" | head -n 1
}

# latency_percentiles LOGDIR PREFIX: p50|p99 (ms) of pgbench -l logs.
latency_percentiles() {
    cat "$1/$2".* 2>/dev/null | awk '{ print $3 / 1000 }' | sort -n | awk '
        { v[NR] = $1 } END { if (NR == 0) { print "-|-"; exit }
          half = int((NR + 1) / 2); high = int(NR * 0.99); if (high < 1) high = 1
          printf "%.2f|%.2f\n", v[half], v[high] }'
}

if want producers; then
    prow=()
    # Deadlocks: 2 clients, 20 transactions each.
    for kind in crossing-200 disjoint-200 disjoint-1000; do
        n=${kind#*-}
        case "$kind" in
        crossing-*) script="CALL bench.enqueue_keys('x', $n, :client_id % 2 = 1);" ;;
        disjoint-*) script="\\set c :client_id % 2
\\if :c
CALL bench.enqueue_keys('b', $n, false);
\\else
CALL bench.enqueue_keys('a', $n, false);
\\endif" ;;
        esac
        printf '%s\n' "$script" >"$dir/scripts/producers_$kind.sql"
        chown "$IDEM_OS_USER" "$dir/scripts/producers_$kind.sql"
        psql_bench -c "TRUNCATE idempotency.outbox" >/dev/null
        log "producers: $kind (2 clients x 20 transactions)"
        as_pg "$bindir/pgbench" -h "$dir" -p "$port" -U postgres -n -c 2 -j 2 -t 20 \
            -f "$dir/scripts/producers_$kind.sql" bench >"$dir/producers.$kind.log" 2>&1
        failed=$(pgbench_failed "$dir/producers.$kind.log")
        aborted=$(grep -c 'deadlock detected' "$dir/producers.$kind.log")
        prow+=("deadlocks|$kind: 2 clients x 20 transactions, $n keys each|${failed:-?} of 40 transactions failed, $aborted deadlock errors|0")
    done
    # Producers beside an open bulk transaction.
    printf '%s\n' "\\set k random(1, 10000)" \
        "SELECT idempotency.outbox_enqueue('bench', '{}', 'x' || lpad(:k::text, 5, '0'));" \
        >"$dir/scripts/producers_single.sql"
    chown "$IDEM_OS_USER" "$dir/scripts/producers_single.sql"
    for bulk in 0 100 10000; do
        psql_bench -c "TRUNCATE idempotency.outbox" -c "CHECKPOINT" >/dev/null
        bulk_pid=
        if [ "$bulk" -gt 0 ]; then
            psql_bench -c "BEGIN" -c "CALL bench.enqueue_keys('x', $bulk, false)" \
                -c "SELECT pg_sleep($seconds + 3)" -c "COMMIT" >/dev/null &
            bulk_pid=$!
            sleep 2
        fi
        log "producers: 4 clients for ${seconds}s beside an open transaction of $bulk events"
        rm -f "$dir"/lat.*
        (cd "$dir" && as_pg "$bindir/pgbench" -h "$dir" -p "$port" -U postgres -n -c 4 -j 2 -T "$seconds" \
            -M prepared -l --log-prefix="$dir/lat" -f "$dir/scripts/producers_single.sql" bench \
            >"$dir/producers.bulk$bulk.log" 2>&1)
        [ -n "$bulk_pid" ] && wait "$bulk_pid"
        IFS='|' read -r p50 p99 <<<"$(latency_percentiles "$dir" lat)"
        tps=$(sed -nE 's/^tps = ([0-9.]+) .*/\1/p' "$dir/producers.bulk$bulk.log" | head -n 1)
        prow+=("open bulk transaction|$bulk keyed events open (keys from the producers' 10,000)|p50 ${p50} ms, p99 ${p99} ms, $(printf '%.0f' "${tps:-0}") tps|-")
    done
    # Many topics, notifications on and off.
    for topics in 30 10000; do
        printf '%s\n' "\\set t random(1, $topics)" "\\set k random(1, 1000)" \
            "SELECT idempotency.outbox_enqueue('t' || :t, '{\"order\": 42}', :k::text);" \
            >"$dir/scripts/producers_topics.sql"
        chown "$IDEM_OS_USER" "$dir/scripts/producers_topics.sql"
        declare -A ttps=()
        modes=(on off)
        for ((round = 1; round <= outbox_rounds; round++)); do
            for mode in "${modes[@]}"; do
                psql_bench -c "TRUNCATE idempotency.outbox" -c "CHECKPOINT" >/dev/null
                log "producers: 16 clients, $topics topics, notifications $mode (round $round/$outbox_rounds)"
                ttps[$mode]="${ttps[$mode]:-} $(pgbench_pgoptions="-c idempotency.outbox_notify=$mode" \
                    pgbench_run "topics/$topics/$mode" "$dir/topics.$topics.$mode.log" 16 "$seconds" \
                    producers_topics)"
            done
            modes=("${modes[1]}" "${modes[0]}")
        done
        # shellcheck disable=SC2086
        on=$(median ${ttps[on]}) off=$(median ${ttps[off]})
        r=$(ratio "$on" "$off")
        prow+=("many topics|16 producers over $topics topics|$on tps notify on, $off off: $r|$(verdict "$r" "$notify_target")")
        unset ttps
    done
    header="case|setting|result|target"
    echo
    echo "outbox producers"
    table_rows "$header" "${prow[@]}"
    {
        echo
        echo "## Outbox: producers"
        echo
        echo "- deadlocks: two pgbench clients, 20 transactions each, each enqueueing one event for" \
            "each of N keys (topic \`bench\`): the same keys in opposite orders (crossing), or disjoint" \
            "sorted sets (target: 0 failed)"
        echo "- open bulk transaction: 4 clients enqueue one keyed event per transaction (keys from 10,000)" \
            "for ${seconds}s while one transaction that enqueued N events of those keys stays open" \
            "(latency from pgbench -l)"
        echo "- many topics: 16 clients enqueue one event per transaction over N topics, with" \
            "\`idempotency.outbox_notify\` on (the notifier announces the commits) and off; target: on" \
            ">= ${notify_target} x off"
        echo
        markdown_rows "$header" "${prow[@]}"
    } >>"$out"
fi
