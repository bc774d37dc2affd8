#!/usr/bin/env bash
# GPU benchmark: l2l with one worker on cuda:0 against PyTorch training the
# same model entirely on the same GPU (bf16 autocast, fused AdamW, scaled-dot-product
# attention), GPT-2 XL shapes (1.56B parameters), same tokens per step. Prints:
#   * tokens/s of each and the ratio l2l / PyTorch        (target >= 0.85 at >= 16k tokens/step)
#   * peak device memory of each and the ratio            (target <= 0.3)
#   * l2l's time breakdown per step as the worker reports it (compute, waiting on the
#     EPS for a layer, waiting to push a gradient).
#   * with BENCH_DEEP=1: l2l's peak device memory at 4x the depth, stash: host, against
#     1x with stash: host                                 (target <= +10%)
# A benchmark: it never fails on speed, only on errors.
#
# Order, so that one failure loses as little as possible: (0) before anything runs, the
# cuBLASLt lookup and an ldd check of bin/* (fails at once naming the missing
# libraries); (1) the l2l 1x run (stash: device); (2) PyTorch (a failure, e.g. no torch
# or out of memory, is reported as "PyTorch: FAILED (...)" and its ratios print n/a);
# (3) the 1x summary (tokens/s, memory, breakdown) is printed; (4) only with BENCH_DEEP=1,
# the 1x and 4x-depth stash: host runs (the 4x one needs ~90 GB of host RAM for the EPS).
# Every failure is reported where it happens and in the last line; the exit status is
# then non-zero, but the figures already measured stay printed.
#
# Run on the GPU machine from an unpacked bundle (scripts/bundle.sh puts this script in
# l2l/src/scripts/) or from a CUDA build tree:
#   bash bench_gpu.sh [L2L_ROOT]        # L2L_ROOT holds bin/ (default: the bundle root)
# Environment: BENCH_B (micro-batch sequences, 8), BENCH_M (micro-batches per step, 2),
#   BENCH_T (1024), BENCH_STEPS (timed steps, 5), BENCH_WARMUP (2), BENCH_MODEL_LAYERS
#   (48), BENCH_DEEP=1 (also run the 1x and 4x-depth stash: host runs; default 0, 1 in
#   smoke mode; BENCH_SKIP_DEEP=1 still forces it off), BENCH_SKIP_TORCH=1 (no PyTorch
#   run: its figures and ratios print n/a), BENCH_RUN_TIMEOUT (seconds for each
#   l2l-worker run, 240), BENCH_TORCH_TIMEOUT (seconds for the PyTorch run, default
#   BENCH_RUN_TIMEOUT), BENCH_EPS_START_TIMEOUT (seconds for l2l-eps to listen, 300),
#   BENCH_TOTAL_TIMEOUT (seconds for the whole script, 540, 0 = none: each run's time
#   limit is cut to what is left, and a run with under 20 s left is skipped, so the
#   script ends, daemons stopped, inside a 10-minute command), PYTHON (python3),
#   L2L_CUBLAS_DIR (as gpu_check.sh), BENCH_N_EMBD / BENCH_N_HEAD / BENCH_VOCAB
#   (override the GPT-2 XL width, heads and vocabulary of the l2l model; d_ff is
#   4 x n_embd and the model's seq_len is T), BENCH_KEEP_WORK=1 (keep the temp folder
#   with the job YAMLs and the EPS/worker logs).
# A run past its time limit is killed (SIGTERM, SIGKILL 15 s later) and reported as
# "TIMED OUT after N s"; its l2l-eps is stopped without a checkpoint (SIGKILL if
# `l2lctl stop` does not end it, then its /dev/shm segments are removed).
# BENCH_SMOKE=1: a smoke test of the l2l side for the CUDA emulator (docs/gpu.md) or a
#   quick look on the GPU: tiny defaults (2 layers, n_embd 64, 2 heads, vocabulary 256,
#   T 64, B 2, M 2, 2 warm-up + 2 timed steps; any BENCH_* above still overrides them),
#   no PyTorch run, no cuBLASLt lookup and no nvidia-smi polling (all said so in the
#   output; memory figures are the worker's own device_bytes), everything else for
#   real: it fails when l2l fails or prints no parseable progress line.
#
# STATUS: written without a GPU. The PyTorch side is self-contained; the l2l side drives
# l2l-eps/l2l-worker through their documented CLIs and progress lines. Neither has been
# run on a GPU yet: see docs/gpu.md.
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
PYTHON=${PYTHON:-python3}
# l2l's GEMMs in bf16 with fp32 accumulation (docs/gpu.md, "bf16 GEMM mode"), the
# closest to PyTorch's bf16 autocast; set L2L_CUDA_GEMM=fp32|tf32 to compare.
export L2L_CUDA_GEMM=${L2L_CUDA_GEMM:-bf16}
SMOKE=${BENCH_SMOKE:-0}
if [[ "$SMOKE" == 1 ]]; then
  B=${BENCH_B:-2}; M=${BENCH_M:-2}; T=${BENCH_T:-64}
  STEPS=${BENCH_STEPS:-2}; WARMUP=${BENCH_WARMUP:-2}; LAYERS=${BENCH_MODEL_LAYERS:-2}
  N_EMBD=${BENCH_N_EMBD:-64}; N_HEAD=${BENCH_N_HEAD:-2}; VOCAB=${BENCH_VOCAB:-256}
  DATA_TOKENS=65536; DEEP=${BENCH_DEEP:-1}
  log "SMOKE mode: tiny l2l model; the PyTorch run, the cuBLASLt lookup and nvidia-smi memory polling are SKIPPED"
else
  B=${BENCH_B:-8}; M=${BENCH_M:-2}; T=${BENCH_T:-1024}
  STEPS=${BENCH_STEPS:-5}; WARMUP=${BENCH_WARMUP:-2}; LAYERS=${BENCH_MODEL_LAYERS:-48}
  N_EMBD=${BENCH_N_EMBD:-}; N_HEAD=${BENCH_N_HEAD:-}; VOCAB=${BENCH_VOCAB:-}
  DATA_TOKENS=4000000; DEEP=${BENCH_DEEP:-0}
fi
[[ "${BENCH_SKIP_DEEP:-0}" != 1 ]] || DEEP=0
SKIP_TORCH=${BENCH_SKIP_TORCH:-0}
RUN_TIMEOUT=${BENCH_RUN_TIMEOUT:-240}
TORCH_TIMEOUT=${BENCH_TORCH_TIMEOUT:-$RUN_TIMEOUT}
EPS_START_TIMEOUT=${BENCH_EPS_START_TIMEOUT:-300}
TOTAL_TIMEOUT=${BENCH_TOTAL_TIMEOUT:-540}
((STEPS >= 1 && WARMUP >= 0 && LAYERS >= 1)) || die "BENCH_STEPS must be >= 1, BENCH_WARMUP >= 0, BENCH_MODEL_LAYERS >= 1"
for v in RUN_TIMEOUT TORCH_TIMEOUT EPS_START_TIMEOUT; do
  [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "BENCH_$v must be a positive number of seconds, not '${!v}'"
done
[[ "$TOTAL_TIMEOUT" =~ ^[0-9]+$ ]] || die "BENCH_TOTAL_TIMEOUT must be a number of seconds (0: none), not '$TOTAL_TIMEOUT'"
TOKENS_PER_STEP=$((B * M * T))
# Model lines beside `preset: gpt2-xl` in the job YAML (overrides of the preset's shape).
MODEL_OVERRIDES=""
[[ -z "$N_EMBD" ]] || MODEL_OVERRIDES+="  d_model: $N_EMBD"$'\n'"  d_ff: $((4 * N_EMBD))"$'\n'"  seq_len: $T"$'\n'
[[ -z "$N_HEAD" ]] || MODEL_OVERRIDES+="  n_head: $N_HEAD"$'\n'
[[ -z "$VOCAB" ]] || MODEL_OVERRIDES+="  vocab_size: $VOCAB"$'\n'

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
log "l2l GEMMs: L2L_CUDA_GEMM=$L2L_CUDA_GEMM"

WORK=$(mktemp -d /tmp/l2l-bench-gpu.XXXXXX)
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
cleanup() {
  stop_poll
  abort_eps
  local p
  for p in ${pids[@]+"${pids[@]}"}; do kill "$p" 2>/dev/null || true; done
  if [[ "${BENCH_KEEP_WORK:-0}" == 1 ]]; then echo "bench_gpu.sh: kept $WORK (BENCH_KEEP_WORK=1)"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

# limit_for NOMINAL: the time limit for the next run, NOMINAL cut to what
# BENCH_TOTAL_TIMEOUT leaves (minus 30 s to stop daemons); 0 when under 20 s are left.
limit_for() {
  if ((TOTAL_TIMEOUT == 0)); then echo "$1"; return; fi
  local left=$((TOTAL_TIMEOUT - SECONDS - 30))
  if ((left < 20)); then echo 0; elif ((left < $1)); then echo "$left"; else echo "$1"; fi
}

# ---- GPU memory polling: per-process peak (MiB) from nvidia-smi ----------------------
POLL_PID=""
start_poll() {  # start_poll FILE (smoke mode: no polling, POLL_PID empty)
  POLL_PID=""
  [[ "$SMOKE" == 1 ]] && return 0
  ( while true; do
      nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null | sed "s/^/$(date +%s) /"
      echo "$(date +%s) total,$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0)"
      sleep 0.2
    done ) > "$1" &
  POLL_PID=$!; pids+=("$POLL_PID")
}
peak_mib() {  # peak_mib FILE PID BASE_MIB: the PID's peak, else total peak minus the idle base
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
if [[ "$SMOKE" == 1 ]]; then
  BASE_MIB=0
else
  command -v nvidia-smi >/dev/null || die "nvidia-smi not found (BENCH_SMOKE=1 runs without it)"
  BASE_MIB=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 | head -1)
  [[ "$BASE_MIB" =~ ^[0-9]+$ ]] || die "nvidia-smi gave no memory.used for GPU 0 ('$BASE_MIB')"
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

# ---- l2l ---------------------------------------------------------------------------------
# `preset: gpt2-xl` is looked up in $L2L_CONFIG_DIR/models (common/config.h): the bundle's
# src/configs, or the source tree's configs.
CFGS=""
for c in "$ROOT/src/configs" "$HERE/../configs"; do [[ -d "$c/models" ]] && { CFGS=$(cd "$c" && pwd); break; }; done
[[ -n "$CFGS" ]] || die "no configs/models folder (looked in $ROOT/src/configs and $HERE/../configs)"
export L2L_CONFIG_DIR="$CFGS"

"$PYTHON" - "$WORK/train.bin" "$DATA_TOKENS" "${VOCAB:-50257}" <<'PY' || die "could not write the tokens file with $PYTHON"
# A random llm.c tokens file (common/formats/tokens_file.h): 256-int32 header, uint16 tokens.
import array, random, sys
n, vocab = int(sys.argv[2]), int(sys.argv[3])
hdr = array.array("i", [20240520, 1, n] + [0] * 253)
rnd = random.Random(0)
tok = array.array("H", (rnd.randrange(vocab) for _ in range(n)))
with open(sys.argv[1], "wb") as f:
    hdr.tofile(f); tok.tofile(f)
PY
# run_fail NAME MSG: reports a failed l2l run (and stops its daemon); the caller returns 1.
run_fail() {
  L2L_ERR="$2"
  echo "bench_gpu.sh: FAILED: l2l $1: $2" >&2
  stop_poll
  abort_eps
}

run_l2l() {  # run_l2l NAME LAYERS STASH STEPS -> 0 and L2L_TPS, L2L_MIB, L2L_BREAKDOWN, L2L_DEV_MIB; or 1 and L2L_ERR
  local name=$1 layers=$2 stash=$3 steps=$4
  local dir="$WORK/$name"; mkdir -p "$dir/eps"
  local total=$((steps + WARMUP))
  L2L_ERR=""
  local limit; limit=$(limit_for "$RUN_TIMEOUT")
  if ((limit == 0)); then
    run_fail "$name" "not run: under 20 s of BENCH_TOTAL_TIMEOUT=${TOTAL_TIMEOUT} s left after ${SECONDS} s elapsed and 30 s kept for stopping daemons"; return 1
  fi
  {
    echo "model:"
    echo "  preset: gpt2-xl"
    echo "  n_layer: $layers"
    printf '%s' "$MODEL_OVERRIDES"
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
  train_path: $WORK/train.bin
publish_dtype: bf16
YAML
  } > "$dir/job.yaml"
  EPS_JOB="bench$$$name"; EPS_NAME=$name
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
  local port; port=$(cat "$dir/eps/eps.port")
  limit=$(limit_for "$RUN_TIMEOUT")
  ((limit > 0)) || { run_fail "$name" "not run: BENCH_TOTAL_TIMEOUT=${TOTAL_TIMEOUT} s nearly spent after ${SECONDS} s"; return 1; }
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
    run_fail "$name" "l2l-worker exited with status $wrc (log above)"; return 1
  fi
  # Stop the daemon without its final checkpoint (a killed l2l-eps writes one on the way
  # out: the whole fp32 master + AdamW state, 19 GB at GPT-2 XL, 4x that at 4x depth).
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
  local dev_bytes; dev_bytes=$(sed -n 's/.* device_bytes=\([0-9]*\).*/\1/p' <<<"$done_line")
  [[ -n "$dev_bytes" ]] || { run_fail "$name" "l2l-worker: no device_bytes= in '$done_line'"; return 1; }
  L2L_DEV_MIB=$(awk -v b="$dev_bytes" 'BEGIN { printf "%.2f", b / 1048576 }')
  local mem_note=" (worker device_bytes; nvidia-smi SKIPPED)"
  if [[ "$SMOKE" != 1 ]]; then
    L2L_MIB=$(peak_mib "$dir/smi.txt" "$wpid" "$BASE_MIB"); mem_note=" (nvidia-smi; the worker's device_bytes: $L2L_DEV_MIB MiB)"
    if [[ "$L2L_MIB" == 0 ]]; then
      L2L_MIB=$L2L_DEV_MIB; mem_note=" (worker device_bytes: nvidia-smi saw no memory in use above the idle ${BASE_MIB} MiB)"
    fi
  else
    L2L_MIB=$L2L_DEV_MIB
  fi
  # Progress lines: "step 12/100 loss 4.12 tok/s 5321 step_s 0.77 wait_layer 0.01 wait_push 0.00 ..."
  # (log_every 1: one per step; the first WARMUP are left out).
  read -r L2L_TPS L2L_BREAKDOWN < <(awk -v skip="$WARMUP" '
    $1 == "step" && $2 ~ /^[0-9]+\/[0-9]+$/ { n++; if (n <= skip) next
      delete v; for (i = 2; i < NF; i++) v[$i] = $(i + 1)
      if (!("tok/s" in v) || !("step_s" in v) || !("wait_layer" in v) || !("wait_push" in v)) { bad = 1; next }
      tps += v["tok/s"]; st += v["step_s"]; wl += v["wait_layer"]; wp += v["wait_push"]; k++ }
    END { if (k == 0 || bad) { print "0 none"; exit }
          printf "%.1f step_s=%.3f compute~%.3f wait_layer(EPS/H2D)=%.3f wait_push(D2H/EPS)=%.3f\n",
                 tps / k, st / k, (st - wl - wp) / k, wl / k, wp / k }' "$dir/worker.log")
  if [[ "$L2L_BREAKDOWN" == none ]]; then
    tail -20 "$dir/worker.log"
    run_fail "$name" "no parseable progress line after the $WARMUP warm-up steps"; return 1
  fi
  log "l2l $name: tokens/s $L2L_TPS; peak device memory ${L2L_MIB} MiB$mem_note; per step: $L2L_BREAKDOWN"
  log "  $(sed -n 's/.*\(backend cuda:0 .*\), stash.*/\1/p' "$dir/worker.log" | head -1 | grep . || echo "worker backend line not found")"
  log "  $done_line"
}

MODEL_DESC="GPT-2 XL shapes"
[[ -z "$MODEL_OVERRIDES" ]] || MODEL_DESC="gpt2-xl preset with n_embd ${N_EMBD:-1600} n_head ${N_HEAD:-25} vocab ${VOCAB:-50257}"
FAILED=()

# ---- 1. l2l at 1x depth, stash: device ------------------------------------------------------
log "l2l: $MODEL_DESC, $LAYERS layers, B=$B M=$M T=$T ($TOKENS_PER_STEP tokens/step), $STEPS steps after $WARMUP, one worker on cuda:0 (at most ${RUN_TIMEOUT} s per run)"
XL_STATUS=OK; XL_TPS=0; XL_MIB=0; XL_BREAKDOWN=""
if run_l2l xl-device "$LAYERS" device "$STEPS"; then
  XL_TPS=$L2L_TPS; XL_MIB=$L2L_MIB; XL_BREAKDOWN=$L2L_BREAKDOWN
else
  XL_STATUS="FAILED ($L2L_ERR)"; FAILED+=("l2l 1x")
fi

# ---- 2. PyTorch --------------------------------------------------------------------------
cat > "$WORK/torch_gpt.py" <<'PY'
# GPT-2 trained entirely on the GPU the usual way: bf16 autocast, fused AdamW, flash SDPA.
import json, sys, time
import torch, torch.nn as nn, torch.nn.functional as F
B, M, T, steps, warmup, layers, V, C, NH = map(int, sys.argv[1:10])
FF = 4 * C

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.c_attn, self.attn_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.c_fc, self.mlp_proj = nn.Linear(C, FF), nn.Linear(FF, C)
    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (z.view(b, t, NH, C // NH).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).reshape(b, t, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.h = nn.ModuleList(Block() for _ in range(layers))
        self.ln_f = nn.LayerNorm(C)
    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.h:
            x = blk(x)
        logits = self.ln_f(x) @ self.wte.weight.T  # tied head
        return F.cross_entropy(logits.float().view(-1, V), targets.reshape(-1))

torch.manual_seed(0)
model = GPT().cuda()
params = sum(p.numel() for p in model.parameters())
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=True)
data = torch.randint(0, V, (M, B, T + 1), device="cuda")

def step():
    for u in range(M):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(data[u, :, :-1], data[u, :, 1:]) / M
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item() * M

for _ in range(warmup):
    step()
torch.cuda.synchronize()
torch.cuda.reset_peak_memory_stats()
t0 = time.perf_counter()
for _ in range(steps):
    loss = step()
torch.cuda.synchronize()
dt = time.perf_counter() - t0
print("torchbench " + json.dumps({
    "params": params, "tokens_per_s": B * M * T * steps / dt, "loss": loss,
    "max_allocated": torch.cuda.max_memory_allocated(), "max_reserved": torch.cuda.max_memory_reserved()}))
PY
TORCH_TPS=0; TORCH_MIB=0
if [[ "$SMOKE" == 1 ]]; then
  TORCH_STATUS="SKIPPED (smoke mode)"
elif [[ "$SKIP_TORCH" == 1 ]]; then
  TORCH_STATUS="SKIPPED (BENCH_SKIP_TORCH=1)"
else
  TORCH_STATUS=OK
  limit=$(limit_for "$TORCH_TIMEOUT")
  if ((limit == 0)); then
    TORCH_STATUS="FAILED (not run: under 20 s of BENCH_TOTAL_TIMEOUT=${TOTAL_TIMEOUT} s left after ${SECONDS} s)"
  else
    log "PyTorch: GPT-2 XL shapes ($LAYERS layers), B=$B M=$M T=$T ($TOKENS_PER_STEP tokens/step), $STEPS steps after $WARMUP (at most ${limit} s)"
    start_poll "$WORK/smi_torch.txt"
    trc=0
    run_limited "$limit" "$WORK/torch.pid" "$WORK/torch.out" "$PYTHON" "$WORK/torch_gpt.py" "$B" "$M" "$T" \
        "$STEPS" "$WARMUP" "$LAYERS" "${VOCAB:-50257}" "${N_EMBD:-1600}" "${N_HEAD:-25}" || trc=$?
    stop_poll
    TORCH_JSON=$(sed -n 's/^torchbench //p' "$WORK/torch.out" | tail -1)
    if ((trc == 124 || trc == 137)); then
      tail -20 "$WORK/torch.out"
      TORCH_STATUS="FAILED (TIMED OUT after ${limit} s: BENCH_TORCH_TIMEOUT=$TORCH_TIMEOUT)"
    elif ((trc != 0)); then
      tail -20 "$WORK/torch.out"
      why=$(grep -E 'Error|error' "$WORK/torch.out" | tail -1 | cut -c1-200 || true)
      TORCH_STATUS="FAILED (exit status $trc${why:+: $why})"
    elif [[ -z "$TORCH_JSON" ]]; then
      tail -20 "$WORK/torch.out"
      TORCH_STATUS="FAILED (no torchbench line in its output)"
    else
      TORCH_TPS=$("$PYTHON" -c 'import json,sys;print(json.loads(sys.argv[1])["tokens_per_s"])' "$TORCH_JSON")
      TORCH_MIB=$(peak_mib "$WORK/smi_torch.txt" "$(cat "$WORK/torch.pid" 2>/dev/null || echo 0)" "$BASE_MIB")
      log "PyTorch: $TORCH_JSON; nvidia-smi peak ${TORCH_MIB} MiB"
    fi
  fi
  [[ "$TORCH_STATUS" == OK ]] || FAILED+=("PyTorch")
fi
log "PyTorch: $TORCH_STATUS"

# ---- 3. the 1x summary, printed before the (riskier) deep runs ----------------------------
"$PYTHON" - "$XL_TPS" "$TORCH_TPS" "$XL_MIB" "$TORCH_MIB" "$TOKENS_PER_STEP" "$SMOKE" "$MODEL_DESC" \
    "$XL_STATUS" "$TORCH_STATUS" <<'PY'
import sys
l2l_tps, torch_tps, l2l_mib, torch_mib, tps_step = map(float, sys.argv[1:6])
smoke, desc, l2l_st, torch_st = sys.argv[6] == "1", sys.argv[7], sys.argv[8], sys.argv[9]
l2l_ok, torch_ok = l2l_st == "OK", torch_st == "OK"
def ratio(a, b): return f"{a / b:.3f}" if l2l_ok and torch_ok and b > 0 else "n/a"
torch_word = torch_st.split(" ")[0]  # SKIPPED / FAILED (the reason is on the line above)
print(f"bench_gpu.sh: {desc}, {int(tps_step)} tokens/step, one GPU" + (" (SMOKE: no PyTorch, no nvidia-smi)" if smoke else ""))
l2l_t = f"{l2l_tps:,.0f}" if l2l_ok else "FAILED"
if smoke:
    l2l_m = f"{l2l_mib:.2f} MiB (worker device_bytes)" if l2l_ok else "FAILED"
    print(f"  tokens/s      l2l {l2l_t}   PyTorch SKIPPED")
    print(f"  peak memory   l2l {l2l_m}   PyTorch SKIPPED")
else:
    l2l_m = f"{l2l_mib/1024:.2f} GiB" if l2l_ok else "FAILED"
    torch_t = f"{torch_tps:,.0f}" if torch_ok else torch_word
    torch_m = f"{torch_mib/1024:.2f} GiB" if torch_ok else torch_word
    print(f"  tokens/s      l2l {l2l_t}   PyTorch {torch_t}   ratio {ratio(l2l_tps, torch_tps)}  (target >= 0.85)")
    print(f"  peak memory   l2l {l2l_m}   PyTorch {torch_m}   ratio {ratio(l2l_mib, torch_mib)}  (target <= 0.3)")
PY
if [[ "$XL_STATUS" == OK ]]; then
  log "l2l time breakdown per step (1x, stash device): $XL_BREAKDOWN"
  log "note: exposed H2D/D2H are not separated until the CUDA relay reports them"
else
  log "l2l 1x: $XL_STATUS"
fi

# ---- 4. 4x depth, stash: host (BENCH_DEEP=1) -------------------------------------------------
DEEP_STATUS=OK
if [[ "$DEEP" != 1 ]]; then
  DEEP_STATUS="SKIPPED (set BENCH_DEEP=1; it needs ~90 GB of host RAM)"
elif [[ "$XL_STATUS" != OK ]]; then
  DEEP_STATUS="SKIPPED (the 1x run failed)"
else
  log "4x depth: stash host at 1x ($LAYERS layers) and 4x ($((4 * LAYERS)) layers), 2 steps after $WARMUP each"
  if ! run_l2l xl-host "$LAYERS" host 2; then
    DEEP_STATUS="FAILED (1x stash host: $L2L_ERR)"
  else
    HOST1_MIB=$L2L_MIB
    if ! run_l2l xl-4x-host "$((4 * LAYERS))" host 2; then
      DEEP_STATUS="FAILED (4x stash host: $L2L_ERR)"
    else
      HOST4_MIB=$L2L_MIB
      "$PYTHON" - "$HOST1_MIB" "$HOST4_MIB" "$SMOKE" <<'PY'
import sys
h1, h4 = map(float, sys.argv[1:3])
unit, div = ("MiB", 1) if sys.argv[3] == "1" else ("GiB", 1024)
pct = f"{100 * (h4 / h1 - 1):+.1f}%" if h1 > 0 else "n/a"
print(f"  4x depth, stash host: {h4/div:.2f} {unit} vs {h1/div:.2f} {unit} at 1x: {pct}  (target <= +10%)")
PY
    fi
  fi
  [[ "$DEEP_STATUS" == OK ]] || FAILED+=("4x depth")
fi
[[ "$DEEP_STATUS" == OK ]] || echo "  4x depth, stash host: $DEEP_STATUS"

log "done in ${SECONDS} s: l2l 1x $XL_STATUS; PyTorch $TORCH_STATUS; 4x depth $DEEP_STATUS"
((${#FAILED[@]} == 0)) || die "${FAILED[*]} (figures measured before are above)"
