#!/usr/bin/env bash
# CPU benchmark: forward+backward tokens/s of the reference trainer (l2l-bench-train) vs
# the same GPT in PyTorch (float32, same threads, same B and T), measured in the same
# run, and the ratio; then l2l-bench-kernels when it is built. Not a test: prints only.
#
# Environment: L2L_BUILD_DIR (default build), THREADS (default 2), B (8), T (128),
# ITERS (10), CONFIG (configs/quickstart.yaml: the `small` model).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${L2L_BUILD_DIR:-build}"
THREADS="${THREADS:-2}" B="${B:-8}" T="${T:-128}" ITERS="${ITERS:-10}"
CONFIG="${CONFIG:-configs/quickstart.yaml}"
# Both sides use OpenMP (oneDNN / torch); same wait policy for both.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}" OMP_NUM_THREADS="$THREADS"

echo "machine: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) cores), load: $(cut -d' ' -f1-3 /proc/loadavg)"
ours=$("$BUILD_DIR/bin/l2l-bench-train" --config "$CONFIG" --B "$B" --T "$T" --iters "$ITERS" --threads "$THREADS")
echo "$ours"
ours_tps=$(echo "$ours" | sed -n 's/.*tok\/s \([0-9.]*\).*/\1/p')

# The same model (shape from the config's preset via l2l's own loader is not available in
# python, so the shape is read from the YAML preset file directly).
torch_tps=$(/usr/bin/python3 - "$CONFIG" "$B" "$T" "$ITERS" "$THREADS" <<'PY'
import math, os, sys, time, re
import torch, torch.nn as nn, torch.nn.functional as F
cfg, B, T, iters, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
torch.set_num_threads(threads)
text = open(cfg).read()
preset = re.search(r"preset:\s*(\S+)", text).group(1)
spec = {}
for line in open(os.path.join(os.path.dirname(cfg), "models", preset + ".yaml")):
    m = re.match(r"\s+(\w+):\s*(\S+)", line)
    if m: spec[m.group(1)] = m.group(2)
V, C, L, NH, Fd = (int(spec[k]) for k in ("vocab_size", "d_model", "n_layer", "n_head", "d_ff"))
T = T or int(spec["seq_len"])
class Block(nn.Module):
    def __init__(s):
        super().__init__()
        s.ln1, s.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        s.attn, s.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        s.fc, s.fcp = nn.Linear(C, Fd), nn.Linear(Fd, C)
    def forward(s, x):
        Bq, Tq, _ = x.shape
        q, k, v = s.attn(s.ln1(x)).split(C, dim=2)
        q, k, v = [t.view(Bq, Tq, NH, C // NH).transpose(1, 2) for t in (q, k, v)]
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // NH)
        att = att.masked_fill(torch.triu(torch.ones(Tq, Tq, dtype=torch.bool), 1), float("-inf")).softmax(-1)
        x = x + s.proj((att @ v).transpose(1, 2).reshape(Bq, Tq, C))
        return x + s.fcp(F.gelu(s.fc(s.ln2(x)), approximate="tanh"))
class GPT(nn.Module):
    def __init__(s):
        super().__init__()
        s.wte, s.wpe = nn.Embedding(V, C), nn.Embedding(int(spec["seq_len"]), C)
        s.blocks = nn.ModuleList(Block() for _ in range(L))
        s.lnf = nn.LayerNorm(C)
    def forward(s, idx, tgt):
        x = s.wte(idx) + s.wpe(torch.arange(idx.shape[1]))
        for b in s.blocks: x = b(x)
        logits = s.lnf(x) @ s.wte.weight.t()
        return F.cross_entropy(logits.view(-1, V), tgt.view(-1))
model = GPT()
idx = torch.randint(0, V, (B, T)); tgt = torch.randint(0, V, (B, T))
for _ in range(2): model(idx, tgt).backward()
t0 = time.perf_counter()
for _ in range(iters): model(idx, tgt).backward()
dt = time.perf_counter() - t0
print("%.0f" % (B * T * iters / dt))
PY
)
echo "pytorch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)') fwd+bwd, same model/B/T/threads: tok/s $torch_tps"
awk -v a="$ours_tps" -v b="$torch_tps" 'BEGIN { printf "ratio l2l/pytorch: %.2f\n", a / b }'

if [ -x "$BUILD_DIR/bin/l2l-bench-kernels" ]; then
  echo "---- l2l-bench-kernels ----"
  "$BUILD_DIR/bin/l2l-bench-kernels" --threads "$THREADS" || "$BUILD_DIR/bin/l2l-bench-kernels" || true
fi
