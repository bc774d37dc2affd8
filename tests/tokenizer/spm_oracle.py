#!/usr/bin/env python3
"""Oracle test: our SentencePiece-style BPE (tokenizer/spm.h) against Hugging Face
`tokenizers` and Google's `sentencepiece`, on the same >= 1 MB test text as hf_oracle.py
(prose, C/C++ headers, Unicode in many scripts with emoji, whitespace runs, special tokens
inside text).

Cases (each: ids equal token for token, and where noted decode round-trips):
  * gemma3-gguf: the real Gemma 3 270M GGUF (scripts/fetch_models.sh gemma3; tokenizer.ggml.model
    "llama", 262,144 pieces with scores and types, no merges) loaded by tok::LoadTokenizer
    (the GGUF path of l2l-tokenize), against
      - HF: a `tokenizers` Tokenizer built from the GGUF's pieces the way transformers'
        GemmaConverter builds Gemma's tokenizer.json from its SentencePiece model (BPE with
        byte_fallback, unk <unk>, fuse_unk; merges from transformers' own generate_merges
        ordered by the pieces' scores; normalizer Replace(" ", "▁"), pre-tokenizer
        Split(" ", merged_with_previous); control (3) and user-defined (4) pieces as added
        tokens, normalized=False, control special; "<bos> $A" template);
      - SentencePiece: a ModelProto (type BPE, byte_fallback, identity normalizer without
        dummy prefix, as Gemma's tokenizer.model) written from the same pieces and run by the
        `sentencepiece` library, on the text between control tokens (SentencePiece does not
        match control tokens in text; HF and llama.cpp do) — the original algorithm;
    and decode must round-trip.
  * gemma3-hf-json: that HF tokenizer.json itself (Gemma's own tokenizer.json shape: 262,144
    pieces, merges by rank) loaded by Tokenizer::FromTokenizerJson.
  * gemma3-exported: the tokenizer.json we write for the GGUF (BpeSpecToTokenizerJson: what
    an HF export of a GGUF-imported Gemma carries) loaded by HF `tokenizers` gives our ids.
  * llama2-legacy / llama2-metaspace(-split): Llama-2-style tokenizer.json files trained here with
    `tokenizers` (BPE, byte_fallback, <0xNN> byte tokens with some bytes left out so that
    4-byte characters fall to <unk>, fuse_unk; normalizer Prepend("▁") + Replace(" ", "▁")
    / pre-tokenizer Metaspace prepend_scheme "first", or "always" with split; decoder Replace / ByteFallback / Fuse
    / Strip; "<s> $A" template) loaded by Tokenizer::FromTokenizerJson, against HF.

  * gemma sft (with --tokenize): l2l-tokenize --jsonl with the GGUF as --tokenizer formats
    messages with Gemma 3's chat template: ids equal transformers' apply_chat_template with
    that template (tests/tokenizer/fixtures/gemma3_chat_template.jinja), the loss mask marks
    each assistant turn's content and its <end_of_turn>; non-alternating roles are refused.

usage: spm_oracle.py --tool BUILD/tests/l2l_tokenizer_tool --gemma GEMMA.gguf --work DIR [--only NAME]
                     [--tokenize BUILD/bin/l2l-tokenize]
"""
import argparse
import json
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_oracle  # noqa: E402  (the shared corpus and comparison)

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers  # noqa: E402

SPACE = "\u2581"
GEMMA_SPECIALS = ["<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>", "<pad>", "<mask>", "[multimodal]",
                  "<table>", "</td>", "<start_of_image>"]


def gguf_pieces(path):
    from gguf import GGUFReader
    r = GGUFReader(path)

    def arr(name):
        f = r.fields[name]
        if f.types[-1].name == "STRING":
            return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
        return [f.parts[i].tolist()[0] for i in f.data]

    def scalar(name, default=None):
        f = r.fields.get(name)
        return default if f is None else f.parts[f.data[0]].tolist()[0]

    meta = {"tokens": arr("tokenizer.ggml.tokens"), "scores": arr("tokenizer.ggml.scores"),
            "types": arr("tokenizer.ggml.token_type"), "model": bytes(r.fields["tokenizer.ggml.model"].parts[-1]).decode(),
            "bos": scalar("tokenizer.ggml.bos_token_id"), "unk": scalar("tokenizer.ggml.unknown_token_id"),
            "add_bos": scalar("tokenizer.ggml.add_bos_token"), "add_space_prefix": scalar("tokenizer.ggml.add_space_prefix")}
    assert meta["model"] == "llama", meta["model"]
    assert meta["add_bos"] and not meta["add_space_prefix"], (meta["add_bos"], meta["add_space_prefix"])
    return meta


def hf_from_gguf(meta):
    """GemmaConverter's recipe (transformers 4.46.3 convert_slow_tokenizer.py) on the GGUF pieces."""
    from transformers.convert_slow_tokenizer import generate_merges
    vocab_scores = [("\t" if t == "<0x09>" else t, s) for t, s in zip(meta["tokens"], meta["scores"])]
    vocab = {t: i for i, (t, _) in enumerate(vocab_scores)}
    merges = generate_merges(vocab, vocab_scores)
    tok = Tokenizer(models.BPE(vocab, merges, unk_token=meta["tokens"][meta["unk"]], fuse_unk=True, byte_fallback=True,
                               dropout=None))
    tok.add_tokens([AddedToken(t, normalized=False, special=ty == 3)
                    for t, ty in zip(meta["tokens"], meta["types"]) if ty in (3, 4)])
    tok.normalizer = normalizers.Replace(" ", SPACE)
    tok.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous")
    tok.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    bos = meta["tokens"][meta["bos"]]
    tok.post_processor = processors.TemplateProcessing(single=bos + ":0 $A:0", pair=bos + ":0 $A:0 " + bos + ":1 $B:1",
                                                       special_tokens=[(bos, meta["bos"])])
    return tok


def spm_model_proto(meta, path):
    """A SentencePiece ModelProto (protobuf wire format written by hand: the oracle venv has no
    protobuf package): pieces (piece, score, type), trainer_spec {model_type BPE, byte_fallback,
    unk/bos/eos/pad ids}, normalizer_spec {identity, no dummy prefix, no whitespace removal,
    escape whitespace} — Gemma's tokenizer.model settings. The GGUF stores <unk> as a control
    piece and user-defined space runs with spaces; SentencePiece wants UNKNOWN and "▁"."""
    def varint(n):
        out = bytearray()
        while True:
            b, n = n & 0x7F, n >> 7
            out.append(b | (0x80 if n else 0))
            if not n:
                return bytes(out)

    def field(num, wire, payload):
        return varint(num << 3 | wire) + payload

    def msg(num, b):
        return field(num, 2, varint(len(b)) + b)

    out = bytearray()
    for i, (t, s, ty) in enumerate(zip(meta["tokens"], meta["scores"], meta["types"])):
        if i == meta["unk"]:
            ty = 2
        if ty == 4 and t.strip(" ") == "":
            t = t.replace(" ", SPACE)
        out += msg(1, msg(1, t.encode()) + field(2, 5, struct.pack("<f", s)) + field(3, 0, varint(ty)))
    trainer = b"".join(field(n, 0, varint(v)) for n, v in ((3, 2), (35, 1), (40, meta["unk"]), (41, meta["bos"]), (42, 1), (43, 0)))
    out += msg(2, trainer)
    out += msg(3, msg(1, b"identity") + field(3, 0, varint(0)) + field(4, 0, varint(0)) + field(5, 0, varint(1)))
    with open(path, "wb") as f:
        f.write(bytes(out))


def spm_ids(sp, meta, doc):
    """SentencePiece's ids of `doc` with control / user-defined pieces cut out first (leftmost
    longest, as HF and llama.cpp match them), BOS first."""
    added = {t: i for i, (t, ty) in enumerate(zip(meta["tokens"], meta["types"])) if ty in (3, 4)}
    by_first = {}
    for t in sorted(added, key=len, reverse=True):
        by_first.setdefault(t[0], []).append(t)
    ids, start, i = [meta["bos"]], 0, 0
    while i < len(doc):
        hit = next((t for t in by_first.get(doc[i], []) if doc.startswith(t, i)), None)
        if hit is None:
            i += 1
            continue
        if start < i:
            ids += sp.encode(doc[start:i])
        ids.append(added[hit])
        i += len(hit)
        start = i
    if start < len(doc):
        ids += sp.encode(doc[start:])
    return ids


def gemma_configs(args, docs):
    meta = gguf_pieces(args.gemma)
    hf = hf_from_gguf(meta)
    p = os.path.join(args.work, "gemma3-hf.json")
    hf.save(p)
    ok = True
    # SentencePiece itself (the original algorithm) agrees with the HF tokenizer used as the oracle.
    import sentencepiece
    model = os.path.join(args.work, "gemma3.model")
    spm_model_proto(meta, model)
    sp = sentencepiece.SentencePieceProcessor(model_file=model)
    want = [e.ids for e in hf.encode_batch(docs)]
    diff = [i for i in range(len(docs)) if spm_ids(sp, meta, docs[i]) != want[i]]
    print("gemma3: sentencepiece %s vs HF tokenizers (GemmaConverter recipe): %d of %d documents differ"
          % (sentencepiece.__version__, len(diff), len(docs)))
    if diff:
        a, b = spm_ids(sp, meta, docs[diff[0]]), want[diff[0]]
        k = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
        print("  first: document %d token %d: spm %r vs HF %r" % (diff[0], k, a[k:k + 6], b[k:k + 6]))
        ok = False
    return ok, {"gemma3-gguf": (p, ["--load", args.gemma]), "gemma3-hf-json": (p, ["--json", p])}


def llama2_configs(args, train_docs):
    """Llama-2-style tokenizer.json files trained here (legacy Prepend + Replace normalizer;
    Metaspace prepend_scheme first), with <0xNN> byte tokens for all bytes but 0xF0-0xF4 (the
    lead bytes of 4-byte characters: those become <unk>, fused)."""
    out = {}
    for name in ("llama2-legacy", "llama2-metaspace", "llama2-metaspace-split"):
        tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
        if name == "llama2-legacy":
            tok.normalizer = normalizers.Sequence([normalizers.Prepend(SPACE), normalizers.Replace(" ", SPACE)])
        elif name == "llama2-metaspace":
            tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="first", split=False)
        else:  # a piece per word: "▁" starts each (as tokenizers' Metaspace split=True)
            tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="always", split=True)
        trainer = trainers.BpeTrainer(vocab_size=3000, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=200,
                                      show_progress=False)
        tok.train_from_iterator(train_docs, trainer=trainer)
        j = json.loads(tok.to_str())
        vocab = j["model"]["vocab"]
        n = max(vocab.values()) + 1
        for b in range(256):
            if not 0xF0 <= b <= 0xF4:
                vocab["<0x%02X>" % b] = n
                n += 1
        j["decoder"] = {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": SPACE}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
        p = os.path.join(args.work, name + ".json")
        with open(p, "w", encoding="utf-8") as f:
            json.dump(j, f, ensure_ascii=False)
        tok = Tokenizer.from_file(p)
        tok.add_special_tokens(hf_oracle.SPECIALS)
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
        tok.save(p)
        # A "▁" prepended after every added token (legacy) and <unk> lose text: no round trip.
        out[name] = (p, ["--json", p, "--no-roundtrip"])
    return out


def check_synthetic(args):
    """Hand-made cases on llama2-legacy that the corpus may not hit: byte fallback, unknown
    characters (fused), leading / multiple spaces, newlines, an empty string."""
    p = os.path.join(args.work, "llama2-legacy.json")
    tok = Tokenizer.from_file(p)
    texts = ["\u00e9t\u00e9 \u0416\u0436 \u4e2d\u6587", "emoji \U0001F600\U0001F601 x \U0001F468\u200d\U0001F469", " lead",
             "   three  two ", "a\nb\n\nc\r\n", "", " ", "\t\ttabs", "<s>x</s> <unk>", "\u2581already"]
    docs = os.path.join(args.work, "synthetic.json")
    with open(docs, "w", encoding="utf-8") as f:
        json.dump(texts, f, ensure_ascii=False)
    ids_path = os.path.join(args.work, "synthetic.ids.json")
    proc = hf_oracle.subprocess.run([args.tool, "encode", "--json", p, "--docs", docs, "--out", ids_path, "--no-roundtrip"],
                                    capture_output=True, text=True)
    if proc.returncode != 0:
        print("synthetic: tool failed: " + proc.stderr.strip())
        return False
    with open(ids_path, encoding="utf-8") as f:
        got = json.load(f)
    ok = True
    unk = tok.token_to_id("<unk>")
    for t, g in zip(texts, got):
        w = tok.encode(t).ids
        if g != w:
            print("synthetic %r: ours %r, HF %r" % (t, g, w))
            ok = False
    # The cases must exercise what they name.
    byte_hit = any(tok.id_to_token(i).startswith("<0x") for i in tok.encode(texts[0]).ids)
    unk_hit = unk in tok.encode(texts[1]).ids
    if not (byte_hit and unk_hit):
        print("synthetic: the cases no longer hit byte fallback (%s) / unknown characters (%s)" % (byte_hit, unk_hit))
        ok = False
    if ok:
        print("synthetic: OK: %d hand-made texts (byte fallback, fused <unk>, spaces, newlines) equal HF's ids" % len(texts))
    return ok


GEMMA_SFT_LINES = [
    {"messages": [{"role": "system", "content": "You are terse. "}, {"role": "user", "content": "What is 2+2?"},
                  {"role": "assistant", "content": "4."}]},
    {"messages": [{"role": "user", "content": "  leading spaces\nand\n\nnewlines \u00e9\u4e2d\U0001F600  "},
                  {"role": "assistant", "content": "\nStarts with a newline;\tends with spaces  "},
                  {"role": "user", "content": "Again: 1234567 <start_of_turn>"},
                  {"role": "assistant", "content": "Digits 89,\u00a0<b>html</b> and   runs\n\n\n"}]},
    {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": ""}]},
]


def check_sft_gemma(args):
    """l2l-tokenize --jsonl --tokenizer GEMMA.gguf against transformers' apply_chat_template with
    Gemma 3's chat template (tests/tokenizer/fixtures/gemma3_chat_template.jinja, the
    chat_template of google/gemma-3 tokenizer_config.json; the GGUF carries none) on the HF
    tokenizer: ids equal; the mask marks exactly the tokens of each assistant turn's trimmed
    content and its <end_of_turn> (spans found by rendering the conversation up to each turn)."""
    from transformers import PreTrainedTokenizerFast
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "fixtures", "gemma3_chat_template.jinja"), encoding="utf-8") as f:
        template = f.read()
    hf = PreTrainedTokenizerFast(tokenizer_file=os.path.join(args.work, "gemma3-hf.json"), bos_token="<bos>",
                                 eos_token="<eos>")
    src = os.path.join(args.work, "gemma-sft.jsonl")
    with open(src, "w", encoding="utf-8") as f:
        for line in GEMMA_SFT_LINES:
            f.write(json.dumps(line) + "\n")
    want_ids, want_mask = [], []
    for line in GEMMA_SFT_LINES:
        msgs = line["messages"]
        text = hf.apply_chat_template(msgs, chat_template=template, tokenize=False)
        ids = hf.apply_chat_template(msgs, chat_template=template, tokenize=True)
        enc = hf.backend_tokenizer.encode(text, add_special_tokens=False)
        assert list(enc.ids) == list(ids), "apply_chat_template ids differ from encoding its text"
        spans = []
        for k, m in enumerate(msgs):
            if m["role"] != "assistant":
                continue
            before = hf.apply_chat_template(msgs[:k], chat_template=template, tokenize=False)
            upto = hf.apply_chat_template(msgs[:k + 1], chat_template=template, tokenize=False)
            begin = len(before) + len("<start_of_turn>model\n")
            assert upto.endswith("<end_of_turn>\n") and text.startswith(upto)
            spans.append((begin, len(upto) - 1))
        want_ids += list(ids)
        want_mask += [1 if any(b <= o[0] < e for b, e in spans) else 0 for o in enc.offsets]
    out = os.path.join(args.work, "gemma-sft.bin")
    proc = hf_oracle.subprocess.run([args.tokenize, src, out, "--jsonl", "--tokenizer", args.gemma], capture_output=True, text=True)
    if proc.returncode != 0:
        print("gemma sft: l2l-tokenize failed: " + proc.stderr.strip())
        return False
    got_ids, got_mask = hf_oracle.read_tokens(out), hf_oracle.read_mask(out + ".mask")
    if got_ids != want_ids or got_mask != want_mask:
        k = next((k for k in range(min(len(got_ids), len(want_ids))) if got_ids[k] != want_ids[k] or got_mask[k] != want_mask[k]),
                 min(len(got_ids), len(want_ids)))
        print("gemma sft: differs at token %d (%d vs %d tokens): ours %r / mask %r, HF %r / mask %r"
              % (k, len(got_ids), len(want_ids), got_ids[k:k + 6], got_mask[k:k + 6], want_ids[k:k + 6], want_mask[k:k + 6]))
        return False
    # Roles that do not alternate are refused, naming the line and message.
    bad = os.path.join(args.work, "gemma-bad.jsonl")
    with open(bad, "w", encoding="utf-8") as f:
        f.write(json.dumps({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}) + "\n")
    proc = hf_oracle.subprocess.run([args.tokenize, bad, out, "--jsonl", "--tokenizer", args.gemma], capture_output=True, text=True)
    if proc.returncode == 0 or (bad + ":1") not in proc.stderr or "messages[1]" not in proc.stderr:
        print("gemma sft: non-alternating roles gave exit %d: %r" % (proc.returncode, proc.stderr))
        return False
    print("gemma sft: OK: %d tokens equal apply_chat_template's ids (Gemma 3 template), %d target tokens in the mask; "
          "bad roles -> %s" % (len(got_ids), sum(got_mask), proc.stderr.strip()))
    return True


def check_sft_llama2(args):
    """l2l-tokenize --jsonl with the llama2-legacy tokenizer.json (ChatML tokens added, a "▁"
    prefix before the text and after every added token): ids equal HF's encoding of the
    formatted lines and the mask is the one HF's offsets give (hf_oracle.expected_sft)."""
    p = os.path.join(args.work, "llama2-legacy.json")
    tok = Tokenizer.from_file(p)
    # (This vocabulary spells 4-byte characters as <unk>, whose bytes are not the text's: SFT
    # refuses such lines, so the emoji is left out here.)
    lines = json.loads(json.dumps(hf_oracle.SFT_LINES).replace("\\ud83d\\ude00", "!"))
    assert "\U0001F600" not in json.dumps(lines, ensure_ascii=False)
    src = os.path.join(args.work, "llama2-sft.jsonl")
    with open(src, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")
    out = os.path.join(args.work, "llama2-sft.bin")
    proc = hf_oracle.subprocess.run([args.tokenize, src, out, "--jsonl", "--tokenizer", p], capture_output=True, text=True)
    if proc.returncode != 0:
        print("llama2 sft: l2l-tokenize failed: " + proc.stderr.strip())
        return False
    want_ids, want_mask = [], []
    for line in lines:
        i, m = hf_oracle.expected_sft(tok, line, None)
        want_ids += i
        want_mask += m
    got_ids, got_mask = hf_oracle.read_tokens(out), hf_oracle.read_mask(out + ".mask")
    if got_ids != want_ids or got_mask != want_mask:
        k = next((k for k in range(min(len(got_ids), len(want_ids))) if got_ids[k] != want_ids[k] or got_mask[k] != want_mask[k]),
                 min(len(got_ids), len(want_ids)))
        print("llama2 sft: differs at token %d (%d vs %d tokens): ours %r / mask %r, HF %r / mask %r"
              % (k, len(got_ids), len(want_ids), got_ids[k:k + 6], got_mask[k:k + 6], want_ids[k:k + 6], want_mask[k:k + 6]))
        return False
    print("llama2 sft: OK: %d tokens (ChatML with a ▁ prefix after each added token) equal HF's, %d target tokens"
          % (len(got_ids), sum(got_mask)))
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--gemma", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--only", default="")
    ap.add_argument("--tokenize", default="", help="BUILD/bin/l2l-tokenize: also check --jsonl with the Gemma template")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    docs, sizes, train_docs = hf_oracle.corpus(GEMMA_SPECIALS)
    total = sum(len(d.encode()) for d in docs)
    if total < hf_oracle.MIN_BYTES:
        print("spm_oracle: only %d bytes of test text" % total)
        return 1
    ok = True
    configs = {}
    if not args.only or args.only.startswith("gemma3"):
        g_ok, g = gemma_configs(args, docs)
        ok &= g_ok
        configs.update(g)
    if not args.only or args.only.startswith("llama2"):
        configs.update(llama2_configs(args, train_docs[:150]))
        ok &= check_synthetic(args)
    for name, (json_path, tool_args) in configs.items():
        if args.only and name != args.only:
            continue
        ok &= hf_oracle.check(name, json_path, tool_args, docs, args, sizes)
    if args.tokenize and (not args.only or args.only.startswith("gemma3")):
        ok &= check_sft_gemma(args)
    if args.tokenize and (not args.only or args.only.startswith("llama2")):
        ok &= check_sft_llama2(args)
    if not args.only or args.only == "gemma3-gguf":
        # The tokenizer.json we export for the GGUF encodes in HF as we do.
        out_dir = os.path.join(args.work, "gemma3-exported")
        exported = os.path.join(out_dir, "tokenizer.json")
        proc = hf_oracle.subprocess.run([args.tool, "export-hf", "--gguf", args.gemma, "--out", out_dir],
                                        capture_output=True, text=True)
        if proc.returncode != 0:
            print("gemma3-exported: export failed: " + proc.stderr.strip())
            ok = False
        else:
            ok &= hf_oracle.check("gemma3-exported", exported, ["--load", args.gemma], docs, args, sizes)
    print("spm_oracle: %s" % ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
