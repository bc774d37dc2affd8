"""Oracle tests of the encoder (BERT) tools against Hugging Face transformers.

  encoder_oracle.py BIN_DIR WORK_DIR eval
        (a) l2l-eval on a random BertForSequenceClassification (2 and 3 labels, saved by
        save_pretrained) and classification rows with padding and token types: loss equals
        the mean cross-entropy of HF's logits (rel <= 1e-5); accuracy and, for 2 labels,
        precision / recall / F1 of class 1 equal the formulas applied to HF's argmax
        (no sklearn); the majority-class accuracy equals the label counts'.
        (b) l2l-eval on a random BertForMaskedLM: the rows are masked here by an independent
        Python transcription of the documented masking (SplitMix64 of seed, epoch 0, row,
        position; docs/formats.md) and HF's loss / accuracy over the masked positions equal
        l2l-eval's (loss rel <= 1e-5, same masked count).
  encoder_oracle.py BIN_DIR WORK_DIR minilm MODEL_DIR
        The real all-MiniLM-L6-v2 (scripts/fetch_models.sh minilm): 100 varied sentences
        tokenized by l2l-tokenize --task classify equal HF's tokenizer ids; l2l-embed's
        mean-pooled embeddings equal HF AutoModel's (rel <= 1e-5 per sentence), for the
        checkpoint as shipped (BertModel names without "bert.") and for a copy whose
        tensors carry "bert.".

Exits non-zero with a message on the first failure. Run with the oracle venv's python
(scripts/oracle_venv.sh) and HF_HUB_OFFLINE=1.
"""
import json
import os
import re
import shutil
import subprocess
import sys

os.environ["HF_HUB_OFFLINE"] = "1"
import numpy as np
import torch
import transformers

transformers.utils.logging.set_verbosity_error()
MASK64 = (1 << 64) - 1


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def run(args):
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode != 0:
        fail(f"{' '.join(args)} exited {p.returncode}: {p.stderr.strip()}")
    return p.stdout


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


# ---- rows files (common/formats/rows_file.h) -------------------------------------------------

def write_header_file(path, magic, version, count, payload, extra=()):
    hdr = np.zeros(256, dtype=np.int32)
    hdr[0], hdr[1], hdr[2] = magic, version, count
    for i, v in enumerate(extra):
        hdr[3 + i] = v
    with open(path, "wb") as f:
        f.write(hdr.tobytes())
        f.write(payload)


def write_rows(path, ids, types, attn, labels, classes):
    n, L = ids.shape
    flat = ids.reshape(-1)
    wide = int(flat.max()) >= 65536
    write_header_file(path, 20240520, 2 if wide else 1, flat.size,
                      flat.astype(np.uint32 if wide else np.uint16).tobytes(), extra=(4 if wide else 2,))
    write_header_file(path + ".types", 20240522, 1, flat.size, types.reshape(-1).astype(np.uint8).tobytes())
    write_header_file(path + ".attn", 20240522, 1, flat.size, attn.reshape(-1).astype(np.uint8).tobytes())
    write_header_file(path + ".labels", 20240525, 1, n, np.asarray(labels, dtype=np.int32).tobytes(), extra=(L, classes))


def read_rows(path):
    def body(p, dtype_of):
        with open(p, "rb") as f:
            hdr = np.frombuffer(f.read(1024), dtype=np.int32)
            return hdr, np.frombuffer(f.read(), dtype=dtype_of(hdr))
    lh, labels = body(path + ".labels", lambda h: np.int32)
    n, L = int(lh[2]), int(lh[3])
    _, ids = body(path, lambda h: np.uint16 if h[1] == 1 else np.uint32)
    _, types = body(path + ".types", lambda h: np.uint8)
    _, attn = body(path + ".attn", lambda h: np.uint8)
    return (ids.reshape(n, L).astype(np.int64), types.reshape(n, L).astype(np.int64),
            attn.reshape(n, L).astype(np.int64), labels.astype(np.int64))


def random_rows(rng, n, L, vocab, first_word, cls=101, sep=102, pad=0):
    ids = np.full((n, L), pad, dtype=np.int64)
    types = np.zeros((n, L), dtype=np.int64)
    attn = np.zeros((n, L), dtype=np.int64)
    for r in range(n):
        length = int(rng.integers(4, L + 1))
        ids[r, 0], ids[r, length - 1] = cls, sep
        ids[r, 1:length - 1] = rng.integers(first_word, vocab, size=length - 2)
        if length >= 6 and r % 2 == 1:  # a pair: [CLS] A [SEP] B [SEP]
            cut = length // 2
            ids[r, cut] = sep
            types[r, cut + 1:length] = 1
        attn[r, :length] = 1
    return ids, types, attn


# ---- l2l-eval, classification ----------------------------------------------------------

def parse_fields(line):
    return {k: float(v) for k, v in re.findall(r"(\w+) (-?[0-9.]+(?:e-?\d+)?)", line)}


def check_classify(bindir, work, num_labels, seed):
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    cfg = transformers.BertConfig(vocab_size=300, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=40, type_vocab_size=2,
                                  num_labels=num_labels, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = transformers.BertForSequenceClassification(cfg).eval()
    with torch.no_grad():  # logits far enough apart that argmax is not a coin flip of rounding
        model.classifier.weight.normal_(0.0, 2.0)
        model.bert.pooler.dense.weight.normal_(0.0, 0.5)
    n, L = 61, 24
    ids, types, attn = random_rows(rng, n, L, 300, 110)
    labels = rng.integers(0, num_labels, size=n)
    labels[:5] = 1  # class 1 present
    inputs = dict(input_ids=torch.tensor(ids), token_type_ids=torch.tensor(types), attention_mask=torch.tensor(attn))
    with torch.no_grad():  # centre each class's logits: a random model otherwise predicts one class everywhere
        model.classifier.bias -= model(**inputs).logits.mean(0)
        logits = model(**inputs).logits.double()
    mdir = os.path.join(work, f"cls{num_labels}")
    model.save_pretrained(mdir, safe_serialization=True)
    rows = os.path.join(work, f"cls{num_labels}.bin")
    write_rows(rows, ids, types, attn, labels, num_labels)
    top2 = torch.topk(logits, 2, dim=1).values
    if float((top2[:, 0] - top2[:, 1]).min()) < 1e-4:
        fail(f"test data: a near tie in HF's logits (seed {seed}); pick another seed")
    pred = logits.argmax(1).numpy()
    loss = float(torch.nn.functional.cross_entropy(logits, torch.tensor(labels)))
    acc = float((pred == labels).mean())
    majority = float(np.bincount(labels, minlength=num_labels).max()) / n
    out = run([os.path.join(bindir, "l2l-eval"), "--model", mdir, "--data", rows, "--batch", "7"])
    got = parse_fields(out)
    print(out.strip())
    print(f"HF: loss {loss:.6f} accuracy {acc:.6f} majority {majority:.6f}")
    if rel(got["loss"], loss) > 1e-5:
        fail(f"{num_labels} labels: loss {got['loss']} vs HF {loss} (rel {rel(got['loss'], loss):.2e})")
    if abs(got["accuracy"] - acc) > 1e-6:
        fail(f"{num_labels} labels: accuracy {got['accuracy']} vs HF argmax {acc}")
    if abs(got["majority"] - majority) > 1e-6:
        fail(f"{num_labels} labels: majority {got['majority']} vs {majority}")
    if not (0.0 < acc < 1.0):
        fail(f"test data: accuracy {acc} is degenerate")
    if num_labels == 2:
        tp = int(((pred == 1) & (labels == 1)).sum())
        fp = int(((pred == 1) & (labels == 0)).sum())
        fn = int(((pred == 0) & (labels == 1)).sum())
        if tp == 0 or tp + fp == n:
            fail(f"test data: degenerate predictions (tp {tp}, fp {fp}); pick another seed")
        precision, recall = tp / (tp + fp), tp / (tp + fn)
        f1 = 2 * precision * recall / (precision + recall)
        for k, v in (("precision", precision), ("recall", recall), ("f1", f1)):
            if abs(got[k] - v) > 1e-6:
                fail(f"{k} {got[k]} vs {v} from HF's predictions")
        print(f"HF: precision {precision:.6f} recall {recall:.6f} f1 {f1:.6f}")
    elif "f1" in got:
        fail("F1 printed for more than two classes")


# ---- l2l-eval, masked LM ---------------------------------------------------------------

def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def mask_row(ids, attn, seed, epoch, row, vocab, mask_id, first_word, prob=0.15):
    """docs/formats.md "Masked-LM rows", transcribed independently of the C++."""
    key = splitmix64((splitmix64(splitmix64(seed) ^ 0x6D6C6D5F6D61736B) + epoch) & MASK64)
    row_key = splitmix64(key ^ splitmix64(row))
    inputs, targets = list(ids), [-100] * len(ids)
    for t in range(len(ids)):
        if attn[t] == 0 or ids[t] < first_word:
            continue
        base = (row_key + 3 * t) & MASK64
        if not (splitmix64(base) >> 11) / 2.0**53 < prob:
            continue
        targets[t] = ids[t]
        how = (splitmix64((base + 1) & MASK64) >> 11) / 2.0**53
        if how < 0.8:
            inputs[t] = mask_id
        elif how < 0.9:
            inputs[t] = first_word + ((splitmix64((base + 2) & MASK64) * (vocab - first_word)) >> 64)
    return inputs, targets


def check_mlm(bindir, work):
    torch.manual_seed(5)
    rng = np.random.default_rng(5)
    V, mask_id, first_word, seed = 200, 4, 10, 99
    cfg = transformers.BertConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=40, type_vocab_size=2,
                                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = transformers.BertForMaskedLM(cfg).eval()
    with torch.no_grad():  # a sharper distribution than the random init's, favouring word 10:
        model.cls.predictions.transform.dense.weight.normal_(0.0, 0.5)
        model.cls.predictions.bias[first_word] += 4.0
    n, L = 40, 32
    # Words from [10, 14): the favoured word is right about a quarter of the time.
    ids, types, attn = random_rows(rng, n, L, first_word + 4, first_word, cls=1, sep=2)
    mdir = os.path.join(work, "mlm")
    model.save_pretrained(mdir, safe_serialization=True)
    rows = os.path.join(work, "mlm.bin")
    write_rows(rows, ids, types, attn, np.zeros(n, dtype=np.int64), 1)
    masked_in, targets = [], []
    for r in range(n):
        i, t = mask_row(ids[r].tolist(), attn[r].tolist(), seed, 0, r, V, mask_id, first_word)
        masked_in.append(i)
        targets.append(t)
    masked_in, targets = torch.tensor(masked_in), torch.tensor(targets)
    with torch.no_grad():
        logits = model(input_ids=masked_in, token_type_ids=torch.tensor(types),
                       attention_mask=torch.tensor(attn)).logits.double()
    sel = targets != -100
    count = int(sel.sum())
    loss = float(torch.nn.functional.cross_entropy(logits[sel], targets[sel]))
    acc = float((logits[sel].argmax(-1) == targets[sel]).double().mean())
    out = run([os.path.join(bindir, "l2l-eval"), "--model", mdir, "--data", rows, "--batch", "5", "--seed", str(seed),
               "--mask-id", str(mask_id), "--first-word-id", str(first_word)])
    got = parse_fields(out)
    print(out.strip())
    print(f"HF: loss {loss:.6f} accuracy {acc:.6f} masked {count}")
    if int(got["masked"]) != count:
        fail(f"masked {int(got['masked'])} positions, the documented masking gives {count}")
    if count < 0.1 * int(attn.sum()) or count > 0.2 * int(attn.sum()):
        fail(f"{count} masked of {int(attn.sum())} real tokens: not about 15%")
    if rel(got["loss"], loss) > 1e-5:
        fail(f"mlm loss {got['loss']} vs HF {loss} (rel {rel(got['loss'], loss):.2e})")
    if abs(got["accuracy"] - acc) > 1.5 / count:  # at most one near tie
        fail(f"mlm accuracy {got['accuracy']} vs HF {acc}")
    if not 0.0 < acc < 1.0:
        fail(f"test data: mlm accuracy {acc} is degenerate")


# ---- the real MiniLM checkpoint --------------------------------------------------------

def sentences():
    out = []
    for name in ("GPL-3", "Apache-2.0", "Artistic", "MPL-2.0", "BSD"):
        with open("/usr/share/common-licenses/" + name, encoding="utf-8", errors="replace") as f:
            lines = [l.strip() for l in f if len(l.strip()) > 30]
        out += lines[3:3 + 16]
    out += [
        "Héllo wörld, ça va? Ñandú and façade are spelled with accents.",
        "東京は日本の首都です。 Mixed CJK 中文 text with English words.",
        "Numbers: 3.14159, 42, 1e-5 and -273.15 degrees Celsius!",
        "Short.",
        "A", "The quick brown fox jumps over the lazy dog " * 12,
        "URLs like https://www.debian.org/legal/licenses/ and e-mails foo@example.com",
        "Emoji 🙂 and symbols © ® ™ § ¶ † ‡ • …",
        "UPPER CASE SENTENCE THAT SHOULD BE LOWERCASED BY THE NORMALIZER",
        "tabs\tand  multiple   spaces\tinside",
        "Don't, won't, can't; it's O'Reilly's \"quoted\" text (with parentheses) [and brackets].",
        "Ελληνικά και русский язык в одном предложении.",
        "unbelievably antidisestablishmentarianism hyperparameterization tokenization",
        "σ ς Σ İstanbul ß ﬁ ligature",
        "1 2 3 4 5 6 7 8 9 10 eleven twelve",
        "What is the capital of France? Paris is the capital of France.",
        "Transformers trained layer to layer keep device memory flat in depth.",
        "def f(x): return x ** 2  # code as text",
        "Ünïcödé nörmälïzätïön",
        "This sentence ends without punctuation",
    ]
    out = out[:100]
    if len(out) != 100:
        fail(f"{len(out)} sentences, need 100")
    return out


def embed_and_compare(bindir, work, mdir, tag, rows, hf_emb):
    emb_path = os.path.join(work, f"emb_{tag}.f32")
    print(run([os.path.join(bindir, "l2l-embed"), "--model", mdir, "--data", rows, "--output", emb_path,
               "--batch", "16"]).strip())
    ours = np.fromfile(emb_path, dtype=np.float32).reshape(hf_emb.shape)
    worst = max(float(np.linalg.norm(ours[i] - hf_emb[i]) / np.linalg.norm(hf_emb[i])) for i in range(len(ours)))
    print(f"{tag}: worst per-sentence rel error {worst:.3e} over {len(ours)} sentences")
    if worst > 1e-5:
        fail(f"{tag}: mean-pooled embeddings differ from HF's: rel {worst:.3e} > 1e-5")


def check_minilm(bindir, work, mdir):
    sents = sentences()
    jsonl = os.path.join(work, "sentences.jsonl")
    with open(jsonl, "w", encoding="utf-8") as f:
        for s in sents:
            f.write(json.dumps({"text": s, "label": 0}) + "\n")
    rows = os.path.join(work, "sentences.bin")
    L = 128
    run([os.path.join(bindir, "l2l-tokenize"), jsonl, rows, "--task", "classify", "--tokenizer", mdir,
         "--max-len", str(L)])
    ids, types, attn, _ = read_rows(rows)
    tok = transformers.AutoTokenizer.from_pretrained(mdir)
    enc = tok(sents, truncation=True, max_length=L, padding="max_length", return_tensors="np")
    if not (np.array_equal(enc["input_ids"], ids) and np.array_equal(enc["attention_mask"], attn)):
        bad = [i for i in range(len(sents)) if not np.array_equal(enc["input_ids"][i], ids[i])]
        fail(f"l2l-tokenize rows differ from HF's tokenizer on sentences {bad[:5]}")
    model = transformers.AutoModel.from_pretrained(mdir).eval()
    with torch.no_grad():
        h = model(input_ids=torch.tensor(ids), token_type_ids=torch.tensor(types),
                  attention_mask=torch.tensor(attn)).last_hidden_state.double()
    m = torch.tensor(attn).unsqueeze(-1).double()
    hf_emb = ((h * m).sum(1) / m.sum(1)).numpy()
    embed_and_compare(bindir, work, mdir, "as-shipped", rows, hf_emb)

    # The same weights under BertForMaskedLM-style names ("bert." prefix).
    from safetensors.numpy import load_file, save_file
    pdir = os.path.join(work, "minilm_prefixed")
    os.makedirs(pdir, exist_ok=True)
    for name in os.listdir(mdir):
        if os.path.isfile(os.path.join(mdir, name)) and name != "model.safetensors":
            shutil.copy(os.path.join(mdir, name), pdir)
    tensors = load_file(os.path.join(mdir, "model.safetensors"))
    if any(k.startswith("bert.") for k in tensors):
        fail("the shipped checkpoint already carries 'bert.' names; the test expects plain BertModel names")
    save_file({"bert." + k: v for k, v in tensors.items()}, os.path.join(pdir, "model.safetensors"))
    embed_and_compare(bindir, work, pdir, "bert.-prefixed", rows, hf_emb)


def main():
    if len(sys.argv) < 4:
        fail("usage: encoder_oracle.py BIN_DIR WORK_DIR eval|minilm [MODEL_DIR]")
    bindir, work, mode = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)
    if mode == "eval":
        check_classify(bindir, work, 2, 11)
        check_classify(bindir, work, 3, 12)
        check_mlm(bindir, work)
    elif mode == "minilm":
        if len(sys.argv) < 5 or not os.path.isfile(os.path.join(sys.argv[4], "model.safetensors")):
            fail("minilm needs MODEL_DIR holding model.safetensors: run scripts/fetch_models.sh minilm")
        check_minilm(bindir, work, sys.argv[4])
    else:
        fail("unknown mode " + mode)
    print("PASS")


if __name__ == "__main__":
    main()
