#!/usr/bin/env python3
"""The PyTorch side of scripts/bench_gpu.sh: the peers a GPU user would pick, and the
device's own rates. Three subcommands, each printing one line the script parses:

  flops --model M --T T [--layers L]
      "flops {json}": the model's parameters and training FLOPs per token, from its
      published shape alone (no torch): 6 x (the parameters a token multiplies: all but
      GPT-2's position table) + 12 x layers x d_model x T (attention scores and weighted
      sum, forward + backward, the full T x T as PaLM's MFU counts it). The same figure
      serves every system, so MFU ratios equal tokens/s ratios.
  rates [--device cuda|cpu] [--out FILE]
      "rates {json}" (and FILE): bf16 matmul TFLOP/s (torch.matmul 8192^3 on random data,
      the MFU peak), pinned H2D and D2H GB/s (1 GiB copies), and the attention rate:
      scaled_dot_product_attention (causal, bf16) forward + backward at GPT-2 XL's head
      shape, counted with the relay model's FLOPs (12 x T x d per token). Keys as
      `l2l-bench-relay --simulate --rates-json` reads them.
  train --model M --mode eager|compile|compile-full --B B --M M --T T --steps S --warmup W
      "torchbench {json}": trains the model on random tokens the usual way -- fp32
      weights, bf16 autocast, fused AdamW (lr 1e-4, wd 0.1), gradient clipping at 1.0,
      M micro-batches of B x T tokens per step (gradient accumulation). eager: as is;
      compile: torch.compile of each transformer block (regional compilation, PyTorch's
      recipe for repeated blocks: one compilation serves every layer); compile-full:
      torch.compile of the whole model. On failure "torchbench_error {json}" and a
      non-zero exit: 3 out of memory, 4 torch.compile failed, 5 anything else.

Models (random init, built from numbers, nothing downloaded): gpt2-xl (transformers
GPT2Config: 48 layers, n_embd 1600, 25 heads, vocab 50257, tied; dropout 0) and
qwen2.5-1.5b (transformers Qwen2Config: 28 layers, hidden 1536, 12 heads on 2 key/value
heads, intermediate 8960, vocab 151936, tied, RoPE base 1e6), both with sdpa attention.
--impl plain uses a hand-written GPT-2 (nn.Module) instead of transformers' (gpt2-xl only;
also the fallback when transformers is missing). --tiny shrinks either model (2 layers,
width 64, vocabulary 256: bench_gpu.sh's smoke shapes) for a CPU check of this file; --layers overrides the depth.
"""
import argparse
import json
import math
import sys
import time

SHAPES = {
    # layers, d_model, heads, kv heads, d_ff, vocab, tied, family
    "gpt2-xl": dict(L=48, d=1600, H=25, KV=25, ff=6400, V=50257, tied=True, family="gpt2"),
    "qwen2.5-1.5b": dict(L=28, d=1536, H=12, KV=2, ff=8960, V=151936, tied=True, family="qwen2"),
}
# --tiny: the shapes BENCH_SMOKE=1 gives the l2l side (scripts/bench_gpu.sh), so the
# FLOPs per token agree.
TINY = {
    "gpt2-xl": dict(L=2, d=64, H=2, KV=2, ff=256, V=256),
    "qwen2.5-1.5b": dict(L=2, d=64, H=4, KV=2, ff=128, V=256),
}


def shape_of(a):
    s = dict(SHAPES[a.model])
    if getattr(a, "tiny", False):
        s.update(TINY[a.model])
    if getattr(a, "layers", 0):
        s["L"] = a.layers
    return s


def count(s, T):
    """(parameters, parameters a token multiplies) of the shape, biases and norms included."""
    L, d, H, KV, ff, V = s["L"], s["d"], s["H"], s["KV"], s["ff"], s["V"]
    if s["family"] == "gpt2":
        block = 12 * d * d + 13 * d  # ln 2d, qkv 3d^2+3d, proj d^2+d, ln 2d, fc 4d^2+4d, proj 4d^2+d
        params = V * d + T * d + L * block + 2 * d
        return params, params - T * d  # the position table is a lookup
    hd = d // H
    kv = KV * hd
    block = (d * d + d) + 2 * (d * kv + kv) + d * d + 3 * d * ff + 2 * d  # q,k,v biases; o none; 2 RMSNorms
    params = V * d * (1 if s["tied"] else 2) + L * block + d
    return params, params - (0 if s["tied"] else V * d)


def flops_json(a):
    s = shape_of(a)
    params, mult = count(s, a.T)
    fpt = 6 * mult + 12 * s["L"] * s["d"] * a.T
    return {"model": a.model, "layers": s["L"], "params": params, "flops_per_token": fpt, "T": a.T}


# ---- rates ------------------------------------------------------------------------------
def timed(torch, dev, fn, iters):
    """Seconds per call: CUDA events on a GPU, perf_counter on the CPU."""
    if dev == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3 / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def rates(a):
    import torch
    import torch.nn.functional as F
    dev = a.device
    if dev == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_gpu_torch.py rates: torch sees no GPU")
    out = {"device": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu", "torch": torch.__version__,
           "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    n = 8192 if dev == "cuda" else 256
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(n, n, device=dev, dtype=torch.bfloat16, generator=g)
    y = torch.randn(n, n, device=dev, dtype=torch.bfloat16, generator=g)
    for _ in range(5):
        x @ y
    s = timed(torch, dev, lambda: x @ y, 50 if dev == "cuda" else 3)
    out["matmul_tflops"] = 2 * n ** 3 / s / 1e12
    out["matmul_shape"] = [n, n, n]
    del x, y
    if dev == "cuda":
        nbytes = 1 << 30
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        host.random_(0, 255)
        gpu = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        gpu.copy_(host, non_blocking=True)
        host.copy_(gpu, non_blocking=True)
        torch.cuda.synchronize()
        out["h2d_gbps"] = nbytes / timed(torch, dev, lambda: gpu.copy_(host, non_blocking=True), 5) / 1e9
        out["d2h_gbps"] = nbytes / timed(torch, dev, lambda: host.copy_(gpu, non_blocking=True), 5) / 1e9
        del host, gpu
    else:
        out["h2d_gbps"] = out["d2h_gbps"] = None  # no device: not measured
    # Attention at GPT-2 XL's heads (25 x 64, T 1024, 8 sequences), forward + backward.
    B, H, T, hd = (8, 25, 1024, 64) if dev == "cuda" else (1, 2, 64, 32)
    q, k, v = (torch.randn(B, H, T, hd, device=dev, dtype=torch.bfloat16, generator=g).requires_grad_()
               for _ in range(3))
    do = torch.randn(B, H, T, hd, device=dev, dtype=torch.bfloat16, generator=g)

    def fwd_bwd():
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        o.backward(do)

    for _ in range(3):
        fwd_bwd()
    s = timed(torch, dev, fwd_bwd, 20 if dev == "cuda" else 2)
    out["attention_tflops"] = 12 * T * (H * hd) * (B * T) / s / 1e12
    out["attention_shape"] = {"B": B, "heads": H, "T": T, "head_dim": hd, "causal": True,
                              "flops_counted": "12 x T x d per token (the relay model's, full T x T)"}
    return out


# ---- training -----------------------------------------------------------------------------
def plain_gpt2(torch, s, T):
    import torch.nn as nn
    import torch.nn.functional as F
    C, NH, V, FF = s["d"], s["H"], s["V"], s["ff"]

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.c_attn, self.attn_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.c_fc, self.mlp_proj = nn.Linear(C, FF), nn.Linear(FF, C)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
            q, k, v = (z.view(b, t, NH, C // NH).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.attn_proj(y.transpose(1, 2).reshape(b, t, C))
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
            self.h = nn.ModuleList(Block() for _ in range(s["L"]))
            self.ln_f = nn.LayerNorm(C)

        def forward(self, idx):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
            for blk in self.h:
                x = blk(x)
            logits = self.ln_f(x) @ self.wte.weight.T  # tied head
            return F.cross_entropy(logits[:, :-1].float().reshape(-1, V), idx[:, 1:].reshape(-1))

    m = GPT()
    return m, list(m.h), lambda idx: m(idx)


def hf_model(s, T):
    from transformers import AutoModelForCausalLM, GPT2Config, Qwen2Config
    if s["family"] == "gpt2":
        cfg = GPT2Config(vocab_size=s["V"], n_positions=T, n_embd=s["d"], n_layer=s["L"], n_head=s["H"],
                         n_inner=s["ff"], resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                         tie_word_embeddings=True, use_cache=False)
    else:
        kw = dict(vocab_size=s["V"], hidden_size=s["d"], intermediate_size=s["ff"], num_hidden_layers=s["L"],
                  num_attention_heads=s["H"], num_key_value_heads=s["KV"], max_position_embeddings=32768,
                  rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False, attention_dropout=0.0,
                  use_cache=False)
        try:
            cfg = Qwen2Config(rope_theta=1e6, **kw)
        except TypeError:  # a transformers that takes RoPE settings only as rope_parameters
            cfg = Qwen2Config(**kw)
    m = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    blocks = list(m.transformer.h) if s["family"] == "gpt2" else list(m.model.layers)
    return m, blocks, lambda idx: m(input_ids=idx, labels=idx).loss


def train(a):
    import torch
    s = shape_of(a)
    dev = a.device
    if dev == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("torch sees no GPU")
    torch.manual_seed(0)
    impl = a.impl
    t_build = time.perf_counter()
    with torch.device(dev):
        if impl == "hf":
            try:
                model, blocks, loss_fn = hf_model(s, a.T)
            except ImportError as e:
                if s["family"] != "gpt2":
                    raise
                print(f"bench_gpu_torch.py: transformers unavailable ({e}); the hand-written GPT-2", file=sys.stderr)
                impl = "plain"
        if impl == "plain":
            if s["family"] != "gpt2":
                raise RuntimeError("--impl plain is GPT-2 only")
            model, blocks, loss_fn = plain_gpt2(torch, s, a.T)
    model.to(dev)  # a no-op when the device context above placed it; some versions build on the CPU
    model.train()
    params = sum(p.numel() for p in model.parameters())
    fl = flops_json(a)
    if a.mode == "compile":
        for b in blocks:
            b.compile()
    elif a.mode == "compile-full":
        compiled = torch.compile(model)
        loss_fn_inner = loss_fn
        loss_fn = (lambda idx: compiled(idx)) if impl == "plain" else \
            (lambda idx: compiled(input_ids=idx, labels=idx).loss)
        del loss_fn_inner
    fused = dev == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=fused)
    data = torch.randint(0, s["V"], (a.M, a.B, a.T), device=dev, generator=torch.Generator(device=dev).manual_seed(1))
    amp = torch.autocast(dev, dtype=torch.bfloat16)
    build_s = time.perf_counter() - t_build

    def step():
        total = 0.0
        for u in range(a.M):
            with amp:
                loss = loss_fn(data[u]) / a.M
            loss.backward()
            total += loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return total

    def sync():
        if dev == "cuda":
            torch.cuda.synchronize()

    t0 = time.perf_counter()
    for _ in range(a.warmup):
        step()
    sync()
    warmup_s = time.perf_counter() - t0
    if dev == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    loss = None
    for _ in range(a.steps):
        t = time.perf_counter()
        loss = step()
        sync()
        times.append(time.perf_counter() - t)
    dt = sum(times)
    tps = a.B * a.M * a.T * a.steps / dt
    out = {"model": a.model, "mode": a.mode, "impl": impl, "device": dev, "layers": s["L"], "params": params,
           "params_analytic": fl["params"], "flops_per_token": fl["flops_per_token"], "B": a.B, "M": a.M, "T": a.T,
           "tokens_per_step": a.B * a.M * a.T, "steps": a.steps, "warmup": a.warmup, "tokens_per_s": tps,
           "step_s": dt / a.steps, "step_s_each": times, "build_s": build_s, "warmup_s": warmup_s,
           "loss": float(loss), "torch": torch.__version__}
    if dev == "cuda":
        out["max_allocated"] = torch.cuda.max_memory_allocated()
        out["max_reserved"] = torch.cuda.max_memory_reserved()
    if not math.isfinite(out["loss"]):
        raise RuntimeError(f"loss is {out['loss']}")
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("flops")
    r = sub.add_parser("rates")
    t = sub.add_parser("train")
    for q in (f, t):
        q.add_argument("--model", required=True, choices=sorted(SHAPES))
        q.add_argument("--T", type=int, default=1024)
        q.add_argument("--layers", type=int, default=0)
        q.add_argument("--tiny", action="store_true")
    r.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    r.add_argument("--out", default="")
    t.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    t.add_argument("--mode", default="eager", choices=["eager", "compile", "compile-full"])
    t.add_argument("--impl", default="hf", choices=["hf", "plain"])
    t.add_argument("--B", type=int, default=8)
    t.add_argument("--M", type=int, default=2)
    t.add_argument("--steps", type=int, default=5)
    t.add_argument("--warmup", type=int, default=2)
    a = p.parse_args()
    if a.cmd == "flops":
        print("flops " + json.dumps(flops_json(a)), flush=True)
        return 0
    if a.cmd == "rates":
        out = rates(a)
        if a.out:
            with open(a.out, "w") as fh:
                json.dump(out, fh, indent=1)
        print("rates " + json.dumps(out), flush=True)
        return 0
    if a.steps < 1 or a.warmup < 0 or min(a.B, a.M, a.T) < 1:
        p.error("--steps >= 1, --warmup >= 0, --B/--M/--T >= 1")
    import torch
    try:
        out = train(a)
    except torch.cuda.OutOfMemoryError as e:
        print("torchbench_error " + json.dumps({"kind": "out of memory", "error": str(e).split("\n")[0][:300]}),
              flush=True)
        return 3
    except Exception as e:  # noqa: BLE001 -- reported as one line, then a non-zero exit
        kind = "torch.compile failed" if a.mode != "eager" and ("dynamo" in type(e).__module__ or
                                                               "inductor" in type(e).__module__ or
                                                               "Backend" in type(e).__name__) else "error"
        print("torchbench_error " + json.dumps({"kind": kind, "error": f"{type(e).__name__}: {str(e)[:300]}"}),
              flush=True)
        return 4 if kind == "torch.compile failed" else 5
    print("torchbench " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
