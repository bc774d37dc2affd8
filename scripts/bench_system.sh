#!/usr/bin/env bash
# The whole system against l2l's own reference trainer, on one host: one l2l-eps and one
# l2l-worker process (shared memory, CPU backend) train a GPT shape for STEPS steps on
# random tokens, and l2l-train-ref (the whole model in one process, same kernels, same
# AdamW) trains the same job; the two run alternately ROUNDS times. System tokens/s is
# the daemon's (run.jsonl: tokens over the wall time between two steps' StepDone, so the
# worker's data loading, the StepDone round trip and every wait are in it); the
# reference's is its per-step figure. The first step of each run is not counted.
# Prints each run's median, the per-step timeline medians of the system (run.jsonl
# fields, docs/operations.md) and `ratio system/reference_trainer = X` (medians over the
# runs; > 1 means the system is faster). Not a test: prints only.
#
# Environment: L2L_BUILD_DIR (build), THREADS (2), STEPS (6), ROUNDS (3), SHAPE (S2:
# V=256 L=6 C=384 H=6 T=256 B=8; S0: V=256 L=4 C=128 H=4 T=128 B=8, the quickstart's
# `small`), M (1 micro-batch per step), WORKER_ARGS (extra l2l-worker flags).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${L2L_BUILD_DIR:-build}"
THREADS="${THREADS:-2}" STEPS="${STEPS:-6}" ROUNDS="${ROUNDS:-3}" SHAPE="${SHAPE:-S2}" M="${M:-1}"
case "$SHAPE" in
  S2) V=256 L=6 C=384 H=6 T=256 B=8 ;;
  S0) V=256 L=4 C=128 H=4 T=128 B=8 ;;
  *) echo "bench_system.sh: unknown SHAPE $SHAPE (S2 or S0)" >&2; exit 1 ;;
esac
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
tmp=$(mktemp -d /tmp/l2l-bench-system.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
python3 scripts/random_tokens.py "$tmp/train.bin" $((1 << 20)) 256 1
cat > "$tmp/job.yaml" <<YAML
model: {vocab_size: $V, seq_len: $T, d_model: $C, n_layer: $L, n_head: $H, d_ff: $((4 * C)), tied_embeddings: true}
optim: {lr: 1.0e-3, warmup_steps: 2, total_steps: $STEPS, grad_clip: 1.0, weight_decay: 0.1}
train: {steps: $STEPS, micro_batch_size: $B, micro_batches: $M, log_every: 1, clip: none}
data: {train_path: $tmp/train.bin}
YAML

system() {
  local dir="$tmp/sys-$1"
  mkdir -p "$dir"
  "$BUILD_DIR/bin/l2l-eps" --config configs/eps.yaml --job "$tmp/job.yaml" --state-dir "$dir" \
    --job-id "bsys$$x$1" > "$dir/eps.log" 2>&1 &
  local eps=$!
  for _ in $(seq 300); do [[ -s "$dir/eps.port" ]] && break; sleep 0.1; done
  [[ -s "$dir/eps.port" ]] || { echo "l2l-eps did not start:"; cat "$dir/eps.log"; exit 1; }
  "$BUILD_DIR/bin/l2l-worker" --eps "127.0.0.1:$(cat "$dir/eps.port")" --threads "$THREADS" \
    ${WORKER_ARGS:-} > "$dir/worker.log" 2>&1
  kill -TERM "$eps"; wait "$eps" || true
  python3 - "$dir/run.jsonl" <<'PY'
import json, statistics as st, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if "tokens_per_s" in r][1:]
keys = [k for k in rows[0] if k.endswith("_s") and k != "tokens_per_s"]
print("system tok_s %.1f " % st.median(r["tokens_per_s"] for r in rows) +
      " ".join("%s %.4f" % (k, st.median(r[k] for r in rows if k in r)) for k in keys))
PY
}

reference() {
  "$BUILD_DIR/bin/l2l-train-ref" --config "$tmp/job.yaml" --threads "$THREADS" --sample-tokens 0 \
    --out "$tmp/ref-out" > "$tmp/ref.log" 2>&1
  python3 - "$tmp/ref.log" <<'PY'
import re, statistics as st, sys
v = [float(m) for m in re.findall(r"\| tok/s (\S+)", open(sys.argv[1]).read())][1:]
print("reference tok_s %.1f" % st.median(v))
PY
}

echo "machine: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) cores); shape $SHAPE V=$V L=$L C=$C H=$H T=$T B=$B M=$M; threads $THREADS"
for r in $(seq "$ROUNDS"); do
  echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
  reference
  system "$r"
done | tee "$tmp/results"
python3 - "$tmp/results" <<'PY'
import statistics as st, sys
rows = {"system": [], "reference": []}
for line in open(sys.argv[1]):
    f = line.split()
    if f and f[0] in rows: rows[f[0]].append(float(f[2]))
s, r = st.median(rows["system"]), st.median(rows["reference"])
print("system median tok/s %.1f over %d runs; reference median tok/s %.1f over %d runs" % (s, len(rows["system"]), r, len(rows["reference"])))
print("ratio system/reference_trainer = %.3f" % (s / r))
PY
