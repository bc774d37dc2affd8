#!/usr/bin/env bash
# SSD tier benchmark: the spill I/O path (io_uring, O_DIRECT, page-sized transfers split
# into blocks) against fio on the same directory, block size and queue depth, in the
# same run (bench/bench_spill_main.cc; docs/performance.md "SSD tier: spill I/O vs
# fio"). Not a test: prints GB/s and ratios; fails only when it cannot measure (no fio,
# an I/O error).
#
#   scripts/bench_spill.sh [DIR]    DIR: the spill.dir to measure; default a temp dir
#                                   under the state dir (${L2L_STATE_DIR:-/tmp/l2l-eps}),
#                                   removed afterwards.
# Environment: L2L_BUILD_DIR (default build), BYTES (default 1 GiB, capped by the free
# space), BLOCK_BYTES (1 MiB), QUEUE_DEPTH (32), PAGE_BYTES (4 MiB), REPEAT (3: medians
# are printed; a shared virtual disk moves by 2x between runs).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${L2L_BUILD_DIR:-build}"
BIN="$BUILD_DIR/bin/l2l-bench-spill"
if ! command -v fio > /dev/null; then
  echo "bench_spill.sh: fio is not installed (apt-get install fio); nothing measured" >&2
  exit 2
fi
if [ ! -x "$BIN" ]; then
  [ -f "$BUILD_DIR/build.ninja" ] || cmake -S . -B "$BUILD_DIR" -G Ninja \
    -DCMAKE_BUILD_TYPE="${L2L_BUILD_TYPE:-RelWithDebInfo}" -DL2L_CUDA="${L2L_CUDA:-AUTO}"
  cmake --build "$BUILD_DIR" -j "$(nproc)" --target l2l-bench-spill
fi

if [ $# -ge 1 ]; then
  dir="$1"
  mkdir -p "$dir"
else
  state="${L2L_STATE_DIR:-/tmp/l2l-eps}"
  mkdir -p "$state"
  dir=$(mktemp -d "$state/bench-spill.XXXXXX")
  trap 'rm -rf "$dir"' EXIT
fi

echo "machine: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) cores), load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "dir: $dir on $(df --output=source,fstype "$dir" | tail -1 | tr -s ' '), kernel $(uname -r), $(fio --version)"
"$BIN" --dir "$dir" --bytes "${BYTES:-1073741824}" --block-bytes "${BLOCK_BYTES:-1048576}" \
  --queue-depth "${QUEUE_DEPTH:-32}" --page-bytes "${PAGE_BYTES:-4194304}" --repeat "${REPEAT:-3}"
