// Vectorised AdamW (kernels/cpu/adamw_simd.h) against the scalar reference
// common/adamw.h AdamWStep: bit-identical on every code path this CPU supports, for
// several sizes (tails), unaligned starts, worker counts, weight decay and the bf16 copy.
// The fast arithmetic (AdamWUpdateFast): every path equal to its scalar path, and within
// a few fp32 roundings of the update computed in double precision. The dispatcher: the
// level it detects is one the CPU has.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/adamw.h"
#include "common/dtype.h"
#include "kernels/cpu/adamw_simd.h"

namespace l2l::kernels {
namespace {

std::vector<float> Random(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

}  // namespace

TEST_CASE("AdamWUpdate equals the scalar AdamWStep bit for bit", "[eps][adamw]") {
  const size_t n = GENERATE(1, 7, 16, 37, 1000, 4099);
  const int workers = GENERATE(1, 2, 3);
  const float wd = GENERATE(0.0f, 0.1f);
  const int64_t t = GENERATE(1, 5);
  for (int lvl = 0; lvl <= static_cast<int>(DetectSimdLevel()); ++lvl) {
    const auto level = static_cast<SimdLevel>(lvl);
    INFO("n=" << n << " workers=" << workers << " wd=" << wd << " t=" << t << " path=" << SimdLevelName(level));
    std::vector<std::vector<float>> grads;
    for (int w = 0; w < workers; ++w) grads.push_back(Random(n, 100 + w, 0.5f));
    std::vector<const float*> gp;
    for (auto& g : grads) gp.push_back(g.data());
    auto p0 = Random(n, 1, 0.02f), m0 = Random(n, 2, 0.01f), v0 = Random(n, 3, 0.001f);
    for (auto& x : v0) x = x * x;  // v >= 0
    // Reference: sum in worker order, then the scalar step.
    std::vector<float> gsum(n);
    for (size_t i = 0; i < n; ++i) {
      float s = grads[0][i];
      for (int w = 1; w < workers; ++w) s = s + grads[w][i];
      gsum[i] = s;
    }
    const float scale = 1.0f / 6.0f * 0.75f;
    auto rp = p0, rm = m0, rv = v0;
    const AdamWStepArgs a{.lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = wd, .t = t,
                          .grad_scale = scale};
    AdamWStep(rp.data(), gsum.data(), rm.data(), rv.data(), n, a);
    for (DType dt : {DType::kBF16, DType::kF32}) {
      auto vp = p0, vm = m0, vv = v0;
      std::vector<uint16_t> bf(n);
      std::vector<float> f32(n);
      void* out = dt == DType::kBF16 ? static_cast<void*>(bf.data()) : static_cast<void*>(f32.data());
      AdamWUpdate(a, vp.data(), vm.data(), vv.data(), gp.data(), workers, n, dt, out, level);
      if (dt == DType::kBF16) {
        std::vector<uint16_t> want(n);
        FloatToBf16(rp.data(), want.data(), n);
        CHECK(std::memcmp(bf.data(), want.data(), n * 2) == 0);
      } else {
        CHECK(SameBits(f32, rp));
      }
      CHECK(SameBits(vp, rp));
      CHECK(SameBits(vm, rm));
      CHECK(SameBits(vv, rv));
    }
  }
}

TEST_CASE("AdamWUpdate is bit-identical to AdamWStep from unaligned starts", "[eps][adamw]") {
  // Arrays starting 1..3 floats past a 64-byte boundary, so every vector load is
  // unaligned and the tails have odd lengths.
  const size_t offset = GENERATE(1, 2, 3);
  const size_t n = GENERATE(33, 101, 1029);
  for (int lvl = 0; lvl <= static_cast<int>(DetectSimdLevel()); ++lvl) {
    const auto level = static_cast<SimdLevel>(lvl);
    INFO("n=" << n << " offset=" << offset << " path=" << SimdLevelName(level));
    auto g = Random(n + offset, 7, 0.3f), p = Random(n + offset, 8, 0.02f), m = Random(n + offset, 9, 0.01f);
    auto v = Random(n + offset, 10, 0.01f);
    for (auto& x : v) x = x * x;
    auto rp = p, rm = m, rv = v;
    const AdamWStepArgs a{.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .t = 3,
                          .grad_scale = 0.5f};
    AdamWStep(rp.data() + offset, g.data() + offset, rm.data() + offset, rv.data() + offset, n, a);
    const float* gp = g.data() + offset;
    std::vector<uint16_t> bf(n + offset);
    AdamWUpdate(a, p.data() + offset, m.data() + offset, v.data() + offset, &gp, 1, n, DType::kBF16,
                bf.data() + offset, level);
    CHECK(SameBits(p, rp));
    CHECK(SameBits(m, rm));
    CHECK(SameBits(v, rv));
  }
}

TEST_CASE("AdamWUpdateFast: every path equals the scalar one and the update within rounding",
          "[eps][adamw]") {
  const size_t n = GENERATE(1, 15, 17, 37, 1001);
  const size_t offset = GENERATE(0, 3);
  const int workers = GENERATE(1, 3);
  const int64_t t = GENERATE(1, 7);
  AdamWStepArgs a;
  a.lr = 3e-3f;
  a.weight_decay = 0.1f;
  a.t = t;
  a.grad_scale = 0.25f;
  std::vector<std::vector<float>> grads;
  for (int w = 0; w < workers; ++w) grads.push_back(Random(n + offset, 200 + w, 0.5f));
  std::vector<const float*> gp;
  for (auto& g : grads) gp.push_back(g.data() + offset);
  const auto p0 = Random(n + offset, 11, 0.02f), m0 = Random(n + offset, 12, 0.01f);
  auto v0 = Random(n + offset, 13, 0.03f);
  for (auto& x : v0) x = x * x;

  // Scalar fast path: the reference the vector paths must equal bit for bit.
  auto sp = p0, sm = m0, sv = v0;
  std::vector<uint16_t> sbf(n + offset);
  AdamWUpdateFast(a, sp.data() + offset, sm.data() + offset, sv.data() + offset, gp.data(), workers, n,
                  DType::kBF16, sbf.data() + offset, SimdLevel::kScalar);

  // The update in double precision (torch.optim.AdamW's formula, no intermediate rounding
  // beyond the fp32 inputs); the fast update must be within a few fp32 ulps of each term.
  const double b1 = 0.9, b2 = 0.95, eps = 1e-8, lr = a.lr, wd = a.weight_decay;
  const double bc1 = 1 - std::pow(b1, static_cast<double>(t)), bc2 = 1 - std::pow(b2, static_cast<double>(t));
  const double ulp = std::numeric_limits<float>::epsilon();
  for (size_t i = offset; i < n + offset; ++i) {
    INFO("i=" << i << " n=" << n << " workers=" << workers << " t=" << t);
    float gs = grads[0][i];
    for (int w = 1; w < workers; ++w) gs = gs + grads[w][i];
    const double g = static_cast<double>(gs) * a.grad_scale;
    const double m = b1 * m0[i] + (1 - b1) * g;
    const double v = b2 * v0[i] + (1 - b2) * g * g;
    const double step = lr / bc1 * m / (std::sqrt(v) / std::sqrt(bc2) + eps);
    const double p = p0[i] * (1 - lr * wd) - step;
    // Error bounds: a few roundings of each operand, propagated through the step
    // (m / denom amplifies an absolute error of m, and a relative error of v halves
    // through the square root).
    const double em = 4 * ulp * (std::abs(m0[i]) + std::abs(g));
    const double ev = 4 * ulp * (v0[i] + g * g);
    const double d = std::sqrt(v) / std::sqrt(bc2) + eps;
    const double ed = (v > 0 ? ev / (2 * v) : 0) * std::sqrt(v) / std::sqrt(bc2) + 4 * ulp * d;
    const double estep = lr / bc1 * (em / d + std::abs(m) * ed / (d * d)) + 4 * ulp * std::abs(step);
    CHECK(std::abs(sm[i] - m) <= em);
    CHECK(std::abs(sv[i] - v) <= ev);
    CHECK(std::abs(sp[i] - p) <= 4 * ulp * std::abs(p0[i]) + estep);
  }

  for (int lvl = 1; lvl <= static_cast<int>(DetectSimdLevel()); ++lvl) {
    const auto level = static_cast<SimdLevel>(lvl);
    INFO("n=" << n << " offset=" << offset << " workers=" << workers << " path=" << SimdLevelName(level));
    auto vp = p0, vm = m0, vv = v0;
    std::vector<uint16_t> vbf(n + offset);
    AdamWUpdateFast(a, vp.data() + offset, vm.data() + offset, vv.data() + offset, gp.data(), workers, n,
                    DType::kBF16, vbf.data() + offset, level);
    CHECK(SameBits(vp, sp));
    CHECK(SameBits(vm, sm));
    CHECK(SameBits(vv, sv));
    CHECK(vbf == sbf);
  }
}

TEST_CASE("The AdamW dispatcher picks a path this CPU supports", "[eps][adamw]") {
  __builtin_cpu_init();
  const SimdLevel best = DetectSimdLevel();
  INFO("detected " << SimdLevelName(best));
  if (best == SimdLevel::kAvx512) CHECK(__builtin_cpu_supports("avx512f"));
  if (best == SimdLevel::kAvx2) {
    CHECK(__builtin_cpu_supports("avx2"));
    CHECK(__builtin_cpu_supports("fma"));
  }
  // The best level is detected, not merely allowed: a CPU with AVX-512F gets that path.
  if (__builtin_cpu_supports("avx512f")) CHECK(best == SimdLevel::kAvx512);
  for (int lvl = 0; lvl <= static_cast<int>(SimdLevel::kAvx512); ++lvl) {
    const auto req = static_cast<SimdLevel>(lvl);
    const SimdLevel got = ResolveSimdLevel(req);
    CHECK(static_cast<int>(got) <= static_cast<int>(best));
    CHECK(static_cast<int>(got) <= lvl);
    if (lvl <= static_cast<int>(best)) CHECK(got == req);
  }
}

TEST_CASE("AdamWUpdate's bf16 cast rounds to nearest even and keeps NaN and Inf", "[eps][adamw]") {
  // lr = 0 and zero gradients leave p unchanged, so the copy is the cast of p.
  std::vector<float> p = {1.0f, 1.00390625f, 1.01171875f, -3.39e38f, 3.4e38f,
                          std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                          0.0f, -0.0f, 1e-40f, 2.5f, -7.75f, 1.5f, 0.1f, 0.2f, 0.3f, 0.4f};
  const size_t n = p.size();
  for (int lvl = 0; lvl <= static_cast<int>(DetectSimdLevel()); ++lvl) {
    auto q = p;
    std::vector<float> m(n, 0.0f), v(n, 0.0f), g(n, 0.0f);
    const float* gp = g.data();
    std::vector<uint16_t> out(n);
    AdamWStepArgs a;
    a.lr = 0.0f;
    AdamWUpdate(a, q.data(), m.data(), v.data(), &gp, 1, n, DType::kBF16, out.data(),
                static_cast<SimdLevel>(lvl));
    for (size_t i = 0; i < n; ++i) {
      INFO("i=" << i << " path=" << SimdLevelName(static_cast<SimdLevel>(lvl)));
      CHECK(out[i] == FloatToBf16(p[i]));
    }
  }
}

TEST_CASE("AdamWUpdate reports a non-finite reduced gradient on every code path, body or tail",
          "[eps][adamw][nonfinite]") {
  const size_t n = 37;  // two AVX-512 vectors (or four AVX2) and a scalar tail
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  struct Case {
    const char* what;
    size_t at;
    float g0, g1;  // the two workers' values at `at`
    bool finite;
  };
  const Case cases[] = {
      {"all finite", 0, 0.5f, -0.25f, true},
      {"NaN in the vector body", 5, nan, 0.0f, false},
      {"Inf in the tail", 35, 0.0f, -inf, false},
      {"the sum overflows", 20, 3e38f, 3e38f, false},
  };
  for (int lvl = 0; lvl <= static_cast<int>(DetectSimdLevel()); ++lvl) {
    for (const Case& c : cases) {
      INFO(c.what << " path=" << SimdLevelName(static_cast<SimdLevel>(lvl)));
      std::vector<float> p(n, 1.0f), m(n, 0.0f), v(n, 0.0f), g0(n, 0.01f), g1(n, 0.02f);
      g0[c.at] = c.g0;
      g1[c.at] = c.g1;
      const float* gp[2] = {g0.data(), g1.data()};
      AdamWStepArgs a;
      a.lr = 1e-3f;
      CHECK(AdamWUpdate(a, p.data(), m.data(), v.data(), gp, 2, n, DType::kF32, nullptr,
                        static_cast<SimdLevel>(lvl)) == c.finite);
    }
  }
}

}  // namespace l2l::kernels
