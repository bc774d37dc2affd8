#!/usr/bin/env bash
# Runs the GPU tests (tests/gpu: CUDA-vs-CPU conformance of every op, the worker's CUDA
# transfer path, 10-step relay and trainer runs) on the CPU emulator of CUDA
# (cuda_emu), so the CUDA code paths are exercised on machines without a GPU.
# Builds build-emu with -DL2L_CUDA=EMU (the .cu files compiled by g++ against the
# emulator's headers), then `ctest -L emu`. What this shows: indexing, reductions,
# stream/event ordering, cuBLASLt layouts and API use are right. What it cannot show:
# speed, or anything that needs the real GPU memory model; scripts/gpu_check.sh does that
# on a GPU. Usage: scripts/emu_test.sh [ctest args...]   (scripts/test.sh runs it)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${L2L_EMU_BUILD_DIR:-build-emu}"
start=$(date +%s)
# Same ccache settings as scripts/build.sh: the worker/EPS objects come from the main build.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}" CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DL2L_CUDA=EMU >/dev/null
cmake --build "$BUILD_DIR" --target l2l_gpu_tests l2l_cuda_emu_tests l2l-eps l2l-worker l2lctl l2l-bench-relay -j "${L2L_JOBS:-$(nproc)}"
root=$PWD
cd "$BUILD_DIR"
bash "$root/scripts/ctest_stage.sh" emu -L emu --output-on-failure --no-tests=error -j "$(nproc)" "$@"
echo "emu_test.sh: done in $(( $(date +%s) - start )) s"
