# The shared behaviour tests against the SQL edition (src/sql_edition/):
# sourced by test/run.sh, whose count(), $stage, $bindir and $pgxs_dir it
# uses. One throwaway server without shared_preload_libraries, with the
# settings of test/regress.conf but the preload; the tests are staged by
# test/sql_edition/stage.sh. IDEM_SQL_CHECK_PORT (IDEM_CHECK_PORT + 1).

# The server-wide settings the shared tests change with ALTER SYSTEM, named
# in the server's configuration file with an empty value (unset: the
# edition's own defaults apply until a test sets them). Named there, they
# are known to every session, so ALTER SYSTEM takes them on every major:
# PostgreSQL 15 and 16 refuse ALTER SYSTEM of a placeholder that neither a
# library nor the configuration file names, 17 and later take it.
sql_edition_server_settings() {
    printf "%s = ''\n" idempotency.outbox_retention idempotency.inbox_retention idempotency.purge_batch
}

sql_check_dir=
start_sql_edition_server() {
    [ -n "$sql_check_dir" ] && return 0
    sql_check_dir=$stage/tmp_sql_edition_server
    start_cluster "$sql_check_dir" "$(sql_edition_port)" "shared_preload_libraries = ''" \
        "$(grep -v -e '^#' -e '^shared_preload_libraries' "$stage/test/regress.conf")" \
        "$(sql_edition_server_settings)" ||
        { cat "$sql_check_dir/server.log" >&2; sql_check_dir=; return 1; }
}
stop_sql_edition_server() {
    [ -n "$sql_check_dir" ] && stop_cluster "$sql_check_dir"
    sql_check_dir=
}
sql_edition_port() { echo "${IDEM_SQL_CHECK_PORT:-$((${IDEM_CHECK_PORT:-54460} + 1))}"; }

# run_sql_edition regress|isolation
run_sql_edition() {
    local kind=$1 dir=$stage/sql_edition_$1 out names status
    log "$kind tests against the SQL edition"
    start_sql_edition_server || { count "$kind-sql" 0 1; return; }
    rm -rf "$dir" && mkdir -p "$dir" && chown "$IDEM_OS_USER" "$dir"
    names=$(as_pg bash "$stage/test/sql_edition/stage.sh" "$kind" "$dir") ||
        { count "$kind-sql" 0 1; return; }
    out=$stage/$kind-sql.log
    if [ "$kind" = regress ]; then
        (cd "$dir" && as_pg "$pgxs_dir/src/test/regress/pg_regress" --inputdir=. --outputdir=. \
            --bindir="$bindir" --launcher="$stage/test/sql_edition/psql_launcher.sh" \
            --host="$sql_check_dir" --port="$(sql_edition_port)" --dbname=contrib_regression \
            $names) >"$out" 2>&1
    else
        (cd "$dir" && as_pg "$pgxs_dir/src/test/isolation/pg_isolation_regress" --inputdir=. \
            --outputdir=. --bindir="$bindir" --host="$sql_check_dir" --port="$(sql_edition_port)" \
            --dbname=isolation_regression $names) >"$out" 2>&1
    fi
    status=$?
    cat "$out"
    [ "$status" -ne 0 ] && [ -f "$dir/regression.diffs" ] && cat "$dir/regression.diffs"
    count_regress_output "$kind-sql" "$out" "$status"
}
