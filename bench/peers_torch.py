"""PyTorch / DeepSpeed side of scripts/bench_peers.sh: the peers l2l is compared with.

  peers_torch.py adamw N ITERS            torch AdamW (fused, foreach), DeepSpeedCPUAdam
  peers_torch.py adamw_job N ITERS W      the daemon's whole per-layer job done with them:
                                          sum W workers' gradients, AdamW, bf16 copy
  peers_torch.py llama V L C H KV F T B ITERS [fp32|bf16]
                                          the same for a Llama (SmolLM2-like: RMSNorm, RoPE,
                                          grouped-query attention, SwiGLU, tied head, no biases)
  peers_torch.py peft_llama V L C H KV F T B ITERS R
                                          LoRA training of the same Llama shape with Hugging
                                          Face PEFT (LoraConfig r=R, alpha=2R, all-linear,
                                          dropout 0) on transformers' LlamaForCausalLM (sdpa,
                                          random weights, fp32): forward+backward alone
                                          (peft_fwdbwd) and the whole step with AdamW on the
                                          adapters (peft_step, torch.optim.AdamW fused)
  peers_torch.py gpt V L C H T B ITERS [fp32|bf16]
                                          GPT forward+backward, torch eager and torch.compile;
                                          bf16: the forward under torch.autocast("cpu",
                                          dtype=torch.bfloat16), results named *_bf16

Prints `RESULT name = value` lines (params/s or tokens/s: median and best of ITERS timed
steps after warm-up). Threads: OMP_NUM_THREADS (torch.set_num_threads follows it).
The GPT is l2l's: pre-LayerNorm blocks, causal attention, tanh GELU, tied embedding head,
fp32. CPU only; bench only, never a test.
"""
import math
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))


def timed(step, iters, warmup=2):
    for _ in range(warmup):
        step()
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        step()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts), min(ts)


def report(name, work, med, best):
    print(f"RESULT {name}_median = {work / med:.6g}")
    print(f"RESULT {name}_best = {work / best:.6g}", flush=True)


def adamw(n, iters):
    def make():
        p = torch.nn.Parameter(torch.randn(n) * 0.02)
        p.grad = torch.randn(n) * 0.01
        return p
    for name, kw in (("torch_adamw_fused", {"fused": True}), ("torch_adamw_foreach", {"foreach": True})):
        p = make()
        opt = torch.optim.AdamW([p], lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, **kw)
        med, best = timed(opt.step, iters)
        report(name, n, med, best)
        del opt, p
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from deepspeed.ops.adam import DeepSpeedCPUAdam
    p = make()
    opt = DeepSpeedCPUAdam([p], lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                           adamw_mode=True, fp32_optimizer_states=True)
    med, best = timed(opt.step, iters)
    report("deepspeed_cpu_adam", n, med, best)


def adamw_job(n, iters, workers):
    """What l2l-eps does per layer in one fused pass, done the way a user of these peers
    would: the W workers' gradients summed into p.grad (torch.sum over a stack would copy;
    in-place adds are the cheapest), the optimizer step, the weights cast to the bf16 copy
    the workers fetch."""
    grads = [torch.randn(n) * (0.01 / workers) for _ in range(workers)]
    pub = torch.empty(n, dtype=torch.bfloat16)

    def run(name, opt, p):
        def step():
            torch.add(grads[0], grads[1], out=p.grad) if workers > 1 else p.grad.copy_(grads[0])
            for g in grads[2:]:
                p.grad.add_(g)
            opt.step()
            pub.copy_(p.detach())
        med, best = timed(step, iters)
        report(name, n, med, best)

    p = torch.nn.Parameter(torch.randn(n) * 0.02)
    p.grad = torch.zeros(n)
    run("torch_adamw_fused_job", torch.optim.AdamW([p], lr=1e-3, betas=(0.9, 0.95), eps=1e-8,
                                                   weight_decay=0.1, fused=True), p)
    del p
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from deepspeed.ops.adam import DeepSpeedCPUAdam
    p = torch.nn.Parameter(torch.randn(n) * 0.02)
    p.grad = torch.zeros(n)
    run("deepspeed_cpu_adam_job", DeepSpeedCPUAdam([p], lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                                                   adamw_mode=True, fp32_optimizer_states=True), p)


class Block(nn.Module):
    def __init__(s, C, H):
        super().__init__()
        s.C, s.H = C, H
        s.ln1, s.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        s.attn, s.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        s.fc, s.fcp = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(s, x):
        B, T, C = x.shape
        q, k, v = s.attn(s.ln1(x)).split(C, dim=2)
        q, k, v = [t.view(B, T, s.H, C // s.H).transpose(1, 2) for t in (q, k, v)]
        # The fused attention kernel a PyTorch user gets (causal, skips the masked half).
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + s.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + s.fcp(F.gelu(s.fc(s.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(s, V, L, C, H, T):
        super().__init__()
        s.V = V
        s.wte, s.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        s.blocks = nn.ModuleList(Block(C, H) for _ in range(L))
        s.lnf = nn.LayerNorm(C)

    def forward(s, idx, tgt):
        x = s.wte(idx) + s.wpe(torch.arange(idx.shape[1]))
        for b in s.blocks:
            x = b(x)
        logits = s.lnf(x) @ s.wte.weight.t()
        return F.cross_entropy(logits.view(-1, s.V), tgt.view(-1))


class RMSNorm(nn.Module):
    def __init__(s, C, eps=1e-5):
        super().__init__()
        s.w, s.eps = nn.Parameter(torch.ones(C)), eps

    def forward(s, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + s.eps) * s.w


def rope(x, cos, sin):  # x (B, H, T, hs); rotate-half form, as Hugging Face's Llama
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class LlamaBlock(nn.Module):
    def __init__(s, C, H, KV, Fd):
        super().__init__()
        s.H, s.KV, s.hs = H, KV, C // H
        s.n1, s.n2 = RMSNorm(C), RMSNorm(C)
        s.q, s.k, s.v = (nn.Linear(C, H * s.hs, bias=False), nn.Linear(C, KV * s.hs, bias=False),
                         nn.Linear(C, KV * s.hs, bias=False))
        s.o = nn.Linear(H * s.hs, C, bias=False)
        s.gate, s.up, s.down = (nn.Linear(C, Fd, bias=False), nn.Linear(C, Fd, bias=False),
                                nn.Linear(Fd, C, bias=False))

    def forward(s, x, cos, sin):
        B, T, C = x.shape
        h = s.n1(x)
        q = s.q(h).view(B, T, s.H, s.hs).transpose(1, 2)
        k = s.k(h).view(B, T, s.KV, s.hs).transpose(1, 2)
        v = s.v(h).view(B, T, s.KV, s.hs).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        rep = s.H // s.KV  # repeat the key/value heads, as Hugging Face's sdpa path does
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + s.o(y.transpose(1, 2).reshape(B, T, C))
        h = s.n2(x)
        return x + s.down(F.silu(s.gate(h)) * s.up(h))


class Llama(nn.Module):
    def __init__(s, V, L, C, H, KV, Fd, T, theta=100000.0):
        super().__init__()
        s.V = V
        s.wte = nn.Embedding(V, C)
        s.blocks = nn.ModuleList(LlamaBlock(C, H, KV, Fd) for _ in range(L))
        s.nf = RMSNorm(C)
        hs = C // H
        inv = 1.0 / theta ** (torch.arange(0, hs, 2).float() / hs)
        ang = torch.outer(torch.arange(T).float(), inv)
        emb = torch.cat((ang, ang), dim=-1)
        s.register_buffer("cos", emb.cos(), persistent=False)
        s.register_buffer("sin", emb.sin(), persistent=False)

    def forward(s, idx, tgt):
        x = s.wte(idx)
        for b in s.blocks:
            x = b(x, s.cos, s.sin)
        logits = s.nf(x) @ s.wte.weight.t()
        return F.cross_entropy(logits.view(-1, s.V), tgt.view(-1))


def train_steps(model, V, T, B, iters, dtype):
    idx = torch.randint(0, V, (B, T))
    tgt = torch.randint(0, V, (B, T))
    bf16 = dtype == "bf16"
    suffix = "_bf16" if bf16 else ""
    for name, m in (("torch_eager", model), ("torch_compile", torch.compile(model))):
        def step():
            for p in model.parameters():
                p.grad = None
            # Mixed precision as a PyTorch user runs it: fp32 parameters and gradients,
            # the forward under autocast (bf16 matmuls), backward outside it.
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = m(idx, tgt)
            loss.backward()
        med, best = timed(step, iters, warmup=3)
        report(name + suffix, B * T, med, best)


def gpt(V, L, C, H, T, B, iters, dtype="fp32"):
    torch.manual_seed(0)
    train_steps(GPT(V, L, C, H, T), V, T, B, iters, dtype)


def llama(V, L, C, H, KV, Fd, T, B, iters, dtype="fp32"):
    torch.manual_seed(0)
    train_steps(Llama(V, L, C, H, KV, Fd, T), V, T, B, iters, dtype)


def peft_llama(V, L, C, H, KV, Fd, T, B, iters, r):
    """PEFT's LoRA on transformers' Llama, as a user fine-tunes with it (eager, fp32)."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=V, hidden_size=C, intermediate_size=Fd, num_hidden_layers=L,
                      num_attention_heads=H, num_key_value_heads=KV, max_position_embeddings=T,
                      rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
                      attention_bias=False, mlp_bias=False, use_cache=False)
    base = LlamaForCausalLM(cfg).to(torch.float32)
    base.config._attn_implementation = "sdpa"
    model = get_peft_model(base, LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.0,
                                            target_modules="all-linear", bias="none",
                                            task_type="CAUSAL_LM"))
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    print(f"# peft: {sum(p.numel() for p in model.parameters())} params, "
          f"{sum(p.numel() for p in trainable)} trainable", flush=True)
    idx = torch.randint(0, V, (B, T))
    opt = torch.optim.AdamW(trainable, lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)

    def fwdbwd():
        for p in trainable:
            p.grad = None
        model(input_ids=idx, labels=idx).loss.backward()

    def step():
        fwdbwd()
        opt.step()
    med, best = timed(fwdbwd, iters, warmup=2)
    report("peft_fwdbwd", B * T, med, best)
    med, best = timed(step, iters, warmup=1)
    report("peft_step", B * T, med, best)


if __name__ == "__main__":
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"mkldnn {torch.backends.mkldnn.is_available()}, capability {torch.backends.cpu.get_cpu_capability()}",
          flush=True)
    a = sys.argv[1:]
    if a[0] == "adamw":
        adamw(int(a[1]), int(a[2]))
    elif a[0] == "adamw_job":
        adamw_job(int(a[1]), int(a[2]), int(a[3]))
    elif a[0] == "gpt":
        if len(a) > 8 and a[8] not in ("fp32", "bf16"):
            sys.exit(f"peers_torch.py: dtype {a[8]!r} is not fp32 or bf16")
        gpt(*(int(x) for x in a[1:8]), *(a[8:9]))
    elif a[0] == "llama":
        if len(a) > 10 and a[10] not in ("fp32", "bf16"):
            sys.exit(f"peers_torch.py: dtype {a[10]!r} is not fp32 or bf16")
        llama(*(int(x) for x in a[1:10]), *(a[10:11]))
    elif a[0] == "peft_llama":
        peft_llama(*(int(x) for x in a[1:11]))
    else:
        sys.exit(f"peers_torch.py: unknown benchmark {a[0]!r} (adamw, adamw_job, gpt, llama or peft_llama)")
