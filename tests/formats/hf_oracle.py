"""Independent side of the model-directory tests (tests/formats/model_reader_test.cc):
config.json written by transformers' own config classes, safetensors by the `safetensors`
package (torch tensors, so BF16 too), a tiny Llama GGUF written the way llama.cpp's
converter does (gguf's TensorNameMap for names, the q/k permutation), and checks of
directories l2l wrote with transformers' from_pretrained. Run with the oracle venv's python.

  hf_oracle.py fixtures OUTDIR     model dirs + expected values + manifest.json
  hf_oracle.py check_dir DIR EXP   loads an l2l-written dir with AutoModelForCausalLM and
                                   compares every weight with EXP/<name>.f32
  hf_oracle.py check_gguf_export GGUF EXP   the same through transformers' GGUF loader
Exits non-zero with a message on the first failure.
"""
import json
import os
import struct
import sys

os.environ["HF_HUB_OFFLINE"] = "1"
import numpy as np
import torch
import gguf
import transformers
from safetensors.torch import save_file


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def tiny_llama_config(**kw):
    args = dict(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=64, rope_theta=50000.0, rms_norm_eps=1e-6,
                tie_word_embeddings=False, bos_token_id=1, eos_token_id=[2, 3], torch_dtype="bfloat16",
                rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                              "original_max_position_embeddings": 32})
    args.update(kw)
    return transformers.LlamaConfig(**args)


def state_dict(cfg, seed):
    """HF LlamaForCausalLM's own parameter names and shapes, random values."""
    torch.manual_seed(seed)
    m = transformers.LlamaForCausalLM(cfg)
    return {k: torch.randn(v.shape) for k, v in m.state_dict().items()}


def config_expect(cfg):
    d = cfg.to_dict()
    keys = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "max_position_embeddings", "rope_theta", "rms_norm_eps", "tie_word_embeddings",
            "attention_bias", "bos_token_id", "eos_token_id", "torch_dtype", "rope_scaling", "model_type",
            "architectures", "sliding_window", "use_sliding_window", "layer_norm_epsilon", "n_embd", "n_layer",
            "n_head", "n_positions", "n_inner", "head_dim"]
    return {k: d[k] for k in keys if k in d}


def save_expected(out_dir, sd):
    os.makedirs(out_dir, exist_ok=True)
    for k, v in sd.items():
        v.float().numpy().astype(np.float32).tofile(os.path.join(out_dir, k + ".f32"))


def hand_safetensors(path, header, data):
    h = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


def fixtures(out):
    manifest = {}
    # 1. A Llama dir, one file, tensors in F32, BF16 and F16 (as stored; expected = torch's
    #    own widening of the stored values).
    cfg = tiny_llama_config(architectures=["LlamaForCausalLM"])
    d = os.path.join(out, "llama")
    cfg.save_pretrained(d)
    sd = state_dict(cfg, 1)
    dtypes = [torch.float32, torch.bfloat16, torch.float16]
    stored = {k: v.to(dtypes[i % 3]).contiguous() for i, (k, v) in enumerate(sorted(sd.items()))}
    save_file(stored, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    save_expected(os.path.join(out, "llama.expected"), stored)
    manifest["llama"] = {"config": config_expect(cfg),
                         "tensors": {k: {"shape": list(v.shape), "dtype": str(v.dtype).replace("torch.", "")}
                                     for k, v in stored.items()}}

    # 2. The same weights sharded in three files with an index (as save_pretrained lays out).
    d = os.path.join(out, "sharded")
    cfg.save_pretrained(d)
    names = sorted(stored)
    parts = [names[0::3], names[1::3], names[2::3]]
    wm = {}
    for i, p in enumerate(parts):
        fn = f"model-{i + 1:05d}-of-00003.safetensors"
        save_file({k: stored[k] for k in p}, os.path.join(d, fn), metadata={"format": "pt"})
        wm.update({k: fn for k in p})
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": wm}, f)

    # 3. GPT-2 and Qwen2 configs (key names and types), written by transformers.
    g = transformers.GPT2Config(n_embd=48, n_layer=3, n_head=4, n_positions=128, vocab_size=50,
                                architectures=["GPT2LMHeadModel"])
    g.save_pretrained(os.path.join(out, "gpt2"))
    manifest["gpt2"] = {"config": config_expect(g)}
    q = transformers.Qwen2Config(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, use_sliding_window=False,
                                 sliding_window=4096, rope_theta=1e6, tie_word_embeddings=True,
                                 architectures=["Qwen2ForCausalLM"])
    q.save_pretrained(os.path.join(out, "qwen2"))
    manifest["qwen2"] = {"config": config_expect(q)}

    # 4. Broken directories, one defect each.
    def copy_dir(src, dst):
        os.makedirs(dst, exist_ok=True)
        for f in os.listdir(src):
            with open(os.path.join(src, f), "rb") as a, open(os.path.join(dst, f), "wb") as b:
                b.write(a.read())
    copy_dir(os.path.join(out, "sharded"), os.path.join(out, "missing_shard"))
    os.remove(os.path.join(out, "missing_shard", "model-00002-of-00003.safetensors"))
    copy_dir(os.path.join(out, "sharded"), os.path.join(out, "index_extra"))
    with open(os.path.join(out, "index_extra", "model.safetensors.index.json"), "w") as f:
        json.dump({"weight_map": dict(wm, **{"model.ghost.weight": "model-00001-of-00003.safetensors"})}, f)
    for name, key, val in [("bad_type", "hidden_size", "32"), ("bad_bool", "tie_word_embeddings", 1),
                           ("bad_rope", "rope_scaling", {"rope_type": "llama3", "factor": "8"})]:
        dd = os.path.join(out, name)
        copy_dir(os.path.join(out, "llama"), dd)
        c = json.load(open(os.path.join(dd, "config.json")))
        c[key] = val
        json.dump(c, open(os.path.join(dd, "config.json"), "w"))
    dd = os.path.join(out, "bad_shape")
    copy_dir(os.path.join(out, "llama"), dd)
    # shape [3, 4] of F32 needs 48 bytes; data_offsets span 40.
    hand_safetensors(os.path.join(dd, "model.safetensors"),
                     {"w.bad": {"dtype": "F32", "shape": [3, 4], "data_offsets": [0, 40]}}, b"\0" * 40)
    dd = os.path.join(out, "int_tensor")
    copy_dir(os.path.join(out, "llama"), dd)
    save_file({"model.ids": torch.arange(4, dtype=torch.int64)}, os.path.join(dd, "model.safetensors"))
    dd = os.path.join(out, "truncated")
    copy_dir(os.path.join(out, "llama"), dd)
    b = open(os.path.join(dd, "model.safetensors"), "rb").read()
    open(os.path.join(dd, "model.safetensors"), "wb").write(b[:-100])
    dd = os.path.join(out, "no_weights")
    os.makedirs(dd)
    cfg.save_pretrained(dd)

    # 5. A tiny Llama GGUF as llama.cpp's converter writes one: gguf's name map, q/k
    #    permuted with n_head / n_head_kv, F32 (exact), expected = the HF tensors.
    cfg_g = tiny_llama_config(rope_scaling=None)
    sd = state_dict(cfg_g, 2)
    w = gguf.GGUFWriter(os.path.join(out, "tiny_llama.gguf"), "llama")
    w.add_block_count(cfg_g.num_hidden_layers)
    w.add_context_length(cfg_g.max_position_embeddings)
    w.add_embedding_length(cfg_g.hidden_size)
    w.add_feed_forward_length(cfg_g.intermediate_size)
    w.add_head_count(cfg_g.num_attention_heads)
    w.add_head_count_kv(cfg_g.num_key_value_heads)
    w.add_rope_freq_base(cfg_g.rope_theta)
    w.add_layer_norm_rms_eps(cfg_g.rms_norm_eps)
    w.add_rope_dimension_count(cfg_g.hidden_size // cfg_g.num_attention_heads)
    w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
    w.add_rope_scaling_factor(2.0)
    w.add_token_list([f"t{i}" for i in range(cfg_g.vocab_size)])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg_g.num_hidden_layers)
    nh, nkv = cfg_g.num_attention_heads, cfg_g.num_key_value_heads
    gguf_names = {}
    for k, v in sd.items():
        x = v.numpy().astype(np.float32)
        if k.endswith("q_proj.weight"):
            x = x.reshape(nh, 2, x.shape[0] // nh // 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)
        if k.endswith("k_proj.weight"):
            x = x.reshape(nkv, 2, x.shape[0] // nkv // 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)
        gn = tmap.get_name(k, try_suffixes=(".weight", ".bias"))
        if gn is None:
            fail(f"gguf has no name for {k}")
        gguf_names[k] = gn
        w.add_tensor(gn, np.ascontiguousarray(x))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    save_expected(os.path.join(out, "tiny_llama.expected"), sd)
    manifest["tiny_llama"] = {"gguf_names": gguf_names, "n_head": nh, "n_kv": nkv,
                              "shapes": {k: list(v.shape) for k, v in sd.items()}}

    # 6. A tiny Qwen2 GGUF: llama.cpp's converter does not permute Qwen2's q/k, and Qwen2
    #    has q/k/v biases.
    qc = transformers.Qwen2Config(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                  num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    torch.manual_seed(3)
    qsd = {k: torch.randn(v.shape) for k, v in transformers.Qwen2ForCausalLM(qc).state_dict().items()
           if k != "lm_head.weight"}
    w = gguf.GGUFWriter(os.path.join(out, "tiny_qwen2.gguf"), "qwen2")
    w.add_block_count(1)
    w.add_embedding_length(32)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_rope_freq_base(1e6)
    w.add_vocab_size(40)
    qmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN2, 1)
    for k, v in qsd.items():
        w.add_tensor(qmap.get_name(k, try_suffixes=(".weight", ".bias")), v.numpy().astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    save_expected(os.path.join(out, "tiny_qwen2.expected"), qsd)
    manifest["tiny_qwen2"] = {"names": sorted(qsd)}
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f)


def check_dir(d, expected_dir):
    cfg = transformers.AutoConfig.from_pretrained(d)
    m, info = transformers.AutoModelForCausalLM.from_pretrained(d, output_loading_info=True, torch_dtype=torch.float32)
    for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        if info[k]:
            fail(f"from_pretrained({d}): {k} = {info[k]}")
    sd = m.state_dict()
    n = 0
    for k, v in sd.items():
        p = os.path.join(expected_dir, k + ".f32")
        if not os.path.exists(p):
            if cfg.tie_word_embeddings and k == "lm_head.weight":
                continue
            fail(f"no expected values for {k}")
        want = torch.from_numpy(np.fromfile(p, dtype=np.float32).reshape(v.shape))
        dt = open(os.path.join(expected_dir, k + ".dtype")).read().strip()
        if dt == "bf16":
            want = want.to(torch.bfloat16).float()
        if not torch.equal(v.float(), want):
            fail(f"{k}: transformers loads different values ({dt})")
        n += 1
    print(f"ok: {type(m).__name__} loaded {n} tensors, no missing/unexpected keys; config {cfg.model_type}")


def check_gguf_export(path, expected_dir):
    """A GGUF l2l exported, loaded by transformers' own GGUF loader (which dequantizes and
    undoes the Llama q/k permutation itself); values equal HF's, Q8_0 ones equal gguf's
    quantize -> dequantize of HF's."""
    # from_pretrained(gguf_file=...) needs accelerate (not in the oracle venv); this is the
    # same path without it: the config from the GGUF metadata, then transformers' own GGUF
    # tensor conversion, loaded strictly (missing or unexpected keys raise).
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    cfg = transformers.AutoConfig.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    m = transformers.AutoModelForCausalLM.from_config(cfg)
    tensors = load_gguf_checkpoint(path, return_tensors=True)["tensors"]
    res = m.load_state_dict(tensors, strict=False)
    missing = [k for k in res.missing_keys if not (k == "lm_head.weight" and cfg.tie_word_embeddings)]
    if missing or res.unexpected_keys:
        fail(f"{path}: missing {missing}, unexpected {res.unexpected_keys}")
    n = 0
    for k, v in m.state_dict().items():
        p = os.path.join(expected_dir, k + ".f32")
        if not os.path.exists(p):
            fail(f"transformers has {k}, l2l exported no such tensor")
        want = np.fromfile(p, dtype=np.float32).reshape(tuple(v.shape))
        if open(os.path.join(expected_dir, k + ".dtype")).read().strip() == "q8_0":
            want = gguf.quants.dequantize(gguf.quants.quantize(want, gguf.GGMLQuantizationType.Q8_0),
                                          gguf.GGMLQuantizationType.Q8_0)
        if not np.array_equal(v.numpy(), want):
            fail(f"{k}: transformers' GGUF loader gives other values (max diff {np.abs(v.numpy() - want).max()})")
        n += 1
    print(f"ok: transformers loaded {n} tensors from the l2l GGUF, config {m.config.model_type}")


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "fixtures":
        fixtures(sys.argv[2])
    elif cmd == "check_gguf_export":
        check_gguf_export(sys.argv[2], sys.argv[3])
    elif cmd == "check_dir":
        check_dir(sys.argv[2], sys.argv[3])
    else:
        fail("unknown command " + cmd)
