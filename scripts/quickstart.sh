#!/usr/bin/env bash
# Quickstart: installs dependencies, builds l2l, makes a small English corpus from the
# fortunes-min Debian package, tokenizes it (byte level) and trains the `small` demo GPT
# with configs/quickstart.yaml, ending with a generated sample. About 3-5 minutes on 2
# CPU cores after the build.
#
# Today the training runs in one process (l2l-train-ref, the reference trainer); the
# run_training function below is the one place to swap in the daemon + workers.
#
# Environment: L2L_BUILD_DIR (default build), QUICKSTART_STEPS (default: the config's),
# QUICKSTART_THREADS (default: all cores), L2L_SKIP_SETUP=1 to skip scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
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

# ---- training ----
run_training() {
  local args=(--config "$CONFIG" --out "$OUT_DIR" --prompt "The ")
  if [ -n "${QUICKSTART_STEPS:-}" ]; then args+=(--steps "$QUICKSTART_STEPS"); fi
  if [ -n "${QUICKSTART_THREADS:-}" ]; then args+=(--threads "$QUICKSTART_THREADS"); fi
  "$BUILD_DIR/bin/l2l-train-ref" "${args[@]}"
}
start=$(date +%s)
run_training
echo "quickstart: done in $(( $(date +%s) - start )) s; model in $OUT_DIR/model.safetensors"
