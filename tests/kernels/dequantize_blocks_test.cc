// Backend::DequantizeBlocks on the CPU backend: equal to common/quant_blocks.h's
// Dequantize for NF4, Q4_0 and Q8_0 (whole tensors large enough to run in parallel
// chunks, and an offset run of blocks), partial blocks refused. The CUDA backend is
// checked against this in tests/gpu/dequantize_blocks_test.cc.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <vector>

#include "common/quant_blocks.h"
#include "kernels/backend.h"

namespace l2l::kernels {
namespace {

TEST_CASE("cpu DequantizeBlocks equals quant_blocks' Dequantize", "[kernels][quant]") {
  const QuantFormat f = GENERATE(QuantFormat::kNf4, QuantFormat::kQ4_0, QuantFormat::kQ8_0);
  INFO("format " << ToString(f));
  std::unique_ptr<Backend> cpu = CreateCpuBackend(2);
  const int64_t n = 64 * 3001;  // several parallel chunks and a ragged last one
  std::mt19937 rng(8);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = dist(rng);
  std::vector<uint8_t> q(*QuantizedBytes(f, n));
  REQUIRE(Quantize(f, x.data(), n, q.data()).ok());
  std::vector<float> want(x.size()), got(x.size(), -7.0f);
  REQUIRE(Dequantize(f, q.data(), n, want.data()).ok());
  REQUIRE(cpu->DequantizeBlocks(got.data(), q.data(), f, n).ok());
  CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);

  const int64_t be = Info(f).block_elems, first = 17, count = 100;
  std::vector<float> tile(static_cast<size_t>(count * be));
  REQUIRE(cpu->DequantizeBlocks(tile.data(), q.data() + first * Info(f).block_bytes, f, count * be).ok());
  CHECK(std::memcmp(tile.data(), want.data() + first * be, tile.size() * sizeof(float)) == 0);

  const Status bad = cpu->DequantizeBlocks(got.data(), q.data(), f, be - 1);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.message().find("not a whole number of blocks") != std::string::npos);
}

}  // namespace
}  // namespace l2l::kernels
