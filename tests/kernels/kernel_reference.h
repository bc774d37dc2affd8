// Naive double-precision reference implementations of the transformer ops and GPT-2
// layers, written independently of the backend (plain loops, llm.c style), for the
// kernels tests to compare against and to take finite differences of.
// Thread-safety: pure functions.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace l2l::kernels::testing {

using DVec = std::vector<double>;

inline double GeluRef(double x) {
  const double s = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(s * (x + 0.044715 * x * x * x)));
}

// out (N,C) with torch's biased variance and eps 1e-5; optionally the row mean and rstd.
inline DVec LayerNormRef(const double* x, const double* w, const double* b, int64_t N, int64_t C,
                         DVec* mean = nullptr, DVec* rstd = nullptr) {
  DVec out(N * C);
  for (int64_t n = 0; n < N; ++n) {
    double m = 0.0, v = 0.0;
    for (int64_t c = 0; c < C; ++c) m += x[n * C + c];
    m /= C;
    for (int64_t c = 0; c < C; ++c) v += (x[n * C + c] - m) * (x[n * C + c] - m);
    v /= C;
    const double rs = 1.0 / std::sqrt(v + 1e-5);
    for (int64_t c = 0; c < C; ++c) out[n * C + c] = (x[n * C + c] - m) * rs * w[c] + b[c];
    if (mean) mean->push_back(m);
    if (rstd) rstd->push_back(rs);
  }
  return out;
}

// y (N,OC) = x (N,IC) @ W (IC,OC) + b (OC); b may be null.
inline DVec LinearRef(const double* x, const double* w, const double* b, int64_t N, int64_t IC,
                      int64_t OC) {
  DVec y(N * OC);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OC; ++o) {
      double s = b ? b[o] : 0.0;
      for (int64_t i = 0; i < IC; ++i) s += x[n * IC + i] * w[i * OC + o];
      y[n * OC + o] = s;
    }
  return y;
}

// Causal attention: out (B,T,C) from qkv (B,T,3C); optionally att (B,NH,T,T).
inline DVec AttentionRef(const double* qkv, int64_t B, int64_t T, int64_t C, int64_t NH,
                         DVec* att_out = nullptr) {
  const int64_t hs = C / NH;
  const double scale = 1.0 / std::sqrt(double(hs));
  DVec out(B * T * C, 0.0);
  if (att_out) att_out->assign(B * NH * T * T, 0.0);
  DVec w(T);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t t = 0; t < T; ++t) {
        const double* q = &qkv[(b * T + t) * 3 * C + h * hs];
        double mx = -1e300;
        for (int64_t j = 0; j <= t; ++j) {
          const double* k = &qkv[(b * T + j) * 3 * C + C + h * hs];
          double s = 0.0;
          for (int64_t i = 0; i < hs; ++i) s += q[i] * k[i];
          w[j] = s * scale;
          mx = std::max(mx, w[j]);
        }
        double sum = 0.0;
        for (int64_t j = 0; j <= t; ++j) sum += (w[j] = std::exp(w[j] - mx));
        for (int64_t j = 0; j <= t; ++j) {
          w[j] /= sum;
          if (att_out) (*att_out)[((b * NH + h) * T + t) * T + j] = w[j];
          const double* v = &qkv[(b * T + j) * 3 * C + 2 * C + h * hs];
          for (int64_t i = 0; i < hs; ++i) out[(b * T + t) * C + h * hs + i] += w[j] * v[i];
        }
      }
  return out;
}

// Causal attention's per-row log-sum-exp of the scaled scores, (B,NH,T): what the CPU
// backend keeps in `att` for the backward. qkv rows hold q (NH heads), k and v (NKV
// heads each) of hs; query head h reads kv head h / (NH / NKV).
inline DVec AttentionLseRef(const double* qkv, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                            int64_t hs) {
  const int64_t W = (NH + 2 * NKV) * hs, C = NH * hs, rep = NH / NKV;
  const double scale = 1.0 / std::sqrt(double(hs));
  DVec lse(B * NH * T);
  DVec w(T);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t t = 0; t < T; ++t) {
        const double* q = &qkv[(b * T + t) * W + h * hs];
        double mx = -1e300;
        for (int64_t j = 0; j <= t; ++j) {
          const double* k = &qkv[(b * T + j) * W + C + (h / rep) * hs];
          double s = 0.0;
          for (int64_t i = 0; i < hs; ++i) s += q[i] * k[i];
          mx = std::max(mx, w[j] = s * scale);
        }
        double sum = 0.0;
        for (int64_t j = 0; j <= t; ++j) sum += std::exp(w[j] - mx);
        lse[(b * NH + h) * T + t] = mx + std::log(sum);
      }
  return lse;
}

// Per-row cross-entropy losses via log-sum-exp; optionally the softmax probabilities.
inline DVec CrossEntropyRef(const double* logits, const int32_t* targets, int64_t N, int64_t V,
                            DVec* probs = nullptr) {
  DVec losses(N);
  for (int64_t n = 0; n < N; ++n) {
    const double* x = &logits[n * V];
    double mx = x[0];
    for (int64_t v = 1; v < V; ++v) mx = std::max(mx, x[v]);
    double s = 0.0;
    for (int64_t v = 0; v < V; ++v) s += std::exp(x[v] - mx);
    losses[n] = std::log(s) + mx - x[targets[n]];
    if (probs)
      for (int64_t v = 0; v < V; ++v) probs->push_back(std::exp(x[v] - mx) / s);
  }
  return losses;
}

}  // namespace l2l::kernels::testing
