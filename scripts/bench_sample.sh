#!/usr/bin/env bash
# Sampling speed, one command: l2l-sample with its KV cache, l2l-sample recomputing the
# context per token (--no-kv-cache, the old path), and the peer a user would pick on a CPU
# without llama.cpp (not in Debian 12): Hugging Face transformers' generate() with its KV
# cache, fp32, on the same SmolLM2-135M GGUF, the same prompt ids, greedy, the same
# number of new tokens and threads, in one run. Prints tokens/s and
# `ratio l2l_kv/hf_generate = X` (X > 1: l2l is faster), and whether the greedy ids agree.
# Bench only, never CI. Each l2l figure is the generation's own time (l2l-sample's stderr
# line, model loading excluded); the peer's is generate()'s time after a warm-up.
#
# Usage: scripts/bench_sample.sh [NEW_TOKENS (128)]    Env: THREADS (all cores),
#   PY (python with torch + transformers + gguf; default the peers venv,
#   scripts/bench_peers_venv.sh: PyTorch 2.x + transformers 4.46.3. The oracle venv's
#   Debian torch 1.13 cannot run generate() under Python 3.11), L2L_BUILD_DIR (build).
set -euo pipefail
cd "$(dirname "$0")/.."
NEW=${1:-128}
THREADS=${THREADS:-$(nproc)}
BIN=${L2L_BUILD_DIR:-build}/bin
PY=${PY:-$(bash scripts/bench_peers_venv.sh)}
GGUF=$(bash scripts/fetch_models.sh smollm2)
[ -x "$BIN/l2l-sample" ] || { echo "bench_sample: $BIN/l2l-sample missing (scripts/build.sh)" >&2; exit 1; }
PROMPT_IDS=1348,1578,314,1904,3197  # "This program is free software" in SmolLM2's tokenizer
echo "bench_sample: $(date -u +%F) $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, threads $THREADS, $NEW new tokens"

run_l2l() {  # extra flags -> "RATE IDS"
  local err out
  err=$(mktemp)
  out=$("$BIN/l2l-sample" "$GGUF" --prompt-ids "$PROMPT_IDS" --tokens "$NEW" --temperature 0 --ignore-eos \
        --ids "$@" 2>"$err") || { cat "$err" >&2; exit 1; }
  sed -n 's/.*: \([0-9.]*\) new tokens\/s.*/\1/p' "$err" | tail -1
  grep '^ids: ' <<<"$out" | sed 's/^ids: //'
  rm -f "$err"
}
mapfile -t kv < <(run_l2l)
echo "l2l-sample (KV cache):         ${kv[0]} new tokens/s"
mapfile -t full < <(run_l2l --no-kv-cache)
echo "l2l-sample (full recompute):   ${full[0]} new tokens/s"
peer=$(OMP_NUM_THREADS=$THREADS HF_HUB_OFFLINE=1 "$PY" bench/peers_generate.py "$GGUF" "$PROMPT_IDS" "$NEW" "$THREADS")
peer_rate=$(sed -n 's/^peer hf_generate: .*: \([0-9.]*\) new tokens\/s.*/\1/p' <<<"$peer")
peer_ids=$(sed -n 's/^peer ids: //p' <<<"$peer")
echo "$(head -1 <<<"$peer")"
awk -v a="${kv[0]}" -v b="$peer_rate" 'BEGIN {printf "ratio l2l_kv/hf_generate = %.2f\n", a / b}'
awk -v a="${kv[0]}" -v b="${full[0]}" 'BEGIN {printf "ratio l2l_kv/l2l_full_recompute = %.2f\n", a / b}'
if [ "${kv[1]}" = "$peer_ids" ] && [ "${kv[1]}" = "${full[1]}" ]; then
  echo "greedy ids: identical (KV cache, full recompute, HF generate)"
else
  echo "greedy ids: DIFFER"; echo "  kv:   ${kv[1]}"; echo "  full: ${full[1]}"; echo "  hf:   $peer_ids"
fi
