// Vectorised AdamW (scalar / AVX2 / AVX-512 paths, exact and fast arithmetic). See
// adamw_simd.h. Compiled with -ffp-contract=off (kernels/CMakeLists.txt): contracting
// mul+add into FMA would change rounding and break the exact paths' bit-equality with
// common/adamw.h; the fast paths ask for their fused multiply-adds explicitly.
#include "kernels/cpu/adamw_simd.h"

// GCC 12's avx512fintrin.h trips -Wmaybe-uninitialized on its own _mm512_undefined_*
// (clang has no such warning, and would warn about the unknown name).
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <vector>

namespace l2l::kernels {
namespace {

// One element; the tail of the vector paths and the whole scalar path. kFast: the
// arithmetic of AdamWUpdateFast (fused multiply-adds, a multiply by 1/sqrt(1-b2^t)).
// Returns whether every scaled gradient element was finite.
template <bool kFast>
inline bool ScalarRange(const AdamWScalars& c, float* param, float* m, float* v, const float* const* grads,
                        int ng, size_t begin, size_t end, DType od, void* out) {
  bool finite = true;
  for (size_t i = begin; i < end; ++i) {
    float gs = grads[0][i];
    for (int w = 1; w < ng; ++w) gs = gs + grads[w][i];
    const float g = gs * c.grad_scale;
    finite = finite && std::isfinite(g);
    float mi, vi, p;
    if constexpr (kFast) {
      mi = std::fma(c.one_minus_b1, g - m[i], m[i]);
      vi = std::fma(v[i], c.beta2, c.one_minus_b2 * g * g);
      const float denom = std::fma(std::sqrt(vi), c.inv_bc2_sqrt, c.eps);
      p = std::fma(param[i], c.decay_mul, c.neg_step_size * mi / denom);
    } else {
      p = param[i] * c.decay_mul;
      mi = m[i] + c.one_minus_b1 * (g - m[i]);
      vi = v[i] * c.beta2 + c.one_minus_b2 * g * g;
      const float denom = std::sqrt(vi) / c.bc2_sqrt + c.eps;
      p = p + c.neg_step_size * mi / denom;
    }
    m[i] = mi;
    v[i] = vi;
    param[i] = p;
    if (out != nullptr) {
      if (od == DType::kBF16) {
        static_cast<uint16_t*>(out)[i] = FloatToBf16(p);
      } else {
        static_cast<float*>(out)[i] = p;
      }
    }
  }
  return finite;
}

// The AdamW arithmetic on one vector of lanes at element i, written once for both vector
// widths: P is the intrinsic prefix (_mm256 or _mm512), V the vector type. Uses the
// enclosing function's broadcast constants, kFast, g (the scaled gradient) and m, v,
// param; stores the new m, v and param and leaves the new parameter in p. The exact
// path's operation order is AdamWStep's (common/adamw.cc); the fast path fuses.
#define L2L_ADAMW_LANES(P, V)                                                              \
  const V m0 = P##_loadu_ps(m + i), v0 = P##_loadu_ps(v + i);                              \
  V p, mi, vi;                                                                             \
  if constexpr (kFast) {                                                                   \
    mi = P##_fmadd_ps(omb1, P##_sub_ps(g, m0), m0);                                        \
    vi = P##_fmadd_ps(v0, b2, P##_mul_ps(P##_mul_ps(omb2, g), g));                         \
    const V denom = P##_fmadd_ps(P##_sqrt_ps(vi), inv_bc2s, eps);                          \
    p = P##_fmadd_ps(P##_loadu_ps(param + i), decay_mul, P##_div_ps(P##_mul_ps(nss, mi), denom)); \
  } else {                                                                                 \
    p = P##_mul_ps(P##_loadu_ps(param + i), decay_mul);                                    \
    mi = P##_add_ps(m0, P##_mul_ps(omb1, P##_sub_ps(g, m0)));                              \
    vi = P##_add_ps(P##_mul_ps(v0, b2), P##_mul_ps(P##_mul_ps(omb2, g), g));               \
    const V denom = P##_add_ps(P##_div_ps(P##_sqrt_ps(vi), bc2s), eps);                    \
    p = P##_add_ps(p, P##_div_ps(P##_mul_ps(nss, mi), denom));                             \
  }                                                                                        \
  P##_storeu_ps(m + i, mi);                                                                \
  P##_storeu_ps(v + i, vi);                                                                \
  P##_storeu_ps(param + i, p)

template <bool kFast>
__attribute__((target("avx2,fma"))) bool Avx2Range(const AdamWScalars& c, float* param, float* m, float* v,
                                                   const float* const* grads, int ng, size_t n, DType od,
                                                   void* out) {
  const __m256 decay_mul = _mm256_set1_ps(c.decay_mul), omb1 = _mm256_set1_ps(c.one_minus_b1);
  const __m256 b2 = _mm256_set1_ps(c.beta2), omb2 = _mm256_set1_ps(c.one_minus_b2);
  const __m256 bc2s = _mm256_set1_ps(c.bc2_sqrt), eps = _mm256_set1_ps(c.eps);
  const __m256 inv_bc2s = _mm256_set1_ps(c.inv_bc2_sqrt);
  const __m256 nss = _mm256_set1_ps(c.neg_step_size), scale = _mm256_set1_ps(c.grad_scale);
  const __m256i round_bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  const __m256i quiet = _mm256_set1_epi32(0x40);
  // g - g is NaN exactly when g is NaN or infinite: OR the unordered compares together.
  __m256 nonfinite = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 gs = _mm256_loadu_ps(grads[0] + i);
    for (int w = 1; w < ng; ++w) gs = _mm256_add_ps(gs, _mm256_loadu_ps(grads[w] + i));
    const __m256 g = _mm256_mul_ps(gs, scale);
    const __m256 d = _mm256_sub_ps(g, g);
    nonfinite = _mm256_or_ps(nonfinite, _mm256_cmp_ps(d, d, _CMP_UNORD_Q));
    L2L_ADAMW_LANES(_mm256, __m256);
    if (out == nullptr) continue;
    if (od == DType::kBF16) {
      const __m256i u = _mm256_castps_si256(p);
      const __m256i rounded = _mm256_srli_epi32(
          _mm256_add_epi32(_mm256_add_epi32(u, round_bias),
                           _mm256_and_si256(_mm256_srli_epi32(u, 16), one)), 16);
      const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
      const __m256i qnan = _mm256_or_si256(_mm256_srli_epi32(u, 16), quiet);
      const __m256i h = _mm256_blendv_epi8(rounded, qnan, nan);
      // packus interleaves 128-bit lanes: [a0..3 b0..3 a4..7 b4..7]; fix the order.
      const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(h, h), 0xd8);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(out) + i),
                       _mm256_castsi256_si128(packed));
    } else {
      _mm256_storeu_ps(static_cast<float*>(out) + i, p);
    }
  }
  const bool tail = ScalarRange<kFast>(c, param, m, v, grads, ng, i, n, od, out);
  return tail && _mm256_movemask_ps(nonfinite) == 0;
}

template <bool kFast>
__attribute__((target("avx512f"))) bool Avx512Range(const AdamWScalars& c, float* param, float* m, float* v,
                                                    const float* const* grads, int ng, size_t n, DType od,
                                                    void* out) {
  const __m512 decay_mul = _mm512_set1_ps(c.decay_mul), omb1 = _mm512_set1_ps(c.one_minus_b1);
  const __m512 b2 = _mm512_set1_ps(c.beta2), omb2 = _mm512_set1_ps(c.one_minus_b2);
  const __m512 bc2s = _mm512_set1_ps(c.bc2_sqrt), eps = _mm512_set1_ps(c.eps);
  const __m512 inv_bc2s = _mm512_set1_ps(c.inv_bc2_sqrt);
  const __m512 nss = _mm512_set1_ps(c.neg_step_size), scale = _mm512_set1_ps(c.grad_scale);
  const __m512i round_bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
  const __m512i quiet = _mm512_set1_epi32(0x40);
  __mmask16 nonfinite = 0;  // as in Avx2Range: g - g is NaN iff g is not finite
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 gs = _mm512_loadu_ps(grads[0] + i);
    for (int w = 1; w < ng; ++w) gs = _mm512_add_ps(gs, _mm512_loadu_ps(grads[w] + i));
    const __m512 g = _mm512_mul_ps(gs, scale);
    const __m512 d = _mm512_sub_ps(g, g);
    nonfinite = static_cast<__mmask16>(nonfinite | _mm512_cmp_ps_mask(d, d, _CMP_UNORD_Q));
    L2L_ADAMW_LANES(_mm512, __m512);
    if (out == nullptr) continue;
    if (od == DType::kBF16) {
      const __m512i u = _mm512_castps_si512(p);
      const __m512i rounded = _mm512_srli_epi32(
          _mm512_add_epi32(_mm512_add_epi32(u, round_bias),
                           _mm512_and_si512(_mm512_srli_epi32(u, 16), one)), 16);
      const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, abs_mask), inf);
      const __m512i h = _mm512_mask_blend_epi32(nan, rounded,
                                                _mm512_or_si512(_mm512_srli_epi32(u, 16), quiet));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(out) + i),
                          _mm512_cvtepi32_epi16(h));
    } else {
      _mm512_storeu_ps(static_cast<float*>(out) + i, p);
    }
  }
  const bool tail = ScalarRange<kFast>(c, param, m, v, grads, ng, i, n, od, out);
  return tail && nonfinite == 0;
}

#undef L2L_ADAMW_LANES

}  // namespace

const char* SimdLevelName(SimdLevel s) {
  switch (s) {
    case SimdLevel::kScalar: return "scalar";
    case SimdLevel::kAvx2: return "avx2";
    case SimdLevel::kAvx512: return "avx512";
  }
  return "?";
}

SimdLevel DetectSimdLevel() {
  static const SimdLevel level = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return SimdLevel::kAvx512;
    // The AVX2 paths are compiled with FMA too (the fast arithmetic uses it).
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return SimdLevel::kAvx2;
    return SimdLevel::kScalar;
  }();
  return level;
}

SimdLevel ResolveSimdLevel(SimdLevel requested) {
  const SimdLevel best = DetectSimdLevel();
  return static_cast<int>(requested) > static_cast<int>(best) ? best : requested;
}

namespace {

template <bool kFast>
bool Dispatch(const AdamWStepArgs& a, float* param, float* m, float* v, const float* const* grads,
              int num_grads, size_t n, DType out_dtype, void* out, SimdLevel level) {
  L2L_CHECK(num_grads >= 1) << "AdamWUpdate needs at least one gradient";
  L2L_CHECK(out == nullptr || out_dtype == DType::kF32 || out_dtype == DType::kBF16)
      << "published dtype " << DTypeName(out_dtype) << " not supported";
  const AdamWScalars c = MakeAdamWScalars(a);
  switch (ResolveSimdLevel(level)) {
    case SimdLevel::kAvx512: return Avx512Range<kFast>(c, param, m, v, grads, num_grads, n, out_dtype, out);
    case SimdLevel::kAvx2: return Avx2Range<kFast>(c, param, m, v, grads, num_grads, n, out_dtype, out);
    case SimdLevel::kScalar: return ScalarRange<kFast>(c, param, m, v, grads, num_grads, 0, n, out_dtype, out);
  }
  return false;
}

}  // namespace

bool AdamWUpdate(const AdamWStepArgs& a, float* param, float* m, float* v, const float* const* grads,
                 int num_grads, size_t n, DType out_dtype, void* out, SimdLevel level) {
  return Dispatch<false>(a, param, m, v, grads, num_grads, n, out_dtype, out, level);
}

bool AdamWUpdateFast(const AdamWStepArgs& a, float* param, float* m, float* v, const float* const* grads,
                     int num_grads, size_t n, DType out_dtype, void* out, SimdLevel level) {
  return Dispatch<true>(a, param, m, v, grads, num_grads, n, out_dtype, out, level);
}

double ReducedSumSquares(const float* const* grads, int num_grads, size_t n, float scale) {
  double s = 0.0;
  for (size_t i = 0; i < n; ++i) {
    float gs = grads[0][i];
    for (int w = 1; w < num_grads; ++w) gs = gs + grads[w][i];
    const double g = static_cast<double>(gs * scale);
    s += g * g;
  }
  return s;
}

double MeasureAdamWUpdateRate(size_t n) {
  std::vector<float> p(n, 0.5f), m(n, 0.f), v(n, 0.f), g(n, 1e-3f);
  std::vector<uint16_t> out(n);
  AdamWStepArgs a;  // the optimizer's defaults, weight decay off
  a.lr = 1e-3f;
  auto pass = [&] {
    tbb::parallel_for(tbb::blocked_range<size_t>(0, n, size_t{1} << 16), [&](const tbb::blocked_range<size_t>& r) {
      const float* grads[] = {g.data() + r.begin()};
      (void)AdamWUpdate(a, p.data() + r.begin(), m.data() + r.begin(), v.data() + r.begin(), grads, 1, r.size(),
                        DType::kBF16, out.data() + r.begin());
    });
  };
  pass();
  const auto t0 = std::chrono::steady_clock::now();
  a.t = 2;
  pass();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return s > 0 ? static_cast<double>(n) / s : 0;
}

}  // namespace l2l::kernels
