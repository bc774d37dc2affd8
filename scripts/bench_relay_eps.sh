#!/usr/bin/env bash
# Relay over the real daemon: one l2l-eps and one l2l-worker process (shared memory,
# CPU backend) train the job for STEPS steps on random tokens; prints the worker's mean
# step time, tokens/s and time waiting for layers (the EPS's exposed update and commit)
# over the steps after the first. With BASE_BUILD_DIR set (another build of
# l2l, e.g. the commit before a change) the two builds run alternately ROUNDS times each
# on the same machine and the script prints the ratio this / base. Not a test: prints
# only. Results go to docs/performance.md.
#
# Environment: L2L_BUILD_DIR (build), BASE_BUILD_DIR (unset), THREADS (2), STEPS (20),
# ROUNDS (3), PRESET (small: configs/models/small.yaml), CLIP (none | per_layer | global),
# B (8), M (2), MODEL_KEYS ("": keys beside the preset, e.g. "d_model: 512, d_ff: 2048").
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${L2L_BUILD_DIR:-build}"
THREADS="${THREADS:-2}" STEPS="${STEPS:-20}" ROUNDS="${ROUNDS:-3}" PRESET="${PRESET:-small}"
CLIP="${CLIP:-none}" B="${B:-8}" M="${M:-2}"
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
tmp=$(mktemp -d /tmp/l2l-bench-relay-eps.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
# Random byte tokens (the model's vocabulary is 256): enough for STEPS steps.
python3 scripts/random_tokens.py "$tmp/train.bin" $((1 << 20)) 256 1

cat > "$tmp/job.yaml" <<YAML
model:
  preset: $PWD/configs/models/$PRESET.yaml
$(echo "${MODEL_KEYS:-}" | tr ',' '\n' | sed -n 's/^ *\(..*\)/  \1/p')
optim: {lr: 3.0e-3, warmup_steps: 2, total_steps: $STEPS, grad_clip: 1.0, weight_decay: 0.1}
train: {steps: $STEPS, micro_batch_size: $B, micro_batches: $M, log_every: 1, clip: $CLIP}
data: {train_path: $tmp/train.bin}
YAML

# run BUILD TAG: prints "TAG step_s S tok_s T steps N".
run() {
  local build="$1" tag="$2" dir="$tmp/$2-$RANDOM"
  mkdir -p "$dir"
  "$build/bin/l2l-eps" --config configs/eps.yaml --job "$tmp/job.yaml" --state-dir "$dir" \
    --job-id "bench$RANDOM" > "$dir/eps.log" 2>&1 &
  local eps=$!
  for _ in $(seq 100); do [[ -s "$dir/eps.port" ]] && break; sleep 0.1; done
  "$build/bin/l2l-worker" --eps "127.0.0.1:$(cat "$dir/eps.port")" --threads "$THREADS" > "$dir/worker.log" 2>&1
  kill -TERM "$eps"; wait "$eps" || true
  python3 - "$dir/worker.log" "$tag" <<'PY'
import json, re, sys
pat = r"tok/s (\S+) step_s (\S+) wait_layer (\S+)"
steps = [tuple(map(float, m.groups())) for m in re.finditer(pat, open(sys.argv[1]).read())][1:]
mean = lambda k: sum(s[k] for s in steps) / len(steps)
print(f"{sys.argv[2]} step_s {mean(1):.4f} tok_s {mean(0):.0f} wait_layer_s {mean(2):.4f} steps {len(steps)}")
PY
}

echo "machine: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) cores), load: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$ROUNDS"); do
  if [[ -n "${BASE_BUILD_DIR:-}" ]]; then run "$BASE_BUILD_DIR" base; fi
  run "$BUILD_DIR" this
done | tee "$tmp/results"
python3 - "$tmp/results" <<'PY'
import sys, collections
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    rows[f[0]].append((float(f[2]), float(f[4]), float(f[6])))
for tag, v in rows.items():
    m = lambda k: sum(x[k] for x in v) / len(v)
    print(f"{tag}: mean step_s {m(0):.4f} (min {min(x[0] for x in v):.4f}) tok/s {m(1):.0f} "
          f"wait_layer_s {m(2):.4f} over {len(v)} runs")
if "base" in rows:
    t = sum(x[1] for x in rows["this"]) / len(rows["this"]); b = sum(x[1] for x in rows["base"]) / len(rows["base"])
    print(f"ratio this / base tokens/s: {t / b:.3f}")
PY
