// The CPU backend's blocked causal attention (query strips of 64 rows, keys up to the
// diagonal) against a plain double-precision implementation: the forward (out and the
// log-sum-exp stash), an analytic backward (itself checked against finite differences
// here), shapes with several strips and a partial last strip, multi-head and
// grouped-query, and bit-identical results for 1 and 2 threads.
#include <catch2/catch.hpp>

#include <array>
#include <cmath>

#include "kernels/backend.h"
#include "tests/kernels/kernel_reference.h"
#include "tests/kernels/kernel_test_util.h"

namespace l2l::kernels {
namespace {

using namespace testing;  // NOLINT

struct Shape {
  int64_t B, T, NH, NKV, hs;
  int64_t W() const { return (NH + 2 * NKV) * hs; }
  int64_t C() const { return NH * hs; }
};

// Plain causal attention in double: out (B,T,C) and, when dout is given, dqkv (B,T,W)
// from the textbook softmax backward (no blocking).
DVec PlainAttention(const Shape& s, const DVec& qkv, const DVec* dout = nullptr, DVec* dqkv = nullptr) {
  const int64_t W = s.W(), C = s.C(), rep = s.NH / s.NKV, T = s.T, hs = s.hs;
  const double scale = 1.0 / std::sqrt(double(hs));
  DVec out(s.B * T * C, 0.0), p(T), dp(T);
  if (dqkv) dqkv->assign(s.B * T * W, 0.0);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.NH; ++h)
      for (int64_t t = 0; t < T; ++t) {
        const int64_t g = h / rep;
        auto q = [&](int64_t r) { return &qkv[(b * T + r) * W + h * hs]; };
        auto k = [&](int64_t r) { return &qkv[(b * T + r) * W + C + g * hs]; };
        auto v = [&](int64_t r) { return &qkv[(b * T + r) * W + C + s.NKV * hs + g * hs]; };
        double mx = -1e300;
        for (int64_t j = 0; j <= t; ++j) {
          double d = 0.0;
          for (int64_t i = 0; i < hs; ++i) d += q(t)[i] * k(j)[i];
          mx = std::max(mx, p[j] = d * scale);
        }
        double sum = 0.0;
        for (int64_t j = 0; j <= t; ++j) sum += (p[j] = std::exp(p[j] - mx));
        for (int64_t j = 0; j <= t; ++j) {
          p[j] /= sum;
          for (int64_t i = 0; i < hs; ++i) out[(b * T + t) * C + h * hs + i] += p[j] * v(j)[i];
        }
        if (!dqkv) continue;
        const double* dot = &(*dout)[(b * T + t) * C + h * hs];
        double pdp = 0.0;
        for (int64_t j = 0; j <= t; ++j) {
          double d = 0.0;
          for (int64_t i = 0; i < hs; ++i) d += dot[i] * v(j)[i];
          dp[j] = d;
          pdp += p[j] * d;
        }
        double* dq = &(*dqkv)[(b * T + t) * W + h * hs];
        for (int64_t j = 0; j <= t; ++j) {
          const double ds = p[j] * (dp[j] - pdp) * scale;
          double* dk = &(*dqkv)[(b * T + j) * W + C + g * hs];
          double* dv = &(*dqkv)[(b * T + j) * W + C + s.NKV * hs + g * hs];
          for (int64_t i = 0; i < hs; ++i) {
            dq[i] += ds * k(j)[i];
            dk[i] += ds * q(t)[i];
            dv[i] += p[j] * dot[i];
          }
        }
      }
  return out;
}

struct Result {
  std::vector<float> out, lse, dqkv;
};

// Forward and backward on a CPU backend of `threads` threads; MHA entry points when
// NKV == NH and `mha`, else the GQA ones. dqkv starts from dqkv0 (the ops accumulate).
Result RunCpu(const Shape& s, int threads, bool mha, const std::vector<float>& qkv,
              const std::vector<float>& dout, const std::vector<float>& dqkv0) {
  auto be = CreateCpuBackend(threads);
  const int64_t C = s.C();
  auto dQ = Upload(*be, qkv), dD = Upload(*be, dout), dG = Upload(*be, dqkv0);
  auto dO = Upload(*be, std::vector<float>(s.B * s.T * C, 7.0f));
  auto dA = Upload(*be, std::vector<float>(s.B * s.NH * s.T * s.T, 3.0f));
  auto dS = Upload(*be, std::vector<float>(s.B * s.NH * s.T * s.T, 5.0f));
  if (mha) {
    be->AttentionForward(dO.f32(), dA.f32(), dQ.f32(), s.B, s.T, C, s.NH);
    be->AttentionBackward(dG.f32(), dS.f32(), dD.f32(), dQ.f32(), dA.f32(), s.B, s.T, C, s.NH);
  } else {
    be->AttentionForwardGqa(dO.f32(), dA.f32(), dQ.f32(), s.B, s.T, s.NH, s.NKV, s.hs);
    be->AttentionBackwardGqa(dG.f32(), dS.f32(), dD.f32(), dQ.f32(), dA.f32(), s.B, s.T, s.NH, s.NKV, s.hs);
  }
  return {Download(*be, dO, s.B * s.T * C), Download(*be, dA, s.B * s.NH * s.T),
          Download(*be, dG, s.B * s.T * s.W())};
}

TEST_CASE("Blocked causal attention matches plain attention over several query strips",
          "[kernels][cpu][attention][blocked]") {
  const auto a = GENERATE(std::array<int64_t, 5>{2, 130, 2, 2, 16},  // B, T, NH, NKV, hs: 3 strips, last of 2
                          std::array<int64_t, 5>{1, 64, 3, 3, 8},     // exactly one strip
                          std::array<int64_t, 5>{2, 65, 2, 2, 4},     // a strip of one row
                          std::array<int64_t, 5>{1, 200, 4, 2, 8},    // GQA, groups of 2
                          std::array<int64_t, 5>{1, 129, 6, 1, 12},   // GQA, one kv head
                          std::array<int64_t, 5>{1, 256, 6, 6, 64});  // a GPT-2 head size
  const Shape s{a[0], a[1], a[2], a[3], a[4]};
  const bool mha = s.NH == s.NKV;
  INFO("B=" << s.B << " T=" << s.T << " NH=" << s.NH << " NKV=" << s.NKV << " hs=" << s.hs);
  std::mt19937 rng(static_cast<uint32_t>(s.T * 31 + s.NH * 7 + s.NKV));
  const auto qkv = RandomVec(rng, s.B * s.T * s.W(), -1.5f, 1.5f);
  const auto dout = RandomVec(rng, s.B * s.T * s.C()), dqkv0 = RandomVec(rng, s.B * s.T * s.W());
  const DVec qd = ToDouble(qkv), dd = ToDouble(dout);
  DVec dref;
  const DVec out = PlainAttention(s, qd, &dd, &dref);
  for (size_t i = 0; i < dref.size(); ++i) dref[i] += dqkv0[i];

  const Result r2 = RunCpu(s, 2, mha, qkv, dout, dqkv0);
  ExpectClose(r2.out, out, 2e-6, 1e-5, "out");
  ExpectClose(r2.lse, AttentionLseRef(qd.data(), s.B, s.T, s.NH, s.NKV, s.hs), 2e-6, 1e-6, "log-sum-exp");
  ExpectClose(r2.dqkv, dref, 1e-5, 1e-4, "dqkv");
  if (mha) {  // the GQA entry points with NKV == NH are the same computation
    const Result g = RunCpu(s, 2, false, qkv, dout, dqkv0);
    CHECK(g.out == r2.out);
    CHECK(g.dqkv == r2.dqkv);
  }
  // Strips and kv heads run as independent tasks: the thread count does not change a bit.
  const Result r1 = RunCpu(s, 1, mha, qkv, dout, dqkv0);
  CHECK(r1.out == r2.out);
  CHECK(r1.lse == r2.lse);
  CHECK(r1.dqkv == r2.dqkv);
}

TEST_CASE("The plain attention backward used as reference matches finite differences",
          "[kernels][cpu][attention][blocked]") {
  const Shape s{1, 70, 4, 2, 4};
  std::mt19937 rng(5);
  const DVec qkv = ToDouble(RandomVec(rng, s.B * s.T * s.W(), -1.5f, 1.5f));
  const DVec dout = ToDouble(RandomVec(rng, s.B * s.T * s.C()));
  DVec g;
  PlainAttention(s, qkv, &dout, &g);
  std::vector<double> got, fd;
  for (size_t i : SampleIndices(qkv.size(), 150)) {
    got.push_back(g[i]);
    fd.push_back(FiniteDiff([&](const DVec& v) { return Dot(PlainAttention(s, v), dout); }, qkv, i));
  }
  ExpectClose(got, fd, 1e-6, 1e-5, "plain attention backward");
}

}  // namespace
}  // namespace l2l::kernels
