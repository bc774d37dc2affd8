#!/usr/bin/env bash
# One ctest stage of scripts/test.sh (also scripts/asan.sh, scripts/emu_test.sh): runs
# `ctest ARGS --output-junit` in the current directory (a build dir), then prints the
# stage's skip line (scripts/ctest_skips.py: "STAGE: SKIPPED: N tests: names (why)" or
# "STAGE: SKIPPED: none"), which in CI (CI=true) fails the stage when a test skipped that
# may not. The line is also appended to $L2L_SKIP_SUMMARY when set (scripts/test.sh
# repeats every stage's line at its end).
# Exit status: ctest's when it failed, else 1 for a disallowed skip in CI, else 0.
# Usage: scripts/ctest_stage.sh STAGE [ctest args...]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
stage=$1
shift
junit="$PWD/Testing/l2l-$stage-junit.xml"
mkdir -p "$PWD/Testing"
rm -f "$junit"
rc=0
ctest "$@" --output-junit "$junit" || rc=$?
line=$(python3 "$here/ctest_skips.py" "$stage" "$junit")
skip_rc=$?
echo "$line"
if [ -n "${L2L_SKIP_SUMMARY:-}" ]; then echo "$line" >> "$L2L_SKIP_SUMMARY"; fi
if [ "$rc" -ne 0 ]; then exit "$rc"; fi
exit "$skip_rc"
