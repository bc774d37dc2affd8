// Backend::DequantizeBlocks on the CUDA backend against the CPU backend (the reference,
// common/quant_blocks.h's Dequantize): NF4, Q4_0 and Q8_0 blocks of N(0, 0.02) weights
// dequantize to the same bits, whole and as a GEMM tile's rows (an offset run of blocks),
// and a count that is not whole blocks is refused. Label gpu (emu on the emulator).
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <vector>

#include "common/quant_blocks.h"
#include "tests/gpu/gpu_test_util.h"

namespace l2l::gpu_test {
namespace {

TEST_CASE("cuda DequantizeBlocks equals the CPU backend bit for bit", "[gpu][quant]") {
  Backends& b = Both();
  const QuantFormat f = GENERATE(QuantFormat::kNf4, QuantFormat::kQ4_0, QuantFormat::kQ8_0);
  INFO("format " << ToString(f));
  // A (96, 256) weight: 96 rows, whole blocks per row for every format.
  const int64_t rows = 96, cols = 256, n = rows * cols;
  std::mt19937 rng(21);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  std::vector<float> w(static_cast<size_t>(n));
  for (float& v : w) v = dist(rng);
  const size_t bytes = *QuantizedBytes(f, n);
  std::vector<uint8_t> q(bytes);
  REQUIRE(Quantize(f, w.data(), n, q.data()).ok());
  std::vector<float> want(static_cast<size_t>(n));
  REQUIRE(Dequantize(f, q.data(), n, want.data()).ok());

  for (Backend* be : {b.cpu.get(), b.gpu.get()}) {
    INFO(be->name());
    auto blocks = DeviceBuffer::Create(be, bytes);
    auto out = DeviceBuffer::Create(be, static_cast<size_t>(n) * sizeof(float));
    REQUIRE(blocks.ok());
    REQUIRE(out.ok());
    be->CopyToDevice(blocks->data(), q.data(), bytes);
    REQUIRE(be->DequantizeBlocks(out->f32(), blocks->data(), f, n).ok());
    std::vector<float> got(static_cast<size_t>(n));
    be->CopyToHost(got.data(), out->data(), got.size() * sizeof(float));
    be->Synchronize();
    CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);

    // Rows [40, 72) alone, as a GEMM tile would dequantize them.
    const int64_t r0 = 40, r1 = 72, per_row = cols / Info(f).block_elems * Info(f).block_bytes;
    be->Zero(out->data(), static_cast<size_t>(n) * sizeof(float));
    REQUIRE(be->DequantizeBlocks(out->f32(), static_cast<const uint8_t*>(blocks->data()) + r0 * per_row, f,
                                 (r1 - r0) * cols)
                .ok());
    std::vector<float> tile(static_cast<size_t>((r1 - r0) * cols));
    be->CopyToHost(tile.data(), out->data(), tile.size() * sizeof(float));
    be->Synchronize();
    CHECK(std::memcmp(tile.data(), want.data() + r0 * cols, tile.size() * sizeof(float)) == 0);

    const Status bad = be->DequantizeBlocks(out->f32(), blocks->data(), f, Info(f).block_elems + 1);
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.message().find("not a whole number of blocks") != std::string::npos);
  }
}

}  // namespace
}  // namespace l2l::gpu_test
