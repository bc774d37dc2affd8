// The chunked LM head on the CUDA backend (the emulator in CI): the head computed 5 rows
// at a time on the GPU equals the CPU backend's one-chunk head, for GPT-2 (tied), Llama
// (untied) and BERT's masked-LM head, with loss-masked targets; the same bounds as the
// unchunked CUDA head tests (gpu_test_util.h ExpectEmbeddingAndHeadMatch): loss 1e-5
// relative, gradients and probabilities atol 1e-6, rtol 1e-3.
#include <catch2/catch.hpp>

#include "tests/gpu/gpu_test_util.h"
#include "tests/testing/head_run.h"

namespace l2l::gpu_test {
namespace {

TEST_CASE("cuda chunked LM head equals the cpu's one-chunk head for every head kind", "[gpu][head]") {
  Backends& b = Both();
  const int64_t B = 2, T = 11, N = B * T;
  for (const testing::HeadCase& c : testing::HeadCases()) {
    const testing::HeadResult cpu = testing::RunHead(*b.cpu, c, B, T, N, 9);
    const testing::HeadResult gpu = testing::RunHead(*b.gpu, c, B, T, 5, 9);
    testing::ExpectSameHead(gpu, cpu, 1e-5, 1e-6, 1e-3, c.name + " (cuda, 5 rows per chunk)");
  }
}

}  // namespace
}  // namespace l2l::gpu_test
