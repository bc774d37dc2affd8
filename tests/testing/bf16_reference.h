// Independent references for bf16 GEMM modes (the CUDA backend's and the CPU backend's):
// round-to-nearest-even to bf16 written here (not the code under test's), the softmax
// probabilities of causal attention recomputed in double from the CPU backend's
// log-sum-exp stash, per-element bounds of what a bf16 attention rounds beyond its
// inputs, and a comparison against such bounds. Thread-safety: test-only, pure functions.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"

namespace l2l::testing {

// Per-element bounds (double) of what bf16 GEMM mode rounds beyond its inputs in
// attention: the probabilities P (for out and dV) and the softmax gradient dS (for dQ and
// dK), each by at most u = 2^-8 relative. qkv is (B, T, (NH + 2 NKV) hs) as q|k|v, dout
// (B, T, NH hs), att the CPU's probabilities (B, NH, T, T). Query head h reads key/value
// head g = h / (NH / NKV) (NKV = NH: multi-head attention); a key/value gradient sums the
// bounds of the heads that read it. Keys j <= i when `causal`, else every key (padded
// keys have P = 0 and add nothing):
//   out_h,i,d : u * sum_j P_ij |v_g,jd|        dV_g,j,d : u * sum_h sum_i P_ij |dout_h,id|
//   dQ_h,i,d  : u * sum_j |dS_ij| |k_g,jd|     dK_g,j,d : u * sum_h sum_i |dS_ij| |q_h,id|
// with dS_i = scale * P_i * (dP_i - sum_j P_ij dP_ij), dP_ij = dout_i . v_j.
struct AttentionBounds {
  std::vector<double> out, dqkv;
};
inline AttentionBounds Bf16AttentionBounds(const std::vector<float>& qkv, const std::vector<float>& dout,
                                           const std::vector<float>& att, int64_t B, int64_t T, int64_t NH,
                                           int64_t NKV, int64_t hs, bool causal) {
  const int64_t rep = NH / NKV, C = NH * hs, W = (NH + 2 * NKV) * hs;
  const double scale = 1.0 / std::sqrt(double(hs)), u = std::ldexp(1.0, -8);
  AttentionBounds r;
  r.out.assign(B * T * C, 0.0);
  r.dqkv.assign(B * T * W, 0.0);
  std::vector<double> ds(T * T);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < NH; ++h) {
      const int64_t g = h / rep;
      const int64_t qo = h * hs, ko = C + g * hs, vo = C + NKV * hs + g * hs;
      auto P = [&](int64_t i, int64_t j) { return double(att[((b * NH + h) * T + i) * T + j]); };
      auto Q = [&](int64_t t, int64_t d, int64_t off) { return double(qkv[(b * T + t) * W + off + d]); };
      auto D = [&](int64_t t, int64_t d) { return double(dout[(b * T + t) * C + h * hs + d]); };
      for (int64_t i = 0; i < T; ++i) {
        const int64_t keys = causal ? i + 1 : T;
        double row = 0.0;
        for (int64_t j = 0; j < keys; ++j) {
          double dp = 0.0;
          for (int64_t d = 0; d < hs; ++d) dp += D(i, d) * Q(j, d, vo);
          ds[i * T + j] = dp;
          row += P(i, j) * dp;
        }
        for (int64_t j = 0; j < keys; ++j) ds[i * T + j] = scale * P(i, j) * (ds[i * T + j] - row);
      }
      for (int64_t i = 0; i < T; ++i) {
        const int64_t keys = causal ? i + 1 : T;
        for (int64_t j = 0; j < keys; ++j) {
          const double p = P(i, j), s = std::abs(ds[i * T + j]);
          for (int64_t d = 0; d < hs; ++d) {
            r.out[(b * T + i) * C + qo + d] += u * p * std::abs(Q(j, d, vo));
            r.dqkv[(b * T + j) * W + vo + d] += u * p * std::abs(D(i, d));
            r.dqkv[(b * T + i) * W + qo + d] += u * s * std::abs(Q(j, d, ko));
            r.dqkv[(b * T + j) * W + ko + d] += u * s * std::abs(Q(i, d, qo));
          }
        }
      }
    }
  }
  return r;
}

// The softmax probabilities (B,NH,T,T) of causal attention, from the CPU backend's stash:
// its `att` keeps only each row's log-sum-exp (first B*NH*T floats), so P_ij =
// exp(scale q_i.k_j - lse_i) for j <= i (0 past i), in double from the same fp32 qkv.
// qkv rows hold q (NH heads), k and v (NKV heads) of hs; head h reads kv head h/(NH/NKV).
inline std::vector<float> CpuAttentionProbs(const std::vector<float>& qkv, const std::vector<float>& cpu_att,
                                            int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t hs) {
  const int64_t W = (NH + 2 * NKV) * hs, C = NH * hs, rep = NH / NKV;
  const double scale = 1.0 / std::sqrt(double(hs));
  std::vector<float> p(B * NH * T * T, 0.0f);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t i = 0; i < T; ++i) {
        const double lse = cpu_att[(b * NH + h) * T + i];
        const float* q = &qkv[(b * T + i) * W + h * hs];
        for (int64_t j = 0; j <= i; ++j) {
          const float* k = &qkv[(b * T + j) * W + C + (h / rep) * hs];
          double s = 0.0;
          for (int64_t d = 0; d < hs; ++d) s += double(q[d]) * double(k[d]);
          p[((b * NH + h) * T + i) * T + j] = float(std::exp(s * scale - lse));
        }
      }
  return p;
}

// Round to nearest even to bf16 (8 significant bits), returned as the fp32 it stands for.
// Inputs here are finite.
inline float RoundBf16(float x) {
  uint32_t u = 0;
  std::memcpy(&u, &x, sizeof(u));
  const uint32_t lsb = (u >> 16) & 1u;
  u = (u + 0x7fffu + lsb) & 0xffff0000u;
  float r = 0.0f;
  std::memcpy(&r, &u, sizeof(r));
  return r;
}

// A layer published as bf16 (n values drawn uniform(-1, 1), rounded): its bits and the
// fp32 slot that is their widening, as the worker's prefetcher holds them.
struct Bf16Layer {
  std::vector<uint16_t> bits;
  std::vector<float> slot;
};
inline Bf16Layer RandomBf16Layer(std::mt19937& rng, int64_t n) {
  Bf16Layer l{std::vector<uint16_t>(static_cast<size_t>(n)), std::vector<float>(static_cast<size_t>(n))};
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int64_t i = 0; i < n; ++i) {
    l.bits[i] = FloatToBf16(u(rng));
    l.slot[i] = Bf16ToFloat(l.bits[i]);
  }
  return l;
}

inline std::vector<float> RoundedBf16(const std::vector<float>& v) {
  std::vector<float> r(v.size());
  std::transform(v.begin(), v.end(), r.begin(), RoundBf16);
  return r;
}

// op(x)[r][c] of a row-major matrix with leading dimension ld (transposed when trans).
inline double OpAt(const std::vector<float>& x, bool trans, int64_t ld, int64_t r, int64_t c) {
  return trans ? x[c * ld + r] : x[r * ld + c];
}

// Checks a bf16-mode Gemm's C (got) against the double product of the bf16-rounded
// operands (ar, br: already rounded) and against the fp32 Gemm's C (fp32). Errors are
// relative to |alpha| sum|a||b| per element: none beyond 1e-5 of that (+ 1e-6 of
// |beta C|); the fp32 result differs by more than 1e-4 somewhere (the mode is on) and by
// no more than bf16 rounding (2^-7) anywhere; the padding between C's rows (c0's values)
// is not written.
inline void CheckBf16Gemm(const std::vector<float>& got, const std::vector<float>& fp32,
                          const std::vector<float>& ar, const std::vector<float>& br,
                          const std::vector<float>& c0, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                          float alpha, float beta, int64_t lda, int64_t ldb, int64_t ldc) {
  size_t bad = 0;
  double worst_oracle = 0.0, max_vs_fp32 = 0.0;
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      double dot = 0.0, mag = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = OpAt(ar, ta, lda, i, k) * OpAt(br, tb, ldb, k, j);
        dot += p;
        mag += std::abs(p);
      }
      const double c_in = c0[i * ldc + j];
      const double ref = alpha * dot + beta * c_in;
      const double scale = std::abs(alpha) * mag;
      const double err = std::abs(got[i * ldc + j] - ref);
      const double tol = 1e-5 * scale + 1e-6 * std::abs(beta * c_in) + 1e-30;
      if (!(err <= tol)) ++bad;
      worst_oracle = std::max(worst_oracle, err / (scale + 1e-30));
      max_vs_fp32 = std::max(max_vs_fp32, std::abs(double(got[i * ldc + j]) - fp32[i * ldc + j]) / (scale + 1e-30));
    }
  }
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = N; j < ldc; ++j) CHECK(got[i * ldc + j] == c0[i * ldc + j]);
  }
  INFO("worst |got - oracle| / (|alpha| sum|a||b|) = " << worst_oracle
       << "; max |bf16 - fp32| / (|alpha| sum|a||b|) = " << max_vs_fp32);
  CHECK(bad == 0);
  CHECK(max_vs_fp32 > 1e-4);                         // the mode is on
  CHECK(max_vs_fp32 <= std::ldexp(1.0, -7) + 1e-5);  // and it is bf16 rounding, no worse
}

// |got - ref| <= 1.01 * bound + atol + rtol * |ref| for every element (bound: what bf16
// rounding may add beyond the inputs' own rounding); reports the worst.
inline void ExpectWithin(const std::vector<float>& got, const std::vector<float>& ref,
                         const std::vector<double>& bound, double atol, double rtol,
                         const std::string& what) {
  REQUIRE(got.size() == ref.size());
  REQUIRE(bound.size() == ref.size());
  size_t bad = 0, worst = 0;
  double worst_ratio = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(double(got[i]) - ref[i]);
    const double tol = 1.01 * bound[i] + atol + rtol * std::abs(double(ref[i]));
    if (!(err <= tol)) ++bad;
    if (!(err / tol <= worst_ratio)) {
      worst_ratio = err / tol;
      worst = i;
    }
  }
  INFO(what << ": " << bad << " of " << got.size() << " off; worst [" << worst << "] got "
            << got[worst] << " ref " << ref[worst] << " bound " << bound[worst]
            << " (error / tolerance " << worst_ratio << ")");
  CHECK(bad == 0);
}

}  // namespace l2l::testing
