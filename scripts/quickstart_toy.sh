#!/usr/bin/env bash
# Toy quickstart (scripts/quickstart.sh --toy): installs dependencies, builds l2l, makes a small English corpus from the
# fortunes-min Debian package, tokenizes it (byte level) and trains the `small` demo GPT
# with configs/quickstart.yaml, ending with a generated sample. About 3-5 minutes on 2
# CPU cores after the build.
#
# Training runs the real system: the l2l-eps daemon and one l2l-worker (CPU), watched
# with l2lctl; QUICKSTART_REFERENCE=1 uses the single-process reference trainer instead.
#
# Environment: L2L_BUILD_DIR (default build), QUICKSTART_STEPS (default: the config's),
# QUICKSTART_THREADS (default: all cores), L2L_SKIP_SETUP=1 to skip scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/relay_run.sh
source scripts/relay_run.sh
BUILD_DIR="${L2L_BUILD_DIR:-build}"
DATA_DIR=data/quickstart
OUT_DIR=out/quickstart
CONFIG=configs/quickstart.yaml

if [ "${L2L_SKIP_SETUP:-0}" != 1 ]; then bash scripts/setup.sh; fi
L2L_BUILD_DIR="$BUILD_DIR" bash scripts/build.sh

# ---- corpus: the text files of fortunes-min (not the .dat indexes / .u8 links) ----
FORTUNES=/usr/share/games/fortunes
texts=()
for f in "$FORTUNES"/*; do
  case "$f" in *.dat|*.u8) continue ;; esac
  [ -f "$f" ] && [ ! -L "$f" ] && texts+=("$f")
done
if [ ${#texts[@]} -eq 0 ]; then
  echo "quickstart: no corpus in $FORTUNES; install the fortunes-min package (bash scripts/setup.sh)" >&2
  exit 1
fi
mkdir -p "$DATA_DIR"
cat "${texts[@]}" > "$DATA_DIR/corpus.txt"
echo "quickstart: corpus $DATA_DIR/corpus.txt ($(wc -c < "$DATA_DIR/corpus.txt") bytes from ${#texts[@]} files)"
"$BUILD_DIR/bin/l2l-tokenize" "$DATA_DIR/corpus.txt" "$DATA_DIR/train.bin" \
  --val-fraction 0.1 --val-output "$DATA_DIR/val.bin"

# ---- training: the real system (l2l-eps daemon + one l2l-worker on the CPU) ----
# The daemon holds the weights and AdamW state; the worker relays the model through its
# device one layer at a time. Progress comes from `l2lctl watch`; at the end the daemon
# checkpoints, exports safetensors and stops. QUICKSTART_REFERENCE=1 trains with the
# single-process reference trainer (l2l-train-ref) instead.
run_training() {
  if [ "${QUICKSTART_REFERENCE:-0}" = 1 ]; then
    local args=(--config "$CONFIG" --out "$OUT_DIR" --prompt "The ")
    if [ -n "${QUICKSTART_STEPS:-}" ]; then args+=(--steps "$QUICKSTART_STEPS"); fi
    if [ -n "${QUICKSTART_THREADS:-}" ]; then args+=(--threads "$QUICKSTART_THREADS"); fi
    "$BUILD_DIR/bin/l2l-train-ref" "${args[@]}"
    return
  fi
  local wargs=() wopts=()
  if [ -n "${QUICKSTART_STEPS:-}" ]; then wargs+=(--steps "$QUICKSTART_STEPS"); wopts+=(--steps "$QUICKSTART_STEPS"); fi
  if [ -n "${QUICKSTART_THREADS:-}" ]; then wargs+=(--threads "$QUICKSTART_THREADS"); fi
  RELAY_EPS_ARGS=(--allow-data "$PWD/$DATA_DIR")  # the config's data lives in data/, not configs/
  relay_start "$BUILD_DIR/bin" "$CONFIG" "$OUT_DIR" "${wargs[@]}"
  relay_wait "${wopts[@]}"
  tail -1 "$OUT_DIR/worker.log"
  "${RELAY_CTL[@]}" checkpoint
  "${RELAY_CTL[@]}" export --format safetensors model.safetensors  # lands in the state dir
  mv "$RELAY_STATE/model.safetensors" "$OUT_DIR/model.safetensors"
  relay_stop
  echo "quickstart: checkpoints in $RELAY_STATE/checkpoints, logs in $OUT_DIR/{eps,worker}.log"
}
mkdir -p "$OUT_DIR"
start=$(date +%s)
run_training
echo "quickstart: trained in $(( $(date +%s) - start )) s"

# ---- what the model learned: a sample, and the run's plot ----
"$BUILD_DIR/bin/l2l-sample" "$OUT_DIR/model.safetensors" --prompt "The " --tokens 300
RUN_LOG="$OUT_DIR/eps-state/run.jsonl"
if [ -s "$RUN_LOG" ]; then
  /usr/bin/python3 scripts/plot_run.py "$RUN_LOG" "$OUT_DIR/run.png"
fi
echo "quickstart: outputs"
echo "  model (safetensors, Hugging Face GPT-2 names): $OUT_DIR/model.safetensors"
[ -d "$OUT_DIR/eps-state/checkpoints" ] && echo "  checkpoints (resume with l2l-eps --resume DIR):  $OUT_DIR/eps-state/checkpoints"
[ -s "$RUN_LOG" ] && echo "  run log: $RUN_LOG    plot: $OUT_DIR/run.png"
echo "  logs: $OUT_DIR/eps.log $OUT_DIR/worker.log"
