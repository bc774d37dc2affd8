// The CPU backend's Llama-family ops (token embedding, RMSNorm, RoPE, SwiGLU,
// grouped-query attention) against naive double-precision loops written here (forward)
// and central finite differences of those loops (backward). Inputs are fresh random
// values; shapes include odd sizes and ones large enough for the parallel paths.
#include <catch2/catch.hpp>

#include <array>
#include <cmath>

#include "kernels/backend.h"
#include "tests/kernels/kernel_reference.h"
#include "tests/kernels/kernel_test_util.h"

namespace l2l::kernels {
namespace {

using namespace testing;  // NOLINT
using DVec = std::vector<double>;

DVec RmsNormRef(const double* x, const double* w, int64_t N, int64_t C, double eps) {
  DVec out(N * C);
  for (int64_t n = 0; n < N; ++n) {
    double ss = 0.0;
    for (int64_t c = 0; c < C; ++c) ss += x[n * C + c] * x[n * C + c];
    const double rs = 1.0 / std::sqrt(ss / double(C) + eps);
    for (int64_t c = 0; c < C; ++c) out[n * C + c] = x[n * C + c] * rs * w[c];
  }
  return out;
}

// Rotates n_heads heads at the start of each row of stride W (rotate_half convention).
DVec RopeRef(const double* x, const DVec& cos, const DVec& sin, int64_t B, int64_t T, int64_t W,
             int64_t n_heads, int64_t hs) {
  DVec out(x, x + B * T * W);
  const int64_t half = hs / 2;
  for (int64_t n = 0; n < B * T; ++n)
    for (int64_t h = 0; h < n_heads; ++h)
      for (int64_t i = 0; i < half; ++i) {
        const int64_t t = n % T, a = n * W + h * hs + i, b = a + half;
        const double c = cos[t * half + i], s = sin[t * half + i];
        out[a] = x[a] * c - x[b] * s;
        out[b] = x[b] * c + x[a] * s;
      }
  return out;
}

DVec SwiGluRef(const double* gu, int64_t N, int64_t F) {
  DVec out(N * F);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < F; ++i) {
      const double g = gu[n * 2 * F + i], u = gu[n * 2 * F + F + i];
      out[n * F + i] = g / (1.0 + std::exp(-g)) * u;
    }
  return out;
}

DVec GqaRef(const double* qkv, int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t hs,
            DVec* att_out = nullptr) {
  const int64_t W = (NH + 2 * NKV) * hs, C = NH * hs, rep = NH / NKV;
  const double scale = 1.0 / std::sqrt(double(hs));
  DVec out(B * T * C, 0.0), w(T);
  if (att_out) att_out->assign(B * NH * T * T, 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t t = 0; t < T; ++t) {
        const int64_t g = h / rep;
        const double* q = &qkv[(b * T + t) * W + h * hs];
        double mx = -1e300;
        for (int64_t j = 0; j <= t; ++j) {
          const double* k = &qkv[(b * T + j) * W + C + g * hs];
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
          const double* v = &qkv[(b * T + j) * W + C + NKV * hs + g * hs];
          for (int64_t i = 0; i < hs; ++i) out[(b * T + t) * C + h * hs + i] += w[j] * v[i];
        }
      }
  return out;
}

TEST_CASE("TokenEmbedding gathers rows and scatters gradients deterministically",
          "[kernels][cpu][llama]") {
  const int64_t N = GENERATE(int64_t{7}, int64_t{300});
  const int64_t V = 23, C = 70;
  std::mt19937 rng(static_cast<uint32_t>(N));
  const auto tokens = RandomTokens(rng, N, V);
  const auto wte = RandomVec(rng, V * C), dout = RandomVec(rng, N * C), dw0 = RandomVec(rng, V * C);
  auto be = CreateCpuBackend(2);
  auto dTok = Upload(*be, tokens), dW = Upload(*be, wte), dD = Upload(*be, dout), dG = Upload(*be, dw0);
  auto dOut = Upload(*be, RandomVec(rng, N * C));
  be->TokenEmbeddingForward(dOut.f32(), dTok.i32(), dW.f32(), N, C);
  DVec want(N * C), gw = ToDouble(dw0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) {
      want[n * C + c] = wte[tokens[n] * C + c];
      gw[tokens[n] * C + c] += dout[n * C + c];
    }
  ExpectClose(Download(*be, dOut, N * C), want, 0, 0, "TokenEmbeddingForward");
  be->TokenEmbeddingBackward(dG.f32(), dD.f32(), dTok.i32(), N, C);
  const auto got = Download(*be, dG, V * C);
  ExpectClose(got, gw, 1e-6, 1e-5, "TokenEmbeddingBackward");
  // Same bits with one thread.
  auto one = CreateCpuBackend(1);
  auto dG1 = Upload(*one, dw0);
  one->TokenEmbeddingBackward(dG1.f32(), dD.f32(), dTok.i32(), N, C);
  CHECK(Download(*one, dG1, V * C) == got);
}

TEST_CASE("RMSNorm forward matches the formula and backward the finite differences",
          "[kernels][cpu][llama]") {
  const auto shape = GENERATE(std::array<int64_t, 2>{3, 5}, std::array<int64_t, 2>{40, 130},
                              std::array<int64_t, 2>{97, 576});
  const int64_t N = shape[0], C = shape[1];
  CAPTURE(N, C);
  const float eps = 1e-6f;
  std::mt19937 rng(static_cast<uint32_t>(N * C));
  const auto x = RandomVec(rng, N * C, -2.0f, 2.0f), w = RandomVec(rng, C, 0.5f, 1.5f);
  const auto R = RandomVec(rng, N * C), dx0 = RandomVec(rng, N * C), dw0 = RandomVec(rng, C);
  auto be = CreateCpuBackend(2);
  auto dX = Upload(*be, x), dW = Upload(*be, w), dR = Upload(*be, R), dDx = Upload(*be, dx0),
       dDw = Upload(*be, dw0);
  auto dOut = Upload(*be, RandomVec(rng, N * C)), dRs = Upload(*be, RandomVec(rng, N));
  be->RMSNormForward(dOut.f32(), dRs.f32(), dX.f32(), dW.f32(), N, C, eps);
  const auto xd = ToDouble(x), wd = ToDouble(w), Rd = ToDouble(R);
  ExpectClose(Download(*be, dOut, N * C), RmsNormRef(xd.data(), wd.data(), N, C, eps), 1e-6, 1e-5,
              "RMSNormForward");
  be->RMSNormBackward(dDx.f32(), dDw.f32(), dR.f32(), dX.f32(), dW.f32(), dRs.f32(), N, C);
  const auto gx = Download(*be, dDx, N * C), gw = Download(*be, dDw, C);
  std::vector<float> got;
  DVec fd;
  for (size_t i : SampleIndices(x.size(), 300)) {
    got.push_back(gx[i]);
    fd.push_back(dx0[i] + FiniteDiff([&](const DVec& v) { return Dot(RmsNormRef(v.data(), wd.data(), N, C, eps), Rd); }, xd, i));
  }
  ExpectClose(got, fd, 1e-4, 1e-3, "RMSNormBackward dinp");
  DVec fdw;
  for (int64_t c = 0; c < C; ++c) {
    fdw.push_back(dw0[c] + FiniteDiff([&](const DVec& v) { return Dot(RmsNormRef(xd.data(), v.data(), N, C, eps), Rd); }, wd, c));
  }
  ExpectClose(gw, fdw, 1e-4, 1e-3, "RMSNormBackward dweight");

  // The same bits with one thread (dweight sums fixed row chunks in order).
  auto one = CreateCpuBackend(1);
  auto hDx = Upload(*one, dx0), hDw = Upload(*one, dw0);
  one->RMSNormBackward(hDx.f32(), hDw.f32(), dR.f32(), dX.f32(), dW.f32(), dRs.f32(), N, C);
  CHECK(Download(*one, hDw, C) == gw);
  CHECK(Download(*one, hDx, N * C) == gx);
}

TEST_CASE("RoPE rotates q and k heads in place and its backward is the transposed rotation",
          "[kernels][cpu][llama]") {
  const int64_t B = 2, T = 9, hs = 6, n_rot = 5, W = 7 * hs;  // 5 rotated heads + 2 untouched
  std::mt19937 rng(3);
  const auto x = RandomVec(rng, B * T * W);
  std::vector<float> cos(T * hs / 2), sin(T * hs / 2);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < hs / 2; ++i) {
      const double a = t * std::pow(100.0, -2.0 * i / hs);
      cos[t * hs / 2 + i] = float(std::cos(a));
      sin[t * hs / 2 + i] = float(std::sin(a));
    }
  auto be = CreateCpuBackend(2);
  auto dX = Upload(*be, x), dC = Upload(*be, cos), dS = Upload(*be, sin);
  be->RopeForward(dX.f32(), dC.f32(), dS.f32(), B, T, W, n_rot, hs);
  const DVec cd = ToDouble(cos), sd = ToDouble(sin), xd = ToDouble(x);
  ExpectClose(Download(*be, dX, B * T * W), RopeRef(xd.data(), cd, sd, B, T, W, n_rot, hs), 1e-6, 1e-6,
              "RopeForward");
  // Backward: dx = J^T dy, checked as finite differences of sum(rope(x) * R).
  const auto R = RandomVec(rng, B * T * W);
  auto dR = Upload(*be, R);
  be->RopeBackward(dR.f32(), dC.f32(), dS.f32(), B, T, W, n_rot, hs);
  const auto g = Download(*be, dR, B * T * W);
  const DVec Rd = ToDouble(R);
  std::vector<float> got;
  DVec fd;
  for (size_t i : SampleIndices(x.size(), 300)) {
    got.push_back(g[i]);
    fd.push_back(FiniteDiff([&](const DVec& v) { return Dot(RopeRef(v.data(), cd, sd, B, T, W, n_rot, hs), Rd); }, xd, i));
  }
  ExpectClose(got, fd, 1e-5, 1e-4, "RopeBackward");
}

TEST_CASE("SwiGLU forward matches silu(gate)*up and backward the finite differences",
          "[kernels][cpu][llama]") {
  const auto shape = GENERATE(std::array<int64_t, 2>{3, 5}, std::array<int64_t, 2>{64, 300});
  const int64_t N = shape[0], F = shape[1];
  std::mt19937 rng(static_cast<uint32_t>(N + F));
  const auto gu = RandomVec(rng, N * 2 * F, -4.0f, 4.0f), R = RandomVec(rng, N * F),
             d0 = RandomVec(rng, N * 2 * F);
  auto be = CreateCpuBackend(2);
  auto dGu = Upload(*be, gu), dR = Upload(*be, R), dD = Upload(*be, d0);
  auto dOut = Upload(*be, RandomVec(rng, N * F));
  be->SwiGLUForward(dOut.f32(), dGu.f32(), N, F);
  const DVec gd = ToDouble(gu), Rd = ToDouble(R);
  ExpectClose(Download(*be, dOut, N * F), SwiGluRef(gd.data(), N, F), 1e-6, 1e-5, "SwiGLUForward");
  be->SwiGLUBackward(dD.f32(), dR.f32(), dGu.f32(), N, F);
  const auto g = Download(*be, dD, N * 2 * F);
  std::vector<float> got;
  DVec fd;
  for (size_t i : SampleIndices(gu.size(), 300)) {
    got.push_back(g[i]);
    fd.push_back(d0[i] + FiniteDiff([&](const DVec& v) { return Dot(SwiGluRef(v.data(), N, F), Rd); }, gd, i));
  }
  ExpectClose(got, fd, 1e-5, 1e-4, "SwiGLUBackward");
}

TEST_CASE("SwiGLU stays finite and exact in the tails (large |gate|)", "[kernels][cpu][llama]") {
  const int64_t N = 1, F = 21;  // not a multiple of the vector width: the tail path too
  std::vector<float> gu(2 * F);
  const float gates[] = {-1000.0f, -100.0f, -88.0f, -30.0f, -5.0f, 0.0f, 5.0f, 30.0f, 88.0f, 100.0f, 1000.0f};
  for (int64_t i = 0; i < F; ++i) {
    gu[i] = gates[i % 11];
    gu[F + i] = 1.0f + 0.1f * float(i);
  }
  auto be = CreateCpuBackend(2);
  auto dGu = Upload(*be, gu), dOut = Upload(*be, std::vector<float>(F, 0.0f));
  auto dD = Upload(*be, std::vector<float>(2 * F, 0.0f)), dR = Upload(*be, std::vector<float>(F, 1.0f));
  be->SwiGLUForward(dOut.f32(), dGu.f32(), N, F);
  be->SwiGLUBackward(dD.f32(), dR.f32(), dGu.f32(), N, F);
  const auto out = Download(*be, dOut, F), d = Download(*be, dD, 2 * F);
  const DVec gd = ToDouble(gu);
  const DVec want = SwiGluRef(gd.data(), N, F);
  for (int64_t i = 0; i < F; ++i) {
    CAPTURE(i, gu[i]);
    REQUIRE(std::isfinite(out[i]));
    REQUIRE(std::isfinite(d[i]));
    REQUIRE(std::isfinite(d[F + i]));
    CHECK(std::abs(out[i] - want[i]) <= 1e-6 + 1e-6 * std::abs(want[i]));
    // d/d(up) = silu(gate); d/d(gate) -> 0 (very negative) or up (very positive).
    CHECK(std::abs(d[F + i] - double(out[i]) / gu[F + i]) <= 1e-5 + 1e-6 * std::abs(out[i]));
    if (gu[i] <= -30.0f) CHECK(std::abs(d[i]) <= 1e-9);
    if (gu[i] >= 30.0f) CHECK(std::abs(d[i] - gu[F + i]) <= 1e-5 * gu[F + i]);
  }
}

TEST_CASE("Grouped-query attention matches a naive causal reference with shared kv heads",
          "[kernels][cpu][llama][attention]") {
  const auto shape = GENERATE(std::array<int64_t, 5>{1, 1, 1, 1, 4},  // B, T, NH, NKV, hs
                              std::array<int64_t, 5>{2, 5, 4, 2, 3},
                              std::array<int64_t, 5>{2, 17, 6, 1, 4},
                              std::array<int64_t, 5>{1, 8, 3, 3, 5});
  const int64_t B = shape[0], T = shape[1], NH = shape[2], NKV = shape[3], hs = shape[4];
  const int64_t W = (NH + 2 * NKV) * hs, C = NH * hs;
  INFO("B=" << B << " T=" << T << " NH=" << NH << " NKV=" << NKV << " hs=" << hs);
  std::mt19937 rng(static_cast<uint32_t>(B * 1000 + T * 10 + NH + NKV));
  const auto qkv = RandomVec(rng, B * T * W, -1.5f, 1.5f), R = RandomVec(rng, B * T * C);
  const auto dqkv0 = RandomVec(rng, B * T * W);
  auto be = CreateCpuBackend(2);
  auto dQkv = Upload(*be, qkv), dR = Upload(*be, R), dG = Upload(*be, dqkv0);
  auto dOut = Upload(*be, RandomVec(rng, B * T * C));
  auto dAtt = Upload(*be, RandomVec(rng, B * NH * T * T)), dScr = Upload(*be, RandomVec(rng, B * NH * T * T));
  be->AttentionForwardGqa(dOut.f32(), dAtt.f32(), dQkv.f32(), B, T, NH, NKV, hs);
  const DVec qd = ToDouble(qkv), Rd = ToDouble(R);
  ExpectClose(Download(*be, dOut, B * T * C), GqaRef(qd.data(), B, T, NH, NKV, hs), 1e-5, 1e-5,
              "AttentionForwardGqa out");
  // The CPU backend's stash for the backward: each row's log-sum-exp.
  ExpectClose(Download(*be, dAtt, B * NH * T), AttentionLseRef(qd.data(), B, T, NH, NKV, hs), 1e-5, 1e-5,
              "AttentionForwardGqa log-sum-exp in att");
  be->AttentionBackwardGqa(dG.f32(), dScr.f32(), dR.f32(), dQkv.f32(), dAtt.f32(), B, T, NH, NKV, hs);
  const auto g = Download(*be, dG, B * T * W);
  std::vector<float> got;
  DVec fd;
  for (size_t i : SampleIndices(qkv.size(), 400)) {
    got.push_back(g[i]);
    fd.push_back(dqkv0[i] + FiniteDiff([&](const DVec& v) { return Dot(GqaRef(v.data(), B, T, NH, NKV, hs), Rd); }, qd, i));
  }
  ExpectClose(got, fd, 1e-4, 1e-3, "AttentionBackwardGqa dqkv");
}

}  // namespace
}  // namespace l2l::kernels
