#!/usr/bin/python3
"""Independent checks of l2l's file formats from Python (json + numpy + torch only).

  check_formats.py safetensors TOOL   TOOL = l2l_format_tool (tests/common/format_tool.cc)
  check_formats.py tokenize BIN       BIN  = l2l-tokenize

safetensors: parses files written by l2l's writer with a reader written here from the
format description (header length, JSON, 8-byte alignment, contiguous offsets), checks
the Hugging Face GPT-2 names/shapes and that BF16/F16 values are torch's/numpy's
round-to-nearest-even of the fp32 weights; then writes files with an independent
writer (mixed dtypes, 'transformer.' prefix, attention buffers, no padding) and checks
l2l loads exactly the values numpy/torch decode, and rejects a corrupt one.
tokenize: runs l2l-tokenize and checks the llm.c layout with numpy, plus error exits.
Exits non-zero on the first failure.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def hf_gpt2_layout(spec):
    """(name, shape) in model order, as Hugging Face GPT-2 stores them."""
    V, T, C, F = spec["vocab_size"], spec["seq_len"], spec["d_model"], spec["d_ff"]
    out = [("wte.weight", (V, C)), ("wpe.weight", (T, C))]
    for i in range(spec["n_layer"]):
        h = f"h.{i}."
        out += [(h + "ln_1.weight", (C,)), (h + "ln_1.bias", (C,)),
                (h + "attn.c_attn.weight", (C, 3 * C)), (h + "attn.c_attn.bias", (3 * C,)),
                (h + "attn.c_proj.weight", (C, C)), (h + "attn.c_proj.bias", (C,)),
                (h + "ln_2.weight", (C,)), (h + "ln_2.bias", (C,)),
                (h + "mlp.c_fc.weight", (C, F)), (h + "mlp.c_fc.bias", (F,)),
                (h + "mlp.c_proj.weight", (F, C)), (h + "mlp.c_proj.bias", (C,))]
    out += [("ln_f.weight", (C,)), ("ln_f.bias", (C,))]
    if not spec["tied_embeddings"]:
        out.append(("lm_head.weight", (V, C)))
    return out


def read_safetensors(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    check(8 + n <= len(raw), f"{path}: header length {n} past the end")
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = raw[8 + n:]
    meta = header.pop("__metadata__", {})
    spans = sorted((v["data_offsets"][0], v["data_offsets"][1], k) for k, v in header.items())
    pos = 0
    for b, e, k in spans:
        check(b == pos, f"{path}: tensor {k} starts at {b}, expected {pos} (contiguous)")
        pos = e
    check(pos == len(data), f"{path}: data section has {len(data)} bytes, tensors cover {pos}")
    return n, header, meta, data


def decode(info, data):
    b, e = info["data_offsets"]
    buf = data[b:e]
    shape = tuple(info["shape"])
    dt = info["dtype"]
    if dt == "F32":
        return np.frombuffer(buf, dtype="<f4").reshape(shape)
    if dt == "F16":
        return np.frombuffer(buf, dtype="<f2").astype(np.float32).reshape(shape)
    if dt == "BF16":
        bits = np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16
        return bits.view(np.float32).reshape(shape)
    fail(f"unexpected dtype {dt}")


def expected_tensors(spec, flat):
    out, pos = {}, 0
    for name, shape in hf_gpt2_layout(spec):
        n = int(np.prod(shape))
        out[name] = flat[pos:pos + n].reshape(shape)
        pos += n
    check(pos == flat.size, f"layer buffers hold {flat.size} floats, layout {pos}")
    return out


def bits16(x, dtype):
    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    if dtype == "BF16":
        return t.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    return x.astype(np.float16).view(np.uint16)


def check_written(tool, d):
    subprocess.run([tool, "write-model", d], check=True)
    for fname, variant, dtype in [("model_f32", "tied", "F32"), ("model_bf16", "tied", "BF16"),
                                  ("model_f16", "untied", "F16")]:
        path = os.path.join(d, fname + ".safetensors")
        spec = json.load(open(os.path.join(d, f"spec_{variant}.json")))
        flat = np.fromfile(os.path.join(d, f"layers_{variant}.f32"), dtype="<f4")
        want = expected_tensors(spec, flat)
        n, header, meta, data = read_safetensors(path)
        check(n % 8 == 0, f"{path}: header length {n} is not a multiple of 8")
        check(meta.get("format") == "pt", f"{path}: metadata format is {meta.get('format')}")
        check(json.loads(meta["l2l.model_spec"]) == spec, f"{path}: metadata spec differs")
        check(set(header) == set(want), f"{path}: names {sorted(set(header) ^ set(want))} differ from HF GPT-2")
        for name, ref in want.items():
            info = header[name]
            check(info["dtype"] == dtype, f"{path}: {name} dtype {info['dtype']}")
            check(tuple(info["shape"]) == ref.shape, f"{path}: {name} shape {info['shape']} != {ref.shape}")
            b, e = info["data_offsets"]
            if dtype == "F32":
                got = np.frombuffer(data[b:e], dtype="<f4").reshape(ref.shape)
                check(np.array_equal(got, ref), f"{path}: {name} values differ")
            else:
                got = np.frombuffer(data[b:e], dtype="<u2").reshape(ref.shape)
                check(np.array_equal(got, bits16(ref, dtype)), f"{path}: {name} {dtype} bits differ from RNE")
        print(f"ok: {fname} ({len(header)} tensors, {dtype}) matches the independent reader")


def write_safetensors(path, tensors, meta=None):
    """An independent writer: no padding, tensors in the given order."""
    header, blobs, pos = {}, [], 0
    if meta:
        header["__metadata__"] = meta
    for name, dtype, arr in tensors:
        if dtype == "F32":
            blob = np.ascontiguousarray(arr, dtype="<f4").tobytes()
        elif dtype == "F16":
            blob = arr.astype("<f2").tobytes()
        else:
            blob = bits16(arr, "BF16").astype("<u2").tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [pos, pos + len(blob)]}
        blobs.append(blob)
        pos += len(blob)
    h = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def check_read(tool, d):
    spec = {"vocab_size": 256, "seq_len": 32, "d_model": 32, "n_layer": 2, "n_head": 2, "d_ff": 128,
            "tied_embeddings": True}
    spec_path = os.path.join(d, "py_spec.json")
    json.dump(spec, open(spec_path, "w"))
    rng = np.random.default_rng(5)
    layout = hf_gpt2_layout(spec)
    dtypes = ["F32", "BF16", "F16"]
    tensors, expect = [], []
    for i, (name, shape) in enumerate(layout):
        arr = rng.standard_normal(shape).astype(np.float32)
        dt = dtypes[i % 3]
        tensors.append(("transformer." + name, dt, arr))
        stored = {"F32": arr, "F16": arr.astype(np.float16).astype(np.float32),
                  "BF16": torch.from_numpy(arr).to(torch.bfloat16).to(torch.float32).numpy()}[dt]
        expect.append(stored.reshape(-1))
    tensors.append(("transformer.h.0.attn.bias", "F32", np.tril(np.ones((1, 1, 32, 32), np.float32))))
    tensors.reverse()  # file order need not be model order
    path = os.path.join(d, "py.safetensors")
    write_safetensors(path, tensors, {"format": "pt"})
    out = os.path.join(d, "py_loaded.f32")
    subprocess.run([tool, "read-model", path, spec_path, out], check=True)
    got = np.fromfile(out, dtype="<f4")
    want = np.concatenate(expect)
    check(got.shape == want.shape and np.array_equal(got, want), "l2l loaded different values than numpy/torch decode")
    print(f"ok: l2l reads a Python-written file with mixed dtypes ({got.size} floats, exact)")

    # Corrupt: offsets past the end of the data section must be rejected naming the tensor.
    bad = os.path.join(d, "bad.safetensors")
    h = json.dumps({"wte.weight": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    open(bad, "wb").write(struct.pack("<Q", len(h)) + h + b"\0\0\0\0")
    r = subprocess.run([tool, "read-model", bad, spec_path, out], capture_output=True, text=True)
    check(r.returncode != 0 and "wte.weight" in r.stderr, f"corrupt file: rc={r.returncode} stderr={r.stderr!r}")
    print("ok: corrupt file rejected: " + r.stderr.strip())


def check_tokenize(binary, d):
    text = bytes(range(256)) * 40 + "héllo wörld\n".encode()
    src = os.path.join(d, "in.txt")
    open(src, "wb").write(text)
    train, val = os.path.join(d, "train.bin"), os.path.join(d, "val.bin")
    subprocess.run([binary, src, train, "--val-fraction", "0.25", "--val-output", val], check=True)
    toks = []
    for p in (train, val):
        raw = np.fromfile(p, dtype="<i4", count=256)
        check(raw[0] == 20240520 and raw[1] == 1, f"{p}: header {raw[:3]}")
        check(not raw[3:].any(), f"{p}: header tail not zero")
        t = np.fromfile(p, dtype="<u2", offset=1024)
        check(t.size == raw[2], f"{p}: {t.size} tokens, header says {raw[2]}")
        toks.append(t)
    n_val = int(len(text) * 0.25)
    check(toks[1].size == n_val, f"val has {toks[1].size} tokens, expected {n_val}")
    check(np.array_equal(np.concatenate(toks), np.frombuffer(text, dtype=np.uint8)), "tokens are not the text bytes")
    print(f"ok: l2l-tokenize wrote {toks[0].size} + {toks[1].size} byte tokens in llm.c layout")

    empty = os.path.join(d, "empty.txt")
    open(empty, "wb").close()
    for args, needle in [([os.path.join(d, "missing.txt"), train], "missing.txt"),
                         ([empty, train], "empty"),
                         ([src, train, "--val-fraction", "1.5", "--val-output", val], "val-fraction"),
                         ([src, train, "--val-fraction", "0.1"], "--val-output"),
                         ([src], "")]:
        r = subprocess.run([binary] + args, capture_output=True, text=True)
        check(r.returncode != 0, f"l2l-tokenize {args} exited 0")
        check(needle in r.stderr, f"l2l-tokenize {args}: stderr {r.stderr!r} lacks {needle!r}")
    print("ok: l2l-tokenize rejects bad input with non-zero exit")


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("safetensors", "tokenize"):
        fail(__doc__)
    with tempfile.TemporaryDirectory(prefix="l2l_formats_") as d:
        if sys.argv[1] == "safetensors":
            check_written(sys.argv[2], d)
            check_read(sys.argv[2], d)
        else:
            check_tokenize(sys.argv[2], d)


if __name__ == "__main__":
    main()
