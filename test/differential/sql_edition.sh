#!/usr/bin/env bash
# The differential test with the SQL edition as the reference
# (docs/table-access.md, "The SQL edition as a reference"): `direct` and a
# database with the SQL edition get the same seeded sequence, a seed of
# their own (5), 2,500 steps, with the crash and the standby. It keeps the
# two editions' answers, rows and trigger firings the same; run.sh beside
# it keeps the direct path against `viasql` with every scenario.
# Settings: DIFF_SQL_PORT (54712; the standby the next port),
# DIFF_SQL_STEPS (2500), DIFF_SQL_SEEDS (5). Run as root after the
# extension is installed (make test does both).
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DIFF_PORT=${DIFF_SQL_PORT:-54712} DIFF_STEPS=${DIFF_SQL_STEPS:-2500} DIFF_SEEDS=${DIFF_SQL_SEEDS:-5} \
    DIFF_REFERENCES=sqled exec bash "$here/run.sh"
