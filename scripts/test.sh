#!/usr/bin/env bash
# The test command: installs dependencies, configures, builds, runs every test that
# needs no GPU (ctest -LE gpu: labels unit, oracle, integration).
# In CI (CI=true) or with L2L_TSAN=1 it first builds the EPS concurrency tests with
# ThreadSanitizer and runs them (scripts/tsan.sh, a separate build-tsan; ~5 min on 2
# cores without ccache), and (CI=true or L2L_TSA=1) compiles the EPS library with clang's
# -Wthread-safety as an error (scripts/tsa.sh, build-tsa). Then it runs the GPU tests on the CPU emulator of CUDA
# (scripts/emu_test.sh, build-emu; L2L_EMU=0 skips it).
# Each ctest stage ends with its skip line ("STAGE: SKIPPED: N tests: names (why)" or
# "STAGE: SKIPPED: none"; scripts/ctest_stage.sh), and the end of the run repeats them all.
# In CI a skipped test fails its stage unless it may skip (scripts/ctest_skips.py says
# which may, and why); outside CI skips are listed, not failed. A stage this script does
# not run (L2L_TSAN=0 ...) is named in the summary too.
# The main build has -Werror (-DL2L_WERROR=ON) in CI: the project's code builds with zero
# warnings; L2L_WERROR=0|1 overrides (default: on with CI=true, off otherwise).
# .ci/run sets CI=true itself; run `CI=true scripts/test.sh` for the same checks by hand.
# Usage: scripts/test.sh [ctest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
start=$(date +%s)
L2L_SKIP_SUMMARY=$(mktemp)
export L2L_SKIP_SUMMARY
trap 'rm -f "$L2L_SKIP_SUMMARY"' EXIT
# A stage turned off by its variable is named in the summary; in CI it fails the run.
stages_off=0
not_run() { echo "test.sh: stage $1 NOT RUN ($2)" | tee -a "$L2L_SKIP_SUMMARY"; stages_off=$((stages_off + 1)); }
bash scripts/setup.sh
tsan_default=0
if [ "${CI:-}" = "true" ]; then tsan_default=1; fi
werror=OFF
[ "${L2L_WERROR:-$tsan_default}" = "1" ] && werror=ON
bash scripts/build.sh -DL2L_WERROR="$werror"
if [ "${L2L_TSAN:-$tsan_default}" = "1" ]; then bash "$root/scripts/tsan.sh"; else not_run tsan "L2L_TSAN=0; CI=${CI:-unset}"; fi
if [ "${L2L_TSA:-$tsan_default}" = "1" ]; then bash "$root/scripts/tsa.sh"; else not_run tsa "L2L_TSA=0; CI=${CI:-unset}"; fi
# ASan+UBSan unit/integration tests and ~30 s of fuzzing (scripts/asan.sh, scripts/fuzz.sh).
if [ "${L2L_ASAN:-$tsan_default}" = "1" ]; then bash "$root/scripts/asan.sh"; else not_run asan "L2L_ASAN=0; CI=${CI:-unset}"; fi
# CI fuzzes from a fixed seed: its result is reproducible (scripts/fuzz.sh explains).
if [ "${L2L_FUZZ:-$tsan_default}" = "1" ]; then
  L2L_FUZZ_SEED="${L2L_FUZZ_SEED:-1}" bash "$root/scripts/fuzz.sh" all "${L2L_FUZZ_SECONDS:-30}"
else
  not_run fuzz "L2L_FUZZ=0; CI=${CI:-unset}"
fi
cd "${L2L_BUILD_DIR:-build}"
# No retries: a test that fails once under load has a bug (in the code or in the test)
# to fix, not to hide.
bash "$root/scripts/ctest_stage.sh" main -LE gpu --output-on-failure --no-tests=error -j "$(nproc)" "$@"
cd "$root"
if [ "${L2L_EMU:-1}" = "1" ]; then bash "$root/scripts/emu_test.sh"; else not_run emu "L2L_EMU=0"; fi
echo "test.sh: skips, stage by stage:"
sed 's/^/  /' "$L2L_SKIP_SUMMARY"
echo "test.sh: done in $(( $(date +%s) - start )) s"
if [ "${CI:-}" = "true" ] && [ "$stages_off" -gt 0 ]; then
  echo "test.sh: FAILED: CI=true and $stages_off stage(s) turned off (L2L_TSAN/L2L_TSA/L2L_ASAN/L2L_FUZZ/L2L_EMU=0)"
  exit 1
fi
