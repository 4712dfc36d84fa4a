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
