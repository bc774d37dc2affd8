"""Oracle test of common/formats/lora_export.h (a LoRA job's export: AdapterFromLayers +
WritePeftAdapter / WriteGgufLora, MergedLayerSource under ExportHf / SaveModelStreamed)
against Hugging Face transformers 4.46.3 + peft 0.13.2 and the gguf package.

  lora_export_oracle.py BIN_DIR DUMP_TOOL WORK_DIR

For tiny random Hugging Face models (lora_oracle.py make-base: an untied Llama, a GPT-2)
tests/formats/lora_export_dump.cc (DUMP_TOOL) writes the exports of LoRA layers holding
the model, random adapters (B != 0) and, where asked, a trained lm_head
(modules_to_save). Variants: Llama all-linear + modules_to_save [lm_head]; Llama
q_proj,v_proj (also a GGUF LoRA); GPT-2 c_attn,c_fc (Conv1D: fan_in_fan_out). Per variant:

  keys     PeftModel.from_pretrained(BASE, peft/): set_peft_model_state_dict reports no
           unexpected and no missing adapter keys; the PEFT model's adapter state dict
           has exactly the file's keys and values; a saved lm_head is PEFT's
           modules_to_save copy and differs from the base's
  logits   the PeftModel's logits equal transformers' on merged/ (rel <= 1e-5 of the
           largest), and peft's merge_and_unload() weights equal merged/'s
  l2l      l2l-eval --model BASE --adapter peft/ (l2l's own forward with the adapter,
           tools/inference_model.h ApplyAdapter) gives the PeftModel's loss (rel <= 1e-5),
           and so do l2l-eval of merged/ and of merged.safetensors; the adapter moves the
           loss (rel > 1e-3)
  gguf     the Llama q/v variant's adapter.gguf read by the gguf package: lora_oracle.py
           check-gguf (llama.cpp names, ne order, alpha, q/k permutation); with
           modules_to_save the GGUF LoRA is refused naming --merge and --format peft

Run with the oracle venv's python (scripts/oracle_venv.sh), HF_HUB_OFFLINE=1. Exits
non-zero with a message on the first failure.
"""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
os.environ["HF_HUB_OFFLINE"] = "1"
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
import peft  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

import lora_oracle  # noqa: E402
from tools_oracle import check_close, fail, hf_windows_loss, parse_eval, run, write_tokens  # noqa: E402

VARIANTS = [
    ("llama_mts", "llama", ["--r", "4", "--alpha", "8", "--target", "all-linear", "--modules-to-save", "lm_head"]),
    ("llama_qv", "llama", ["--r", "3", "--alpha", "5", "--target", "q_proj,v_proj"]),
    ("gpt2", "gpt2", ["--r", "4", "--alpha", "8", "--target", "c_attn,c_fc"]),
]
T = 32


def quiet(fn, *args):
    import contextlib
    import io
    with contextlib.redirect_stdout(io.StringIO()):
        fn(*args)


def max_rel(got, want):
    return float((got - want).abs().max() / want.abs().max())


def check_variant(bin_dir, tool, work, name, family, args, base, data, toks):
    print(f"-- {name}")
    out = os.path.join(work, name)
    print("   " + run([tool, "--model", base, "--out", out] + args).stdout.strip())
    pdir, merged = os.path.join(out, "peft"), os.path.join(out, "merged")
    file_sd = load_file(os.path.join(pdir, "adapter_model.safetensors"))

    # keys: PeftModel.from_pretrained loads every tensor of the file, and nothing is missing.
    model = peft.PeftModel.from_pretrained(lora_oracle.load_base(base), pdir).eval()
    res = peft.set_peft_model_state_dict(model, peft.load_peft_weights(pdir))
    if res.unexpected_keys:
        fail(f"{name}: unexpected keys {res.unexpected_keys[:5]}")
    missing = [k for k in res.missing_keys if "lora_" in k or ".modules_to_save." in k]
    if missing:
        fail(f"{name}: missing adapter keys {missing[:5]}")
    model_sd = peft.get_peft_model_state_dict(model)
    if set(model_sd) != set(file_sd):
        fail(f"{name}: PEFT's adapter keys differ from the file's: {sorted(set(model_sd) ^ set(file_sd))[:5]}")
    for k, v in model_sd.items():
        if not np.array_equal(v.detach().numpy(), file_sd[k]):
            fail(f"{name}: loaded {k} differs from the file")
    saved = [k for k in file_sd if ".lora_" not in k]
    if "--modules-to-save" in args:
        if saved != ["base_model.model.lm_head.weight"]:
            fail(f"{name}: saved tensors {saved}, expected base_model.model.lm_head.weight")
        wrapper = model.base_model.model.lm_head
        if not hasattr(wrapper, "modules_to_save"):
            fail(f"{name}: PEFT's lm_head is no modules_to_save wrapper")
        trained = wrapper.modules_to_save["default"].weight.detach().numpy()
        original = wrapper.original_module.weight.detach().numpy()
        if not np.array_equal(trained, file_sd["base_model.model.lm_head.weight"]) or np.array_equal(trained, original):
            fail(f"{name}: PEFT's lm_head copy is not the file's trained tensor")
    elif saved:
        fail(f"{name}: unexpected saved tensors {saved}")
    print(f"   keys: {len(file_sd)} tensors loaded, none missing or unexpected ({len(saved)} modules_to_save)")

    # logits: PEFT's vs transformers on our merged dir; peft's own merge vs ours.
    ids = lora_oracle.tokens(model.config.vocab_size)
    ours_merged = transformers.AutoModelForCausalLM.from_pretrained(merged, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        got = model(input_ids=ids).logits.double()
        want = ours_merged(input_ids=ids).logits.double()
    rel = max_rel(got, want)
    print(f"   logits: PeftModel vs transformers on merged/: max rel {rel:.2e} (<= 1e-5)")
    if not rel <= 1e-5:
        fail(f"{name}: PeftModel's logits differ from those of our merged dir: {rel:.3e}")
    theirs = dict(peft.PeftModel.from_pretrained(lora_oracle.load_base(base), pdir).merge_and_unload().state_dict())
    mine = ours_merged.state_dict()
    worst = 0.0
    for k, w in mine.items():
        if k not in theirs:
            fail(f"{name}: merge_and_unload() has no {k}")
        worst = max(worst, max_rel(theirs[k].double(), w.double()) if w.abs().max() > 0 else 0.0)
    print(f"   merge: peft's merge_and_unload vs merged/: max rel {worst:.2e} (<= 1e-6)")
    if not worst <= 1e-6:
        fail(f"{name}: our merged weights differ from peft's merge_and_unload: {worst:.3e}")

    # l2l's own forward with the adapter (and of the merged exports) vs PEFT's loss.
    ev = os.path.join(bin_dir, "l2l-eval")
    peft_loss, _ = hf_windows_loss(model, toks, T)
    with_adapter = parse_eval(run([ev, "--model", base, "--adapter", pdir, "--data", data, "--context", str(T)]).stdout)
    of_merged = parse_eval(run([ev, "--model", merged, "--data", data, "--context", str(T)]).stdout)
    of_st = parse_eval(run([ev, "--model", os.path.join(out, "merged.safetensors"), "--data", data,
                            "--context", str(T)]).stdout)
    of_base = parse_eval(run([ev, "--model", base, "--data", data, "--context", str(T)]).stdout)
    check_close("l2l-eval --adapter peft/ vs the PeftModel", with_adapter[0], peft_loss, 1e-5)
    check_close("l2l-eval merged/ vs the PeftModel", of_merged[0], peft_loss, 1e-5)
    check_close("l2l-eval merged.safetensors vs the PeftModel", of_st[0], peft_loss, 1e-5)
    moved = abs(with_adapter[0] - of_base[0]) / of_base[0]
    print(f"   the adapter moves the loss by rel {moved:.3g}")
    if not moved > 1e-3:
        fail(f"{name}: the adapter hardly changes the loss ({moved:.3g}): a skipped merge would pass")

    if family == "llama" and "--modules-to-save" in args:
        refused = os.path.join(out, "gguf_refused.txt")
        text = open(refused).read() if os.path.exists(refused) else ""
        if "modules_to_save" not in text or "--merge" not in text or "--format peft" not in text:
            fail(f"{name}: the GGUF LoRA with modules_to_save was not refused naming --merge / --format peft: {text!r}")
        print(f"   gguf-lora refused: {text.strip()}")
    elif family == "llama":
        import contextlib
        import io
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            lora_oracle.check_gguf(base, pdir, os.path.join(out, "adapter.gguf"))
        print("   " + buf.getvalue().strip())


def main():
    if len(sys.argv) != 4:
        print("usage: lora_export_oracle.py BIN_DIR DUMP_TOOL WORK_DIR", file=sys.stderr)
        return 2
    bin_dir, tool, work = sys.argv[1:]
    os.makedirs(work, exist_ok=True)
    torch.set_num_threads(2)
    print(f"peft {peft.__version__}, transformers {transformers.__version__}, torch {torch.__version__}")
    g = np.random.default_rng(4)
    toks = [int(x) for x in g.integers(0, 128, size=257)]
    data = os.path.join(work, "tokens.bin")
    write_tokens(data, toks)
    bases = {}
    for name, family, args in VARIANTS:
        if family not in bases:
            bases[family] = os.path.join(work, family + "-base")
            quiet(lora_oracle.make_base, family, bases[family])
        check_variant(bin_dir, tool, work, name, family, args, bases[family], data, toks)
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
