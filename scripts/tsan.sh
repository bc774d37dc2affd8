#!/usr/bin/env bash
# Builds the EPS unit tests with ThreadSanitizer (build-tsan, CPU only) and runs the
# concurrency tests: ParamStore publish/read with concurrent readers, the update
# pipeline, the SSD tier (io_uring engine reaper thread, leases from several threads).
# Usage: scripts/tsan.sh   (scripts/test.sh runs it when L2L_TSAN=1)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${L2L_TSAN_BUILD_DIR:-build-tsan}"
start=$(date +%s)
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DL2L_CUDA=OFF \
  -DL2L_SANITIZE=thread >/dev/null
cmake --build "$BUILD_DIR" --target l2l_eps_tests -j "${L2L_JOBS:-2}"
# halt_on_error: a race fails the run instead of only printing a report.
log="$BUILD_DIR/tsan-tests.log"
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/scripts/tsan.supp" \
  "$BUILD_DIR/tests/l2l_eps_tests" "[param_store],[pipeline],[spill_io],[spill_tier],[shards]" 2>&1 | tee "$log"
# The Catch2 binary runs without ctest: its skip line from the cases' own marker
# ("L2L-SKIPPED:", tests/testing/cpu_bf16_mode.h), the same rule in CI as ctest_skips.py.
skips=$(grep -c "L2L-SKIPPED:" "$log" || true)
if [ "$skips" -eq 0 ]; then
  line="tsan: SKIPPED: none"
else
  line="tsan: SKIPPED: $skips test cases$(grep "L2L-SKIPPED:" "$log" | sed 's/^ */; /' | tr -d '\n')"
fi
echo "$line"
if [ -n "${L2L_SKIP_SUMMARY:-}" ]; then echo "$line" >> "$L2L_SKIP_SUMMARY"; fi
if [ "${CI:-}" = "true" ] && [ "$skips" -gt 0 ]; then echo "tsan: FAILED: CI=true and a case skipped"; exit 1; fi
echo "tsan.sh: done in $(( $(date +%s) - start )) s"
