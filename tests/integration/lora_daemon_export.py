"""End-to-end LoRA export through the daemon (ctest integration.lora_daemon_export, label
lora_daemon): a real l2l-eps + one CPU l2l-worker train a LoRA job on a tiny random
LlamaForCausalLM saved by transformers (model.from an HF dir; lora: {r: 4, alpha: 8,
target: all-linear}; 3 steps), then `l2lctl export`:

  refused   --format hf without --merge (naming --merge and --format peft), and
            --format peft --merge (naming --merge)
  peft      --format peft adapter: PeftModel.from_pretrained(the original model, adapter)
            reports no unexpected and no missing adapter keys; training moved B off zero
  merged    --format hf --merge merged-hf: transformers' logits of it equal the
            PeftModel's (rel <= 1e-4 of the largest) and differ from the base's; so does
            --format safetensors --merge (l2l-eval's loss equal to l2l-eval of merged-hf)
  l2l       l2l-eval --model BASE --adapter adapter gives l2l-eval's loss of merged-hf
  gguf      --format gguf-lora adapter.gguf: the gguf package reads it (general.type
            adapter, adapter.lora.alpha 8, llama.cpp names blk.N.<t>.weight.lora_a/_b,
            values = the PEFT adapter's with llama.cpp's q/k permutation:
            tests/formats/lora_oracle.py check-gguf)

  lora_daemon_export.py BIN_DIR WORK_DIR

Run with the oracle venv's python (scripts/oracle_venv.sh), HF_HUB_OFFLINE=1. Exits
non-zero with a message on the first failure.
"""
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "formats"))
os.environ["HF_HUB_OFFLINE"] = "1"
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
import peft  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

import lora_oracle  # noqa: E402

B, T, STEPS = 2, 16, 3
START_TIMEOUT_S = 300


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def write_tokens(path, toks):
    hdr = np.zeros(256, dtype=np.int32)
    hdr[0], hdr[1], hdr[2] = 20240520, 1, len(toks)
    with open(path, "wb") as f:
        f.write(hdr.tobytes())
        f.write(np.asarray(toks, dtype=np.uint16).tobytes())


def tiny_llama(path):
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False,
                                   bos_token_id=1, eos_token_id=2)
    torch.manual_seed(21)
    m = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():
        for n, p in m.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn(p.shape) if "norm" in n else 0.2 * torch.randn(p.shape))
    m.float().save_pretrained(path, safe_serialization=True)


class Daemon:
    def __init__(self, bin_dir, work, model_dir, data):
        self.bin, self.state = bin_dir, os.path.join(work, "state")
        shutil.rmtree(self.state, ignore_errors=True)
        os.makedirs(self.state)
        self.job = os.path.join(work, "job.yaml")
        with open(self.job, "w") as f:
            f.write(f"model:\n  from: {json.dumps(model_dir)}\n"
                    f"lora: {{r: 4, alpha: 8, target: all-linear}}\n"
                    f"optim: {{lr: 1e-2, warmup_steps: 0, weight_decay: 0.0}}\n"
                    f"train: {{steps: {STEPS}, micro_batch_size: {B}, micro_batches: 1, seq_len: {T}, seed: 7, "
                    f"clip: none}}\n"
                    f"data: {{train_path: {json.dumps(data)}}}\n")
        self.log_path = os.path.join(work, "eps.log")
        self.log = open(self.log_path, "w")
        self.eps = subprocess.Popen([os.path.join(bin_dir, "l2l-eps"), "--job", self.job, "--state-dir", self.state,
                                     "--job-id", "lora-export-" + str(os.getpid()), "--workers", "1",
                                     "--allow-models", model_dir], stdout=self.log, stderr=subprocess.STDOUT)
        port = os.path.join(self.state, "eps.port")
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (os.path.exists(port) and open(port).read().strip()):
            if self.eps.poll() is not None:
                fail(f"l2l-eps exited {self.eps.returncode}: " + open(self.log_path).read()[-2000:])
            if time.monotonic() > deadline:
                fail(f"l2l-eps did not listen within {START_TIMEOUT_S} s: " + open(self.log_path).read()[-2000:])
            time.sleep(0.1)
        self.addr = "127.0.0.1:" + open(port).read().strip()

    def train(self):
        w = subprocess.run([os.path.join(self.bin, "l2l-worker"), "--eps", self.addr, "--threads", "2",
                            "--steps", str(STEPS)], capture_output=True, text=True, timeout=600)
        if w.returncode != 0:
            fail(f"l2l-worker failed: {w.stdout[-1500:]} {w.stderr[-1500:]}")
        losses = {}
        for _ in range(100):
            p = os.path.join(self.state, "run.jsonl")
            if os.path.exists(p):
                for line in open(p):
                    r = json.loads(line)
                    if "loss" in r and "step" in r:
                        losses[r["step"]] = r["loss"]
            if len(losses) >= STEPS:
                return losses
            time.sleep(0.1)
        fail(f"run.jsonl has {len(losses)} of {STEPS} steps")

    def ctl(self, *args, ok=True):
        r = subprocess.run([os.path.join(self.bin, "l2lctl"), "--eps", self.addr] + list(args), capture_output=True,
                           text=True, timeout=300)
        if ok and r.returncode != 0:
            fail(f"l2lctl {' '.join(args)}: {r.stdout} {r.stderr}")
        return r

    def stop(self):
        self.ctl("stop", "--skip-checkpoint")
        self.eps.wait(timeout=60)
        self.log.close()


def l2l_eval(bin_dir, args):
    r = subprocess.run([os.path.join(bin_dir, "l2l-eval")] + args, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        fail(f"l2l-eval {' '.join(args)}: {r.stderr.strip()}")
    line = [x for x in r.stdout.splitlines() if x.startswith("eval: loss ")]
    if not line:
        fail(f"l2l-eval printed no loss: {r.stdout}")
    return float(line[0].split()[2])


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


def main():
    if len(sys.argv) != 3:
        print("usage: lora_daemon_export.py BIN_DIR WORK_DIR", file=sys.stderr)
        return 2
    bin_dir, work = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    os.makedirs(work, exist_ok=True)
    torch.set_num_threads(2)
    base = os.path.join(work, "base")
    tiny_llama(base)
    toks = [int(x) for x in np.random.default_rng(3).integers(0, 96, size=4096)]
    data = os.path.join(work, "tokens.bin")
    write_tokens(data, toks)

    d = Daemon(bin_dir, work, base, data)
    losses = d.train()
    print(f"ok: trained {STEPS} LoRA steps: losses {[round(losses[s], 5) for s in sorted(losses)]}")

    # Refusals: whole-model formats need --merge; --merge does not go with peft.
    for args, needles in [(["--format", "hf", "refused-hf"], ["LoRA job", "--merge", "--format peft"]),
                          (["--format", "peft", "--merge", "refused-peft"], ["--merge"])]:
        r = d.ctl("export", *args, ok=False)
        if r.returncode != 1 or not all(n in r.stderr for n in needles):
            fail(f"l2lctl export {' '.join(args)}: want exit 1 naming {needles}, got {r.returncode}: {r.stderr.strip()}")
        print(f"ok: refused export {' '.join(args)}: {r.stderr.strip()}")

    d.ctl("export", "--format", "peft", "adapter")
    d.ctl("export", "--format", "gguf-lora", "adapter.gguf")
    d.ctl("export", "--format", "hf", "--merge", "merged-hf")
    d.ctl("export", "--format", "safetensors", "--merge", "merged.safetensors")
    d.stop()
    check_exports(bin_dir, base, data, toks, d.state)
    print("OK")
    return 0


def check_exports(bin_dir, base, data, toks, state):
    """The checks of the exports in `state` (adapter/, adapter.gguf, merged-hf/,
    merged.safetensors) against the original model `base`."""
    adapter, gguf_path = os.path.join(state, "adapter"), os.path.join(state, "adapter.gguf")
    merged, merged_st = os.path.join(state, "merged-hf"), os.path.join(state, "merged.safetensors")

    # peft: loads into the original model with every key.
    cfg = json.load(open(os.path.join(adapter, "adapter_config.json")))
    if cfg["r"] != 4 or cfg["lora_alpha"] != 8 or sorted(cfg["target_modules"]) != sorted(
            ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]):
        fail(f"adapter_config.json: r {cfg['r']} lora_alpha {cfg['lora_alpha']} targets {cfg['target_modules']}")
    file_sd = load_file(os.path.join(adapter, "adapter_model.safetensors"))
    if len(file_sd) != 2 * 7 * 2:
        fail(f"adapter_model.safetensors has {len(file_sd)} tensors, expected 28 (2 blocks x 7 linears x A, B)")
    biggest_b = max(float(np.max(np.abs(v))) for k, v in file_sd.items() if ".lora_B." in k)
    if not biggest_b > 1e-4:
        fail(f"training left every lora_B at zero (max |B| {biggest_b:.2e})")
    model = peft.PeftModel.from_pretrained(lora_oracle.load_base(base), adapter).eval()
    res = peft.set_peft_model_state_dict(model, peft.load_peft_weights(adapter))
    missing = [k for k in res.missing_keys if "lora_" in k or ".modules_to_save." in k]
    if res.unexpected_keys or missing:
        fail(f"PeftModel.from_pretrained: unexpected {res.unexpected_keys[:5]}, missing {missing[:5]}")
    print(f"ok: peft adapter: {len(file_sd)} tensors, none missing or unexpected; max |B| {biggest_b:.3g}")

    # merged: transformers on the merged export = the PeftModel.
    ids = torch.tensor([toks[:T], toks[T:2 * T]])
    with torch.no_grad():
        got = model(input_ids=ids).logits.double()
        want = transformers.AutoModelForCausalLM.from_pretrained(merged, torch_dtype=torch.float32).eval()(
            input_ids=ids).logits.double()
        plain = lora_oracle.load_base(base)(input_ids=ids).logits.double()
    r = float((got - want).abs().max() / want.abs().max())
    moved = float((plain - want).abs().max() / want.abs().max())
    if not r <= 1e-4:
        fail(f"the PeftModel's logits differ from the merged HF export's: {r:.3e}")
    if not moved > 1e-4:
        fail(f"the merged export hardly differs from the base ({moved:.2e}): a skipped merge would pass")
    print(f"ok: PeftModel vs transformers on merged-hf: max rel {r:.2e} (<= 1e-4); the adapter moves logits {moved:.2e}")

    # l2l: --adapter over the base = the merged exports.
    ev = ["--data", data, "--context", str(T), "--tokens", "1025"]
    with_adapter = l2l_eval(bin_dir, ["--model", base, "--adapter", adapter] + ev)
    of_merged = l2l_eval(bin_dir, ["--model", merged] + ev)
    of_st = l2l_eval(bin_dir, ["--model", merged_st] + ev)
    for what, v in [("merged-hf", of_merged), ("merged.safetensors", of_st)]:
        if not rel(with_adapter, v) <= 1e-5:
            fail(f"l2l-eval --adapter adapter ({with_adapter}) and of {what} ({v}) differ")
        print(f"ok: l2l-eval --adapter {with_adapter:.7f} vs {what} {v:.7f} (rel {rel(with_adapter, v):.1e} <= 1e-5)")

    # gguf: the gguf package reads the adapter with llama.cpp's names and the PEFT values.
    import contextlib
    import io
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        lora_oracle.check_gguf(base, adapter, gguf_path)
    print("ok: gguf-lora: " + buf.getvalue().strip())


if __name__ == "__main__":
    sys.exit(main())
