#!/usr/bin/env bash
# Honest CPU peers, one command: l2l against the PyTorch (2.x, from PyPI: MKL + oneDNN
# inside) and DeepSpeed a user installs, measured in one run on the same threads. Bench
# only, never CI: prints measurements and ratios, never fails on speed.
#
#   1. AdamW, fp32 params/grads/moments, N params, no published copy: l2l-eps's update
#      (l2l-bench-eps: exact arithmetic as the pipeline runs it, and the fast arithmetic)
#      vs torch.optim.AdamW(fused=True), (foreach=True) and DeepSpeedCPUAdam; and l2l's
#      fraction of the memory bound measured with the update's own traffic.
#      And the daemon's whole per-layer job (JOB_GRADS=2 workers' gradients summed, AdamW,
#      the bf16 copy): l2l-eps's one pass vs the peers' add + step + cast.
#   2. The worker's compute step (l2l-bench-train: the reference trainer's forward +
#      backward of one micro-batch, the worker's kernels without the relay) vs torch eager
#      and torch.compile, on GPT-2-like shapes:
#        S1: V=50257 L=4 C=384 H=6 T=256 B=4 (the LM head dominates)
#        S2: V=256   L=6 C=384 H=6 T=256 B=8 (the blocks dominate)
#      and on SmolLM2-135M's Llama architecture (SmolLM2: V=49152 L=30 C=576, 9 query / 3
#      key-value heads, SwiGLU F=1536, RoPE, RMSNorm, tied head; T=256 B=4; random weights)
#      against the same model written in PyTorch (scaled_dot_product_attention, as
#      Hugging Face's sdpa path runs it),
#      and, where the CPU has AVX512_BF16 (BF16=auto, the default; 1 forces, 0 skips), the
#      same in bf16 compute: l2l-bench-train --compute bf16 (bf16 GEMM operands, fp32
#      accumulation, fp32 masters) vs torch eager / torch.compile with the forward under
#      torch.autocast("cpu", dtype=torch.bfloat16): `ratio worker_S1_bf16/torch_eager_bf16`,
#      `.../torch_compile_bf16`, and l2l's own `ratio worker_S1_bf16/worker_S1` (bf16 vs fp32).
#   3. The whole system (l2l-eps + l2l-worker, shm) vs l2l's reference trainer on S2
#      (scripts/bench_system.sh: alternating runs, the daemon's tokens/s, the per-step
#      timeline medians), printed as `ratio system/reference_trainer = X`.
#   4. LoRA (LORA=1): SmolLM2-135M's shape (random weights, fp32), r=16 all-linear
#      (alpha 32, dropout 0), B=4 T=256, against Hugging Face PEFT 0.13.2's LoraModel on
#      transformers' LlamaForCausalLM (sdpa, eager; peers_torch.py peft_llama): l2l's
#      reference trainer's forward + backward (l2l-bench-train on the job with the lora
#      section: the worker's kernels and LoRA code, no relay) vs PEFT's forward + backward
#      (`ratio lora_worker_SmolLM2/peft_fwdbwd`), and the whole system's step (l2l-eps +
#      one l2l-worker, scripts/bench_lora.sh MODEL=preset:smollm2-135m MODES=fp32: relay,
#      AdamW on the adapters, every wait; the daemon's tokens/s) vs PEFT's step with
#      torch.optim.AdamW(fused) on the adapters (`ratio lora_system_SmolLM2/peft_step`).
#
# Every comparison prints `ratio NAME = X` (X > 1: l2l is faster), from medians; the
# worker step's l2l side is run before and after its peer (the mean of both medians).
# Environment: L2L_BUILD_DIR (default build; needs bin/l2l-bench-eps and
# bin/l2l-bench-train), THREADS (2), ITERS (AdamW steps, 10), GPT_ITERS (7),
# ADAMW_PARAMS (33554432), JOB_GRADS (2), SHAPES ("S1 S2 SmolLM2"; empty: none), ADAMW (1; 0 skips AdamW),
# SYSTEM (1; 0 skips the system vs reference trainer; SYSTEM_ROUNDS 3, SYSTEM_STEPS 5),
# RECOMPUTE (empty: the config's train.recompute; always | never | auto: passed to
# l2l-bench-train --recompute), LORA (1; 0 skips the LoRA vs PEFT section; LORA_STEPS 5:
# the system's steps, the first not counted). The venv: scripts/bench_peers_venv.sh
# (~/.cache/l2l/peers-venv, built on first use: a ~5 GB download).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${L2L_BUILD_DIR:-build}"
THREADS="${THREADS:-2}" ITERS="${ITERS:-10}" GPT_ITERS="${GPT_ITERS:-7}"
ADAMW_PARAMS="${ADAMW_PARAMS:-33554432}" SHAPES="${SHAPES-S1 S2 SmolLM2}" ADAMW="${ADAMW:-1}"
BF16="${BF16:-auto}"
if [[ "$BF16" == auto ]]; then
  if grep -qw avx512_bf16 /proc/cpuinfo; then BF16=1; else BF16=0; fi
fi
for b in l2l-bench-eps l2l-bench-train; do
  [[ -x "$BUILD_DIR/bin/$b" ]] || { echo "bench_peers.sh: $BUILD_DIR/bin/$b missing: build it first (cmake --build $BUILD_DIR --target $b)" >&2; exit 1; }
done
PY=$(bash scripts/bench_peers_venv.sh)
# Both sides: the same thread count, OpenMP threads that sleep when idle (l2l's binaries
# default to it; torch gets it explicitly), DeepSpeed's CPU op builder.
export OMP_NUM_THREADS="$THREADS" OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}" DS_ACCELERATOR=cpu
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-$(dirname "$PY")/../inductor-cache}"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) cores), $THREADS threads, load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "command: THREADS=$THREADS ITERS=$ITERS GPT_ITERS=$GPT_ITERS ADAMW_PARAMS=$ADAMW_PARAMS SHAPES=\"$SHAPES\" ADAMW=$ADAMW SYSTEM=${SYSTEM:-1} BF16=$BF16 LORA=${LORA:-1} bash scripts/bench_peers.sh"

# RESULT lines -> value of one name.
val() { sed -n "s/^RESULT $2 = //p" "$1" | tail -1; }
ratio() {  # ratio NAME OURS THEIRS
  if [[ -n "$2" && -n "$3" ]]; then
    awk -v n="$1" -v a="$2" -v b="$3" 'BEGIN { printf "ratio %s = %.2f\n", n, a / b }'
  else
    echo "ratio $1 = n/a (a side failed; see above)"
  fi
}

if [[ "$ADAMW" == 1 ]]; then
echo "---- AdamW: $ADAMW_PARAMS fp32 params ----"
"$BUILD_DIR/bin/l2l-bench-eps" --threads "$THREADS" --iters "$ITERS" --params "$ADAMW_PARAMS" \
  --adamw-only --no-torch --no-publish | tee "$TMP/l2l-adamw"
"$PY" bench/peers_torch.py adamw "$ADAMW_PARAMS" "$ITERS" 2>"$TMP/py-adamw.err" | tee "$TMP/py-adamw" \
  || { echo "torch/DeepSpeed AdamW failed:"; tail -20 "$TMP/py-adamw.err"; }
for arith in exact fast; do
  ours=$(val "$TMP/l2l-adamw" "adamw_${arith}_median_params_per_s")
  ratio "adamw_${arith}/torch_fused" "$ours" "$(val "$TMP/py-adamw" torch_adamw_fused_median)"
  ratio "adamw_${arith}/torch_foreach" "$ours" "$(val "$TMP/py-adamw" torch_adamw_foreach_median)"
  ratio "adamw_${arith}/deepspeed_cpu_adam" "$ours" "$(val "$TMP/py-adamw" deepspeed_cpu_adam_median)"
  bound=$(val "$TMP/l2l-adamw" adamw_bound_params_per_s)
  if [[ -n "$ours" && -n "$bound" ]]; then
    awk -v n="adamw_${arith}" -v a="$ours" -v b="$bound" \
      'BEGIN { printf "fraction %s of the measured memory bound = %.2f\n", n, a / b }'
  fi
done
# The daemon's whole per-layer job: JOB_GRADS workers' gradients summed, AdamW, the bf16
# copy the workers fetch. l2l-eps does it in one pass over memory; a user of the peers
# sums into p.grad, steps, and casts (peers_torch.py adamw_job).
JOB_GRADS="${JOB_GRADS:-2}"
echo "---- the daemon's per-layer job: $JOB_GRADS gradients summed + AdamW + bf16 copy, $ADAMW_PARAMS params ----"
"$BUILD_DIR/bin/l2l-bench-eps" --threads "$THREADS" --iters "$ITERS" --params "$ADAMW_PARAMS" \
  --adamw-only --no-torch --grads "$JOB_GRADS" | tee "$TMP/l2l-job"
"$PY" bench/peers_torch.py adamw_job "$ADAMW_PARAMS" "$ITERS" "$JOB_GRADS" 2>"$TMP/py-job.err" | tee "$TMP/py-job" \
  || { echo "torch/DeepSpeed AdamW job failed:"; tail -20 "$TMP/py-job.err"; }
ours=$(val "$TMP/l2l-job" adamw_exact_median_params_per_s)
ratio "adamw_job/torch_fused_job" "$ours" "$(val "$TMP/py-job" torch_adamw_fused_job_median)"
ratio "adamw_job/deepspeed_cpu_adam_job" "$ours" "$(val "$TMP/py-job" deepspeed_cpu_adam_job_median)"
bound=$(val "$TMP/l2l-job" adamw_bound_params_per_s)
[[ -n "$ours" && -n "$bound" ]] && awk -v a="$ours" -v b="$bound" \
  'BEGIN { printf "fraction adamw_job of the measured memory bound = %.2f\n", a / b }'
fi

# The worker step runs before and after its torch peer; its figure is the mean of the
# two medians, so a guest whose speed drifts during the run (a shared host) moves both
# sides alike instead of only the one measured later.
l2l_train() {  # l2l_train OUT [extra flags]: l2l-bench-train on $TMP/$shape.yaml
  local out="$1"
  shift
  "$BUILD_DIR/bin/l2l-bench-train" --config "$TMP/$shape.yaml" --B "$B" --T "$T" --iters "$GPT_ITERS" \
    --warmup 2 --threads "$THREADS" ${RECOMPUTE:+--recompute "$RECOMPUTE"} "$@" | tee "$out" || true
}
sandwich() {  # sandwich BEFORE AFTER: the mean of the two runs' median tok/s
  local a b
  a=$(sed -n 's/.*median tok\/s \([0-9.]*\).*/\1/p' "$1")
  b=$(sed -n 's/.*median tok\/s \([0-9.]*\).*/\1/p' "$2")
  [[ -n "$a" && -n "$b" ]] || return 0
  awk -v a="$a" -v b="$b" 'BEGIN { printf "%.1f", (a + b) / 2 }'
}

for shape in $SHAPES; do
  KV="" FF=""
  case "$shape" in
    S1) V=50257 L=4 C=384 H=6 T=256 B=4 ;;
    S2) V=256 L=6 C=384 H=6 T=256 B=8 ;;
    SmolLM2) V=49152 L=30 C=576 H=9 KV=3 FF=1536 T=256 B=4 ;;  # configs/models/smollm2-135m.yaml
    *) echo "bench_peers.sh: unknown shape $shape (S1, S2 or SmolLM2)" >&2; exit 1 ;;
  esac
  if [[ -n "$KV" ]]; then  # the Llama family (SmolLM2-135M's architecture, random weights)
    echo "---- worker step, $shape: V=$V L=$L C=$C H=$H KV=$KV F=$FF T=$T B=$B ----"
    PEER=(llama "$V" "$L" "$C" "$H" "$KV" "$FF" "$T" "$B")
  else
    echo "---- worker step, $shape: V=$V L=$L C=$C H=$H T=$T B=$B ----"
    PEER=(gpt "$V" "$L" "$C" "$H" "$T" "$B")
  fi
  {
    echo "model:"
    [[ -n "$KV" ]] && echo "  family: llama"
    printf '  vocab_size: %s\n  seq_len: %s\n  d_model: %s\n  n_layer: %s\n  n_head: %s\n  d_ff: %s\n' \
      "$V" "$T" "$C" "$L" "$H" "${FF:-$((4 * C))}"
    [[ -n "$KV" ]] && printf '  n_kv_heads: %s\n  rope_theta: 100000\n  rms_norm_eps: 1.0e-5\n' "$KV"
    echo "  tied_embeddings: true"
  } > "$TMP/$shape.yaml"
  l2l_train "$TMP/l2l-$shape"
  "$PY" bench/peers_torch.py "${PEER[@]}" "$GPT_ITERS" 2>"$TMP/py-$shape.err" \
    | tee "$TMP/py-$shape" || { echo "torch $shape failed:"; tail -20 "$TMP/py-$shape.err"; }
  l2l_train "$TMP/l2l-$shape-after"
  ours=$(sandwich "$TMP/l2l-$shape" "$TMP/l2l-$shape-after")
  echo "l2l worker tok/s, mean of the medians before and after the peer = ${ours:-n/a}"
  ratio "worker_$shape/torch_eager" "$ours" "$(val "$TMP/py-$shape" torch_eager_median)"
  ratio "worker_$shape/torch_compile" "$ours" "$(val "$TMP/py-$shape" torch_compile_median)"
  if [[ "$BF16" == 1 ]]; then
    echo "---- worker step, $shape, bf16 compute (torch: autocast bf16) ----"
    l2l_train "$TMP/l2l-$shape-bf16" --compute bf16
    "$PY" bench/peers_torch.py "${PEER[@]}" "$GPT_ITERS" bf16 2>"$TMP/py-$shape-bf16.err" \
      | tee "$TMP/py-$shape-bf16" || { echo "torch $shape bf16 failed:"; tail -20 "$TMP/py-$shape-bf16.err"; }
    l2l_train "$TMP/l2l-$shape-bf16-after" --compute bf16
    ours16=$(sandwich "$TMP/l2l-$shape-bf16" "$TMP/l2l-$shape-bf16-after")
    echo "l2l worker bf16 tok/s, mean of the medians before and after the peer = ${ours16:-n/a}"
    ratio "worker_${shape}_bf16/torch_eager_bf16" "$ours16" "$(val "$TMP/py-$shape-bf16" torch_eager_bf16_median)"
    ratio "worker_${shape}_bf16/torch_compile_bf16" "$ours16" "$(val "$TMP/py-$shape-bf16" torch_compile_bf16_median)"
    ratio "worker_${shape}_bf16/worker_${shape}" "$ours16" "$ours"
  fi
done

if [[ "${SYSTEM:-1}" == 1 ]]; then
  echo "---- whole system vs reference trainer, S2 ----"
  L2L_BUILD_DIR="$BUILD_DIR" THREADS="$THREADS" ROUNDS="${SYSTEM_ROUNDS:-3}" STEPS="${SYSTEM_STEPS:-5}" SHAPE=S2 \
    bash scripts/bench_system.sh || echo "ratio system/reference_trainer = n/a (bench_system.sh failed; see above)"
fi

if [[ "${LORA:-1}" == 1 ]]; then
  shape=SmolLM2-lora V=49152 L=30 C=576 H=9 KV=3 FF=1536 T=256 B=4 LR=16
  echo "---- LoRA vs PEFT, SmolLM2-135M shape: V=$V L=$L C=$C H=$H KV=$KV F=$FF T=$T B=$B, r=$LR all-linear ----"
  printf 'model:\n  family: llama\n  vocab_size: %s\n  seq_len: %s\n  d_model: %s\n  n_layer: %s\n  n_head: %s\n  d_ff: %s\n  n_kv_heads: %s\n  rope_theta: 100000\n  rms_norm_eps: 1.0e-5\n  tied_embeddings: true\nlora: {r: %s, alpha: %s, target: all-linear, base_dtype: fp32}\n' \
    "$V" "$T" "$C" "$L" "$H" "$FF" "$KV" "$LR" "$((2 * LR))" > "$TMP/$shape.yaml"
  l2l_train "$TMP/l2l-$shape"
  "$PY" bench/peers_torch.py peft_llama "$V" "$L" "$C" "$H" "$KV" "$FF" "$T" "$B" "$GPT_ITERS" "$LR" \
    2>"$TMP/py-$shape.err" | tee "$TMP/py-$shape" || { echo "PEFT failed:"; tail -20 "$TMP/py-$shape.err"; }
  l2l_train "$TMP/l2l-$shape-after"
  ours=$(sandwich "$TMP/l2l-$shape" "$TMP/l2l-$shape-after")
  echo "l2l LoRA worker step tok/s, mean of the medians before and after PEFT = ${ours:-n/a}"
  ratio "lora_worker_SmolLM2/peft_fwdbwd" "$ours" "$(val "$TMP/py-$shape" peft_fwdbwd_median)"
  L2L_BUILD_DIR="$BUILD_DIR" THREADS="$THREADS" STEPS="${LORA_STEPS:-5}" B="$B" T="$T" R="$LR" MODES=fp32 \
    MODEL=preset:smollm2-135m PUBLISH=f32 OUT="$TMP/lora-system" bash scripts/bench_lora.sh | tee "$TMP/l2l-lora-system" \
    || echo "bench_lora.sh failed; see above"
  ratio "lora_system_SmolLM2/peft_step" "$(val "$TMP/l2l-lora-system" fp32_tok_s)" "$(val "$TMP/py-$shape" peft_step_median)"
fi
