"""Oracles of l2l's LoRA adapter files (tests/formats/lora_adapter_test.cc, tests/tools):
Hugging Face transformers + peft (PeftModel, LoraConfig, merge_and_unload) and the gguf
package's GGUFReader. Subcommands:

  make-base FAMILY DIR             a tiny random llama / gpt2 model (save_pretrained, fp32)
  check-peft BASE ADAPTER          PeftModel.from_pretrained(BASE, ADAPTER): the model's
                                   adapter state dict has exactly the file's keys and values
                                   (no missing, no unexpected key), and its logits equal
                                   those of BASE with W + (alpha/r) B A merged by hand
                                   ((B A)^T for GPT-2's Conv1D) within 1e-5 relative
  peft-save BASE TARGETS OUT       an adapter made by peft itself (get_peft_model with
                                   random A and B, TARGETS comma-separated), saved to OUT
  same-adapter DIR1 DIR2           the two adapter dirs hold the same tensors (bitwise) and
                                   the same r / lora_alpha / target_modules / fan_in_fan_out
  merge-save BASE ADAPTER OUT      merge_and_unload() saved as a Hugging Face dir (fp32)
  check-gguf BASE ADAPTER FILE     FILE (l2l's GGUF LoRA of ADAPTER) read by GGUFReader:
                                   general.type / adapter.type / adapter.lora.alpha /
                                   general.architecture, one .lora_a / .lora_b pair per
                                   module named as llama.cpp names the base tensor, F32,
                                   ne = [in, r] / [r, out], lora_a = A and lora_b = B with
                                   llama.cpp's q/k row permutation (convert_hf_to_gguf.py's
                                   LlamaModel.permute) applied to attn_q / attn_k
Prints one line "ok ..." and exits 0, or says what differs and exits 1.
"""
import json
import math
import os
import sys

import numpy as np
import torch


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def make_base(family, out):
    import transformers
    torch.manual_seed(0)
    if family == "llama":
        cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                       tie_word_embeddings=False, torch_dtype="float32")
        model = transformers.LlamaForCausalLM(cfg)
    elif family == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                                      torch_dtype="float32")
        model = transformers.GPT2LMHeadModel(cfg)
    else:
        fail("unknown family " + family)
    with torch.no_grad():  # larger than the 0.02 init so the adapter's change shows
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    model.save_pretrained(out, safe_serialization=True)
    print("ok base " + family)


def load_base(path):
    import transformers
    return transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()


def tokens(vocab):
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, vocab, (2, 16), generator=g)


def adapter_tensors(adapter):
    from safetensors.numpy import load_file
    return load_file(os.path.join(adapter, "adapter_model.safetensors"))


def check_peft(base_path, adapter):
    from peft import PeftModel
    from peft.utils import get_peft_model_state_dict
    cfg = json.load(open(os.path.join(adapter, "adapter_config.json")))
    file_sd = adapter_tensors(adapter)
    model = PeftModel.from_pretrained(load_base(base_path), adapter).eval()
    model_sd = get_peft_model_state_dict(model)
    missing = sorted(set(model_sd) - set(file_sd))
    unexpected = sorted(set(file_sd) - set(model_sd))
    if missing or unexpected:
        fail("missing keys %s, unexpected keys %s" % (missing[:5], unexpected[:5]))
    for k, v in model_sd.items():
        if not np.array_equal(v.detach().numpy(), file_sd[k]):
            fail("loaded %s differs from the file" % k)
    # Merge by hand: W += (alpha / r) B A, transposed for Conv1D weights (in, out).
    base = load_base(base_path)
    scale = cfg["lora_alpha"] / (math.sqrt(cfg["r"]) if cfg.get("use_rslora") else cfg["r"])
    params = dict(base.named_parameters())
    with torch.no_grad():
        for k in file_sd:
            if not k.endswith(".lora_A.weight"):
                continue
            module = k[len("base_model.model."):-len(".lora_A.weight")]
            a = torch.from_numpy(file_sd[k]).double()
            b = torch.from_numpy(file_sd[k.replace("lora_A", "lora_B")]).double()
            delta = scale * (b @ a)
            w = params[module + ".weight"]
            if cfg["fan_in_fan_out"]:
                delta = delta.T
            if tuple(w.shape) != tuple(delta.shape):
                fail("%s: weight %s, delta %s" % (module, tuple(w.shape), tuple(delta.shape)))
            w.copy_((w.double() + delta).float())
    ids = tokens(base.config.vocab_size)
    with torch.no_grad():
        got = model(ids).logits.double()
        want = base(ids).logits.double()
        plain = load_base(base_path)(ids).logits.double()
    rel = ((got - want).abs().max() / want.abs().max()).item()
    moved = ((plain - want).abs().max() / want.abs().max()).item()
    if not rel <= 1e-5:
        fail("PEFT logits differ from the hand-merged model's: max rel %.3g" % rel)
    if not moved > 1e-3:
        fail("the adapter hardly changes the logits (%.3g): the test would not see a wrong merge" % moved)
    print("ok peft %d tensors, logits rel diff %.3g (adapter moves them %.3g)" % (len(file_sd), rel, moved))


def peft_save(base_path, targets, out):
    from peft import LoraConfig, get_peft_model
    torch.manual_seed(3)
    base = load_base(base_path)
    cfg = LoraConfig(r=4, lora_alpha=16, target_modules=targets.split(","), lora_dropout=0.0,
                     task_type="CAUSAL_LM", fan_in_fan_out=base.config.model_type == "gpt2")
    model = get_peft_model(base, cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn_like(p) * 0.1)
    model.create_or_update_model_card = lambda *a, **k: None  # README.md needs Jinja2, not pinned
    model.save_pretrained(out, safe_serialization=True)
    print("ok saved")


def same_adapter(d1, d2):
    c1 = json.load(open(os.path.join(d1, "adapter_config.json")))
    c2 = json.load(open(os.path.join(d2, "adapter_config.json")))
    for key in ("r", "lora_alpha", "fan_in_fan_out", "peft_type", "bias"):
        if c1.get(key) != c2.get(key):
            fail("%s: %r vs %r" % (key, c1.get(key), c2.get(key)))
    if sorted(c1["target_modules"]) != sorted(c2["target_modules"]):
        fail("target_modules %r vs %r" % (c1["target_modules"], c2["target_modules"]))
    t1, t2 = adapter_tensors(d1), adapter_tensors(d2)
    if sorted(t1) != sorted(t2):
        fail("keys differ: %s" % sorted(set(t1) ^ set(t2))[:5])
    for k in t1:
        if t1[k].dtype != t2[k].dtype or not np.array_equal(t1[k], t2[k]):
            fail("tensor %s differs" % k)
    print("ok same %d tensors" % len(t1))


def merge_save(base_path, adapter, out):
    from peft import PeftModel
    model = PeftModel.from_pretrained(load_base(base_path), adapter).merge_and_unload()
    model.save_pretrained(out, safe_serialization=True)
    print("ok merged")


def llama_permute(w, n_head):  # convert_hf_to_gguf.py LlamaModel.permute
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def check_gguf(base_path, adapter, path):
    from gguf import GGUFReader, GGMLQuantizationType
    cfg = json.load(open(os.path.join(adapter, "adapter_config.json")))
    base_cfg = json.load(open(os.path.join(base_path, "config.json")))
    r = GGUFReader(path)

    def field(key):
        f = r.fields.get(key)
        if f is None:
            fail("no key " + key)
        v = f.parts[f.data[0]]
        return bytes(v).decode() if f.types[0].name == "STRING" else v[0]

    if field("general.type") != "adapter" or field("adapter.type") != "lora":
        fail("general.type %r adapter.type %r" % (field("general.type"), field("adapter.type")))
    if field("general.architecture") != base_cfg["model_type"]:
        fail("general.architecture %r, base model_type %r" % (field("general.architecture"), base_cfg["model_type"]))
    alpha = float(field("adapter.lora.alpha"))
    if alpha != float(np.float32(cfg["lora_alpha"])):
        fail("adapter.lora.alpha %r, adapter's %r" % (alpha, cfg["lora_alpha"]))
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down"}
    want = {}
    for k, v in adapter_tensors(adapter).items():
        module = k[len("base_model.model."):-len(".lora_A.weight")]
        parts = module.split(".")  # model.layers.N.self_attn.q_proj
        stem = "blk.%s.%s.weight" % (parts[2], names[".".join(parts[3:])])
        if ".lora_A." in k:
            want[stem + ".lora_a"] = v
        else:
            if stem.endswith(".attn_q.weight"):
                v = llama_permute(v, base_cfg["num_attention_heads"])
            elif stem.endswith(".attn_k.weight"):
                v = llama_permute(v, base_cfg["num_key_value_heads"])
            want[stem + ".lora_b"] = v
    got = {t.name: t for t in r.tensors}
    if sorted(got) != sorted(want):
        fail("tensor names %s, expected %s" % (sorted(got)[:4], sorted(want)[:4]))
    for name, t in got.items():
        if t.tensor_type != GGMLQuantizationType.F32:
            fail("%s has type %s" % (name, t.tensor_type.name))
        w = want[name]
        if list(t.shape) != [w.shape[1], w.shape[0]]:  # ggml ne order
            fail("%s has ne %s, expected %s" % (name, list(t.shape), [w.shape[1], w.shape[0]]))
        if not np.array_equal(np.asarray(t.data).reshape(w.shape), w):
            fail("%s values differ" % name)
    print("ok gguf %d tensors alpha %g" % (len(got), alpha))


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    {"make-base": make_base, "check-peft": check_peft, "peft-save": peft_save, "same-adapter": same_adapter,
     "merge-save": merge_save, "check-gguf": check_gguf}[cmd](*args)


if __name__ == "__main__":
    main()
