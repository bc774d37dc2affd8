// Vectorised AdamW (eps_server/adamw_vec.h) against the scalar reference
// common/adamw.h AdamWStep: bit-identical on every code path this CPU supports, for
// several sizes (tails), worker counts, weight decay and the bf16 copy.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <vector>

#include "common/adamw.h"
#include "common/dtype.h"
#include "eps_server/adamw_vec.h"

namespace l2l::eps {
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
    AdamWStep(rp.data(), gsum.data(), rm.data(), rv.data(), n, 3e-3f, 0.9f, 0.95f, 1e-8f, wd, t, scale);
    AdamWArgs a;
    a.lr = 3e-3f;
    a.weight_decay = wd;
    a.t = t;
    a.grad_scale = scale;
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
    AdamWArgs a;
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
      AdamWArgs a;
      a.lr = 1e-3f;
      CHECK(AdamWUpdate(a, p.data(), m.data(), v.data(), gp, 2, n, DType::kF32, nullptr,
                        static_cast<SimdLevel>(lvl)) == c.finite);
    }
  }
}

}  // namespace l2l::eps
