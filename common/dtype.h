// Element types l2l stores tensors in (fp32 masters, bf16/fp16 published copies and
// files) and exact conversions between them and fp32.
//
// Conversions follow IEEE 754: fp32 -> bf16/fp16 rounds to nearest, ties to even;
// values beyond the target's range become +-Inf (fp16 also produces subnormals and
// flushes below half its smallest subnormal to +-0); Inf stays Inf; a NaN stays a NaN of
// the same sign, quieted (the quiet bit is set; the top payload bits are kept). Widening
// to fp32 is exact. The scalar functions are inline so CPU loops in other components can
// use them; the bulk converters live in dtype.cc.
//
// Thread-safety: pure functions.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace l2l {

static_assert(std::endian::native == std::endian::little, "l2l assumes a little-endian host");

enum class DType { kF32, kBF16, kF16 };

const char* DTypeName(DType d);                  // "f32" | "bf16" | "f16"
Result<DType> ParseDType(const std::string& s);  // inverse of DTypeName
size_t DTypeSize(DType d);                       // bytes per element

// ---- bf16: 1 sign, 8 exponent, 7 mantissa bits (the top half of an fp32) ------------

inline float Bf16ToFloat(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

inline uint16_t FloatToBf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);  // NaN
  // Round to nearest even: add 0x7fff plus the lowest kept bit; a carry into the exponent
  // is the correct rounding (up to Inf at the top of the range).
  const uint32_t rounded = x + 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}

// ---- fp16 (IEEE binary16): 1 sign, 5 exponent, 10 mantissa bits ----------------------

inline float Fp16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) {  // Inf or NaN (NaN quieted)
    return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13) | (mant ? 0x00400000u : 0u));
  }
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in fp32
    const float mag = static_cast<float>(mant) * 0x1.0p-24f;
    return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(mag));
  }
  return std::bit_cast<float>(sign | ((exp + (127 - 15)) << 23) | (mant << 13));
}

inline uint16_t FloatToFp16(float f) {
  const uint32_t x_signed = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x_signed >> 16) & 0x8000u);
  const uint32_t x = x_signed & 0x7fffffffu;
  if (x > 0x7f800000u) {  // NaN: quiet, keep the top payload bits
    return static_cast<uint16_t>(sign | 0x7e00u | ((x >> 13) & 0x3ffu));
  }
  // >= 65520 (half-way between 65504, the largest fp16, and 2^16) rounds to Inf.
  if (x >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (x >= 0x38800000u) {  // normal fp16 (>= 2^-14): rebias, round 13 bits to even
    uint32_t r = x - ((127u - 15u) << 23);
    r += 0xfffu + ((r >> 13) & 1u);
    return static_cast<uint16_t>(sign | (r >> 13));
  }
  if (x <= 0x33000000u) return sign;  // <= 2^-25: ties to the even neighbour, zero
  // Subnormal: the result is round(value / 2^-24) = round(m * 2^(e-126)), shift >= 14.
  const uint32_t e = x >> 23;
  const uint32_t m = (x & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - e;
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) ++q;  // q == 0x400 is the smallest normal
  return static_cast<uint16_t>(sign | q);
}

// ---- bulk converters: n elements; in and out must not overlap ----------------------

void FloatToBf16(const float* in, uint16_t* out, size_t n);
void Bf16ToFloat(const uint16_t* in, float* out, size_t n);
void FloatToFp16(const float* in, uint16_t* out, size_t n);
void Fp16ToFloat(const uint16_t* in, float* out, size_t n);

// Converts n fp32 values to `to`'s encoding (out holds n * DTypeSize(to) bytes).
void ConvertFromFloat(const float* in, DType to, void* out, size_t n);
// Converts n values in `from`'s encoding to fp32. `in` need not be aligned.
void ConvertToFloat(const void* in, DType from, float* out, size_t n);

}  // namespace l2l
