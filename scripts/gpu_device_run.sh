#!/usr/bin/env bash
# The GPU checks in one command on a lent GPU machine (docs/gpu.md, "Running the GPU
# checks"): unpacks a bundle built on the CPU machine (scripts/bundle.sh), runs the
# conformance tests (gpu_check.sh, ctest -L gpu) and then the benchmark (bench_gpu.sh:
# l2l vs PyTorch eager and torch.compile on GPT-2 XL and Qwen2.5-1.5B, the measured rates,
# the relay model beside the measurement), both from the bundle, and writes the raw
# output where the device tool brings files back from:
#   $OUT/env.txt            the machine: nvidia-smi, torch/transformers versions, cores,
#                           memory, disk, the bundle's COMMIT
#   $OUT/gpu_check.log      gpu_check.sh's whole output (every ctest case)
#   $OUT/bench_gpu.log      bench_gpu.sh's whole output (the table at its end)
#   $OUT/rates.json  results.json  simulate.txt  bench_gpu_logs.tar.gz   (bench_gpu.sh's
#                           BENCH_OUT_DIR: rates, rows, the model's table, job YAMLs and
#                           the EPS/worker/PyTorch logs)
# (7 files: the tool brings back at most 8.)
#
#   bash scripts/gpu_device_run.sh [BUNDLE]     # default bundle/l2l-gpu-bundle.tar.gz
#
# Time: the two steps share L2L_DEVICE_TOTAL_S seconds (450): gpu_check.sh gets at most
# L2L_DEVICE_CHECK_S (150; its gpt2bench step is skipped, bench_gpu.sh measures the peak),
# bench_gpu.sh the rest (BENCH_TOTAL_TIMEOUT; each phase cut to what is left). With the
# unpacking that is under 8 minutes: run it with the device tool's timeout_s 540.
# L2L_DEVICE_SKIP_CHECK=1 runs the benchmark alone (a partial rerun on a warm machine).
# Any BENCH_* or L2L_* variable set by the caller passes through. Exit status: gpu_check's
# or bench_gpu's, whichever failed (the logs say what).
set -uo pipefail
BUNDLE=${1:-bundle/l2l-gpu-bundle.tar.gz}
OUTD=${OUT:-/tmp/l2l-gpu-out}
TOTAL=${L2L_DEVICE_TOTAL_S:-450}
CHECK_S=${L2L_DEVICE_CHECK_S:-150}
DEST=${L2L_DEVICE_DIR:-/tmp/l2l-gpu}
say() { echo "gpu_device_run.sh: $*"; }
[[ -f "$BUNDLE" ]] || { say "FAILED: no bundle $BUNDLE (build it: scripts/bundle.sh; carry its folder)"; exit 1; }
mkdir -p "$OUTD"
rm -rf "$DEST" && mkdir -p "$DEST" && tar -C "$DEST" -xzf "$BUNDLE" || { say "FAILED: cannot unpack $BUNDLE"; exit 1; }
L2L="$DEST/l2l"
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "bundle commit: $(cat "$L2L/COMMIT" 2>/dev/null || echo '?')   needs: $(cat "$L2L/GLIBC_REQUIRED" 2>/dev/null || echo '?')"
  echo "tree commit: $(git rev-parse HEAD 2>/dev/null || echo '? (no git here)')"
  nvidia-smi 2>&1
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1
  python3 -c 'import sys, torch, transformers; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)' 2>&1
  echo "cores: $(nproc)"; free -g 2>&1; df -h /tmp /dev/shm 2>&1; uname -a
} > "$OUTD/env.txt"
say "bundle commit $(cat "$L2L/COMMIT" 2>/dev/null || echo '?'); $(grep -m1 -E 'H100|H200|NVIDIA' "$OUTD/env.txt" | tr -s ' ' | cut -c1-120)"

check_rc=0
if [[ "${L2L_DEVICE_SKIP_CHECK:-0}" == 1 ]]; then
  say "1/2 conformance: SKIPPED (L2L_DEVICE_SKIP_CHECK=1)" | tee "$OUTD/gpu_check.log"
else
  say "1/2 conformance: gpu_check.sh (at most $CHECK_S s)"
  # timeout (not --foreground) signals its whole process group: ctest and the tests too.
  L2L_GPU_CHECK_SKIP_BENCH=1 L2L_GPU_TEST_TIMEOUT=${L2L_GPU_TEST_TIMEOUT:-90} \
    timeout -k 10 "$CHECK_S" bash "$L2L/gpu_check.sh" 2>&1 | tee "$OUTD/gpu_check.log"
  check_rc=${PIPESTATUS[0]}
  if ((check_rc == 124 || check_rc == 137)); then
    say "conformance: TIMED OUT after $CHECK_S s (the cases that ran are in gpu_check.log)"
  fi
fi

left=$((TOTAL - SECONDS))
((left >= 120)) || left=120
say "2/2 benchmark: bench_gpu.sh (BENCH_TOTAL_TIMEOUT=$left s)"
BENCH_TOTAL_TIMEOUT=${BENCH_TOTAL_TIMEOUT:-$left} BENCH_OUT_DIR="$OUTD" \
  bash "$L2L/src/scripts/bench_gpu.sh" "$L2L" 2>&1 | tee "$OUTD/bench_gpu.log"
bench_rc=${PIPESTATUS[0]}
rm -f "$OUTD/results.jsonl"   # results.json holds the same rows (the tool brings back 8 files)

say "done in $SECONDS s: conformance rc $check_rc, benchmark rc $bench_rc"
grep -E '^gpu_check.sh: (conformance|GPT-2)' "$OUTD/gpu_check.log" || true
((check_rc == 0 && bench_rc == 0))
