// FillNormal (common/models/family_util.h) fills large tensors on several threads: the
// bytes must be those of one serial pass (FillNormalRange over the whole tensor), for
// odd and even sizes, and a tensor split at any even offset gives the same values.
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "common/models/family_util.h"

namespace l2l::models {
namespace {

TEST_CASE("FillNormal on several threads gives the serial pass's bytes", "[common][init]") {
  for (size_t n : {size_t{(1u << 23) + 3}, size_t{(1u << 23) + 1000}, size_t{1001}}) {
    INFO("n=" << n);
    std::vector<float> threaded(n), serial(n);
    FillNormal(0x1234567ull, 0.02f, threaded.data(), n);
    FillNormalRange(0x1234567ull, 0.02f, serial.data(), 0, n);
    CHECK(std::memcmp(threaded.data(), serial.data(), n * sizeof(float)) == 0);
    // Two ranges split at an even offset are the same values again.
    std::vector<float> split(n);
    FillNormalRange(0x1234567ull, 0.02f, split.data(), 0, 400);
    FillNormalRange(0x1234567ull, 0.02f, split.data(), 400, n);
    CHECK(std::memcmp(split.data(), serial.data(), n * sizeof(float)) == 0);
  }
}

}  // namespace
}  // namespace l2l::models
