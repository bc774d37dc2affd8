// Emulated cuda_bf16.h (cuda_emu): the bfloat16 storage type and the conversions
// kernels/cuda uses. Stands alone (no other emulator header). Conversions follow the
// real header: float -> bf16 rounds to nearest, ties to even (a NaN stays a quiet NaN
// with its sign; +-inf stay exact; values past the largest finite bf16 round to inf);
// bf16 -> float is exact. Pure functions on values: thread-safe.
#pragma once

#include <cstdint>
#include <cstring>

struct __nv_bfloat16_raw {
  unsigned short x;
};

struct __nv_bfloat16 {
  unsigned short __x;

  __nv_bfloat16() = default;
  constexpr __nv_bfloat16(const __nv_bfloat16_raw& r) : __x(r.x) {}  // NOLINT: as CUDA's
  constexpr operator __nv_bfloat16_raw() const { return __nv_bfloat16_raw{__x}; }
};
static_assert(sizeof(__nv_bfloat16) == 2, "__nv_bfloat16 must be 2 bytes");

typedef __nv_bfloat16 nv_bfloat16;

inline __nv_bfloat16 __float2bfloat16_rn(const float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  __nv_bfloat16_raw r;
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    r.x = static_cast<unsigned short>((u >> 16) | 0x0040u);  // NaN: keep sign, make quiet
  } else {
    // Round to nearest even on the 16 dropped bits; a carry into the exponent is right
    // (the largest values round up to inf, inf itself has no low bits).
    u += 0x7fffu + ((u >> 16) & 1u);
    r.x = static_cast<unsigned short>(u >> 16);
  }
  return __nv_bfloat16(r);
}

inline __nv_bfloat16 __float2bfloat16(const float f) { return __float2bfloat16_rn(f); }

inline float __bfloat162float(const __nv_bfloat16 h) {
  const uint32_t u = static_cast<uint32_t>(h.__x) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
