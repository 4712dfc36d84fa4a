#!/usr/bin/env bash
# Claims over long topic lists: BENCH_TOPICS (100,000) topics with one
# pending event each, and outbox_claim(relay, 100, topics => a list of 1,
# 1,000 and all BENCH_TOPICS topics) against the claim over every topic
# (topics => NULL), in one run on one cluster. Each claim runs in a
# transaction that is rolled back, so every claim sees the same backlog.
# Prints Markdown on stdout: the median and p99 per list, each median
# divided by the NULL claim's, and divided by the NULL claim's plus what
# reading the list alone costs (the same subquery, its cardinality). Target:
# at 100,000 topics <= 2x the NULL claim. Then the claim of a relay role that
# grant_relay limited to all BENCH_TOPICS topics (topics => NULL: its
# granted list), and the same with an ack of what it claimed, beside the
# owner's claim and claim + ack.
#
# Environment: BENCH_TOPICS, BENCH_TOPIC_CLAIMS (claims per list, 50),
# BENCH_TOPICS_PORT (54436). Run by `make bench` (section topic_lists) or
# alone.
set -u
. "$(dirname "$0")/../lib/common.sh"

topics=${BENCH_TOPICS:-100000}
claims=${BENCH_TOPIC_CLAIMS:-50}
port=${BENCH_TOPICS_PORT:-54436}
target=2.0

if [ -z "${IDEM_BENCH_BUILT:-}" ]; then build_and_install || exit 1; fi
bindir=$(pg_bindir)

dir=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-topics.XXXXXX")
cleanup() { stop_cluster "$dir"; rm -rf "$dir"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

start_cluster "$dir" "$port" "shared_buffers = 128MB" "idempotency.worker_enabled = off" ||
    { cat "$dir/server.log" >&2; exit 1; }
psql_bench() { as_pg "$bindir/psql" -h "$dir" -p "$port" -U postgres -d postgres -X -q -A -t -v ON_ERROR_STOP=1 "$@"; }

psql_bench -c "CREATE EXTENSION idempotency" \
    -c "SET idempotency.outbox_notify = off" \
    -c "SELECT count(idempotency.outbox_enqueue('topic-' || i, '{}')) FROM generate_series(1, $topics) i" \
    -c "CREATE TABLE lists (n int PRIMARY KEY, topics text[])" \
    -c "INSERT INTO lists SELECT n, ARRAY(SELECT 'topic-' || i FROM generate_series(1, n) i)
          FROM unnest(ARRAY[1, 1000, $topics]) n" \
    -c "CREATE ROLE bench_relay LOGIN" \
    -c "SELECT idempotency.grant_relay('bench_relay', (SELECT topics FROM lists WHERE n = $topics))" \
    -c "VACUUM ANALYZE" -c "CHECKPOINT" >/dev/null || exit 1

# run_ms NAME SQL [ROLE]: the median and p99 (ms) of CLAIMS transactions
# running SQL as ROLE (postgres), from pgbench's per-transaction log.
run_ms() {
    local name=$1 script=$dir/$1.sql
    printf '%s\n' "BEGIN;" "$2" "ROLLBACK;" >"$script"
    chmod 644 "$script"
    (cd "$dir" && as_pg "$bindir/pgbench" -h "$dir" -p "$port" -U "${3:-postgres}" -n -t "$claims" \
        -f "$script" -l --log-prefix="$dir/log_$name" postgres >/dev/null 2>&1) || { echo "failed failed"; return; }
    sort -n -k3,3 "$dir"/log_"$name".* | awk '{ v[NR] = $3 / 1000 }
        END { printf "%.3f %.3f\n", v[int((NR + 1) / 2)], v[int(NR * 0.99 + 0.999)] }'
}
# claim_ms LIST: claims of 100 over LIST (a size in lists, or NULL).
claim_ms() {
    local arg=NULL
    [ "$1" = NULL ] || arg="(SELECT topics FROM lists WHERE n = $1)"
    run_ms "claim_$1" "SELECT count(*) FROM idempotency.outbox_claim('bench', 100, topics => $arg);"
}
# read_ms LIST: reading the list alone.
read_ms() { run_ms "read_$1" "SELECT cardinality((SELECT topics FROM lists WHERE n = $1));"; }

read -r base base_p99 < <(claim_ms NULL)
echo "| topics listed | claim of 100, median | p99 | reading the list alone, median | ÷ topics => NULL | ÷ (NULL claim + reading the list) |"
echo "|---|---:|---:|---:|---:|---:|"
echo "| NULL (every topic) | $base ms | $base_p99 ms | | 1.00 | |"
last=n/a
for list in 1 1000 "$topics"; do
    read -r median p99 < <(claim_ms "$list")
    read -r reading _ < <(read_ms "$list")
    ratio=$(awk -v a="$median" -v b="$base" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }')
    floor=$(awk -v a="$median" -v b="$base" -v r="$reading" 'BEGIN { if (b + r > 0) printf "%.2f", a / (b + r); else print "n/a" }')
    echo "| $list | $median ms | $p99 ms | $reading ms | $ratio | $floor |"
    [ "$list" = "$topics" ] && last=$ratio
done
claim_sql="SELECT count(*) FROM idempotency.outbox_claim('bench', 100);"
ack_sql="SELECT idempotency.outbox_ack(array_agg(id)) FROM idempotency.outbox_claim('bench', 100);"
read -r granted granted_p99 < <(run_ms granted "$claim_sql" bench_relay)
read -r owner_ack _ < <(run_ms owner_ack "$ack_sql")
read -r granted_ack granted_ack_p99 < <(run_ms granted_ack "$ack_sql" bench_relay)
granted_ratio=$(awk -v a="$granted" -v b="$base" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }')
ack_ratio=$(awk -v a="$granted_ack" -v b="$owner_ack" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }')
echo "| relay role granted all $topics (topics => NULL) | $granted ms | $granted_p99 ms | | $granted_ratio | |"
echo "| relay role granted all $topics, claim + ack | $granted_ack ms | $granted_ack_p99 ms | | $ack_ratio (÷ the owner's claim + ack, $owner_ack ms) | |"
echo
echo "$topics topics with one pending event each, $claims claims per list, each rolled back."
echo "Target at $topics listed topics: <= ${target}x the claim over every topic; measured ${last}x."
