#!/usr/bin/env bash
# Configures and builds l2l into ${L2L_BUILD_DIR:-build} (Ninja, ccache when present).
# Extra arguments go to cmake's configure step, e.g. -DL2L_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${L2L_BUILD_DIR:-build}"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="${L2L_BUILD_TYPE:-RelWithDebInfo}" \
  -DL2L_CUDA="${L2L_CUDA:-AUTO}" "$@"
cmake --build "$BUILD_DIR" -j "$(nproc)"
