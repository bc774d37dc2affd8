#!/usr/bin/env bash
# GPU check, run on the GPU machine in one command:
#   bash gpu_check.sh l2l-gpu-bundle.tar.gz     # unpacks next to the archive, then checks
#   bash l2l/gpu_check.sh                       # from an already unpacked bundle
# (the bundle comes from scripts/bundle.sh on a build machine). It:
#   1. finds the CUDA libraries the bundle leaves out (libcublasLt.so.13: the CUDA 13
#      toolkit, or PyTorch's nvidia wheels) and sets LD_LIBRARY_PATH;
#   2. checks every bundled binary resolves all its libraries;
#   3. runs the GPU conformance tests through ctest: `ctest -L gpu --no-tests=error`
#      (a CTestTestfile is generated for the unpacked paths, one ctest test per Catch2
#      test case, label gpu; without ctest it runs the binary and fails on zero tests);
#   4. trains GPT-2-small shapes for a few steps with the reference trainer on cuda:0
#      (the hidden "[.gpt2bench]" case of l2l_gpu_tests) and prints tokens/s, model FLOPs
#      utilisation = 6 x params x tokens/s over the bf16 GEMM peak measured here with
#      torch.matmul on 8192^2 bf16 matrices, and peak device memory (the backend's own
#      high-water mark and nvidia-smi's, polled);
#   4b. times the attention ops ("[.flashbench]": the fused kernel and the GEMM path,
#      fp32 and bf16) and PyTorch's scaled_dot_product_attention on the same shapes;
#   5. on a host with 4 or more GPUs, the device-group conformance cases ("[group]":
#      2- and 4-GPU groups equal one GPU and the reference trainer); with fewer it says
#      in the summary that they did not run;
#   6. on a host with 2 or more GPUs, the device group's throughput (scripts/bench_group.sh:
#      GPT-2 small, one worker --devices cuda:0..n-1 for n = 1, 2, 4, 8, tokens/s and
#      `ratio group_N/group_1`).
# Environment: L2L_BENCH_STEPS/B/M/T/MODEL (see tests/gpu/gpt2_bench_test.cc),
# L2L_GPU_CHECK_SKIP_BENCH=1 (skip the GPT-2-small training throughput and the bf16 peak),
# L2L_CUDA_GEMM=tf32 for TF32 GEMMs, PYTHON (default python3), L2L_CUBLAS_DIR,
# L2L_GPU_TEST_TIMEOUT (seconds per ctest case, 120), L2L_GPU_BENCH_TIMEOUT (seconds for
# the [.gpt2bench] run, 300). When torch cannot measure the bf16 peak (no torch, no GPU
# for it) the check goes on: MFU prints "n/a".
# The cuBLASLt lookup and the ldd check are shared with bench_gpu.sh: gpu_env.sh (the
# bundle's src/scripts/gpu_env.sh, else the one beside this script).
# Exit status: non-zero when any step fails (the summary says which).
# L2L_GPU_CHECK_SMOKE=1: a smoke run of this script itself, e.g. on a bundle of a CUDA
# emulator build (-DL2L_CUDA=EMU, docs/gpu.md): skips the nvidia-smi queries and memory
# polling, the cuBLASLt lookup and the torch bf16 peak (it says so), runs only the ctest
# cases matching L2L_GPU_CHECK_SMOKE_TESTS (a ctest -R regex; default: a few quick
# conformance cases) and the [.gpt2bench] run with tiny defaults (L2L_BENCH_B=1 M=1 T=16
# STEPS=1; set them to override). It fails like the full check does.
set -euo pipefail

die() { echo "gpu_check.sh: FAILED: $*" >&2; exit 1; }
log() { echo "gpu_check.sh: $*"; }

# ---- 0. locate (or unpack) the bundle ------------------------------------------------
if [[ $# -ge 1 ]]; then
  [[ -f "$1" ]] || die "no bundle archive $1"
  DEST=${L2L_CHECK_DIR:-$(cd "$(dirname "$1")" && pwd)/l2l-gpu-check}
  rm -rf "$DEST" && mkdir -p "$DEST"
  tar -C "$DEST" -xzf "$1"
  DIR="$DEST/l2l"
else
  DIR=$(cd "$(dirname "$0")" && pwd)
fi
[[ -x "$DIR/tests/l2l_gpu_tests" ]] || die "$DIR/tests/l2l_gpu_tests not found: not an l2l GPU bundle"
log "bundle $DIR (commit $(cat "$DIR/COMMIT" 2>/dev/null || echo ?), needs $(cat "$DIR/GLIBC_REQUIRED" 2>/dev/null || echo ?))"
PYTHON=${PYTHON:-python3}
SMOKE=${L2L_GPU_CHECK_SMOKE:-0}
TEST_TIMEOUT=${L2L_GPU_TEST_TIMEOUT:-120}
BENCH_TIMEOUT=${L2L_GPU_BENCH_TIMEOUT:-300}
[[ "$TEST_TIMEOUT" =~ ^[1-9][0-9]*$ && "$BENCH_TIMEOUT" =~ ^[1-9][0-9]*$ ]] ||
  die "L2L_GPU_TEST_TIMEOUT ('$TEST_TIMEOUT') and L2L_GPU_BENCH_TIMEOUT ('$BENCH_TIMEOUT') must be positive integers (seconds)"
ENV_SH=""
for e in "$DIR/src/scripts/gpu_env.sh" "$(cd "$(dirname "$0")" && pwd)/gpu_env.sh"; do
  [[ -f "$e" ]] && { ENV_SH=$e; break; }
done
[[ -n "$ENV_SH" ]] || die "gpu_env.sh not found (looked in $DIR/src/scripts and beside $0)"
# shellcheck source=scripts/gpu_env.sh
source "$ENV_SH"
[[ "$SMOKE" != 1 ]] || log "SMOKE mode: nvidia-smi, the cuBLASLt lookup and the torch bf16 peak are SKIPPED"

# ---- 1. GPU and libraries ------------------------------------------------------------
if [[ "$SMOKE" == 1 ]]; then
  GPU_NAME="(not queried: smoke mode)"
else
  command -v nvidia-smi >/dev/null || die "nvidia-smi not found: no NVIDIA driver on this machine"
  nvidia-smi -L || die "nvidia-smi -L failed: no usable GPU"
  GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 | head -1)
fi

if [[ "$SMOKE" == 1 ]]; then
  CUBLAS_DIR="(not looked up: smoke mode)"
  export LD_LIBRARY_PATH="$DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  CUBLAS_DIR=$(find_cublaslt) || die "libcublasLt.so.13 not found; looked in $(find_cublaslt_where) (set L2L_CUBLAS_DIR to the folder holding it)"
  export LD_LIBRARY_PATH="$DIR/lib:$CUBLAS_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # NCCL (device groups) is left out of the bundle too (200+ MB); a build without it needs none.
  if NCCL_DIR=$(find_cuda_lib libnccl.so.2); then
    export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$NCCL_DIR"
  fi
fi
# Tests that read configs/ find them in the bundle's src/ (not the build machine's tree).
if [[ -d "$DIR/src/configs" ]]; then
  export L2L_SOURCE_DIR="$DIR/src"
fi
log "GPU 0: $GPU_NAME; libcublasLt.so.13 from $CUBLAS_DIR"

unresolved=$(ldd_unresolved "$DIR"/bin/* "$DIR"/tests/l2l_*_tests) ||
  die "unresolved libraries (LD_LIBRARY_PATH=$LD_LIBRARY_PATH):"$'\n'"$unresolved"

# ---- 2. conformance tests (label gpu) -----------------------------------------------
CT="$DIR/ctest"
rm -rf "$CT" && mkdir -p "$CT"
# The device-group cases ([group]: n GPUs as one worker, NCCL) need 4 GPUs: step 4.
mapfile -t names < <("$DIR/tests/l2l_gpu_tests" "~[group]" --list-test-names-only | sed '/^$/d')
((${#names[@]} > 0)) || die "l2l_gpu_tests lists no test cases"
# A test name is a Catch2 test spec on the command line: ',' '[' ']' must be escaped with
# '\' (as catch_discover_tests does), else a name with a comma matches no test case and
# Catch2 exits 0 having run nothing; --warn NoTests makes that case fail all the same.
{
  echo "# generated by gpu_check.sh for $DIR"
  for n in "${names[@]}"; do
    spec=$(sed 's/\([],[]\)/\\\1/g' <<<"$n")
    echo "add_test([==[$n]==] \"$DIR/tests/l2l_gpu_tests\" [==[$spec]==] --warn NoTests --durations yes)"
    echo "set_tests_properties([==[$n]==] PROPERTIES LABELS gpu TIMEOUT $TEST_TIMEOUT WORKING_DIRECTORY \"$CT\")"
  done
} > "$CT/CTestTestfile.cmake"
test_rc=0
SMOKE_TESTS=${L2L_GPU_CHECK_SMOKE_TESTS:-'^cuda (backend|elementwise|LayerNorm|f32 to bf16|Gemm matches)|^L2L_CUDA_GEMM=bf16 reaches'}
if [[ "$SMOKE" == 1 ]]; then
  command -v ctest >/dev/null || die "smoke mode needs ctest on PATH"
  log "ctest -L gpu -R '$SMOKE_TESTS' --no-tests=error (smoke mode: a subset of the ${#names[@]} tests)"
  (cd "$CT" && ctest -L gpu -R "$SMOKE_TESTS" --no-tests=error --output-on-failure) || test_rc=$?
elif command -v ctest >/dev/null; then
  log "ctest -L gpu --no-tests=error (${#names[@]} tests, at most ${TEST_TIMEOUT} s each: L2L_GPU_TEST_TIMEOUT)"
  (cd "$CT" && ctest -L gpu --no-tests=error --output-on-failure) || test_rc=$?
else
  log "no ctest on PATH: running l2l_gpu_tests directly (${#names[@]} test cases)"
  "$DIR/tests/l2l_gpu_tests" --durations yes || test_rc=$?
fi

# ---- 3. GPT-2-small training throughput ----------------------------------------------
# L2L_GPU_CHECK_SKIP_BENCH=1 skips this step (scripts/gpu_device_run.sh: bench_gpu.sh
# measures the peak and the throughput right after).
if [[ "${L2L_GPU_CHECK_SKIP_BENCH:-0}" == 1 ]]; then
  log "GPT-2-small training throughput and the bf16 peak: SKIPPED (L2L_GPU_CHECK_SKIP_BENCH=1)"
  bench_rc=0; line="skipped"
else
if [[ "$SMOKE" == 1 ]]; then
  export L2L_BENCH_B=${L2L_BENCH_B:-1} L2L_BENCH_M=${L2L_BENCH_M:-1} L2L_BENCH_T=${L2L_BENCH_T:-16} \
         L2L_BENCH_STEPS=${L2L_BENCH_STEPS:-1}
  log "bf16 GEMM peak: SKIPPED (smoke mode); [.gpt2bench] with B=$L2L_BENCH_B M=$L2L_BENCH_M T=$L2L_BENCH_T STEPS=$L2L_BENCH_STEPS"
  PEAK_TFLOPS=0
else
log "measuring the bf16 GEMM peak with torch.matmul (8192^2)"
PEAK_TFLOPS=$("$PYTHON" - <<'PY'
import torch, time
assert torch.cuda.is_available(), "torch sees no GPU"
n = 8192
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
for _ in range(5): a @ b
torch.cuda.synchronize()
iters = 50
t0 = time.perf_counter()
for _ in range(iters): a @ b
torch.cuda.synchronize()
dt = time.perf_counter() - t0
print(f"{2 * n**3 * iters / dt / 1e12:.1f}")
PY
) || PEAK_TFLOPS=""
if [[ "$PEAK_TFLOPS" =~ ^[0-9]+(\.[0-9]+)?$ ]]; then
  log "bf16 GEMM peak on $GPU_NAME: $PEAK_TFLOPS TFLOP/s (measured)"
else
  log "WARNING: could not measure the bf16 peak with $PYTHON + torch (output above); MFU will print n/a"
  PEAK_TFLOPS=0
fi
fi

SMI_LOG="$CT/smi_memory.txt"
: > "$SMI_LOG"
SMI_PID=""
BASE_MIB=0
if [[ "$SMOKE" != 1 ]]; then
  ( while true; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 >> "$SMI_LOG" 2>/dev/null; sleep 0.2; done ) &
  SMI_PID=$!
  trap 'kill $SMI_PID 2>/dev/null || true' EXIT
  BASE_MIB=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 | head -1)
fi
bench_rc=0
if command -v timeout >/dev/null; then
  bench_out=$(timeout --kill-after=15 "$BENCH_TIMEOUT" "$DIR/tests/l2l_gpu_tests" "[.gpt2bench]" --warn NoTests 2>&1) || bench_rc=$?
  if ((bench_rc == 124 || bench_rc == 137)); then
    bench_out+=$'\n'"gpu_check.sh: the [.gpt2bench] run TIMED OUT after ${BENCH_TIMEOUT} s (L2L_GPU_BENCH_TIMEOUT)"
  fi
else
  bench_out=$("$DIR/tests/l2l_gpu_tests" "[.gpt2bench]" --warn NoTests 2>&1) || bench_rc=$?
fi
[[ -z "$SMI_PID" ]] || kill $SMI_PID 2>/dev/null || true
echo "$bench_out" | grep -E "gpt2bench:|FAILED|error" || true
line=$(echo "$bench_out" | grep "^gpt2bench:" | tail -1 || true)

get() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$line"; }
if [[ -n "$line" && $bench_rc -eq 0 ]]; then
  params=$(get params); step_tps=$(get step_tokens_per_s); fb_tps=$(get fwdbwd_tokens_per_s)
  peak_alloc=$(get peak_alloc_bytes); internal=$(get internal_bytes)
  smi_peak=$(grep -E '^[0-9]+$' "$SMI_LOG" | sort -n | tail -1 || true)
  "$PYTHON" - "$params" "$step_tps" "$fb_tps" "$PEAK_TFLOPS" "$peak_alloc" "$internal" "${smi_peak:-0}" "${BASE_MIB:-0}" <<'PY'
import sys
params, step_tps, fb_tps, peak, alloc, internal, smi_mib, base_mib = map(float, sys.argv[1:])
def mfu(tps): return f"MFU {100 * 6 * params * tps / (peak * 1e12):.2f}% of the bf16 peak" if peak > 0 else "MFU n/a (no peak measured)"
print(f"gpu_check.sh: GPT-2-small ({params/1e6:.1f}M params), reference trainer on cuda:0")
print(f"  tokens/s, whole step (fwd+bwd+host AdamW): {step_tps:,.1f}   {mfu(step_tps)}")
print(f"  tokens/s, forward+backward only:           {fb_tps:,.1f}   {mfu(fb_tps)}")
smi = (f"nvidia-smi peak {smi_mib/1024:.2f} GiB ({(smi_mib-base_mib)/1024:.2f} GiB above the idle {base_mib/1024:.2f} GiB)"
       if smi_mib > 0 else "nvidia-smi peak n/a (not polled)")
print(f"  peak device memory: {alloc/2**30:.2f} GiB allocated by l2l (+{internal/2**30:.2f} GiB workspace/scratch); {smi}")
print("  note: the reference trainer computes in fp32 (L2L_CUDA_GEMM=tf32 for TF32), so MFU against the bf16 peak is low by design")
PY
else
  echo "$bench_out" | tail -30
fi
fi

# ---- 4b. attention timing: the fused kernel and the GEMM path vs PyTorch's SDPA --------------
# The hidden "[.flashbench]" case (tests/gpu/flash_bench_test.cc) prints one flashbench:
# line per (impl, mode, shape); torch.nn.functional.scaled_dot_product_attention (causal,
# fp32 and bf16, k/v repeated for GQA) is timed here on the same shapes, the same way
# (median of 5 after 2 warm-ups, forward and forward+backward).
flash_rc=0
if [[ "$SMOKE" == 1 ]]; then
  flash_state="SKIPPED (smoke mode)"
else
  log "attention timing: l2l_gpu_tests [.flashbench], then torch SDPA"
  flash_out=$(timeout --kill-after=15 "$BENCH_TIMEOUT" "$DIR/tests/l2l_gpu_tests" "[.flashbench]" --warn NoTests 2>&1) ||
    flash_rc=$?
  echo "$flash_out" | grep -E "^flashbench:|FAILED|error" || echo "$flash_out" | tail -20
  "$PYTHON" - <<'PY' || log "WARNING: torch SDPA timing failed (output above)"
import time, torch
import torch.nn.functional as F
def med(fn):
    for _ in range(2): fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(5):
        t0 = time.perf_counter(); fn(); torch.cuda.synchronize(); ts.append((time.perf_counter() - t0) * 1e3)
    return sorted(ts)[2]
for dtype, mode in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
    for B, T, NH, NKV, hs in ((4, 1024, 16, 16, 64), (4, 1024, 16, 16, 128), (2, 4096, 16, 16, 64), (2, 4096, 32, 8, 128)):
        q = torch.randn(B, NH, T, hs, device="cuda", dtype=dtype, requires_grad=True)
        k = torch.randn(B, NKV, T, hs, device="cuda", dtype=dtype, requires_grad=True)
        v = torch.randn(B, NKV, T, hs, device="cuda", dtype=dtype, requires_grad=True)
        do = torch.randn(B, NH, T, hs, device="cuda", dtype=dtype)
        def fwd():
            return F.scaled_dot_product_attention(q, k.repeat_interleave(NH // NKV, 1), v.repeat_interleave(NH // NKV, 1), is_causal=True)
        def fwdbwd():
            fwd().backward(do)
        f = med(lambda: fwd()); fb = med(fwdbwd)
        print(f"flashbench: impl=torch_sdpa mode={mode} B={B} T={T} NH={NH} NKV={NKV} hs={hs} fwd_ms={f:.3f} fwdbwd_ms={fb:.3f}")
PY
  flash_state=$([[ $flash_rc -eq 0 ]] && echo OK || echo "FAILED (rc $flash_rc)")
fi

# ---- 4. several GPUs: the device group (l2l-worker --devices) ---------------------------
# Its conformance cases train 2- and 4-device groups against one device and the reference
# trainer (NCCL all-gather of 1/n fetches, reduce-scatter of gradients). Step 5 measures
# their speed.
group_rc=0
if [[ "$SMOKE" == 1 ]]; then
  NGPU=0
  group_state="SKIPPED (smoke mode)"
else
  NGPU=$(nvidia-smi -L | grep -c '^GPU ' || true)
  if ((NGPU >= 4)); then
    log "device group conformance on $NGPU GPUs: l2l_gpu_tests [group]"
    timeout --kill-after=15 $((TEST_TIMEOUT * 10)) "$DIR/tests/l2l_gpu_tests" "[group]" --warn NoTests --durations yes ||
      group_rc=$?
    group_state=$([[ $group_rc -eq 0 ]] && echo PASSED || echo "FAILED (rc $group_rc)")
  else
    group_state="NOT RUN: it needs 4 GPUs, this machine has $NGPU"
  fi
fi

# ---- 5b. several GPUs: the device group's throughput (scripts/bench_group.sh) ------------
# GPT-2 small through one l2l-eps and one l2l-worker --devices cuda:0..n-1 for n = 1, 2,
# 4, 8 up to the GPUs present: tokens/s, the step timeline and `ratio group_N/group_1`.
groupbench_rc=0
if [[ "$SMOKE" == 1 ]]; then
  groupbench_state="SKIPPED (smoke mode)"
elif ((NGPU >= 2)); then
  GROUP_SH="$DIR/src/scripts/bench_group.sh"
  [[ -f "$GROUP_SH" ]] || GROUP_SH="$(cd "$(dirname "$0")" && pwd)/bench_group.sh"
  log "device group throughput on $NGPU GPUs: $GROUP_SH"
  L2L_BUILD_DIR="$DIR" timeout --kill-after=15 $((TEST_TIMEOUT * 10)) bash "$GROUP_SH" || groupbench_rc=$?
  groupbench_state=$([[ $groupbench_rc -eq 0 ]] && echo OK || echo "FAILED (rc $groupbench_rc)")
else
  groupbench_state="NOT RUN: it needs 2 GPUs, this machine has $NGPU"
fi

# ---- summary -------------------------------------------------------------------------
echo "gpu_check.sh: conformance (ctest -L gpu): $([[ $test_rc -eq 0 ]] && echo PASSED || echo "FAILED (rc $test_rc)")"
echo "gpu_check.sh: GPT-2-small training:       $([[ "$line" == skipped ]] && echo "SKIPPED (L2L_GPU_CHECK_SKIP_BENCH=1)" || { [[ $bench_rc -eq 0 && -n "$line" ]] && echo OK || echo "FAILED (rc $bench_rc)"; })"
echo "gpu_check.sh: attention timing:          $flash_state"
echo "gpu_check.sh: device group (--devices):   $group_state"
echo "gpu_check.sh: device group throughput:    $groupbench_state"
[[ $test_rc -eq 0 && $bench_rc -eq 0 && -n "$line" && $flash_rc -eq 0 && $group_rc -eq 0 && $groupbench_rc -eq 0 ]]
