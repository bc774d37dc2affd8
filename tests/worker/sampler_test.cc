// Sampler options beyond temperature and top-k: top-p (nucleus) against hand-computed
// nuclei and empirical frequencies, and stopping at an end-of-sequence id.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "worker/sampler.h"

namespace l2l::worker {
namespace {

TEST_CASE("SampleToken top-p keeps the smallest most-likely set reaching p", "[sampler]") {
  const std::vector<float> p = {0.1f, 0.4f, 0.2f, 0.3f};  // sorted: 1 (0.4), 3 (0.3), 2 (0.2), 0 (0.1)
  for (double u : {0.0, 0.25, 0.5, 0.75, 0.999}) {
    CHECK(SampleToken(p, 1.0f, 0, 0.3f, u) == 1);           // 0.4 >= 0.3: only token 1
    CHECK(SampleToken(p, 1.0f, 0, 0.39f, u) == 1);          // just below 0.4
    const int32_t t = SampleToken(p, 1.0f, 0, 0.65f, u);    // 0.4 + 0.3 = 0.7 >= 0.65
    CHECK((t == 1 || t == 3));
    const int32_t t3 = SampleToken(p, 1.0f, 0, 0.85f, u);   // 0.9 >= 0.85: {1, 3, 2}
    CHECK((t3 == 1 || t3 == 3 || t3 == 2));
  }
  // top_p >= 1 or <= 0: no cut (the smallest u/largest u reach both ends).
  CHECK(SampleToken(p, 1.0f, 0, 1.0f, 0.999) == 0);
  CHECK(SampleToken(p, 1.0f, 0, 0.0f, 0.999) == 0);
  // Within the nucleus {1, 3} the draw follows the renormalised weights 4/7, 3/7.
  std::vector<int> count(4, 0);
  const int n = 20000;
  for (int i = 0; i < n; ++i) ++count[SampleToken(p, 1.0f, 0, 0.65f, SamplerUniform(91, i))];
  CHECK(count[0] == 0);
  CHECK(count[2] == 0);
  CHECK(std::abs(count[1] / double(n) - 4.0 / 7.0) < 0.02);
  CHECK(std::abs(count[3] / double(n) - 3.0 / 7.0) < 0.02);
}

TEST_CASE("SampleToken applies top-p after temperature and top-k", "[sampler]") {
  // Temperature 0.5 squares: 0.01, 0.16, 0.04, 0.09 over 0.30 -> token 1 alone has 0.533.
  const std::vector<float> p = {0.1f, 0.4f, 0.2f, 0.3f};
  for (double u : {0.0, 0.5, 0.999}) CHECK(SampleToken(p, 0.5f, 0, 0.5f, u) == 1);
  // Top-k 2 renormalises {1, 3} to 4/7, 3/7; top-p 0.5 then keeps only token 1.
  for (double u : {0.0, 0.5, 0.999}) CHECK(SampleToken(p, 1.0f, 2, 0.5f, u) == 1);
  // Without top-p the same u reaches token 3.
  CHECK(SampleToken(p, 1.0f, 2, 1.0f, 0.999) == 3);
}

TEST_CASE("Generate stops after the EOS id and keeps it", "[sampler]") {
  // Deterministic chain: after token x the next is (x + 1) % 6.
  NextTokenProbs next = [](const std::vector<int32_t>& ctx) -> Result<std::vector<float>> {
    std::vector<float> p(6, 0.0f);
    p[(ctx.back() + 1) % 6] = 1.0f;
    return p;
  };
  SamplerOptions o;
  o.temperature = 0.0f;
  o.max_new_tokens = 20;
  o.context_len = 4;
  o.eos_id = 4;
  auto out = Generate(next, {1}, o);
  REQUIRE(out.ok());
  CHECK(*out == std::vector<int32_t>{1, 2, 3, 4});
  o.eos_id = -1;
  auto all = Generate(next, {1}, o);
  REQUIRE(all.ok());
  CHECK(all->size() == 21);
  o.eos_id = 1;  // EOS in the prompt does not stop; only a generated one does
  auto wrap = Generate(next, {1}, o);
  REQUIRE(wrap.ok());
  CHECK(*wrap == std::vector<int32_t>{1, 2, 3, 4, 5, 0, 1});
}

}  // namespace
}  // namespace l2l::worker
