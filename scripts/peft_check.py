#!/usr/bin/env python3
"""The LoRA quickstart's last check: a PEFT adapter that l2l exported, loaded the way a
Hugging Face user loads it -- transformers' model class on the ORIGINAL base (a GGUF file,
dequantized by transformers, or an HF directory), then PeftModel.from_pretrained -- and
its held-out perplexity, scored as l2l-eval scores (windows of T+1 tokens starting at
multiples of T, each window's T targets given the tokens before them in the window).

Run with the oracle venv (scripts/oracle_venv.sh: transformers 4.46.3, peft 0.13.2, gguf).
Prints one line per fact; exits 1 when the base or the adapter does not load cleanly (a
base weight transformers left uninitialised, an adapter tensor that lands on no module,
no LoRA module) or the perplexity is not finite or not below --expect-below.

  peft_check.py --base MODEL.gguf|HF_DIR --adapter DIR --tokens VAL.bin [--context T] [--windows N]
                [--expect-below PPL]
"""
import argparse
import math
import os
import struct
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def read_tokens(path):
    """An llm.c tokens file (common/formats/tokens_file.h): 256 int32 header, then tokens."""
    with open(path, "rb") as f:
        header = struct.unpack("<256i", f.read(1024))
        if header[0] != 20240520:
            sys.exit(f"{path}: not a tokens file (magic {header[0]})")
        n, width = header[2], header[3] or 2
        data = f.read(n * width)
    fmt = {2: "H", 4: "I"}[width]
    return list(struct.unpack(f"<{n}{fmt}", data))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--adapter", required=True)
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--windows", type=int, default=0, help="score at most N windows (0: all)")
    ap.add_argument("--expect-below", type=float, default=0,
                    help="fail unless the perplexity is below this (the base's, before fine-tuning)")
    a = ap.parse_args()

    import time
    t0 = time.time()
    import torch
    import transformers
    import peft
    from peft import PeftModel

    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count() or 1)  # Debian's torch 1.13 starts with 1
    if os.path.isdir(a.base):
        base, info = transformers.AutoModelForCausalLM.from_pretrained(
            a.base, torch_dtype=torch.float32, output_loading_info=True)
    else:
        d, f = os.path.split(os.path.abspath(a.base))
        base, info = transformers.AutoModelForCausalLM.from_pretrained(
            d, gguf_file=f, torch_dtype=torch.float32, output_loading_info=True)
    missing = list(info.get("missing_keys", []))
    if missing == ["lm_head.weight"] and not os.path.isdir(a.base):
        # A GGUF without output.weight has a tied head (SmolLM2); transformers 4.46's GGUF
        # config does not say so, and would leave lm_head random.
        import gguf
        names = {t.name for t in gguf.GGUFReader(a.base).tensors}
        if "output.weight" not in names:
            base.config.tie_word_embeddings = True
            base.lm_head.weight = base.get_input_embeddings().weight
            missing = []
            print("the GGUF has no output.weight: lm_head tied to the embedding")
    if missing:
        print("base weights transformers did not load:", missing[:10])
        return 1
    base.eval()
    t1 = time.time()
    model = PeftModel.from_pretrained(base, a.adapter)
    model.eval()
    # What PEFT put in: every adapter tensor in the file must land on a module.
    from safetensors.torch import load_file
    saved = load_file(os.path.join(a.adapter, "adapter_model.safetensors"))
    state = {k for k in model.state_dict()}
    missing = [k for k in saved if k.replace(".weight", ".default.weight") not in state and k not in state]
    lora_modules = sum(1 for n, m in model.named_modules() if hasattr(m, "lora_A") and len(m.lora_A) > 0)
    print(f"peft {peft.__version__}, transformers {transformers.__version__}: {len(saved)} adapter tensors, "
          f"{lora_modules} LoRA modules, {len(missing)} tensors that landed nowhere")
    if missing or lora_modules == 0:
        for k in missing[:10]:
            print("  not loaded:", k)
        return 1

    t2 = time.time()
    toks = read_tokens(a.tokens)
    T = a.context
    windows = (len(toks) - 1) // T
    if a.windows > 0:
        windows = min(windows, a.windows)
    nll, count = 0.0, 0
    with torch.no_grad():
        for w in range(windows):
            x = torch.tensor([toks[w * T: w * T + T + 1]])
            logits = model(input_ids=x[:, :-1]).logits.float()
            loss = torch.nn.functional.cross_entropy(logits[0], x[0, 1:], reduction="sum")
            nll += loss.item()
            count += T
    ppl = math.exp(nll / count)
    print(f"seconds: base {t1 - t0:.1f} (imports + load), adapter {t2 - t1:.1f}, scoring {time.time() - t2:.1f}")
    print(f"held-out perplexity with the PEFT adapter on the original base: {ppl:.4f} "
          f"({windows} windows of {T + 1} tokens)")
    if not math.isfinite(ppl) or (a.expect_below > 0 and ppl >= a.expect_below):
        print(f"FAILED: the perplexity is not below {a.expect_below}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
