"""Reference block quantizers for tests/formats/quant_blocks_test.cc.

  quant_oracle.py FORMAT IN.f32 OUT.bin OUT_DEQ.f32

FORMAT nf4: QLoRA's NormalFloat4 written from its definition, independently of l2l's
tables: the 16 values are bitsandbytes' create_normal_map(offset=0.9677083) (normal
quantiles, scipy.stats.norm.ppf, normalised to [-1, 1]); blocks of 64 with absmax =
max |x| (fp32); each element's code is the nearest value to x * (1 / absmax) with ties to
the lower code (bitsandbytes' dQuantizeNF4 compares x > midpoint of neighbouring values);
two codes per byte, the first in the high nibble (bitsandbytes' packing). A block is
stored as fp32 absmax + 32 bytes (l2l's interleaved layout; bitsandbytes keeps the two in
separate tensors); an all-zero block stores code 7 (0.0). Dequantized: value * absmax.
FORMAT q4_0 | q8_0: the gguf package's gguf.quants.quantize / dequantize (gguf-py, the
llama.cpp project's own Python implementation).
OUT.bin: the blocks; OUT_DEQ.f32: the blocks dequantized by the same reference.
"""
import sys

import numpy as np


def nf4_table():
    from scipy.stats import norm
    import torch  # bitsandbytes builds the table with torch.linspace (fp32) and torch.Tensor
    offset = 0.9677083
    v1 = norm.ppf(torch.linspace(offset, 0.5, 9)[:-1].numpy()).tolist()
    v3 = (-norm.ppf(torch.linspace(offset, 0.5, 8)[:-1].numpy())).tolist()
    v = np.sort(np.array(v1 + [0.0] + v3, dtype=np.float32))
    return (v / v.max()).astype(np.float32)


def nf4(x):
    code = nf4_table()
    assert code.shape == (16,)
    mid = ((code[:-1].astype(np.float64) + code[1:].astype(np.float64)) / 2).astype(np.float32)
    blocks = x.reshape(-1, 64)
    absmax = np.abs(blocks).max(axis=1).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = (np.float32(1) / absmax).astype(np.float32)
        normed = (blocks * inv[:, None]).astype(np.float32)
    q = (normed[:, :, None] > mid[None, None, :]).sum(axis=2).astype(np.uint8)
    q[absmax == 0] = 7
    packed = (q[:, 0::2] << 4) | q[:, 1::2]
    out = np.concatenate([absmax.astype("<f4").view(np.uint8).reshape(-1, 4), packed], axis=1)
    deq = (code[q] * absmax[:, None]).astype(np.float32)
    return out.tobytes(), deq.reshape(-1)


def ggml(x, name):
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize
    t = getattr(GGMLQuantizationType, name)
    q = quantize(x.reshape(-1, 32), t)
    deq = dequantize(q, t).astype(np.float32)
    return q.tobytes(), deq.reshape(-1)


def main():
    fmt, src, out_path, deq_path = sys.argv[1:5]
    x = np.fromfile(src, dtype="<f4")
    if fmt == "nf4":
        data, deq = nf4(x)
    elif fmt in ("q4_0", "q8_0"):
        data, deq = ggml(x, fmt.upper())
    else:
        sys.exit("unknown format " + fmt)
    with open(out_path, "wb") as f:
        f.write(data)
    deq.astype("<f4").tofile(deq_path)


if __name__ == "__main__":
    main()
