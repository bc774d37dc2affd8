#!/usr/bin/env bash
# The test command: installs dependencies, configures, builds, runs every test that
# needs no GPU (ctest -LE gpu: labels unit, oracle, integration).
# In CI (CI=true) or with L2L_TSAN=1 it first builds the EPS concurrency tests with
# ThreadSanitizer and runs them (scripts/tsan.sh, a separate build-tsan; ~5 min on 2
# cores without ccache), and (CI=true or L2L_TSA=1) compiles the EPS library with clang's
# -Wthread-safety as an error (scripts/tsa.sh, build-tsa). Then it runs the GPU tests on the CPU emulator of CUDA
# (scripts/emu_test.sh, build-emu; L2L_EMU=0 skips it).
# Usage: scripts/test.sh [ctest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
start=$(date +%s)
bash scripts/setup.sh
bash scripts/build.sh
tsan_default=0
if [ "${CI:-}" = "true" ]; then tsan_default=1; fi
if [ "${L2L_TSAN:-$tsan_default}" = "1" ]; then bash "$root/scripts/tsan.sh"; fi
if [ "${L2L_TSA:-$tsan_default}" = "1" ]; then bash "$root/scripts/tsa.sh"; fi
# ASan+UBSan unit/integration tests and ~30 s of fuzzing (scripts/asan.sh, scripts/fuzz.sh).
if [ "${L2L_ASAN:-$tsan_default}" = "1" ]; then bash "$root/scripts/asan.sh"; fi
# CI fuzzes from a fixed seed: its result is reproducible (scripts/fuzz.sh explains).
if [ "${L2L_FUZZ:-$tsan_default}" = "1" ]; then
  L2L_FUZZ_SEED="${L2L_FUZZ_SEED:-1}" bash "$root/scripts/fuzz.sh" all "${L2L_FUZZ_SECONDS:-30}"
fi
cd "${L2L_BUILD_DIR:-build}"
# No retries: a test that fails once under load has a bug (in the code or in the test)
# to fix, not to hide.
ctest -LE gpu --output-on-failure --no-tests=error -j "$(nproc)" "$@"
cd "$root"
if [ "${L2L_EMU:-1}" = "1" ]; then bash "$root/scripts/emu_test.sh"; fi
echo "test.sh: done in $(( $(date +%s) - start )) s"
