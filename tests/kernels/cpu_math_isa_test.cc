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
  // An ISA above the CPU's best is refused and changes nothing.
  if (BestMathIsa() != MathIsa::kAvx512) {
    const MathIsa before = ActiveMathIsa();
    CHECK_FALSE(SetMathIsa(MathIsa::kAvx512));
    CHECK(ActiveMathIsa() == before);
  }
}

}  // namespace
}  // namespace l2l::kernels
