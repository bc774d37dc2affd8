// ggml block formats beyond Q8_0 / Q4_0 / Q4_1 (those are in gguf.h): the legacy 5-bit
// types Q5_0 / Q5_1 and the K-quants Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K.
//
// Dequantizers compute what llama.cpp's reference dequantize_row_* (ggml-quants.c) and the
// Python gguf package's gguf.quants compute, bit for bit: fp16 scales widened to fp32,
// then each product and difference rounded to fp32 separately in ggml's order:
//   Q2_K  y = (d * (sc & 15)) * q - (dmin * (sc >> 4))
//   Q3_K  y = (d * (sc6 - 32)) * (q2 - (hbit ? 0 : 4))
//   Q4_K  y = (d * sc6) * q4 - (dmin * m6)           Q5_K as Q4_K with q5
//   Q6_K  y = (d * (int8)sc) * (q6 - 32)             Q8_K y = d(fp32) * q8 (bsums unused)
//   Q5_0  y = (q5 - 16) * d                          Q5_1 y = q5 * d + m
// Every product before the last rounding step is exact in fp32 (an fp16 scale has 11
// significant bits, the 6-8-bit sub-scales and the levels fit in the rest), so only the
// final product or difference rounds and the grouping above cannot change a result; even
// so gguf_quants.cc is compiled with -ffp-contract=off (common/formats/CMakeLists.txt), so
// no compiler fuses a product and a sum into one FMA.
//
// Quantizers (for export): Q5_0 as ggml's quantize_row_q5_0_ref (the bytes gguf.quants
// produces); Q4_K and Q6_K by llama.cpp's reference search, written from its description
// (per 32-element sub-block of Q4_K a weighted least-squares scale/min search over 21
// candidate scales, weights |x| + rms of the sub-block, "make_qkx2_quants"; per 16-element
// sub-block of Q6_K an rms-weighted search over 19 candidate scales, "make_qx_quants";
// then 6-bit / 8-bit scales relative to the block's fp16 super-scale). Not asserted
// bit-equal to llama-quantize's output; what a file holds is always what it decodes to.
//
// Layouts (bytes; fp16 little-endian):
//   Q5_0  22: d, qh[4] (bit j = high bit of element j), qs[16] (low nibbles: j and j+16)
//   Q5_1  24: d, m, qh[4], qs[16]
//   Q2_K  84: scales[16] (lo 4 bits scale, hi 4 bits min), qs[64], d, dmin
//   Q3_K 110: hmask[32], qs[64], scales[12] (16 x 6 bits), d
//   Q4_K 144: d, dmin, scales[12] (8 x 6-bit scale + 8 x 6-bit min), qs[128]
//   Q5_K 176: d, dmin, scales[12], qh[32], qs[128]
//   Q6_K 210: ql[128], qh[64], scales[16] (int8), d
//   Q8_K 292: d (fp32), qs[256] (int8), bsums[16] (int16)
// n (elements) is a multiple of the type's block size (32 for Q5_*, 256 for K-quants).
#pragma once

#include <cstddef>
#include <cstdint>

namespace l2l::formats {

inline constexpr size_t kQK_K = 256;  // elements per K-quant super-block

void DequantizeQ5_0(const uint8_t* blocks, float* out, size_t n);
void DequantizeQ5_1(const uint8_t* blocks, float* out, size_t n);
void DequantizeQ2_K(const uint8_t* blocks, float* out, size_t n);
void DequantizeQ3_K(const uint8_t* blocks, float* out, size_t n);
void DequantizeQ4_K(const uint8_t* blocks, float* out, size_t n);
void DequantizeQ5_K(const uint8_t* blocks, float* out, size_t n);
void DequantizeQ6_K(const uint8_t* blocks, float* out, size_t n);
void DequantizeQ8_K(const uint8_t* blocks, float* out, size_t n);

void QuantizeQ5_0(const float* x, uint8_t* blocks, size_t n);
void QuantizeQ4_K(const float* x, uint8_t* blocks, size_t n);
void QuantizeQ6_K(const float* x, uint8_t* blocks, size_t n);

}  // namespace l2l::formats
