#!/usr/bin/env python3
"""Oracle test: our C++ WordPiece tokenizer (tokenizer/wordpiece.h) against Hugging Face
`tokenizers`.

Tokenizers (no hub):
  * uncased: trained here with `tokenizers` as BertWordPieceTokenizer does (BertNormalizer
    lowercase, accents stripped by default, CJK spacing, clean_text; BertPreTokenizer;
    WordPiece "##"; TemplateProcessing [CLS] $A [SEP] / [CLS] $A [SEP] $B:1 [SEP]:1;
    WordPiece decoder);
  * cased: the same trained without lowercasing or accent stripping, BertProcessing;
  * raw: cased, strip_accents true, clean_text and handle_chinese_chars off, a shorter
    max_input_chars_per_word, and a normalized=true added token;
  * minilm: the real all-MiniLM-L6-v2 tokenizer.json (scripts/fetch_models.sh minilm; its
    truncation / padding switched off on the HF side, as our encoder ignores them).
Text: the corpus of hf_oracle.py (>= 1 MB: Debian prose, C/C++ headers, generated Unicode in
many scripts incl. CJK and emoji, whitespace runs, special tokens such as [CLS] / [SEP]
inside text) plus documents of control characters and accented letters. Each tokenizer
encodes every document as a single sequence (with and without special tokens) and every
consecutive pair of documents as a pair (with and without): ids AND token type ids must be
equal token for token; HF's decode(ids) (special tokens skipped) must equal ours.

With --tokenize BIN/l2l-tokenize (and --only classify) it checks `l2l-tokenize --task
classify` on the MiniLM tokenizer: JSONL lines of single texts and pairs (short ones padded,
long ones truncated) give rows, read back with numpy from the documented layout
(docs/formats.md), equal to HF's encode with truncation longest_first to --max-len and
padding to it (ids, token_type_ids, attention_mask), labels as given, the validation split
the tail; bad lines fail naming file:line.

usage: wordpiece_oracle.py --tool BUILD/l2l_tokenizer_tool --work DIR [--minilm DIR] [--only NAME]
                           [--tokenize BUILD/bin/l2l-tokenize]
"""
import argparse
import json
import os
import random
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_oracle  # noqa: E402  (the shared corpus builder)
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers  # noqa: E402

BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
MIN_BYTES = 1 << 20
CONTROLS = ["\x00", "\x01", "\x07", "\x1b", "\x7f", "\x85", "\x9f", "\ufffd", "\u200e", "\u200f", "\u2060", "\ue000",
            "\U000f0000", "\u00ad", "\u0600", "\ufff9", "\t", "\r", "\n", "\x0b", "\x0c"]
ACCENTED = ["caf\u00e9", "Cafe\u0301", "na\u00efve", "\u00c5ngstr\u00f6m", "Stra\u00dfe", "\u0130stanbul", "\u1e9e",
            "r\u00e9sum\u00e9", "Cr\u00e8me Br\u00fbl\u00e9e", "\u01c5", "\u0391\u03b8\u03ae\u03bd\u03b1", "\u03a3\u039f\u03a6\u039f\u03a3",
            "\u1ea0\u1ea1\u1ec7", "\u0e01\u0e34\u0e19", "\u0928\u092e\u0938\u094d\u0924\u0947", "\ufb01ne", "\u2163", "\u00bd",
            "\uff21\uff22\uff43", "\u3042\u3099", "\U0001d400", "\u00e5\u0328", "a\u0345b"]


def control_docs(rng, n_docs, words):
    docs = []
    for _ in range(n_docs):
        parts = []
        for _ in range(rng.randint(40, 160)):
            r = rng.random()
            if r < 0.3:
                parts.append(rng.choice(CONTROLS) * rng.choice([1, 1, 2, 5]))
            elif r < 0.6:
                parts.append(rng.choice(ACCENTED))
            else:
                parts.append(rng.choice(words))
            parts.append(rng.choice(hf_oracle.SEPS + ["", "", "-", "'", "(", ")", "\u201c", "\u00bf"]))
        docs.append("".join(parts))
    return docs


def build_corpus():
    docs, sizes, train_docs = hf_oracle.corpus(list(BERT_SPECIALS) + ["[cls]", "[SEP ]", "##ing"])
    rng = random.Random(99)
    words = " ".join(docs[:40]).split()
    ctl, n_ctl = hf_oracle.take(control_docs(rng, 120, words), 80_000)
    docs = docs + ctl
    sizes["control+accents"] = n_ctl
    # Pairs: consecutive documents, each cut to a random prefix (a sentence-pair task's
    # segments are shorter than a document).
    pairs = []
    for i in range(len(docs) - 1):
        a, b = docs[i], docs[i + 1]
        pairs.append([a[:rng.randint(0, len(a))], b[:rng.randint(0, len(b))]])
    # Training text: prose and code, plus a little of every script so CJK and the rest
    # are in the vocabulary (and not all [UNK]).
    uni = [d for d in docs if any(ord(c) > 0x2000 for c in d[:200])][:60]
    return docs, sizes, pairs, train_docs + uni


def train(train_docs, lowercase, strip_accents, bert_processing, clean_text=True, chinese=True, max_chars=100,
          extra_normalized=None):
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=max_chars))
    tok.normalizer = normalizers.BertNormalizer(clean_text=clean_text, handle_chinese_chars=chinese,
                                                strip_accents=strip_accents, lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=8000, special_tokens=list(BERT_SPECIALS), show_progress=False)
    tok.train_from_iterator(train_docs, trainer=trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    if bert_processing:
        tok.post_processor = processors.BertProcessing(("[SEP]", sep), ("[CLS]", cls))
    else:
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
            special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    tok.decoder = decoders.WordPiece()
    if extra_normalized:
        tok.add_tokens([AddedToken(extra_normalized, normalized=True)])
    return tok


def first_diff(a, b):
    return next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))


def run_case(name, tok, json_path, inputs, add_special, args, label):
    """Encodes `inputs` (strings or [a, b] pairs) with HF and with our tool; compares."""
    docs_path = os.path.join(args.work, "wp_docs.json")
    with open(docs_path, "w", encoding="utf-8") as f:
        json.dump(inputs, f, ensure_ascii=False)
    out_path = os.path.join(args.work, "%s.%s.json" % (name, label))
    batch = [tuple(x) if isinstance(x, list) else x for x in inputs]
    encs = tok.encode_batch(batch, add_special_tokens=add_special)
    want_ids = [e.ids for e in encs]
    want_types = [e.type_ids for e in encs]
    cmd = [args.tool, "wordpiece", "--json", json_path, "--docs", docs_path, "--out", out_path]
    if not add_special:
        cmd.append("--no-special")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        print("%s/%s: l2l_tokenizer_tool failed (exit %d): %s" % (name, label, proc.returncode, proc.stderr.strip()))
        return False
    with open(out_path, encoding="utf-8") as f:
        got = json.load(f)
    ok = True
    for key, want in (("ids", want_ids), ("types", want_types)):
        bad = [i for i in range(len(inputs)) if want[i] != got[key][i]]
        if bad:
            i = bad[0]
            pos = first_diff(want[i], got[key][i])
            lo = max(0, pos - 6)
            show = lambda ids: [(t, tok.id_to_token(t)) for t in want_ids[i][lo:pos + 6]] if key == "types" else \
                [(t, tok.id_to_token(t)) for t in ids[lo:pos + 6]]
            print("%s/%s: %s differ in %d of %d inputs; first: input %d, HF %d tokens, ours %d, at token %d"
                  % (name, label, key, len(bad), len(inputs), i, len(want[i]), len(got[key][i]), pos))
            print("  HF   [%d:]: %r" % (lo, want[i][lo:pos + 6] if key == "types" else show(want[i])))
            print("  ours [%d:]: %r" % (lo, got[key][i][lo:pos + 6] if key == "types" else show(got[key][i])))
            e = encs[i]
            if pos < len(e.offsets):
                off = e.offsets[pos][0]
                text = inputs[i] if isinstance(inputs[i], str) else inputs[i][e.sequence_ids[pos] or 0]
                print("  text around char %d: %r" % (off, text[max(0, off - 40):off + 40]))
            ok = False
    if ok and add_special:
        want_text = tok.decode_batch(want_ids)  # skip_special_tokens=True
        bad = [i for i in range(len(inputs)) if want_text[i] != got["decoded"][i]]
        if bad:
            i = bad[0]
            pos = first_diff(want_text[i], got["decoded"][i])
            print("%s/%s: decode differs in %d of %d inputs; first: input %d at char %d: HF %r, ours %r"
                  % (name, label, len(bad), len(inputs), i, pos, want_text[i][max(0, pos - 30):pos + 30],
                     got["decoded"][i][max(0, pos - 30):pos + 30]))
            ok = False
    n_bytes = sum(len((x if isinstance(x, str) else x[0] + x[1]).encode()) for x in inputs)
    if ok:
        print("%s/%s: OK: %d inputs, %d bytes, %d tokens: ids and token types equal token for token%s (ours %.2fs)"
              % (name, label, len(inputs), n_bytes, sum(map(len, want_ids)),
                 "; decode equal" if add_special else "", got["seconds"]))
    return ok


def check(name, tok, json_path, docs, pairs, sizes, args):
    total = sum(len(d.encode()) for d in docs)
    print("%s: corpus %d documents, %d bytes (%s); %d pairs" % (name, len(docs), total,
          ", ".join("%s %d" % kv for kv in sizes.items()), len(pairs)))
    if total < MIN_BYTES:
        print("%s: corpus below 1 MB" % name)
        return False
    ok = True
    ok &= run_case(name, tok, json_path, docs, True, args, "single")
    ok &= run_case(name, tok, json_path, docs, False, args, "single-nospecial")
    ok &= run_case(name, tok, json_path, pairs, True, args, "pair")
    ok &= run_case(name, tok, json_path, pairs, False, args, "pair-nospecial")
    return ok


def read_header_file(path, magic, dtype):
    import numpy as np
    hdr = np.fromfile(path, dtype="<i4", count=256)
    assert hdr[0] == magic, (path, hdr[:6])
    return hdr, np.fromfile(path, dtype=dtype, offset=1024)


def check_classify(args, docs):
    import numpy as np
    rng = random.Random(7)
    tok = Tokenizer.from_file(os.path.join(args.minilm, "tokenizer.json"))
    L = 64
    tok.enable_truncation(max_length=L, strategy="longest_first")
    tok.enable_padding(length=L, pad_id=tok.token_to_id("[PAD]"), pad_token="[PAD]")
    lines = []
    for i in range(400):
        d = docs[rng.randrange(len(docs))]
        cut = lambda: d[(s0 := rng.randrange(max(1, len(d)))):s0 + rng.choice([0, 5, 20, 80, 300, 2000])]
        if rng.random() < 0.5:
            lines.append({"text": cut(), "label": rng.randrange(3)})
        else:
            lines.append({"text_a": cut(), "text_b": cut(), "label": rng.randrange(3), "idx": i})
    data = os.path.join(args.work, "classify.jsonl")
    with open(data, "w", encoding="utf-8") as f:
        for k, ln in enumerate(lines):
            f.write(json.dumps(ln, ensure_ascii=rng.random() < 0.5) + "\n")
            if k % 50 == 0:
                f.write("\n")
    out, val = os.path.join(args.work, "cls_train.bin"), os.path.join(args.work, "cls_val.bin")
    proc = subprocess.run([args.tokenize, data, out, "--task", "classify", "--tokenizer", args.minilm, "--max-len", str(L),
                           "--val-fraction", "0.25", "--val-output", val], capture_output=True, text=True)
    print(proc.stdout.strip())
    if proc.returncode != 0:
        print("classify: l2l-tokenize failed: %s" % proc.stderr.strip())
        return False
    encs = tok.encode_batch([ln["text"] if "text" in ln else (ln["text_a"], ln["text_b"]) for ln in lines])
    n_val = int(len(lines) * 0.25)
    ok = True
    for path, first, n in ((out, 0, len(lines) - n_val), (val, len(lines) - n_val, n_val)):
        hdr, ids = read_header_file(path, 20240520, "<u2")
        _, types = read_header_file(path + ".types", 20240522, "u1")
        _, attn = read_header_file(path + ".attn", 20240522, "u1")
        lh, labels = read_header_file(path + ".labels", 20240525, "<i4")
        if list(lh[1:5]) != [1, n, L, 3] or len(ids) != n * L or len(labels) != n:
            print("classify: %s: header %s, %d ids, %d labels; want rows %d of %d" % (path, lh[:5], len(ids), len(labels), n, L))
            return False
        for r in range(n):
            e = encs[first + r]
            got = (ids[r * L:(r + 1) * L].tolist(), types[r * L:(r + 1) * L].tolist(), attn[r * L:(r + 1) * L].tolist())
            want = (e.ids, e.type_ids, e.attention_mask)
            if got != want or labels[r] != lines[first + r]["label"]:
                print("classify: %s row %d (line %r) differs:\n  HF   %r label %d\n  ours %r label %d"
                      % (path, r, lines[first + r], want, lines[first + r]["label"], got, labels[r]))
                ok = False
                break
    if ok:
        n_trunc = sum(1 for e in encs if e.attention_mask[-1] == 1)
        print("classify: OK: %d rows of %d (%d truncated, %d pairs): ids, types, attention mask and labels equal HF's"
              % (len(lines), L, n_trunc, sum("text_a" in ln for ln in lines)))
    # Plain text with a WordPiece tokenizer: [CLS] LINE [SEP] per non-blank line.
    plain = Tokenizer.from_file(os.path.join(args.minilm, "tokenizer.json"))
    plain.no_truncation()
    plain.no_padding()
    text = "\n".join(d[:3000] for d in docs[::7]) + "\n\n  \nlast line"
    txt = os.path.join(args.work, "mlm.txt")
    with open(txt, "w", encoding="utf-8") as f:
        f.write(text)
    proc = subprocess.run([args.tokenize, txt, os.path.join(args.work, "mlm.bin"), "--tokenizer", args.minilm],
                          capture_output=True, text=True)
    want = [i for ln in text.split("\n") if ln.strip(" \t\r") for i in plain.encode(ln).ids]
    got = read_header_file(os.path.join(args.work, "mlm.bin"), 20240520, "<u2")[1].tolist() if proc.returncode == 0 else None
    if got != want:
        print("classify: plain-text WordPiece stream differs from HF (exit %d %s); first difference at %d"
              % (proc.returncode, proc.stderr.strip(), first_diff(want, got or [])))
        ok = False
    else:
        print("classify: plain text -> %d tokens, [CLS] line [SEP] per line, equal to HF's" % len(want))
    bad_cases = [('{"text": "a", "label": 1}\n{"text": "b"}\n', ":2", "label"),
                 ('{"text": "a", "label": -1}\n', ":1", "label"),
                 ('{"text_a": "a", "label": 0}\n', ":1", "text_b"),
                 ('\n\n{"text": 3, "label": 0}\n', ":3", "text"),
                 ('{"text": "a", "label": 0}\nnot json\n', ":2", "JSON")]
    for k, (body, line_tag, word) in enumerate(bad_cases):
        p = os.path.join(args.work, "bad%d.jsonl" % k)
        with open(p, "w") as f:
            f.write(body)
        proc = subprocess.run([args.tokenize, p, os.path.join(args.work, "bad.bin"), "--task", "classify",
                               "--tokenizer", args.minilm, "--max-len", "16"], capture_output=True, text=True)
        if proc.returncode == 0 or (p + line_tag) not in proc.stderr or word not in proc.stderr:
            print("classify: bad input %r: exit %d, stderr %r (want %s%s and %r)" % (body, proc.returncode, proc.stderr, p, line_tag, word))
            ok = False
    if ok:
        print("classify: bad lines fail naming file:line")
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--minilm", default="", help="model dir of all-MiniLM-L6-v2 (scripts/fetch_models.sh minilm)")
    ap.add_argument("--only", default="")
    ap.add_argument("--tokenize", default="")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    docs, sizes, pairs, train_docs = build_corpus()
    configs = []
    if args.only == "classify":
        ok = bool(args.minilm and args.tokenize) and check_classify(args, docs)
        print("classify oracle: %s" % ("PASS" if ok else "FAIL"))
        return 0 if ok else 1
    want = lambda n: not args.only or args.only == n
    if want("uncased"):
        configs.append(("uncased", train(train_docs, lowercase=True, strip_accents=None, bert_processing=False)))
    if want("cased"):
        configs.append(("cased", train(train_docs, lowercase=False, strip_accents=False, bert_processing=True)))
    if want("raw"):
        configs.append(("raw", train(train_docs, lowercase=False, strip_accents=True, bert_processing=False,
                                     clean_text=False, chinese=False, max_chars=12, extra_normalized="<mix>")))
    ok = True
    for name, tok in configs:
        path = os.path.join(args.work, name + ".tokenizer.json")
        tok.save(path)
        ok &= check(name, tok, path, docs, pairs, sizes, args)
    if want("minilm"):
        if not args.minilm:
            print("minilm: no --minilm model directory given")
            ok = False
        else:
            path = os.path.join(args.minilm, "tokenizer.json")
            tok = Tokenizer.from_file(path)
            tok.no_truncation()
            tok.no_padding()
            ok &= check("minilm", tok, path, docs, pairs, sizes, args)
    print("wordpiece oracle: %s" % ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
