#!/usr/bin/env bash
# LoRA against full fine-tuning through the whole system, on one host: one l2l-eps and one
# CPU l2l-worker (shared memory) train SmolLM2-135M (the GGUF scripts/fetch_models.sh
# fetches, `model.from`) for STEPS steps on random tokens, once per MODE:
#   full                 every parameter trains (no lora section)
#   fp32 | bf16 | q8 | q4  lora: {r: R, alpha: 2R, target: all-linear, base_dtype: MODE}
# For each run it prints the daemon's own arithmetic (its "host budget for ..." log line),
# the daemon's measured peak RSS (VmHWM from /proc/PID/status, read after the worker has
# finished and before the daemon is stopped, so the exit checkpoint is not in it; its RSS
# then, split into anonymous / shared-memory / file pages, is printed too), that
# peak over the model's parameters (B/param), the worker's peak RSS (/usr/bin/time -f %M)
# and the daemon's tokens/s (run.jsonl, median over the steps after the first). Then
# `ratio lora_MODE/full = X` (tokens/s; > 1: LoRA is faster). Bench only, never CI.
#
# Environment: L2L_BUILD_DIR (build; needs bin/l2l-eps, bin/l2l-worker), THREADS (2, the
# worker's), STEPS (4), B (4), T (128), R (16), MODES ("full bf16 q8 q4"), ROUNDS (1: each
# mode run ROUNDS times, alternating), MODEL (default: `scripts/fetch_models.sh smollm2`;
# `preset:NAME`: the preset's shape with random weights, e.g. preset:smollm2-135m),
# PUBLISH (bf16: the job's publish_dtype), OUT (runs/bench-lora: each run's eps.log,
# worker.log, run.jsonl and the job are kept there; runs/ is gitignored), VOCAB (49152:
# the random tokens' range) and P (134515008: the parameters B/param divides by), both
# SmolLM2-135M's: set them for another model.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${L2L_BUILD_DIR:-build}"
THREADS="${THREADS:-2}" STEPS="${STEPS:-4}" B="${B:-4}" T="${T:-128}" R="${R:-16}"
MODES="${MODES:-full bf16 q8 q4}" ROUNDS="${ROUNDS:-1}" PUBLISH="${PUBLISH:-bf16}"
OUT="${OUT:-runs/bench-lora}" VOCAB="${VOCAB:-49152}" P="${P:-134515008}"
for b in l2l-eps l2l-worker; do
  [[ -x "$BUILD_DIR/bin/$b" ]] || { echo "bench_lora.sh: $BUILD_DIR/bin/$b missing: build it first" >&2; exit 1; }
done
MODEL="${MODEL:-$(bash scripts/fetch_models.sh smollm2)}"
if [[ "$MODEL" == preset:* ]]; then
  MODEL_YAML="model: {preset: ${MODEL#preset:}}" MODEL_DIR=$PWD
  export L2L_CONFIG_DIR="$PWD/configs"  # the preset is this tree's configs/models/NAME.yaml
else
  [[ -f "$MODEL" || -d "$MODEL" ]] || { echo "bench_lora.sh: model $MODEL not found" >&2; exit 1; }
  MODEL=$(realpath "$MODEL")
  MODEL_YAML="model: {from: $MODEL}" MODEL_DIR=$(dirname "$MODEL")
fi
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
mkdir -p "$OUT"
OUT=$(realpath "$OUT")
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
python3 scripts/random_tokens.py "$OUT/train.bin" $((1 << 20)) "$VOCAB" 1

echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) cores), $(free -g | awk '/^Mem:/ {print $2}') GiB RAM; worker threads $THREADS"
echo "command: THREADS=$THREADS STEPS=$STEPS B=$B T=$T R=$R MODES=\"$MODES\" ROUNDS=$ROUNDS PUBLISH=$PUBLISH bash scripts/bench_lora.sh"
echo "model: $MODEL"

run() {  # run MODE ROUND
  local mode=$1 dir="$OUT/$1-$2"
  rm -rf "$dir"
  mkdir -p "$dir"
  {
    echo "$MODEL_YAML"
    echo "optim: {lr: 1.0e-4, warmup_steps: 1, total_steps: $STEPS, weight_decay: 0.0}"
    echo "train: {steps: $STEPS, micro_batch_size: $B, micro_batches: 1, seq_len: $T, log_every: 1, checkpoint_every: 0}"
    echo "data: {train_path: $OUT/train.bin}"
    echo "publish_dtype: $PUBLISH"
    [[ "$mode" == full ]] || echo "lora: {r: $R, alpha: $((2 * R)), target: all-linear, base_dtype: $mode}"
  } > "$dir/job.yaml"
  local load
  load=$(cut -d' ' -f1-3 /proc/loadavg)
  "$BUILD_DIR/bin/l2l-eps" --config configs/eps.yaml --job "$dir/job.yaml" --state-dir "$dir" \
    --allow-models "$MODEL_DIR" --allow-data "$OUT" --job-id "blora$$$mode$2" > "$dir/eps.log" 2>&1 &
  local eps=$!
  for _ in $(seq 1200); do [[ -s "$dir/eps.port" ]] && break; kill -0 "$eps" 2>/dev/null || break; sleep 0.1; done
  [[ -s "$dir/eps.port" ]] || { echo "l2l-eps did not start ($mode):"; tail -5 "$dir/eps.log"; return 1; }
  /usr/bin/time -f "%M" -o "$dir/worker.maxrss" "$BUILD_DIR/bin/l2l-worker" \
    --eps "127.0.0.1:$(cat "$dir/eps.port")" --threads "$THREADS" > "$dir/worker.log" 2>&1 \
    || { echo "l2l-worker failed ($mode):"; tail -5 "$dir/worker.log"; }
  grep -E '^(VmHWM|VmRSS|RssAnon|RssFile|RssShmem)' "/proc/$eps/status" > "$dir/eps.status" || true
  kill -TERM "$eps"
  wait "$eps" || true
  rm -rf "$dir/checkpoints"  # the exit checkpoint: 1.6 GB for full fine-tuning, not measured
  python3 - "$dir" "$mode" "$load" <<'PY'
import json, re, statistics as st, sys
d, mode, load = sys.argv[1:]
log = open(d + "/eps.log").read()
m = re.search(r"host budget for (\d+) params: .*", log)
budget = m.group(0) if m else "(no host budget line in eps.log)"
status = open(d + "/eps.status").read()
kb = lambda k: int(re.search(k + r":\s+(\d+)", status).group(1)) * 1024
hwm = kb("VmHWM")
wrss = int(open(d + "/worker.maxrss").read().split()[-1]) * 1024
rows = [json.loads(l) for l in open(d + "/run.jsonl") if l.strip()]
tps = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r][1:]
print("%s budget: %s" % (mode, budget))
print("%s eps at the end: VmRSS %.1f MB = anonymous %.1f + shared memory %.1f + file %.1f" % (
    mode, kb("VmRSS") / 1e6, kb("RssAnon") / 1e6, kb("RssShmem") / 1e6, kb("RssFile") / 1e6))
print("%s load %s eps VmHWM %.1f MB; worker peak RSS %.1f MB; tok/s %s (median %.1f)" % (
    mode, load, hwm / 1e6, wrss / 1e6, " ".join("%.1f" % x for x in tps), st.median(tps) if tps else float("nan")))
print("RESULT %s_eps_hwm_bytes = %d" % (mode, hwm))
print("RESULT %s_tok_s = %.2f" % (mode, st.median(tps) if tps else float("nan")))
PY
}

for r in $(seq "$ROUNDS"); do
  for mode in $MODES; do run "$mode" "$r"; done
done | tee "$OUT/results"
python3 - "$OUT/results" "$P" <<'PY'
import collections, re, statistics as st, sys
v = collections.defaultdict(list)
for line in open(sys.argv[1]):
    m = re.match(r"RESULT (\w+?)_(eps_hwm_bytes|tok_s) = (\S+)", line)
    if m: v[(m.group(1), m.group(2))].append(float(m.group(3)))
P = int(sys.argv[2])  # the model's parameters (SmolLM2-135M: configs/models/smollm2-135m.yaml)
order = ["full", "fp32", "bf16", "q8", "q4"]
modes = sorted({k[0] for k in v}, key=lambda m: order.index(m) if m in order else len(order))
for m in modes:
    h, t = st.median(v[(m, "eps_hwm_bytes")]), st.median(v[(m, "tok_s")])
    print("summary %s: eps peak RSS %.1f MB = %.2f B/param (of %d); tok/s %.1f" % (m, h / 1e6, h / P, P, t))
full = v.get(("full", "tok_s"))
for m in modes:
    if m != "full" and full:
        print("ratio lora_%s/full = %.2f" % (m, st.median(v[(m, "tok_s")]) / st.median(full)))
PY
