#!/usr/bin/python3
"""PyTorch oracle for l2l's model and optimizer arithmetic.

Reads what `l2l-oracle-dump --out DIR` wrote (see worker/reference/oracle_dump_main.cc) for each
variant (tied / untied embeddings) and checks it against an independent GPT-2 written
here in plain torch (no transformers package):

  * probabilities (softmax of the logits), the loss and every parameter gradient,
    recomputed in float64 from the same weights and tokens;
  * one torch.optim.AdamW step (param groups: weight decay on 2-D weights only, as
    GPT-2/nanoGPT), in float32 from the same weights and OUR gradients, without and with
    torch.nn.utils.clip_grad_norm_.

Tolerances (our side is fp32; float64 reference):
  probs      |ours - ref| <= 1e-7 + 1e-5 * |ref|          (observed max 2e-8)
  loss       relative 1e-5                                (observed ~1e-7)
  gradients  per tensor: max |ours - ref| <= 2e-5 * max |ref| + 1e-9
             (fp32 accumulation over B*T*M rows; observed ~4e-7 of max |ref|)
  AdamW      |ours - torch| <= 1e-7 + 1e-6 * |torch| (same fp32 inputs: rounding only;
             the step moves weights by ~lr = 1e-2, so any wrong term shows)
  clip       grad norm relative 1e-6; clip coefficient relative 1e-5

Missing torch or numpy is a failure, not a skip. safetensors files are parsed with
json + numpy (the safetensors python package is not required).

Usage: torch_oracle.py DIR
"""
import json
import math
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

from oracle_checker import Checker  # beside this script

DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I32": np.int32, "I64": np.int64}


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + n])
    data = blob[8 + n :]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        if info["dtype"] == "BF16":
            raw = np.frombuffer(data[begin:end], dtype=np.uint16).astype(np.uint32) << 16
            arr = raw.view(np.float32)
        else:
            arr = np.frombuffer(data[begin:end], dtype=DTYPES[info["dtype"]])
        out[name] = arr.reshape(info["shape"]).copy()
    return out


def gelu(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def gpt2_logits(P, idx, spec):
    """P: name -> tensor (HF GPT-2 names, Conv1D weights (in, out)); idx (B,T) int64."""
    B, T = idx.shape
    C, NH, L = spec["d_model"], spec["n_head"], spec["n_layer"]
    hs = C // NH
    x = P["wte.weight"][idx] + P["wpe.weight"][:T]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for i in range(L):
        p = lambda s: P["h.%d.%s" % (i, s)]  # noqa: E731
        h = F.layer_norm(x, (C,), p("ln_1.weight"), p("ln_1.bias"), eps=1e-5)
        qkv = h @ p("attn.c_attn.weight") + p("attn.c_attn.bias")
        q, k, v = qkv.split(C, dim=-1)
        q, k, v = [t.view(B, T, NH, hs).transpose(1, 2) for t in (q, k, v)]
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ p("attn.c_proj.weight") + p("attn.c_proj.bias")
        h = F.layer_norm(x, (C,), p("ln_2.weight"), p("ln_2.bias"), eps=1e-5)
        x = x + gelu(h @ p("mlp.c_fc.weight") + p("mlp.c_fc.bias")) @ p("mlp.c_proj.weight") + p("mlp.c_proj.bias")
    x = F.layer_norm(x, (C,), P["ln_f.weight"], P["ln_f.bias"], eps=1e-5)
    head = P["wte.weight"] if spec["tied_embeddings"] else P["lm_head.weight"]
    return x @ head.t()


def check_variant(d, chk):
    meta = json.load(open(d + "/meta.json"))
    spec = meta["spec"]
    weights = read_safetensors(d + "/model.safetensors")
    data = read_safetensors(d + "/data.safetensors")
    grads = read_safetensors(d + "/grads.safetensors")
    print("%s: V=%d T=%d C=%d L=%d NH=%d F=%d tied=%s, micro-batches %d of %dx%d" % (
        d, spec["vocab_size"], spec["seq_len"], spec["d_model"], spec["n_layer"], spec["n_head"], spec["d_ff"],
        spec["tied_embeddings"], meta["M"], meta["B"], meta["T"]))

    # ---- forward and backward in float64 ----
    P = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in weights.items()}
    chk.true("weights: %d tensors, grads for each" % len(P), set(P) == set(grads))
    inputs = torch.tensor(data["inputs"], dtype=torch.int64)
    targets = torch.tensor(data["targets"], dtype=torch.int64)
    M = inputs.shape[0]
    total = 0.0
    probs = []
    for u in range(M):
        logits = gpt2_logits(P, inputs[u], spec)
        probs.append(logits.softmax(-1).detach())
        # Each micro-batch's mean loss, averaged over micro-batches (all equal sized).
        total = total + F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets[u].reshape(-1)) / M
    total.backward()
    chk.close("probs (M,B,T,V)", data["probs"], torch.stack(probs).numpy(), 1e-7, 1e-5)
    chk.close("loss", meta["loss"], total.item(), 0.0, 1e-5)
    for name in sorted(P):
        ref = P[name].grad.numpy()
        scale = float(np.max(np.abs(ref)))
        chk.close("grad " + name, grads[name], ref, 2e-5 * scale + 1e-9, 0.0)

    # ---- one AdamW step in float32 from the same weights and our gradients ----
    for which in ("noclip", "clip"):
        o = meta["steps"][which]
        after = read_safetensors(d + "/after_%s.safetensors" % which)
        params = {k: torch.nn.Parameter(torch.tensor(v, dtype=torch.float32)) for k, v in weights.items()}
        for k, p in params.items():
            p.grad = torch.tensor(grads[k], dtype=torch.float32)
        decay = [p for k, p in params.items() if p.dim() == 2]
        no_decay = [p for k, p in params.items() if p.dim() != 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": o["weight_decay"]},
                                 {"params": no_decay, "weight_decay": 0.0}],
                                lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"], foreach=False)
        norm64 = math.sqrt(sum(float(np.sum(grads[k].astype(np.float64) ** 2)) for k in grads))
        chk.close("[%s] global grad norm" % which, o["grad_norm"], norm64, 0.0, 1e-6)
        if o["clip"] == "global":
            torch.nn.utils.clip_grad_norm_(list(params.values()), o["grad_clip"])
            coef = min(1.0, o["grad_clip"] / (norm64 + 1e-6))
            chk.true("[clip] clipping is active (coefficient < 1)", coef < 0.99)
            chk.close("[clip] clip coefficient", o["clip_coefficient"], coef, 0.0, 1e-5)
        opt.step()
        moved = 0.0
        for name in sorted(params):
            ref = params[name].detach().numpy()
            moved = max(moved, float(np.max(np.abs(ref - weights[name]))))
            chk.close("[%s] AdamW %s" % (which, name), after[name], ref, 1e-7, 1e-6)
        chk.true("[%s] the step moved the weights (max %.2e)" % (which, moved), moved > 1e-3)


def main():
    if len(sys.argv) != 2:
        print("usage: torch_oracle.py DIR (written by l2l-oracle-dump --out DIR)", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    chk = Checker(width=44)
    for variant in ("tied", "untied"):
        check_variant(sys.argv[1] + "/" + variant, chk)
    if chk.failures:
        print("\nFAILED (%d):" % len(chk.failures))
        for f in chk.failures:
            print("  " + f)
        return 1
    print("\nall oracle checks passed (torch %s)" % torch.__version__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
