"""The real Gemma 3 270M GGUF (scripts/fetch_models.sh gemma3: Q4_K_M, tensors
F32/Q5_0/Q4_K/Q8_0/Q6_K) through l2l-eval against transformers' perplexity of the same
file: tests/fixtures/gemma3_270m/reference.json holds the token ids (transformers'
tokenizer of the GGUF) and the mean NLL transformers 4.57 computed in fp32
(tests/fixtures/make_gemma3_gguf_fixture.py). l2l imports the GGUF (dequantizing every
tensor, norms stored as 1 + w read back as w) and scores the same ids in one window;
the losses must agree to 1e-3 relative.

  gemma3_gguf_test.py L2L_EVAL GGUF WORK_DIR      (/usr/bin/python3: no packages needed)
"""
import json
import os
import re
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    l2l_eval, gguf_path, work = sys.argv[1], sys.argv[2], sys.argv[3]
    with open(os.path.join(HERE, "..", "fixtures", "gemma3_270m", "reference.json")) as f:
        ref = json.load(f)
    ids = ref["token_ids"]
    os.makedirs(work, exist_ok=True)
    toks = os.path.join(work, "gemma3_text.tokens")
    header = [20240520, 2, len(ids), 4] + [0] * 252  # version 2: uint32 ids (vocab 262144)
    with open(toks, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack("<%dI" % len(ids), *ids))
    cmd = [l2l_eval, "--model", gguf_path, "--data", toks, "--context", str(len(ids) - 1), "--batch", "1"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    print(p.stdout + p.stderr)
    if p.returncode != 0:
        sys.exit(f"FAIL: l2l-eval exited {p.returncode}")
    m = re.search(r"eval: loss ([0-9.eE+-]+)", p.stdout)
    if not m:
        sys.exit("FAIL: no 'eval: loss' line")
    loss, want = float(m.group(1)), ref["nll"]
    rel = abs(loss - want) / abs(want)
    print(f"l2l loss {loss:.6f}, transformers {want:.6f} ({ref['transformers']}), rel {rel:.2e}")
    if rel > 1e-3:
        sys.exit("FAIL: l2l's loss differs from transformers' by more than 1e-3 relative")
    print("OK")


if __name__ == "__main__":
    main()
