# Helpers shared by the relay harnesses (run.sh, brokers.sh), sourced after
# test/lib/common.sh. They read the caller's globals: dir (the run's
# folder), port and db (its cluster), bindir, relay_bin, and they keep
# passed, failed, number and pids.

ok() { number=$((number + 1)); passed=$((passed + 1)); echo "ok $number - $1"; }
not_ok() {
    number=$((number + 1)); failed=$((failed + 1)); echo "not ok $number - $1"
    [ $# -gt 1 ] && printf '  %s\n' "${@:2}"
    return 0
}
# check NAME COMMAND...: ok when the command succeeds.
check() { local name=$1; shift; if "$@"; then ok "$name"; else not_ok "$name"; fi; }

sql() { as_pg "$bindir/psql" -X -q -At -h "$dir" -p "$port" -U postgres -d "$db" -v ON_ERROR_STOP=1 "$@"; }
# wait_until SECONDS COMMAND...: polls every 0.1 s.
wait_until() {
    local limit=$1; shift
    local deadline=$((SECONDS + limit))
    while ! "$@"; do
        [ "$SECONDS" -ge "$deadline" ] && return 1
        sleep 0.1
    done
}
sql_is() { [ "$(sql -c "$1" 2>/dev/null)" = "$2" ]; }
states() {
    sql -c "SELECT coalesce(string_agg(state || '=' || n, ' ' ORDER BY state), '') FROM
            (SELECT state::text, count(*) AS n FROM idempotency.outbox WHERE topic = '$1' GROUP BY 1) s"
}

# start_relay NAME ARGS...: runs idem-relay in the background with stdout
# and stderr in $dir/NAME.out and $dir/NAME.err; sets relay_pid. (Not under
# timeout(1), which would pass our signals on twice; every wait below is
# bounded and the cleanup kills what is left.)
start_relay() {
    local name=$1; shift
    "$relay_bin" --relay "$name" "$@" >"$dir/$name.out" 2>"$dir/$name.err" &
    relay_pid=$!
    pids+=("$relay_pid")
}
# stop_relay PID SECONDS [SIGNAL]: SIGTERM (or SIGNAL), then the exit status
# (124 when it did not exit in time, and then it is killed).
stop_relay() {
    local pid=$1 limit=$2 signal=${3:-TERM}
    kill -"$signal" "$pid" 2>/dev/null
    local deadline=$((SECONDS + limit))
    while kill -0 "$pid" 2>/dev/null; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            kill -KILL "$pid" 2>/dev/null
            wait "$pid" 2>/dev/null
            return 124
        fi
        sleep 0.05
    done
    wait "$pid"
}
# once NAME SECONDS ARGS...: a --once run in the foreground; its exit status.
once() {
    local name=$1 limit=$2; shift 2
    timeout -s KILL "$limit" "$relay_bin" --relay "$name" --once "$@" >"$dir/$name.out" 2>"$dir/$name.err"
}
show_err() { echo "  --- $1.err:"; tail -n "${2:-15}" "$dir/$1.err" | sed 's/^/  /'; }
# expect_delivered NAME SECONDS TOPIC COUNT [RELAY]: ok once COUNT events of
# TOPIC are delivered within SECONDS; else not ok with their states (and
# RELAY's stderr).
expect_delivered() {
    local name=$1 limit=$2 topic=$3 count=$4 relay=${5:-}
    if wait_until "$limit" sql_is "SELECT count(*) FROM idempotency.outbox WHERE topic = '$topic' AND state = 'delivered'" "$count"; then
        ok "$name"
    else
        not_ok "$name" "$(states "$topic")"
        [ -n "$relay" ] && show_err "$relay"
    fi
    return 0
}
# own_exit PID SECONDS: sets status to the exit status of a relay that stops
# by itself within SECONDS, else to "running".
own_exit() {
    if wait_until "$2" bash -c "! kill -0 $1 2>/dev/null"; then
        wait "$1"; status=$?
    else
        status=running
    fi
}
# make_test_ca DIR: a private CA (ca.pem) and, signed by it, a certificate
# for 127.0.0.1 and localhost (server.pem, server.key) and a client
# certificate (client.pem, client.key), made with openssl; readable by the
# brokers' OS users (test keys only).
make_test_ca() {
    local d=$1
    mkdir -p "$d" || return 1
    openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=idem test CA" \
        -keyout "$d/ca.key" -out "$d/ca.pem" >/dev/null 2>&1 || return 1
    openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" -keyout "$d/server.key" \
        -out "$d/server.csr" >/dev/null 2>&1 || return 1
    printf 'subjectAltName=IP:127.0.0.1,DNS:127.0.0.1,DNS:localhost\n' >"$d/server.ext"
    openssl x509 -req -in "$d/server.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial \
        -days 2 -extfile "$d/server.ext" -out "$d/server.pem" >/dev/null 2>&1 || return 1
    openssl req -newkey rsa:2048 -nodes -subj "/CN=idem-relay" -keyout "$d/client.key" \
        -out "$d/client.csr" >/dev/null 2>&1 || return 1
    openssl x509 -req -in "$d/client.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial \
        -days 2 -out "$d/client.pem" >/dev/null 2>&1 || return 1
    chmod 755 "$d" && chmod 644 "$d"/*
}
