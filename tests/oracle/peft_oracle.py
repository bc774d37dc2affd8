"""Hugging Face PEFT oracle for l2l's LoRA training (common/lora.h).

Reads what `l2l-oracle-dump --lora --out DIR` wrote (worker/reference/oracle_dump_main.cc):
per variant the frozen base under its Hugging Face names, our adapters (A, B; B non-zero
so every gradient path matters) and modules_to_save tensors, random tokens, our loss,
our gradients of what trains and what trains after one AdamW step. For each variant it
builds the transformers class (config made by hf_oracle.hf_config from our spec), loads
the base with from_pretrained, wraps it with peft.get_peft_model(LoraConfig(r, alpha,
target_modules, lora_dropout, modules_to_save)), OVERWRITES every lora_A / lora_B with
ours (PEFT's own initialisation uses torch's generator, which l2l does not reproduce),
runs it in float64 and checks:

  trainable  PEFT's trainable parameters are exactly our adapters + modules_to_save
  loss       relative <= 1e-5
  gradients  per tensor: max |ours - ref| <= 1e-4 * max |ref|
  AdamW      one torch.optim.AdamW step (weight decay on every trainable tensor, all
             2-D) from the same fp32 values and OUR gradients: |ours - torch| <= 1e-5 abs
  adapter    our PEFT adapter directory of the adapters after the step
             (common/formats/lora_export.h + peft_adapter.h) loads with PeftModel.from_pretrained with
             no unexpected or missing adapter keys, holds exactly our values, and gives
             the logits of the model our after-step adapters were copied into (1e-6 abs)

Adapter dropout (variants with meta lora.dropout > 0): PEFT is built with that
lora_dropout, and each of its lora_dropout modules (torch.nn.Dropout, checked) is
replaced by CounterMask, which multiplies the adapter's input by the mask l2l documents
(common/lora.h LoraDropoutStream, common/rng.h DropoutKeep), recomputed HERE from the
formula (an independent implementation: numpy uint64 SplitMix64 and FNV-1a, keyed by
train.seed, step 0, the block and weight from PEFT's module name, the micro-batch, the
element's index) and scaled by 1/(1-p). Loss and gradients are then checked as above;
beside them: the masks kept a fraction of the elements within binomial bounds of 1-p,
and PEFT without dropout gives a loss farther from ours than the tolerance (so the masks
mattered).

A bf16 base (lora.base_dtype bf16): the dump's model.safetensors holds the bf16-rounded
base l2l trains on, so the checks above hold with the same bounds; beside them the loss
of the same adapters on the unrounded fp32 base (model_fp32.safetensors) is printed and
must lie within 1e-2 relative of ours (the stated bound of a bf16 base).

Must run with the oracle venv's python (scripts/oracle_venv.sh: peft 0.13.2 over torch
1.13, transformers 4.46.3); a missing package is a failure, never a skip.

Usage: peft_oracle.py DIR
"""
import json
import os
import re
import sys
import tempfile

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402
import peft  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402
from oracle_checker import Checker  # noqa: E402  (beside this script)
from hf_oracle import hf_config  # noqa: E402


def load_base(arch, spec, path):
    cls = getattr(transformers, arch)
    config = hf_config(arch, spec)
    weights = load_file(path)
    with tempfile.TemporaryDirectory() as tmp:
        config.save_pretrained(tmp)
        expected = set(cls(config).state_dict())
        prefix = cls.base_model_prefix + "."
        renamed = {(n if n in expected else prefix + n): w for n, w in weights.items()}
        save_file(renamed, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        model, info = cls.from_pretrained(tmp, torch_dtype=torch.float32, output_loading_info=True)
    return model, info


U64 = (1 << 64) - 1
LORA_DROPOUT_TAG = 0x4C6F524144726F70  # "LoRADrop", common/lora.h kLoraDropoutTag


def splitmix64_int(x):
    """common/rng.h SplitMix64 on a Python int (mod 2^64)."""
    x = (x + 0x9E3779B97F4A7C15) & U64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & U64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & U64
    return x ^ (x >> 31)


def splitmix64_np(x):
    """The same on a numpy uint64 array (array arithmetic wraps mod 2^64)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def fnv1a64(text):
    h = 0xCBF29CE484222325
    for b in text.encode():
        h = ((h ^ b) * 0x100000001B3) & U64
    return h


def dropout_stream(seed, step, block, micro_batch, weight):
    """common/lora.h LoraDropoutStream."""
    k = splitmix64_int((seed ^ LORA_DROPOUT_TAG) & U64)
    for v in (step, block, micro_batch):
        k = splitmix64_int(k ^ (v & U64))
    return splitmix64_int(k ^ fnv1a64(weight))


class CounterMask(torch.nn.Module):
    """Stands in for PEFT's lora_dropout: x * keep / (1-p) with l2l's documented mask for
    (train.seed, step, block, weight) and the micro-batch in state["u"]."""

    def __init__(self, p, seed, step, block, weight, state):
        super().__init__()
        self.p, self.seed, self.step, self.block, self.weight, self.state = p, seed, step, block, weight, state
        self.threshold = np.uint64(int(p * 16777216.0))  # floor(p * 2^24)

    def forward(self, x):
        stream = dropout_stream(self.seed, self.step, self.block, self.state["u"], self.weight)
        i = np.arange(x.numel(), dtype=np.uint64)  # (B, T, in) row-major: (b*T + t)*in + c
        keep = (splitmix64_np(np.uint64(stream) + i) >> np.uint64(40)) >= self.threshold
        self.state["kept"] += int(keep.sum())
        self.state["total"] += keep.size
        mask = torch.tensor(keep.reshape(tuple(x.shape)), dtype=x.dtype) / (1.0 - self.p)
        return x * mask


def install_masks(pm, meta, state):
    """Replaces every lora_dropout module (PEFT's torch.nn.Dropout) by a CounterMask."""
    lo = meta["lora"]
    replaced = 0
    for name, module in pm.named_modules():
        if not hasattr(module, "lora_dropout") or "default" not in module.lora_dropout:
            continue
        drop = module.lora_dropout["default"]
        if not isinstance(drop, torch.nn.Dropout) or abs(drop.p - lo["dropout"]) > 1e-12:
            raise RuntimeError("%s: lora_dropout is %r, expected torch.nn.Dropout(p=%g)" % (name, drop, lo["dropout"]))
        m = re.search(r"\.(?:layers|h)\.(\d+)\.(.+)$", name)
        if m is None:
            raise RuntimeError("%s: no block index in the module name" % name)
        module.lora_dropout["default"] = CounterMask(lo["dropout"], lo["train_seed"], lo["step"], int(m.group(1)),
                                                     m.group(2) + ".weight", state)
        replaced += 1
    return replaced


def peft_model(meta, base_path, adapters, dropout=0.0):
    arch, spec, lo = meta["hf_architecture"], meta["spec"], meta["lora"]
    model, info = load_base(arch, spec, base_path)
    cfg = peft.LoraConfig(r=lo["r"], lora_alpha=lo["alpha"], target_modules=lo["target_modules"],
                          lora_dropout=dropout, bias="none", modules_to_save=lo["modules_to_save"] or None,
                          fan_in_fan_out=arch == "GPT2LMHeadModel")
    pm = peft.get_peft_model(model, cfg)
    # Our adapters into PEFT's modules: "<module>.lora_A" -> base_model.model.<module>.lora_A.default.
    modules = dict(pm.named_modules())
    loaded = 0
    with torch.no_grad():
        for name, value in adapters.items():
            module, ab = name.rsplit(".", 1)
            if ab in ("lora_A", "lora_B"):
                getattr(modules["base_model.model." + module], ab)["default"].weight.copy_(torch.tensor(value))
                loaded += 1
            else:  # a modules_to_save tensor ("lm_head.weight"): PEFT's trained copy
                getattr(modules["base_model.model." + module].modules_to_save["default"], ab).copy_(
                    torch.tensor(value))
    return pm.double(), info, loaded


def trainable_key(name):
    """PEFT's parameter name -> the dump's key."""
    n = name[len("base_model.model."):]
    n = n.replace(".lora_A.default.weight", ".lora_A").replace(".lora_B.default.weight", ".lora_B")
    n = n.replace(".modules_to_save.default.", ".")
    return n


def mean_loss(pm, data, state=None):
    """state: the CounterMasks' (its "u" is set to each micro-batch's index)."""
    inputs = torch.tensor(data["inputs"], dtype=torch.int64)
    targets = torch.tensor(data["targets"], dtype=torch.int64)
    M = inputs.shape[0]
    total = 0.0
    for u in range(M):
        if state is not None:
            state["u"] = u
        logits = pm(input_ids=inputs[u], use_cache=False).logits
        total = total + F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets[u].reshape(-1)) / M
    return total


def check_variant(d, chk):
    meta = json.load(open(os.path.join(d, "meta.json")))
    print("%s: %s lora %s" % (d, meta["hf_architecture"], json.dumps(meta["lora"], sort_keys=True)))
    adapters = load_file(os.path.join(d, "adapters.safetensors"))
    grads = load_file(os.path.join(d, "grads.safetensors"))
    after = load_file(os.path.join(d, "after_noclip.safetensors"))
    data = load_file(os.path.join(d, "data.safetensors"))

    drop = meta["lora"].get("dropout", 0.0)
    pm, info, loaded = peft_model(meta, os.path.join(d, "model.safetensors"), adapters, dropout=drop)
    chk.true("from_pretrained: no missing keys %s" % info["missing_keys"], not info["missing_keys"])
    chk.true("from_pretrained: no unexpected keys %s" % info["unexpected_keys"], not info["unexpected_keys"])
    chk.true("adapters loaded: %d" % loaded, loaded > 0)
    state = None
    if drop > 0:
        state = {"u": 0, "kept": 0, "total": 0}
        replaced = install_masks(pm, meta, state)
        chk.true("dropout: every adapter's lora_dropout (%d) replaced by l2l's mask" % replaced,
                 replaced == loaded // 2 and replaced > 0)
    pm.train()  # the model's own dropout probabilities are 0; the adapters' are the masks
    params = {trainable_key(n): p for n, p in pm.named_parameters() if p.requires_grad}
    ours = set(grads)
    chk.true("trainable: PEFT's %d tensors are ours (%d)" % (len(params), len(ours)), set(params) == ours)

    total = mean_loss(pm, data, state)
    total.backward()
    chk.close("loss", meta["loss"], total.item(), 0.0, 1e-5)
    if drop > 0:
        n, kept = state["total"], state["kept"]
        sd = (n * drop * (1 - drop)) ** 0.5
        print("  dropout %g: kept %d of %d elements (expected %.0f +- %.0f)" % (drop, kept, n, n * (1 - drop), sd))
        chk.true("dropout: kept fraction within 5 sd of 1-p", abs(kept - n * (1 - drop)) <= 5 * sd)
        plain, _, _ = peft_model(meta, os.path.join(d, "model.safetensors"), adapters)
        with torch.no_grad():
            loss0 = mean_loss(plain, data).item()
        rel0 = abs(meta["loss"] - loss0) / abs(loss0)
        print("  dropout %g: our loss %.7f, PEFT without dropout %.7f (relative %.2e)" % (drop, meta["loss"], loss0, rel0))
        chk.true("dropout: the masks matter (loss without them differs by %.2e > 1e-4)" % rel0, rel0 > 1e-4)
    for name in sorted(grads):
        if name not in params:
            continue
        ref = params[name].grad.numpy()
        scale = float(np.max(np.abs(ref)))
        chk.close("grad " + name, grads[name], ref, 1e-4 * scale + 1e-12, 0.0)
    chk.true("the adapters' gradients are not all zero",
             max(float(np.max(np.abs(g))) for k, g in grads.items() if k.endswith(".lora_A")) > 1e-6)

    # ---- one AdamW step in float32 from the same values and our gradients ----
    o = meta["steps"]["noclip"]
    ps = {k: torch.nn.Parameter(torch.tensor(adapters[k], dtype=torch.float32)) for k in grads}
    for k, p in ps.items():
        p.grad = torch.tensor(grads[k], dtype=torch.float32)
    opt = torch.optim.AdamW(list(ps.values()), lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"],
                            weight_decay=o["weight_decay"], foreach=False)
    opt.step()
    moved = 0.0
    for name in sorted(ps):
        ref = ps[name].detach().numpy()
        moved = max(moved, float(np.max(np.abs(ref - adapters[name]))))
        chk.close("AdamW " + name, after[name], ref, 1e-5, 0.0)
    chk.true("the step moved the adapters (max %.2e)" % moved, moved > 1e-3)

    # ---- our PEFT adapter directory (the adapters after the step) ----
    adir = os.path.join(d, "peft_adapter")
    base, _ = load_base(meta["hf_architecture"], meta["spec"], os.path.join(d, "model.safetensors"))
    loaded_pm = peft.PeftModel.from_pretrained(base, adir)
    res = peft.set_peft_model_state_dict(loaded_pm, peft.load_peft_weights(adir))
    chk.true("adapter dir: no unexpected keys %s" % res.unexpected_keys, not res.unexpected_keys)
    missing = [k for k in res.missing_keys if "lora_" in k or ".modules_to_save." in k]
    chk.true("adapter dir: no missing adapter keys %s" % missing, not missing)
    got = {trainable_key(n): p.detach().numpy() for n, p in loaded_pm.named_parameters()
           if "lora_" in n or ".modules_to_save." in n}
    chk.true("adapter dir: holds exactly the trained tensors (%d)" % len(got), set(got) == set(after))
    for name in sorted(set(got) & set(after)):
        chk.true("adapter dir: %s equals ours after the step" % name, np.array_equal(got[name], after[name]))
    ours_after, _, _ = peft_model(meta, os.path.join(d, "model.safetensors"), after)
    inputs = torch.tensor(data["inputs"], dtype=torch.int64)
    with torch.no_grad():  # evaluation: no adapter dropout
        want = ours_after.float().eval()(input_ids=inputs[0], use_cache=False).logits.numpy()
        have = loaded_pm.float().eval()(input_ids=inputs[0], use_cache=False).logits.numpy()
    chk.close("adapter dir: logits of PeftModel.from_pretrained", have, want, 1e-6, 0.0)

    if meta["lora"]["base_dtype"] != "fp32":
        pm32, _, _ = peft_model(meta, os.path.join(d, "model_fp32.safetensors"), adapters)
        with torch.no_grad():
            loss32 = mean_loss(pm32, data).item()
        rel = abs(meta["loss"] - loss32) / abs(loss32)
        print("  bf16 base: our loss %.7f, PEFT on the fp32 base %.7f (relative %.2e)" % (meta["loss"], loss32, rel))
        chk.true("bf16 base: loss within 1e-2 relative of the fp32 base's (%.2e)" % rel, rel <= 1e-2)


def main():
    if len(sys.argv) != 2:
        print("usage: peft_oracle.py DIR (written by l2l-oracle-dump --lora --out DIR)", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    print("peft %s, torch %s, transformers %s" % (peft.__version__, torch.__version__, transformers.__version__))
    chk = Checker()
    root = sys.argv[1]
    variants = sorted(v for v in os.listdir(root) if os.path.isfile(os.path.join(root, v, "meta.json")))
    archs = set(json.load(open(os.path.join(root, v, "meta.json")))["hf_architecture"] for v in variants)
    chk.true("variants cover GPT-2 and Llama", {"GPT2LMHeadModel", "LlamaForCausalLM"} <= archs)
    dropped = set(json.load(open(os.path.join(root, v, "meta.json")))["hf_architecture"] for v in variants
                  if json.load(open(os.path.join(root, v, "meta.json")))["lora"].get("dropout", 0) > 0)
    chk.true("adapter dropout variants cover GPT-2 and Llama", {"GPT2LMHeadModel", "LlamaForCausalLM"} <= dropped)
    for v in variants:
        check_variant(os.path.join(root, v), chk)
    if chk.failures:
        print("\nFAILED (%d):" % len(chk.failures))
        for f in chk.failures:
            print("  " + f)
        return 1
    print("\nall checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
