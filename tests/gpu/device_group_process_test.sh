#!/usr/bin/env bash
# l2l-worker --devices as operators run it: a real l2l-eps (shared-memory transport) and
# ONE l2l-worker driving a device group of 2 GPUs (on the CUDA emulator: 2 emulated
# devices, its NCCL), the tiny model, 3 synchronous steps. Passes when the worker logs
# the group, finishes every step with a finite, falling-or-level loss, the daemon reports
# step 3 of 3 with every layer at version 3 (l2lctl --json status: one publish per step,
# one worker), and both stop cleanly.
# Usage: device_group_process_test.sh BIN_DIR CONFIG_DIR   (ctest passes both)
set -euo pipefail
BIN=$1
export L2L_CONFIG_DIR=$2
export L2L_CUDA_EMU_DEVICES=2
WORK=$(mktemp -d)
EPS_PID=""
cleanup() {
  if [[ -n "$EPS_PID" ]] && kill -0 "$EPS_PID" 2>/dev/null; then
    timeout 30 "$BIN/l2lctl" --state-dir "$WORK/eps" stop --abort-step --skip-checkpoint --wait 20 >/dev/null 2>&1 ||
      kill -9 "$EPS_PID" 2>/dev/null || true
    wait "$EPS_PID" 2>/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
fail() { echo "device_group_process_test: FAILED: $*" >&2; exit 1; }

python3 - "$WORK/train.bin" <<'PY'
# A tokens file (common/formats/tokens_file.h): 256-int32 header, uint16 tokens; a learnable
# sequence x[t+1] = (5 x[t] + 3) mod 256.
import array, sys
n = 8192
hdr = array.array("i", [20240520, 1, n] + [0] * 253)
tok, x = array.array("H"), 7
for _ in range(n):
    tok.append(x); x = (5 * x + 3) % 256
with open(sys.argv[1], "wb") as f:
    hdr.tofile(f); tok.tofile(f)
PY
cat > "$WORK/job.yaml" <<YAML
model:
  preset: tiny
optim:
  lr: 3.0e-3
train:
  steps: 3
  micro_batch_size: 2
  micro_batches: 4
  seed: 1234
  log_every: 1
  mode: sync
data:
  train_path: $WORK/train.bin
publish_dtype: bf16
YAML
mkdir -p "$WORK/eps"
"$BIN/l2l-eps" --job "$WORK/job.yaml" --state-dir "$WORK/eps" --workers 1 --job-id "devgroup$$" \
  > "$WORK/eps.log" 2>&1 &
EPS_PID=$!
for _ in $(seq 1 120); do
  [[ -s "$WORK/eps/eps.port" ]] && break
  kill -0 "$EPS_PID" 2>/dev/null || { cat "$WORK/eps.log"; fail "l2l-eps exited before listening"; }
  sleep 0.5
done
[[ -s "$WORK/eps/eps.port" ]] || { cat "$WORK/eps.log"; fail "l2l-eps did not listen"; }
port=$(cat "$WORK/eps/eps.port")
rc=0
timeout 300 "$BIN/l2l-worker" --eps "127.0.0.1:$port" --devices cuda:0,cuda:1 > "$WORK/worker.log" 2>&1 || rc=$?
cat "$WORK/worker.log"
((rc == 0)) || { tail -20 "$WORK/eps.log"; fail "l2l-worker exited with status $rc"; }
grep -q "device group of 2 devices" "$WORK/worker.log" || fail "the worker did not run a device group"
grep -q "^l2l-worker: done steps=3 " "$WORK/worker.log" || fail "no 'done steps=3' line"
mapfile -t losses < <(sed -n 's/^step [0-9]*\/3 loss \([0-9.]*\) .*/\1/p' "$WORK/worker.log")
((${#losses[@]} == 3)) || fail "expected 3 progress lines, got ${#losses[@]}"
python3 - "${losses[@]}" <<'PY' || fail "losses not finite or rising: ${losses[*]}"
import math, sys
l = [float(x) for x in sys.argv[1:]]
assert all(math.isfinite(x) and x > 0 for x in l), l
assert l[-1] <= l[0] + 1e-3, l
PY
status=$("$BIN/l2lctl" --state-dir "$WORK/eps" status 2>&1) || { echo "$status"; fail "l2lctl status failed"; }
echo "$status"
# The daemon's own account (l2lctl --json status): step 3 of 3, and every layer at
# version 3: one publish per step per layer, so the group's gradients arrived as ONE
# worker's (a second registration or a step applied twice would show another number).
json=$("$BIN/l2lctl" --state-dir "$WORK/eps" --json status 2>&1) || { echo "$json"; fail "l2lctl --json status failed"; }
python3 - "$json" <<'PY' || fail "the daemon's step or layer versions are not 3: $json"
import json, sys
s = json.loads(sys.argv[1])
v = s["layer_version"]
print("layer versions:", v, "step", s["step"], "of", s["total_steps"], "workers", len(s["workers"]))
assert s["step"] == 3 and s["total_steps"] == 3, s
assert len(v) >= 3 and all(x == 3 for x in v), v
assert len(s["workers"]) <= 1, s["workers"]
PY
timeout 60 "$BIN/l2lctl" --state-dir "$WORK/eps" stop --skip-checkpoint --wait 45 > "$WORK/stop.log" 2>&1 ||
  { cat "$WORK/stop.log"; fail "l2lctl stop failed"; }
wait "$EPS_PID" || fail "l2l-eps exited with status $?"
EPS_PID=""
echo "device_group_process_test: ok (losses ${losses[*]})"
