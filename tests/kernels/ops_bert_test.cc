// The CPU backend's BERT-family ops (LayerNorm with a given epsilon, erf GELU, tanh,
// bidirectional attention with a key padding mask) against naive double-precision loops
// written here (forward) and central finite differences of those loops (backward). Shapes
// include padded sequences, odd sizes and ones large enough for the parallel paths.
#include <catch2/catch.hpp>

#include <array>
#include <cmath>

#include "kernels/backend.h"
#include "tests/kernels/kernel_test_util.h"

namespace l2l::kernels {
namespace {

using namespace testing;  // NOLINT
using DVec = std::vector<double>;

DVec LayerNormRef(const double* x, const double* w, const double* b, int64_t N, int64_t C, double eps) {
  DVec out(N * C);
  for (int64_t n = 0; n < N; ++n) {
    double m = 0.0, v = 0.0;
    for (int64_t c = 0; c < C; ++c) m += x[n * C + c];
    m /= double(C);
    for (int64_t c = 0; c < C; ++c) v += (x[n * C + c] - m) * (x[n * C + c] - m);
    v /= double(C);
    for (int64_t c = 0; c < C; ++c) out[n * C + c] = (x[n * C + c] - m) / std::sqrt(v + eps) * w[c] + b[c];
  }
  return out;
}

DVec GeluErfRef(const DVec& x) {
  DVec out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = 0.5 * x[i] * (1.0 + std::erf(x[i] / std::sqrt(2.0)));
  return out;
}

DVec TanhRef(const DVec& x) {
  DVec out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = std::tanh(x[i]);
  return out;
}

// Non-causal attention; keys j with mask[b,j] == 0 are left out of the softmax.
DVec MaskedAttentionRef(const double* qkv, const std::vector<int32_t>& mask, int64_t B, int64_t T, int64_t C,
                        int64_t NH, DVec* att_out = nullptr) {
  const int64_t hs = C / NH, W = 3 * C;
  const double scale = 1.0 / std::sqrt(double(hs));
  DVec out(B * T * C, 0.0), w(T);
  if (att_out) att_out->assign(B * NH * T * T, 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t t = 0; t < T; ++t) {
        const double* q = &qkv[(b * T + t) * W + h * hs];
        double mx = -1e300;
        for (int64_t j = 0; j < T; ++j) {
          if (!mask.empty() && mask[b * T + j] == 0) continue;
          const double* k = &qkv[(b * T + j) * W + C + h * hs];
          double s = 0.0;
          for (int64_t i = 0; i < hs; ++i) s += q[i] * k[i];
          w[j] = s * scale;
          mx = std::max(mx, w[j]);
        }
        double sum = 0.0;
        for (int64_t j = 0; j < T; ++j) {
          if (!mask.empty() && mask[b * T + j] == 0) continue;
          sum += (w[j] = std::exp(w[j] - mx));
        }
        for (int64_t j = 0; j < T; ++j) {
          if (!mask.empty() && mask[b * T + j] == 0) continue;
          const double p = w[j] / sum;
          if (att_out) (*att_out)[((b * NH + h) * T + t) * T + j] = p;
          const double* v = &qkv[(b * T + j) * W + 2 * C + h * hs];
          for (int64_t i = 0; i < hs; ++i) out[(b * T + t) * C + h * hs + i] += p * v[i];
        }
      }
  return out;
}

TEST_CASE("LayerNormForwardEps uses the given epsilon - LayerNormBackward serves it", "[kernels][cpu][bert]") {
  const int64_t N = 7, C = 13;
  std::mt19937 rng(11);
  // Rows of tiny spread make the epsilon matter: 1e-12 and 1e-2 give different results.
  auto x = RandomVec(rng, N * C, -1e-3f, 1e-3f);
  const auto w = RandomVec(rng, C, 0.5f, 1.5f), b = RandomVec(rng, C), R = RandomVec(rng, N * C);
  auto be = CreateCpuBackend(2);
  auto dX = Upload(*be, x), dW = Upload(*be, w), dB = Upload(*be, b), dR = Upload(*be, R);
  auto dOut = Upload(*be, RandomVec(rng, N * C)), dMean = Upload(*be, RandomVec(rng, N)),
       dRstd = Upload(*be, RandomVec(rng, N));
  const DVec xd = ToDouble(x), wd = ToDouble(w), bd = ToDouble(b), Rd = ToDouble(R);
  for (double eps : {1e-12, 1e-6}) {
    INFO("eps=" << eps);
    be->LayerNormForwardEps(dOut.f32(), dMean.f32(), dRstd.f32(), dX.f32(), dW.f32(), dB.f32(), N, C, float(eps));
    ExpectClose(Download(*be, dOut, N * C), LayerNormRef(xd.data(), wd.data(), bd.data(), N, C, eps), 1e-5, 1e-4,
                "LayerNormForwardEps");
    auto dDx = Upload(*be, std::vector<float>(N * C, 0.0f));
    auto dDw = Upload(*be, std::vector<float>(C, 0.0f)), dDb = Upload(*be, std::vector<float>(C, 0.0f));
    be->LayerNormBackward(dDx.f32(), dDw.f32(), dDb.f32(), dR.f32(), dX.f32(), dW.f32(), dMean.f32(), dRstd.f32(), N,
                          C);
    const auto g = Download(*be, dDx, N * C);
    std::vector<float> got;
    DVec fd;
    for (size_t i : SampleIndices(x.size(), 60)) {
      got.push_back(g[i]);
      fd.push_back(FiniteDiff(
          [&](const DVec& v) { return Dot(LayerNormRef(v.data(), wd.data(), bd.data(), N, C, eps), Rd); }, xd, i,
          1e-9));
    }
    // The gradient of a normalised row of spread 1e-3 is ~1e3: relative tolerance.
    ExpectClose(got, fd, 1e-2, 2e-3, "LayerNormBackward dx");
  }
}

TEST_CASE("erf GELU and tanh match their formulas - backwards the finite differences", "[kernels][cpu][bert]") {
  const int64_t n = GENERATE(int64_t{7}, int64_t{40000});
  std::mt19937 rng(static_cast<uint32_t>(n));
  const auto x = RandomVec(rng, n, -5.0f, 5.0f), R = RandomVec(rng, n), d0 = RandomVec(rng, n);
  auto be = CreateCpuBackend(2);
  auto dX = Upload(*be, x), dR = Upload(*be, R), dOut = Upload(*be, RandomVec(rng, n));
  const DVec xd = ToDouble(x), Rd = ToDouble(R);

  be->GeluErfForward(dOut.f32(), dX.f32(), n);
  ExpectClose(Download(*be, dOut, n), GeluErfRef(xd), 1e-6, 1e-6, "GeluErfForward");
  auto dD = Upload(*be, d0);
  be->GeluErfBackward(dD.f32(), dX.f32(), dR.f32(), n);
  auto g = Download(*be, dD, n);
  std::vector<float> got;
  DVec fd;
  for (size_t i : SampleIndices(x.size(), 300)) {
    got.push_back(g[i]);
    fd.push_back(d0[i] + FiniteDiff([&](const DVec& v) { return Dot(GeluErfRef(v), Rd); }, xd, i));
  }
  ExpectClose(got, fd, 1e-5, 1e-4, "GeluErfBackward");

  be->TanhForward(dOut.f32(), dX.f32(), n);
  ExpectClose(Download(*be, dOut, n), TanhRef(xd), 1e-6, 1e-6, "TanhForward");
  auto dT = Upload(*be, d0);
  be->TanhBackward(dT.f32(), dOut.f32(), dR.f32(), n);
  g = Download(*be, dT, n);
  got.clear();
  fd.clear();
  for (size_t i : SampleIndices(x.size(), 300)) {
    got.push_back(g[i]);
    fd.push_back(d0[i] + FiniteDiff([&](const DVec& v) { return Dot(TanhRef(v), Rd); }, xd, i));
  }
  ExpectClose(got, fd, 1e-5, 1e-4, "TanhBackward");
}

TEST_CASE("Masked bidirectional attention matches a naive reference - padded keys get no weight",
          "[kernels][cpu][bert][attention]") {
  const auto shape = GENERATE(std::array<int64_t, 4>{1, 1, 1, 4},  // B, T, NH, hs
                              std::array<int64_t, 4>{3, 6, 2, 3},
                              std::array<int64_t, 4>{2, 17, 4, 5});
  const bool with_mask = GENERATE(false, true);
  const int64_t B = shape[0], T = shape[1], NH = shape[2], hs = shape[3], C = NH * hs;
  INFO("B=" << B << " T=" << T << " NH=" << NH << " hs=" << hs << " mask=" << with_mask);
  std::mt19937 rng(static_cast<uint32_t>(B * 1000 + T * 10 + NH));
  const auto qkv = RandomVec(rng, B * T * 3 * C, -1.5f, 1.5f), R = RandomVec(rng, B * T * C);
  const auto dqkv0 = RandomVec(rng, B * T * 3 * C);
  std::vector<int32_t> mask;
  if (with_mask) {
    // Sequence b keeps T - 2b real tokens (at least 1).
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) mask.push_back(t < std::max<int64_t>(1, T - 2 * b) ? 1 : 0);
  }
  auto be = CreateCpuBackend(2);
  auto dQkv = Upload(*be, qkv), dR = Upload(*be, R), dG = Upload(*be, dqkv0);
  auto dMask = Upload(*be, mask.empty() ? std::vector<int32_t>(1, 1) : mask);
  auto dOut = Upload(*be, RandomVec(rng, B * T * C));
  auto dAtt = Upload(*be, RandomVec(rng, B * NH * T * T)), dScr = Upload(*be, RandomVec(rng, B * NH * T * T));
  be->AttentionForwardMasked(dOut.f32(), dAtt.f32(), dQkv.f32(), with_mask ? dMask.i32() : nullptr, B, T, C, NH);
  DVec att;
  const DVec qd = ToDouble(qkv), Rd = ToDouble(R);
  ExpectClose(Download(*be, dOut, B * T * C), MaskedAttentionRef(qd.data(), mask, B, T, C, NH, &att), 1e-5, 1e-5,
              "AttentionForwardMasked out");
  ExpectClose(Download(*be, dAtt, B * NH * T * T), att, 1e-6, 1e-5, "AttentionForwardMasked att");
  be->AttentionBackwardMasked(dG.f32(), dScr.f32(), dR.f32(), dQkv.f32(), dAtt.f32(), B, T, C, NH);
  const auto g = Download(*be, dG, B * T * 3 * C);
  std::vector<float> got;
  DVec fd;
  for (size_t i : SampleIndices(qkv.size(), 400)) {
    got.push_back(g[i]);
    fd.push_back(dqkv0[i] +
                 FiniteDiff([&](const DVec& v) { return Dot(MaskedAttentionRef(v.data(), mask, B, T, C, NH), Rd); }, qd, i));
  }
  ExpectClose(got, fd, 1e-4, 1e-3, "AttentionBackwardMasked dqkv");
}

}  // namespace
}  // namespace l2l::kernels
