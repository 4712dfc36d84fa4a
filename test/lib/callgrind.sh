# single_user_instructions DATA INPUT LOG: the instructions PostgreSQL
# executes in single-user mode on the cluster folder DATA (stopped),
# database bench, reading one command per line from INPUT (valgrind's
# callgrind; its output goes next to LOG). Fails, with the first errors on
# stderr, when a command fails.
single_user_instructions() {
    local data=$1 input=$2 log=$3 out=$3.callgrind
    chmod 644 "$input"
    rm -f "$out"
    as_pg valgrind --tool=callgrind --callgrind-out-file="$out" "$(pg_bindir)/postgres" --single \
        -D "$data" bench <"$input" >"$log" 2>&1
    if grep -q ERROR "$log" || [ ! -s "$out" ]; then
        grep -m5 ERROR "$log" >&2
        return 1
    fi
    sed -n 's/^summary: \([0-9]*\).*/\1/p' "$out"
}

# callgrind_cluster NAME PORT [SETTING...]: what each count starts from:
# valgrind installed, the extension built and installed (unless
# IDEM_BENCH_BUILT is set), and a throwaway cluster with these settings in a
# new folder (removed at exit) holding a database bench. Sets dir and bindir.
callgrind_cluster() {
    local name=$1 port=$2
    shift 2
    IDEM_PACKAGES="valgrind" ensure_packages || return 1
    if [ -z "${IDEM_BENCH_BUILT:-}" ]; then build_and_install || return 1; fi
    bindir=$(pg_bindir)
    dir=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-$name.XXXXXX") || return 1
    chmod 755 "$dir"
    trap 'stop_cluster "$dir"; rm -rf "$dir"' EXIT
    trap 'exit 130' INT TERM
    start_cluster "$dir" "$port" "$@" || { cat "$dir/server.log" >&2; return 1; }
    as_pg "$bindir/createdb" -h "$dir" -p "$port" -U postgres bench
}
