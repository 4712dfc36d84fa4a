#!/usr/bin/env bash
# `make test`: installs what is missing, builds and installs the extension,
# then runs every suite against throwaway clusters as the `postgres` OS user:
# unit tests (ctest), regression (pg_regress), races (isolation tester),
# TAP tests against real clusters, and the harnesses (the doc test, stress, chaos, relay,
# the differential test of the direct table access, the client libraries' tests,
# examples); IDEM_SUITES names a subset. Ends
# with the line "N passed, N failed"; the exit status is non-zero on any
# failure.
set -u
. "$(dirname "$0")/lib/common.sh"

# IDEM_SKIP_BUILD=1: use what is installed (the runner's own test does).
if [ -z "${IDEM_SKIP_BUILD:-}" ]; then
    ensure_packages || exit 1
    build_and_install || { echo "0 passed, 1 failed"; exit 1; }
fi

stage=$(stage_tree)
bindir=$(pg_bindir)
pgxs_dir=$(dirname "$(dirname "$(dirname "$("$(pg_config_path)" --pgxs)")")")
passed=0
failed=0
failures=()

durations=()

count() {  # count SUITE PASSED FAILED
    passed=$((passed + $2))
    failed=$((failed + $3))
    [ "$3" -eq 0 ] || failures+=("$1")
}

# Counts pg_regress-style result lines ("test x ... ok" / "... FAILED").
count_regress_output() {
    local suite=$1 out=$2 status=$3 ok bad
    ok=$(grep -cE '\.\.\. ok|^ok [0-9]' "$out")
    bad=$(grep -cE '\.\.\. FAILED|\.\.\. failed|^not ok [0-9]' "$out")
    [ "$status" -ne 0 ] && [ "$bad" -eq 0 ] && bad=1
    count "$suite" "$ok" "$bad"
}

# IDEM_UNIT_BUILD: what CMake builds, "tests" (the unit tests' programs and
# the libraries they link; the default, as make test has just built the
# module with the Makefile) or "all" (the module and idem-relay too: the
# matrix, so that the CMake build is tried on every major).
run_unit() {
    [ -f "$stage/CMakeLists.txt" ] || return 0
    log "unit tests (ctest)"
    local build=$stage/build out=$stage/unit.log targets=()
    [ "${IDEM_UNIT_BUILD:-tests}" = all ] || targets=(--target idempotency_unit_tests)
    if ! (cmake -S "$stage" -B "$build" -DPG_CONFIG="$(pg_config_path)" >/dev/null &&
        if [ ${#targets[@]} -gt 0 ] && cmake --build "$build" --target help | grep '^\.\.\. idem_relay_unit_tests$' >/dev/null; then
            targets+=(idem_relay_unit_tests)
        fi
        cmake --build "$build" -j2 "${targets[@]}" >/dev/null); then
        echo "unit tests: build failed" >&2
        count unit 0 1
        return
    fi
    (cd "$build" && ctest --output-on-failure) >"$out" 2>&1
    local status=$? total bad
    tail -n 3 "$out"
    total=$(sed -nE 's/.*tests failed out of ([0-9]+).*/\1/p' "$out" | tail -n 1)
    bad=$(sed -nE 's/.*, ([0-9]+) tests failed out of.*/\1/p' "$out" | tail -n 1)
    [ -n "$total" ] || { cat "$out"; count unit 0 1; return; }
    [ "$status" -ne 0 ] && [ "${bad:-0}" -eq 0 ] && bad=1
    [ "$status" -ne 0 ] && cat "$out"
    count unit $((total - bad)) "$bad"
}

# The regression and race tests run as `make installcheck` does for a user
# (the lists are the Makefile's), against one throwaway server with the
# settings of test/regress.conf. IDEM_CHECK_PORT (54460).
check_dir=
start_check_server() {
    [ -n "$check_dir" ] && return 0
    check_dir=$stage/tmp_check_server
    start_cluster "$check_dir" "${IDEM_CHECK_PORT:-54460}" \
        "$(grep -v -e '^#' -e '^shared_preload_libraries' "$stage/test/regress.conf")" ||
        { cat "$check_dir/server.log" >&2; check_dir=; return 1; }
}
installcheck() {  # installcheck SUITE OUTPUT DIFFS MAKE-ARGS...
    local suite=$1 out=$2 diffs=$3; shift 3
    start_check_server || { count "$suite" 0 1; return; }
    (cd "$stage" && as_pg make -s installcheck PG_CONFIG="$(pg_config_path)" \
        PGHOST="$check_dir" PGPORT="${IDEM_CHECK_PORT:-54460}" "$@") >"$out" 2>&1
    local status=$?
    cat "$out"
    [ "$status" -ne 0 ] && [ -f "$diffs" ] && cat "$diffs"
    count_regress_output "$suite" "$out" "$status"
}

# The regression and race tests run against both editions: the C++
# extension, and the SQL edition (test/lib/sql_edition.sh). IDEM_EDITIONS
# names a subset ("cpp sql").
. "$(dirname "$0")/lib/sql_edition.sh"
editions=" ${IDEM_EDITIONS:-cpp sql} "
trap '[ -n "$check_dir" ] && stop_cluster "$check_dir"; stop_sql_edition_server' EXIT

run_regress() {
    if [[ $editions == *" cpp "* ]]; then
        log "regression tests (pg_regress, make installcheck)"
        installcheck regress "$stage/regress.log" "$stage/regression.diffs" ISOLATION=
    fi
    [[ $editions == *" sql "* ]] && run_sql_edition regress
}

run_isolation() {
    if [[ $editions == *" cpp "* ]]; then
        log "race tests (isolation tester, make installcheck)"
        installcheck isolation "$stage/isolation.log" "$stage/output_iso/regression.diffs" REGRESS=
    fi
    [[ $editions == *" sql "* ]] && run_sql_edition isolation
}

# Work that runs in the background: each item's output, exit status and
# seconds go into files of the stage, printed and counted by the caller.
pooled_output() { echo "$stage/pooled.$(echo "$1" | tr / _)"; }

run_pooled() {  # run_pooled JOBS COMMAND ITEM...: "COMMAND ITEM" for each ITEM, JOBS at a time
    local jobs=$1 command=$2 item; shift 2
    for item in "$@"; do
        while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
        (
            out=$(pooled_output "$item")
            started=$SECONDS
            "$command" "$item" >"$out.log" 2>&1
            echo "$? $((SECONDS - started))" >"$out.end"
        ) &
    done
    wait
}

finish_pooled() {  # finish_pooled ITEM NAME [HEADER]: waits for ITEM, prints HEADER and its output, counts it as NAME
    local out status seconds
    out=$(pooled_output "$1")
    while [ ! -s "$out.end" ]; do sleep 1; done
    read -r status seconds <"$out.end"
    [ -n "${3:-}" ] && log "$3"
    cat "$out.log"
    if [ "$status" -eq 0 ]; then count "$2" 1 0; else count "$2" 0 1; fi
    durations+=("$seconds $2")
}

# IDEM_TAP_FILES: the TAP files to run, relative to the tree (the matrix
# runs those of test/tap/major_upgrade/ where two majors are installed).
# IDEM_TAP_JOBS: how many files run at once (2: most of a file's time is
# spent waiting on its cluster's workers and clocks, and each file has its
# own cluster and ports). The files run in the background, beside the
# suites that follow (their clusters listen on sockets in folders of their
# own); finish_tap prints their outputs, in file order, once those are done.
# The harnesses of harness_after_tap (IDEM_AFTER_TAP below) are queued in
# the same lane, after the files.
tap_files=()
start_tap() {
    local file
    for file in $(cd "$stage" && printf '%s\n' ${IDEM_TAP_FILES:-test/tap/*.pl}); do
        [ -f "$stage/$file" ] && tap_files+=("$file")
    done
    [ $((${#tap_files[@]} + ${#harness_after_tap[@]})) -gt 0 ] || return 0
    log "TAP tests (PostgreSQL::Test::Cluster), ${IDEM_TAP_JOBS:-2} at a time, in the background"
    [ ${#harness_after_tap[@]} -gt 0 ] && log "then in the same lane: ${harness_after_tap[*]}"
    tap_third_party=
    idem_third_party_required && tap_third_party=1
    (run_pooled "${IDEM_TAP_JOBS:-2}" run_tap_item "${tap_files[@]}" "${harness_after_tap[@]}"
     echo "$SECONDS" >"$stage/tap.end") &
}
run_tap_item() {  # run_tap_item FILE: a TAP file, or a harness queued after them
    if [[ $1 == *.pl ]]; then run_tap_file "$1"; else run_harness_script "$1"; fi
}
finish_tap() {
    local file
    [ ${#tap_files[@]} -gt 0 ] && log "TAP tests (ran in the background)"
    for file in "${tap_files[@]}"; do finish_pooled "$file" "${file#test/}"; done
    tap_files=()
}

run_tap_file() {  # run_tap_file FILE (relative to the stage)
    cd "$stage" && as_pg env PG_REGRESS="$pgxs_dir/src/test/regress/pg_regress" \
        PATH="$bindir:$PATH" TESTDIR="$stage" PG_CONFIG="$(pg_config_path)" \
        IDEM_REQUIRE_THIRD_PARTY=$tap_third_party prove -I "$pgxs_dir/src/test/perl" "$1"
}

# Harnesses that run real processes: each script is one test.
# IDEM_HARNESSES: the harnesses to run, relative to the tree (default all).
# IDEM_BESIDE: those of them that run in a background lane, one after the
# other, from the start of the first suite, beside the unit, regression,
# race and TAP tests and the other harnesses; their output is printed when
# the foreground harnesses are done (empty: every harness in the
# foreground). The default is the differential tests, which keep a core
# busy for minutes where most of the others wait on processes and clocks,
# then the relay's, the pooler's, the stress (one huge transaction among
# them) and the chaos harnesses: none
# shares a folder, a TCP port or a service with another suite or harness,
# and both lanes end about together.
# IDEM_AFTER_TAP: harnesses that run in the TAP lane once its files are
# under way, where TAP comes before the harnesses in IDEM_SUITES (it does
# by default), in the foreground elsewhere. The TAP lane ends minutes
# before the foreground's: the default is the client libraries' suites
# against the SQL edition, which mostly wait on their clusters.
harness_foreground=()
harness_background=()
harness_after_tap=()
start_beside() {
    local script beside=" ${IDEM_BESIDE-test/differential/run.sh test/differential/sql_edition.sh \
        test/relay/run.sh test/relay/maintenance.sh test/relay/brokers.sh test/pooler/run.sh \
        test/stress/run.sh test/stress/outbox.sh test/stress/huge_transaction.sh test/chaos/run.sh} "
    local after_tap=" ${IDEM_AFTER_TAP-test/clients/sql_edition.sh} "
    for script in $(cd "$stage" && printf '%s\n' ${IDEM_HARNESSES:-test/checks/*.sh test/matrix/versions_agree.sh \
        test/docs/run.sh test/demo/repeat.sh test/runner/*.sh test/stress/*.sh test/relay/run.sh \
        test/relay/maintenance.sh test/relay/brokers.sh test/pooler/run.sh test/chaos/run.sh test/differential/run.sh \
        test/differential/sql_edition.sh test/sql_edition/install.sh test/clients/*.sh \
        test/monitoring/*.sh examples/run-all.sh}); do
        [ -x "$stage/$script" ] || continue
        if [[ $beside == *" $script "* ]]; then
            harness_background+=("$script")
        elif [[ $after_tap == *" $script "* && " $IDEM_SUITES " == *" tap "*"harnesses "* ]]; then
            harness_after_tap+=("$script")
        else
            harness_foreground+=("$script")
        fi
    done
    # One Go build cache for the harnesses that build Go (the client's
    # tests on both editions, the go-worker example): the standard library
    # is then compiled once, not in each. Removed with the stage.
    export GOCACHE=${GOCACHE:-$stage/gocache}
    [ ${#harness_background[@]} -gt 0 ] || return 0
    log "harnesses in the background: ${harness_background[*]}"
    (run_pooled 1 run_harness_script "${harness_background[@]}"; echo "$SECONDS" >"$stage/beside.end") &
}

run_harnesses() {
    local script
    for script in "${harness_foreground[@]}"; do
        log "harness $script"
        run_harness "$script"
    done
    foreground_end=$SECONDS
    for script in "${harness_background[@]}"; do
        finish_pooled "$script" "$script" "harness $script (ran in the background)"
    done
    for script in "${harness_after_tap[@]}"; do
        finish_pooled "$script" "$script" "harness $script (ran in the TAP lane)"
    done
}

# From the staged copy: the OS user may not enter the checkout.
run_harness() {  # run_harness SCRIPT
    local started=$SECONDS
    # Kept in a file too: a failed harness's last lines are printed again
    # at the end, where a long run's log is read first.
    (run_harness_script "$1") 2>&1 | tee "$(pooled_output "$1").log"
    if [ "${PIPESTATUS[0]}" -eq 0 ]; then count "$1" 1 0; else count "$1" 0 1; fi
    durations+=("$((SECONDS - started)) $1")
}

run_harness_script() { cd "$stage" && "./$1"; }

suite_seconds=()
[[ " $IDEM_SUITES " == *" harnesses "* ]] && start_beside
tap_started=
for suite in $IDEM_SUITES; do
    suite_started=$SECONDS
    case $suite in
        unit) run_unit ;;
        regress) run_regress ;;
        isolation) run_isolation ;;
        tap) start_tap; tap_started=$SECONDS; continue ;;
        harnesses) run_harnesses ;;
        *) echo "unknown suite $suite" >&2; count "$suite" 0 1 ;;
    esac
    suite_seconds+=("$suite $((SECONDS - suite_started))")
done
if [ -n "$tap_started" ]; then
    finish_tap
    [ -s "$stage/tap.end" ] && suite_seconds+=("tap $(($(cat "$stage/tap.end") - tap_started))")
fi
wait

[ -n "$check_dir" ] && stop_cluster "$check_dir"
check_dir=
stop_sql_edition_server
# When each lane ended (seconds from the start): the longest sets the time.
lanes=()
[ -n "${foreground_end:-}" ] && lanes+=(" foreground harnesses $foreground_end")
[ -s "$stage/beside.end" ] && lanes+=(" background harnesses $(cat "$stage/beside.end")")
[ -s "$stage/tap.end" ] && lanes+=(" TAP $(cat "$stage/tap.end")")
if [ "$failed" -eq 0 ]; then
    rm -rf "$stage"
else
    for suite in "${failures[@]}"; do
        out=$(pooled_output "$suite").log
        [ -s "$out" ] || out=$(pooled_output "test/$suite").log  # a TAP file
        [ -s "$out" ] || continue
        # Its last lines first, what failed after them: a reader of only
        # the end of the log sees what failed.
        echo "--- the last lines of $suite"
        tail -n 30 "$out"
        echo "--- what failed in $suite"
        grep -E '(^|[[:space:]])not ok |--- FAIL|FAILED|[Ee]rror: ' "$out" | head -n 20
        grep -A 4 '^#   Failed test' "$out" | head -n 40
        grep -A 6 'DIVERGENCE' "$out" | head -n 20
    done
    echo "failed suites: ${failures[*]} (outputs kept in $stage)"
fi
# Where the time went: the ten slowest TAP files and harnesses.
if [ ${#durations[@]} -gt 0 ]; then
    echo "slowest (seconds):"
    printf '%s\n' "${durations[@]}" | sort -rn | head -10 | sed 's/^/  /'
fi
echo "seconds per suite: ${suite_seconds[*]}; in all $SECONDS"
[ ${#lanes[@]} -gt 0 ] && (IFS=,; echo "lanes ended at (s):${lanes[*]}")
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
