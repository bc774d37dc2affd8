// Tests for common/quant_blocks.h: NF4, Q4_0 and Q8_0 blocks equal the references of
// tests/formats/quant_oracle.py bit for bit (NF4 written there from QLoRA's definition,
// its table derived from normal quantiles; Q4_0 / Q8_0 are the gguf package's own
// quantizers), dequantization equals the references' dequantization bit for bit, the
// error on Gaussian weights stays within the formats' bounds (relative RMS errors measured
// and pinned), and bad sizes and non-finite values are refused.
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "common/quant_blocks.h"
#include "tests/formats/oracle_util.h"
#include "tests/testing/temp_dir.h"

namespace l2l {
namespace {

std::vector<float> Gaussian(size_t n, float stddev, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<uint8_t> QuantizeOrDie(QuantFormat f, const std::vector<float>& x) {
  Result<size_t> bytes = QuantizedBytes(f, static_cast<int64_t>(x.size()));
  REQUIRE(bytes.ok());
  std::vector<uint8_t> q(*bytes);
  REQUIRE(Quantize(f, x.data(), static_cast<int64_t>(x.size()), q.data()).ok());
  return q;
}

std::vector<float> DequantizeOrDie(QuantFormat f, const std::vector<uint8_t>& q, size_t n) {
  std::vector<float> out(n);
  REQUIRE(Dequantize(f, q.data(), static_cast<int64_t>(n), out.data()).ok());
  return out;
}

TEST_CASE("Block quantizers equal their references bit for bit", "[formats][quant]") {
  const QuantFormat f = GENERATE(QuantFormat::kNf4, QuantFormat::kQ4_0, QuantFormat::kQ8_0);
  INFO("format " << ToString(f));
  // 257 NF4 blocks of N(0, 0.02) weights (a Llama-like scale), the first block all zeros,
  // a few large outliers, and values at +-absmax.
  std::vector<float> x = Gaussian(64 * 257, 0.02f, 7);
  for (int j = 0; j < 64; ++j) x[j] = 0.0f;
  x[100] = 0.5f;
  x[1000] = -0.75f;
  x[2000] = 3.0f;
  x[2001] = -3.0f;
  testing::TempDir dir("l2l_quant");
  testing::WriteF32File(dir.File("x.f32"), x);
  testing::RunOracle("quant_oracle.py", {ToString(f), dir.File("x.f32"), dir.File("ref.bin"), dir.File("ref.f32")});
  const std::string ref = testing::ReadAll(dir.File("ref.bin"));
  const std::vector<uint8_t> q = QuantizeOrDie(f, x);
  REQUIRE(ref.size() == q.size());
  size_t first_diff = q.size();
  for (size_t i = 0; i < q.size() && first_diff == q.size(); ++i) {
    if (static_cast<uint8_t>(ref[i]) != q[i]) first_diff = i;
  }
  INFO("first differing byte " << first_diff << " (block " << first_diff / Info(f).block_bytes << ")");
  CHECK(first_diff == q.size());

  const std::vector<float> ref_deq = testing::ReadF32File(dir.File("ref.f32"));
  const std::vector<float> deq = DequantizeOrDie(f, q, x.size());
  REQUIRE(ref_deq.size() == deq.size());
  CHECK(std::memcmp(ref_deq.data(), deq.data(), deq.size() * sizeof(float)) == 0);
  for (int j = 0; j < 64; ++j) CHECK(deq[j] == 0.0f);  // the zero block stays zero
}

// Relative RMS error of a round trip on N(0, 1) weights, and the largest error per element
// against the format's bound.
struct RoundTripError {
  double rel_rms = 0;
  bool within_bound = true;
};

RoundTripError Measure(QuantFormat f, const std::vector<float>& x) {
  const std::vector<uint8_t> q = QuantizeOrDie(f, x);
  const std::vector<float> y = DequantizeOrDie(f, q, x.size());
  const int64_t be = Info(f).block_elems;
  RoundTripError r;
  double se = 0, sx = 0;
  for (size_t b = 0; b < x.size() / be; ++b) {
    float absmax = 0;
    for (int64_t j = 0; j < be; ++j) absmax = std::max(absmax, std::fabs(x[b * be + j]));
    // NF4: half the widest gap between neighbouring codes (-1 .. -0.696), times absmax.
    // Q4_0: one step d = absmax / 8 (the element of opposite sign to the largest one is
    // clipped at 7 steps, not 8), plus the fp16 rounding of d. Q8_0: half a step
    // d = absmax / 127 plus 127 times d's fp16 rounding (relative 2^-11).
    const double bound = f == QuantFormat::kNf4    ? absmax * (1.0 - 0.6961928009986877) / 2 * (1 + 1e-6)
                         : f == QuantFormat::kQ4_0 ? absmax / 8.0 * (1 + 8 * 0x1p-11) * (1 + 1e-6)
                                                   : absmax / 127.0 * (0.5 + 127 * 0x1p-11) * (1 + 1e-6);
    for (int64_t j = 0; j < be; ++j) {
      const double e = std::fabs(static_cast<double>(y[b * be + j]) - x[b * be + j]);
      if (e > bound) r.within_bound = false;
      se += e * e;
      sx += static_cast<double>(x[b * be + j]) * x[b * be + j];
    }
  }
  r.rel_rms = std::sqrt(se / sx);
  return r;
}

TEST_CASE("Round-trip error on Gaussian weights stays within each format's bound", "[formats][quant]") {
  const std::vector<float> x = Gaussian(64 * 4096, 1.0f, 11);
  const RoundTripError nf4 = Measure(QuantFormat::kNf4, x);
  const RoundTripError q4 = Measure(QuantFormat::kQ4_0, x);
  const RoundTripError q8 = Measure(QuantFormat::kQ8_0, x);
  INFO("relative RMS error: nf4 " << nf4.rel_rms << ", q4_0 " << q4.rel_rms << ", q8_0 " << q8.rel_rms);
  CHECK(nf4.within_bound);
  CHECK(q4.within_bound);
  CHECK(q8.within_bound);
  // Measured (seed 11, 262144 weights): nf4 0.0919, q4_0 0.0859, q8_0 0.00534. At the same
  // 0.5625 bytes per parameter Q4_0's blocks of 32 (a smaller absmax per block, and the
  // signed-extreme scale) beat NF4's 16 normal quantiles over blocks of 64 by ~7%.
  CHECK(nf4.rel_rms < 0.095);
  CHECK(q4.rel_rms < 0.09);
  CHECK(q8.rel_rms < 0.0055);
}

TEST_CASE("Block formats state their sizes and refuse partial blocks and non-finite values",
          "[formats][quant]") {
  CHECK(*QuantizedBytes(QuantFormat::kNf4, 128) == 72);   // 0.5625 B/param
  CHECK(*QuantizedBytes(QuantFormat::kQ4_0, 128) == 72);  // 18 / 32
  CHECK(*QuantizedBytes(QuantFormat::kQ8_0, 128) == 136);  // 34 / 32
  CHECK(*QuantizedBytes(QuantFormat::kNf4, 0) == 0);
  for (auto [f, n] : {std::pair{QuantFormat::kNf4, int64_t{32}}, {QuantFormat::kNf4, int64_t{65}},
                      {QuantFormat::kQ4_0, int64_t{31}}, {QuantFormat::kQ8_0, int64_t{-32}}}) {
    const Result<size_t> r = QuantizedBytes(f, n);
    REQUIRE_FALSE(r.ok());
    INFO(r.status().ToString());
    CHECK(r.status().message().find(std::to_string(n) + " elements are not a whole number of blocks") !=
          std::string::npos);
    std::vector<float> x(static_cast<size_t>(std::max<int64_t>(n, 0)));
    std::vector<uint8_t> q(1024);
    CHECK_FALSE(Quantize(f, x.data(), n, q.data()).ok());
    CHECK_FALSE(Dequantize(f, q.data(), n, x.data()).ok());
  }
  std::vector<float> x = Gaussian(64, 1.0f, 3);
  x[17] = std::nanf("");
  std::vector<uint8_t> q(36);
  const Status s = Quantize(QuantFormat::kNf4, x.data(), 64, q.data());
  REQUIRE_FALSE(s.ok());
  CHECK(s.message().find("element 17 of 64 is not finite") != std::string::npos);
  x[17] = INFINITY;
  CHECK_FALSE(Quantize(QuantFormat::kQ8_0, x.data(), 64, q.data()).ok());
}

TEST_CASE("base_dtype q4 means NF4 and q8 means Q8_0", "[formats][quant]") {
  CHECK(*QuantFormatForBaseDtype("q4") == QuantFormat::kNf4);
  CHECK(*QuantFormatForBaseDtype("q8") == QuantFormat::kQ8_0);
  CHECK_FALSE(QuantFormatForBaseDtype("bf16").ok());
  for (QuantFormat f : {QuantFormat::kNf4, QuantFormat::kQ4_0, QuantFormat::kQ8_0}) {
    CHECK(*ParseQuantFormat(ToString(f)) == f);
  }
  CHECK_FALSE(ParseQuantFormat("nf5").ok());
}

}  // namespace
}  // namespace l2l
