// Block quantization of a frozen base model (LoRA / QLoRA training keeps the base weights
// quantized and dequantizes them per layer or per GEMM tile): quantize and dequantize on
// the CPU; kernels/backend.h's Backend::DequantizeBlocks does the dequantization on a
// device (the CPU backend calls Dequantize below; the CUDA backend has its own kernel,
// bit-equal to it).
//
// Formats (n elements are n / block_elems blocks, stored one after the other):
//  * NF4 (QLoRA, Dettmers et al. 2023, as bitsandbytes implements it): blocks of 64
//    elements, each { fp32 absmax (little-endian), u8 qs[32] }, 36 bytes = 0.5625 B/param.
//    absmax = max |x| over the block; element j's 4-bit code is the index of the nearest
//    value of kNf4Code to x * (1 / absmax) (bitsandbytes' dQuantizeNF4 decision tree:
//    thresholds at the midpoints of neighbouring codes, a value equal to a midpoint takes
//    the lower code); elements 2i and 2i+1 share qs[i], 2i in the HIGH nibble (as
//    bitsandbytes packs them). x = kNf4Code[code] * absmax. Differences from
//    bitsandbytes: its absmax array and packed codes are two tensors (here they are
//    interleaved per block, so any run of whole blocks -- a GEMM tile of rows whose length
//    is a multiple of 64 -- is self-contained); a block of zeros stores code 7 (0.0)
//    where bitsandbytes computes 0 * inf = NaN and stores code 0 (-1.0 * 0 = -0.0): both
//    dequantize to zero. No double quantization (QLoRA's 8-bit absmax, 0.127 bits/param
//    less): the absmax stays fp32.
//  * Q4_0 (ggml): blocks of 32 { fp16 d, u8 qs[16] }, 18 bytes = 0.5625 B/param;
//    x = d * (nibble - 8), element j < 16 in the low nibble of qs[j], j >= 16 in the high
//    nibble of qs[j - 16]. Quantized as gguf-py 0.10's gguf.quants.Q4_0 (ggml's
//    quantize_row_q4_0_ref with its fused multiply-add): d = m / -8 with m the element of
//    largest magnitude (the first one on ties), q = min(15, trunc(fp32(x * (1/d) + 8.5)))
//    with the product and sum in double.
//  * Q8_0 (ggml): blocks of 32 { fp16 d, i8 q[32] }, 34 bytes = 1.0625 B/param; the codec
//    is common/formats/gguf.h's QuantizeQ8_0 / DequantizeQ8_0 (ggml's reference).
// Q4_0 and Q8_0 dequantize through common/formats/gguf.h's dequantizers (one
// implementation of each GGUF block type).
//
// Which format a base_dtype means (QuantFormatForBaseDtype): "q4" -> NF4, "q8" -> Q8_0.
// NF4 because a QLoRA adapter is trained against the quantized base: with NF4 computed as
// bitsandbytes computes it (blocksize 64, no double quantization; tested against a
// reference written from its definition, bitsandbytes itself does not run here), the base a PEFT user runs the
// exported adapter on (transformers + bitsandbytes, bnb_4bit_quant_type="nf4") holds the
// same values the adapter was trained against. It is NOT the lower-error code at this
// size: on N(0, 1) weights the relative RMS error is 0.092 for NF4, 0.086 for Q4_0
// (blocks of 32), 0.0053 for Q8_0 (tests/formats/quant_blocks_test.cc). A GGUF base that
// is already Q4_0 can keep its blocks (kQ4_0) instead of being re-quantized.
// docs/architecture.md ("Quantized base weights") has the table.
//
// Errors: sizes that are not whole blocks and non-finite inputs are InvalidArgument
// naming the format, the count and the element.
// Thread-safety: free functions on caller-owned memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/status.h"

namespace l2l {

enum class QuantFormat { kNf4, kQ4_0, kQ8_0 };
const char* ToString(QuantFormat f);                       // "nf4" | "q4_0" | "q8_0"
Result<QuantFormat> ParseQuantFormat(std::string_view s);  // inverse of ToString
// A LoRA job's base_dtype: "q4" -> kNf4, "q8" -> kQ8_0; anything else is InvalidArgument
// (fp32 / bf16 bases are not block formats).
Result<QuantFormat> QuantFormatForBaseDtype(std::string_view base_dtype);

struct QuantFormatInfo {
  int64_t block_elems;  // elements per block
  int64_t block_bytes;  // bytes per block
};
QuantFormatInfo Info(QuantFormat f);

// The 16 NF4 values (bitsandbytes' NF4 code table, fp32), ascending; code 7 is 0.
inline constexpr float kNf4Code[16] = {
    -1.0f,
    -0.6961928009986877f,
    -0.5250730514526367f,
    -0.39491748809814453f,
    -0.28444138169288635f,
    -0.18477343022823334f,
    -0.09105003625154495f,
    0.0f,
    0.07958029955625534f,
    0.16093020141124725f,
    0.24611230194568634f,
    0.33791524171829224f,
    0.44070982933044434f,
    0.5626170039176941f,
    0.7229568362236023f,
    1.0f,
};
inline constexpr int64_t kNf4BlockElems = 64;
inline constexpr int64_t kNf4BlockBytes = 4 + 32;

// Bytes that n elements take; InvalidArgument when n < 0 or not a whole number of blocks.
Result<size_t> QuantizedBytes(QuantFormat f, int64_t n);

// x (n fp32, finite) -> QuantizedBytes(f, n) bytes at out.
Status Quantize(QuantFormat f, const float* x, int64_t n, uint8_t* out);
// blocks (QuantizedBytes(f, n) bytes) -> out (n fp32).
Status Dequantize(QuantFormat f, const uint8_t* blocks, int64_t n, float* out);

// The per-format codecs. REQUIRES: n a multiple of the block size, finite x (Quantize
// checks both).
uint8_t Nf4Code(float normalized);  // bitsandbytes' dQuantizeNF4
void QuantizeNf4(const float* x, uint8_t* blocks, size_t n);
void DequantizeNf4(const uint8_t* blocks, float* out, size_t n);
void QuantizeQ4_0(const float* x, uint8_t* blocks, size_t n);

}  // namespace l2l
