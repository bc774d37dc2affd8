"""The real Gemma 3 270M GGUF (scripts/fetch_models.sh gemma3, Q4_K_M) fine-tuned through the
relay the quickstart way and exported to GGUF Q4_K_M (issue 29's round trip, the part CI can
check; the HF export loaded by transformers 4.57's Gemma3ForCausalLM is scripts/gemma3_roundtrip.sh,
which needs the fixtures venv):

  * `l2l finetune --steps 3 --seq-len 128 --batch 2 --export gguf --export-type q4_k_m` on
    Debian's licence texts finishes, having measured the held-out perplexity before;
  * the `gguf` package (llama.cpp's reader) reads the export: architecture gemma3, the
    original file's tensor names and shapes, and each tensor's type the one llama.cpp gave
    it in the downloaded Q4_K_M file (Q4_K, Q6_K, Q5_0, Q8_0, F32: the same recipe);
  * l2l-eval's held-out perplexity of the exported file is below the perplexity before
    (146.79 -> 62.07 on 2026-11-27: 3 steps at lr 1e-4, then Q4_K_M).

  gemma3_finetune_test.py L2L_BIN_DIR GGUF WORK_DIR      (the oracle venv: gguf)
"""
import os
import re
import subprocess
import sys

import gguf


def main():
    bin_dir, model, work = sys.argv[1], sys.argv[2], sys.argv[3]
    os.makedirs(work, exist_ok=True)
    texts = [f"/usr/share/common-licenses/{n}" for n in ("GPL-2", "LGPL-2.1", "GPL-3")]
    data = os.path.join(work, "licences.txt")
    with open(data, "wb") as out:
        for t in texts:
            with open(t, "rb") as f:
                out.write(f.read())
    run = os.path.join(work, "run")
    cmd = [os.path.join(bin_dir, "l2l"), "finetune", "--model", model, "--data", data, "--out", run, "--steps", "3",
           "--seq-len", "128", "--batch", "2", "--lr", "1e-4", "--val-fraction", "0.1", "--quiet", "--export", "gguf",
           "--export-type", "q4_k_m"]
    print(" ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    before = open(os.path.join(run, "eval-before.log")).read()
    ppl_before = float(re.search(r"perplexity ([0-9.]+)", before).group(1))
    exported = os.path.join(run, "model.gguf")
    ev = subprocess.run([os.path.join(bin_dir, "l2l-eval"), "--model", exported, "--data",
                         os.path.join(run, "data", "val.bin"), "--context", "128"],
                        check=True, capture_output=True, text=True).stdout
    print(ev.strip())
    ppl_after = float(re.search(r"perplexity ([0-9.]+)", ev).group(1))
    print(f"held-out perplexity {ppl_before} -> {ppl_after} (the Q4_K_M export)")

    got, orig = gguf.GGUFReader(exported), gguf.GGUFReader(model)
    arch = bytes(got.fields["general.architecture"].parts[-1]).decode()
    og = {t.name: t for t in orig.tensors}
    names = {t.name for t in got.tensors}
    failures = []
    if arch != "gemma3":
        failures.append(f"general.architecture {arch!r}, want 'gemma3'")
    if names != set(og):
        failures.append(f"tensor names differ from the original file's: {sorted(names ^ set(og))[:8]}")
    for t in got.tensors:
        o = og.get(t.name)
        if o is None:
            continue
        if list(t.shape) != list(o.shape):
            failures.append(f"{t.name}: shape {list(t.shape)}, original {list(o.shape)}")
        if t.tensor_type != o.tensor_type:
            failures.append(f"{t.name}: type {t.tensor_type.name}, llama.cpp's Q4_K_M gave {o.tensor_type.name}")
    types = {}
    for t in got.tensors:
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    print(f"gguf reads {exported}: {len(names)} tensors, types {types}")
    if not ppl_after < ppl_before:
        failures.append(f"held-out perplexity did not drop: {ppl_before} -> {ppl_after}")
    if failures:
        sys.exit("FAIL:\n  " + "\n  ".join(failures))
    print("OK")


if __name__ == "__main__":
    main()
