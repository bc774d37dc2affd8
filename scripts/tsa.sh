#!/usr/bin/env bash
# Compile-time thread-safety check of the EPS: compiles the l2l_eps library's sources
# with clang's -Wthread-safety as an error, in a separate build-tsa (CPU only, no tests,
# nothing linked). Against libc++ with its thread-safety
# annotations on, so std::mutex and std::lock_guard are capabilities the analysis
# follows; the EPS's mutex-guarded members carry GUARDED_BY (common/thread_annotations.h).
# Usage: scripts/tsa.sh   (scripts/test.sh runs it in CI)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${L2L_TSA_BUILD_DIR:-build-tsa}"
CXX_BIN="${L2L_TSA_CXX:-clang++-14}"
start=$(date +%s)
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}" CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DL2L_CUDA=OFF -DBUILD_TESTING=OFF \
  -DCMAKE_C_COMPILER="${L2L_TSA_CC:-clang-14}" -DCMAKE_CXX_COMPILER="$CXX_BIN" \
  -DCMAKE_CXX_FLAGS="-stdlib=libc++ -D_LIBCPP_ENABLE_THREAD_SAFETY_ANNOTATIONS -Wthread-safety -Werror=thread-safety" \
  -DCMAKE_EXE_LINKER_FLAGS="-stdlib=libc++" >/dev/null
# Only the EPS's own objects (and the generated proto headers they include): l2l_common
# needs floating-point std::from_chars, which libc++ 14 lacks, and is checked by gcc.
objs=$(ninja -C "$BUILD_DIR" -t targets all | sed -n 's|^\(eps_server/CMakeFiles/l2l_eps\.dir/[^:]*\.o\):.*|\1|p')
[ -n "$objs" ] || { echo "tsa.sh: no l2l_eps objects found in $BUILD_DIR" >&2; exit 1; }
# shellcheck disable=SC2086
ninja -C "$BUILD_DIR" -k 0 -j "${L2L_JOBS:-2}" $objs
echo "tsa.sh: done in $(( $(date +%s) - start )) s"
