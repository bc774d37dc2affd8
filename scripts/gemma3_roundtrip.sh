#!/usr/bin/env bash
# The real Gemma 3 file's round trip (issue 29): gemma-3-270m-q4_k_m.gguf (scripts/fetch_models.sh
# gemma3) is fine-tuned through the relay the quickstart way (`l2l finetune` on Debian's licence
# texts, held-out perplexity before/after, tokens/s), exported
#   1. to a Hugging Face directory (l2l finetune's default), which transformers' own
#      Gemma3ForCausalLM loads (the fixtures venv: transformers 4.57; the oracle venv's 4.46.3 has
#      no Gemma3) and whose loss on the held-out windows equals l2l-eval's (rel <= 1e-4);
#   2. to GGUF Q4_K_M (`--export gguf --export-type q4_k_m`), which the `gguf` package reads
#      back: the original file's tensor names and shapes, each tensor's type the Q4_K_M recipe's
#      (common/formats/gguf_recipe.h, rewritten here from llama.cpp's rule), and l2l-eval's
#      held-out perplexity of it next to the fp32 export's.
# Not run by ctest (two fine-tunes of a 268M-parameter model with a 262144-token vocabulary and
# the fixtures venv, which CI does not have); its figures are in docs/performance.md.
#
# Usage: bash scripts/gemma3_roundtrip.sh [OUT_DIR]   (env: STEPS=10 SEQ=128 BATCH=2 BUILD=build)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-/tmp/l2l-gemma3-roundtrip}
STEPS=${STEPS:-10} SEQ=${SEQ:-128} BATCH=${BATCH:-2}
BIN="$ROOT/${BUILD:-build}/bin"
GGUF=$(bash "$ROOT/scripts/fetch_models.sh" gemma3)
PY=$(bash "$ROOT/scripts/fixtures_venv.sh")
mkdir -p "$OUT"
cat /usr/share/common-licenses/{GPL-2,LGPL-2.1,GPL-3} > "$OUT/licences.txt"
common=(--model "$GGUF" --data "$OUT/licences.txt" --steps "$STEPS" --seq-len "$SEQ" --batch "$BATCH" --lr 1e-4
        --val-fraction 0.1)

echo "== 1. l2l finetune, export hf"
rm -rf "$OUT/hf"
"$BIN/l2l" finetune "${common[@]}" --out "$OUT/hf" --quiet
grep -h "tokens/s" "$OUT/hf/eps.log" | tail -n +2 | awk '{s += $(NF-1); n++} END {printf "tokens/s (steps 2..%d, mean of the daemon'"'"'s per-step figures): %.1f\n", n + 1, s / n}'
after=$(grep -o 'loss [0-9.]*' "$OUT/hf/eval-after.log" | head -1 | cut -d' ' -f2)
echo "l2l-eval loss of model-hf on val.bin: $after"

echo "== transformers loads model-hf"
"$PY" - "$OUT/hf/model-hf" "$OUT/hf/data/val.bin" "$SEQ" "$after" <<'EOF'
import sys, numpy as np, torch, transformers
d, val, T, want = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
raw = open(val, "rb").read()
hdr = np.frombuffer(raw[:1024], dtype=np.int32)
toks = np.frombuffer(raw[1024:], dtype=np.uint32 if hdr[3] == 4 else np.uint16)[: hdr[2]].astype(np.int64)
model = transformers.AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32, attn_implementation="eager")
assert type(model) is transformers.Gemma3ForCausalLM, type(model)
n = (len(toks) - 1) // T  # l2l-eval's windows: T+1 tokens from w*T
x = torch.tensor(np.stack([toks[w * T: w * T + T + 1] for w in range(n)]))
with torch.no_grad():
    logits = model(input_ids=x[:, :-1]).logits.float()
loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1)).item()
rel = abs(loss - want) / want
print(f"transformers {transformers.__version__} Gemma3ForCausalLM loss {loss:.6f} vs l2l-eval {want:.6f} "
      f"(rel {rel:.2e}, {n} windows of {T + 1})")
sys.exit(0 if rel <= 1e-4 else "FAIL: the HF export's loss differs from l2l-eval's")
EOF

echo "== 2. l2l finetune, export gguf q4_k_m"
rm -rf "$OUT/gguf"
"$BIN/l2l" finetune "${common[@]}" --out "$OUT/gguf" --quiet --no-eval --export gguf --export-type q4_k_m
"$BIN/l2l-eval" --model "$OUT/gguf/model.gguf" --data "$OUT/hf/data/val.bin" --context "$SEQ"
"$PY" - "$OUT/gguf/model.gguf" "$GGUF" <<'EOF'
import sys, gguf
from gguf import GGMLQuantizationType as Q
got, orig = gguf.GGUFReader(sys.argv[1]), gguf.GGUFReader(sys.argv[2])
arch = bytes(got.fields["general.architecture"].parts[-1]).decode()
assert arch == "gemma3", arch
n_layer = int(got.fields["gemma3.block_count"].parts[-1][0])
def more_bits(i):  # llama.cpp llama-quant.cpp use_more_bits
    return i < n_layer // 8 or i >= 7 * n_layer // 8 or (i - n_layer // 8) % 3 == 2
names = {t.name for t in got.tensors}
def want(t):
    shape = [int(x) for x in t.shape]  # gguf lists ne: ne[0] is the row length
    if len(shape) == 1: return Q.F32
    row, name = shape[0], t.name
    is_out = name == "output.weight" or (name == "token_embd.weight" and "output.weight" not in names)
    q = Q.Q6_K if is_out else Q.Q4_K
    if name.endswith((".attn_v.weight", ".ffn_down.weight")) and more_bits(int(name.split(".")[1])): q = Q.Q6_K
    if row % 256:
        q = Q.Q8_0 if (q == Q.Q6_K or is_out) else Q.Q5_0
        if row % 32: q = Q.F16
    return q
bad = [(t.name, t.tensor_type.name, want(t).name) for t in got.tensors if t.tensor_type != want(t)]
og = {t.name: t for t in orig.tensors}
assert names == set(og), sorted(names ^ set(og))
assert all(list(t.shape) == list(og[t.name].shape) for t in got.tensors)
from collections import Counter
print(f"gguf {gguf.__version__ if hasattr(gguf, '__version__') else ''} reads {sys.argv[1]}: arch {arch}, "
      f"{len(names)} tensors (the original file's names and shapes), types {dict(Counter(t.tensor_type.name for t in got.tensors))}")
same = sum(t.tensor_type == og[t.name].tensor_type for t in got.tensors)
print(f"types equal to the original llama.cpp Q4_K_M file's: {same} of {len(names)}")
sys.exit(0 if not bad else f"FAIL: types differ from the recipe: {bad[:5]}")
EOF
echo "OK"
