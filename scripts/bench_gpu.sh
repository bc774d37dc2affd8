#!/usr/bin/env bash
# GPU benchmark (issue 5): l2l with one worker on cuda:0 against PyTorch training the
# same model entirely on the same GPU (bf16 autocast, fused AdamW, scaled-dot-product
# attention), GPT-2 XL shapes (1.56B parameters), same tokens per step. Prints:
#   * tokens/s of each and the ratio l2l / PyTorch        (target >= 0.85 at >= 16k tokens/step)
#   * peak device memory of each and the ratio            (target <= 0.3)
#   * l2l's peak device memory at 4x the depth, stash: host, against 1x with stash: host
#                                                         (target <= +10%)
#   * l2l's time breakdown per step as the worker reports it (compute, waiting on the
#     EPS for a layer, waiting to push a gradient).
# A benchmark: it never fails on speed, only on errors.
#
# Run on the GPU machine from an unpacked bundle (scripts/bundle.sh puts this script in
# l2l/src/scripts/) or from a CUDA build tree:
#   bash bench_gpu.sh [L2L_ROOT]        # L2L_ROOT holds bin/ (default: the bundle root)
# Environment: BENCH_B (micro-batch sequences, 8), BENCH_M (micro-batches per step, 2),
#   BENCH_T (1024), BENCH_STEPS (timed steps, 5), BENCH_WARMUP (2), BENCH_MODEL_LAYERS
#   (48), BENCH_SKIP_DEEP=1 (skip the 4x-depth run: it needs ~90 GB of host RAM for the
#   EPS), PYTHON (python3), L2L_CUBLAS_DIR (as gpu_check.sh), BENCH_N_EMBD / BENCH_N_HEAD /
#   BENCH_VOCAB (override the GPT-2 XL width, heads and vocabulary of the l2l model; d_ff
#   is 4 x n_embd and the model's seq_len is T), BENCH_KEEP_WORK=1 (keep the temp folder
#   with the job YAMLs and the EPS/worker logs).
# BENCH_SMOKE=1: a smoke test of the l2l side for the CUDA emulator (docs/gpu.md) or a
#   quick look on the GPU: tiny defaults (2 layers, n_embd 64, 2 heads, vocabulary 256,
#   T 64, B 2, M 2, 2 warm-up + 2 timed steps; any BENCH_* above still overrides them),
#   no PyTorch run and no nvidia-smi polling (both said so in the output; memory figures
#   are the worker's own device_bytes), everything else for real: it fails when l2l
#   fails or prints no parseable progress line.
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
PYTHON=${PYTHON:-python3}
SMOKE=${BENCH_SMOKE:-0}
if [[ "$SMOKE" == 1 ]]; then
  B=${BENCH_B:-2}; M=${BENCH_M:-2}; T=${BENCH_T:-64}
  STEPS=${BENCH_STEPS:-2}; WARMUP=${BENCH_WARMUP:-2}; LAYERS=${BENCH_MODEL_LAYERS:-2}
  N_EMBD=${BENCH_N_EMBD:-64}; N_HEAD=${BENCH_N_HEAD:-2}; VOCAB=${BENCH_VOCAB:-256}
  DATA_TOKENS=65536
  log "SMOKE mode: tiny l2l model; the PyTorch run and nvidia-smi memory polling are SKIPPED"
else
  B=${BENCH_B:-8}; M=${BENCH_M:-2}; T=${BENCH_T:-1024}
  STEPS=${BENCH_STEPS:-5}; WARMUP=${BENCH_WARMUP:-2}; LAYERS=${BENCH_MODEL_LAYERS:-48}
  N_EMBD=${BENCH_N_EMBD:-}; N_HEAD=${BENCH_N_HEAD:-}; VOCAB=${BENCH_VOCAB:-}
  DATA_TOKENS=4000000
fi
((STEPS >= 1 && WARMUP >= 0 && LAYERS >= 1)) || die "BENCH_STEPS must be >= 1, BENCH_WARMUP >= 0, BENCH_MODEL_LAYERS >= 1"
TOKENS_PER_STEP=$((B * M * T))
# Model lines beside `preset: gpt2-xl` in the job YAML (overrides of the preset's shape).
MODEL_OVERRIDES=""
[[ -z "$N_EMBD" ]] || MODEL_OVERRIDES+="  d_model: $N_EMBD"$'\n'"  d_ff: $((4 * N_EMBD))"$'\n'"  seq_len: $T"$'\n'
[[ -z "$N_HEAD" ]] || MODEL_OVERRIDES+="  n_head: $N_HEAD"$'\n'
[[ -z "$VOCAB" ]] || MODEL_OVERRIDES+="  vocab_size: $VOCAB"$'\n'

# Libraries: the bundle's lib/ and cuBLASLt from the CUDA toolkit or PyTorch's wheels.
if [[ -d "$ROOT/lib" ]]; then export LD_LIBRARY_PATH="$ROOT/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
for d in ${L2L_CUBLAS_DIR:-} /usr/local/cuda/lib64 $("$PYTHON" -c 'import glob,site;print(" ".join(glob.glob(site.getsitepackages()[0]+"/nvidia/*/lib")))' 2>/dev/null); do
  [[ -e "$d/libcublasLt.so.13" ]] && { export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"; break; }
done

WORK=$(mktemp -d /tmp/l2l-bench-gpu.XXXXXX)
pids=()
EPS_LIVE=""   # state dir of the l2l-eps running now: on an early exit it is stopped without
              # its final checkpoint (SIGTERM alone would write one: ~19 GB at GPT-2 XL)
cleanup() {
  [[ -z "$EPS_LIVE" ]] || "$BIN/l2lctl" --state-dir "$EPS_LIVE" stop --abort-step --skip-checkpoint --wait 30 \
      >/dev/null 2>&1 || true
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  if [[ "${BENCH_KEEP_WORK:-0}" == 1 ]]; then echo "bench_gpu.sh: kept $WORK (BENCH_KEEP_WORK=1)"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

# ---- GPU memory polling: per-process peak (MiB) from nvidia-smi ----------------------
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
stop_poll() { [[ -z "${POLL_PID:-}" ]] || kill "$POLL_PID" 2>/dev/null || true; }
if [[ "$SMOKE" == 1 ]]; then
  BASE_MIB=0
else
  command -v nvidia-smi >/dev/null || die "nvidia-smi not found (BENCH_SMOKE=1 runs without it)"
  BASE_MIB=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 | head -1)
  [[ "$BASE_MIB" =~ ^[0-9]+$ ]] || die "nvidia-smi gave no memory.used for GPU 0 ('$BASE_MIB')"
fi

# ---- PyTorch -----------------------------------------------------------------------------
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
        return F.cross_entropy(logits.float().view(-1, V), targets.view(-1))

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
if [[ "$SMOKE" == 1 ]]; then
  log "PyTorch: SKIPPED (smoke mode)"
  TORCH_TPS=0; TORCH_MIB=0
else
  log "PyTorch: GPT-2 XL shapes ($LAYERS layers), B=$B M=$M T=$T ($TOKENS_PER_STEP tokens/step), $STEPS steps after $WARMUP"
  start_poll "$WORK/smi_torch.txt"
  "$PYTHON" "$WORK/torch_gpt.py" "$B" "$M" "$T" "$STEPS" "$WARMUP" "$LAYERS" \
      "${VOCAB:-50257}" "${N_EMBD:-1600}" "${N_HEAD:-25}" > "$WORK/torch.out" 2>&1 &
  TPID=$!; pids+=("$TPID")
  wait "$TPID" || { cat "$WORK/torch.out"; die "the PyTorch run failed"; }
  stop_poll
  TORCH_JSON=$(sed -n 's/^torchbench //p' "$WORK/torch.out" | tail -1)
  [[ -n "$TORCH_JSON" ]] || { cat "$WORK/torch.out"; die "the PyTorch run printed no torchbench line"; }
  TORCH_TPS=$("$PYTHON" -c 'import json,sys;print(json.loads(sys.argv[1])["tokens_per_s"])' "$TORCH_JSON")
  TORCH_MIB=$(peak_mib "$WORK/smi_torch.txt" "$TPID" "$BASE_MIB")
  log "PyTorch: $TORCH_JSON; nvidia-smi peak ${TORCH_MIB} MiB"
fi

# ---- l2l ---------------------------------------------------------------------------------
# `preset: gpt2-xl` is looked up in $L2L_CONFIG_DIR/models (common/config.h): the bundle's
# src/configs, or the source tree's configs.
CFGS=""
for c in "$ROOT/src/configs" "$HERE/../configs"; do [[ -d "$c/models" ]] && { CFGS=$(cd "$c" && pwd); break; }; done
[[ -n "$CFGS" ]] || die "no configs/models folder (looked in $ROOT/src/configs and $HERE/../configs)"
export L2L_CONFIG_DIR="$CFGS"

"$PYTHON" - "$WORK/train.bin" "$DATA_TOKENS" "${VOCAB:-50257}" <<'PY' || die "could not write the tokens file with $PYTHON"
# A random llm.c tokens file (common/tokens_file.h): 256-int32 header, uint16 tokens.
import array, random, sys
n, vocab = int(sys.argv[2]), int(sys.argv[3])
hdr = array.array("i", [20240520, 1, n] + [0] * 253)
rnd = random.Random(0)
tok = array.array("H", (rnd.randrange(vocab) for _ in range(n)))
with open(sys.argv[1], "wb") as f:
    hdr.tofile(f); tok.tofile(f)
PY

run_l2l() {  # run_l2l NAME LAYERS STASH STEPS -> sets L2L_TPS, L2L_MIB, L2L_BREAKDOWN, L2L_DEV_MIB
  local name=$1 layers=$2 stash=$3 steps=$4
  local dir="$WORK/$name"; mkdir -p "$dir/eps"
  local total=$((steps + WARMUP))
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
  "$BIN/l2l-eps" --job "$dir/job.yaml" --state-dir "$dir/eps" --workers 1 --job-id "bench$$$name" \
      > "$dir/eps.log" 2>&1 &
  local eps_pid=$!; pids+=("$eps_pid"); EPS_LIVE="$dir/eps"
  for _ in $(seq 1 600); do [[ -s "$dir/eps/eps.port" ]] && break; kill -0 "$eps_pid" 2>/dev/null || break; sleep 0.5; done
  [[ -s "$dir/eps/eps.port" ]] || { cat "$dir/job.yaml" "$dir/eps.log"; die "l2l-eps ($name) did not start"; }
  local port; port=$(cat "$dir/eps/eps.port")
  start_poll "$dir/smi.txt"
  "$BIN/l2l-worker" --eps "127.0.0.1:$port" --device cuda:0 > "$dir/worker.log" 2>&1 &
  local wpid=$!; pids+=("$wpid")
  wait "$wpid" || { tail -20 "$dir/worker.log"; tail -20 "$dir/eps.log"; die "l2l-worker ($name) failed"; }
  stop_poll
  # Stop the daemon without its final checkpoint (a killed l2l-eps writes one on the way
  # out: the whole fp32 master + AdamW state, 19 GB at GPT-2 XL, 4x that at 4x depth).
  "$BIN/l2lctl" --state-dir "$dir/eps" stop --skip-checkpoint --wait 120 > "$dir/stop.log" 2>&1 ||
    { cat "$dir/stop.log"; tail -20 "$dir/eps.log"; die "l2lctl stop ($name) failed"; }
  local eps_rc=0; wait "$eps_pid" || eps_rc=$?
  EPS_LIVE=""
  ((eps_rc == 0)) || { tail -20 "$dir/eps.log"; die "l2l-eps ($name) exited with status $eps_rc"; }
  [[ ! -d "$dir/eps/checkpoints" ]] || log "  warning: l2l-eps ($name) wrote a checkpoint: $(du -sh "$dir/eps/checkpoints" | cut -f1)"
  # At exit: "l2l-worker: done steps=N peak_rss_kb=K device_bytes=D stash_host_bytes=H ..."
  local done_line; done_line=$(grep "^l2l-worker: done" "$dir/worker.log" | tail -1 || true)
  [[ -n "$done_line" ]] || { tail -20 "$dir/worker.log"; die "l2l-worker ($name) printed no 'l2l-worker: done' line"; }
  local done_steps; done_steps=$(sed -n 's/.* steps=\([0-9]*\).*/\1/p' <<<"$done_line")
  [[ "$done_steps" == "$total" ]] || { tail -20 "$dir/worker.log"; die "l2l-worker ($name) did $done_steps steps, not $total"; }
  local dev_bytes; dev_bytes=$(sed -n 's/.* device_bytes=\([0-9]*\).*/\1/p' <<<"$done_line")
  [[ -n "$dev_bytes" ]] || die "l2l-worker ($name): no device_bytes= in '$done_line'"
  L2L_DEV_MIB=$(awk -v b="$dev_bytes" 'BEGIN { printf "%.2f", b / 1048576 }')
  if [[ "$SMOKE" == 1 ]]; then L2L_MIB=$L2L_DEV_MIB; else L2L_MIB=$(peak_mib "$dir/smi.txt" "$wpid" "$BASE_MIB"); fi
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
    die "l2l-worker ($name): no parseable progress line after the $WARMUP warm-up steps"
  fi
  log "l2l $name: tokens/s $L2L_TPS; peak device memory ${L2L_MIB} MiB$([[ "$SMOKE" == 1 ]] && echo " (worker device_bytes; nvidia-smi SKIPPED)"); per step: $L2L_BREAKDOWN"
  log "  $(sed -n 's/.*\(backend cuda:0 .*\), stash.*/\1/p' "$dir/worker.log" | head -1 | grep . || echo "worker backend line not found")"
  log "  $done_line"
}

MODEL_DESC="GPT-2 XL shapes"
[[ -z "$MODEL_OVERRIDES" ]] || MODEL_DESC="gpt2-xl preset with n_embd ${N_EMBD:-1600} n_head ${N_HEAD:-25} vocab ${VOCAB:-50257}"
log "l2l: $MODEL_DESC, $LAYERS layers, B=$B M=$M T=$T ($TOKENS_PER_STEP tokens/step), $STEPS steps after $WARMUP, one worker on cuda:0"
run_l2l xl-device "$LAYERS" device "$STEPS"
XL_TPS=$L2L_TPS; XL_MIB=$L2L_MIB; XL_BREAKDOWN=$L2L_BREAKDOWN
run_l2l xl-host "$LAYERS" host 2
HOST1_MIB=$L2L_MIB
if [[ "${BENCH_SKIP_DEEP:-0}" != 1 ]]; then
  run_l2l xl-4x-host "$((4 * LAYERS))" host 2
  HOST4_MIB=$L2L_MIB
else
  log "4x-depth run SKIPPED (BENCH_SKIP_DEEP=1)"
fi

# ---- summary -------------------------------------------------------------------------------
"$PYTHON" - "$XL_TPS" "$TORCH_TPS" "$XL_MIB" "$TORCH_MIB" "$HOST1_MIB" "${HOST4_MIB:-0}" "$TOKENS_PER_STEP" "$SMOKE" "$MODEL_DESC" <<'PY'
import sys
l2l_tps, torch_tps, l2l_mib, torch_mib, h1, h4, tps_step = map(float, sys.argv[1:8])
smoke, desc = sys.argv[8] == "1", sys.argv[9]
def ratio(a, b): return f"{a / b:.3f}" if b > 0 else "n/a"
print(f"bench_gpu.sh: {desc}, {int(tps_step)} tokens/step, one GPU" + (" (SMOKE: no PyTorch, no nvidia-smi)" if smoke else ""))
if smoke:
    print(f"  tokens/s      l2l {l2l_tps:,.0f}   PyTorch SKIPPED")
    print(f"  peak memory   l2l {l2l_mib:.2f} MiB (worker device_bytes)   PyTorch SKIPPED")
else:
    print(f"  tokens/s      l2l {l2l_tps:,.0f}   PyTorch {torch_tps:,.0f}   ratio {ratio(l2l_tps, torch_tps)}  (target >= 0.85)")
    print(f"  peak memory   l2l {l2l_mib/1024:.2f} GiB   PyTorch {torch_mib/1024:.2f} GiB   ratio {ratio(l2l_mib, torch_mib)}  (target <= 0.3)")
if h4 > 0:
    unit, div = ("MiB", 1) if smoke else ("GiB", 1024)
    pct = f"{100 * (h4 / h1 - 1):+.1f}%" if h1 > 0 else "n/a"
    print(f"  4x depth, stash host: {h4/div:.2f} {unit} vs {h1/div:.2f} {unit} at 1x: {pct}  (target <= +10%)")
PY
log "l2l time breakdown per step (1x, stash device): $XL_BREAKDOWN"
log "note: exposed H2D/D2H are not separated until the CUDA relay reports them (issue 5 part 2)"
