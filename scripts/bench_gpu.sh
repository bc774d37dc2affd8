#!/usr/bin/env bash
# GPU benchmark, one run, one GPU: l2l against the peers a GPU user would pick, on two
# models, the same tokens per step for every system (l2l issue 26, items 5 and 6):
#   systems  l2l          l2l-eps + one l2l-worker --device cuda:0, publish_dtype bf16, the
#                         bf16 GEMM mode (L2L_CUDA_GEMM=bf16), stash on the device;
#            eager        PyTorch eager: fp32 weights, bf16 autocast, fused AdamW, sdpa
#                         attention, gradient clipping (scripts/bench_gpu_torch.py);
#            compile      the same model under torch.compile (BENCH_COMPILE=regional: each
#                         transformer block, PyTorch's recipe for repeated blocks; full: the
#                         whole model).
#   models   gpt2-xl       GPT-2 XL (1.56B: 48 x 1600, 25 heads, vocab 50257, tied);
#            qwen2.5-1.5b  the Qwen2.5-1.5B shape (1.54B: 28 x 1536, 12 heads on 2 kv,
#                          SwiGLU 8960, vocab 151936, tied), random init: configs/models'
#                          preset for l2l, a transformers Qwen2Config for PyTorch.
# Before them it measures the device's rates (bench_gpu_torch.py rates: bf16 matmul
# TFLOP/s with torch.matmul 8192^3 -- the MFU peak --, pinned H2D/D2H GB/s, the attention
# rate) into rates.json, and at the end runs `l2l-bench-relay --simulate --rates-json` on
# them: the relay model's one-device step beside l2l's measured one.
# Prints, last, one table: per model and system tokens/s, peak device memory (nvidia-smi,
# per process), the ratios to PyTorch eager (targets for l2l: >= 0.85x tokens/s at
# <= 0.3x memory) and MFU = tokens/s x FLOPs/token over the measured peak (FLOPs/token:
# bench_gpu_torch.py flops, the same for every system).
# A benchmark: it never fails on speed. A phase that fails (out of memory, torch.compile
# failing, a model that does not fit, a time limit) prints one line saying so and its
# row says FAILED/TIMED OUT; the others go on. Exit status non-zero if any phase failed.
#
# Order, so that a failure or the time limit loses as little as possible: (0) the
# cuBLASLt lookup and ldd of bin/* (fails at once naming missing libraries); (1) rates;
# (2) per model: eager, then l2l; (3) per model: torch.compile (the slowest to start);
# (3b) the bf16 operand reuse A/B (BENCH_REUSE_AB); (4) only with BENCH_DEEP=1: l2l
# GPT-2 XL with stash host at 1x and 4x depth; (5) the table, (6) model vs measurement. Each phase has its own time limit, cut to what
# BENCH_TOTAL_TIMEOUT leaves (30 s kept for stopping daemons; a phase with under 20 s
# left is not started and says so), so the script ends inside its total.
#
# Run on the GPU machine from an unpacked bundle (scripts/bundle.sh puts this script in
# l2l/src/scripts/) or from a CUDA build tree:
#   bash bench_gpu.sh [L2L_ROOT]        # L2L_ROOT holds bin/ (default: the bundle root)
# Environment:
#   BENCH_MODELS ("gpt2-xl qwen2.5-1.5b"), BENCH_SYSTEMS ("eager l2l compile"),
#   BENCH_B (8), BENCH_M (2), BENCH_T (1024): B x M x T tokens per step for every system,
#   BENCH_STEPS (timed steps, 4), BENCH_WARMUP (2), BENCH_MODEL_LAYERS (every model's
#   depth; default the preset's), BENCH_COMPILE (regional | full),
#   BENCH_TOTAL_TIMEOUT (s, 420; 0 = none), BENCH_RATES_TIMEOUT (60), BENCH_TORCH_TIMEOUT
#   (eager, 100), BENCH_COMPILE_TIMEOUT (150), BENCH_RUN_TIMEOUT (each l2l-worker run,
#   150), BENCH_EPS_START_TIMEOUT (s for l2l-eps to listen, 150),
#   BENCH_OUT_DIR (also write rates.json, results.json, simulate.txt and
#   bench_gpu_logs.tar.gz -- job YAMLs, EPS/worker/PyTorch logs -- there),
#   BENCH_RATES_JSON (use this rates file instead of measuring), BENCH_DEEP=1,
#   BENCH_SKIP_TORCH=1 (no PyTorch phase: rows SKIPPED), BENCH_TORCH_DEVICE (cuda; cpu
#   runs the PyTorch phases on the CPU, with --tiny in smoke mode: a rehearsal of the
#   script, not a benchmark), PYTHON (python3), L2L_CUBLAS_DIR (as gpu_check.sh),
#   BENCH_KEEP_WORK=1 (keep the temp folder), BENCH_REUSE_AB (1: the first model's l2l run
#   again with L2L_CUDA_BF16_REUSE=0, the bf16 operand reuse's A/B, docs/gpu.md; 0: not).
# A run past its time limit is killed (SIGTERM, SIGKILL 15 s later) and reported as
# "TIMED OUT after N s"; its l2l-eps is stopped without a checkpoint (SIGKILL if
# `l2lctl stop` does not end it, then its /dev/shm segments are removed).
# BENCH_SMOKE=1: a smoke test of the script on the CUDA emulator (docs/gpu.md) or a quick
#   look on a GPU: tiny shapes of both models (2 layers, width 64, vocabulary 256; T 64,
#   B 2, M 2, 2 + 2 steps; any BENCH_* above still overrides), no cuBLASLt lookup, no
#   nvidia-smi (memory: the worker's own device_bytes), PyTorch SKIPPED unless
#   BENCH_TORCH_DEVICE=cpu, rates synthetic unless BENCH_RATES_JSON is set (all said so in
#   the output), BENCH_DEEP=1 by default; everything else for real.
set -euo pipefail
die() { echo "bench_gpu.sh: FAILED: $*" >&2; exit 1; }
log() { echo "bench_gpu.sh: $*"; }

HERE=$(cd "$(dirname "$0")" && pwd)
if [[ $# -ge 1 ]]; then ROOT=$(cd "$1" && pwd)
elif [[ -x "$HERE/../../bin/l2l-worker" ]]; then ROOT=$(cd "$HERE/../.." && pwd)   # bundle: l2l/src/scripts
elif [[ -x "$HERE/../build/bin/l2l-worker" ]]; then ROOT=$(cd "$HERE/../build" && pwd)
else die "no l2l binaries found; pass the folder holding bin/"; fi
BIN="$ROOT/bin"
[[ -x "$BIN/l2l-eps" && -x "$BIN/l2l-worker" && -x "$BIN/l2lctl" ]] || die "$BIN lacks l2l-eps, l2l-worker or l2lctl"
command -v timeout >/dev/null || die "no 'timeout' on PATH (coreutils): every run is time-limited"
TORCH_PY="$HERE/bench_gpu_torch.py"
[[ -f "$TORCH_PY" ]] || die "$TORCH_PY not found (bundle.sh packs scripts/)"
PYTHON=${PYTHON:-python3}
# l2l's GEMMs in bf16 with fp32 accumulation (docs/gpu.md, "bf16 GEMM mode"), the
# closest to PyTorch's bf16 autocast; set L2L_CUDA_GEMM=fp32|tf32 to compare.
export L2L_CUDA_GEMM=${L2L_CUDA_GEMM:-bf16}
SMOKE=${BENCH_SMOKE:-0}
if [[ "$SMOKE" == 1 ]]; then
  B=${BENCH_B:-2}; M=${BENCH_M:-2}; T=${BENCH_T:-64}
  STEPS=${BENCH_STEPS:-2}; WARMUP=${BENCH_WARMUP:-2}
  DATA_TOKENS=65536; DEEP=${BENCH_DEEP:-1}
  log "SMOKE mode: tiny shapes of the models; the cuBLASLt lookup and nvidia-smi memory polling are SKIPPED"
else
  B=${BENCH_B:-8}; M=${BENCH_M:-2}; T=${BENCH_T:-1024}
  STEPS=${BENCH_STEPS:-4}; WARMUP=${BENCH_WARMUP:-2}
  DATA_TOKENS=1000000; DEEP=${BENCH_DEEP:-0}
fi
LAYERS_OVERRIDE=${BENCH_MODEL_LAYERS:-}
MODELS=${BENCH_MODELS:-gpt2-xl qwen2.5-1.5b}
SYSTEMS=" ${BENCH_SYSTEMS:-eager l2l compile} "
COMPILE=${BENCH_COMPILE:-regional}
TORCH_DEVICE=${BENCH_TORCH_DEVICE:-cuda}
SKIP_TORCH=${BENCH_SKIP_TORCH:-0}
RATES_TIMEOUT=${BENCH_RATES_TIMEOUT:-60}
TORCH_TIMEOUT=${BENCH_TORCH_TIMEOUT:-100}
COMPILE_TIMEOUT=${BENCH_COMPILE_TIMEOUT:-150}
RUN_TIMEOUT=${BENCH_RUN_TIMEOUT:-150}
EPS_START_TIMEOUT=${BENCH_EPS_START_TIMEOUT:-150}
TOTAL_TIMEOUT=${BENCH_TOTAL_TIMEOUT:-420}
OUT_DIR=${BENCH_OUT_DIR:-}
((STEPS >= 1 && WARMUP >= 0)) || die "BENCH_STEPS must be >= 1 and BENCH_WARMUP >= 0"
[[ -z "$LAYERS_OVERRIDE" || "$LAYERS_OVERRIDE" =~ ^[1-9][0-9]*$ ]] || die "BENCH_MODEL_LAYERS must be a positive integer, not '$LAYERS_OVERRIDE'"
for v in RATES_TIMEOUT TORCH_TIMEOUT COMPILE_TIMEOUT RUN_TIMEOUT EPS_START_TIMEOUT; do
  [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "BENCH_$v must be a positive number of seconds, not '${!v}'"
done
[[ "$TOTAL_TIMEOUT" =~ ^[0-9]+$ ]] || die "BENCH_TOTAL_TIMEOUT must be a number of seconds (0: none), not '$TOTAL_TIMEOUT'"
[[ "$COMPILE" == regional || "$COMPILE" == full ]] || die "BENCH_COMPILE must be regional or full, not '$COMPILE'"
[[ "$TORCH_DEVICE" == cuda || "$TORCH_DEVICE" == cpu ]] || die "BENCH_TORCH_DEVICE must be cuda or cpu, not '$TORCH_DEVICE'"
for m in $MODELS; do
  [[ "$m" == gpt2-xl || "$m" == qwen2.5-1.5b ]] || die "BENCH_MODELS: '$m' is not gpt2-xl or qwen2.5-1.5b"
done
for s in $SYSTEMS; do
  [[ "$s" == eager || "$s" == l2l || "$s" == compile ]] || die "BENCH_SYSTEMS: '$s' is not eager, l2l or compile"
done
[[ -z "$OUT_DIR" ]] || { mkdir -p "$OUT_DIR" && OUT_DIR=$(cd "$OUT_DIR" && pwd); } || die "cannot create BENCH_OUT_DIR $OUT_DIR"
TOKENS_PER_STEP=$((B * M * T))

# ---- 0. libraries, before anything runs -----------------------------------------------
# The bundle's lib/, and cuBLASLt (left out of the bundle) from the CUDA toolkit or
# PyTorch's wheels: the same lookup as gpu_check.sh (gpu_env.sh).
[[ -f "$HERE/gpu_env.sh" ]] || die "$HERE/gpu_env.sh not found (it is shared with gpu_check.sh; bundle.sh packs it)"
# shellcheck source=scripts/gpu_env.sh
source "$HERE/gpu_env.sh"
if [[ -d "$ROOT/lib" ]]; then export LD_LIBRARY_PATH="$ROOT/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
if [[ "$SMOKE" == 1 ]]; then
  CUBLAS_NOTE="libcublasLt.so.13 not looked up (smoke mode)"
elif CUBLAS_DIR=$(find_cublaslt); then
  export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$CUBLAS_DIR"
  CUBLAS_NOTE="libcublasLt.so.13 from $CUBLAS_DIR"
else
  CUBLAS_NOTE="libcublasLt.so.13 NOT FOUND; looked in $(find_cublaslt_where); set L2L_CUBLAS_DIR"
fi
log "$CUBLAS_NOTE"
unresolved=$(ldd_unresolved "$BIN"/*) ||
  die "unresolved libraries in $BIN (nothing has run yet; LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}):"$'\n'"$unresolved"$'\n'"($CUBLAS_NOTE)"
log "ldd: every binary in $BIN resolves its libraries"
log "l2l GEMMs: L2L_CUDA_GEMM=$L2L_CUDA_GEMM; commit $(cat "$ROOT/COMMIT" 2>/dev/null || git -C "$HERE/.." rev-parse --short HEAD 2>/dev/null || echo '?')"

WORK=$(mktemp -d /tmp/l2l-bench-gpu.XXXXXX)
RESULTS="$WORK/results.jsonl"; : > "$RESULTS"
pids=()       # background processes of ours still to be stopped on exit
EPS_LIVE=""   # state dir of the l2l-eps running now: on an early exit it is stopped without
EPS_PID=""    # its final checkpoint (SIGTERM alone would write one: ~19 GB at GPT-2 XL)
EPS_JOB=""; EPS_NAME=""
untrack() { local keep=() p; for p in ${pids[@]+"${pids[@]}"}; do [[ "$p" == "$1" ]] || keep+=("$p"); done; pids=(${keep[@]+"${keep[@]}"}); }
# abort_eps: stops the live l2l-eps without a checkpoint; SIGKILL if `l2lctl stop` does
# not end it within ~55 s (then its /dev/shm segments, named l2l-<job>-*, are removed).
abort_eps() {
  [[ -n "$EPS_LIVE" ]] || return 0
  timeout 45 "$BIN/l2lctl" --state-dir "$EPS_LIVE" stop --abort-step --skip-checkpoint --wait 30 \
      > "$EPS_LIVE/../abort.log" 2>&1 || true
  for _ in $(seq 1 20); do kill -0 "$EPS_PID" 2>/dev/null || break; sleep 0.5; done
  if kill -0 "$EPS_PID" 2>/dev/null; then
    kill -KILL "$EPS_PID" 2>/dev/null || true
    echo "bench_gpu.sh: l2l-eps ($EPS_NAME, pid $EPS_PID) did not stop: killed (SIGKILL, no checkpoint)" >&2
  fi
  wait "$EPS_PID" 2>/dev/null || true
  untrack "$EPS_PID"
  rm -f /dev/shm/l2l-"$EPS_JOB"-* 2>/dev/null || true
  EPS_LIVE=""; EPS_PID=""
}
save_outputs() {  # the logs (not the tokens files) as one archive beside the figures
  [[ -n "$OUT_DIR" ]] || return 0
  cp "$RESULTS" "$OUT_DIR/results.jsonl" 2>/dev/null || true
  (cd "$WORK" && find . -type f ! -name '*.bin' ! -name 'smi*.txt' -size -20M -print0 |
     tar --null -czf "$OUT_DIR/bench_gpu_logs.tar.gz" -T - 2>/dev/null) || true
}
cleanup() {
  stop_poll
  abort_eps
  local p
  for p in ${pids[@]+"${pids[@]}"}; do kill "$p" 2>/dev/null || true; done
  save_outputs
  if [[ "${BENCH_KEEP_WORK:-0}" == 1 ]]; then echo "bench_gpu.sh: kept $WORK (BENCH_KEEP_WORK=1)"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

# limit_for NOMINAL: the time limit for the next phase, NOMINAL cut to what
# BENCH_TOTAL_TIMEOUT leaves (minus 30 s to stop daemons); 0 when under 20 s are left.
limit_for() {
  if ((TOTAL_TIMEOUT == 0)); then echo "$1"; return; fi
  local left=$((TOTAL_TIMEOUT - SECONDS - 30))
  if ((left < 20)); then echo 0; elif ((left < $1)); then echo "$left"; else echo "$1"; fi
}
not_started() { echo "not started: under 20 s of BENCH_TOTAL_TIMEOUT=${TOTAL_TIMEOUT} s left after ${SECONDS} s"; }

# record MODEL SYSTEM STATUS TOKENS_PER_S PEAK_MIB MEM_SOURCE STEP_S [EXTRA_JSON]: one row.
record() {
  "$PYTHON" - "$@" >> "$RESULTS" <<'PY'
import json, sys
a = sys.argv[1:]
row = {"model": a[0], "system": a[1], "status": a[2], "tokens_per_s": float(a[3]), "peak_mib": float(a[4]),
       "mem_source": a[5], "step_s": float(a[6])}
if len(a) > 7 and a[7]:
    row["extra"] = json.loads(a[7])
print(json.dumps(row))
PY
}

# ---- GPU memory polling: per-process peak (MiB) from nvidia-smi ----------------------
POLL_PID=""
USE_SMI=1
[[ "$SMOKE" != 1 ]] || USE_SMI=0
start_poll() {  # start_poll FILE (no polling without nvidia-smi: POLL_PID empty)
  POLL_PID=""
  ((USE_SMI)) || return 0
  ( while true; do
      nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null | sed "s/^/$(date +%s) /"
      echo "$(date +%s) total,$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0)"
      sleep 0.2
    done ) > "$1" &
  POLL_PID=$!; pids+=("$POLL_PID")
}
peak_mib() {  # peak_mib FILE PID BASE_MIB: the PID's peak, else total peak minus the idle base
  [[ -s "$1" ]] || { echo 0; return; }
  local p; p=$(awk -v pid="$2" '{split($2,a,","); if (a[1]==pid && a[2]+0>m) m=a[2]+0} END {print m+0}' "$1")
  if [[ "$p" == 0 ]]; then
    p=$(awk -v base="$3" '{split($2,a,","); if (a[1]=="total" && a[2]-base>m) m=a[2]-base} END {print m+0}' "$1")
  fi
  echo "$p"
}
stop_poll() {
  [[ -n "${POLL_PID:-}" ]] || return 0
  kill "$POLL_PID" 2>/dev/null || true; wait "$POLL_PID" 2>/dev/null || true
  untrack "$POLL_PID"; POLL_PID=""
}
GPU_NAME="(not queried: smoke mode)"
BASE_MIB=0
if ((USE_SMI)); then
  command -v nvidia-smi >/dev/null || die "nvidia-smi not found (BENCH_SMOKE=1 runs without it)"
  BASE_MIB=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 | head -1)
  [[ "$BASE_MIB" =~ ^[0-9]+$ ]] || die "nvidia-smi gave no memory.used for GPU 0 ('$BASE_MIB')"
  GPU_NAME=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader -i 0 | head -1)
  log "GPU 0: $GPU_NAME; idle memory in use $BASE_MIB MiB"
fi

# run_limited LIMIT PIDFILE LOG CMD...: runs CMD in the background under `timeout` (SIGTERM
# at LIMIT s, SIGKILL 15 s later), writing CMD's own pid (not timeout's) to PIDFILE, and
# waits for it. Returns CMD's exit status; 124 or 137 mean it timed out.
run_limited() {
  local limit=$1 pidfile=$2 out=$3; shift 3
  timeout --kill-after=15 "$limit" bash -c 'echo $$ > "$0"; exec "$@"' "$pidfile" "$@" > "$out" 2>&1 &
  local tp=$! rc=0; pids+=("$tp")
  wait "$tp" || rc=$?
  untrack "$tp"
  return "$rc"
}

# ---- FLOPs per token (no torch needed) --------------------------------------------------
TINY_FLAG=""; [[ "$SMOKE" != 1 ]] || TINY_FLAG="--tiny"
declare -A FLOPS=()
for m in $MODELS; do
  fl=$("$PYTHON" "$TORCH_PY" flops --model "$m" --T "$T" ${LAYERS_OVERRIDE:+--layers "$LAYERS_OVERRIDE"} $TINY_FLAG) ||
    die "bench_gpu_torch.py flops failed for $m"
  FLOPS[$m]=$(sed -n 's/^flops //p' <<<"$fl")
  desc=$("$PYTHON" - "${FLOPS[$m]}" <<'PY'
import json, sys
j = json.loads(sys.argv[1])
print("{:,} params, {} layers, {:.2f} GFLOP/token (6 x params a token multiplies + 12 x layers x d x T)".format(
    j["params"], j["layers"], j["flops_per_token"] / 1e9))
PY
) || die "could not read bench_gpu_torch.py's flops line for $m: ${FLOPS[$m]}"
  log "$m: $desc"
done

# ---- 1. the device's rates ----------------------------------------------------------------
RATES="$WORK/rates.json"
RATES_STATUS=""
if [[ -n "${BENCH_RATES_JSON:-}" ]]; then
  cp "$BENCH_RATES_JSON" "$RATES" || die "BENCH_RATES_JSON $BENCH_RATES_JSON unreadable"
  RATES_STATUS="from $BENCH_RATES_JSON (not measured in this run)"
elif [[ "$SMOKE" == 1 && "$TORCH_DEVICE" != cpu ]]; then
  echo '{"device": "synthetic (smoke mode)", "matmul_tflops": 100.0, "attention_tflops": 50.0, "h2d_gbps": 20.0, "d2h_gbps": 20.0}' > "$RATES"
  RATES_STATUS="SYNTHETIC (smoke mode: nothing measured)"
elif [[ "$SKIP_TORCH" == 1 ]]; then
  RATES_STATUS="SKIPPED (BENCH_SKIP_TORCH=1: torch measures them)"
else
  limit=$(limit_for "$RATES_TIMEOUT")
  if ((limit == 0)); then RATES_STATUS="FAILED ($(not_started))"
  else
    log "rates: bf16 matmul 8192^3, pinned H2D/D2H 1 GiB, SDPA attention fwd+bwd (at most ${limit} s)"
    rrc=0
    run_limited "$limit" "$WORK/rates.pid" "$WORK/rates.log" "$PYTHON" "$TORCH_PY" rates --device "$TORCH_DEVICE" \
        --out "$RATES" || rrc=$?
    if ((rrc == 124 || rrc == 137)); then RATES_STATUS="FAILED (TIMED OUT after ${limit} s)"
    elif ((rrc != 0)) || [[ ! -s "$RATES" ]]; then
      tail -5 "$WORK/rates.log"; RATES_STATUS="FAILED (exit status $rrc; log above)"
    else RATES_STATUS="measured now"; fi
  fi
fi
PEAK_TFLOPS=0
if [[ -s "$RATES" ]]; then
  PEAK_TFLOPS=$("$PYTHON" -c 'import json,sys; print(json.load(open(sys.argv[1]))["matmul_tflops"])' "$RATES")
  log "rates ($RATES_STATUS): $(tr -d '\n' < "$RATES" | cut -c1-400)"
  [[ -z "$OUT_DIR" ]] || cp "$RATES" "$OUT_DIR/rates.json"
else
  log "rates: $RATES_STATUS; MFU prints n/a and the model comparison is skipped"
fi

# ---- l2l ---------------------------------------------------------------------------------
# `preset: <model>` is looked up in $L2L_CONFIG_DIR/models (common/config.h): the bundle's
# src/configs, or the source tree's configs.
CFGS=""
for c in "$ROOT/src/configs" "$HERE/../configs"; do [[ -d "$c/models" ]] && { CFGS=$(cd "$c" && pwd); break; }; done
[[ -n "$CFGS" ]] || die "no configs/models folder (looked in $ROOT/src/configs and $HERE/../configs)"
export L2L_CONFIG_DIR="$CFGS"

model_vocab() { if [[ "$SMOKE" == 1 ]]; then echo 256; elif [[ "$1" == gpt2-xl ]]; then echo 50257; else echo 151936; fi; }
# The job YAML's model lines: the preset, T, and in smoke mode the tiny shape (the same as
# bench_gpu_torch.py --tiny).
model_yaml() {  # model_yaml MODEL LAYERS
  echo "model:"
  echo "  preset: $1"
  [[ -z "$2" ]] || echo "  n_layer: $2"
  echo "  seq_len: $T"
  if [[ "$SMOKE" == 1 ]]; then
    echo "  vocab_size: 256"
    echo "  d_model: 64"
    if [[ "$1" == gpt2-xl ]]; then echo "  n_head: 2"; echo "  d_ff: 256"
    else echo "  n_head: 4"; echo "  n_kv_heads: 2"; echo "  d_ff: 128"; fi
    [[ -n "$2" ]] || echo "  n_layer: 2"
  fi
}
write_tokens() {  # write_tokens FILE N VOCAB: a random tokens file (common/formats/tokens_file.h)
  "$PYTHON" - "$@" <<'PY'
# 256-int32 header [magic, version, count, bytes per token]; version 1 uint16 tokens,
# version 2 uint32 (vocabularies above 65,536 ids).
import array, random, sys
path, n, vocab = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
wide = vocab > 65536
hdr = array.array("i", [20240520, 2 if wide else 1, n, 4 if wide else 2] + [0] * 252)
rnd = random.Random(0)
tok = array.array("I" if wide else "H", (rnd.randrange(vocab) for _ in range(n)))
with open(path, "wb") as f:
    hdr.tofile(f); tok.tofile(f)
PY
}
# run_fail NAME MSG: reports a failed l2l run (and stops its daemon); the caller returns 1.
run_fail() {
  L2L_ERR="$2"
  echo "bench_gpu.sh: FAILED: l2l $1: $2" >&2
  stop_poll
  abort_eps
}

# run_l2l NAME MODEL LAYERS STASH STEPS -> 0 and L2L_TPS, L2L_MIB, L2L_STEP_S, L2L_BREAKDOWN,
# L2L_DEV_MIB, L2L_MEM_SRC; or 1 and L2L_ERR
run_l2l() {
  local name=$1 model=$2 layers=$3 stash=$4 steps=$5
  local dir="$WORK/$name"; mkdir -p "$dir/eps"
  local total=$((steps + WARMUP))
  L2L_ERR=""
  local limit; limit=$(limit_for "$RUN_TIMEOUT")
  ((limit > 0)) || { run_fail "$name" "$(not_started)"; return 1; }
  local vocab; vocab=$(model_vocab "$model")
  local data="$WORK/train-$vocab.bin"
  [[ -s "$data" ]] || write_tokens "$data" "$DATA_TOKENS" "$vocab" || { run_fail "$name" "could not write $data with $PYTHON"; return 1; }
  {
    model_yaml "$model" "$layers"
    cat <<YAML
optim:
  lr: 1.0e-4
train:
  steps: $total
  micro_batch_size: $B
  micro_batches: $M
  seq_len: $T
  stash: $stash
  log_every: 1
data:
  train_path: $data
publish_dtype: bf16
YAML
  } > "$dir/job.yaml"
  EPS_JOB="bench$$${name//[^a-z0-9]/}"; EPS_NAME=$name
  "$BIN/l2l-eps" --job "$dir/job.yaml" --state-dir "$dir/eps" --workers 1 --job-id "$EPS_JOB" --allow-data "$WORK" \
      > "$dir/eps.log" 2>&1 &
  EPS_PID=$!; pids+=("$EPS_PID"); EPS_LIVE="$dir/eps"
  local start_limit; start_limit=$(limit_for "$EPS_START_TIMEOUT"); ((start_limit > 0)) || start_limit=20
  local t0=$SECONDS
  while ((SECONDS - t0 < start_limit)); do
    [[ -s "$dir/eps/eps.port" ]] && break; kill -0 "$EPS_PID" 2>/dev/null || break; sleep 0.5
  done
  if [[ ! -s "$dir/eps/eps.port" ]]; then
    cat "$dir/job.yaml"; tail -20 "$dir/eps.log"
    if kill -0 "$EPS_PID" 2>/dev/null; then run_fail "$name" "l2l-eps did not listen within ${start_limit} s (BENCH_EPS_START_TIMEOUT)"
    else run_fail "$name" "l2l-eps exited before listening (log above)"; fi
    return 1
  fi
  log "  l2l $name: l2l-eps listening after $((SECONDS - t0)) s"
  local port; port=$(cat "$dir/eps/eps.port")
  limit=$(limit_for "$RUN_TIMEOUT")
  ((limit > 0)) || { run_fail "$name" "$(not_started)"; return 1; }
  start_poll "$dir/smi.txt"
  local wrc=0
  run_limited "$limit" "$dir/worker.pid" "$dir/worker.log" \
      "$BIN/l2l-worker" --eps "127.0.0.1:$port" --device cuda:0 || wrc=$?
  stop_poll
  local wpid; wpid=$(cat "$dir/worker.pid" 2>/dev/null || echo 0)
  if ((wrc == 124 || wrc == 137)); then
    tail -20 "$dir/worker.log"; tail -20 "$dir/eps.log"
    run_fail "$name" "l2l-worker TIMED OUT after ${limit} s (BENCH_RUN_TIMEOUT=$RUN_TIMEOUT, BENCH_TOTAL_TIMEOUT=$TOTAL_TIMEOUT); killed, l2l-eps stopped"
    return 1
  elif ((wrc != 0)); then
    tail -20 "$dir/worker.log"; tail -20 "$dir/eps.log"
    local why; why=$(grep -iE 'out of memory|error' "$dir/worker.log" | tail -1 | cut -c1-200 || true)
    run_fail "$name" "l2l-worker exited with status $wrc${why:+: $why} (log above)"; return 1
  fi
  # Stop the daemon without its final checkpoint (a killed l2l-eps writes one on the way
  # out: the whole fp32 master + AdamW state, 19 GB at GPT-2 XL).
  if ! timeout 150 "$BIN/l2lctl" --state-dir "$dir/eps" stop --skip-checkpoint --wait 120 > "$dir/stop.log" 2>&1; then
    cat "$dir/stop.log"; tail -20 "$dir/eps.log"
    run_fail "$name" "l2lctl stop failed"; return 1
  fi
  local eps_rc=0; wait "$EPS_PID" || eps_rc=$?
  untrack "$EPS_PID"; EPS_LIVE=""; EPS_PID=""
  ((eps_rc == 0)) || { tail -20 "$dir/eps.log"; run_fail "$name" "l2l-eps exited with status $eps_rc"; return 1; }
  [[ ! -d "$dir/eps/checkpoints" ]] || log "  warning: l2l-eps ($name) wrote a checkpoint: $(du -sh "$dir/eps/checkpoints" | cut -f1)"
  # At exit: "l2l-worker: done steps=N peak_rss_kb=K device_bytes=D stash_host_bytes=H ..."
  local done_line; done_line=$(grep "^l2l-worker: done" "$dir/worker.log" | tail -1 || true)
  [[ -n "$done_line" ]] || { tail -20 "$dir/worker.log"; run_fail "$name" "l2l-worker printed no 'l2l-worker: done' line"; return 1; }
  local done_steps; done_steps=$(sed -n 's/.* steps=\([0-9]*\).*/\1/p' <<<"$done_line")
  [[ "$done_steps" == "$total" ]] || { tail -20 "$dir/worker.log"; run_fail "$name" "l2l-worker did $done_steps steps, not $total"; return 1; }
  # "cuda:0 (...): bf16 GEMM operands: X M elements cast, Y M read in place ... (P%)": the
  # weights published bf16 that the GEMMs read without a cast pass (docs/gpu.md).
  local operands; operands=$(grep -o 'bf16 GEMM operands: .*' "$dir/worker.log" | tail -1 || true)
  [[ -z "$operands" ]] || log "  $name: $operands"
  local dev_bytes; dev_bytes=$(sed -n 's/.* device_bytes=\([0-9]*\).*/\1/p' <<<"$done_line")
  [[ -n "$dev_bytes" ]] || { run_fail "$name" "l2l-worker: no device_bytes= in '$done_line'"; return 1; }
  L2L_DEV_MIB=$(awk -v b="$dev_bytes" 'BEGIN { printf "%.2f", b / 1048576 }')
  L2L_MIB=$L2L_DEV_MIB; L2L_MEM_SRC="worker device_bytes (nvidia-smi not polled)"
  if ((USE_SMI)); then
    local smi; smi=$(peak_mib "$dir/smi.txt" "$wpid" "$BASE_MIB")
    if [[ "$smi" != 0 ]]; then L2L_MIB=$smi; L2L_MEM_SRC="nvidia-smi (worker's device_bytes $L2L_DEV_MIB MiB)"
    else L2L_MEM_SRC="worker device_bytes: nvidia-smi saw no memory above the idle ${BASE_MIB} MiB"; fi
  fi
  # Progress lines: "step 12/100 loss 4.12 tok/s 5321 step_s 0.77 wait_layer 0.01 wait_push 0.00 ..."
  # (log_every 1: one per step; the first WARMUP are left out).
  read -r L2L_TPS L2L_STEP_S L2L_BREAKDOWN < <(awk -v skip="$WARMUP" '
    $1 == "step" && $2 ~ /^[0-9]+\/[0-9]+$/ { n++; if (n <= skip) next
      delete v; for (i = 2; i < NF; i++) v[$i] = $(i + 1)
      if (!("tok/s" in v) || !("step_s" in v) || !("wait_layer" in v) || !("wait_push" in v)) { bad = 1; next }
      tps += v["tok/s"]; st += v["step_s"]; wl += v["wait_layer"]; wp += v["wait_push"]; k++ }
    END { if (k == 0 || bad) { print "0 0 none"; exit }
          printf "%.1f %.4f step_s=%.3f compute~%.3f wait_layer(EPS/H2D)=%.3f wait_push(D2H/EPS)=%.3f\n",
                 tps / k, st / k, st / k, (st - wl - wp) / k, wl / k, wp / k }' "$dir/worker.log")
  if [[ "$L2L_BREAKDOWN" == none ]]; then
    tail -20 "$dir/worker.log"
    run_fail "$name" "no parseable progress line after the $WARMUP warm-up steps"; return 1
  fi
  log "l2l $name: tokens/s $L2L_TPS; peak device memory ${L2L_MIB} MiB ($L2L_MEM_SRC); per step: $L2L_BREAKDOWN"
  log "  $(sed -n 's/.*\(backend cuda:0 .*\), stash.*/\1/p' "$dir/worker.log" | head -1 | grep . || echo "worker backend line not found")"
  log "  $done_line"
}

# ---- PyTorch --------------------------------------------------------------------------------
# run_torch MODEL MODE(eager|compile) -> a row in results.jsonl
run_torch() {
  local model=$1 mode=$2 sysname=$1-$2
  local tmode=$mode nominal=$TORCH_TIMEOUT
  if [[ "$mode" == compile ]]; then nominal=$COMPILE_TIMEOUT; [[ "$COMPILE" == full ]] && tmode=compile-full; fi
  if [[ "$SKIP_TORCH" == 1 ]]; then record "$model" "$mode" "SKIPPED (BENCH_SKIP_TORCH=1)" 0 0 none 0; return 0; fi
  if [[ "$SMOKE" == 1 && "$TORCH_DEVICE" != cpu ]]; then
    record "$model" "$mode" "SKIPPED (smoke mode; BENCH_TORCH_DEVICE=cpu rehearses it)" 0 0 none 0; return 0
  fi
  local limit; limit=$(limit_for "$nominal")
  if ((limit == 0)); then
    log "PyTorch $sysname: $(not_started)"
    record "$model" "$mode" "FAILED ($(not_started))" 0 0 none 0; FAILED+=("$sysname"); return 0
  fi
  log "PyTorch $sysname: B=$B M=$M T=$T ($TOKENS_PER_STEP tokens/step), $STEPS steps after $WARMUP on $TORCH_DEVICE (at most ${limit} s)"
  local out="$WORK/torch-$sysname.log" trc=0
  start_poll "$WORK/smi-$sysname.txt"
  run_limited "$limit" "$WORK/torch-$sysname.pid" "$out" "$PYTHON" "$TORCH_PY" train --model "$model" --mode "$tmode" \
      --device "$TORCH_DEVICE" --B "$B" --M "$M" --T "$T" --steps "$STEPS" --warmup "$WARMUP" \
      ${LAYERS_OVERRIDE:+--layers "$LAYERS_OVERRIDE"} $TINY_FLAG || trc=$?
  stop_poll
  local js; js=$(sed -n 's/^torchbench //p' "$out" | tail -1)
  local err; err=$(sed -n 's/^torchbench_error //p' "$out" | tail -1)
  local status
  if ((trc == 124 || trc == 137)); then
    tail -5 "$out"; status="TIMED OUT after ${limit} s (BENCH_$([[ $mode == compile ]] && echo COMPILE || echo TORCH)_TIMEOUT)"
  elif ((trc != 0)) || [[ -z "$js" ]]; then
    tail -8 "$out"
    if [[ -n "$err" ]]; then
      status="FAILED ($("$PYTHON" -c 'import json,sys; j=json.loads(sys.argv[1]); print(j["kind"] + ": " + j["error"][:160])' "$err"))"
    else
      status="FAILED (exit status $trc$(grep -E 'Error' "$out" | tail -1 | cut -c1-160 | sed 's/^/: /' || true))"
    fi
  else
    local tps step_s reserved
    read -r tps step_s reserved < <("$PYTHON" -c 'import json,sys; j=json.loads(sys.argv[1]); print(j["tokens_per_s"], j["step_s"], j.get("max_reserved", 0) / 2**20)' "$js")
    local mib=0 src="none (CPU rehearsal)"
    if ((USE_SMI)); then
      mib=$(peak_mib "$WORK/smi-$sysname.txt" "$(cat "$WORK/torch-$sysname.pid" 2>/dev/null || echo 0)" "$BASE_MIB")
      src="nvidia-smi (torch max_reserved $(printf '%.0f' "$reserved") MiB)"
      [[ "$mib" != 0 ]] || { mib=$reserved; src="torch max_reserved (nvidia-smi saw nothing)"; }
    fi
    log "PyTorch $sysname: tokens/s $(printf '%.1f' "$tps"); peak device memory $mib MiB ($src); step $(printf '%.3f' "$step_s") s"
    log "  $js"
    record "$model" "$mode" OK "$tps" "$mib" "$src" "$step_s" "$js"
    return 0
  fi
  log "PyTorch $sysname: $status"
  record "$model" "$mode" "$status" 0 0 none 0
  FAILED+=("$sysname")
}

FAILED=()
declare -A L2L_STEP=() L2L_BD=()
l2l_phase() {  # l2l_phase MODEL
  local m=$1
  if [[ "$SYSTEMS" != *" l2l "* ]]; then return 0; fi
  log "l2l: $m, B=$B M=$M T=$T ($TOKENS_PER_STEP tokens/step), $STEPS steps after $WARMUP, l2l-eps + one l2l-worker on cuda:0, publish bf16 (at most ${RUN_TIMEOUT} s for the worker)"
  if run_l2l "$m-device" "$m" "$LAYERS_OVERRIDE" device "$STEPS"; then
    L2L_STEP[$m]=$L2L_STEP_S; L2L_BD[$m]=$L2L_BREAKDOWN
    record "$m" l2l OK "$L2L_TPS" "$L2L_MIB" "$L2L_MEM_SRC" "$L2L_STEP_S" \
        "{\"breakdown\": \"$L2L_BREAKDOWN\", \"device_bytes_mib\": $L2L_DEV_MIB}"
  else
    record "$m" l2l "FAILED ($L2L_ERR)" 0 0 none 0; FAILED+=("l2l $m")
  fi
}

# ---- 2. per model: eager, then l2l ---------------------------------------------------------
for m in $MODELS; do
  [[ "$SYSTEMS" != *" eager "* ]] || run_torch "$m" eager
  l2l_phase "$m"
done
# ---- 3. per model: torch.compile -----------------------------------------------------------
if [[ "$SYSTEMS" == *" compile "* ]]; then
  for m in $MODELS; do run_torch "$m" compile; done
fi

# ---- 3b. the bf16 operand reuse A/B (BENCH_REUSE_AB, default 1): the first model's l2l run
# again with L2L_CUDA_BF16_REUSE=0 (every activation operand cast by its GEMM; the same
# bits), last before the table so that a short time limit cuts it first.
REUSE_AB=${BENCH_REUSE_AB:-1}
first_model=${MODELS%% *}
if [[ "$REUSE_AB" == 1 && "$SYSTEMS" == *" l2l "* && "${L2L_CUDA_GEMM}" == bf16 && -n "${L2L_STEP[$first_model]:-}" ]]; then
  log "bf16 operand reuse A/B: $first_model again with L2L_CUDA_BF16_REUSE=0"
  if L2L_CUDA_BF16_REUSE=0 run_l2l "$first_model-noreuse" "$first_model" "$LAYERS_OVERRIDE" device "$STEPS"; then
    record "$first_model" l2l-noreuse OK "$L2L_TPS" "$L2L_MIB" "$L2L_MEM_SRC" "$L2L_STEP_S" \
        "{\"breakdown\": \"$L2L_BREAKDOWN\"}"
    log "bf16 operand reuse A/B ($first_model): step ${L2L_STEP[$first_model]} s with reuse, $L2L_STEP_S s without:" \
        "$(awk -v a="${L2L_STEP[$first_model]}" -v b="$L2L_STEP_S" 'BEGIN { if (a > 0) printf "%.3fx", b / a; else print "n/a" }') the step time"
  else
    record "$first_model" l2l-noreuse "FAILED ($L2L_ERR)" 0 0 none 0; FAILED+=("l2l $first_model reuse off")
  fi
fi

# ---- 4. 4x depth, stash: host (BENCH_DEEP=1, GPT-2 XL) -------------------------------------
DEEP_STATUS=OK
if [[ "$DEEP" != 1 ]]; then
  DEEP_STATUS="SKIPPED (set BENCH_DEEP=1; it needs ~90 GB of host RAM)"
elif [[ " $MODELS " != *" gpt2-xl "* || -z "${L2L_STEP[gpt2-xl]:-}" ]]; then
  DEEP_STATUS="SKIPPED (no successful l2l gpt2-xl run)"
else
  base_layers=${LAYERS_OVERRIDE:-$([[ "$SMOKE" == 1 ]] && echo 2 || echo 48)}
  log "4x depth: gpt2-xl stash host at 1x ($base_layers layers) and 4x ($((4 * base_layers)) layers), 2 steps after $WARMUP each"
  if ! run_l2l gpt2-xl-host gpt2-xl "$base_layers" host 2; then
    DEEP_STATUS="FAILED (1x stash host: $L2L_ERR)"
  else
    HOST1_MIB=$L2L_MIB
    if ! run_l2l gpt2-xl-4x-host gpt2-xl "$((4 * base_layers))" host 2; then
      DEEP_STATUS="FAILED (4x stash host: $L2L_ERR)"
    else
      HOST4_MIB=$L2L_MIB
      DEEP_LINE=$("$PYTHON" - "$HOST1_MIB" "$HOST4_MIB" "$SMOKE" <<'PY'
import sys
h1, h4 = map(float, sys.argv[1:3])
unit, div = ("MiB", 1) if sys.argv[3] == "1" else ("GiB", 1024)
pct = f"{100 * (h4 / h1 - 1):+.1f}%" if h1 > 0 else "n/a"
print(f"  4x depth, stash host: {h4/div:.2f} {unit} vs {h1/div:.2f} {unit} at 1x: {pct}  (target <= +10%)")
PY
)
    fi
  fi
  [[ "$DEEP_STATUS" == OK ]] || FAILED+=("4x depth")
fi

# ---- 5. the table ------------------------------------------------------------------------------
FLOPS_JSON="{"; sep=""
for m in $MODELS; do FLOPS_JSON+="$sep\"$m\": ${FLOPS[$m]}"; sep=", "; done; FLOPS_JSON+="}"
echo
"$PYTHON" - "$RESULTS" "$FLOPS_JSON" "$PEAK_TFLOPS" "$TOKENS_PER_STEP" "$B" "$M" "$T" "$GPU_NAME" "$COMPILE" \
    "$SMOKE" "${OUT_DIR:+$OUT_DIR/results.json}" "$RATES_STATUS" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
flops = json.loads(sys.argv[2])
order = {"eager": 0, "compile": 1, "l2l": 2, "l2l-noreuse": 3}
models = list(flops)
rows.sort(key=lambda r: (models.index(r["model"]) if r["model"] in models else 99, order[r["system"]]))
peak, tps_step = float(sys.argv[3]), int(sys.argv[4])
B, M, T, gpu, compile_mode, smoke, out, rates_status = sys.argv[5:13]
names = {"eager": "PyTorch eager (bf16 autocast)", "compile": f"torch.compile ({compile_mode})",
         "l2l": "l2l (EPS + worker, bf16)", "l2l-noreuse": "l2l, bf16 operand reuse off"}
print(f"bench_gpu.sh: RESULTS on {gpu}: {tps_step:,} tokens/step (B {B} x M {M} x T {T}) for every system;"
      f" bf16 matmul peak {peak:.4g} TFLOP/s ({rates_status})" + ("  [SMOKE: tiny shapes, not a benchmark]" if smoke == "1" else ""))
print(f"  {'model':<13} {'system':<30} {'tokens/s':>10} {'peak mem':>11} {'tok/s vs eager':>15} {'mem vs eager':>13} {'MFU':>7}")
verdicts = []
for r in rows:
    m, s = r["model"], r["system"]
    ok = r["status"] == "OK"
    eager = next((e for e in rows if e["model"] == m and e["system"] == "eager" and e["status"] == "OK"), None)
    mem = r["peak_mib"]
    unit = "MiB" if smoke == "1" else "GiB"
    mem_s = ("n/a" if mem <= 0 else (f"{mem:.1f} MiB" if smoke == "1" else f"{mem / 1024:.2f} GiB")) if ok else "-"
    rt = f"{r['tokens_per_s'] / eager['tokens_per_s']:.3f}" if ok and eager else "n/a"
    rm = f"{mem / eager['peak_mib']:.3f}" if ok and eager and mem > 0 and eager["peak_mib"] > 0 else "n/a"
    fpt = flops.get(m, {}).get("flops_per_token", 0)
    mfu = f"{100 * r['tokens_per_s'] * fpt / (peak * 1e12):.3g}%" if ok and peak > 0 and fpt else "n/a"
    tps = f"{r['tokens_per_s']:,.0f}" if ok else ("TIMED OUT" if r["status"].startswith("TIMED") else r["status"].split(" ")[0])
    print(f"  {m:<13} {names[s]:<30} {tps:>10} {mem_s:>11} {rt:>15} {rm:>13} {mfu:>7}")
    if not ok:
        print(f"  {'':<13} {'':<30} {r['status']}")
    if s == "l2l":
        if ok and rt != "n/a" and rm != "n/a":
            met = float(rt) >= 0.85 and float(rm) <= 0.3
            verdicts.append(f"{m}: {'MET' if met else 'MISSED'} ({rt}x tokens/s, {rm}x memory)")
        else:
            verdicts.append(f"{m}: not judged (" + ("l2l failed" if not ok else "no PyTorch eager row" if not eager
                                                    else "a peak memory figure is missing") + ")")
print("  target (l2l vs PyTorch eager: >= 0.85x tokens/s at <= 0.3x peak device memory): " +
      ("; ".join(verdicts) or "not judged (l2l not in BENCH_SYSTEMS)"))
print("  MFU = tokens/s x FLOPs/token / the bf16 matmul peak; FLOPs/token = 6 x (params a token multiplies)"
      " + 12 x layers x d x T: " + ", ".join(f"{m} {f['flops_per_token'] / 1e9:.4g} G" for m, f in flops.items()))
if out:
    with open(out, "w") as f:
        json.dump({"rows": rows, "flops": flops, "peak_tflops": peak, "tokens_per_step": tps_step,
                   "B": int(B), "M": int(M), "T": int(T), "gpu": gpu, "compile": compile_mode}, f, indent=1)
PY
for m in $MODELS; do
  [[ -z "${L2L_BD[$m]:-}" ]] || log "l2l $m time per step (worker): ${L2L_BD[$m]}"
done
if [[ "$DEEP_STATUS" == OK ]]; then echo "${DEEP_LINE:-}"; else echo "  4x depth, stash host: $DEEP_STATUS"; fi

# ---- 6. model vs measurement: l2l-bench-relay --simulate on the measured rates ----------------
SIM_STATUS="SKIPPED (no rates)"
if [[ ! -x "$BIN/l2l-bench-relay" ]]; then
  SIM_STATUS="SKIPPED ($BIN/l2l-bench-relay not built)"
elif [[ -s "$RATES" ]]; then
  shapes=$(tr ' ' ',' <<<"$MODELS" | sed 's/,*$//')
  sim_out="$WORK/simulate.txt"
  if "$BIN/l2l-bench-relay" --simulate --rates-json "$RATES" --devices 1 --sequences $((B * M)) --seq-len "$T" \
       --shapes "$shapes" > "$sim_out" 2>&1; then
    SIM_STATUS=OK
    [[ -z "$OUT_DIR" ]] || cp "$sim_out" "$OUT_DIR/simulate.txt"
    steps_json="{"; sep=""
    for m in $MODELS; do steps_json+="$sep\"$m\": ${L2L_STEP[$m]:-0}"; sep=", "; done; steps_json+="}"
    "$PYTHON" - "$sim_out" "$steps_json" "$RATES" "$SMOKE" "${LAYERS_OVERRIDE:-}" <<'PY'
import json, sys
sim = [json.loads(l[6:]) for l in open(sys.argv[1]) if l.startswith("json: ")]
measured, rates = json.loads(sys.argv[2]), json.load(open(sys.argv[3]))
def g(k):
    return f"{rates[k]:.4g}" if isinstance(rates.get(k), (int, float)) else "n/a"
note = ""
if sys.argv[4] == "1" or sys.argv[5]:
    note = "  [the model is the full preset shape; this run's shapes differ: not comparable]"
print("bench_gpu.sh: MODEL vs MEASUREMENT, one device, per-device fetch, no interleave"
      f" (l2l-bench-relay --simulate --rates-json: matmul {g('matmul_tflops')}, attention"
      f" {g('attention_tflops')} TFLOP/s, H2D {g('h2d_gbps')}, D2H {g('d2h_gbps')} GB/s (n/a: the h100 preset's);"
      f" the daemon's AdamW at the preset's 8 G params/s){note}")
for j in sim:
    if j["devices"] != 1 or j["bandwidth_centric"] or j["interleave"]:
        continue
    got = measured.get(j["model"], 0)
    meas = f"measured l2l step {got:.3f} s = {got / j['step_s']:.2f}x the model" if got > 0 else "l2l not measured"
    print(f"  {j['model']:<13} model step {j['step_s']:.3f} s (forward {j['forward_s']:.3f}, backward"
          f" {j['backward_s']:.3f}, update tail {j['update_tail_s']:.3f}) = {j['tokens_per_step'] / j['step_s']:,.0f}"
          f" tokens/s; {meas}")
PY
  else
    SIM_STATUS="FAILED ($(tail -1 "$sim_out"))"
  fi
fi
[[ "$SIM_STATUS" == OK ]] || log "model vs measurement: $SIM_STATUS"

log "done in ${SECONDS} s (BENCH_TOTAL_TIMEOUT $TOTAL_TIMEOUT): rates $RATES_STATUS; 4x depth $DEEP_STATUS; failed: ${FAILED[*]:-none}"
((${#FAILED[@]} == 0)) || die "${FAILED[*]} (the figures measured are above)"
