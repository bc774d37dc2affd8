"""Peer of l2l-sample's speed: Hugging Face transformers' generate() with its KV cache
(use_cache=True, greedy) on the same GGUF file, fp32 weights dequantized by transformers'
own GGUF loader, on the CPU with the given threads. Bench only (scripts/bench_sample.sh).

usage: peers_generate.py GGUF PROMPT_IDS(comma) NEW_TOKENS THREADS
prints: `peer hf_generate: N new tokens in S s: R new tokens/s (torch X, transformers Y)`
and `peer ids: ...` (the greedy ids, for the script to compare with l2l's)."""
import os
import sys
import time

import torch
import transformers


def load(path):
    import gguf
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    cfg = transformers.AutoConfig.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    if "output.weight" not in {t.name for t in gguf.GGUFReader(path).tensors}:
        cfg.tie_word_embeddings = True  # llama.cpp writes no copy of a tied head
    m = transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32)
    m.load_state_dict(load_gguf_checkpoint(path, return_tensors=True)["tensors"], strict=False)
    if cfg.tie_word_embeddings:
        m.tie_weights()
    return m.float().eval()


def main():
    path, ids, new, threads = sys.argv[1], [int(x) for x in sys.argv[2].split(",")], int(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(threads)
    m = load(path)
    inp = torch.tensor([ids])
    kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, use_cache=True, pad_token_id=0)
    with torch.no_grad():
        m.generate(inp, **dict(kw, max_new_tokens=4, min_new_tokens=4))  # warm-up
        t0 = time.perf_counter()
        out = m.generate(inp, **kw)
        secs = time.perf_counter() - t0
    gen = out[0, len(ids):].tolist()
    print(f"peer hf_generate: {len(gen)} new tokens in {secs:.2f} s: {len(gen) / secs:.1f} new tokens/s "
          f"(torch {torch.__version__}, transformers {transformers.__version__})")
    print("peer ids: " + " ".join(map(str, gen)))


if __name__ == "__main__":
    main()
