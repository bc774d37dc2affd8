"""Oracle tests of model.from import and `l2lctl export --format hf|gguf`, through the
real processes (l2l-eps + one CPU l2l-worker), against Hugging Face transformers.

  import_oracle.py BIN_DIR WORK_DIR synthetic   (a) HF dirs (f32, sharded, bf16) of a
        random LlamaForCausalLM and Qwen2ForCausalLM, (b) GGUF F32 / Q8_0 files written by
        the gguf package, (c) export hf / gguf after training steps (hf also sharded with
        --max-shard-size: shard names, index, tensors bit-equal to the single file,
        transformers' logits equal, re-imported by l2l), (d) malformed inputs
  import_oracle.py BIN_DIR WORK_DIR smollm2 GGUF  (e) the real SmolLM2-135M GGUF
  import_oracle.py BIN_DIR WORK_DIR smollm2_bf16 GGUF  (h) that file through the CUDA
        backend's bf16 path (a CUDA or emulator build): within 1e-2 of transformers' fp32
  import_oracle.py BIN_DIR WORK_DIR smollm2_q4_k_m GGUF  (g) that model exported with
        --dtype q4_k_m: read by the gguf package, tensor types as llama.cpp's Q4_K_M
        recipe gives them, l2l-eval perplexity within 6% of the original file's
  import_oracle.py BIN_DIR WORK_DIR gguf_tokenizer TOKENIZER_TOOL  (f) export --format gguf
        of HF-dir imports writes their byte-level BPE tokenizer as tokenizer.ggml.*
        metadata: read back with the gguf package it is the tokenizer.json's vocabulary,
        merges, token types, ids and chat template, and l2l's loader of the GGUF encodes
        varied text as HF `tokenizers` encodes it with the original tokenizer.json

The loss l2l reports for step 1 (run.jsonl: the forward pass at the imported weights) is
compared with transformers' loss on the same tokens: the tokens file holds exactly one
micro-batch (B windows of T+1 tokens), so the data order cannot matter. Exits non-zero
with a message on the first failure. Run with the oracle venv's python (HF_HUB_OFFLINE=1).
"""
import glob
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time

os.environ["HF_HUB_OFFLINE"] = "1"
import numpy as np
import torch
import gguf
import transformers

B, T = 2, 16


# How long a daemon may take to import a model and listen (generous: CI is loaded).
START_TIMEOUT_S = 600

def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def write_tokens(path, toks):
    hdr = np.zeros(256, dtype=np.int32)
    hdr[0], hdr[1], hdr[2] = 20240520, 1, len(toks)
    with open(path, "wb") as f:
        f.write(hdr.tobytes())
        f.write(np.asarray(toks, dtype=np.uint16).tobytes())


def hf_loss(model, toks):
    """Mean next-token cross entropy over the B windows of T+1 tokens (l2l's windows)."""
    x = torch.tensor([toks[k * T:k * T + T] for k in range(B)])
    y = torch.tensor([toks[k * T + 1:k * T + T + 1] for k in range(B)])
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=x).logits.float()
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).item()


class Run:
    """One l2l-eps (--job) + one l2l-worker; returns step losses; can export."""

    def __init__(self, bin_dir, work, name, model_from, steps=1, lr=1e-3, extra_model="", eps_args=(),
                 extra_train="", extra_job="", worker_args=(), worker_env=None):
        # The model file may live outside the work dir (the fetched SmolLM2 in the model
        # cache): its directory is listed for the daemon (paths.models).
        self.eps_args = ["--allow-models", os.path.dirname(os.path.abspath(model_from))] + list(eps_args)
        self.bin, self.state = bin_dir, os.path.join(work, "state-" + name)
        shutil.rmtree(self.state, ignore_errors=True)
        os.makedirs(self.state)
        self.job = os.path.join(work, name + ".yaml")
        with open(self.job, "w") as f:
            f.write(f"model:\n  from: {json.dumps(model_from)}\n{extra_model}"
                    f"optim: {{lr: {lr}, warmup_steps: 0, weight_decay: 0.0}}\n"
                    f"train: {{steps: {steps}, micro_batch_size: {B}, micro_batches: 1, seq_len: {T}, seed: 7, "
                    f"clip: none{extra_train}}}\n"
                    f"data: {{train_path: {json.dumps(os.path.join(work, 'tokens.bin'))}}}\n{extra_job}")
        self.steps, self.name = steps, name
        self.worker_args, self.worker_env = list(worker_args), worker_env
        self.worker_log = ""

    def start(self):
        self.eps_log = open(os.path.join(self.state, "..", self.name + ".eps.log"), "w")
        self.eps = subprocess.Popen([os.path.join(self.bin, "l2l-eps"), "--job", self.job, "--state-dir", self.state,
                                     "--job-id", "imp-" + self.name + str(os.getpid()), "--workers", "1"] +
                                    self.eps_args,
                                    stdout=self.eps_log, stderr=subprocess.STDOUT)
        port = os.path.join(self.state, "eps.port")
        # The daemon imports the model before it listens: 135M parameters dequantised and
        # streamed into the page store take minutes on a loaded 2-core machine.
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if os.path.exists(port) and open(port).read().strip():
                break
            if self.eps.poll() is not None:
                fail(f"{self.name}: l2l-eps exited {self.eps.returncode}: " + open(self.eps_log.name).read()[-2000:])
            if time.monotonic() > deadline:
                fail(f"{self.name}: l2l-eps did not listen within {START_TIMEOUT_S} s: "
                     + open(self.eps_log.name).read()[-2000:])
            time.sleep(0.1)
        self.addr = "127.0.0.1:" + open(port).read().strip()

    def train(self):
        w = subprocess.run([os.path.join(self.bin, "l2l-worker"), "--eps", self.addr, "--threads", "2",
                            "--steps", str(self.steps)] + self.worker_args, capture_output=True, text=True,
                           timeout=900, env=self.worker_env)
        if w.returncode != 0:
            fail(f"{self.name}: l2l-worker failed: {w.stdout[-1500:]} {w.stderr[-1500:]}")
        self.worker_log = w.stdout + w.stderr
        losses = {}
        for _ in range(100):
            p = os.path.join(self.state, "run.jsonl")
            if os.path.exists(p):
                for line in open(p):
                    r = json.loads(line)
                    if "loss" in r and "step" in r:
                        losses[r["step"]] = r["loss"]
            if len(losses) >= self.steps:
                return losses
            time.sleep(0.1)
        fail(f"{self.name}: run.jsonl has {len(losses)} of {self.steps} steps")

    def ctl(self, *args):
        r = subprocess.run([os.path.join(self.bin, "l2lctl"), "--eps", self.addr] + list(args), capture_output=True,
                           text=True, timeout=600)
        if r.returncode != 0:
            fail(f"{self.name}: l2lctl {' '.join(args)}: {r.stdout} {r.stderr}")
        return r.stdout

    def stop(self):
        self.ctl("stop", "--skip-checkpoint")
        self.eps.wait(timeout=60)
        self.eps_log.close()


def l2l_first_loss(bin_dir, work, name, model_from):
    r = Run(bin_dir, work, name, model_from, steps=1)
    r.start()
    loss = r.train()[1]
    r.stop()
    return loss


def check_close(what, ours, theirs, rel):
    d = abs(ours - theirs) / max(abs(theirs), 1e-12)
    if not d <= rel:
        fail(f"{what}: l2l loss {ours:.8f} vs transformers {theirs:.8f} (rel {d:.2e} > {rel})")
    print(f"ok: {what}: l2l {ours:.8f} transformers {theirs:.8f} rel {d:.1e}")


# ---- models and files ---------------------------------------------------------------

def tiny(arch):
    common = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2)
    if arch == "llama":
        cfg = transformers.LlamaConfig(rope_theta=10000.0, tie_word_embeddings=False, **common)
        cls = transformers.LlamaForCausalLM
    else:
        cfg = transformers.Qwen2Config(rope_theta=100000.0, tie_word_embeddings=True, use_sliding_window=False, **common)
        cls = transformers.Qwen2ForCausalLM
    torch.manual_seed(11 if arch == "llama" else 12)
    m = cls(cfg)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "norm" in n:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape))
            else:
                p.copy_(0.2 * torch.randn(p.shape))
    return m.float()


def llama_permute(w, n_head):
    """As convert_hf_to_gguf.py's LlamaModel.permute."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


GGUF_NAMES = {"embed_tokens": "token_embd", "norm": "output_norm", "lm_head": "output",
              "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
              "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
              "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down"}


def gguf_name(hf):
    stem, suf = hf.rsplit(".", 1)
    stem = stem[len("model."):] if stem.startswith("model.") else stem
    if stem.startswith("layers."):
        _, i, rest = stem.split(".", 2)
        return f"blk.{i}.{GGUF_NAMES[rest]}.{suf}"
    return f"{GGUF_NAMES[stem]}.{suf}"


def write_gguf(model, path, qtype):
    """As llama.cpp's converter: llama.cpp names, q/k permuted for arch llama, 1-D in F32.
    Returns the state dict transformers should see (Q8_0 quantize -> dequantize)."""
    cfg = model.config
    arch = "llama" if cfg.model_type == "llama" else "qwen2"
    w = gguf.GGUFWriter(path, arch)
    w.add_name("tiny")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    seen = {}
    for k, v in model.state_dict().items():
        if k == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        a = v.float().numpy().copy()
        name = gguf_name(k)
        stored = a
        if arch == "llama" and (".attn_q." in name or ".attn_k." in name):
            stored = llama_permute(a, cfg.num_attention_heads if ".attn_q." in name else cfg.num_key_value_heads)
        if qtype == "q8_0" and a.ndim == 2:
            q = gguf.quants.quantize(stored, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(name, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            a = gguf.quants.dequantize(gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0),
                                       gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, stored)
        seen[k] = torch.from_numpy(np.ascontiguousarray(a))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return seen


def hf_with(model, sd):
    m = type(model)(model.config)
    res = m.load_state_dict(sd, strict=False)
    missing = [k for k in res.missing_keys if not (k == "lm_head.weight" and model.config.tie_word_embeddings)]
    if missing or res.unexpected_keys:
        fail(f"state dict: missing {missing}, unexpected {res.unexpected_keys}")
    if model.config.tie_word_embeddings:
        m.tie_weights()
    return m.float()


def load_exported_gguf(path):
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    cfg = transformers.AutoConfig.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    tensors = load_gguf_checkpoint(path, return_tensors=True)["tensors"]
    if "lm_head.weight" not in tensors:
        # No output.weight: llama.cpp reads the token embedding as the head (tied);
        # transformers 4.46's GGUF config mapping does not set that itself.
        cfg.tie_word_embeddings = True
    m = transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32)
    res = m.load_state_dict(tensors, strict=False)
    missing = [k for k in res.missing_keys if not (k == "lm_head.weight" and cfg.tie_word_embeddings)]
    if missing or res.unexpected_keys:
        fail(f"{path}: transformers' GGUF loader: missing {missing}, unexpected {res.unexpected_keys}")
    if cfg.tie_word_embeddings:
        m.tie_weights()
    return m.float()


# ---- (d) malformed inputs --------------------------------------------------------------

def expect_refused(bin_dir, work, name, model_from, needles, extra_model=""):
    r = Run(bin_dir, work, name, model_from, extra_model=extra_model)
    p = subprocess.run([os.path.join(bin_dir, "l2l-eps"), "--job", r.job, "--state-dir", r.state, "--job-id",
                        "bad" + str(os.getpid()), "--workers", "1"], capture_output=True, text=True, timeout=120)
    if p.returncode == 0:
        fail(f"{name}: l2l-eps accepted a bad model")
    err = [l for l in p.stderr.strip().splitlines() if l.strip()]
    last = err[-1] if err else ""
    for n in needles:
        if n not in last:
            fail(f"{name}: the error does not name '{n}': {p.stderr.strip()}")
    left = os.listdir(r.state)
    if left:
        fail(f"{name}: the refused import left files in the state dir: {left}")
    print(f"ok: {name}: refused: {last}")


def malformed(bin_dir, work, good_dir, model):
    import safetensors.torch as st
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    def make(name, mutate):
        d = os.path.join(work, name)
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(good_dir, d)
        mutate(d)
        return d
    # truncated: the safetensors file loses its last bytes
    d = make("bad-truncated", lambda d: os.truncate(os.path.join(d, "model.safetensors"),
                                                    os.path.getsize(os.path.join(d, "model.safetensors")) - 100))
    expect_refused(bin_dir, work, "truncated", d, ["model.safetensors"])
    def wrong_shape(d):
        s = dict(sd)
        s["model.layers.1.mlp.up_proj.weight"] = torch.zeros(63, 32)
        st.save_file(s, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    d = make("bad-shape", wrong_shape)
    expect_refused(bin_dir, work, "wrong-shape", d, ["model.safetensors", "model.layers.1.mlp.up_proj.weight"])
    def missing(d):
        s = dict(sd)
        del s["model.layers.0.self_attn.k_proj.weight"]
        st.save_file(s, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    d = make("bad-missing", missing)
    expect_refused(bin_dir, work, "missing-tensor", d, ["bad-missing", "model.layers.0.self_attn.k_proj.weight"])
    def extra(d):
        s = dict(sd)
        s["model.layers.0.extra.weight"] = torch.zeros(4)
        st.save_file(s, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    d = make("bad-extra", extra)
    expect_refused(bin_dir, work, "extra-tensor", d, ["model.safetensors", "model.layers.0.extra.weight"])
    # GGUF: bad magic; a tensor of a type id ggml does not define
    good = os.path.join(work, "llama-f32.gguf")
    data = bytearray(open(good, "rb").read())
    p = os.path.join(work, "bad-magic.gguf")
    open(p, "wb").write(b"GGUX" + bytes(data[4:]))
    expect_refused(bin_dir, work, "bad-magic", p, ["bad-magic.gguf", "magic"])
    r = gguf.GGUFReader(good)
    t = [x for x in r.tensors if x.name == "blk.0.ffn_up.weight"][0]
    # The tensor info: name, n_dims, ne[], type (u32), offset. Find the type field's bytes.
    name_b = t.name.encode()
    pos = bytes(data).find(struct.pack("<Q", len(name_b)) + name_b)
    type_pos = pos + 8 + len(name_b) + 4 + 8 * len(t.shape)
    if struct.unpack_from("<I", data, type_pos)[0] != 0:
        fail("could not locate the tensor type field in the fixture")
    bad = bytearray(data)
    struct.pack_into("<I", bad, type_pos, 99)
    p = os.path.join(work, "bad-qtype.gguf")
    open(p, "wb").write(bytes(bad))
    expect_refused(bin_dir, work, "unknown-qtype", p, ["bad-qtype.gguf", "blk.0.ffn_up.weight"])
    # YAML contradicting the file
    r2 = Run(bin_dir, work, "bad-yaml", good_dir, extra_model="  n_layer: 3\n")
    p = subprocess.run([os.path.join(bin_dir, "l2l-eps"), "--job", r2.job, "--state-dir", r2.state], capture_output=True,
                       text=True, timeout=60)
    last = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
    if p.returncode == 0 or not all(n in last for n in ["n_layer=3", "n_layer=2", "bad-yaml.yaml", good_dir]):
        fail(f"contradicting YAML: rc {p.returncode}: {p.stderr.strip()}")
    if os.listdir(r2.state):
        fail("contradicting YAML: files left in the state dir")
    print(f"ok: contradicting YAML: refused: {last}")


def check_sharded_export(d, want_tensors, want_model, toks, limit):
    """`l2lctl export --format hf --max-shard-size` at `limit` bytes: HF's shard names and
    index, every tensor bit-equal to the unsharded export's, and transformers' logits
    equal to those of the unsharded export's model."""
    import safetensors.torch as st
    if os.path.exists(os.path.join(d, "model.safetensors")):
        fail(f"{d}: a sharded export also has model.safetensors")
    index = json.load(open(os.path.join(d, "model.safetensors.index.json")))
    shards = sorted(glob.glob(os.path.join(d, "model-*-of-*.safetensors")))
    n = len(shards)
    names = [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    if n < 3 or [os.path.basename(f) for f in shards] != names:
        fail(f"{d}: shard files {[os.path.basename(f) for f in shards]}, want {n} >= 3 named as transformers does")
    got = {}
    for f in shards:
        t = st.load_file(f)
        size = sum(v.numel() * v.element_size() for v in t.values())
        if size > limit and len(t) > 1:
            fail(f"{f}: {size} bytes of tensors in a shard of at most {limit}")
        for k in t:
            if index["weight_map"].get(k) != os.path.basename(f):
                fail(f"{d}: weight_map[{k}] = {index['weight_map'].get(k)}, but the tensor is in {f}")
        got.update(t)
    if set(index["weight_map"]) != set(got):
        fail(f"{d}: weight_map names {sorted(set(index['weight_map']) ^ set(got))} without a tensor (or the reverse)")
    total = sum(v.numel() * v.element_size() for v in got.values())
    if index["metadata"]["total_size"] != total:
        fail(f"{d}: metadata.total_size {index['metadata']['total_size']}, tensors hold {total} bytes")
    if got.keys() != want_tensors.keys() or any(not torch.equal(got[k], want_tensors[k]) for k in got):
        fail(f"{d}: the sharded tensors differ from the single-file export's")
    hs, info = transformers.AutoModelForCausalLM.from_pretrained(d, output_loading_info=True, torch_dtype=torch.float32)
    for k in ["missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"]:
        if info[k]:
            fail(f"from_pretrained({d}): {k} = {info[k]}")
    x = torch.tensor([toks[:T]])
    hs.eval()
    want_model.eval()
    with torch.no_grad():
        if not torch.equal(hs(input_ids=x).logits, want_model(input_ids=x).logits):
            fail(f"{d}: transformers' logits of the sharded export differ from the single-file export's")
    print(f"ok: export hf --max-shard-size {limit}: {n} shards + model.safetensors.index.json "
          f"({total} bytes), tensors bit-equal to the single file, transformers' logits equal")


# ---- main ------------------------------------------------------------------------------

def synthetic(bin_dir, work):
    rng = np.random.default_rng(5)
    toks = [int(x) for x in rng.integers(0, 96, size=B * T + 1)]
    write_tokens(os.path.join(work, "tokens.bin"), toks)
    for arch in ["llama", "qwen2"]:
        m = tiny(arch)
        want = hf_loss(m, toks)
        d = os.path.join(work, arch + "-f32")
        m.save_pretrained(d, safe_serialization=True)
        check_close(f"{arch} HF dir f32", l2l_first_loss(bin_dir, work, arch + "-f32", d), want, 1e-5)
        d = os.path.join(work, arch + "-sharded")
        m.save_pretrained(d, safe_serialization=True, max_shard_size="20KB")
        if not os.path.exists(os.path.join(d, "model.safetensors.index.json")):
            fail(f"{d}: transformers did not shard")
        check_close(f"{arch} HF dir sharded", l2l_first_loss(bin_dir, work, arch + "-sharded", d), want, 1e-5)
        d = os.path.join(work, arch + "-bf16")
        mb = tiny(arch).to(torch.bfloat16)
        mb.save_pretrained(d, safe_serialization=True)
        # A fresh fp32 model of the stored bf16 weights (mb.float() would keep the rotary
        # inv_freq buffer rounded to bf16).
        want_bf16 = hf_loss(transformers.AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32), toks)
        check_close(f"{arch} HF dir bf16", l2l_first_loss(bin_dir, work, arch + "-bf16", d), want_bf16, 1e-5)
        for q in ["f32", "q8_0"]:
            p = os.path.join(work, f"{arch}-{q}.gguf")
            sd = write_gguf(m, p, q)
            want_q = hf_loss(hf_with(m, sd), toks)
            check_close(f"{arch} GGUF {q}", l2l_first_loss(bin_dir, work, f"{arch}-gguf-{q}", p), want_q, 1e-5)
            if q == "q8_0":
                print(f"   (Q8_0 moves the loss by {abs(want_q - want) / want:.1e} relative to the f32 weights)")

    # Streaming into the SSD tier: a host budget that holds no state page in RAM.
    sp = os.path.join(work, "spill")
    os.makedirs(sp, exist_ok=True)
    with open(os.path.join(work, "eps-spill.yaml"), "w") as f:
        f.write(f"memory: {{host_bytes: 450000, page_bytes: 4096}}\nspill: {{dir: {json.dumps(sp)}, block_bytes: 4096}}\n")
    r = Run(bin_dir, work, "spill", os.path.join(work, "llama-f32"),
            eps_args=["--config", os.path.join(work, "eps-spill.yaml")])
    r.start()
    mem = {m["tier"]: m["used_bytes"] for m in json.loads(r.ctl("status", "--json"))["memory"]}
    if not mem.get("ssd", 0) > 0 or mem.get("ram", 0) != 0:
        fail(f"spill: the imported state is not on the SSD tier: {mem}")
    loss = r.train()[1]
    r.stop()
    check_close(f"llama HF dir imported into the SSD tier ({mem['ssd']} bytes on SSD)", loss,
                hf_loss(tiny("llama"), toks), 1e-5)

    # (c) export after training steps, from a copy of the HF dir with a tokenizer (the
    # copy is deleted before --resume: resuming must not read the imported file again)
    src = os.path.join(work, "llama-copy")
    shutil.copytree(os.path.join(work, "llama-f32"), src)
    from tokenizers import Tokenizer, models as tmodels, pre_tokenizers
    vocab = {f"w{i}": i for i in range(96)}
    tk = Tokenizer(tmodels.WordLevel(vocab, unk_token="w0"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="w0", bos_token="w1", eos_token="w2")
    fast.save_pretrained(src)
    r = Run(bin_dir, work, "train-llama", src, steps=3, lr=1e-2)
    r.start()
    losses = r.train()
    print(f"   trained 3 steps: losses {[round(losses[s], 5) for s in sorted(losses)]}")
    r.ctl("checkpoint")
    r.ctl("export", "--format", "hf", "exp-hf")
    r.ctl("export", "--format", "hf", "--dtype", "bf16", "exp-hf-bf16")
    # Sharded: ~99 KB of f32 weights at 20 KB shards (transformers' spelling of the size).
    r.ctl("export", "--format", "hf", "--max-shard-size", "20KB", "exp-hf-sharded")
    for bad, needles in [(["--max-shard-size", "5XB", "x"], ["--max-shard-size", "5XB"]),
                         (["--max-shard-size", "0", "x"], ["--max-shard-size", "positive"]),
                         (["--format", "gguf", "--max-shard-size", "1MB", "x.gguf"], ["--format hf only"])]:
        argv = [os.path.join(bin_dir, "l2lctl"), "--eps", r.addr, "export"] + (["--format", "hf"] if "--format" not in bad else []) + bad
        p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        if p.returncode != 64 or not all(n in p.stderr for n in needles):
            fail(f"l2lctl {' '.join(argv[3:])}: want exit 64 naming {needles}, got {p.returncode}: {p.stderr.strip()}")
    r.ctl("export", "--format", "gguf", "exp.gguf")
    r.ctl("export", "--format", "gguf", "--dtype", "q8_0", "exp-q8.gguf")
    r.stop()
    exp = os.path.join(r.state, "exp-hf")
    for f in ["config.json", "generation_config.json", "model.safetensors"]:
        if not os.path.exists(os.path.join(exp, f)):
            fail(f"{exp}: no {f}")
    hm, info = transformers.AutoModelForCausalLM.from_pretrained(exp, output_loading_info=True,
                                                                  torch_dtype=torch.float32)
    for k in ["missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"]:
        if info[k]:
            fail(f"from_pretrained({exp}): {k} = {info[k]}")
    text = "w5 w17 w2 w95 w1"
    if transformers.AutoTokenizer.from_pretrained(exp)(text)["input_ids"] != fast(text)["input_ids"]:
        fail(f"{exp}: the exported tokenizer encodes differently from the imported one")
    print("ok: export hf: from_pretrained loads with no missing/unexpected keys; AutoTokenizer loads the copied tokenizer")
    want = hf_loss(hm, toks)
    # --resume: the checkpoint, not the (now deleted) imported dir; exports the same weights.
    shutil.rmtree(src)
    state2 = os.path.join(work, "state-resume")
    shutil.rmtree(state2, ignore_errors=True)
    os.makedirs(state2)
    log2 = open(os.path.join(work, "resume.eps.log"), "w")
    eps2 = subprocess.Popen([os.path.join(bin_dir, "l2l-eps"), "--resume", os.path.join(r.state, "checkpoints"),
                             "--state-dir", state2, "--job-id", "imp-resume" + str(os.getpid()), "--workers", "1"],
                            stdout=log2, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not os.path.exists(os.path.join(state2, "eps.port")) and eps2.poll() is None:
        if time.monotonic() > deadline:
            fail(f"--resume of an imported job did not listen within {START_TIMEOUT_S} s: "
                 + open(log2.name).read()[-2000:])
        time.sleep(0.1)
    if eps2.poll() is not None:
        fail("--resume of an imported job failed: " + open(log2.name).read()[-2000:])
    r.addr = "127.0.0.1:" + open(os.path.join(state2, "eps.port")).read().strip()
    r.ctl("export", "--format", "hf", "exp-hf")
    r.ctl("stop", "--skip-checkpoint")
    eps2.wait(timeout=60)
    import safetensors.torch as st
    a = st.load_file(os.path.join(exp, "model.safetensors"))
    b = st.load_file(os.path.join(state2, "exp-hf", "model.safetensors"))
    if a.keys() != b.keys() or any(not torch.equal(a[k], b[k]) for k in a):
        fail("--resume of an imported job: the exported weights differ from before the restart")
    print("ok: --resume of an imported job restores the trained weights without the imported file")
    check_sharded_export(os.path.join(r.state, "exp-hf-sharded"), a, hm, toks, 20000)
    reimp = l2l_first_loss(bin_dir, work, "reimp-hf", exp)
    check_close("export hf f32 (re-imported by l2l)", reimp, want, 1e-5)
    reimp_sharded = l2l_first_loss(bin_dir, work, "reimp-hf-sharded", os.path.join(r.state, "exp-hf-sharded"))
    if reimp_sharded != reimp:
        fail(f"the sharded export re-imported by l2l: loss {reimp_sharded!r}, the single file's {reimp!r}")
    print(f"ok: export hf sharded (re-imported by l2l): loss {reimp_sharded:.8f}, equal to the single file's")
    hb = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(r.state, "exp-hf-bf16"),
                                                           torch_dtype=torch.float32)
    check_close("export hf bf16 (re-imported by l2l)",
                l2l_first_loss(bin_dir, work, "reimp-hf-bf16", os.path.join(r.state, "exp-hf-bf16")),
                hf_loss(hb, toks), 1e-5)
    for f in ["exp.gguf", "exp-q8.gguf"]:
        p = os.path.join(r.state, f)
        gguf.GGUFReader(p)  # the gguf package reads it
        gm = load_exported_gguf(p)
        check_close(f"export gguf {f} (re-imported by l2l)", l2l_first_loss(bin_dir, work, "reimp-" + f, p),
                    hf_loss(gm, toks), 1e-5)
    # GPT-2 jobs export the same way (hf format)
    g2 = os.path.join(work, "gpt2")
    torch.manual_seed(3)
    gm = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=96, n_positions=32, n_embd=32, n_layer=2,
                                                               n_head=4, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0))
    gm.save_pretrained(g2, safe_serialization=True)
    check_close("gpt2 HF dir", l2l_first_loss(bin_dir, work, "gpt2", g2), hf_loss(gm, toks), 1e-5)
    r = Run(bin_dir, work, "train-gpt2", g2, steps=2, lr=1e-2)
    r.start()
    r.train()
    r.ctl("export", "--format", "hf", "exp-hf")
    r.stop()
    exp = os.path.join(r.state, "exp-hf")
    hm, info = transformers.AutoModelForCausalLM.from_pretrained(exp, output_loading_info=True,
                                                                  torch_dtype=torch.float32)
    for k in ["missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"]:
        if info[k]:
            fail(f"from_pretrained({exp}): {k} = {info[k]}")
    check_close("gpt2 export hf (re-imported by l2l)", l2l_first_loss(bin_dir, work, "reimp-gpt2", exp),
                hf_loss(hm, toks), 1e-5)

    malformed(bin_dir, work, os.path.join(work, "llama-f32"), tiny("llama"))
    print("ok: all import/export oracle checks passed")


def smollm2_tokens_and_hf_loss(work, path):
    """Writes one micro-batch (B = 1 window of T = 48) of English text through the model's
    own tokenizer (transformers' conversion of the GGUF vocabulary; both sides get the
    same ids, so its exact splitting does not matter) and returns transformers' fp32 loss
    of the dequantised model on it."""
    global B, T
    B, T = 1, 48
    tok = transformers.AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    text = ("The quick brown fox jumps over the lazy dog. Language models predict the next word from the words "
            "before it, and a model that has read a great deal of text assigns a high probability to sentences "
            "that people actually write. Fine-tuning continues that training on new text.")
    toks = tok(text)["input_ids"][:B * T + 1]
    if len(toks) < B * T + 1:
        fail(f"the text has only {len(toks)} tokens")
    write_tokens(os.path.join(work, "tokens.bin"), toks)
    m = load_exported_gguf(path)
    want = hf_loss(m, toks)
    del m
    return want


def smollm2(bin_dir, work, path):
    want = smollm2_tokens_and_hf_loss(work, path)
    ours = l2l_first_loss(bin_dir, work, "smollm2", path)
    check_close("SmolLM2-135M GGUF (Q4_1)", ours, want, 1e-3)
    print(f"   perplexity l2l {np.exp(ours):.3f} transformers {np.exp(want):.3f}")


def smollm2_bf16(bin_dir, work, path):
    """(h) The bf16 path on the CUDA backend (BIN_DIR: a CUDA build, on the emulator in CI):
    layers published bf16 and multiplied as they arrive, bf16 GEMMs with fp32 accumulation
    (L2L_CUDA_GEMM=bf16), the stash between layers bf16; transformers' fp32 loss within
    1e-2 relative. Every GEMM operand is rounded to 8 significant bits (relative error up
    to 2^-9 per element); over 30 blocks these errors add to the logits like a random walk,
    and the mean over 48 tokens of log-probabilities moves by far less than 1e-2 of a loss
    near 4 unless something is wrong (a mis-cast operand or a stale copy moves it by O(1)).
    The fp32 import of the same file is held to 1e-3 (smollm2 above)."""
    want = smollm2_tokens_and_hf_loss(work, path)
    env = dict(os.environ, L2L_CUDA_GEMM="bf16")
    r = Run(bin_dir, work, "smollm2-bf16", path, steps=1, extra_train=", stash_dtype: bf16",
            extra_job="publish_dtype: bf16\n", worker_args=["--device", "cuda:0"], worker_env=env)
    r.start()
    ours = r.train()[1]
    r.stop()
    for needle in ("gemm bf16", "layers copied as published, bf16", "stash device bf16", "bf16 GEMM operands:"):
        if needle not in r.worker_log:
            fail(f"smollm2-bf16: the worker did not run the bf16 path ('{needle}' not in its log): "
                 + r.worker_log[-2000:])
    check_close("SmolLM2-135M GGUF (Q4_1) through the CUDA bf16 path", ours, want, 1e-2)


# ---- (g) export --dtype q4_k_m of the real SmolLM2 ------------------------------------

def use_more_bits(i, n):
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def q4_k_m_type(name, shape, n_layer, has_output):
    """The type llama.cpp's llama_tensor_get_type gives a Llama tensor for
    LLAMA_FTYPE_MOSTLY_Q4_K_M (llama-quant.cpp, written here from that source): shape is
    row-major, its last entry the row length (ne[0])."""
    QT = gguf.GGMLQuantizationType
    if len(shape) < 2:
        return QT.F32
    nx = shape[-1]
    t = QT.Q4_K
    if name == "output.weight" or (not has_output and name == "token_embd.weight"):
        t = QT.Q8_0 if nx % 256 else QT.Q6_K
    elif "attn_v.weight" in name or "ffn_down" in name:
        if use_more_bits(int(name.split(".")[1]), n_layer):
            t = QT.Q6_K
    if nx % 256:  # llama.cpp's fallback for rows that are not whole super-blocks
        t = {QT.Q4_K: QT.Q5_0, QT.Q6_K: QT.Q8_0}.get(t, t)
    if nx % 32:
        t = QT.F16
    return t


def smollm2_q4_k_m(bin_dir, work, path):
    """Import the real SmolLM2-135M (Q4_1), export --format gguf --dtype q4_k_m: the gguf
    package reads the file, every tensor has the type llama.cpp's Q4_K_M recipe gives it
    and decodes to finite values, and l2l-eval's perplexity of the export on 512 tokens of
    GPL-3 is within 6% of the original file's."""
    global B, T
    B, T = 1, 16
    write_tokens(os.path.join(work, "tokens.bin"), list(range(1, B * T + 2)))
    r = Run(bin_dir, work, "smollm2-q4km", path, steps=1)
    r.start()
    r.ctl("export", "--format", "gguf", "--dtype", "q4_k_m", "exp-q4km.gguf")
    r.stop()
    exp = os.path.join(r.state, "exp-q4km.gguf")
    g = gguf.GGUFReader(exp)
    n_layer = int(g.fields["llama.block_count"].parts[-1][0])
    ftype = int(g.fields["general.file_type"].parts[-1][0])
    if ftype != 15:
        fail(f"{exp}: general.file_type {ftype}, expected 15 (MOSTLY_Q4_K_M)")
    names = {t.name for t in g.tensors}
    counts = {}
    for t in g.tensors:
        shape = [int(d) for d in reversed(t.shape)]
        want = q4_k_m_type(t.name, shape, n_layer, "output.weight" in names)
        if t.tensor_type != want:
            fail(f"{exp}: tensor {t.name} {shape} is {t.tensor_type.name}, the Q4_K_M recipe gives {want.name}")
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
        x = gguf.quants.dequantize(t.data, t.tensor_type)
        if not np.all(np.isfinite(x)):
            fail(f"{exp}: tensor {t.name} decodes to non-finite values")
    for need in ["Q4_K", "Q6_K", "Q5_0", "Q8_0", "F32"]:
        if need not in counts:
            fail(f"{exp}: no {need} tensor (types {counts}): the recipe's branches are not all exercised")
    print(f"ok: export q4_k_m: {len(g.tensors)} tensors by the recipe {counts}; "
          f"{os.path.getsize(exp) / 1e6:.1f} MB (the Q4_1 original {os.path.getsize(path) / 1e6:.1f} MB)")
    tokenize, ev = os.path.join(bin_dir, "l2l-tokenize"), os.path.join(bin_dir, "l2l-eval")
    txt, data = os.path.join(work, "gpl3.txt"), os.path.join(work, "gpl3.bin")
    with open("/usr/share/common-licenses/GPL-3", encoding="utf-8") as f:
        open(txt, "w").write(f.read()[:8000])
    p = subprocess.run([tokenize, txt, data, "--tokenizer", path], capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        fail(f"l2l-tokenize: {p.stderr}")
    ppl = {}
    for what, m in [("original", path), ("q4_k_m export", exp)]:
        p = subprocess.run([ev, "--model", m, "--data", data, "--tokens", "513"], capture_output=True, text=True,
                           timeout=900)
        import re
        got = re.search(r"eval: loss (\S+) perplexity (\S+) tokens (\d+)", p.stdout)
        if p.returncode != 0 or not got:
            fail(f"l2l-eval --model {m}: exit {p.returncode}: {p.stdout[-800:]} {p.stderr[-800:]}")
        ppl[what] = float(got.group(2))
    rel = abs(ppl["q4_k_m export"] - ppl["original"]) / ppl["original"]
    print(f"   perplexity on 512 tokens of GPL-3: original {ppl['original']:.4f}, "
          f"q4_k_m export {ppl['q4_k_m export']:.4f} (rel {rel:.4f})")
    # Measured 2026-11-27: 18.7261 -> 19.6337 (rel 0.0485; the export re-quantizes the Q4_1
    # weights, mostly to Q5_0 as llama.cpp would for rows of 576).
    if not rel <= 0.06:
        fail(f"the q4_k_m export's perplexity {ppl['q4_k_m export']} is not within 6% of the original's {ppl['original']}")
    print("ok: export q4_k_m of SmolLM2-135M")


# ---- (f) the tokenizer of an HF import in a GGUF export --------------------------------

# The split regexes of the Llama-3 and Qwen2 tokenizer.json files.
LLAMA3_RE = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2_RE = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"


def license_text():
    parts = []
    for p in ["/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/Apache-2.0"]:
        if os.path.exists(p):
            parts.append(open(p, encoding="utf-8", errors="replace").read())
    if not parts:
        fail("no Debian license texts under /usr/share/common-licenses")
    return "\n".join(parts)


def varied_docs(text):
    docs = [text[i:i + 1500] for i in range(0, min(len(text), 60000), 1500)]
    docs += [
        "I'm sure they'll say WE'VE done it; don't you think? It's 2024-05-20, 3.14159 and 1234567890.",
        "def f(x):\n    return {'a': [1, 2, 3], \"b\": x ** 2}  # comment\n\n\n\tindented\ttabs  \n",
        "Ünïcödé: naïve café, Straße, Ελληνικά, русский, 日本語のテキスト, 한국어, emoji 😀👍🏽 and ½ ⅓ ²³.",
        "   leading spaces, trailing spaces   \n\n\n   \r\n  mixed\r\n\r\nline ends   ",
        "<|im_start|>user\nHello there!<|im_end|>\n<|im_start|>assistant\nHi 42 times.<|im_end|><|endoftext|>",
        "<|begin_of_text|>text after bos and <|endoftext|> inside, then digits 000111222333",
        "",
    ]
    return docs


def gguf_field(r, key):
    f = r.fields.get(key)
    if f is None:
        return None
    if len(f.types) and f.types[0] == gguf.GGUFValueType.ARRAY:
        if f.types[-1] == gguf.GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
        return [int(f.parts[i][0]) for i in f.data]
    if f.types[0] == gguf.GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8")
    return f.parts[f.data[0]][0].item()


def tokenizer_flavor(work, flavor, text):
    """An HF dir: a tiny LlamaForCausalLM and a byte-level BPE tokenizer.json trained here
    with the pre-tokenizer of `flavor` (the llama.cpp tokenizer.ggml.pre name)."""
    from tokenizers import Tokenizer, Regex, decoders, models as tmodels, pre_tokenizers, processors, trainers
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>"]
    tk = Tokenizer(tmodels.BPE())
    if flavor == "gpt-2":
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    elif flavor == "llama-bpe":
        tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3_RE), "isolated"),
                                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    elif flavor == "qwen2":
        tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2_RE), "isolated"),
                                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:  # smollm
        tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                    pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=420, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tk.train_from_iterator(text.split("\n\n"), trainer=trainer)
    bos = tk.token_to_id("<|begin_of_text|>")
    if flavor == "llama-bpe":
        tk.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B",
                                                          special_tokens=[("<|begin_of_text|>", bos)])
    d = os.path.join(work, "tok-" + flavor)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    path = os.path.join(d, "tokenizer.json")
    tk.save(path)
    if flavor == "llama-bpe":  # as Llama-3's tokenizer.json (llama.cpp's llama-bpe ignores merges)
        j = json.load(open(path))
        j["model"]["ignore_merges"] = True
        json.dump(j, open(path, "w"))
    template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|endoftext|>", "pad_token": "<|im_end|>",
               "chat_template": template, "tokenizer_class": "PreTrainedTokenizerFast"},
              open(os.path.join(d, "tokenizer_config.json"), "w"))
    n = tk.get_vocab_size()
    torch.manual_seed(4)
    cfg = transformers.LlamaConfig(vocab_size=n + 3, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   tie_word_embeddings=True, bos_token_id=bos, eos_token_id=tk.token_to_id("<|endoftext|>"))
    transformers.LlamaForCausalLM(cfg).save_pretrained(d, safe_serialization=True)
    return d, path, n + 3, template


def gguf_tokenizer(bin_dir, work, tool):
    from tokenizers import Tokenizer
    text = license_text()
    docs = varied_docs(text)
    docs_path = os.path.join(work, "docs.json")
    json.dump(docs, open(docs_path, "w"))
    write_tokens(os.path.join(work, "tokens.bin"), [i % 200 for i in range(B * T + 1)])
    for flavor in ["gpt-2", "llama-bpe", "qwen2", "smollm"]:
        d, tj_path, V, template = tokenizer_flavor(work, flavor, text)
        r = Run(bin_dir, work, "tok-" + flavor, d)
        r.start()
        r.ctl("export", "--format", "gguf", "tok.gguf")
        r.stop()
        p = os.path.join(r.state, "tok.gguf")
        # (1) The metadata, read by the gguf package, is the tokenizer.json's.
        g = gguf.GGUFReader(p)
        tj = json.load(open(tj_path))
        want_tokens = [f"[PAD{i}]" for i in range(V)]
        want_types = [5] * V
        for t, i in tj["model"]["vocab"].items():
            want_tokens[i], want_types[i] = t, 1
        for a in tj["added_tokens"]:
            want_tokens[a["id"]], want_types[a["id"]] = a["content"], 3 if a["special"] else 4
        merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
        hf = Tokenizer.from_file(tj_path)
        checks = {
            "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": flavor, "tokenizer.ggml.tokens": want_tokens,
            "tokenizer.ggml.token_type": want_types, "tokenizer.ggml.merges": merges,
            "tokenizer.ggml.bos_token_id": hf.token_to_id("<|begin_of_text|>"),
            "tokenizer.ggml.eos_token_id": hf.token_to_id("<|endoftext|>"),
            "tokenizer.ggml.padding_token_id": hf.token_to_id("<|im_end|>"),
            "tokenizer.ggml.add_bos_token": flavor == "llama-bpe", "tokenizer.ggml.add_eos_token": False,
            "tokenizer.chat_template": template,
        }
        for key, want in checks.items():
            got = gguf_field(g, key)
            if got != want:
                fail(f"{flavor}: {p}: {key} = {str(got)[:200]}, expected {str(want)[:200]}")
        # (2) l2l's tokenizer loaded from the GGUF encodes as HF does with tokenizer.json,
        # and so does FromGguf on the metadata as the gguf package read it.
        want_ids = [e.ids for e in hf.encode_batch(docs)]
        meta = {"tokens": want_tokens, "merges": merges, "token_type": want_types, "pre": flavor,
                "bos": checks["tokenizer.ggml.bos_token_id"], "eos": checks["tokenizer.ggml.eos_token_id"],
                "add_bos": checks["tokenizer.ggml.add_bos_token"], "add_eos": False}
        meta_path = os.path.join(work, f"meta-{flavor}.json")
        json.dump(meta, open(meta_path, "w"))
        for how in (["--load", p], ["--gguf-meta", meta_path]):
            out = os.path.join(work, f"ids-{flavor}.json")
            res = subprocess.run([tool, "encode"] + how + ["--docs", docs_path, "--out", out], capture_output=True,
                                 text=True)
            if res.returncode != 0:
                fail(f"{flavor}: l2l_tokenizer_tool {how[0]}: {res.stdout} {res.stderr}")
            got = json.load(open(out))
            for i, (a, b) in enumerate(zip(got, want_ids)):
                if a != b:
                    fail(f"{flavor} ({how[0]}): document {i} {docs[i][:60]!r}: l2l {a[:20]}... HF {b[:20]}...")
        n_tok = sum(len(x) for x in want_ids)
        print(f"ok: {flavor}: GGUF export carries the tokenizer (pre {flavor}); {len(docs)} documents, {n_tok} "
              f"tokens encode as HF tokenizers")
    # A tokenizer with no GGUF form (WordLevel) leaves the export without tokenizer
    # metadata, and the daemon says so.
    d = os.path.join(work, "llama-wordlevel")
    shutil.rmtree(d, ignore_errors=True)
    tiny("llama").save_pretrained(d, safe_serialization=True)
    from tokenizers import Tokenizer as T2, models as tm2, pre_tokenizers as pt2
    wl = T2(tm2.WordLevel({f"w{i}": i for i in range(96)}, unk_token="w0"))
    wl.pre_tokenizer = pt2.Whitespace()
    wl.save(os.path.join(d, "tokenizer.json"))
    r = Run(bin_dir, work, "tok-wordlevel", d)
    r.start()
    r.ctl("export", "--format", "gguf", "tok.gguf")
    r.stop()
    g = gguf.GGUFReader(os.path.join(r.state, "tok.gguf"))
    if "tokenizer.ggml.model" in g.fields:
        fail("a WordLevel tokenizer was written as GGUF tokenizer metadata")
    log = open(os.path.join(work, "tok-wordlevel.eps.log")).read()
    if "without tokenizer metadata" not in log or "BPE" not in log:
        fail("the daemon did not say why the GGUF export has no tokenizer: " + log[-1500:])
    print("ok: a WordLevel tokenizer: GGUF written without tokenizer metadata, the daemon log says why")


if __name__ == "__main__":
    bin_dir, work, what = sys.argv[1], sys.argv[2], sys.argv[3]
    os.makedirs(work, exist_ok=True)
    torch.set_num_threads(2)
    if what == "synthetic":
        synthetic(bin_dir, work)
    elif what == "smollm2":
        smollm2(bin_dir, work, sys.argv[4])
    elif what == "smollm2_bf16":
        smollm2_bf16(bin_dir, work, sys.argv[4])
    elif what == "smollm2_q4_k_m":
        smollm2_q4_k_m(bin_dir, work, sys.argv[4])
    elif what == "gguf_tokenizer":
        gguf_tokenizer(bin_dir, work, sys.argv[4])
    else:
        fail("unknown mode " + what)
