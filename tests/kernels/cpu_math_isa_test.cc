// The CPU backend's vectorised math (kernels/cpu/cpu_math.h) on every instruction set
// this CPU runs (AVX-512, AVX2, baseline, chosen at run time): each path against double
// precision formulas, elementwise results identical across the FMA paths, lengths around the
// 8- and 16-lane widths so the tails are covered.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_math.h"
#include "tests/kernels/kernel_reference.h"

namespace l2l::kernels {
namespace {

double GeluGradRef(double x) {
  const double s = std::sqrt(2.0 / M_PI), u = s * (x + 0.044715 * x * x * x), t = std::tanh(u);
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * s * (1.0 + 3.0 * 0.044715 * x * x);
}

// Restores the load-time ISA when a test section ends.
struct IsaGuard {
  MathIsa saved = ActiveMathIsa();
  ~IsaGuard() { SetMathIsa(saved); }
};

TEST_CASE("Vectorised math matches double precision on every ISA the CPU has, elementwise alike",
          "[kernels][cpu][math]") {
  IsaGuard guard;
  std::vector<MathIsa> isas;
  for (MathIsa isa : {MathIsa::kBase, MathIsa::kAvx2, MathIsa::kAvx512}) {
    if (SetMathIsa(isa)) isas.push_back(isa);
  }
  REQUIRE(!isas.empty());
  INFO("best ISA here: " << MathIsaName(BestMathIsa()) << ", paths tested: " << isas.size());
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> d(-6.0f, 6.0f);
  std::vector<float> first_gelu, first_dgelu, first_exp;
  for (int64_t n : {1, 7, 8, 9, 15, 16, 17, 33, 1000}) {
    first_gelu.clear();
    std::vector<float> x(n), g(n);
    for (auto& v : x) v = d(rng);
    for (auto& v : g) v = d(rng);
    for (size_t k = 0; k < isas.size(); ++k) {
      REQUIRE(SetMathIsa(isas[k]));
      INFO("isa " << MathIsaName(isas[k]) << " n=" << n);
      std::vector<float> out(n), dinp(n, 0.25f), e(n);
      GeluForwardSpan(out.data(), x.data(), n);
      GeluBackwardSpan(dinp.data(), x.data(), g.data(), n);
      const float shift = 1.5f;
      const double sum = ExpShiftSumSpan(e.data(), x.data(), shift, n);
      double esum = 0.0, dot = 0.0, mx = x[0];
      for (int64_t i = 0; i < n; ++i) {
        CHECK(std::abs(out[i] - testing::GeluRef(x[i])) <= 1e-6 + 1e-6 * std::abs(testing::GeluRef(x[i])));
        const double want_d = 0.25 + GeluGradRef(x[i]) * g[i];
        CHECK(std::abs(dinp[i] - want_d) <= 1e-5 + 1e-5 * std::abs(want_d));
        const double want_e = std::exp(double(x[i]) - shift);
        CHECK(std::abs(e[i] - want_e) <= 1e-6 * want_e);
        esum += want_e;
        dot += double(x[i]) * g[i];
        mx = std::max(mx, double(x[i]));
      }
      CHECK(std::abs(sum - esum) <= 1e-6 * esum);
      CHECK(MaxSpan(x.data(), n) == float(mx));
      CHECK(std::abs(DotSpan(x.data(), g.data(), n) - dot) <= 1e-4 + 1e-5 * std::abs(dot) * n);
      std::vector<float> s = x;
      ScaleSpan(s.data(), 0.5f, n);
      for (int64_t i = 0; i < n; ++i) CHECK(s[i] == x[i] * 0.5f);
      // Elementwise ops give the same bits on the FMA paths (AVX2 and AVX-512: same
      // polynomial, same contractions; the baseline has no FMA, so it rounds differently).
      if (isas[k] == MathIsa::kBase) continue;
      if (first_gelu.size() != size_t(n)) {
        first_gelu = out;
        first_dgelu = dinp;
        first_exp = e;
      } else {
        CHECK(out == first_gelu);
        CHECK(dinp == first_dgelu);
        CHECK(e == first_exp);
      }
    }
  }
  // The row kernels of the fused backward passes, on every ISA, against double loops.
  for (int64_t n : {1, 7, 16, 33, 200}) {
    std::vector<float> x(n), g(n), w(n), b(n), acc0(n);
    for (auto& v : x) v = d(rng);
    for (auto& v : g) v = d(rng);
    for (auto& v : w) v = 0.5f + 0.1f * d(rng);
    for (auto& v : b) v = d(rng);
    for (auto& v : acc0) v = d(rng);
    for (MathIsa isa : isas) {
      REQUIRE(SetMathIsa(isa));
      INFO("isa " << MathIsaName(isa) << " n=" << n);
      // GeluBackwardSumSpan: dinp overwritten, sum accumulated.
      std::vector<float> dinp(n, 7.0f), sum = acc0;
      GeluBackwardSumSpan(dinp.data(), sum.data(), x.data(), g.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        const double want = GeluGradRef(x[i]) * g[i];
        CHECK(std::abs(dinp[i] - want) <= 1e-5 + 1e-5 * std::abs(want));
        CHECK(sum[i] == acc0[i] + dinp[i]);
      }
      // AddSpan and SoftmaxGradSpan are exact elementwise.
      std::vector<float> s2(n);
      AddSpan(s2.data(), x.data(), g.data(), n);
      for (int64_t i = 0; i < n; ++i) CHECK(s2[i] == x[i] + g[i]);
      std::vector<float> sg = g;
      SoftmaxGradSpan(sg.data(), x.data(), 0.75f, n);
      for (int64_t i = 0; i < n; ++i) CHECK(sg[i] == x[i] * (g[i] - 0.75f));
      // LayerNorm and RMSNorm rows: forward against double, backward against the double
      // formula (dinp, dw, db accumulate).
      double mean = 0.0, var = 0.0, ss = 0.0;
      for (float v : x) mean += v, ss += double(v) * v;
      mean /= double(n);
      for (float v : x) var += (v - mean) * (v - mean);
      var /= double(n);
      const double rs = 1.0 / std::sqrt(var + 1e-5), rms = 1.0 / std::sqrt(ss / double(n) + 1e-5);
      std::vector<float> out(n);
      float m = 0.0f, r = 0.0f;
      LayerNormRowForward(out.data(), &m, &r, x.data(), w.data(), b.data(), n, 1e-5f);
      CHECK(std::abs(m - mean) <= 1e-5);
      CHECK(std::abs(r - rs) <= 1e-5 * rs);
      for (int64_t i = 0; i < n; ++i) CHECK(std::abs(out[i] - ((x[i] - mean) * rs * w[i] + b[i])) <= 2e-5 * (1 + std::abs(out[i])));
      std::vector<float> di = acc0, dw(n, 0.0f), db(n, 0.0f);
      LayerNormRowBackward(di.data(), dw.data(), db.data(), x.data(), g.data(), w.data(), m, r, n);
      double a1 = 0.0, a2 = 0.0;
      for (int64_t i = 0; i < n; ++i) {
        const double nm = (x[i] - double(m)) * r, dn = double(w[i]) * g[i];
        a1 += dn;
        a2 += dn * nm;
      }
      a1 /= double(n);
      a2 /= double(n);
      for (int64_t i = 0; i < n; ++i) {
        const double nm = (x[i] - double(m)) * r, dn = double(w[i]) * g[i];
        const double want = acc0[i] + (dn - a1 - nm * a2) * r;
        CHECK(std::abs(di[i] - want) <= 1e-4 * (1 + std::abs(want)));
        CHECK(std::abs(dw[i] - nm * g[i]) <= 1e-5 * (1 + std::abs(nm * g[i])));
        CHECK(db[i] == g[i]);
      }
      float rr = 0.0f;
      RMSNormRowForward(out.data(), &rr, x.data(), w.data(), n, 1e-5f);
      CHECK(std::abs(rr - rms) <= 1e-5 * rms);
      for (int64_t i = 0; i < n; ++i) CHECK(std::abs(out[i] - x[i] * rms * w[i]) <= 1e-5 * (1 + std::abs(out[i])));
      std::vector<float> ri = acc0, rw(n, 0.0f);
      RMSNormRowBackward(ri.data(), rw.data(), x.data(), g.data(), w.data(), rr, n);
      double dot = 0.0;
      for (int64_t i = 0; i < n; ++i) dot += double(w[i]) * g[i] * (double(x[i]) * rr);
      dot /= double(n);
      for (int64_t i = 0; i < n; ++i) {
        const double nm = double(x[i]) * rr;
        const double want = acc0[i] + rr * (double(w[i]) * g[i] - nm * dot);
        CHECK(std::abs(ri[i] - want) <= 1e-4 * (1 + std::abs(want)));
        CHECK(std::abs(rw[i] - nm * g[i]) <= 1e-5 * (1 + std::abs(nm * g[i])));
      }
      // SwiGLU: against double silu.
      std::vector<float> sw(n), dgv(n, 0.5f), duv(n, -0.5f);
      SwiGLUForwardSpan(sw.data(), x.data(), b.data(), n);
      SwiGLUBackwardSpan(dgv.data(), duv.data(), x.data(), b.data(), g.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        const double sig = 1.0 / (1.0 + std::exp(-double(x[i]))), silu = x[i] * sig;
        CHECK(std::abs(sw[i] - silu * b[i]) <= 1e-5 * (1 + std::abs(silu * b[i])));
        const double want_g = 0.5 + double(g[i]) * b[i] * sig * (1.0 + x[i] * (1.0 - sig));
        CHECK(std::abs(dgv[i] - want_g) <= 1e-5 * (1 + std::abs(want_g)));
        CHECK(std::abs(duv[i] - (-0.5 + double(g[i]) * silu)) <= 1e-5 * (1 + std::abs(g[i] * silu)));
      }
    }
  }
  // An ISA above the CPU's best is refused and changes nothing.
  if (BestMathIsa() != MathIsa::kAvx512) {
    const MathIsa before = ActiveMathIsa();
    CHECK_FALSE(SetMathIsa(MathIsa::kAvx512));
    CHECK(ActiveMathIsa() == before);
  }
}

}  // namespace
}  // namespace l2l::kernels
