#!/usr/bin/env bash
# Device-group throughput: one l2l-eps (shared memory) and ONE l2l-worker driving a
# group of n GPUs of this host (`--devices cuda:0,...,cuda:n-1`: each device fetches 1/n
# of every layer, NCCL all-gathers it, gradients are reduce-scattered and each device
# pushes its 1/n; worker/device_group.h) for n = 1, 2, 4, 8 up to the GPUs present.
# Prints per group size the daemon's tokens/s (run.jsonl, first step not counted), the
# per-step timeline medians, and `ratio group_N/group_1 = X` (> 1: the group is faster
# than one device; bandwidth-centric fetch should approach N where the fetch dominates).
# Not a test: prints only. scripts/gpu_check.sh runs it on hosts with 2 or more GPUs.
#
# Environment: L2L_BUILD_DIR (build), STEPS (6), SHAPE (gpt2: V=50257 L=12 C=768 H=12
# T=1024, micro-batch B=4, M=4 micro-batches per step; tiny: the emulator-sized check),
# MAX_DEVICES (all), GROUP_SIZES ("1 2 4 8"), PUBLISH (bf16), GPU_FRACTION (unset: the
# config's optim.gpu_fraction; auto or 0..1: the interleaved optimizer's share). On the CUDA emulator build
# (-DL2L_CUDA=EMU) set L2L_CUDA_EMU_DEVICES=N to pretend N devices (SHAPE=tiny).
set -euo pipefail
cd "$(dirname "$0")/.."
export L2L_CONFIG_DIR="${L2L_CONFIG_DIR:-$PWD/configs}"
BUILD_DIR="${L2L_BUILD_DIR:-build}"
STEPS="${STEPS:-6}" SHAPE="${SHAPE:-gpt2}" PUBLISH="${PUBLISH:-bf16}"
case "$SHAPE" in
  gpt2) MODEL="{vocab_size: 50257, seq_len: 1024, d_model: 768, n_layer: 12, n_head: 12, d_ff: 3072, tied_embeddings: true}"
        V=50257 B=4 M=4 ;;
  tiny) MODEL="{preset: tiny}" V=256 B=2 M=4 ;;
  *) echo "bench_group.sh: unknown SHAPE $SHAPE (gpt2 or tiny)" >&2; exit 1 ;;
esac
for b in l2l-eps l2l-worker; do
  [[ -x "$BUILD_DIR/bin/$b" ]] || { echo "bench_group.sh: $BUILD_DIR/bin/$b missing: build it first" >&2; exit 1; }
done
if [[ -n "${L2L_CUDA_EMU_DEVICES:-}" ]]; then
  NGPU=$L2L_CUDA_EMU_DEVICES
else
  command -v nvidia-smi >/dev/null || { echo "bench_group.sh: nvidia-smi not found (no GPUs; on the emulator set L2L_CUDA_EMU_DEVICES)" >&2; exit 1; }
  NGPU=$(nvidia-smi -L | grep -c '^GPU ' || true)
fi
NGPU=$((${MAX_DEVICES:-$NGPU} < NGPU ? ${MAX_DEVICES:-$NGPU} : NGPU))
((NGPU >= 1)) || { echo "bench_group.sh: no GPUs" >&2; exit 1; }
tmp=$(mktemp -d /tmp/l2l-bench-group.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
python3 scripts/random_tokens.py "$tmp/train.bin" $((1 << 22)) "$V" 1
cat > "$tmp/job.yaml" <<YAML
model: $MODEL
optim: {lr: 1.0e-4, warmup_steps: 1, total_steps: $STEPS, weight_decay: 0.1${GPU_FRACTION:+, gpu_fraction: $GPU_FRACTION}}
train: {steps: $STEPS, micro_batch_size: $B, micro_batches: $M, log_every: 1, mode: sync}
data: {train_path: $tmp/train.bin}
publish_dtype: $PUBLISH
YAML

echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
if [[ -z "${L2L_CUDA_EMU_DEVICES:-}" ]]; then
  echo "machine: $NGPU x $(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 | head -1); topology:"
  nvidia-smi topo -m 2>/dev/null | head -$((NGPU + 1)) || true
else
  echo "machine: the CUDA emulator, $NGPU emulated devices (timings mean nothing)"
fi
echo "shape $SHAPE, micro-batch $B x $M per step, $STEPS steps, publish $PUBLISH, optim.gpu_fraction ${GPU_FRACTION:-default}"

run_group() {  # run_group N -> prints "group N tok_s X <timeline medians>"
  local n=$1 dir="$tmp/g$1" devs=""
  for ((d = 0; d < n; ++d)); do devs+="${devs:+,}cuda:$d"; done
  mkdir -p "$dir"
  "$BUILD_DIR/bin/l2l-eps" --job "$tmp/job.yaml" --state-dir "$dir" --workers 1 \
    --job-id "bgroup$$x$n" > "$dir/eps.log" 2>&1 &
  local eps=$!
  for _ in $(seq 600); do [[ -s "$dir/eps.port" ]] && break; sleep 0.1; done
  [[ -s "$dir/eps.port" ]] || { echo "l2l-eps did not start:"; tail -20 "$dir/eps.log"; return 1; }
  local rc=0
  "$BUILD_DIR/bin/l2l-worker" --eps "127.0.0.1:$(cat "$dir/eps.port")" --devices "$devs" \
    ${GPU_FRACTION:+--device-updates on} > "$dir/worker.log" 2>&1 || rc=$?
  kill -TERM "$eps" 2>/dev/null; wait "$eps" || true
  if ((rc != 0)); then
    echo "group of $n failed: l2l-worker --devices $devs exited with status $rc:"; tail -20 "$dir/worker.log"; return 1
  fi
  # The interleaved optimizer's choice and how many updates the worker's device ran.
  grep -h -o 'optimizer (.*' "$dir/eps.log" | tail -1 | cut -c1-600 || true
  grep -h -o 'device_updates=[0-9]*' "$dir/worker.log" | tail -1 || true
  python3 - "$n" "$dir/run.jsonl" <<'PY'
import json, statistics as st, sys
rows = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
rows = [r for r in rows if "tokens_per_s" in r][1:]
if not rows:
    sys.exit("no steps after the first in run.jsonl")
keys = [k for k in rows[0] if k.endswith("_s") and k != "tokens_per_s"]
print("group %s tok_s %.1f " % (sys.argv[1], st.median(r["tokens_per_s"] for r in rows)) +
      " ".join("%s %.4f" % (k, st.median(r[k] for r in rows if k in r)) for k in keys))
PY
}

failed=0
for n in ${GROUP_SIZES:-1 2 4 8}; do
  ((n <= NGPU)) || continue
  run_group "$n" | tee -a "$tmp/results" || failed=1
done
python3 - "$tmp/results" <<'PY' || true
import sys
tok = {}
for line in open(sys.argv[1]):
    f = line.split()
    if f[:1] == ["group"] and f[2:3] == ["tok_s"]: tok[int(f[1])] = float(f[3])
if 1 in tok:
    for n in sorted(tok):
        if n > 1: print("ratio group_%d/group_1 = %.2f" % (n, tok[n] / tok[1]))
PY
exit "$failed"
