#!/usr/bin/env bash
# Configures and builds l2l into ${L2L_BUILD_DIR:-build} (Ninja, ccache when present).
# Extra arguments go to cmake's configure step, e.g. -DL2L_CUDA=OFF.
# L2L_BUILD_TARGETS="l2l-eps l2l-worker ..." builds only those targets (default: all,
# the tests and the CUDA emulator included).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${L2L_BUILD_DIR:-build}"
# ccache: paths relative to the checkout and no working directory in the hash, so the
# build dirs of one checkout (build, build-emu) share objects that compile the same.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}" CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="${L2L_BUILD_TYPE:-RelWithDebInfo}" \
  -DL2L_CUDA="${L2L_CUDA:-AUTO}" "$@"
targets=()
for t in ${L2L_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$BUILD_DIR" -j "$(nproc)" "${targets[@]}"
