// Q5_0 / Q5_1 and K-quant block (de)quantization. See common/formats/gguf_quants.h.
//
// Built with -ffp-contract=off (common/formats/CMakeLists.txt): every product and sum
// below rounds to fp32 on its own, as ggml's reference and numpy do.
#include "common/formats/gguf_quants.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/dtype.h"

namespace l2l::formats {
namespace {

constexpr size_t kQ5_0Bytes = 2 + 4 + 16;
constexpr size_t kQ5_1Bytes = 2 + 2 + 4 + 16;
constexpr size_t kQ2_KBytes = 16 + 64 + 2 + 2;
constexpr size_t kQ3_KBytes = 32 + 64 + 12 + 2;
constexpr size_t kQ4_KBytes = 2 + 2 + 12 + 128;
constexpr size_t kQ5_KBytes = 2 + 2 + 12 + 32 + 128;
constexpr size_t kQ6_KBytes = 128 + 64 + 16 + 2;
constexpr size_t kQ8_KBytes = 4 + 256 + 2 * 16;
static_assert(kQ5_0Bytes == 22 && kQ5_1Bytes == 24 && kQ2_KBytes == 84 && kQ3_KBytes == 110 &&
              kQ4_KBytes == 144 && kQ5_KBytes == 176 && kQ6_KBytes == 210 && kQ8_KBytes == 292);

inline float HalfAt(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return Fp16ToFloat(h);
}

inline void PutHalf(uint8_t* p, float v) {
  const uint16_t h = FloatToFp16(v);
  std::memcpy(p, &h, 2);
}

// Round half to even, as ggml's nearest_int (default rounding mode).
inline int NearestInt(float v) { return static_cast<int>(std::lrintf(v)); }

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K block (ggml's
// get_scale_min_k4).
inline void ScaleMinK4(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

}  // namespace

// ---- Dequantization -------------------------------------------------------------------

void DequantizeQ5_0(const uint8_t* blocks, float* out, size_t n) {
  for (size_t b = 0; b < n / 32; ++b) {
    const uint8_t* blk = blocks + b * kQ5_0Bytes;
    const float d = HalfAt(blk);
    uint32_t qh;
    std::memcpy(&qh, blk + 2, 4);
    const uint8_t* qs = blk + 6;
    float* y = out + b * 32;
    for (int j = 0; j < 16; ++j) {
      const int h0 = static_cast<int>(((qh >> j) << 4) & 0x10);
      const int h1 = static_cast<int>((qh >> (j + 12)) & 0x10);
      const int x0 = ((qs[j] & 0x0F) | h0) - 16;
      const int x1 = ((qs[j] >> 4) | h1) - 16;
      y[j] = static_cast<float>(x0) * d;
      y[j + 16] = static_cast<float>(x1) * d;
    }
  }
}

void DequantizeQ5_1(const uint8_t* blocks, float* out, size_t n) {
  for (size_t b = 0; b < n / 32; ++b) {
    const uint8_t* blk = blocks + b * kQ5_1Bytes;
    const float d = HalfAt(blk);
    const float m = HalfAt(blk + 2);
    uint32_t qh;
    std::memcpy(&qh, blk + 4, 4);
    const uint8_t* qs = blk + 8;
    float* y = out + b * 32;
    for (int j = 0; j < 16; ++j) {
      const int h0 = static_cast<int>(((qh >> j) << 4) & 0x10);
      const int h1 = static_cast<int>((qh >> (j + 12)) & 0x10);
      const float p0 = static_cast<float>((qs[j] & 0x0F) | h0) * d;
      const float p1 = static_cast<float>((qs[j] >> 4) | h1) * d;
      y[j] = p0 + m;
      y[j + 16] = p1 + m;
    }
  }
}

void DequantizeQ2_K(const uint8_t* blocks, float* out, size_t n) {
  for (size_t b = 0; b < n / kQK_K; ++b) {
    const uint8_t* blk = blocks + b * kQ2_KBytes;
    const uint8_t* scales = blk;
    const uint8_t* q = blk + 16;
    const float d = HalfAt(blk + 80);
    const float dmin = HalfAt(blk + 82);
    float* y = out + b * kQK_K;
    int is = 0;
    for (int half = 0; half < 2; ++half, q += 32) {
      for (int shift = 0; shift < 8; shift += 2) {
        for (int part = 0; part < 2; ++part) {
          const uint8_t sc = scales[is++];
          const float dl = d * static_cast<float>(sc & 0xF);
          const float ml = dmin * static_cast<float>(sc >> 4);
          for (int l = 0; l < 16; ++l) {
            const float p = dl * static_cast<float>((q[l + 16 * part] >> shift) & 3);
            *y++ = p - ml;
          }
        }
      }
    }
  }
}

void DequantizeQ3_K(const uint8_t* blocks, float* out, size_t n) {
  for (size_t b = 0; b < n / kQK_K; ++b) {
    const uint8_t* blk = blocks + b * kQ3_KBytes;
    const uint8_t* hm = blk;
    const uint8_t* q = blk + 32;
    const uint8_t* s = blk + 96;
    const float d = HalfAt(blk + 108);
    int scales[16];
    for (int j = 0; j < 16; ++j) {
      const int lo = j < 8 ? (s[j] & 0xF) : (s[j - 8] >> 4);
      const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
      scales[j] = (lo | (hi << 4)) - 32;
    }
    float* y = out + b * kQK_K;
    int is = 0;
    uint8_t m = 1;
    for (int half = 0; half < 2; ++half, q += 32) {
      for (int shift = 0; shift < 8; shift += 2, m = static_cast<uint8_t>(m << 1)) {
        for (int part = 0; part < 2; ++part) {
          const float dl = d * static_cast<float>(scales[is++]);
          for (int l = 0; l < 16; ++l) {
            const int i = l + 16 * part;
            const int v = ((q[i] >> shift) & 3) - ((hm[i] & m) ? 0 : 4);
            *y++ = dl * static_cast<float>(v);
          }
        }
      }
    }
  }
}

void DequantizeQ4_K(const uint8_t* blocks, float* out, size_t n) {
  for (size_t b = 0; b < n / kQK_K; ++b) {
    const uint8_t* blk = blocks + b * kQ4_KBytes;
    const float d = HalfAt(blk);
    const float dmin = HalfAt(blk + 2);
    const uint8_t* scales = blk + 4;
    const uint8_t* q = blk + 16;
    float* y = out + b * kQK_K;
    for (int is = 0; is < 8; is += 2, q += 32) {
      uint8_t sc, m;
      ScaleMinK4(is, scales, &sc, &m);
      const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
      ScaleMinK4(is + 1, scales, &sc, &m);
      const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
      for (int l = 0; l < 32; ++l) {
        const float p = d1 * static_cast<float>(q[l] & 0xF);
        *y++ = p - m1;
      }
      for (int l = 0; l < 32; ++l) {
        const float p = d2 * static_cast<float>(q[l] >> 4);
        *y++ = p - m2;
      }
    }
  }
}

void DequantizeQ5_K(const uint8_t* blocks, float* out, size_t n) {
  for (size_t b = 0; b < n / kQK_K; ++b) {
    const uint8_t* blk = blocks + b * kQ5_KBytes;
    const float d = HalfAt(blk);
    const float dmin = HalfAt(blk + 2);
    const uint8_t* scales = blk + 4;
    const uint8_t* qh = blk + 16;
    const uint8_t* ql = blk + 48;
    float* y = out + b * kQK_K;
    uint8_t u1 = 1, u2 = 2;
    for (int is = 0; is < 8; is += 2, ql += 32, u1 = static_cast<uint8_t>(u1 << 2), u2 = static_cast<uint8_t>(u2 << 2)) {
      uint8_t sc, m;
      ScaleMinK4(is, scales, &sc, &m);
      const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
      ScaleMinK4(is + 1, scales, &sc, &m);
      const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
      for (int l = 0; l < 32; ++l) {
        const float p = d1 * static_cast<float>((ql[l] & 0xF) + ((qh[l] & u1) ? 16 : 0));
        *y++ = p - m1;
      }
      for (int l = 0; l < 32; ++l) {
        const float p = d2 * static_cast<float>((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0));
        *y++ = p - m2;
      }
    }
  }
}

void DequantizeQ6_K(const uint8_t* blocks, float* out, size_t n) {
  for (size_t b = 0; b < n / kQK_K; ++b) {
    const uint8_t* blk = blocks + b * kQ6_KBytes;
    const uint8_t* ql = blk;
    const uint8_t* qh = blk + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192);
    const float d = HalfAt(blk + 208);
    float* y = out + b * kQK_K;
    for (int half = 0; half < 2; ++half, y += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = (d * static_cast<float>(sc[is])) * static_cast<float>(q1);
        y[l + 32] = (d * static_cast<float>(sc[is + 2])) * static_cast<float>(q2);
        y[l + 64] = (d * static_cast<float>(sc[is + 4])) * static_cast<float>(q3);
        y[l + 96] = (d * static_cast<float>(sc[is + 6])) * static_cast<float>(q4);
      }
    }
  }
}

void DequantizeQ8_K(const uint8_t* blocks, float* out, size_t n) {
  for (size_t b = 0; b < n / kQK_K; ++b) {
    const uint8_t* blk = blocks + b * kQ8_KBytes;
    float d;
    std::memcpy(&d, blk, 4);
    const int8_t* q = reinterpret_cast<const int8_t*>(blk + 4);
    for (size_t j = 0; j < kQK_K; ++j) out[b * kQK_K + j] = d * static_cast<float>(q[j]);
  }
}

// ---- Quantization ---------------------------------------------------------------------

// As gguf.quants.Q5_0.quantize_blocks (ggml's quantize_row_q5_0_ref with the sum x/d + 16.5
// formed in double and rounded once to fp32, which is what an FMA gives the C reference).
void QuantizeQ5_0(const float* x, uint8_t* blocks, size_t n) {
  for (size_t b = 0; b < n / 32; ++b) {
    const float* xb = x + b * 32;
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; ++j) {
      if (amax < std::fabs(xb[j])) {
        amax = std::fabs(xb[j]);
        max = xb[j];
      }
    }
    const float d = max / -16.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    uint8_t* blk = blocks + b * kQ5_0Bytes;
    PutHalf(blk, d);
    uint8_t q[32];
    for (int j = 0; j < 32; ++j) {
      const double v = static_cast<double>(xb[j]) * static_cast<double>(id) + 16.5;
      const float t = std::trunc(static_cast<float>(v));
      q[j] = !(t >= 0.0f) ? 0 : t >= 31.0f ? 31 : static_cast<uint8_t>(t);  // NaN -> 0, never UB
    }
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
      blk[6 + j] = static_cast<uint8_t>((q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4));
      qh |= static_cast<uint32_t>(q[j] >> 4) << j;
      qh |= static_cast<uint32_t>(q[j + 16] >> 4) << (j + 16);
    }
    std::memcpy(blk + 2, &qh, 4);
  }
}

namespace {

// Weighted least-squares fit x ~ scale * L + min, L in 0..nmax, min <= 0 (llama.cpp's
// make_qkx2_quants): start from the plain min/max grid, then try nstep + 1 grids of
// (nmax + rmin + rdelta * k) steps over [min, max], solving for the best scale and min of
// each and keeping the smallest weighted squared error. Returns the scale; *neg_min = -min.
float FitScaleMin(int n, int nmax, const float* x, const float* w, uint8_t* L, float* neg_min, float rmin,
                  float rdelta, int nstep) {
  float min = x[0], max = x[0], sum_w = w[0], sum_x = w[0] * x[0];
  for (int i = 1; i < n; ++i) {
    min = std::min(min, x[i]);
    max = std::max(max, x[i]);
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    std::fill(L, L + n, 0);
    *neg_min = -min;
    return 0.0f;
  }
  float iscale = static_cast<float>(nmax) / (max - min);
  float scale = 1.0f / iscale;
  float best = 0;
  for (int i = 0; i < n; ++i) {
    L[i] = static_cast<uint8_t>(std::clamp(NearestInt(iscale * (x[i] - min)), 0, nmax));
    const float diff = scale * L[i] + min - x[i];
    best += w[i] * diff * diff;
  }
  uint8_t aux[32];
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * static_cast<float>(is) + static_cast<float>(nmax)) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(NearestInt(iscale * (x[i] - min)), 0, nmax);
      aux[i] = static_cast<uint8_t>(l);
      sum_l += w[i] * static_cast<float>(l);
      sum_l2 += w[i] * static_cast<float>(l * l);
      sum_xl += w[i] * static_cast<float>(l) * x[i];
    }
    const float det = sum_w * sum_l2 - sum_l * sum_l;
    if (det <= 0) continue;
    float this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
    float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
    if (this_min > 0) {
      this_min = 0;
      this_scale = sum_xl / sum_l2;
    }
    float err = 0;
    for (int i = 0; i < n; ++i) {
      const float diff = this_scale * aux[i] + this_min - x[i];
      err += w[i] * diff * diff;
    }
    if (err < best) {
      std::copy(aux, aux + n, L);
      best = err;
      scale = this_scale;
      min = this_min;
    }
  }
  *neg_min = -min;
  return scale;
}

// Symmetric fit x ~ scale * (L - nmax), L - nmax in -nmax..nmax-1, weights x^2 (llama.cpp's
// make_qx_quants with rmse_type 1): the grid through the element of largest magnitude and
// 18 grids around it (nmax +- 0.1 k steps), keeping the best least-squares scale.
float FitScaleSymmetric(int n, int nmax, const float* x, int8_t* L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  if (amax < 1e-15f) {
    std::fill(L, L + n, 0);
    return 0.0f;
  }
  auto fit = [&](float iscale, float* sumlx, float* suml2) {
    *sumlx = *suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(NearestInt(iscale * x[i]), -nmax, nmax - 1);
      const float w = x[i] * x[i];
      *sumlx += w * x[i] * static_cast<float>(l);
      *suml2 += w * static_cast<float>(l * l);
    }
  };
  auto assign = [&](float iscale) {
    for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(nmax + std::clamp(NearestInt(iscale * x[i]), -nmax, nmax - 1));
  };
  float iscale = -static_cast<float>(nmax) / max;
  float sumlx, suml2;
  fit(iscale, &sumlx, &suml2);
  assign(iscale);
  float scale = suml2 > 0 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(is)) / max;
    fit(iscale, &sumlx, &suml2);
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      assign(iscale);
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

}  // namespace

void QuantizeQ4_K(const float* x, uint8_t* blocks, size_t n) {
  for (size_t b = 0; b < n / kQK_K; ++b) {
    const float* xb = x + b * kQK_K;
    uint8_t* blk = blocks + b * kQ4_KBytes;
    uint8_t L[kQK_K];
    float scales[8], mins[8], w[32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; ++j) {
      float sum_x2 = 0;
      for (int l = 0; l < 32; ++l) sum_x2 += xb[32 * j + l] * xb[32 * j + l];
      const float av_x = std::sqrt(sum_x2 / 32);
      for (int l = 0; l < 32; ++l) w[l] = av_x + std::fabs(xb[32 * j + l]);
      scales[j] = FitScaleMin(32, 15, xb + 32 * j, w, L + 32 * j, &mins[j], -1.0f, 0.1f, 20);
      max_scale = std::max(max_scale, scales[j]);
      max_min = std::max(max_min, mins[j]);
    }
    const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
    const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
    uint8_t* sc = blk + 4;
    std::memset(sc, 0, 12);
    for (int j = 0; j < 8; ++j) {
      const uint8_t ls = static_cast<uint8_t>(std::clamp(NearestInt(inv_scale * scales[j]), 0, 63));
      const uint8_t lm = static_cast<uint8_t>(std::clamp(NearestInt(inv_min * mins[j]), 0, 63));
      if (j < 4) {
        sc[j] = ls;
        sc[j + 4] = lm;
      } else {
        sc[j + 4] = static_cast<uint8_t>((ls & 0xF) | ((lm & 0xF) << 4));
        sc[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
        sc[j] |= static_cast<uint8_t>((lm >> 4) << 6);
      }
    }
    PutHalf(blk, max_scale / 63.0f);
    PutHalf(blk + 2, max_min / 63.0f);
    // Requantize against the stored (fp16 super-scale x 6-bit) scales and mins.
    const float d_all = HalfAt(blk), dmin_all = HalfAt(blk + 2);
    for (int j = 0; j < 8; ++j) {
      uint8_t s, m;
      ScaleMinK4(j, sc, &s, &m);
      const float d = d_all * static_cast<float>(s);
      if (d == 0.0f) continue;  // L keeps the search's levels: they decode to -dm either way
      const float dm = dmin_all * static_cast<float>(m);
      for (int i = 0; i < 32; ++i) {
        L[32 * j + i] = static_cast<uint8_t>(std::clamp(NearestInt((xb[32 * j + i] + dm) / d), 0, 15));
      }
    }
    uint8_t* q = blk + 16;
    for (size_t j = 0; j < kQK_K; j += 64, q += 32) {
      for (int l = 0; l < 32; ++l) q[l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 4));
    }
  }
}

void QuantizeQ6_K(const float* x, uint8_t* blocks, size_t n) {
  for (size_t b = 0; b < n / kQK_K; ++b) {
    const float* xb = x + b * kQK_K;
    uint8_t* blk = blocks + b * kQ6_KBytes;
    int8_t L[kQK_K];
    float scales[16];
    float max_scale = 0, max_abs_scale = 0;
    for (int ib = 0; ib < 16; ++ib) {
      scales[ib] = FitScaleSymmetric(16, 32, xb + 16 * ib, L + 16 * ib);
      if (std::fabs(scales[ib]) > max_abs_scale) {
        max_abs_scale = std::fabs(scales[ib]);
        max_scale = scales[ib];
      }
    }
    if (max_abs_scale < 1e-15f) {  // an all-zero block: every value decodes to 0
      std::memset(blk, 0, kQ6_KBytes);
      continue;
    }
    const float iscale = -128.0f / max_scale;
    PutHalf(blk + 208, 1.0f / iscale);
    int8_t* sc = reinterpret_cast<int8_t*>(blk + 192);
    for (int ib = 0; ib < 16; ++ib) sc[ib] = static_cast<int8_t>(std::min(127, NearestInt(iscale * scales[ib])));
    const float d_all = HalfAt(blk + 208);
    uint8_t Lu[kQK_K];
    for (int j = 0; j < 16; ++j) {
      const float d = d_all * static_cast<float>(sc[j]);
      for (int i = 0; i < 16; ++i) {
        // A zero scale decodes every level to 0; level 32 says so.
        const int l = d == 0.0f ? 0 : std::clamp(NearestInt(xb[16 * j + i] / d), -32, 31);
        Lu[16 * j + i] = static_cast<uint8_t>(l + 32);
      }
    }
    uint8_t* ql = blk;
    uint8_t* qh = blk + 128;
    for (size_t j = 0; j < kQK_K; j += 128, ql += 64, qh += 32) {
      for (int l = 0; l < 32; ++l) {
        const uint8_t q1 = Lu[j + l] & 0xF, q2 = Lu[j + l + 32] & 0xF;
        const uint8_t q3 = Lu[j + l + 64] & 0xF, q4 = Lu[j + l + 96] & 0xF;
        ql[l] = static_cast<uint8_t>(q1 | (q3 << 4));
        ql[l + 32] = static_cast<uint8_t>(q2 | (q4 << 4));
        qh[l] = static_cast<uint8_t>((Lu[j + l] >> 4) | ((Lu[j + l + 32] >> 4) << 2) | ((Lu[j + l + 64] >> 4) << 4) |
                                     ((Lu[j + l + 96] >> 4) << 6));
      }
    }
  }
}

}  // namespace l2l::formats
