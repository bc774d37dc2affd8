#!/usr/bin/env bash
# AddressSanitizer + UndefinedBehaviorSanitizer build of the unit and integration tests
# (build-asan, clang, CPU only, RelWithDebInfo at -O1), then runs them: any heap/stack
# overflow, use-after-free, leak or undefined behaviour fails the test that hit it.
# The same build dir holds the libFuzzer targets (-DL2L_FUZZ=ON: every object also
# carries libFuzzer's coverage instrumentation, which costs the tests little and saves
# a second sanitizer build of every library); scripts/fuzz.sh uses it.
# Usage: scripts/asan.sh            configure, build, run ctest -L 'unit|integration'
#        scripts/asan.sh configure  configure only (scripts/fuzz.sh)
#        scripts/asan.sh [ctest args...]  extra ctest arguments (e.g. -R config)
# scripts/test.sh runs it in CI (or with L2L_ASAN=1).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
BUILD_DIR="${L2L_ASAN_BUILD_DIR:-build-asan}"
start=$(date +%s)
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}" CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DL2L_CUDA=OFF \
  -DCMAKE_C_COMPILER="${L2L_ASAN_CC:-clang-14}" -DCMAKE_CXX_COMPILER="${L2L_ASAN_CXX:-clang++-14}" \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
  -DL2L_SANITIZE=address,undefined -DL2L_FUZZ=ON >/dev/null
if [ "${1:-}" = "configure" ]; then exit 0; fi

# Sanitizer settings for every process the tests start (ctest passes the environment on):
# stop at the first report; third-party findings are suppressed by name in scripts/*.supp.
export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:strict_init_order=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1:suppressions=$root/scripts/ubsan.supp}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$root/scripts/lsan.supp}"

# Everything the unit and integration tests run (test binaries, test tools, the l2l-*
# programs the integration tests start); not the benchmarks, nor the fuzz targets
# (scripts/fuzz.sh builds those).
targets=$(ninja -C "$BUILD_DIR" -t targets all |
  sed -n 's/^\(l2l[-_a-z0-9]*\): phony$/\1/p' | grep -v -e '^l2l-bench-' -e '^l2l_fuzz_' | sort -u)
# ... but common.relay_model.simulate (label unit) runs l2l-bench-relay --simulate.
targets="$targets l2l-bench-relay"
# shellcheck disable=SC2086
cmake --build "$BUILD_DIR" --target $targets -j "${L2L_JOBS:-2}"
built=$(date +%s)
echo "asan.sh: build done in $(( built - start )) s"

# Not run here, each with the reason:
#   label oracle   the Python oracles (HF transformers, torch): the code paths they cover
#                  are the unit tests', they take minutes each even without sanitizers,
#                  and they run in the plain build (scripts/test.sh)
#   label gpu/emu  GPU tests: CPU-only build (scripts/emu_test.sh runs them on the emulator)
#   label fuzz     the corpus replays: scripts/fuzz.sh runs the targets themselves
cd "$BUILD_DIR"
bash "$root/scripts/ctest_stage.sh" asan -L 'unit|integration' -LE 'oracle|gpu|emu|fuzz' \
  --output-on-failure --no-tests=error -j "$(nproc)" "$@"
echo "asan.sh: tests done in $(( $(date +%s) - built )) s; total $(( $(date +%s) - start )) s"
