#!/usr/bin/env bash
# `make test-matrix`: the unit, pg_regress, isolation and TAP suites against
# every supported PostgreSQL major, then the Debian packages and the upgrade
# across majors. The host's major runs on the host; the others run in Debian
# roots made once under IDEM_MATRIX_CACHE (see roots.sh) and reused.
#
# Prints one "N passed, N failed" line per major and a total line; the exit
# status is non-zero on any failure. IDEM_MATRIX_MAJORS picks the majors,
# IDEM_MATRIX_UPGRADES the moves between majors. With IDEM_MATRIX_HOST_TESTED
# set (by .ci/run, after make test) the host's major skips the suites make
# test ran on it.
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib/common.sh"
. "$here/roots.sh"
. "$here/steps.sh"

# The supported majors (META.json and the control file say the same).
supported="15 17 18"
majors=${IDEM_MATRIX_MAJORS:-$supported}
# Moves between majors, OLD:NEW:TESTS (test/tap/major_upgrade/), run with
# NEW when both are in $majors. No pg_upgrade into 18: Debian's 17 (17.12)
# and 15 store a column option, pg_attver, that the archive's 18 (18.6)
# does not know, so pg_upgrade from them fails for any table.
upgrades=${IDEM_MATRIX_UPGRADES:-15:17:pg_upgrade,dump_restore 17:18:dump_restore}
host_major=$(idem_major)
[ "$(id -u)" -eq 0 ] || { echo "make test-matrix runs as root (debootstrap, chroot)" >&2; exit 1; }
IDEM_PACKAGES=$(idem_packages_for "$(idem_major)" roots) ensure_packages || exit 1

# Roots are unmounted however the run ends.
unmount_all() {
    local root
    for root in "$IDEM_MATRIX_CACHE"/*/*/; do umount_root "${root%/}"; done
}
trap unmount_all EXIT

declare -A passed failed
total_passed=0
total_failed=0
failures=()
details=()

count() {  # count MAJOR WHAT PASSED FAILED
    passed[$1]=$((${passed[$1]:-0} + $3))
    failed[$1]=$((${failed[$1]:-0} + $4))
    [ "$4" -eq 0 ] || failures+=("$1:$2")
}

# The closing "N passed, N failed" line of a run of test/run.sh.
count_run() {  # count_run MAJOR WHAT LOG STATUS
    local line p f
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$3" | tail -n 1)
    p=${line%% passed*}
    f=${line#*, }; f=${f%% failed}
    [ -n "$line" ] || { p=0; f=1; }
    [ "$4" -ne 0 ] && [ "${f:-0}" -eq 0 ] && f=1
    # The failed suites' names go into the summary at the end, which is
    # what a CI log keeps when it keeps only the tail.
    local which
    which=$(sed -n 's/^failed suites: \([^(]*\).*/\1/p' "$3" | tail -n 1)
    count "$1" "$2${which:+ (${which% })}" "$p" "$f"
    [ "$f" -eq 0 ] || details+=("$(grep -E -e '^not ok' -e '^#   (Failed test|at )' \
        -e '\.\.\. FAILED' "$3" | head -n 12 | sed "s/^/$1: /")")
}

step() {  # step MAJOR WHAT COMMAND...: one more test, passed when COMMAND is
    local major=$1 what=$2; shift 2
    log "PostgreSQL $major: $what"
    if "$@"; then count "$major" "$what" 1 0; else count "$major" "$what" 0 1; fi
}

step "${majors%% *}" "versions agree" "$here/versions_agree.sh" $supported

for major in $majors; do
    log "PostgreSQL $major"
    out=$(mktemp "${TMPDIR:-/tmp}/idempotency-matrix.XXXXXX")
    if [ "$major" = "$host_major" ] && [ -n "${IDEM_MATRIX_HOST_TESTED:-}" ]; then
        # .ci/run's make test has just run these suites on this major, with
        # this build: not run twice.
        log "PostgreSQL $major: suites run by make test just before"
    elif [ "$major" = "$host_major" ]; then
        IDEM_SUITES="unit regress isolation tap" bash "$IDEM_ROOT/test/run.sh" 2>&1 | tee "$out"
        count_run "$major" suites "$out" "${PIPESTATUS[0]}"
    elif root=$(dev_root "$major"); then
        suites_in_root "$root" "$major" 2>&1 | tee "$out"
        count_run "$major" suites "$out" "${PIPESTATUS[0]}"
    else
        echo "PostgreSQL $major: its Debian root could not be prepared" >&2
        count "$major" root 0 1
    fi
    rm -f "$out"
    for move in $upgrades; do
        IFS=: read -r from to tests <<<"$move"
        [ "$to" = "$major" ] || continue
        case " $majors " in *" $from "*) ;; *) continue ;; esac
        out=$(mktemp "${TMPDIR:-/tmp}/idempotency-matrix.XXXXXX")
        log "PostgreSQL $major: from $from (${tests//,/, })"
        upgrade_in_root "$major" "$from" "${tests//,/ }" 2>&1 | tee "$out"
        count_run "$major" "from $from" "$out" "${PIPESTATUS[0]}"
        rm -f "$out"
    done
    step "$major" "Debian package" build_packages "$major"
    step "$major" "package install" "$here/deb_install.sh" "$major"
    umount_root "$IDEM_MATRIX_CACHE/$(release_of_major "$major")/dev"
done

for major in $majors; do
    echo "PostgreSQL $major: ${passed[$major]:-0} passed, ${failed[$major]:-0} failed"
    total_passed=$((total_passed + ${passed[$major]:-0}))
    total_failed=$((total_failed + ${failed[$major]:-0}))
done
[ ${#details[@]} -eq 0 ] || printf '%s\n' "${details[@]}"
[ ${#failures[@]} -eq 0 ] || echo "failed: ${failures[*]}"
echo "total: $total_passed passed, $total_failed failed"
[ "$total_failed" -eq 0 ]
