"""Hugging Face transformers oracle for l2l's model families.

Reads what `l2l-oracle-dump --hf --out DIR` wrote (see worker/reference/oracle_dump_main.cc): per
variant, our initial weights under their Hugging Face names, random tokens, our loss,
our gradients and our weights after one AdamW step. For each variant it builds the
transformers class the dump names (GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM,
MistralForCausalLM, MixtralForCausalLM, BertForMaskedLM, BertForSequenceClassification) from a config.json made here from our spec, loads our
model.safetensors with from_pretrained (no missing or unexpected keys allowed), runs it
in float64 and checks:

  loss       relative <= 1e-5 (BERT: the model's own loss from labels, our -1 targets as
             its -100, with token_type_ids and the padding attention_mask)
  gradients  per tensor: max |ours - ref| <= 1e-4 * max |ref|   (every parameter)
  AdamW      one torch.optim.AdamW step (decay on 2-D weights only) from the same fp32
             weights and OUR gradients: |ours - torch| <= 1e-5 absolute
  Mixtral    (mixture of experts; loss = cross-entropy + router_aux_loss_coef * the model's
             own aux_loss when output_router_logits) also three AdamW steps: at each step
             the weights we had, HF's loss and gradients at them, the experts HF routed
             tokens to (ours must be the same), and torch.optim.AdamW fed our gradients
             with .grad = None for every expert that got no token (zero_grad(set_to_none=
             True) semantics: such an expert is skipped, moments and step count included);
             after three steps |ours - torch| <= 1e-5, the starved expert bit-identical
             to its initial weights and absent from the optimizer's state.

Must run with the oracle venv's python (scripts/oracle_venv.sh); a missing package is a
failure, never a skip. HF_HUB_OFFLINE=1: nothing is fetched.

Usage: hf_oracle.py DIR
"""
import json
import math
import os
import sys
import tempfile

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402
from oracle_checker import Checker  # noqa: E402  (beside this script)


def hf_config(arch, spec):
    """The transformers config of our spec (the mapping an export must also use)."""
    tied = spec["tied_embeddings"]
    if arch in ("BertForMaskedLM", "BertForSequenceClassification"):
        extra = {} if arch == "BertForMaskedLM" else {"num_labels": spec["num_labels"]}
        return transformers.BertConfig(
            vocab_size=spec["vocab_size"], hidden_size=spec["d_model"], num_hidden_layers=spec["n_layer"],
            num_attention_heads=spec["n_head"], intermediate_size=spec["d_ff"], hidden_act="gelu",
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
            max_position_embeddings=spec["seq_len"], type_vocab_size=spec["type_vocab_size"],
            layer_norm_eps=spec["layer_norm_eps"], position_embedding_type="absolute",
            tie_word_embeddings=True, architectures=[arch], **extra)
    if arch == "GPT2LMHeadModel":
        return transformers.GPT2Config(
            vocab_size=spec["vocab_size"], n_positions=spec["seq_len"], n_embd=spec["d_model"],
            n_layer=spec["n_layer"], n_head=spec["n_head"], n_inner=spec["d_ff"],
            activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            layer_norm_epsilon=1e-5, tie_word_embeddings=tied, architectures=[arch])
    common = dict(
        vocab_size=spec["vocab_size"], hidden_size=spec["d_model"], intermediate_size=spec["d_ff"],
        num_hidden_layers=spec["n_layer"], num_attention_heads=spec["n_head"],
        num_key_value_heads=spec["n_kv_heads"] or spec["n_head"],
        max_position_embeddings=spec["seq_len"], rms_norm_eps=spec["rms_norm_eps"],
        rope_theta=spec["rope_theta"], tie_word_embeddings=tied, hidden_act="silu",
        attention_dropout=0.0, architectures=[arch])
    rs = spec["rope_scaling"]
    if rs["type"] == "linear":
        common["rope_scaling"] = {"rope_type": "linear", "factor": rs["factor"]}
    elif rs["type"] == "llama3":
        common["rope_scaling"] = {
            "rope_type": "llama3", "factor": rs["factor"], "low_freq_factor": rs["low_freq_factor"],
            "high_freq_factor": rs["high_freq_factor"],
            "original_max_position_embeddings": rs["original_max_position_embeddings"]}
    if arch == "LlamaForCausalLM":
        assert not spec["qkv_bias"], "Llama with q/k/v biases is Qwen2"
        return transformers.LlamaConfig(attention_bias=False, mlp_bias=False, **common)
    if arch == "Qwen2ForCausalLM":
        assert spec["qkv_bias"], "Qwen2 always has q/k/v biases"
        return transformers.Qwen2Config(use_sliding_window=False, **common)
    if arch == "MistralForCausalLM":
        assert not spec["qkv_bias"]
        return transformers.MistralConfig(sliding_window=None, **common)
    if arch == "MixtralForCausalLM":
        assert not spec["qkv_bias"] and spec.get("norm_topk_prob", True)
        return transformers.MixtralConfig(
            sliding_window=None, num_local_experts=spec["num_experts"], num_experts_per_tok=spec["experts_per_token"],
            router_aux_loss_coef=spec.get("router_aux_loss_coef", 0.001),
            output_router_logits=spec.get("output_router_logits", False), router_jitter_noise=0.0, **common)
    raise ValueError("unknown architecture " + arch)


def check_variant(d, chk):
    meta = json.load(open(os.path.join(d, "meta.json")))
    spec, arch = meta["spec"], meta["hf_architecture"]
    print("%s: %s %s" % (d, arch, json.dumps(spec, sort_keys=True)))
    weights = load_file(os.path.join(d, "model.safetensors"))
    grads = load_file(os.path.join(d, "grads.safetensors"))
    data = load_file(os.path.join(d, "data.safetensors"))

    # ---- the HF model, loaded from our file by from_pretrained ----
    cls = getattr(transformers, arch)
    config = hf_config(arch, spec)
    with tempfile.TemporaryDirectory() as tmp:
        config.save_pretrained(tmp)
        # Our names are the hub files' (GPT-2 without "transformer."). transformers loads a
        # prefix-less file only when every key lacks the prefix, which an untied GPT-2's
        # lm_head.weight breaks, so the file it loads carries the state_dict names.
        expected = set(cls(config).state_dict())
        prefix = cls.base_model_prefix + "."
        renamed = {(n if n in expected else prefix + n): w for n, w in weights.items()}
        save_file(renamed, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        model, info = cls.from_pretrained(tmp, torch_dtype=torch.float32, output_loading_info=True)
    chk.true("from_pretrained: no missing keys %s" % info["missing_keys"], not info["missing_keys"])
    chk.true("from_pretrained: no unexpected keys %s" % info["unexpected_keys"], not info["unexpected_keys"])
    chk.true("from_pretrained: no mismatched keys", not info["mismatched_keys"])
    n = sum(p.numel() for p in model.parameters())
    chk.true("parameter count: ours %d, transformers %d" % (meta["num_params"], n), meta["num_params"] == n)
    model = model.double()
    model.train()  # every dropout probability is 0: train() only enables the grad paths
    state = model.state_dict()

    def key(name):
        # GPT-2's hub files drop the base model's prefix ("transformer."); Llama's keep it.
        return name if name in state else model.base_model_prefix + "." + name

    for name, w in weights.items():
        chk.true("weight %s loaded unchanged" % name,
                 key(name) in state and torch.equal(state[key(name)], torch.tensor(w, dtype=torch.float64)))

    # ---- loss and gradients in float64 ----
    inputs = torch.tensor(data["inputs"], dtype=torch.int64)
    targets = torch.tensor(data["targets"], dtype=torch.int64)
    M = inputs.shape[0]
    total = 0.0
    encoder = arch.startswith("Bert")
    if encoder:
        chk.true("the batch has padded tokens and several token types",
                 (data["attention_mask"] == 0).any() and len(np.unique(data["token_types"])) > 2)
    for u in range(M):
        if encoder:
            # Our "no target" (-1) is transformers' ignore_index (-100); a classification
            # label is the target at position 0.
            labels = torch.where(targets[u] < 0, torch.full_like(targets[u], -100), targets[u])
            if arch == "BertForSequenceClassification":
                labels = labels[:, 0]
            out = model(input_ids=inputs[u],
                        token_type_ids=torch.tensor(data["token_types"][u], dtype=torch.int64),
                        attention_mask=torch.tensor(data["attention_mask"][u], dtype=torch.int64),
                        labels=labels)
            total = total + out.loss / M
            continue
        if arch == "MixtralForCausalLM":
            total = total + mixtral_loss(model, spec, inputs[u], targets[u]) / M
            continue
        logits = model(input_ids=inputs[u], use_cache=False).logits
        total = total + F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets[u].reshape(-1)) / M
    total.backward()
    chk.close("loss", meta["loss"], total.item(), 0.0, 1e-5)
    params = dict(model.named_parameters())
    chk.true("gradients: one per HF parameter (%d)" % len(params), set(params) == set(key(g) for g in grads))
    for name in sorted(grads):
        if key(name) not in params:
            continue
        g = params[key(name)].grad
        ref = np.zeros(grads[name].shape) if g is None else g.numpy()  # None: an expert without tokens
        scale = float(np.max(np.abs(ref)))
        if name.endswith("attention.self.key.bias"):
            # The softmax over keys is invariant to q . b_k (the same for every key): the
            # exact gradient is 0, and both sides hold roundoff. Scale the tolerance by the
            # layer's query-bias gradient instead.
            sibling = params[key(name.replace(".key.bias", ".query.bias"))].grad.numpy()
            scale = float(np.max(np.abs(sibling)))
        chk.close("grad " + name, grads[name], ref, 1e-4 * scale + 1e-12, 0.0)

    # ---- one AdamW step in float32 from the same weights and our gradients ----
    o = meta["steps"]["noclip"]
    after = load_file(os.path.join(d, "after_noclip.safetensors"))
    ps = {k: torch.nn.Parameter(torch.tensor(v, dtype=torch.float32)) for k, v in weights.items()}
    # Mixtral: an expert that got no token has .grad None (set_to_none semantics).
    hit = hit_experts(model, spec, inputs) if arch == "MixtralForCausalLM" else None
    for k, p in ps.items():
        ex = expert_of(k)
        p.grad = None if hit is not None and ex is not None and ex not in hit else \
            torch.tensor(grads[k], dtype=torch.float32)
    decay = [p for p in ps.values() if p.dim() == 2]
    no_decay = [p for p in ps.values() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": o["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"], foreach=False)
    opt.step()
    moved = 0.0
    for name in sorted(ps):
        ref = ps[name].detach().numpy()
        moved = max(moved, float(np.max(np.abs(ref - weights[name]))))
        chk.close("AdamW " + name, after[name], ref, 1e-5, 0.0)
    chk.true("the step moved the weights (max %.2e)" % moved, moved > 1e-3)
    if arch == "MixtralForCausalLM":
        check_moe_steps(d, meta, model, key, weights, inputs, targets, chk)


def expert_of(name):
    """(layer, expert) of a Mixtral expert tensor's name, else None."""
    parts = name.split(".")
    if "experts" not in parts:
        return None
    return int(parts[parts.index("layers") + 1]), int(parts[parts.index("experts") + 1])


def mixtral_loss(model, spec, inputs, targets):
    """One micro-batch's loss as MixtralForCausalLM forms it: cross-entropy (our targets, not
    shifted) plus router_aux_loss_coef * aux_loss when output_router_logits."""
    out = model(input_ids=inputs, use_cache=False, output_router_logits=spec.get("output_router_logits", False))
    logits = out.logits
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    if spec.get("output_router_logits", False):
        loss = loss + model.config.router_aux_loss_coef * out.aux_loss
    return loss


def hit_experts(model, spec, inputs):
    """(layer, expert) pairs that got at least one token in any micro-batch, from HF's router."""
    hit = set()
    k = spec["experts_per_token"]
    with torch.no_grad():
        for u in range(inputs.shape[0]):
            out = model(input_ids=inputs[u], use_cache=False, output_router_logits=True)
            for layer, logits in enumerate(out.router_logits):
                probs = F.softmax(logits, dim=-1, dtype=torch.float)
                for e in torch.topk(probs, k, dim=-1).indices.flatten().tolist():
                    hit.add((layer, e))
    return hit


def check_moe_steps(d, meta, model, key, weights, inputs, targets, chk):
    spec = meta["spec"]
    E, L = spec["num_experts"], spec["n_layer"]
    o = meta["steps"]["noclip"]
    ps = {k: torch.nn.Parameter(torch.tensor(v, dtype=torch.float32)) for k, v in weights.items()}
    decay = [p for p in ps.values() if p.dim() == 2]
    no_decay = [p for p in ps.values() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": o["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"], foreach=False)

    starved = set((l, e) for l in range(L) for e in range(E))
    for i, st in enumerate(meta["moe_steps"]):
        ours = load_file(os.path.join(d, "steps", "step%d_weights.safetensors" % i))
        for name in sorted(ps):
            chk.close("step %d: our weights before the step, %s" % (i, name), ours[name],
                      ps[name].detach().numpy(), 1e-5, 0.0)
        # HF at our weights of this step: routing, loss and gradients.
        model.load_state_dict({key(n): torch.tensor(w, dtype=torch.float64) for n, w in ours.items()})
        model.zero_grad(set_to_none=True)
        hit = hit_experts(model, spec, inputs)
        touched = set((l, e) for l in range(L) for e in range(E) if st["touched"][l * E + e])
        chk.true("step %d: experts with tokens: ours %s, HF %s" % (i, sorted(touched), sorted(hit)), touched == hit)
        starved -= hit
        total = 0.0
        for u in range(inputs.shape[0]):
            total = total + mixtral_loss(model, spec, inputs[u], targets[u]) / inputs.shape[0]
        total.backward()
        chk.close("step %d: loss" % i, st["loss"], total.item(), 0.0, 1e-5)
        g = load_file(os.path.join(d, "steps", "step%d_grads.safetensors" % i))
        params = dict(model.named_parameters())
        for name in sorted(g):
            hg = params[key(name)].grad
            ref = np.zeros(g[name].shape) if hg is None else hg.numpy()
            chk.close("step %d: grad %s" % (i, name), g[name], ref, 1e-4 * float(np.max(np.abs(ref))) + 1e-12, 0.0)
        # torch AdamW on our gradients, .grad None for experts without tokens.
        for name, p in ps.items():
            ex = expert_of(name)
            p.grad = None if ex is not None and ex not in hit else torch.tensor(g[name], dtype=torch.float32)
        for group in opt.param_groups:
            group["lr"] = st["lr"]
        opt.step()
        opt.zero_grad(set_to_none=True)
    chk.true("an expert got no token in any step (the starved case is exercised): %s" % sorted(starved),
             len(starved) > 0)
    after = load_file(os.path.join(d, "after_3steps.safetensors"))
    for name in sorted(ps):
        chk.close("3 AdamW steps " + name, after[name], ps[name].detach().numpy(), 1e-5, 0.0)
        if expert_of(name) in starved:
            chk.true("starved expert %s unchanged and without optimizer state" % name,
                     np.array_equal(after[name], weights[name]) and len(opt.state[ps[name]]) == 0)
    counts = {}
    for name, p in ps.items():
        ex = expert_of(name)
        if ex is not None and name.endswith("w1.weight"):
            counts[ex] = int(opt.state[p]["step"]) if len(opt.state[p]) else 0
    ours = meta["expert_steps"]
    chk.true("per-expert step counts: ours %s, torch %s" % (ours, counts),
             all(ours[l * E + e] == counts[(l, e)] for (l, e) in counts))


def main():
    if len(sys.argv) != 2:
        print("usage: hf_oracle.py DIR (written by l2l-oracle-dump --hf --out DIR)", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    chk = Checker()
    root = sys.argv[1]
    variants = sorted(v for v in os.listdir(root) if os.path.isfile(os.path.join(root, v, "meta.json")))
    archs = set(json.load(open(os.path.join(root, v, "meta.json")))["hf_architecture"] for v in variants)
    want = {"GPT2LMHeadModel", "LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM", "MixtralForCausalLM",
            "BertForMaskedLM", "BertForSequenceClassification"}
    chk.true("variants cover %s" % sorted(want), want <= archs)
    for v in variants:
        check_variant(os.path.join(root, v), chk)
    if chk.failures:
        print("\nFAILED (%d):" % len(chk.failures))
        for f in chk.failures:
            print("  " + f)
        return 1
    print("\nall %d variants match transformers %s (torch %s)" % (len(variants), transformers.__version__,
                                                                  torch.__version__))
    return 0


if __name__ == "__main__":
    sys.exit(main())
