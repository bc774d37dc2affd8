#!/usr/bin/env bash
# Larger than the GPU (issue 27, items 4-5): Qwen2.5-7B (configs/models/qwen2.5-7b.yaml,
# random init, 7,615,616,512 parameters, ~16 B/param of host state = 122 GB) trained by
# l2l on ONE GPU of a host with 128 GiB of RAM and a 64 GB disk, its state held by
# memory.host_bytes plus the SSD tier (spill.dir), in one run of under 9 minutes. Writes
# into $OUT (default ./bench-large-out):
#   plan.json / plan.txt  the budget arithmetic (below), also printed by --dry-run
#   ssd_rate.txt          the SSD's own sequential rate in this run (fio if installed,
#                         else dd with O_DIRECT): write and read MB/s on the spill dir's disk
#   run.jsonl             the daemon's step timeline (docs/operations.md "run.jsonl")
#   status.jsonl          `l2lctl status --json` every ~2 s (SSD tier bytes read/written,
#                         memory tiers), with the daemon's and worker's RSS and the GPU's
#                         memory (nvidia-smi) on each line
#   summary.json / summary.txt  tokens/s; TFLOPS as MegaTrain counts them (6 x params x
#                         tokens/s) and with attention (PaLM's 6 x params + 12 x n_layer x
#                         d_model x T FLOPs per token, the full T x T scores); peak device
#                         memory; peak host RSS (daemon + worker); SSD bytes read and
#                         written per step; seconds from launch to the first step; the
#                         MegaTrain side by side when it ran, or why not
#   *.log                 the daemon's, worker's, MegaTrain's logs
#
# Budget arithmetic (plan): P parameters; the daemon holds fp32 master + AdamW m + v =
# 12 B/param in 4 MiB pages (per layer, rounded up) and two published bf16 copies (4
# B/param, always in RAM: workers fetch them). memory.host_bytes = the host's
# MemAvailable minus BENCH_HOST_RESERVE_GB (default 12: the worker's pinned staging and
# gradient buffers, the daemon's gradient slots, page cache, the OS); inside it, the
# non-finite guard's budget memory.guard_bytes (BENCH_GUARD_BYTES; default 4.08 B/param,
# the daemon's minimum: each layer's gradient held until the step's verdict, no undo
# copies); what of the 12 B/param does not fit beside the guard, the published copies
# and the staging pool goes to the SSD tier, which must fit the spill dir's free space
# minus BENCH_DISK_MARGIN_GB (6).
# A state beyond RAM + disk is refused up front with the numbers (exit 2), before
# anything starts. The plan also gives the largest Llama-family model this host holds
# at all (16 P <= host_bytes - pool + disk).
#
# MegaTrain side by side (issue 27 item 5): MegaTrain's own examples/sft/train.py from
# $MEGATRAIN_DIR (default: src/peers/megatrain in the bundle, else ../shared/peers/megatrain
# beside the source tree) on the same GPU, shape and tokens per step (batch_size = B x M
# sequences of T tokens; it counts padding tokens, as its own formula does), loading the
# weights l2l just exported with `l2lctl export --format hf --dtype bf16` (sharded
# safetensors, issue 27 item 6; its SFT path loads bf16 weights) and a word-level
# tokenizer written here. It uses: PyTorch and transformers of the host, psutil,
# `datasets` (its alpaca_en_demo loader), attn_implementation "sdpa" (flash-attn is not
# assumed) and, DeepSpeed being absent, its torch AdamW fallback (its train.py picks it
# itself when `deepspeed.ops.adam` does not import; said in the summary). When any of
# that is missing, or time or disk does not allow it, the summary says why and the
# comparison falls back to MegaTrain's published 272 TFLOPS (Qwen2.5-7B, one H100).
#
# Usage (on the GPU machine, from an unpacked bundle: scripts/bundle.sh puts this in
# l2l/src/scripts/; or from a CUDA build tree):
#   bash bench_large.sh [--dry-run] [L2L_ROOT]    L2L_ROOT holds bin/ (default: the bundle root)
#   --dry-run   prints the plan and exits: no binary, GPU or disk write needed. Without
#               BENCH_RAM_BYTES / BENCH_DISK_FREE_BYTES it plans for the target host
#               (128 GiB RAM, 64 GB disk of which 54 GB free), not the machine it runs on.
# Environment: BENCH_PRESET (qwen2.5-7b; any Llama-family preset), BENCH_T (1024),
#   BENCH_B (micro-batch sequences, 8), BENCH_M (micro-batches per step; auto: the most
#   up to 16 whose stash fits: 16 = 131,072 tokens per step at Qwen2.5-7B, near
#   MegaTrain's 1-GPU 158 x 1024; bounded by the device stash,
#   which the plan checks: (n_layer + 1) x tokens x d_model fp32 layer outputs, 54.5 GB
#   at Qwen2.5-7B, must leave BENCH_GPU_RESERVE_GB (12) of the GPU's memory for weights,
#   gradients and workspace; BENCH_GPU_BYTES overrides the GPU's size, nvidia-smi's
#   memory.total, or 78 GiB with --dry-run), BENCH_WARMUP (1), BENCH_STEPS (timed steps, 2),
#   BENCH_N_LAYER (the preset's depth; a number, or "max": the deepest model of the
#   preset's width this host holds, issue 27 item 4's "largest Llama-family shape that
#   trains on that host at all"; one shape per run: the 9 minutes do not hold two),
#   BENCH_HOST_RESERVE_GB (24), BENCH_DISK_MARGIN_GB (6), BENCH_SSD_TEST_MB (the fio/dd
#   file, 4096), BENCH_SPILL_DIR (default
#   $WORK/spill; must be on a real disk, not tmpfs), BENCH_RAM_BYTES /
#   BENCH_DISK_FREE_BYTES (override the measured MemAvailable / free space),
#   BENCH_TOTAL_TIMEOUT (seconds for everything, 530), BENCH_SKIP_MEGATRAIN=1,
#   MEGATRAIN_DIR, PYTHON (python3), OUT, BENCH_KEEP_WORK=1, BENCH_DEVICE (cuda:0; cpu
#   rehearses the whole script on the CPU with a small preset, e.g. BENCH_PRESET=llama-tiny
#   BENCH_T=64 BENCH_B=2 BENCH_M=2 BENCH_HOST_RESERVE_GB=0 BENCH_RAM_BYTES=34000000: no
#   device memory polled, no MegaTrain).
# Exit status: 0 measured (a benchmark: it never fails on speed); 1 a run failed (the
# figures measured so far are still written); 2 the plan refuses the shape (arithmetic
# printed); 64 bad usage.
#
# Depends on: the daemon's per-parameter buffers being inside memory.host_bytes: the
# guard's are (memory.guard_bytes, docs/architecture.md "Host memory budget"); the
# gradient slots and the worker's pinned staging are what the 12 GB reserve is for. B is fixed and M fits the device stash (the micro-batch planner of item 3,
# which would weigh the measured transfer and update rates, is not used).
#
# STATUS: written without a GPU (no device was lent to the session that wrote it). Its
# CPU-side parts are checked there: `bash -n` and --dry-run. Not yet run on a GPU.
set -euo pipefail
die() { echo "bench_large.sh: FAILED: $*" >&2; exit 1; }
log() { echo "bench_large.sh: $*"; }

DRY=0
ARGS=()
for a in "$@"; do
  case "$a" in
    --dry-run) DRY=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    -*) echo "bench_large.sh: unknown option $a (--dry-run, --help)" >&2; exit 64 ;;
    *) ARGS+=("$a") ;;
  esac
done
HERE=$(cd "$(dirname "$0")" && pwd)
PYTHON=${PYTHON:-python3}
PRESET=${BENCH_PRESET:-qwen2.5-7b}
DEVICE=${BENCH_DEVICE:-cuda:0}
N_LAYER=${BENCH_N_LAYER:-}
SSD_MB=${BENCH_SSD_TEST_MB:-4096}
T=${BENCH_T:-1024}; B=${BENCH_B:-8}; M=${BENCH_M:-auto}
WARMUP=${BENCH_WARMUP:-1}; STEPS=${BENCH_STEPS:-2}
TOTAL_TIMEOUT=${BENCH_TOTAL_TIMEOUT:-530}
[[ "$M" == auto ]] || [[ "$M" =~ ^[1-9][0-9]*$ ]] || { echo "bench_large.sh: BENCH_M must be auto or a positive integer, not '$M'" >&2; exit 64; }
for v in T B STEPS TOTAL_TIMEOUT SSD_MB; do
  [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || { echo "bench_large.sh: BENCH_$v must be a positive integer, not '${!v}'" >&2; exit 64; }
done
[[ "$WARMUP" =~ ^[0-9]+$ ]] || { echo "bench_large.sh: BENCH_WARMUP must be >= 0, not '$WARMUP'" >&2; exit 64; }

CFGS=""
for c in "$HERE/../configs" "$HERE/../../src/configs"; do [[ -f "$c/models/$PRESET.yaml" ]] && { CFGS=$(cd "$c" && pwd); break; }; done
[[ -n "$CFGS" ]] || { echo "bench_large.sh: no configs/models/$PRESET.yaml beside $HERE" >&2; exit 64; }
OUT=${OUT:-$PWD/bench-large-out}
mkdir -p "$OUT"

# ---- the plan: budget arithmetic (python3, standard library only) ------------------------
if ((DRY)); then
  GPU_BYTES=${BENCH_GPU_BYTES:-$((78 * 1024 * 1024 * 1024))}
  RAM=${BENCH_RAM_BYTES:-$((128 * 1024 * 1024 * 1024 - 4 * 1000 * 1000 * 1000))}  # 128 GiB less ~4 GB for the OS
  DISK=${BENCH_DISK_FREE_BYTES:-54000000000}
  SPILL_DIR=${BENCH_SPILL_DIR:-/tmp/l2l-bench-large/spill}
else
  RAM=${BENCH_RAM_BYTES:-$(awk '/^MemAvailable:/ { printf "%d", $2 * 1024 }' /proc/meminfo)}
  if [[ -n "${BENCH_GPU_BYTES:-}" ]]; then GPU_BYTES=$BENCH_GPU_BYTES
  elif [[ "$DEVICE" == cuda:* ]] && command -v nvidia-smi >/dev/null; then
    GPU_BYTES=$(($(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 | head -1) * 1024 * 1024))
  else GPU_BYTES=0; fi  # 0: not checked (BENCH_DEVICE=cpu)
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/l2l-bench-large.XXXXXX")
  trap 'rm -rf "$WORK"' EXIT  # until the full cleanup below replaces it
  SPILL_DIR=${BENCH_SPILL_DIR:-$WORK/spill}
  mkdir -p "$SPILL_DIR"
  DISK=${BENCH_DISK_FREE_BYTES:-$(df -B1 --output=avail "$SPILL_DIR" | tail -1 | tr -d ' ')}
fi
plan_rc=0
"$PYTHON" - "$CFGS/models/$PRESET.yaml" "$RAM" "$DISK" "${BENCH_HOST_RESERVE_GB:-12}" "${BENCH_DISK_MARGIN_GB:-6}" \
    "$T" "$B" "$M" "$OUT/plan.json" "$N_LAYER" "$GPU_BYTES" "${BENCH_GPU_RESERVE_GB:-12}" "${BENCH_GUARD_BYTES:-0}" \
    <<'PY' > "$OUT/plan.txt" || plan_rc=$?
import json, math, re, sys
path, ram, disk, reserve_gb, margin_gb, T, B, M, out, n_layer, gpu, gpu_reserve_gb, guard_fixed = sys.argv[1:]
guard_fixed = int(float(guard_fixed))
gpu, gpu_reserve = int(gpu), float(gpu_reserve_gb) * 1e9
ram, disk, T, B = int(ram), int(disk), int(T), int(B)
reserve, margin = float(reserve_gb) * 1e9, float(margin_gb) * 1e9
spec = {}
for line in open(path):
    m = re.match(r"^  ([a-z_]+):\s*([^#\s]+)", line)
    if m:
        spec[m.group(1)] = m.group(2)
V, C, L, H = (int(spec[k]) for k in ("vocab_size", "d_model", "n_layer", "n_head"))
F = int(spec["d_ff"]); KV = int(spec.get("n_kv_heads", H)) or H
bias = spec.get("qkv_bias") == "true"; tied = spec.get("tied_embeddings") == "true"
if spec.get("family") != "llama":
    sys.exit("bench_large.sh: plan: preset %s is not Llama-family" % path)
kv = KV * (C // H)
block = 2 * C * C + 2 * C * kv + (C + 2 * kv if bias else 0) + 3 * C * F + 2 * C
PAGE = 4 << 20
disk_for_ssd = disk - margin


def budget(L):
    """(layers, P, paged, published, state, pool, host_bytes, ram_state, ssd) at depth L."""
    layers = [V * C] + [block] * L + [C + (0 if tied else V * C)]  # embedding, blocks, norm + head
    paged = sum(3 * math.ceil(n * 4 / PAGE) * PAGE for n in layers)  # fp32 master + m + v
    published = sum(2 * 2 * n for n in layers)                       # two bf16 copies
    state = paged + published
    pool = 2 * 3 * math.ceil(max(layers) * 4 / PAGE) * PAGE          # prefetch 1: two layers' pages
    # The non-finite guard's undo copies come out of host_bytes (memory.guard_bytes, the
    # daemon's minimum 4 B/param plus 2%: every layer's update deferred to the step's verdict).
    guard = guard_fixed if guard_fixed > 0 else int(4.08 * sum(layers))
    host_bytes = int(min(ram - reserve, state + guard))
    ram_state = host_bytes - guard - published - pool
    ssd = 0 if host_bytes >= state else paged - ram_state
    return layers, sum(layers), paged, published, state, pool, host_bytes, ram_state, ssd


def guard_of(L):
    return guard_fixed if guard_fixed > 0 else int(4.08 * budget(L)[1])


def fits(L):
    b = budget(L)
    return b[7] >= 0 and b[8] <= disk_for_ssd


# The deepest model of this width the host holds (n_layer "max"): the largest Llama-family
# shape that trains here at all, at the preset's width.
L_max = 0
while fits(L_max + 1) and L_max < 100000:
    L_max += 1
if n_layer == "max":
    L = max(L_max, 1)
elif n_layer:
    L = int(n_layer)
layers, P, paged, published, state, pool, host_bytes, ram_state, ssd = budget(L)
export = 2 * P                                                       # bf16 HF export for MegaTrain
if M == "auto":  # the most micro-batches up to 16 whose device stash fits (at least 1)
    M = 16
    while M > 1 and gpu and (L + 1) * B * M * T * C * 4 > gpu - gpu_reserve:
        M -= 1
M = int(M)
tok = B * M * T
fl_mt = 6 * P                                                        # MegaTrain's count per token
fl_attn = 6 * P + 12 * L * C * T                                     # with attention (PaLM)
p_max = budget(L_max)[1] if L_max else 0
stash = (L + 1) * tok * C * 4                                       # device stash: fp32 layer outputs
refuse = []
if gpu and stash > gpu - gpu_reserve:
    refuse.append("the device stash of %d layer outputs x %d tokens x d_model %d fp32 is %d bytes; the GPU's %d "
                  "less %d for weights, gradients and workspace does not hold it: lower BENCH_M or BENCH_B"
                  % (L + 1, tok, C, stash, gpu, gpu_reserve))
if ram_state < 0:
    refuse.append("memory.host_bytes=%d (MemAvailable %d - reserve %d) cannot hold the published bf16 copies "
                  "(%d) and the staging pool (%d)" % (host_bytes, ram, reserve, published, pool))
elif ssd > disk_for_ssd:
    refuse.append("the SSD tier needs %d bytes (state %d - %d in RAM) but the spill dir has %d free - margin %d"
                  % (ssd, paged, ram_state, disk, margin))
plan = dict(preset=path, n_layer=L, n_layer_max=L_max, params=P, layers=len(layers), largest_layer_params=max(layers),
            state_bytes=state, master_m_v_bytes=paged, published_bf16_bytes=published,
            bytes_per_param=state / P, host_ram_available=ram, host_reserve=int(reserve),
            host_bytes=host_bytes, guard_bytes=guard_of(L), pool_bytes_upper=pool, ram_state_bytes=max(0, ram_state),
            ssd_bytes=ssd, disk_free=disk, disk_margin=int(margin),
            export_bf16_bytes=export, export_fits=(ssd + export <= disk_for_ssd),
            tokens_per_step=tok, T=T, B=B, M=M, device_stash_bytes=stash, gpu_bytes=gpu,
            flops_per_token_megatrain=fl_mt, flops_per_token_with_attention=fl_attn,
            ssd_bytes_per_step_expected=2 * ssd,
            tokens_per_s_for_326_tflops=326e12 / fl_mt,
            largest_llama_params_on_host=int(p_max), refused=refuse)
json.dump(plan, open(out, "w"), indent=1)
G = 1e9
print(f"plan: {path.split('/')[-1]}{'' if L == int(spec['n_layer']) else f' at n_layer {L}'}: {P:,} parameters, "
      f"{len(layers)} layers (largest {max(layers):,} params)")
print(f"  state: fp32 master + AdamW m + v {paged / G:.1f} GB (12 B/param in 4 MiB pages) + two published "
      f"bf16 copies {published / G:.1f} GB = {state / G:.1f} GB ({state / P:.2f} B/param)")
print(f"  host: MemAvailable {ram / G:.1f} GB - reserve {reserve / G:.0f} GB -> memory.host_bytes {host_bytes / G:.1f} GB"
      f" = guard (undo / deferred gradients) {guard_of(L) / G:.1f} + published {published / G:.1f} + staging pool <= "
      f"{pool / G:.1f} + state pages in RAM {max(0, ram_state) / G:.1f}")
print(f"  SSD tier: {ssd / G:.1f} GB of the spill dir's {disk / G:.1f} GB free (margin {margin / G:.0f} GB); "
      f"~{2 * ssd / G:.1f} GB read + written per step (each spilled page once each way)")
print(f"  bf16 HF export for MegaTrain: {export / G:.1f} GB ({'fits' if ssd + export <= disk_for_ssd else 'does NOT fit'} beside the spill file)")
print(f"  device stash: {L + 1} layer outputs x {tok:,} tokens x {C} x 4 B = {stash / G:.1f} GB of the GPU's "
      f"{gpu / G:.1f} GB (reserve {gpu_reserve / G:.0f} GB for weights, gradients, workspace)" if gpu else
      f"  device stash: {stash / G:.1f} GB (no GPU size given: not checked)")
print(f"  tokens/step {tok:,} (B {B} x M {M} x T {T}); FLOPs/token {fl_mt / 1e9:.1f} G (6P, MegaTrain) / "
      f"{fl_attn / 1e9:.1f} G (with attention); 326 TFLOPS (1.2 x MegaTrain's 272) = {326e12 / fl_mt:,.0f} tokens/s")
print(f"  the deepest model of this width this host holds at all: n_layer {L_max}, {p_max / 1e9:.2f} B parameters "
      f"(published copies + pool in RAM, the rest of the state in RAM + disk; BENCH_N_LAYER=max runs it)")
for r in refuse:
    print("  REFUSED: " + r)
sys.exit(2 if refuse else 0)
PY
cat "$OUT/plan.txt"
if ((plan_rc == 2)); then echo "bench_large.sh: the plan refuses this shape on this host (above); nothing was started" >&2; exit 2; fi
((plan_rc == 0)) || die "the plan failed (python $PYTHON, exit $plan_rc)"
if ((DRY)); then log "--dry-run: plan only (written to $OUT/plan.json)"; exit 0; fi

pj() { "$PYTHON" -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$OUT/plan.json" "$1"; }
HOST_BYTES=$(pj host_bytes); GUARD_BYTES=$(pj guard_bytes); PARAMS=$(pj params); EXPORT_FITS=$(pj export_fits); PLAN_N_LAYER=$(pj n_layer); M=$(pj M)  # BENCH_M=auto resolved

# ---- binaries and libraries ---------------------------------------------------------------
if [[ ${#ARGS[@]} -ge 1 ]]; then ROOT=$(cd "${ARGS[0]}" && pwd)
elif [[ -x "$HERE/../../bin/l2l-worker" ]]; then ROOT=$(cd "$HERE/../.." && pwd)
elif [[ -x "$HERE/../build/bin/l2l-worker" ]]; then ROOT=$(cd "$HERE/../build" && pwd)
else die "no l2l binaries found; pass the folder holding bin/"; fi
BIN="$ROOT/bin"
[[ -x "$BIN/l2l-eps" && -x "$BIN/l2l-worker" && -x "$BIN/l2lctl" ]] || die "$BIN lacks l2l-eps, l2l-worker or l2lctl"
# shellcheck source=scripts/gpu_env.sh
source "$HERE/gpu_env.sh"
[[ -d "$ROOT/lib" ]] && export LD_LIBRARY_PATH="$ROOT/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export L2L_CONFIG_DIR="$CFGS"
if [[ "$DEVICE" == cuda:* ]]; then
  if CUBLAS_DIR=$(find_cublaslt); then export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$CUBLAS_DIR"
  else log "libcublasLt.so.13 NOT FOUND; looked in $(find_cublaslt_where)"; fi
  export L2L_CUDA_GEMM=${L2L_CUDA_GEMM:-bf16}
  command -v nvidia-smi >/dev/null || die "nvidia-smi not found"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt" || true
  log "GPU: $(cat "$OUT/gpu.txt")"
else
  echo "none: BENCH_DEVICE=$DEVICE (a CPU rehearsal of the script; no GPU figures)" > "$OUT/gpu.txt"
  log "BENCH_DEVICE=$DEVICE: a CPU rehearsal; device memory is not polled and MegaTrain is not run"
fi
unresolved=$(ldd_unresolved "$BIN"/*) || die "unresolved libraries in $BIN:"$'\n'"$unresolved"

EPS_PID=""; W_PID=""; POLL_PID=""
cleanup() {
  [[ -z "$POLL_PID" ]] || kill "$POLL_PID" 2>/dev/null || true
  [[ -z "$W_PID" ]] || kill "$W_PID" 2>/dev/null || true
  if [[ -n "$EPS_PID" ]] && kill -0 "$EPS_PID" 2>/dev/null; then
    timeout 40 "$BIN/l2lctl" --state-dir "$WORK/eps" stop --abort-step --skip-checkpoint --wait 30 >/dev/null 2>&1 || true
    kill -KILL "$EPS_PID" 2>/dev/null || true
  fi
  rm -f /dev/shm/l2l-benchlarge$$-* 2>/dev/null || true
  if [[ "${BENCH_KEEP_WORK:-0}" == 1 ]]; then log "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
left() { echo $((TOTAL_TIMEOUT - SECONDS)); }

# ---- 1. the SSD's own rate, on the spill dir's disk ----------------------------------------
{
  if command -v fio >/dev/null; then
    for rw in write read; do
      fio --name=ssd-$rw --directory="$SPILL_DIR" --rw=$rw --bs=4M --size=${SSD_MB}M --direct=1 --ioengine=libaio \
          --iodepth=16 --numjobs=1 --group_reporting --output-format=terse --terse-version=3 2>&1 |
        awk -F';' -v rw=$rw '{ printf "fio %s MiB/s %.0f\n", rw, (rw == "write" ? $48 : $7) / 1024 }'
    done
  else
    dd if=/dev/zero of="$SPILL_DIR/dd.bin" bs=4M count=$((SSD_MB / 4)) oflag=direct conv=fsync 2>&1 | tail -1 | sed 's/^/dd write: /'
    dd if="$SPILL_DIR/dd.bin" of=/dev/null bs=4M iflag=direct 2>&1 | tail -1 | sed 's/^/dd read: /'
  fi
  rm -f "$SPILL_DIR/dd.bin" "$SPILL_DIR"/ssd-*
} > "$OUT/ssd_rate.txt" 2>&1 || true
log "SSD: $(tr '\n' ' ' < "$OUT/ssd_rate.txt")"

# ---- 2. l2l ---------------------------------------------------------------------------------
"$PYTHON" - "$WORK/train.bin" 4000000 "$(awk '/vocab_size/ { print $2; exit }' "$CFGS/models/$PRESET.yaml")" <<'PY'
# A version-2 tokens file (common/formats/tokens_file.h): 256-int32 header, uint32 tokens.
import array, random, sys
n, vocab = int(sys.argv[2]), int(sys.argv[3])
hdr = array.array("i", [20240520, 2, n, 4] + [0] * 252)
rnd = random.Random(0)
tok = array.array("I", (rnd.randrange(vocab) for _ in range(n)))
with open(sys.argv[1], "wb") as f:
    hdr.tofile(f); tok.tofile(f)
PY
mkdir -p "$WORK/eps"
cat > "$WORK/eps.yaml" <<YAML
memory:
  host_bytes: $HOST_BYTES
  guard_bytes: $GUARD_BYTES
  page_bytes: 4194304
spill:
  dir: $SPILL_DIR
  prefetch_layers: 1
YAML
cat > "$WORK/job.yaml" <<YAML
model:
  preset: $PRESET
  n_layer: $PLAN_N_LAYER
  seq_len: $T
optim:
  lr: 1.0e-5
train:
  steps: $((WARMUP + STEPS))
  micro_batch_size: $B
  micro_batches: $M
  seq_len: $T
  log_every: 1
data:
  train_path: $WORK/train.bin
publish_dtype: bf16
YAML
cp "$WORK/eps.yaml" "$WORK/job.yaml" "$OUT/"
LAUNCH=$(date +%s.%N)
"$BIN/l2l-eps" --config "$WORK/eps.yaml" --job "$WORK/job.yaml" --state-dir "$WORK/eps" --workers 1 \
    --job-id "benchlarge$$" > "$OUT/eps.log" 2>&1 &
EPS_PID=$!
while [[ ! -s "$WORK/eps/eps.port" ]]; do
  kill -0 "$EPS_PID" 2>/dev/null || { tail -20 "$OUT/eps.log"; die "l2l-eps exited before listening"; }
  (($(left) > 60)) || die "l2l-eps did not listen before the time budget ran out"
  sleep 0.5
done
LISTEN_S=$("$PYTHON" -c "import time; print(round(time.time() - $LAUNCH, 1))")
log "l2l-eps listening after $LISTEN_S s (init + pinning of $PARAMS parameters)"
"$BIN/l2l-worker" --eps "127.0.0.1:$(cat "$WORK/eps/eps.port")" --device "$DEVICE" > "$OUT/worker.log" 2>&1 &
W_PID=$!
rss() { awk '/^VmRSS:/ { print $2 * 1024 }' "/proc/$1/status" 2>/dev/null || echo 0; }
poll_once() {  # one line of status.jsonl: the daemon's status, both RSS, the GPU's memory
  local s g=""
  s=$("$BIN/l2lctl" --state-dir "$WORK/eps" --json --connect-timeout-ms 2000 status 2>/dev/null) || s='{}'
  [[ -n "$s" ]] || s='{}'
  [[ "$DEVICE" != cuda:* ]] || g=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 2>/dev/null | head -1)
  echo "{\"t\": $(date +%s.%N), \"eps_rss\": $(rss "$EPS_PID"), \"worker_rss\": $(rss "${W_PID:-0}"), \"gpu_mib\": ${g:-0}, \"status\": $s}"
}
( while true; do poll_once; sleep 2; done ) > "$OUT/status.jsonl" &
POLL_PID=$!
wrc=0
while kill -0 "$W_PID" 2>/dev/null; do
  if (($(left) < 150)); then log "time budget: stopping the worker with $(left) s left"; kill "$W_PID"; wrc=124; break; fi
  sleep 1
done
((wrc == 0)) && { wait "$W_PID" || wrc=$?; }
W_PID=""
kill "$POLL_PID" 2>/dev/null || true; wait "$POLL_PID" 2>/dev/null || true; POLL_PID=""
poll_once >> "$OUT/status.jsonl"  # the totals after the last step
cp "$WORK/eps/run.jsonl" "$OUT/run.jsonl" 2>/dev/null || log "no run.jsonl written"
((wrc == 0)) || log "l2l-worker exit status $wrc (figures below are from the steps done)"

# ---- 3. export (bf16 HF, sharded: item 6 at size, and MegaTrain's weights), then stop -------
MT_WHY=""
if [[ "${BENCH_SKIP_MEGATRAIN:-0}" == 1 ]]; then MT_WHY="BENCH_SKIP_MEGATRAIN=1"
elif [[ "$DEVICE" != cuda:* ]]; then MT_WHY="BENCH_DEVICE=$DEVICE: no GPU"
fi
if [[ "$EXPORT_FITS" != True ]]; then EXPORT_WHY="the bf16 export ($(pj export_bf16_bytes) bytes) does not fit the disk beside the spill file"
elif (($(left) < 150)); then EXPORT_WHY="under 150 s of the time budget left after l2l"
else EXPORT_WHY=""; fi
[[ -n "$MT_WHY" || -z "$EXPORT_WHY" ]] || MT_WHY="no weights for it: $EXPORT_WHY"
EXPORT_S=""
if [[ -z "$EXPORT_WHY" ]]; then
  t0=$SECONDS
  # A relative path: the daemon writes it under its state dir ($WORK/eps/hf).
  if timeout 120 "$BIN/l2lctl" --state-dir "$WORK/eps" export --format hf --dtype bf16 hf > "$OUT/export.log" 2>&1; then
    EXPORT_S=$((SECONDS - t0)); log "exported bf16 HF dir in $EXPORT_S s: $(ls "$WORK/eps/hf" 2>/dev/null | tr '\n' ' ')"
  else
    EXPORT_WHY="l2lctl export failed: $(tail -1 "$OUT/export.log")"
    [[ -n "$MT_WHY" ]] || MT_WHY="no weights for it: $EXPORT_WHY"
  fi
fi
log "export: ${EXPORT_S:+$EXPORT_S s}${EXPORT_WHY:+not done: $EXPORT_WHY}"
timeout 60 "$BIN/l2lctl" --state-dir "$WORK/eps" stop --skip-checkpoint --wait 50 > "$OUT/stop.log" 2>&1 || true
wait "$EPS_PID" 2>/dev/null || true; EPS_PID=""

# ---- 4. MegaTrain ----------------------------------------------------------------------------
MT_DIR=${MEGATRAIN_DIR:-}
for d in "$ROOT/src/peers/megatrain" "$HERE/../../shared/peers/megatrain" "$HERE/../../../shared/peers/megatrain"; do
  [[ -n "$MT_DIR" ]] && break; [[ -f "$d/examples/sft/train.py" ]] && MT_DIR=$(cd "$d" && pwd)
done
HF_DIR="$WORK/eps/hf"
if [[ -z "$MT_WHY" && -z "$MT_DIR" ]]; then MT_WHY="no MegaTrain checkout (set MEGATRAIN_DIR)"; fi
if [[ -z "$MT_WHY" ]] && (($(left) < 150)); then MT_WHY="under 150 s of the time budget left after l2l and the export"; fi
if [[ -z "$MT_WHY" ]]; then
  if ! miss=$("$PYTHON" -c 'import importlib.util as u
print(" ".join(m for m in ["torch", "transformers", "tokenizers", "psutil", "datasets", "yaml", "jinja2"] if u.find_spec(m) is None))' 2>&1) || [[ -n "$miss" ]]; then
    MT_WHY="python modules missing for MegaTrain: $miss"
  fi
fi
if [[ -z "$MT_WHY" ]]; then
  "$PYTHON" - "$HF_DIR" <<'PY' > "$OUT/megatrain_tokenizer.log" 2>&1 || MT_WHY="could not write a tokenizer into the export (see megatrain_tokenizer.log)"
# A word-level tokenizer over the model's vocabulary (MegaTrain's loader needs one; the
# benchmark's tokens are padded to max_seq_len, which it counts, as its formula does).
import json, sys
from tokenizers import Tokenizer, models, pre_tokenizers
import transformers
d = sys.argv[1]
V = json.load(open(d + "/config.json"))["vocab_size"]
tk = Tokenizer(models.WordLevel({f"w{i}": i for i in range(V)}, unk_token="w0"))
tk.pre_tokenizer = pre_tokenizers.Whitespace()
t = transformers.PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="w0", eos_token="w2", pad_token="w0")
t.chat_template = ("{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
                   "{% if add_generation_prompt %}assistant {% endif %}")
t.save_pretrained(d)
PY
fi
MT_TFLOPS=""; MT_TPS=""
if [[ -z "$MT_WHY" ]]; then
  cat > "$WORK/megatrain.yaml" <<YAML
model: {name: "$HF_DIR", dtype: "bfloat16", device: 0, attn_implementation: "sdpa", trust_remote_code: false}
dataset: {name: "alpaca_en_demo", dataset_dir: "$MT_DIR/data", max_seq_len: $T, num_workers: 2}
training: {batch_size: $((B * M)), gradient_accumulation_steps: 1, num_steps: $((WARMUP + STEPS)), learning_rate: 1.0e-5, weight_decay: 0.01, max_grad_norm: 1.0, seed: 42}
optimizer: {type: "adamw", beta1: 0.9, beta2: 0.999, eps: 1.0e-8}
memory: {checkpoint_interval: 4, num_grad_slabs: 12}
logging: {log_interval: 1, enable_timing: true}
YAML
  cp "$WORK/megatrain.yaml" "$OUT/"
  mrc=0
  (cd "$MT_DIR" && PYTHONPATH="$MT_DIR" timeout --kill-after=10 $(($(left) - 20)) "$PYTHON" examples/sft/train.py \
      --config "$WORK/megatrain.yaml") > "$OUT/megatrain.log" 2>&1 || mrc=$?
  read -r MT_TPS MT_TFLOPS < <(awk -v skip="$WARMUP" '/Tokens\/s/ && /TFLOPS/ { n++; if (n <= skip) next
      for (i = 1; i <= NF; i++) { if ($i == "Tokens/s") tps += $(i + 1); if ($i == "TFLOPS") tf += $(i + 1) } k++ }
      END { if (k) printf "%.1f %.1f\n", tps / k, tf / k; else print "" }' "$OUT/megatrain.log") || true
  [[ -n "$MT_TFLOPS" ]] || MT_WHY="MegaTrain ran (exit $mrc) but printed no timed step: $(grep -m1 -E 'Error|error' "$OUT/megatrain.log" || tail -1 "$OUT/megatrain.log")"
fi

# ---- 5. summary ----------------------------------------------------------------------------
"$PYTHON" - "$OUT" "$WARMUP" "$LISTEN_S" "$LAUNCH" "$wrc" "${EXPORT_S:-}" "$EXPORT_WHY" "${MT_TPS:-}" "${MT_TFLOPS:-}" "$MT_WHY" \
    "$(grep -c 'Using PyTorch AdamW' "$OUT/megatrain.log" 2>/dev/null || true)" <<'PY'
import json, sys
out, warmup, listen_s, launch, wrc, export_s, export_why, mt_tps, mt_tflops, mt_why, mt_torch_adam = sys.argv[1:]
plan = json.load(open(out + "/plan.json"))
warmup = int(warmup)
steps = [json.loads(l) for l in open(out + "/run.jsonl")] if __import__("os").path.exists(out + "/run.jsonl") else []
steps = [s for s in steps if "step" in s and "skipped_steps" not in s]
timed = steps[warmup:]
polls = [json.loads(l) for l in open(out + "/status.jsonl") if l.strip()]
tps = sum(s.get("tokens_per_s", 0) for s in timed) / len(timed) if timed else 0.0
spill = [(p["t"], p["status"].get("step", 0), p["status"].get("spill", {})) for p in polls if p.get("status")]
io = [(t, st, sp.get("bytes_read", 0), sp.get("bytes_written", 0)) for t, st, sp in spill if sp]
per_step_r = per_step_w = None
if len(io) >= 2 and io[-1][1] > io[0][1]:
    n = io[-1][1] - io[0][1]
    per_step_r, per_step_w = (io[-1][2] - io[0][2]) / n, (io[-1][3] - io[0][3]) / n
s = dict(preset=plan["preset"], params=plan["params"], tokens_per_step=plan["tokens_per_step"],
         worker_exit=int(wrc), steps_done=len(steps), timed_steps=len(timed),
         eps_listen_s=float(listen_s), first_step_s=(steps[0]["time"] - float(launch)) if steps else None,
         tokens_per_s=tps,
         tflops_megatrain_formula=tps * plan["flops_per_token_megatrain"] / 1e12,
         tflops_with_attention=tps * plan["flops_per_token_with_attention"] / 1e12,
         target_tflops=326.0,
         device_mib_peak=max((p.get("gpu_mib", 0) for p in polls), default=0),
         host_rss_peak_bytes=max((p.get("eps_rss", 0) + p.get("worker_rss", 0) for p in polls), default=0),
         eps_rss_peak_bytes=max((p.get("eps_rss", 0) for p in polls), default=0),
         ssd_tier_bytes=plan["ssd_bytes"], ssd_read_per_step=per_step_r, ssd_written_per_step=per_step_w,
         ssd_rate=open(out + "/ssd_rate.txt").read().strip().splitlines(),
         export_hf_bf16_s=float(export_s) if export_s else None, export_not_done=export_why or None,
         megatrain=dict(ran=not mt_why, why_not=mt_why or None, tokens_per_s=float(mt_tps) if mt_tps else None,
                        tflops=float(mt_tflops) if mt_tflops else None,
                        optimizer="torch AdamW (no DeepSpeed)" if mt_torch_adam not in ("", "0") else None,
                        published_tflops_qwen2_5_7b_h100=272.0))
json.dump(s, open(out + "/summary.json", "w"), indent=1)
lines = [f"{k}: {v}" for k, v in s.items() if k != "megatrain"] + [f"megatrain.{k}: {v}" for k, v in s["megatrain"].items()]
open(out + "/summary.txt", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
((wrc == 0)) || exit 1
