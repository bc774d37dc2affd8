"""Independent side of the GGUF tests (tests/formats/gguf_test.cc): the `gguf` package
(GGUFWriter, GGUFReader, gguf.quants) that llama.cpp's own converter uses, plus a
hand-made GGUF builder written here from the format description for malformed files.
Run with the oracle venv's python (scripts/oracle_venv.sh).

  gguf_oracle.py fixtures OUTDIR       GGUF files + expected fp32 values + manifest.json
                                       (kquant.gguf: random Q5_0/Q5_1/Q2_K..Q6_K/Q8_K blocks)
  gguf_oracle.py check_written SPEC    a file l2l wrote, read back with GGUFReader (quantized
                                       bytes equal gguf's quantizer's; Q4_K/Q6_K, which gguf
                                       cannot quantize: gguf's decoding equals l2l's and the
                                       error is within the spec's bound)
  gguf_oracle.py real_config GGUF      metadata of a real file as gguf reads it (JSON)
  gguf_oracle.py real_tensor_list GGUF names, ne and types of a file's tensors (JSON)
  gguf_oracle.py real_tensors GGUF     compares tensors l2l streams on stdin with
                                       gguf.quants.dequantize, bit for bit
  gguf_oracle.py real_hf_config DIR    config (transformers AutoConfig) + tensor shapes
  gguf_oracle.py real_hf_tensors DIR   as real_tensors, against safetensors.numpy
Exits non-zero with a message on the first failure.
"""
import json
import os
import struct
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


# ---- fixtures ------------------------------------------------------------------------

def llama_permute(w, n_head):
    """As convert_hf_to_gguf.py's LlamaModel.permute (rows interleaved per head)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def write_fixture(path, out_dir, tensors, alignment=None, extra_kv=True):
    """tensors: list of (name, fp32 array, qtype). Writes the GGUF with GGUFWriter and,
    per tensor, <out_dir>/<name>.f32 = gguf.quants.dequantize of the stored bytes."""
    w = gguf.GGUFWriter(path, "llama")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    if extra_kv:
        w.add_uint8("t.u8", 200)
        w.add_int8("t.i8", -100)
        w.add_uint16("t.u16", 60000)
        w.add_int16("t.i16", -30000)
        w.add_uint32("t.u32", 4000000000)
        w.add_int32("t.i32", -2000000000)
        w.add_float32("t.f32", 0.1)
        w.add_bool("t.bool", True)
        w.add_string("t.str", "h\u00e9llo w\u00f6rld")
        w.add_uint64("t.u64", 2**40 + 3)
        w.add_int64("t.i64", -(2**40) - 5)
        w.add_float64("t.f64", 3.141592653589793)
        w.add_array("t.arr_str", ["a", "", "\u0120the", "<|im_start|>"])
        w.add_array("t.arr_int", [1, -2, 3])
        w.add_array("t.arr_f32", [0.5, -1.25])
        w.add_array("t.arr_bool", [True, False, True])
        w.add_array("t.arr_nested", [[1, 2], [3]])
        w.add_block_count(2)
    expected = {}
    for name, x, qt in tensors:
        if qt == QT.F32:
            data = x.astype(np.float32)
            w.add_tensor(name, data)
        elif qt == QT.F16:
            data = x.astype(np.float16)
            w.add_tensor(name, data)
        else:
            data = gguf.quants.quantize(x.astype(np.float32), qt)
            w.add_tensor(name, data, raw_dtype=qt)
        deq = gguf.quants.dequantize(data.view(np.uint8) if qt not in (QT.F32, QT.F16) else data, qt)
        deq = np.asarray(deq, dtype=np.float32).reshape(x.shape)
        deq.tofile(os.path.join(out_dir, name + ".f32"))
        expected[name] = {"shape": list(x.shape), "type": int(qt)}
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expected


def hand_gguf(kvs, tensors, alignment=32, magic=b"GGUF", version=3, data=None):
    """A GGUF built with struct from the format description. kvs: (key, type, payload
    bytes); tensors: (name, ne list, type id, offset). data: bytes of the data section
    (zeros sized from the tensors when None)."""
    out = bytearray(magic + struct.pack("<IQQ", version, len(tensors), len(kvs)))
    s = lambda b: struct.pack("<Q", len(b)) + b
    for key, t, payload in kvs:
        out += s(key.encode()) + struct.pack("<I", t) + payload
    for name, ne, t, off in tensors:
        out += s(name.encode()) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        out += struct.pack("<IQ", t, off)
    out += b"\0" * ((alignment - len(out) % alignment) % alignment)
    if data is None:
        data = b"\0" * (4 * 32 * 4)
    return bytes(out + data)


def fixtures(out_dir):
    rng = np.random.default_rng(1234)
    os.makedirs(out_dir, exist_ok=True)
    r = lambda *shape: (rng.standard_normal(shape) * 0.7).astype(np.float32)
    tensors = [
        ("f32.w", r(3, 64), QT.F32),
        ("f16.w", r(5, 32), QT.F16),
        ("bf16.w", r(4, 32), QT.BF16),
        ("q8_0.w", r(8, 64), QT.Q8_0),
        ("q4_0.w", r(6, 96), QT.Q4_0),
        ("q4_1.w", r(7, 32), QT.Q4_1),
        ("q8_0.3d", r(2, 3, 64), QT.Q8_0),
        ("bias.1d", r(40), QT.F32),
    ]
    # Blocks with all-equal, zero and extreme values: the quantizers' edge cases.
    edge = r(4, 64)
    edge[0, :32] = 0.0
    edge[1, :32] = 1.5
    edge[2, :32] = np.linspace(-1000, 1000, 32)
    edge[3, :32] = 1e-6
    tensors += [("q8_0.edge", edge, QT.Q8_0), ("q4_0.edge", edge, QT.Q4_0), ("q4_1.edge", edge, QT.Q4_1)]
    manifest = {"mixed": write_fixture(os.path.join(out_dir, "mixed.gguf"), out_dir, tensors)}
    a64 = [("a64.f32", r(3, 32), QT.F32), ("a64.q8", r(2, 32), QT.Q8_0), ("a64.q41", r(1, 32), QT.Q4_1)]
    manifest["align64"] = write_fixture(os.path.join(out_dir, "align64.gguf"), out_dir, a64, alignment=64,
                                        extra_kv=False)

    # Llama q/k as llama.cpp's converter stores them: HF rows permuted per head. Expected
    # files hold the HF (unpermuted) rows.
    n_head, n_kv, hd, hid = 4, 2, 8, 32
    q, k = r(n_head * hd, hid), r(n_kv * hd, hid)
    qb = r(n_head * hd)
    w = gguf.GGUFWriter(os.path.join(out_dir, "perm.gguf"), "llama")
    w.add_tensor("blk.0.attn_q.weight", llama_permute(q, n_head))
    w.add_tensor("blk.0.attn_k.weight", llama_permute(k, n_kv))
    w.add_tensor("blk.0.attn_q.bias", llama_permute(qb, n_head))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    q.tofile(os.path.join(out_dir, "hf.q.f32"))
    k.tofile(os.path.join(out_dir, "hf.k.f32"))
    qb.tofile(os.path.join(out_dir, "hf.qb.f32"))
    manifest["perm"] = {"n_head": n_head, "n_kv": n_kv, "head_dim": hd, "hidden": hid}
    manifest["kquant"] = kquant_fixtures(out_dir)

    # Malformed files, each built by hand around one defect.
    u32 = lambda v: struct.pack("<I", v)
    arch = ("general.architecture", 8, struct.pack("<Q", 5) + b"llama")
    good_t = [("w.ok", [32, 4], 0, 0)]
    bad = {
        "bad_magic": hand_gguf([arch], good_t, magic=b"GGML"),
        "version2": hand_gguf([arch], good_t, version=2),
        "unknown_type": hand_gguf([arch], [("w.unknown", [32, 4], 99, 0)]),
        "offset_out": hand_gguf([arch], [("w.far", [32, 4], 0, 4096)]),
        "misaligned": hand_gguf([arch], [("w.mis", [32, 2], 0, 8)]),
        "bad_row": hand_gguf([arch], [("w.row33", [33, 2], 8, 0)]),
        "dup_tensor": hand_gguf([arch], [("w.dup", [32], 0, 0), ("w.dup", [32], 0, 128)]),
        "bad_kv_type": hand_gguf([("k.bad", 13, u32(1))], good_t),
        "huge_string": hand_gguf([("k.str", 8, struct.pack("<Q", 1 << 40))], good_t),
        "bad_alignment": hand_gguf([("general.alignment", 4, u32(24))], good_t),
        "bad_row_k": hand_gguf([arch], [("w.row96", [96, 2], 12, 0)]),
    }
    # Well-formed files with tensors of types l2l does not dequantize (IQ2_XXS: 66-byte
    # blocks of 256; I32): they open, and reading them fails naming the type and tensor.
    with open(os.path.join(out_dir, "unreadable.gguf"), "wb") as f:
        f.write(hand_gguf([arch], [("w.iq2", [256, 2], 16, 0), ("w.i32", [8], 26, 160)]))
    good = hand_gguf([arch], good_t)
    bad["truncated_data"] = good[:-10]
    bad["truncated_header"] = good[:40]
    for name, b in bad.items():
        with open(os.path.join(out_dir, name + ".gguf"), "wb") as f:
            f.write(b)
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f)


# ---- K-quants and Q5_0 / Q5_1: random blocks ------------------------------------------

# Byte offsets of each type's fp16 scale fields (d, dmin / m) in a block (ggml-common.h).
HALF_FIELDS = {QT.Q5_0: [0], QT.Q5_1: [0, 2], QT.Q2_K: [80, 82], QT.Q3_K: [108], QT.Q4_K: [0, 2],
               QT.Q5_K: [0, 2], QT.Q6_K: [208]}


def q8_k_reference(raw):
    """llama.cpp's dequantize_row_q8_K, written from its definition (gguf 0.10.0 has no
    Q8_K): block = fp32 d, int8 qs[256], int16 bsums[16] (unused); y = d * qs."""
    b = np.ascontiguousarray(raw).view(np.uint8).reshape(-1, 292)
    d = b[:, :4].copy().view(np.float32)
    qs = b[:, 4:260].copy().view(np.int8).astype(np.float32)
    return (d * qs).reshape(-1)


def random_blocks(rng, qt, n_blocks):
    """Random bytes in every field, the scales replaced by chosen fp16 (fp32 for Q8_K)
    values: ordinary, negative, subnormal, zero, -0, the largest finite; never inf/NaN.
    The first two blocks are all zero and all-zero-but-scales."""
    bs, ts = gguf.GGML_QUANT_SIZES[qt]
    b = rng.integers(0, 256, size=(n_blocks, ts), dtype=np.uint8)
    if qt == QT.Q8_K:
        d = (rng.standard_normal(n_blocks) * 0.01).astype(np.float32)
        k = max(0, min(4, n_blocks - 2))
        d[2:2 + k] = np.array([1e-40, -3e-42, -0.0, 3.0e30], np.float32)[:k]  # fp32 subnormals, -0, large
        b[:, :4] = d.view(np.uint8).reshape(n_blocks, 4)
    else:
        special = np.array([0x0001, 0x03ff, 0x8001, 0x8200, 0x0000, 0x8000, 0x7bff, 0xfbff, 0x0400, 0x3c00],
                           np.uint16)
        for off in HALF_FIELDS[qt]:
            h = (rng.standard_normal(n_blocks) * 0.02).astype(np.float16).view(np.uint16)
            k = min(len(special), n_blocks - 2)
            h[2:2 + k] = rng.permutation(special)[:k]
            b[:, off:off + 2] = h.view(np.uint8).reshape(n_blocks, 2)
    b[0, :] = 0
    b[1, :] = 0
    if qt != QT.Q8_K:
        for off in HALF_FIELDS[qt]:
            b[1, off:off + 2] = np.array([0x3c00], np.uint16).view(np.uint8)  # d = 1, levels all 0
    return b


def kquant_fixtures(out_dir):
    """kquant.gguf: one tensor per type of random blocks (raw bytes through GGUFWriter),
    <name>.f32 = gguf.quants.dequantize (Q8_K: q8_k_reference). Returns the manifest part."""
    rng = np.random.default_rng(4321)
    w = gguf.GGUFWriter(os.path.join(out_dir, "kquant.gguf"), "llama")
    expected = {}
    types = [QT.Q5_0, QT.Q5_1, QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.Q8_K]
    for qt in types:
        bs, ts = gguf.GGML_QUANT_SIZES[qt]
        rows, cols = (6, 4 * bs) if bs == 256 else (10, 8 * bs)
        raw = random_blocks(rng, qt, rows * cols // bs).reshape(rows, cols // bs * ts)
        name = "kq." + qt.name.lower()
        w.add_tensor(name, raw, raw_dtype=qt)
        deq = q8_k_reference(raw) if qt == QT.Q8_K else gguf.quants.dequantize(raw, qt)
        deq = np.asarray(deq, dtype=np.float32).reshape(rows, cols)
        if not np.all(np.isfinite(deq)):
            fail(f"{name}: the fixture has non-finite values")
        deq.tofile(os.path.join(out_dir, name + ".f32"))
        expected[name] = {"shape": [rows, cols], "type": int(qt)}
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expected


# ---- files l2l wrote -----------------------------------------------------------------

def field_value(reader, key):
    f = reader.get_field(key)
    if f is None:
        fail(f"key {key} missing")
    t = f.types[0]
    if t == gguf.GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode()
    if t == gguf.GGUFValueType.ARRAY:
        if f.types[1] == gguf.GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode() for i in f.data]
        return [f.parts[i][0].item() for i in f.data]
    return f.parts[f.data[0]][0].item()


def check_written(spec_path):
    spec = json.load(open(spec_path))
    r = gguf.GGUFReader(spec["path"])
    for key, want in spec["metadata"].items():
        got = field_value(r, key)
        if isinstance(want, float) or (isinstance(want, list) and want and isinstance(want[0], float)):
            ok = np.allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), rtol=1e-7, atol=0)
        else:
            ok = got == want
        if not ok:
            fail(f"metadata {key}: gguf reads {got!r}, l2l wrote {want!r}")
        t = r.get_field(key).types
        if spec["types"][key] != [int(x) for x in t]:
            fail(f"metadata {key}: types {list(map(int, t))} != {spec['types'][key]}")
    by_name = {t.name: t for t in r.tensors}
    if sorted(by_name) != sorted(x["name"] for x in spec["tensors"]):
        fail(f"tensor names {sorted(by_name)}")
    if r.alignment != spec["alignment"]:
        fail(f"alignment {r.alignment} != {spec['alignment']}")
    for ts in spec["tensors"]:
        t = by_name[ts["name"]]
        src = np.fromfile(ts["source"], dtype=np.float32).reshape(ts["shape"])
        qt = QT(ts["type"])
        if t.tensor_type != qt:
            fail(f"{ts['name']}: type {t.tensor_type.name} != {qt.name}")
        if list(reversed([int(d) for d in t.shape])) != ts["shape"]:
            fail(f"{ts['name']}: gguf shape (ne) {list(t.shape)} vs row-major {ts['shape']}")
        if t.data_offset % r.alignment != 0:
            fail(f"{ts['name']}: data offset {t.data_offset} not aligned")
        if qt == QT.F32:
            got = np.asarray(t.data, np.float32).reshape(src.shape)
            ok = np.array_equal(got.view(np.uint32), src.view(np.uint32))
        elif qt == QT.F16:
            got = np.asarray(t.data).reshape(src.shape)
            ok = np.array_equal(got.view(np.uint16), src.astype(np.float16).view(np.uint16))
        else:
            got = np.asarray(t.data).view(np.uint8)
            if qt in (QT.Q4_K, QT.Q6_K):
                # gguf 0.10.0 has no quantizer for these: what counts is how gguf decodes
                # our bytes (against l2l's reader below and the source's error bound).
                ok = True
            else:
                # Quantized (and BF16): the stored bytes equal gguf's own quantizer's output.
                want = gguf.quants.quantize(src, qt)
                ok = np.array_equal(got.reshape(want.shape), want)
            if ok:
                deq = np.asarray(gguf.quants.dequantize(got, qt), np.float32).reshape(src.shape)
                err = np.abs(deq - src).max()
                if qt == QT.Q8_0 and err > np.abs(src).max() / 127 * 0.51 + 1e-6:
                    fail(f"{ts['name']}: Q8_0 error {err} beyond half a step")
                if "l2l_f32" in ts:  # what l2l's reader decodes from the same bytes
                    ours = np.fromfile(ts["l2l_f32"], dtype=np.float32).reshape(src.shape)
                    if not np.array_equal(ours.view(np.uint32), deq.view(np.uint32)):
                        i = int(np.argmax(ours.reshape(-1).view(np.uint32) != deq.reshape(-1).view(np.uint32)))
                        fail(f"{ts['name']}: element {i}: l2l decodes {ours.reshape(-1)[i]!r}, "
                             f"gguf {deq.reshape(-1)[i]!r}")
                if "max_rel_rms" in ts:
                    rel = float(np.sqrt(np.mean((deq.astype(np.float64) - src) ** 2) / np.mean(src.astype(np.float64) ** 2)))
                    print(f"{ts['name']}: {qt.name} relative RMS error {rel:.5f} (bound {ts['max_rel_rms']})")
                    if rel > ts["max_rel_rms"]:
                        fail(f"{ts['name']}: {qt.name} relative RMS error {rel} above {ts['max_rel_rms']}")
        if not ok:
            fail(f"{ts['name']}: {qt.name} data differs from gguf's")
    print(f"ok: {len(spec['tensors'])} tensors, {len(spec['metadata'])} keys")


# ---- a real file ---------------------------------------------------------------------

def real_config(path):
    r = gguf.GGUFReader(path)
    arch = field_value(r, "general.architecture")
    out = {"architecture": arch, "n_tensors": len(r.tensors)}
    for k in ["block_count", "embedding_length", "attention.head_count", "attention.head_count_kv",
              "feed_forward_length", "context_length", "rope.freq_base", "attention.layer_norm_rms_epsilon"]:
        out[k] = field_value(r, f"{arch}.{k}")
    out["vocab"] = len(r.get_field("tokenizer.ggml.tokens").data)
    out["merges"] = len(r.get_field("tokenizer.ggml.merges").data)
    out["bos"] = field_value(r, "tokenizer.ggml.bos_token_id")
    out["eos"] = field_value(r, "tokenizer.ggml.eos_token_id")
    out["tokens_head"] = field_value(r, "tokenizer.ggml.tokens")[:50]
    out["tensors"] = [{"name": t.name, "ne": [int(d) for d in t.shape], "type": int(t.tensor_type)} for t in r.tensors]
    print(json.dumps(out))


def real_tensor_list(path):
    r = gguf.GGUFReader(path)
    print(json.dumps([{"name": t.name, "ne": [int(d) for d in t.shape], "type": int(t.tensor_type)} for t in r.tensors]))


def compare_stream(want_fn, names, what):
    """stdin: for each tensor, in any order: its name, '\\n', numel fp32 (l2l's values).
    want_fn(name) gives the oracle's fp32 values; every name must come exactly once."""
    inp = sys.stdin.buffer
    seen = set()
    while True:
        line = inp.readline()
        if not line:
            break
        name = line.decode().rstrip("\n")
        if name not in names:
            fail(f"l2l sent tensor {name!r}, which {what} does not have")
        if name in seen:
            fail(f"l2l sent tensor {name!r} twice")
        seen.add(name)
        want = np.ascontiguousarray(want_fn(name), dtype=np.float32).reshape(-1)
        got = np.frombuffer(inp.read(want.size * 4), dtype=np.float32)
        if got.size != want.size:
            fail(f"{name}: l2l sent {got.size} values, expected {want.size}")
        if not np.array_equal(got.view(np.uint32), want.view(np.uint32)):
            i = int(np.argmax(got.view(np.uint32) != want.view(np.uint32)))
            fail(f"{name}: element {i}: l2l {got[i]!r}, {what} {want[i]!r}")
    if seen != set(names):
        fail(f"l2l did not send {sorted(set(names) - seen)[:5]}")
    print(f"ok: {len(seen)} tensors of {what} equal bit for bit")


def real_tensors(path):
    r = gguf.GGUFReader(path)
    by = {t.name: t for t in r.tensors}
    compare_stream(lambda n: gguf.quants.dequantize(by[n].data, by[n].tensor_type), by, "gguf.quants.dequantize")


def real_hf_config(d):
    os.environ["HF_HUB_OFFLINE"] = "1"
    import transformers
    from safetensors import safe_open
    c = transformers.AutoConfig.from_pretrained(d).to_dict()
    with safe_open(os.path.join(d, "model.safetensors"), "np") as f:
        c["l2l_tensors"] = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
    print(json.dumps(c))


def real_hf_tensors(d):
    from safetensors.numpy import load_file
    sd = {k: v for k, v in load_file(os.path.join(d, "model.safetensors")).items() if v.dtype.kind == "f"}
    compare_stream(lambda n: sd[n].astype(np.float32), sd, "safetensors.numpy")


if __name__ == "__main__":
    cmd = sys.argv[1]
    {"fixtures": fixtures, "check_written": check_written, "real_config": real_config,
     "real_tensor_list": real_tensor_list, "real_tensors": real_tensors, "real_hf_config": real_hf_config, "real_hf_tensors": real_hf_tensors}[cmd](*sys.argv[2:])
